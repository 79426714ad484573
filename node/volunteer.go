package node

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/trainer"
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

// Volunteer is one machine lent to a run: its p2p node, its model and data
// (trainer.Setup), the ring and the DiLoCo state it shares with the others.
// Its methods are the phases of a volunteer's life: NewVolunteer joins,
// Run trains and contributes round after round (re-syncing when it falls
// behind or diverges), Close checkpoints and leaves.
type Volunteer struct {
	cfg   VolunteerConfig
	log   *slog.Logger
	pn    *p2p.Node
	su    *trainer.Setup
	peers *P2PPeers
	ring  *optimizer.Ring
	dl    *optimizer.DiLoCo

	theta     []float32 // the stage's weights, host copy
	n         int       // parameters
	innerStep int       // inner steps trained so far (the AdamW schedule's clock)
	ckPath    string    // local checkpoint; "" = none
	// lastReported is the last round told to the user and OnRound.
	lastReported uint64

	cancelRing context.CancelFunc
	mu         sync.Mutex
	served     []byte // the encoded shared state served to joiners
}

// Join runs a volunteer until ctx ends or cfg.Rounds are done, then saves
// its state and leaves the run gracefully.
func Join(ctx context.Context, cfg VolunteerConfig) error {
	v, err := NewVolunteer(ctx, cfg)
	if err != nil {
		return err
	}
	err = v.Run(ctx)
	if cerr := v.Close(); err == nil {
		err = cerr
	}
	return err
}

// NewVolunteer joins the run: starts the p2p node, builds the model and data
// stream, resumes the local checkpoint if there is one, and serves the
// shared state to joiners. Close undoes it.
func NewVolunteer(ctx context.Context, cfg VolunteerConfig) (_ *Volunteer, err error) {
	v := &Volunteer{cfg: cfg, log: cfg.Logger}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	if _, err := model.Preset(cfg.Preset); err != nil {
		return nil, err
	}
	if cfg.Batch <= 0 || cfg.InnerSteps <= 0 || cfg.Rounds < 0 || cfg.MinPeers < 1 {
		return nil, fmt.Errorf("%w: batch %d, inner steps %d, rounds %d, min peers %d", ErrConfig, cfg.Batch, cfg.InnerSteps, cfg.Rounds, cfg.MinPeers)
	}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	ncfg := p2p.DefaultNodeConfig(cfg.RunID)
	ncfg.DataDir, ncfg.Bootstrap, ncfg.Timing, ncfg.Logger = cfg.DataDir, cfg.Bootstrap, cfg.Timing, v.log
	if len(cfg.Listen) > 0 {
		ncfg.ListenAddrs = cfg.Listen
	}
	ncfg.Meta.Role, ncfg.Meta.Device = p2p.RoleVolunteer, "cpu"
	if v.pn, err = p2p.NewNode(ctx, ncfg); err != nil {
		return nil, err
	}
	say(cfg.Progress, "joined run %q as %s; %d members", cfg.RunID, v.pn.ID(), v.pn.NumMembers())

	const slots = 1 << 16
	if v.su, err = trainer.NewSetup(trainer.SetupConfig{Preset: cfg.Preset, Batch: cfg.Batch, SeqLen: cfg.SeqLen,
		Seed: cfg.Seed, Threads: cfg.Threads, CorpusPaths: cfg.Corpus, Worker: trainer.WorkerSlot(v.pn.ID().String(), slots),
		Workers: slots, AdamW: cfg.AdamW}); err != nil {
		return nil, err
	}
	v.n = v.su.Stage.NumParams()
	maxMsg := uint32(min(stateSize(v.n)+1<<20, 1<<30))
	if v.peers, err = NewP2PPeers(v.pn, p2p.ProtoReduce, maxMsg, 60*time.Second); err != nil {
		return nil, err
	}
	if cfg.Ring.Logger == nil {
		cfg.Ring.Logger = v.log
	}
	if v.ring, err = optimizer.NewRing(v.peers, cfg.Ring); err != nil {
		return nil, err
	}
	// The ring outlives ctx long enough to finish cleanly; Close stops it.
	var rctx context.Context
	rctx, v.cancelRing = context.WithCancel(context.Background())
	v.ring.Start(rctx)
	v.theta = make([]float32, v.n)
	v.su.Dev.CopyOut(v.theta, v.su.Stage.Params)
	if v.dl, err = optimizer.NewDiLoCo(cfg.DiLoCo, v.ring, v.theta); err != nil {
		return nil, err
	}
	v.resume()
	v.served = encodeState(v.dl.State())
	if err := v.pn.ServeBulk(v.serveBulk, 0); err != nil {
		return nil, err
	}
	return v, nil
}

