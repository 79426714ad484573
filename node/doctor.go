package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/host/autonat"
	"github.com/libp2p/go-libp2p/p2p/protocol/ping"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/wan"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/trainer"
)

// `skein node doctor`: what a volunteer runs before joining a run, to
// know whether its machine and network can help. It joins the run's swarm
// through the bootstrap as an observer (it trains nothing and serves
// nothing), and each check says pass, warn or fail with advice.
//
// Not checked yet: a dial-back by the bootstrap (reachability is judged
// from this node's own addresses and its connection to the bootstrap) and
// the upload bandwidth (nothing in the run pulls from an observer).

// The outcomes of a check.
const (
	CheckPass = "pass"
	CheckWarn = "warn"
	CheckFail = "fail"
)

// Check is one line of the doctor's report.
type Check struct {
	Name   string  `json:"name"`
	Status string  `json:"status"` // CheckPass, CheckWarn or CheckFail
	Detail string  `json:"detail"`
	Advice string  `json:"advice,omitempty"`
	Value  float64 `json:"value,omitempty"` // the measured figure, in the unit Detail names
}

// DoctorConfig is what `skein node doctor` needs.
type DoctorConfig struct {
	Bootstrap    []string
	Listen       []string
	Timing       p2p.Timing
	Threads      int
	MaxMemoryMiB int
	// Device is what the volunteer would train on (nil: the CPU with
	// Threads threads).
	Device kernels.Device
	// DeviceNote is why that device was chosen (--device auto), for the
	// device line.
	DeviceNote string
	// WAN, if set, emulates this machine's link on every QUIC packet it
	// sends (--emulate-rate/--emulate-latency: measurements and tests).
	WAN *wan.Link
	// BenchSteps is how many training steps time the device (0: 3).
	BenchSteps int
	Logger     *slog.Logger
}

// Doctor runs the checks; an error only when it could not run at all.
func Doctor(ctx context.Context, cfg DoctorConfig) ([]Check, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Bootstrap) == 0 {
		return nil, fmt.Errorf("%w: give the run's --bootstrap address", ErrConfig)
	}
	var checks []Check
	add := func(c Check) { checks = append(checks, c) }

	runID, err := p2p.DiscoverRun(ctx, cfg.Bootstrap, nil)
	if err != nil {
		add(Check{Name: "bootstrap", Status: CheckFail, Detail: fmt.Sprintf("could not reach %s: %v", cfg.Bootstrap[0], err),
			Advice: "check the address, and that UDP (QUIC) or TCP to it is not blocked by a firewall"})
		return checks, nil
	}
	nc := p2p.DefaultNodeConfig(runID)
	nc.Bootstrap, nc.Timing, nc.Logger = cfg.Bootstrap, cfg.Timing, log
	nc.Meta.Role = p2p.RoleObserver // never counted, placed or waited for
	if len(cfg.Listen) > 0 {
		nc.ListenAddrs = cfg.Listen
	}
	if cfg.WAN != nil {
		emu, err := wan.New(*cfg.WAN, uint64(time.Now().UnixNano()))
		if err != nil {
			return nil, fmt.Errorf("%w: --emulate-rate/--emulate-latency: %w", ErrConfig, err)
		}
		nc.ListenUDP = emu.ListenUDP
	}
	began := time.Now()
	pn, err := p2p.NewNode(ctx, nc)
	if err != nil {
		add(Check{Name: "bootstrap", Status: CheckFail, Detail: fmt.Sprintf("could not join run %q: %v", runID, err),
			Advice: "a closed run needs a join token (skein node join --token); otherwise check the firewall"})
		return checks, nil
	}
	defer pn.Close()
	add(Check{Name: "bootstrap", Status: CheckPass, Value: time.Since(began).Seconds(),
		Detail: fmt.Sprintf("joined run %q in %.1fs; %d members", runID, time.Since(began).Seconds(), pn.NumMembers())})

	boot, ok := bootstrapOf(pn)
	m, err := FetchManifest(ctx, pn, runID, 30*time.Second, log)
	if err != nil {
		add(Check{Name: "manifest", Status: CheckFail, Detail: err.Error(), Advice: "the run serves no usable manifest: tell its operator"})
		return checks, nil
	}
	add(Check{Name: "manifest", Status: CheckPass, Detail: fmt.Sprintf("manifest %s: %s, batch %d x %d, %s", m.ShortHash(),
		m.Model.Preset, m.Model.Batch, m.SeqLen(), m.Optimizer.Kind)})
	if ok {
		checks = append(checks, connectionChecks(ctx, pn, boot)...)
		checks = append(checks, downloadCheck(ctx, pn, boot, m))
		checks = append(checks, uploadCheck(ctx, pn, boot))
		checks = append(checks, clockCheck(ctx, pn, boot))
	} else {
		add(Check{Name: "connection", Status: CheckWarn, Detail: "no bootstrap in the membership (it is down?): connection, latency and bandwidth not measured"})
	}
	checks = append(checks, reachabilityCheck(ctx, pn, boot, ok))
	checks = append(checks, machineChecks(ctx, cfg, m)...)
	return checks, nil
}

