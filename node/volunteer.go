package node

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
)

// VolunteerConfig configures `skein node join`: a volunteer that joins a run
// through its bootstrap (or any known member) and trains with DiLoCo.
type VolunteerConfig struct {
	RunID     string
	DataDir   string // identity, known peers and the local checkpoint
	Bootstrap []string
	Listen    []string // default: QUIC and TCP on all interfaces, any port
	Timing    p2p.Timing

	Preset     string
	Batch      int
	SeqLen     int
	InnerSteps int // H
	Rounds     int // stop after this many rounds (0: until interrupted)
	Seed       uint64
	Threads    int
	AdamW      optimizer.AdamWConfig // TotalSteps: the schedule's length in inner steps
	DiLoCo     optimizer.DiLoCoConfig
	Ring       optimizer.RingConfig
	Corpus     []string
	MinPeers   int // volunteers (self included) to wait for before the first round

	Logger   *slog.Logger
	Progress io.Writer
	// OnRound is told about every finished round.
	OnRound func(RoundReport)
}

// RoundReport describes one finished outer round of a volunteer.
type RoundReport struct {
	Round     uint64
	Loss      float32 // mean training loss of the inner steps
	Members   int
	Stats     optimizer.RoundStats
	StateHash uint64
	// Adopted: this volunteer did not contribute to the round (it joined
	// late, fell behind or was excluded) and took the run's state after it.
	Adopted bool
}

// roundTries is how often a volunteer offers one pseudo-gradient to a round
// that fails before it trains again from the run's state.
const roundTries = 3

// DefaultVolunteerConfig returns settings for the tiny preset.
func DefaultVolunteerConfig(runID string) VolunteerConfig {
	a := optimizer.DefaultAdamW()
	a.LR, a.Warmup, a.TotalSteps = 1e-3, 20, 10000
	rc := optimizer.DefaultRingConfig()
	return VolunteerConfig{RunID: runID, Timing: p2p.WANTiming(), Preset: "tiny", Batch: 8, InnerSteps: 50, Seed: 1,
		AdamW: a, DiLoCo: optimizer.DefaultDiLoCo(), Ring: rc, MinPeers: 1}
}

const volunteerCheckpoint = "volunteer.safetensors"