// resume loads the local checkpoint (weights, AdamW moments, the round and
// phi/momentum), if any; the weights restart from phi.
func (v *Volunteer) resume() {
	if v.cfg.DataDir == "" {
		return
	}
	v.ckPath = filepath.Join(v.cfg.DataDir, volunteerCheckpoint)
	step, err := resumeVolunteer(v.ckPath, v.su.Stage, v.dl)
	switch {
	case err == nil:
		v.innerStep = step
		v.setWeights()
		say(v.cfg.Progress, "resumed local checkpoint at round %d", v.dl.Round)
	case !errors.Is(err, os.ErrNotExist):
		v.log.Warn("ignoring unusable local checkpoint", "path", v.ckPath, "err", err)
	}
}

// serveBulk serves the shared state to joiners (bulk key stateKey).
func (v *Volunteer) serveBulk(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) {
	if key != stateKey {
		return nil, 0, fmt.Errorf("node: no bulk key %q", key)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return bytes.NewReader(v.served), int64(len(v.served)), nil
}

// Close saves the local checkpoint and leaves the run gracefully.
func (v *Volunteer) Close() error {
	v.save()
	return v.close()
}

func (v *Volunteer) close() error {
	if v.ring != nil {
		v.ring.Close()
	}
	if v.cancelRing != nil {
		v.cancelRing()
	}
	if v.peers != nil {
		v.peers.Close()
	}
	if v.su != nil {
		v.su.Close()
	}
	if v.pn != nil {
		return v.pn.Close() // graceful leave
	}
	return nil
}

// Run trains until ctx ends (nil error) or cfg.Rounds rounds are done:
// first it waits for enough volunteers and catches up with the run, then
// each round is an inner phase followed by a contribution.
func (v *Volunteer) Run(ctx context.Context) error {
	if !v.waitForPeers(ctx) {
		return nil
	}
	if err := catchUp(ctx, v.pn, v.dl, v.n, v.log); err != nil {
		v.log.Warn("could not fetch the run's state; starting from the local one", "err", err)
	} else {
		v.setWeights()
	}
	v.announce(ctx)
	v.lastReported = v.dl.Round
	// --rounds counts rounds the run completes while this volunteer is in
	// it (a round adopted from the others counts; a failed one does not).
	stopAt := v.dl.Round + uint64(v.cfg.Rounds)
	for v.cfg.Rounds == 0 || v.dl.Round < stopAt {
		began := time.Now()
		lossSum, err := v.trainPhase(ctx)
		if err != nil || ctx.Err() != nil {
			return err
		}
		if err := v.contribute(ctx, lossSum, began); err != nil || ctx.Err() != nil {
			return err
		}
	}
	return nil
}

// waitForPeers waits for cfg.MinPeers volunteers and for the view to settle
// (unchanged for a second), so that the first round's group is the same
// everywhere. It reports false when ctx ended first.
func (v *Volunteer) waitForPeers(ctx context.Context) bool {
	var last []optimizer.PeerID
	for stable := 0; stable < 2; {
		cur := v.peers.Members()
		slices.Sort(cur)
		switch {
		case len(cur) < v.cfg.MinPeers:
			stable = 0
			say(v.cfg.Progress, "waiting for volunteers: %d of %d", len(cur), v.cfg.MinPeers)
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
			return false
		case <-time.After(500 * time.Millisecond):
		}
	}
	return true
}

// trainPhase runs the round's inner steps and returns the sum of their losses.
func (v *Volunteer) trainPhase(ctx context.Context) (float64, error) {
	var lossSum float64
	for s := 0; s < v.cfg.InnerSteps; s++ {
		if ctx.Err() != nil {
			return lossSum, nil
		}
		r, err := v.su.Step(v.innerStep)
		if err != nil {
			return lossSum, err
		}
		v.innerStep++
		lossSum += float64(r.Loss)
	}
	return lossSum, nil
}

// contribute offers the round's pseudo-gradient to the ring and installs
// the result; or, when this member fell behind or diverged, takes the run's
// state instead.
func (v *Volunteer) contribute(ctx context.Context, lossSum float64, began time.Time) error {
	// Fell behind (joined late, or slow): take the run's state instead of
	// offering a pseudo-gradient for a round the others have finished.
	if before := v.dl.Round; catchUp(ctx, v.pn, v.dl, v.n, v.log) == nil && v.dl.Round > before {
		say(v.cfg.Progress, "behind the run: jumped from round %d to %d", before, v.dl.Round)
		v.adopted(ctx, lossSum)
		return nil
	}
	// Ended the last round with another state than the run's (the others'
	// announcements have arrived by now): train from theirs.
	if v.resynced(ctx) {
		v.adopted(ctx, lossSum)
		return nil
	}
	v.su.Dev.CopyOut(v.theta, v.su.Stage.Params)
	st, err := v.outerStep(ctx)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		if _, fatal := err.(fatalRoundError); fatal {
			return err
		}
		v.adopted(ctx, lossSum) // the run's state if newer; else back to phi
		return nil
	}
	v.install(ctx)       // OuterStep left theta = phi
	if v.resynced(ctx) { // the others finished this round with another result
		v.install(ctx)
	}
	v.lastReported = v.dl.Round
	rep := RoundReport{Round: v.dl.Round, Loss: float32(lossSum / float64(v.cfg.InnerSteps)), Members: len(v.peers.Members()),
		Stats: st, StateHash: v.dl.StateHash()}
	say(v.cfg.Progress, "round %d: loss %.4f, %d in group, %.1f kB sent, %.1fs (state %016x)", rep.Round, rep.Loss,
		len(st.Group), float64(st.BytesSent)/1e3, time.Since(began).Seconds(), rep.StateHash)
	v.report(rep)
	return nil
}

