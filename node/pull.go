package node

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/transport"
)

// `skein node pull`: the run's certified weights as a checkpoint that eval,
// sample and export take. It joins as an observer (it trains and serves
// nothing), takes the round certificate the bootstrap it dialled
// countersigned (checked against the bootstrap's peer ID: the run's
// identity, not any volunteer's word) or the latest one a volunteer's chain
// from it leads to, and downloads that round's state
// from the volunteers that hold it, every chunk checked against the
// certified hash (fetchVerifiedState). The checkpoint holds phi, the
// weights the run agreed on, without optimizer state.
//
// Not yet: NoLoCo runs (no state is certified: members hold different
// weights) and staged runs (no stage is certified; a whole model would be
// assembled from every stage).

// PullConfig is what `skein node pull` needs.
type PullConfig struct {
	Bootstrap []string
	Listen    []string
	Timing    p2p.Timing
	Out       string        // the checkpoint to write
	Wait      time.Duration // how long to wait for a certified state (0: 2 minutes)
	Progress  io.Writer     // progress lines; nil: none
	Logger    *slog.Logger
}

// PullResult says what was pulled.
type PullResult struct {
	Round  uint64
	Hash   uint64
	Params int
	From   transport.PeerID
	Preset string
}

// Pull writes the run's latest certified weights to cfg.Out.
func Pull(ctx context.Context, cfg PullConfig) (PullResult, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Bootstrap) == 0 || cfg.Out == "" {
		return PullResult{}, fmt.Errorf("%w: give the run's --bootstrap address and --out", ErrConfig)
	}
	wait := cfg.Wait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	runID, err := p2p.DiscoverRun(ctx, cfg.Bootstrap, nil)
	if err != nil {
		return PullResult{}, fmt.Errorf("reaching the bootstrap: %w", err)
	}
	nc := p2p.DefaultNodeConfig(runID)
	nc.Bootstrap, nc.Timing, nc.Logger = cfg.Bootstrap, cfg.Timing, log
	nc.Meta.Role = p2p.RoleObserver
	if len(cfg.Listen) > 0 {
		nc.ListenAddrs = cfg.Listen
	}
	pn, err := p2p.NewNode(ctx, nc)
	if err != nil {
		return PullResult{}, fmt.Errorf("joining run %q: %w", runID, err)
	}
	defer pn.Close()
	m, err := FetchManifest(ctx, pn, runID, 30*time.Second, log)
	if err != nil {
		return PullResult{}, err
	}
	switch {
	case m.Optimizer.Kind == manifest.KindNoLoCo:
		return PullResult{}, fmt.Errorf("%w: run %q is a NoLoCo run: its members hold different weights and none is certified", ErrConfig, runID)
	case m.Pipeline.Stages > 1:
		return PullResult{}, fmt.Errorf("%w: run %q is staged (%d stages): pulling a staged run is not built yet", ErrConfig, runID, m.Pipeline.Stages)
	}
	mc, err := m.ModelConfig()
	if err != nil {
		return PullResult{}, err
	}
	n := mc.NumParams()
	say(cfg.Progress, "run %q: %s (%d parameters); waiting for the bootstrap's certified round", runID, m.Model.Preset, n)
	deadline := time.Now().Add(wait)
	for {
		if cert := latestCertified(ctx, pn, log); cert != nil {
			holders := holders(cert, announcements(pn))
			if len(holders) > 0 {
				round, phi, _, from, err := fetchVerifiedState(ctx, pn, log, n, cert.Round, cert.Hash, holders, cfg.Progress)
				if err == nil && round == cert.Round {
					ck := &model.Checkpoint{Config: mc, Spec: model.FullSpec(mc), Step: int(round), Params: phi,
						Meta: map[string]string{model.MetaSeqLen: strconv.Itoa(m.SeqLen()), model.MetaTokenizer: m.Data.TokenizerName(), "skein.run_id": runID,
							"skein.round": strconv.FormatUint(round, 10), "skein.state": fmt.Sprintf("%016x", cert.Hash)}}
					if err := model.SaveCheckpoint(cfg.Out, ck); err != nil {
						return PullResult{}, err
					}
					return PullResult{Round: round, Hash: cert.Hash, Params: n, From: from, Preset: m.Model.Preset}, nil
				}
				log.Warn("could not download the certified state; trying again", "round", cert.Round, "err", err)
			}
		}
		if time.Now().After(deadline) {
			return PullResult{}, fmt.Errorf("no certified state could be downloaded within %v (the bootstrap countersigns a round once volunteers certify one; are volunteers training?)", wait)
		}
		select {
		case <-ctx.Done():
			return PullResult{}, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// latestCertified is the latest certificate a chain from the bootstrap's
// countersigned one leads to: the bootstrap polls every few seconds, and
// volunteers serve only their latest two states, so the anchor's own round may
// be gone already. A volunteer's chain counts only when it verifies and
// extends the anchor (replica.Book.AdoptFrom), as for a newcomer.
func latestCertified(ctx context.Context, pn *p2p.Node, log *slog.Logger) *replica.Certificate {
	anchor := certifiedByBootstrap(ctx, pn, log)
	if anchor == nil {
		return nil
	}
	book := replica.NewBook(pn.RunID(), pn.Signer(), &replica.Certificate{Run: pn.RunID()})
	others := announcements(pn)
	slices.SortFunc(others, func(a, b announcement) int { return cmp.Compare(b.round, a.round) })
	best := anchor
	for _, a := range others[:min(3, len(others))] {
		if a.round <= best.Round {
			break
		}
		chain, err := fetchChain(ctx, pn, a.id, anchor.Round)
		if err != nil {
			continue
		}
		if last, err := book.AdoptFrom(anchor, chain); err == nil && last.Round > best.Round {
			best = last
		} else if err != nil {
			log.Warn("offender: a volunteer's certificates do not extend the bootstrap's", "peer", a.id, "err", err)
		}
	}
	return best
}