// Volunteer runs until ctx ends or Rounds are done, then saves its state and
// leaves the run gracefully.
func Volunteer(ctx context.Context, cfg VolunteerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mc, err := model.Preset(cfg.Preset)
	if err != nil {
		return err
	}
	if cfg.Batch <= 0 || cfg.InnerSteps <= 0 || cfg.Rounds < 0 || cfg.MinPeers < 1 {
		return fmt.Errorf("%w: batch %d, inner steps %d, rounds %d, min peers %d", ErrConfig, cfg.Batch, cfg.InnerSteps, cfg.Rounds, cfg.MinPeers)
	}
	T := cfg.SeqLen
	if T == 0 {
		T = mc.MaxT
	}
	ncfg := p2p.DefaultNodeConfig(cfg.RunID)
	ncfg.DataDir, ncfg.Bootstrap, ncfg.Timing, ncfg.Logger = cfg.DataDir, cfg.Bootstrap, cfg.Timing, log
	if len(cfg.Listen) > 0 {
		ncfg.ListenAddrs = cfg.Listen
	}
	ncfg.Meta.Role, ncfg.Meta.Device = p2p.RoleVolunteer, "cpu"
	pn, err := p2p.NewNode(ctx, ncfg)
	if err != nil {
		return err
	}
	defer pn.Close() // graceful leave
	say(cfg.Progress, "joined run %q as %s; %d members", cfg.RunID, pn.ID(), pn.NumMembers())

	corpus, err := openCorpus(cfg.Corpus)
	if err != nil {
		return err
	}
	defer corpus.Close()
	// Volunteers are not numbered: each draws its stream by a hash of its
	// peer ID among 2^16 slots, disjoint from the others' unless two collide.
	h := fnv.New64a()
	h.Write([]byte(pn.ID()))
	const slots = 1 << 16
	loader, err := data.NewLoader(corpus, data.Train, data.LoaderConfig{Seed: cfg.Seed, Worker: int(h.Sum64() % slots), Workers: slots, B: cfg.Batch, T: T})
	if err != nil {
		return err
	}
	dev := kernels.NewCPU(cfg.Threads)
	stage, err := model.NewStage(dev, mc, model.FullSpec(mc), cfg.Batch, T, cfg.Seed)
	if err != nil {
		return err
	}
	opt, err := optimizer.NewAdamW(cfg.AdamW)
	if err != nil {
		return err
	}
	n := stage.NumParams()
	maxMsg := uint32(min(stateSize(n)+1<<20, 1<<30))
	peers, err := NewP2PPeers(pn, "reduce", maxMsg, 60*time.Second)
	if err != nil {
		return err
	}
	defer peers.Close()
	rctx, cancel := context.WithCancel(context.Background()) // the ring outlives ctx long enough to finish cleanly
	defer cancel()
	if cfg.Ring.Logger == nil {
		cfg.Ring.Logger = log
	}
	ring, err := optimizer.NewRing(peers, cfg.Ring)
	if err != nil {
		return err
	}
	ring.Start(rctx)
	defer ring.Close()
	theta := make([]float32, n)
	dev.CopyOut(theta, stage.Params)
	dl, err := optimizer.NewDiLoCo(cfg.DiLoCo, ring, theta)
	if err != nil {
		return err
	}

	// Local checkpoint: parameters, AdamW moments, the round and phi/momentum.
	ckPath := ""
	innerStep := 0
	if cfg.DataDir != "" {
		ckPath = filepath.Join(cfg.DataDir, volunteerCheckpoint)
		if step, err := resumeVolunteer(ckPath, stage, dl); err == nil {
			innerStep = step
			copy(theta, dl.Phi)
			dev.CopyIn(stage.Params, theta)
			say(cfg.Progress, "resumed local checkpoint at round %d", dl.Round)
		} else if !errors.Is(err, os.ErrNotExist) {
			log.Warn("ignoring unusable local checkpoint", "path", ckPath, "err", err)
		}
	}

	// Serve the shared state to joiners; refreshed after every round.
	var mu sync.Mutex
	latest := encodeState(dl.State())
	if err := pn.ServeBulk(func(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) {
		if key != stateKey {
			return nil, 0, fmt.Errorf("node: no bulk key %q", key)
		}
		mu.Lock()
		defer mu.Unlock()
		return bytes.NewReader(latest), int64(len(latest)), nil
	}, 0); err != nil {
		return err
	}

	// Wait for enough volunteers and for the view to settle (unchanged for a
	// second), so that the first round's group is the same everywhere; then
	// catch up with the furthest member.
	var last []optimizer.PeerID
	for stable := 0; stable < 2; {
		cur := peers.Members()
		slices.Sort(cur)
		switch {
		case len(cur) < cfg.MinPeers:
			stable = 0
			say(cfg.Progress, "waiting for volunteers: %d of %d", len(cur), cfg.MinPeers)
		case slices.Equal(cur, last):
			stable++
		default:
			stable = 1
		}
		last = cur
		if stable >= 2 {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err := catchUp(ctx, pn, dl, n, log); err != nil {
		log.Warn("could not fetch the run's state; starting from the local one", "err", err)
	} else {
		copy(theta, dl.Phi)
		dev.CopyIn(stage.Params, theta)
	}
	announce(ctx, pn, dl)

	in, tg := make([]int32, cfg.Batch*T), make([]int32, cfg.Batch*T)
	save := func() {
		if ckPath == "" {
			return
		}
		if err := saveVolunteer(ckPath, stage, innerStep, dl); err != nil {
			log.Error("saving checkpoint", "err", err)
		}
	}
	defer save()
	// install makes dl's shared state the stage's weights, what this member
	// serves to joiners and what it announces.
	install := func() {
		copy(theta, dl.Phi)
		dev.CopyIn(stage.Params, theta)
		mu.Lock()
		latest = encodeState(dl.State())
		mu.Unlock()
		if err := announce(ctx, pn, dl); err != nil {
			log.Debug("announcing state", "err", err)
		}
	}
	// resynced takes the run's state when this member's differs from it
	// (divergedFrom; DESIGN.md, consistency) and says whether it did.
	resynced := func() bool {
		ids := divergedFrom(pn, dl)
		if len(ids) == 0 {
			return false
		}
		log.Warn("state differs from the run's; re-syncing", "round", dl.Round)
		if err := adoptFrom(ctx, pn, dl, n, ids); err != nil {
			log.Warn("re-sync failed", "err", err)
			return false
		}
		return true
	}
	// adopted installs the run's state just taken and reports the rounds it
	// covers; the inner steps since the last round are dropped.
	lastReported := dl.Round
	adopted := func(lossSum float64) {
		install()
		if dl.Round == lastReported {
			return
		}
		lastReported = dl.Round
		rep := RoundReport{Round: dl.Round, Loss: float32(lossSum / float64(cfg.InnerSteps)), Members: len(peers.Members()),
			StateHash: dl.StateHash(), Adopted: true}
		say(cfg.Progress, "round %d: adopted the run's state (state %016x)", rep.Round, rep.StateHash)
		if cfg.OnRound != nil {
			cfg.OnRound(rep)
		}
		save()
	}
	// --rounds counts rounds the run completes while this volunteer is in
	// it (a round adopted from the others counts; a failed one does not).
	stopAt := dl.Round + uint64(cfg.Rounds)
	for cfg.Rounds == 0 || dl.Round < stopAt {
		began := time.Now()
		var lossSum float64
		for s := 0; s < cfg.InnerSteps; s++ {
			if ctx.Err() != nil {
				return nil
			}
			r, err := trainStep(stage, opt, loader, innerStep, in, tg)
			if err != nil {
				return err
			}
			innerStep++
			lossSum += float64(r.loss)
		}
		// Fell behind (joined late, or slow): take the run's state instead of
		// offering a pseudo-gradient for a round the others have finished.
		if before := dl.Round; catchUp(ctx, pn, dl, n, log) == nil && dl.Round > before {
			say(cfg.Progress, "behind the run: jumped from round %d to %d", before, dl.Round)
			adopted(lossSum)
			continue
		}
		// Ended the last round with another state than the run's (the
		// others' announcements have arrived by now): train from theirs.
		if resynced() {
			adopted(lossSum)
			continue
		}
		dev.CopyOut(theta, stage.Params)
		var st optimizer.RoundStats
		var err error
		for try := 1; ; try++ {
			if st, err = dl.OuterStep(ctx, theta); err == nil || ctx.Err() != nil {
				break
			}
			log.Warn("round failed", "round", dl.Round+1, "try", try, "err", err)
			say(cfg.Progress, "round %d did not complete (%v); re-syncing and retrying", dl.Round+1, err)
			before := dl.Round
			if cerr := catchUp(ctx, pn, dl, n, log); cerr != nil {
				return fmt.Errorf("round %d: %w (re-sync: %v)", dl.Round+1, err, cerr)
			}
			if dl.Round > before || try == roundTries {
				break // the others finished it without us (adopted), or give this pseudo-gradient up
			}
			// Nobody finished the round: offer the same pseudo-gradient
			// again at once (OuterStep left theta and the error feedback as
			// they were), so that members that failed together retry
			// together; retraining first would spread them an inner phase
			// apart, and the first back would exclude the others.
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(try) * 500 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			adopted(lossSum) // the run's state if newer; else back to phi
			continue
		}
		install()       // OuterStep left theta = phi
		if resynced() { // the others finished this round with another result
			install()
		}
		lastReported = dl.Round
		rep := RoundReport{Round: dl.Round, Loss: float32(lossSum / float64(cfg.InnerSteps)), Members: len(peers.Members()),
			Stats: st, StateHash: dl.StateHash()}
		say(cfg.Progress, "round %d: loss %.4f, %d in group, %.1f kB sent, %.1fs (state %016x)", rep.Round, rep.Loss,
			len(st.Group), float64(st.BytesSent)/1e3, time.Since(began).Seconds(), rep.StateHash)
		if cfg.OnRound != nil {
			cfg.OnRound(rep)
		}
		save()
	}
	return nil
}

// catchUp adopts the shared state of the most advanced volunteer when its
// announced round (gossiped in membership metadata) is ahead of ours. Only
// that member's state is downloaded, falling back to the next most advanced.
func catchUp(ctx context.Context, pn *p2p.Node, dl *optimizer.DiLoCo, n int, log *slog.Logger) error {
	type ahead struct {
		id    optimizer.PeerID
		round uint64
	}
	var cands []ahead
	for _, m := range pn.Members() {
		if m.Meta.Role == p2p.RoleVolunteer && m.ID != pn.ID() && m.Meta.Round > dl.Round {
			cands = append(cands, ahead{optimizer.PeerID(m.ID.String()), m.Meta.Round})
		}
	}
	if len(cands) == 0 {
		return nil
	}
	slices.SortFunc(cands, func(a, b ahead) int { return cmp.Compare(b.round, a.round) })
	ids := make([]optimizer.PeerID, len(cands))
	for i, c := range cands {
		ids[i] = c.id
	}
	if err := adoptFrom(ctx, pn, dl, n, ids); err != nil {
		return err
	}
	log.Info("adopted the run's state", "round", dl.Round)
	return nil
}

// The local checkpoint of a volunteer is two files written atomically one
// after the other: the stage (weights and AdamW moments) in safetensors, and
// the shared DiLoCo state beside it. On resume the weights are reset to the
// shared phi, so a crash between the two writes loses at most one round of
// local progress, never consistency.
func saveVolunteer(path string, stage *model.Stage, step int, dl *optimizer.DiLoCo) error {
	if err := model.SaveCheckpoint(path, stage.Snapshot(step, nil)); err != nil {
		return err
	}
	return writeFileAtomic(path+".state", encodeState(dl.State()))
}

// resumeVolunteer loads both files and returns the inner step reached.
func resumeVolunteer(path string, stage *model.Stage, dl *optimizer.DiLoCo) (int, error) {
	raw, err := os.ReadFile(path + ".state")
	if err != nil {
		return 0, err
	}
	round, phi, mom, err := decodeState(raw, stage.NumParams())
	if err != nil {
		return 0, err
	}
	ck, err := model.LoadCheckpoint(path)
	if err != nil {
		return 0, err
	}
	if err := stage.Restore(ck); err != nil {
		return 0, err
	}
	return ck.Step, dl.SetState(round, phi, mom)
}

func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".state-*.tmp")
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("node: writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("node: syncing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("node: closing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("node: installing %s: %w", path, err)
	}
	return nil
}

// announce gossips this member's round and state hash in its metadata.
func announce(ctx context.Context, pn *p2p.Node, dl *optimizer.DiLoCo) error {
	round, hash := dl.Round, dl.StateHash()
	return pn.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = round, hash })
}

