package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
)

// A volunteer of a run over a packed dataset (data.source = "dataset")
// fetches only the chunks it trains on. Which block of the train split it
// trains in a round comes from the run's data ledger (data.Ledger), which
// is part of the run's certified state: the served state's tail, hashed
// into the state root every member votes on. So every member holds the
// same ledger, a newcomer takes it with the state, and no member's word
// alone moves it. After each round the ledger advances with the round's
// certified group: the blocks of members outside it go back to the pool.
//
// NoLoCo has no agreed group: each member takes the block at its rank
// among the volunteers it sees, counted from the step, so members with the
// same view train disjoint blocks, and the overlap of differing views is
// logged.

// datasetDir is the chunk cache inside a volunteer's data directory.
const datasetDir = "tokens"

// openDataset opens the run's packed dataset over a chunk cache that fetches
// from the run's members (the bootstrap first, which serves every chunk).
func (v *Volunteer) openDataset(ctx context.Context) (*data.PackedSource, error) {
	ds, err := v.run.Data.Dataset()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrManifest, err)
	}
	dir := filepath.Join(v.cfg.DataDir, datasetDir)
	if v.cfg.DataDir == "" {
		if dir, err = os.MkdirTemp("", "skein-tokens-*"); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		v.tempShards = dir // removed on Close
	}
	v.dataCtx, v.dataCancel = context.WithCancel(context.Background())
	src, err := data.OpenPackedCache(v.dataCtx, ds, dir, v.fetchTokens)
	if err != nil {
		return nil, err
	}
	say(v.cfg.Progress, "dataset: %s, %d train tokens in %d shards, %d validation tokens; fetching only the chunks this volunteer trains on",
		ds.Tokenizer, ds.SplitTokens(data.Train), len(ds.Train), ds.SplitTokens(data.Validation))
	return src, nil
}

// fetchTokens fetches bytes of a token shard from the run's members: the
// bootstraps first, then the volunteers (which serve the chunks they hold).
// Bytes that fail check are logged with their server and taken from the
// next member.
func (v *Volunteer) fetchTokens(ctx context.Context, name string, off, n int64, check func([]byte) error) ([]byte, error) {
	var lastErr error = errors.New("no member to fetch from")
	for attempt := 0; attempt < 3; attempt++ {
		boots, vols := memberSources(v.pn)
		for _, id := range append(boots, vols...) {
			buf := make(memWriterAt, n)
			fctx, cancel := context.WithTimeout(ctx, fetchTimeout(n))
			// Fetch writes at the shard's offsets: shift them into buf.
			got, err := v.pn.Fetch(fctx, id, data.TokenKey(name), shifted{buf, off}, p2p.FetchOptions{Offset: off, Length: n})
			cancel()
			if err == nil && got != n {
				err = fmt.Errorf("%d of %d bytes", got, n)
			}
			if err == nil {
				if err = check(buf); err != nil {
					v.log.Warn("a member served dataset bytes that do not match their hash; taking them from another member",
						"offender", id, "shard", name[:12], "offset", off)
				}
			}
			if err == nil {
				return buf, nil
			}
			lastErr = fmt.Errorf("%s: %w", shortPeer(id), err)
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt+1) * time.Second):
		}
	}
	return nil, fmt.Errorf("node: shard %.12s bytes %d+%d: %w", name, off, n, lastErr)
}

// shifted writes at offsets less base.
type shifted struct {
	w    memWriterAt
	base int64
}

func (s shifted) WriteAt(p []byte, off int64) (int, error) { return s.w.WriteAt(p, off-s.base) }

// initBlocks cuts the train split into the run's blocks (a round of inner
// steps of one member each) and starts the ledger of a DiLoCo run.
func (v *Volunteer) initBlocks() error {
	m := v.run
	b, err := data.NewBlocks(v.tokens.Tokens(data.Train), v.su.T, m.Optimizer.InnerSteps*m.Model.Batch, m.Model.Seed)
	if err != nil {
		return err
	}
	v.blocks = b
	if m.Optimizer.Kind == manifest.KindDiLoCo {
		if m.Optimizer.Delayed {
			return fmt.Errorf("%w: run %q trains on a packed dataset with the delayed outer step (optimizer.delayed); volunteers assign a dataset's blocks to plain rounds only",
				ErrUnsupported, m.RunID)
		}
		v.ledger = &data.Ledger{}
	}
	say(v.cfg.Progress, "dataset: %d blocks of %d windows of %d tokens an epoch", b.N, b.PerBlock, b.T+1)
	return nil
}

// assignBlock points the loader at the block this member trains in the
// coming inner phase and fetches its chunks, and those of the block it
// will likely train next, in the background.
func (v *Volunteer) assignBlock() {
	if v.tokens == nil {
		return
	}
	self := v.pn.ID().String()
	var slot, next data.Slot
	if v.ledger != nil {
		slot = v.ledger.SlotOf(self, v.blocks)
		// Next round's, if the group stays as it is (this member in it).
		g := slices.Clone(v.ledger.Group)
		if !slices.Contains(g, self) {
			g = append(g, self)
		}
		after := v.ledger.Advance(v.ledger.Round+1, g, v.blocks)
		next = after.SlotOf(self, v.blocks)
	} else {
		slot, next = v.nolocoSlot(v.innerStep), v.nolocoSlot(v.innerStep+v.run.Optimizer.InnerSteps)
	}
	v.su.Loader.UseBlock(v.blocks, slot, v.innerStep)
	v.slot = slot
	for _, s := range []data.Slot{slot, next} {
		off, n := v.blocks.Range(s)
		v.prefetch.Go(func() {
			if err := v.tokens.Prefetch(data.Train, off, n); err != nil && v.dataCtx.Err() == nil {
				v.log.Debug("prefetch", "block", v.blocks.Block(s), "err", err)
			}
		})
	}
}

