package trainer

import (
	"sync"
	"time"

	"github.com/skein-ml/skein/model"
)

// Checkpointer writes a stage's checkpoints in the background (the
// DataStates-LLM idea): Save copies the stage to host memory, which is all
// the training loop waits for, and a goroutine encodes, writes, fsyncs and
// renames the file (model.SaveCheckpoint, atomic: a crash leaves the last
// good checkpoint). At most one write is in flight: a Save while the
// previous write runs waits for it first (back-pressure, never a queue of
// gigabytes). Two host buffers are reused, so a run allocates them once.
// A write's error is returned by the next Save or by Wait. Not safe for
// concurrent use by several goroutines (one training loop calls it).
type Checkpointer struct {
	path string

	done  chan struct{} // closed when the in-flight write ends; nil when none
	err   error         // the last write's error, set before done closes
	spare *model.Checkpoint
	busy  *model.Checkpoint // the snapshot being written

	mu      sync.Mutex
	stalled time.Duration // total time Save kept the caller
	wrote   time.Duration // total time spent writing, in the background
	saves   int
}

// NewCheckpointer writes checkpoints to path.
func NewCheckpointer(path string) *Checkpointer { return &Checkpointer{path: path} }

// Save snapshots stage at step (with meta) and starts writing it; it returns
// the previous write's error, if any (this snapshot is written anyway).
func (c *Checkpointer) Save(stage *model.Stage, step int, meta map[string]string) error {
	return c.SaveWith(stage, step, meta, nil)
}

// SaveWith is Save for a checkpoint of more than the stage (a volunteer's
// outer state beside it): extra, if set, runs while the caller waits, after
// the stage's snapshot ck, copies what goes with it, and returns the write
// to run in the background instead of model.SaveCheckpoint (it writes ck
// itself, and the rest).
func (c *Checkpointer) SaveWith(stage *model.Stage, step int, meta map[string]string, extra func(ck *model.Checkpoint) (write func() error)) error {
	began := time.Now()
	prev := c.wait()
	ck := stage.SnapshotInto(c.spare, step, meta)
	c.spare, c.busy = nil, ck
	write := func() error { return model.SaveCheckpoint(c.path, ck) }
	if extra != nil {
		write = extra(ck)
	}
	done := make(chan struct{})
	c.done = done
	go func() {
		t := time.Now()
		c.err = write()
		c.mu.Lock()
		c.wrote += time.Since(t)
		c.mu.Unlock()
		close(done)
	}()
	c.mu.Lock()
	c.stalled += time.Since(began)
	c.saves++
	c.mu.Unlock()
	return prev
}

// Wait waits for the write in flight, if any, and returns its error.
func (c *Checkpointer) Wait() error {
	return c.wait()
}

func (c *Checkpointer) wait() error {
	if c.done == nil {
		return nil
	}
	<-c.done
	c.done = nil
	err := c.err
	c.err = nil
	c.spare, c.busy = c.busy, nil
	return err
}

// Stats are the total time Save kept the caller (the snapshot, plus waits
// for a previous write), the total background write time, and the saves.
func (c *Checkpointer) Stats() (stalled, wrote time.Duration, saves int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stalled, c.wrote, c.saves
}