// divergedFrom returns the members whose state this member should take:
// among the volunteers announcing this member's round (itself included),
// the state hash held by the most wins, a tie going to the smallest hash so
// that every member picks the same one (two members that ended a round
// differently must not each keep their own). nil when this member holds the
// winning hash or nobody else has announced this round yet.
func divergedFrom(pn *p2p.Node, dl *optimizer.DiLoCo) []optimizer.PeerID {
	mine := dl.StateHash()
	byHash := map[uint64][]optimizer.PeerID{}
	for _, m := range pn.Members() {
		if m.Meta.Role != p2p.RoleVolunteer || m.ID == pn.ID() || m.Meta.Round != dl.Round || m.Meta.StateHash == 0 {
			continue
		}
		byHash[m.Meta.StateHash] = append(byHash[m.Meta.StateHash], optimizer.PeerID(m.ID.String()))
	}
	return winningState(mine, byHash)
}

// winningState applies divergedFrom's rule to the holders of each hash
// (self not included in byHash).
func winningState(mine uint64, byHash map[uint64][]optimizer.PeerID) []optimizer.PeerID {
	best, bestN := mine, len(byHash[mine])+1
	for h, ids := range byHash {
		if h != mine && (len(ids) > bestN || (len(ids) == bestN && h < best)) {
			best, bestN = h, len(ids)
		}
	}
	if best == mine {
		return nil
	}
	return byHash[best]
}

// adoptFrom downloads the shared state from the first of ids that serves a
// valid one at this member's round or later, and installs it.
func adoptFrom(ctx context.Context, pn *p2p.Node, dl *optimizer.DiLoCo, n int, ids []optimizer.PeerID) error {
	var lastErr error = fmt.Errorf("node: no peer to re-sync from")
	for _, m := range ids {
		id, err := peer.Decode(string(m))
		if err != nil {
			continue
		}
		buf := make(memWriterAt, stateSize(n))
		fctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		_, err = pn.Fetch(fctx, id, stateKey, buf, p2p.FetchOptions{Length: int64(len(buf))})
		cancel()
		if err == nil {
			var round uint64
			var phi, mom []float32
			if round, phi, mom, err = decodeState(buf, n); err == nil {
				if round < dl.Round {
					err = fmt.Errorf("node: %s serves round %d, behind our %d", m, round, dl.Round)
				} else if err = dl.SetState(round, phi, mom); err == nil {
					return nil
				}
			}
		}
		lastErr = err
	}
	return lastErr
}
