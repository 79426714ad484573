package main

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/skein-ml/skein/bootstrap/status"
	"github.com/skein-ml/skein/experiment"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/telemetry"
)

// stagedStatus is the staged demo's status page: the same page a bootstrap
// serves, fed from the run itself (experiment.StagedView after every step)
// rather than from volunteers' telemetry: its members are the stage
// replicas, its curve the run's losses, its pipeline card the stages,
// their replicas and the latest iteration's paths.
type stagedStatus struct {
	store *status.Store
	srv   *status.Server
	hs    *http.Server
	log   *slog.Logger
	cfg   experiment.StagedConfig
	specs []model.StageSpec

	mu       sync.Mutex
	members  []status.Member
	pipe     *status.Pipeline
	round    roundTally
	lastSent map[string]int64 // by peer: bytes sent at its last report
	lastRecv map[string]int64
	lastBusy map[string]float64
	began    time.Time // of the round being tallied
}

// roundTally sums a round's training losses.
type roundTally struct {
	loss  float64
	steps int
}

// startStagedStatus opens the history under dir and serves the page on
// addr; it returns the page's URL.
func startStagedStatus(m manifest.Manifest, cfg experiment.StagedConfig, dir, addr string, log *slog.Logger) (*stagedStatus, string, error) {
	mc, err := model.Preset(cfg.Preset)
	if err != nil {
		return nil, "", err
	}
	specs, err := pipeline.SplitLayers(mc, cfg.Stages)
	if err != nil {
		return nil, "", err
	}
	st, err := status.Open(filepath.Join(dir, "history.db"), status.DefaultStoreConfig())
	if err != nil {
		return nil, "", err
	}
	s := &stagedStatus{store: st, log: log, cfg: cfg, specs: specs, lastSent: map[string]int64{}, lastRecv: map[string]int64{},
		lastBusy: map[string]float64{}, began: time.Now()}
	info := status.RunInfo{RunID: m.RunID, ManifestHash: m.HashString(), Preset: cfg.Preset, ParamCount: mc.NumParams(),
		InnerSteps: cfg.InnerSteps, Optimizer: fmt.Sprintf("diloco per stage · %d-stage SkipPipe", cfg.Stages), Started: time.Now()}
	s.srv = status.NewServer(st, info, s.liveMembers, status.WithLogger(log), status.WithPipeline(s.pipeline))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.srv.Close()
		st.Close()
		return nil, "", fmt.Errorf("status page on %s: %w (pass --http 127.0.0.1:0 for any free port)", addr, err)
	}
	s.hs = s.srv.HTTPServer(addr)
	go func() {
		if err := s.hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("status page stopped", "err", err)
		}
	}()
	return s, "http://" + ln.Addr().String(), nil
}

func (s *stagedStatus) liveMembers() []status.Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.members
}

func (s *stagedStatus) pipeline() *status.Pipeline {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pipe
}

// holds names what stage st of the run holds.
func (s *stagedStatus) holds(st int) string {
	sp := s.specs[st]
	var what string
	switch n := sp.LastLayer - sp.FirstLayer; {
	case n == 1:
		what = fmt.Sprintf("layer %d", sp.FirstLayer)
	case n > 1:
		what = fmt.Sprintf("layers %d-%d", sp.FirstLayer, sp.LastLayer-1)
	}
	if sp.Embedding {
		if what == "" {
			return "embedding, head, loss"
		}
		return "embedding, head, loss, " + what
	}
	return what
}

// observe takes the run after a step: members, pipeline, membership events
// and, at the end of a DiLoCo round, one report per node.
func (s *stagedStatus) observe(v experiment.StagedView) {
	for _, e := range v.Events {
		kind := status.Fail
		if e.Joined {
			kind = status.Join
		}
		if err := s.store.RecordEvent(status.Event{At: time.Now(), Peer: e.Peer, Kind: kind, Role: fmt.Sprintf("stage %d", e.Stage)}); err != nil {
			s.log.Warn("status: membership event not recorded", "err", err)
		}
	}
	R := s.cfg.Replicas
	s.mu.Lock()
	s.members = s.members[:0]
	peerOf := make([]string, len(v.Nodes))
	p := &status.Pipeline{SkipRatio: s.cfg.SkipRatio, Iteration: uint64(v.Step)}
	for st := range s.cfg.Stages {
		sv := status.StageView{Stage: st, Holds: s.holds(st), Rebuilt: v.Rebuilt[st]}
		for k := range R {
			sv.Replicas = append(sv.Replicas, v.Nodes[st*R+k].Peer)
		}
		p.Stages = append(p.Stages, sv)
	}
	for i, n := range v.Nodes {
		peerOf[i] = n.Peer
		s.members = append(s.members, status.Member{Peer: n.Peer, Role: fmt.Sprintf("stage %d", n.Stage), Device: "cpu", Round: uint64(v.Rounds)})
	}
	for mb, path := range v.Paths {
		pv := status.PathView{Microbatch: mb, Stages: path.Stages}
		for _, node := range path.Nodes {
			pv.Peers = append(pv.Peers, peerOf[node])
		}
		p.Paths = append(p.Paths, pv)
	}
	s.pipe = p
	if !math.IsNaN(float64(v.TrainLoss)) {
		s.round.loss += float64(v.TrainLoss)
		s.round.steps++
	}
	var reports []func() error
	if v.Step > 0 && v.Step%s.cfg.InnerSteps == 0 && s.round.steps > 0 {
		wall := time.Since(s.began).Seconds()
		train := float32(s.round.loss / float64(s.round.steps))
		steps := s.round.steps
		s.round, s.began = roundTally{}, time.Now()
		for _, n := range v.Nodes {
			rep := telemetry.Report{Round: uint64(v.Rounds), TrainLoss: train, ValLoss: v.ValLoss,
				BytesSent: uint64(max(0, n.BytesSent-s.lastSent[n.Peer])), BytesRecv: uint64(max(0, n.BytesRecv-s.lastRecv[n.Peer])),
				ComputeSeconds: n.ComputeSeconds - s.lastBusy[n.Peer], WallSeconds: wall,
				Members: 1, Device: "cpu", Version: version, UnixMS: time.Now().UnixMilli()}
			if n.Stage == 0 { // the stage-0 replicas start every microbatch: the run's tokens, shared
				rep.Tokens = uint64(steps * v.Tokens / R)
				rep.TokensPerSec = float64(rep.Tokens) / max(wall, 1e-9)
			}
			s.lastSent[n.Peer], s.lastRecv[n.Peer], s.lastBusy[n.Peer] = n.BytesSent, n.BytesRecv, n.ComputeSeconds
			reports = append(reports, func() error { return s.store.Record(n.Peer, rep, time.Now()) })
		}
	}
	s.mu.Unlock()
	for _, rec := range reports {
		if err := rec(); err != nil {
			s.log.Warn("status: report not recorded", "err", err)
		}
	}
	s.srv.Notify()
}

func (s *stagedStatus) close() {
	s.hs.Close()
	s.srv.Close()
	s.store.Close()
}