// bootstrapOf is a bootstrap of the run the doctor dialled, if one is a
// member (not a member that only claims the role).
func bootstrapOf(pn *p2p.Node) (peer.ID, bool) {
	for _, m := range pn.Members() {
		if m.Meta.Role == p2p.RoleBootstrap && pn.IsSeed(m.ID) {
			return m.ID, true
		}
	}
	return "", false
}

// connectionChecks: is the connection to the bootstrap direct, and its
// round-trip time (libp2p ping, the median of five).
func connectionChecks(ctx context.Context, pn *p2p.Node, boot peer.ID) []Check {
	var out []Check
	conns := pn.Host().Network().ConnsToPeer(boot)
	limited := len(conns) > 0
	for _, c := range conns {
		if !c.Stat().Limited {
			limited = false
		}
	}
	switch {
	case len(conns) == 0:
		out = append(out, Check{Name: "connection", Status: CheckWarn, Detail: "no open connection to the bootstrap"})
	case limited:
		out = append(out, Check{Name: "connection", Status: CheckWarn, Detail: "the connection to the bootstrap is relayed",
			Advice: "a relayed volunteer is slow to reach; forward a UDP port to this machine, or let hole punching work (no symmetric NAT)"})
	default:
		out = append(out, Check{Name: "connection", Status: CheckPass, Detail: fmt.Sprintf("direct, over %s", conns[0].RemoteMultiaddr())})
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var rtts []time.Duration
	results := ping.Ping(pctx, pn.Host(), boot)
	for len(rtts) < 5 {
		r, ok := <-results
		if !ok || r.Error != nil {
			break
		}
		rtts = append(rtts, r.RTT)
	}
	if len(rtts) == 0 {
		return append(out, Check{Name: "latency", Status: CheckWarn, Detail: "the bootstrap did not answer pings"})
	}
	slices.Sort(rtts)
	med := rtts[len(rtts)/2]
	c := Check{Name: "latency", Status: CheckPass, Value: float64(med.Microseconds()) / 1000,
		Detail: fmt.Sprintf("round trip to the bootstrap %.1f ms (median of %d)", float64(med.Microseconds())/1000, len(rtts))}
	if med > 300*time.Millisecond {
		c.Status, c.Advice = CheckWarn, "a long round trip slows every outer round and every pipeline hop; a closer run helps"
	}
	return append(out, c)
}

// memberWait is how long the doctor retries what the bootstrap serves only
// to members: its own join reaches the bootstrap's member table a moment
// after the doctor sees the bootstrap in its own (TestDoctor failed about
// one run in 8 by fetching first).
const memberWait = 15 * time.Second

// untilMember runs f until it succeeds, for at most memberWait.
func untilMember(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(memberWait)
	for {
		err := f()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// downloadCheck measures the download rate from the bootstrap on one of
// the run's shards (at most 8 MB or 10 s).
func downloadCheck(ctx context.Context, pn *p2p.Node, boot peer.ID, m manifest.Manifest) Check {
	if m.Data.Source != manifest.SourceShards || len(m.Data.Shards) == 0 {
		return Check{Name: "download", Status: CheckWarn, Detail: "not measured: the run has no shards to fetch"}
	}
	sh := m.Data.Shards[0]
	n := min(sh.Bytes, 8<<20)
	buf := make(memWriterAt, n)
	var got int64
	var took float64
	err := untilMember(ctx, func() error {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		began := time.Now()
		var err error
		got, err = pn.Fetch(fctx, boot, data.ShardKey(sh.Hash), buf, p2p.FetchOptions{Length: n, Streams: 8, ChunkSize: 512 << 10})
		took = time.Since(began).Seconds()
		if got == 0 && err == nil {
			err = errors.New("nothing fetched")
		}
		return err
	})
	if got == 0 || took <= 0 {
		return Check{Name: "download", Status: CheckFail, Detail: fmt.Sprintf("could not fetch from the bootstrap: %v", err),
			Advice: "the run's data comes from its members: check the firewall"}
	}
	mbps := float64(got) * 8 / 1e6 / took
	c := Check{Name: "download", Status: CheckPass, Value: mbps,
		Detail: fmt.Sprintf("%.1f Mbit/s from the bootstrap (%.1f MB in %.1fs)", mbps, float64(got)/1e6, took)}
	switch {
	case mbps < 5:
		c.Status, c.Advice = CheckWarn, "under 5 Mbit/s, fetching the run's state and shards takes long; a wired connection helps"
	case got < 1<<20:
		c.Status, c.Detail = CheckWarn, c.Detail+": the run's first shard is too small for more than a rough figure"
	}
	return c
}

// uploadCheck measures the upload rate to the bootstrap: filler chunks for
// up to 8 s or 16 MB, timed where they arrive (p2p.ProtoUploadProbe).
// Rounds upload a pseudo-gradient per round, so the uplink usually sets a
// volunteer's pace.
func uploadCheck(ctx context.Context, pn *p2p.Node, boot peer.ID) Check {
	var r p2p.UploadReceipt
	err := untilMember(ctx, func() error {
		uctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var err error
		r, err = pn.MeasureUpload(uctx, boot, 16<<20, 8*time.Second)
		return err
	})
	if err != nil {
		return Check{Name: "upload", Status: CheckWarn, Detail: fmt.Sprintf("not measured: %v", err)}
	}
	mbps := r.Mbps()
	c := Check{Name: "upload", Status: CheckPass, Value: mbps,
		Detail: fmt.Sprintf("%.1f Mbit/s to the bootstrap (%.1f MB in %.1fs, timed at its end)", mbps, float64(r.Bytes)/1e6, r.Duration.Seconds())}
	switch {
	case r.Bytes < 1<<20 || r.Duration < 100*time.Millisecond:
		c.Status, c.Detail = CheckWarn, c.Detail+": too little for more than a rough figure"
	case mbps < 2:
		c.Status, c.Advice = CheckWarn, "under 2 Mbit/s up, each round's upload takes long: the run may finish rounds without you; a wired connection helps"
	}
	return c
}

// clockCheck compares this machine's clock with the bootstrap's
// (p2p.ProtoClock): the skew is the bootstrap's reading less the middle of
// the request's round trip, the best of three. Join tokens expire, and the
// status page orders reports by their time.
func clockCheck(ctx context.Context, pn *p2p.Node, boot peer.ID) Check {
	best, rtt := time.Duration(0), time.Duration(math.MaxInt64)
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t0 := time.Now()
		s, err := pn.Open(cctx, boot, p2p.ProtoClock, p2p.MessageFrameConfig(8))
		if err != nil {
			cancel()
			return Check{Name: "clock", Status: CheckWarn, Detail: fmt.Sprintf("not measured: %v", err)}
		}
		typ, b, err := s.ReadFrame()
		t1 := time.Now()
		s.Close()
		cancel()
		if err != nil {
			return Check{Name: "clock", Status: CheckWarn, Detail: fmt.Sprintf("not measured: %v", err)}
		}
		tb, err := p2p.ParseClock(typ, b)
		if err != nil {
			return Check{Name: "clock", Status: CheckWarn, Detail: fmt.Sprintf("not measured: %v", err)}
		}
		if d := t1.Sub(t0); d < rtt {
			rtt, best = d, tb.Sub(t0.Add(d/2))
		}
	}
	c := Check{Name: "clock", Status: CheckPass, Value: best.Seconds(),
		Detail: fmt.Sprintf("%+.3fs from the bootstrap's clock (within %.3fs)", best.Seconds(), rtt.Seconds()/2)}
	switch abs := max(best, -best); {
	case abs > time.Minute:
		c.Status, c.Advice = CheckFail, "set this machine's clock (NTP): join tokens and reports carry times"
	case abs > 2*time.Second:
		c.Status, c.Advice = CheckWarn, "this machine's clock is off; turn on time synchronisation (NTP)"
	}
	return c
}

// reachabilityCheck asks the bootstrap, if there is one, to dial this node
// back on a new connection from another identity (libp2p's AutoNAT, which
// every Skein host serves): a success proves others can dial it directly.
// Without an answer it judges from this node's own addresses.
func reachabilityCheck(ctx context.Context, pn *p2p.Node, boot peer.ID, haveBoot bool) Check {
	var public []string
	for _, a := range pn.Addrs() {
		if isPublicAddr(a) {
			public = append(public, a.String())
		}
	}
	natAdvice := "peers reach you by hole punching or through a relay; forwarding a UDP port to this machine makes you directly reachable"
	why := ""
	if haveBoot {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := autonat.NewAutoNATClient(pn.Host(), nil, nil).DialBack(dctx, boot)
		cancel()
		switch {
		case err == nil:
			return Check{Name: "reachability", Status: CheckPass,
				Detail: "the bootstrap dialed this machine back on a new connection: others can reach it directly"}
		case autonat.IsDialError(err):
			return Check{Name: "reachability", Status: CheckWarn,
				Detail: fmt.Sprintf("the bootstrap could not dial this machine back (%v): a NAT or firewall is in the way", err), Advice: natAdvice}
		case autonat.IsDialRefused(err):
			why = fmt.Sprintf("; the bootstrap did not try to dial back (%v: it dials public addresses only)", err)
		default:
			why = fmt.Sprintf("; no dial-back from the bootstrap (%v)", err)
		}
	}
	if len(public) > 0 {
		return Check{Name: "reachability", Status: CheckPass, Detail: fmt.Sprintf("public address %s%s", public[0], why)}
	}
	return Check{Name: "reachability", Status: CheckWarn, Detail: "no public address: behind a NAT" + why, Advice: natAdvice}
}

func isPublicAddr(a ma.Multiaddr) bool {
	ip, err := manet.ToIP(a)
	return err == nil && manet.IsPublicAddr(a) && !ip.IsLoopback() && !ip.Equal(net.IPv4zero)
}

// machineChecks: the device, its training throughput on the run's model,
// and whether the run fits in memory.
func machineChecks(ctx context.Context, cfg DoctorConfig, m manifest.Manifest) []Check {
	var out []Check
	mc, err := m.ModelConfig()
	if err != nil {
		return append(out, Check{Name: "device", Status: CheckFail, Detail: err.Error()})
	}
	dev := cfg.Device
	if dev == nil {
		dev = kernels.NewCPU(cfg.Threads)
	}
	steps := cfg.BenchSteps
	if steps <= 0 {
		steps = 3
	}
	res, err := trainer.BenchTrain(ctx, dev, m.Model.Preset, m.Model.Batch, cfg.Threads, steps, 1)
	if err != nil {
		out = append(out, Check{Name: "device", Status: CheckFail, Detail: fmt.Sprintf("%s: %v", dev.Name(), err)})
	} else {
		tokens := float64(m.Model.Batch * m.SeqLen() * m.Optimizer.InnerSteps)
		round := tokens / res.TokensPerSec
		c := Check{Name: "device", Status: CheckPass, Value: res.TokensPerSec,
			Detail: fmt.Sprintf("%s: %.0f tokens/s on the run's model (%s, batch %d); an inner phase of %d steps takes about %s",
				dev.Name(), res.TokensPerSec, m.Model.Preset, m.Model.Batch, m.Optimizer.InnerSteps, humanSeconds(round))}
		if round > 30*60 {
			c.Status, c.Advice = CheckWarn, "this machine takes over half an hour per inner phase: the run will often finish rounds without it"
		}
		if cfg.DeviceNote != "" {
			c.Detail += " (" + cfg.DeviceNote + ")"
		}
		out = append(out, c)
	}
	// A staged volunteer holds one stage, the largest it could be given.
	needOf := func(hostCopies int) uint64 { return trainer.MemoryNeed(mc, m.Model.Batch, m.SeqLen(), hostCopies) }
	if m.Pipeline.Staged() {
		if specs, err := pipeline.SplitLayers(mc, m.Pipeline.Stages); err == nil {
			needOf = func(hostCopies int) uint64 {
				var n uint64
				for _, sp := range specs {
					n = max(n, trainer.StageMemoryNeed(mc, sp, m.Model.Batch, m.SeqLen(), hostCopies))
				}
				return n
			}
		}
	}
	need := needOf(dilocoHostCopies)
	if gpu, ok := dev.(interface {
		MemInfo() (uint64, uint64, error)
	}); ok {
		// The stage lives on the GPU; the outer state stays on the host.
		onGPU := needOf(0)
		free, _, err := gpu.MemInfo()
		switch {
		case err != nil:
			out = append(out, Check{Name: "gpu memory", Status: CheckWarn, Detail: err.Error()})
		case onGPU > free:
			out = append(out, Check{Name: "gpu memory", Status: CheckFail, Value: gibs(onGPU),
				Detail: fmt.Sprintf("the run's model needs about %s on the GPU, %s is free", bytesHuman(onGPU), bytesHuman(free)),
				Advice: "free GPU memory (other programs hold it), or join with --device cpu"})
		default:
			out = append(out, Check{Name: "gpu memory", Status: CheckPass, Value: gibs(onGPU),
				Detail: fmt.Sprintf("the run's model needs about %s of the %s free on the GPU", bytesHuman(onGPU), bytesHuman(free))})
		}
		need -= onGPU
	}
	avail, known := trainer.MemAvailable()
	capped := cfg.MaxMemoryMiB > 0
	if capped {
		avail, known = uint64(cfg.MaxMemoryMiB)<<20, true
	}
	switch {
	case !known:
		out = append(out, Check{Name: "memory", Status: CheckWarn, Detail: fmt.Sprintf("the run needs about %s; this system does not say what it has", bytesHuman(need))})
	case need > avail:
		how := "available"
		if capped {
			how = "allowed by --max-memory"
		}
		out = append(out, Check{Name: "memory", Status: CheckFail, Value: gibs(need),
			Detail: fmt.Sprintf("the run needs about %s, %s is %s", bytesHuman(need), bytesHuman(avail), how),
			Advice: "free memory or join a run of a smaller model"})
	default:
		out = append(out, Check{Name: "memory", Status: CheckPass, Value: gibs(need),
			Detail: fmt.Sprintf("the run needs about %s of the %s available", bytesHuman(need), bytesHuman(avail))})
	}
	return out
}

func gibs(b uint64) float64 { return math.Round(float64(b)/(1<<30)*100) / 100 }

func bytesHuman(b uint64) string {
	if b < 1<<30 {
		return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
}

func humanSeconds(s float64) string {
	switch {
	case s < 90:
		return fmt.Sprintf("%.0fs", s)
	case s < 5400:
		return fmt.Sprintf("%.0f min", s/60)
	}
	return fmt.Sprintf("%.1f h", s/3600)
}

// WriteChecks prints the report, one line a check, and says whether any
// failed.
func WriteChecks(w io.Writer, checks []Check) error {
	failed := 0
	for _, c := range checks {
		fmt.Fprintf(w, "%-4s  %-12s %s\n", c.Status, c.Name, c.Detail)
		if c.Advice != "" {
			fmt.Fprintf(w, "      %-12s -> %s\n", "", c.Advice)
		}
		if c.Status == CheckFail {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d of %d checks failed", ErrDoctor, failed, len(checks))
	}
	return nil
}

// ErrDoctor is returned by WriteChecks when a check failed.
var ErrDoctor = errors.New("node: this machine is not ready for the run")