// fatalRoundError ends the volunteer: a round failed and the run's state
// could not be fetched either.
type fatalRoundError struct{ error }

// outerStep offers theta to the round, retrying a failed round at once with
// the same pseudo-gradient (up to roundTries) while nobody finishes it.
func (v *Volunteer) outerStep(ctx context.Context) (optimizer.RoundStats, error) {
	for try := 1; ; try++ {
		st, err := v.dl.OuterStep(ctx, v.theta)
		if err == nil || ctx.Err() != nil {
			return st, err
		}
		v.log.Warn("round failed", "round", v.dl.Round+1, "try", try, "err", err)
		say(v.cfg.Progress, "round %d did not complete (%v); re-syncing and retrying", v.dl.Round+1, err)
		before := v.dl.Round
		if cerr := catchUp(ctx, v.pn, v.dl, v.n, v.log); cerr != nil {
			return st, fatalRoundError{fmt.Errorf("round %d: %w (re-sync: %v)", v.dl.Round+1, err, cerr)}
		}
		if v.dl.Round > before || try == roundTries {
			return st, err // the others finished it without us (adopted), or give this pseudo-gradient up
		}
		// Nobody finished the round: offer the same pseudo-gradient again at
		// once (OuterStep left theta and the error feedback as they were),
		// so that members that failed together retry together; retraining
		// first would spread them an inner phase apart, and the first back
		// would exclude the others.
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(time.Duration(try) * 500 * time.Millisecond):
		}
	}
}

// setWeights makes phi the stage's weights.
func (v *Volunteer) setWeights() {
	copy(v.theta, v.dl.Phi)
	v.su.Dev.CopyIn(v.su.Stage.Params, v.theta)
}

// install makes the shared state the stage's weights, what this member
// serves to joiners and what it announces.
func (v *Volunteer) install(ctx context.Context) {
	v.setWeights()
	blob := encodeState(v.dl.State())
	v.mu.Lock()
	v.served = blob
	v.mu.Unlock()
	v.announce(ctx)
}

// announce gossips this member's round and state hash in its metadata.
func (v *Volunteer) announce(ctx context.Context) {
	round, hash := v.dl.Round, v.dl.StateHash()
	if err := v.pn.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = round, hash }); err != nil {
		v.log.Debug("announcing state", "err", err)
	}
}

// resynced takes the run's state when this member's differs from it
// (divergedFrom; DESIGN.md, consistency) and says whether it did.
func (v *Volunteer) resynced(ctx context.Context) bool {
	ids := divergedFrom(v.pn, v.dl)
	if len(ids) == 0 {
		return false
	}
	v.log.Warn("state differs from the run's; re-syncing", "round", v.dl.Round)
	if err := adoptFrom(ctx, v.pn, v.dl, v.n, ids); err != nil {
		v.log.Warn("re-sync failed", "err", err)
		return false
	}
	return true
}

// adopted installs the run's state just taken and reports the rounds it
// covers; the inner steps since the last round are dropped.
func (v *Volunteer) adopted(ctx context.Context, lossSum float64) {
	v.install(ctx)
	if v.dl.Round == v.lastReported {
		return
	}
	v.lastReported = v.dl.Round
	rep := RoundReport{Round: v.dl.Round, Loss: float32(lossSum / float64(v.cfg.InnerSteps)), Members: len(v.peers.Members()),
		StateHash: v.dl.StateHash(), Adopted: true}
	say(v.cfg.Progress, "round %d: adopted the run's state (state %016x)", rep.Round, rep.StateHash)
	v.report(rep)
}

// report tells OnRound about a finished round and checkpoints.
func (v *Volunteer) report(rep RoundReport) {
	if v.cfg.OnRound != nil {
		v.cfg.OnRound(rep)
	}
	v.save()
}

// save writes the local checkpoint, if there is one.
func (v *Volunteer) save() {
	if v.ckPath == "" || v.su == nil || v.dl == nil {
		return
	}
	if err := saveVolunteer(v.ckPath, v.su.Stage, v.innerStep, v.dl); err != nil {
		v.log.Error("saving checkpoint", "err", err)
	}
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
	return atomicfile.WriteFile(path+".state", encodeState(dl.State()), 0o644)
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

func say(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}
