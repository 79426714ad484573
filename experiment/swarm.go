package experiment

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/trainer"
	"github.com/skein-ml/skein/transport"
)

// Algorithm names a way of training with several workers.
type Algorithm string

// The algorithms RunSwarm knows.
const (
	// Sync is the synchronous baseline: one model, batch Workers*Batch.
	Sync Algorithm = "sync"
	// Single is one worker alone with batch Batch.
	Single Algorithm = "single"
	// DiLoCo averages pseudo-gradients over the butterfly collective every H steps.
	DiLoCo Algorithm = "diloco"
	// NoLoCo averages with a random group every H steps, no all-reduce.
	NoLoCo Algorithm = "noloco"
)

// SwarmConfig configures an in-process multi-worker run on one machine:
// the workers talk through transport.MemNetwork, so the run measures the
// algorithm, not the network.
type SwarmConfig struct {
	Algorithm  Algorithm
	Preset     string
	Workers    int // M
	Batch      int // per worker
	SeqLen     int // 0: the preset's context
	InnerSteps int // H
	Rounds     int // outer steps; each worker runs Rounds*InnerSteps inner steps
	Seed       uint64
	Threads    int // per worker

	AdamW  optimizer.AdamWConfig // TotalSteps is set to Rounds*InnerSteps
	DiLoCo optimizer.DiLoCoConfig
	NoLoCo optimizer.NoLoCoConfig
	// Codec encodes the contributions and the aggregates of the butterfly
	// collective.
	Codec compression.Config
	// AggCodec, if set, encodes the butterfly's aggregates instead
	// (optimizer.ButterflyConfig.AggCodec).
	AggCodec compression.Codec
	// Robust is the butterfly's aggregation rule (trim, norm clip); the
	// zero value is the plain mean, as in the papers.
	Robust optimizer.RobustConfig
	// Sparse, if set (DiLoCo), replaces the butterfly with an all-gather of
	// sparse messages with error feedback and a plain mean, or with Robust
	// set the robust rule per coordinate over the union (sparse.go): the
	// sparse codec's quality, in process.
	Sparse *compression.SparseConfig
	// SparseBeta is the sparse error feedback's decay (0: 1, none).
	SparseBeta float32
	// SubspaceRank, if positive (DiLoCo), sends each weight matrix's
	// coordinates in a shared rank-SubspaceRank basis through the
	// butterfly (optimizer.SubspaceConfig), with residual decay
	// SubspaceDecay (0: 1).
	SubspaceRank  int
	SubspaceDecay float32
	// Delayed (DiLoCo) overlaps each round's exchange with the next inner
	// phase (optimizer.DiLoCo.OuterStepDelayed); the last round is flushed
	// before the final evaluation.
	Delayed bool
	// OverlapSteps (with Delayed) lands each round this many inner steps
	// into the next phase (optimizer.DiLoCo.Land) instead of at its end:
	// the exchange hides behind that many steps, as in Streaming DiLoCo.
	OverlapSteps int
	// Attack, when non-zero, makes the last worker hostile: before every
	// round it multiplies its pseudo-gradient by Attack (for example 1000,
	// or -1 to flip its sign). Worker 0, the one evaluated, stays honest.
	Attack float64

	Corpus      []string
	EvalBatches int
	// Init, if set, is the starting checkpoint (warm start); its parameters
	// are used, not its optimizer state.
	Init   *model.Checkpoint
	Logger *slog.Logger
	// OnEval is called after each evaluation (every InnerSteps steps).
	OnEval func(step int, valLoss float32)
}

// EvalPoint is one validation of a swarm run.
type EvalPoint struct {
	Step    int     `json:"step"`   // inner steps per worker so far
	Tokens  int64   `json:"tokens"` // training tokens consumed by all workers
	ValLoss float32 `json:"val_loss"`
}

