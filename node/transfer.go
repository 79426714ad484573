package node

import (
	"io"
	"sync/atomic"
	"time"
)

// transfer shows a download's progress: a line every 2 seconds while it
// runs (bytes done, share, rate) and a closing line with the mean rate.
// Bytes are counted by wrapping the destination with writerAt.
type transfer struct {
	w     io.Writer
	what  string
	total int64
	done  atomic.Int64
	began time.Time
	stop  chan struct{}
}

// startTransfer starts the progress lines for total bytes of what; a nil
// w shows nothing.
func startTransfer(w io.Writer, what string, total int64) *transfer {
	t := &transfer{w: w, what: what, total: total, began: time.Now(), stop: make(chan struct{})}
	if w == nil {
		return t
	}
	go func() {
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				return
			case <-tick.C:
				d := t.done.Load()
				say(w, "  %s: %.1f of %.1f MB (%.0f%%), %.1f MB/s", t.what, float64(d)/1e6, float64(t.total)/1e6,
					100*float64(d)/float64(max(t.total, 1)), float64(d)/time.Since(t.began).Seconds()/1e6)
			}
		}
	}()
	return t
}

// writerAt counts what is written through it.
func (t *transfer) writerAt(w io.WriterAt) io.WriterAt { return countingWriterAt{w, &t.done} }

// finish stops the progress lines and, when ok, prints the closing line.
func (t *transfer) finish(ok bool) {
	close(t.stop)
	if ok && t.w != nil {
		sec := time.Since(t.began).Seconds()
		say(t.w, "fetched %s: %.1f MB in %.1fs (%.1f MB/s)", t.what, float64(t.total)/1e6, sec, float64(t.total)/sec/1e6)
	}
}

// countingWriterAt counts bytes written.
type countingWriterAt struct {
	w io.WriterAt
	n *atomic.Int64
}

func (c countingWriterAt) WriteAt(p []byte, off int64) (int, error) {
	k, err := c.w.WriteAt(p, off)
	c.n.Add(int64(k))
	return k, err
}