// nolocoSlot is the block a NoLoCo member trains in the phase starting at
// step: the one at its rank among the volunteers it sees, counted from the
// phase's number.
func (v *Volunteer) nolocoSlot(step int) data.Slot {
	self := v.pn.ID().String()
	ids := []string{self}
	for _, a := range announcements(v.pn) {
		ids = append(ids, string(a.id))
	}
	slices.Sort(ids)
	rank, _ := slices.BinarySearch(ids, self)
	phase := uint64(step / max(1, v.run.Optimizer.InnerSteps))
	pos := phase*uint64(len(ids)) + uint64(rank)
	return data.Slot{Epoch: pos / v.blocks.N, Pos: pos % v.blocks.N}
}

// advanceLedger accounts a completed round: its certified group trained
// its slots; the others' go back to the pool.
func (v *Volunteer) advanceLedger(st optimizer.RoundStats) {
	if v.ledger == nil {
		return
	}
	g := make([]string, len(st.Group))
	for i, id := range st.Group {
		g[i] = string(id)
	}
	l := v.ledger.Advance(v.dl.Round, g, v.blocks)
	v.ledger = &l
}

// tail is the state's tail: the ledger's encoding, nil without one.
func (v *Volunteer) tail() []byte {
	if v.ledger == nil {
		return nil
	}
	b, err := v.ledger.MarshalBinary()
	if err != nil {
		v.log.Error("encoding the data ledger", "err", err)
		return nil
	}
	return b
}

// setTail installs the ledger of a state taken from the run (its bytes
// checked against the certified hash already) or from the local
// checkpoint.
func (v *Volunteer) setTail(round uint64, b []byte) error {
	if v.ledger == nil {
		if b != nil {
			return fmt.Errorf("%w: a state with a tail for a run without a ledger", ErrBadState)
		}
		return nil
	}
	var l data.Ledger
	if err := l.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("%w: %w", ErrBadState, err)
	}
	if err := l.Check(v.blocks); err != nil {
		return fmt.Errorf("%w: %w", ErrBadState, err)
	}
	if l.Round != round {
		return fmt.Errorf("%w: the data ledger of round %d with the state of round %d", ErrBadState, l.Round, round)
	}
	v.ledger = &l
	return nil
}

// hashNow is the hash of the shared state this member holds.
func (v *Volunteer) hashNow() uint64 {
	t := v.tail()
	if t == nil {
		return v.dl.StateHash()
	}
	return optimizer.StateRootWith(v.dl.Round, len(v.dl.Phi), v.dl.StateChunkHashes(), sha256.Sum256(t))
}

// ledgered is the DiLoCo state with its tail, as adoptState installs it.
type ledgered struct {
	*optimizer.DiLoCo
	v *Volunteer
}

func (l ledgered) SetTail(round uint64, b []byte) error { return l.v.setTail(round, b) }

// tailSetter is an outerState whose state has a tail.
type tailSetter interface {
	SetTail(round uint64, b []byte) error
}

// adoptable is what adoptState installs the run's state into.
func (v *Volunteer) adoptable() outerState {
	if v.ledger == nil {
		return v.dl
	}
	return ledgered{v.dl, v}
}

// dataProgress is the epoch and the share of it trained, for reports.
func (v *Volunteer) dataProgress() (epoch uint64, done float64, ok bool) {
	if v.ledger == nil {
		return 0, 0, false
	}
	return v.ledger.Epoch, v.ledger.Progress(v.blocks), true
}

// trainedTokens is the tokens the run has trained by the ledger (whole
// epochs and the blocks of the current one), or by this member's estimate
// of the phases all members ran (NoLoCo).
func (v *Volunteer) trainedTokens() (epoch uint64, tokens int64) {
	if v.ledger != nil {
		return v.ledger.Epoch, (int64(v.ledger.Epoch)*int64(v.blocks.N) + int64(v.ledger.Trained)) * v.blocks.BlockTokens()
	}
	s := v.nolocoSlot(v.innerStep)
	return s.Epoch, (int64(s.Epoch)*int64(v.blocks.N) + int64(s.Pos)) * v.blocks.BlockTokens()
}

// runComplete says why the run has ended (data.epochs or data.max_tokens
// reached), or "" while it goes on.
func (v *Volunteer) runComplete() string {
	d := v.run.Data
	if v.tokens == nil || (d.Epochs == 0 && d.MaxTokens == 0) {
		return ""
	}
	epoch, tokens := v.trainedTokens()
	switch {
	case d.Epochs > 0 && epoch >= uint64(d.Epochs):
		return fmt.Sprintf("%d epochs trained (data.epochs)", epoch)
	case d.MaxTokens > 0 && tokens >= d.MaxTokens:
		return fmt.Sprintf("%d tokens trained, the limit is %d (data.max_tokens)", tokens, d.MaxTokens)
	}
	return ""
}

// closeDataset stops fetches in flight.
func (v *Volunteer) closeDataset() {
	if v.dataCancel != nil {
		v.dataCancel()
	}
	v.prefetch.Wait()
}