// SwarmResult summarizes a run.
type SwarmResult struct {
	Config        SwarmConfig `json:"-"`
	Curve         []EvalPoint `json:"curve"`
	FinalValLoss  float32     `json:"final_val_loss"`
	BytesSent     int64       `json:"bytes_sent"` // by all workers, all rounds
	BytesPerToken float64     `json:"bytes_per_token"`
	Seconds       float64     `json:"seconds"`
	Params        int         `json:"params"`
	Final         []float32   `json:"-"` // the evaluated model's parameters at the end
}

type swarmWorker struct {
	*trainer.Setup
	theta []float32
}

func (w *swarmWorker) step(step int) error {
	_, err := w.Step(step)
	return err
}

// RunSwarm trains with cfg.Algorithm and evaluates the validation loss every
// InnerSteps steps on a fixed held-out set.
func RunSwarm(ctx context.Context, cfg SwarmConfig) (*SwarmResult, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mc, err := model.Preset(cfg.Preset)
	if err != nil {
		return nil, err
	}
	if cfg.Workers <= 0 || cfg.Batch <= 0 || cfg.InnerSteps <= 0 || cfg.Rounds <= 0 || cfg.EvalBatches <= 0 {
		return nil, fmt.Errorf("%w: workers %d, batch %d, inner steps %d, rounds %d, eval batches %d must be positive",
			ErrConfig, cfg.Workers, cfg.Batch, cfg.InnerSteps, cfg.Rounds, cfg.EvalBatches)
	}
	T := cfg.SeqLen
	if T == 0 {
		T = mc.MaxT
	}
	if cfg.SubspaceRank > 0 {
		sc := optimizer.SubspaceConfig{Rank: cfg.SubspaceRank, Decay: cfg.SubspaceDecay, Seed: cfg.Seed,
			Matrices: SubspaceMatrices(model.Layout(mc, model.FullSpec(mc)), cfg.SubspaceRank)}
		if sc.Decay == 0 {
			sc.Decay = 1
		}
		cfg.DiLoCo.Subspace = &sc
	}
	corpus, err := trainer.OpenCorpus(cfg.Corpus)
	if err != nil {
		return nil, err
	}
	defer corpus.Close()
	dev := kernels.NewCPU(max(cfg.Threads, 1))
	totalSteps := cfg.Rounds * cfg.InnerSteps
	acfg := cfg.AdamW
	acfg.TotalSteps = totalSteps

	// Workers: Sync is one worker with M times the batch; Single is one
	// worker with the base batch; the distributed algorithms have M.
	nw, batch, workersForData := cfg.Workers, cfg.Batch, cfg.Workers
	switch cfg.Algorithm {
	case Sync:
		nw, batch, workersForData = 1, cfg.Batch*cfg.Workers, 1
	case Single:
		nw, workersForData = 1, 1
	case DiLoCo, NoLoCo:
		if cfg.Workers < 2 {
			return nil, fmt.Errorf("%w: %s needs at least 2 workers, got %d", ErrConfig, cfg.Algorithm, cfg.Workers)
		}
	default:
		return nil, fmt.Errorf("%w: unknown algorithm %q", ErrConfig, cfg.Algorithm)
	}
	workers := make([]*swarmWorker, nw)
	base := trainer.SetupConfig{Preset: cfg.Preset, Batch: batch, SeqLen: cfg.SeqLen, Seed: cfg.Seed, Dev: dev,
		Corpus: corpus, Workers: workersForData, AdamW: acfg, Init: cfg.Init}
	for i := range workers {
		sc := base
		sc.Worker = i
		su, err := trainer.NewSetup(sc)
		if err != nil {
			return nil, err
		}
		w := &swarmWorker{Setup: su, theta: make([]float32, su.Stage.NumParams())}
		dev.CopyOut(w.theta, su.Stage.Params)
		workers[i] = w
	}

	// Evaluation model: a separate stage at the base batch size.
	ec := base
	ec.Batch, ec.Workers, ec.ValBatches, ec.Init = cfg.Batch, 1, cfg.EvalBatches, nil
	eval, err := trainer.NewSetup(ec)
	if err != nil {
		return nil, err
	}
	evaluate := func(params []float32) (float32, error) {
		dev.CopyIn(eval.Stage.Params, params)
		return eval.Eval()
	}

	res := &SwarmResult{Config: cfg, Params: eval.Stage.NumParams()}
	tokensPerStep := int64(cfg.Batch * T * cfg.Workers)
	if cfg.Algorithm == Single {
		tokensPerStep = int64(cfg.Batch * T)
	}
	record := func(step int, params []float32) error {
		vl, err := evaluate(params)
		if err != nil {
			return err
		}
		res.Curve = append(res.Curve, EvalPoint{Step: step, Tokens: int64(step) * tokensPerStep, ValLoss: vl})
		if cfg.OnEval != nil {
			cfg.OnEval(step, vl)
		}
		log.Info("eval", "algorithm", cfg.Algorithm, "step", step, "val_loss", vl)
		return nil
	}
	began := time.Now()
	if err := record(0, workers[0].theta); err != nil {
		return nil, err
	}

	// Outer machinery for the distributed algorithms.
	var net *transport.MemNetwork
	var hub *sparseHub
	var noms *nominationHub
	var dilocos []*optimizer.DiLoCo
	var nolocos []*optimizer.NoLoCo
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if nw > 1 {
		net = transport.NewMemNetwork()
		defer net.Close()
		for i, w := range workers {
			p := net.Join(transport.PeerID(fmt.Sprintf("worker-%02d", i)))
			switch {
			case cfg.Algorithm == DiLoCo && cfg.Sparse != nil:
				if hub == nil {
					hub = newSparseHub(nw)
				}
				beta := cfg.SparseBeta
				if beta == 0 {
					beta = 1
				}
				g, err := newSparseGather(hub, i, len(w.theta), *cfg.Sparse, beta)
				if err != nil {
					return nil, err
				}
				g.robust = cfg.Robust
				d, err := optimizer.NewDiLoCo(cfg.DiLoCo, g, w.theta)
				if err != nil {
					return nil, err
				}
				dilocos = append(dilocos, d)
			case cfg.Algorithm == DiLoCo:
				nx := len(w.theta)
				if s := cfg.DiLoCo.Support; s != nil {
					nx = s.SupportLen(nx) // the collective sees the compacted vector
				}
				if s := cfg.DiLoCo.Subspace; s != nil {
					nx = s.Len(nx)
				}
				dc := cfg.DiLoCo
				if s := dc.Support; s != nil && s.Nominate > 0 {
					if noms == nil {
						noms = newNominationHub(nw)
					}
					dc.Nominator = noms
				}
				bc := optimizer.DefaultButterflyConfig(nx, swarmSigner{p.Self()}, swarmTick.Seconds())
				bc.Codec, bc.AggCodec, bc.Robust = cfg.Codec, cfg.AggCodec, cfg.Robust
				// Every worker in every round, as in the papers: the leader
				// waits for all (in-process inner phases end at about the
				// same time, but a loaded machine spreads them).
				bc.ReadyWait, bc.LeaderWait = int64(time.Hour/swarmTick), int64(2*time.Hour/swarmTick)
				r, err := optimizer.NewButterflyDriver(p, bc, optimizer.ButterflyOptions{Tick: swarmTick, Logger: log})
				if err != nil {
					return nil, err
				}
				r.Start(rctx)
				defer r.Close()
				d, err := optimizer.NewDiLoCo(dc, r, w.theta)
				if err != nil {
					return nil, err
				}
				dilocos = append(dilocos, d)
			case cfg.Algorithm == NoLoCo:
				n, err := optimizer.NewNoLoCo(rctx, cfg.NoLoCo, p, w.theta)
				if err != nil {
					return nil, err
				}
				defer n.Close()
				nolocos = append(nolocos, n)
			}
		}
	}

	for round := 0; round < cfg.Rounds; round++ {
		errs := make([]error, nw)
		var wg sync.WaitGroup
		for i, w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for s := 0; s < cfg.InnerSteps; s++ {
					if err := ctx.Err(); err != nil {
						errs[i] = err
						return
					}
					if cfg.Delayed && cfg.OverlapSteps > 0 && s == cfg.OverlapSteps && dilocos[i].InFlight() {
						dev.CopyOut(w.theta, w.Stage.Params)
						if _, err := dilocos[i].Land(w.theta); err != nil {
							errs[i] = err
							return
						}
						dev.CopyIn(w.Stage.Params, w.theta)
					}
					if err := w.step(round*cfg.InnerSteps + s); err != nil {
						errs[i] = err
						return
					}
				}
				dev.CopyOut(w.theta, w.Stage.Params)
				if cfg.Attack != 0 && i == nw-1 && cfg.Algorithm == DiLoCo {
					// theta' = phi - Attack*(phi - theta): the pseudo-gradient scaled
					for j, phi := range dilocos[i].Phi {
						w.theta[j] = phi - float32(cfg.Attack)*(phi-w.theta[j])
					}
				}
				var err error
				switch cfg.Algorithm {
				case DiLoCo:
					if cfg.Delayed {
						_, err = dilocos[i].OuterStepDelayed(ctx, w.theta)
						if err == nil && round == cfg.Rounds-1 {
							_, err = dilocos[i].Flush(w.theta)
						}
					} else {
						_, err = dilocos[i].OuterStep(ctx, w.theta)
					}
				case NoLoCo:
					_, err = nolocos[i].OuterStep(ctx, w.theta)
				}
				if err == nil && nw > 1 {
					dev.CopyIn(w.Stage.Params, w.theta)
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return res, err
		}
		if err := record((round+1)*cfg.InnerSteps, workers[0].theta); err != nil {
			return res, err
		}
	}
	if net != nil && hub == nil {
		for i := range workers {
			res.BytesSent += net.BytesSent(transport.PeerID(fmt.Sprintf("worker-%02d", i)))
		}
	}
	if hub != nil {
		res.BytesSent = hub.sent
	}
	res.Seconds = time.Since(began).Seconds()
	res.FinalValLoss = res.Curve[len(res.Curve)-1].ValLoss
	res.BytesPerToken = float64(res.BytesSent) / float64(int64(totalSteps)*tokensPerStep)
	res.Final = append([]float32(nil), workers[0].theta...)
	return res, nil
}

// swarmTick is the in-process collective's clock.
const swarmTick = 5 * time.Millisecond

// swarmSigner signs with deterministic ed25519 keys derived from the
// worker's name: in-process workers trust each other; the collective
// still checks every signature.
type swarmSigner struct{ self transport.PeerID }

func swarmKey(id transport.PeerID) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("skein-swarm-key/" + id))
	return ed25519.NewKeyFromSeed(seed[:])
}

func (s swarmSigner) Sign(msg []byte) ([]byte, error) {
	return ed25519.Sign(swarmKey(s.self), msg), nil
}

func (s swarmSigner) Verify(id transport.PeerID, msg, sig []byte) bool {
	return len(sig) == ed25519.SignatureSize && ed25519.Verify(swarmKey(id).Public().(ed25519.PublicKey), msg, sig)
}

// SubspaceMatrices lists a layout's weight matrices that a rank-r basis
// compresses (both sides at least 4r); the rest is sent dense.
func SubspaceMatrices(layout []model.Tensor, r int) []optimizer.Matrix {
	var ms []optimizer.Matrix
	for _, t := range layout {
		if len(t.Shape) == 2 && min(t.Shape[0], t.Shape[1]) >= 4*r {
			ms = append(ms, optimizer.Matrix{Off: t.Offset, Rows: t.Shape[0], Cols: t.Shape[1]})
		}
	}
	return ms
}
