package pipeline

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/internal/scenario"
)

// fakeRunner is a StageRunner whose arithmetic a test can predict: stage 0
// embeds microbatch mb as x_i = (mb+1)(i+1) mod 7 + 1, stage s maps x to
// 2x + s (so the order of the stages shows in the result), the head's loss
// is sum(x) and its gradient all ones, and stage s's "backward" maps d to
// 2d + s (not a derivative: a checksum of the stages the gradient went
// back through, in order). It checks the relay's contract: no backward
// without a forward, no forward twice, no more than mu microbatches kept.
type fakeRunner struct {
	t       testing.TB
	stage   int
	n, mu   int
	held    map[fakeKey]bool
	fail    map[int]bool          // microbatches whose forward fails
	dout0   map[fakeKey][]float32 // stage 0: the gradient each microbatch came back with
	counts  map[Op]int
	history map[fakeKey][]Op
}

type fakeKey struct {
	iter uint64
	mb   int
}

func newFakeRunner(t testing.TB, stage, n, mu int) *fakeRunner {
	return &fakeRunner{t: t, stage: stage, n: n, mu: mu, held: map[fakeKey]bool{}, fail: map[int]bool{},
		dout0: map[fakeKey][]float32{}, counts: map[Op]int{}, history: map[fakeKey][]Op{}}
}

func fakeEmbed(mb, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32((mb+1)*(i+1)%7 + 1)
	}
	return x
}

func (f *fakeRunner) note(k fakeKey, op Op) {
	f.counts[op]++
	f.history[k] = append(f.history[k], op)
}

func (f *fakeRunner) Forward(iter uint64, mb int, in []float32) ([]float32, error) {
	k := fakeKey{iter, mb}
	f.note(k, OpForward)
	if f.held[k] {
		f.t.Errorf("stage %d: microbatch %d forwarded twice", f.stage, mb)
	}
	if f.fail[mb] {
		return nil, errors.New("injected compute failure")
	}
	if f.stage == 0 {
		if in != nil {
			f.t.Errorf("stage 0 got an input")
		}
		f.held[k] = true
		return fakeEmbed(mb, f.n), nil
	}
	if len(in) != f.n {
		f.t.Errorf("stage %d: input of %d", f.stage, len(in))
		return nil, errors.New("bad input")
	}
	f.held[k] = true
	if len(f.held) > f.mu {
		f.t.Errorf("stage %d holds %d microbatches, mu %d", f.stage, len(f.held), f.mu)
	}
	out := make([]float32, f.n)
	for i, v := range in {
		out[i] = 2*v + float32(f.stage)
	}
	return out, nil
}

func (f *fakeRunner) Head(iter uint64, mb int, in []float32) (float32, []float32, error) {
	k := fakeKey{iter, mb}
	f.note(k, OpHead)
	if f.stage != 0 || !f.held[k] {
		f.t.Errorf("head of microbatch %d at stage %d (held %v)", mb, f.stage, f.held[k])
	}
	var loss float32
	for _, v := range in {
		loss += v
	}
	d := make([]float32, f.n)
	for i := range d {
		d[i] = 1
	}
	return loss, d, nil
}

func (f *fakeRunner) Backward(iter uint64, mb int, dout []float32) ([]float32, error) {
	k := fakeKey{iter, mb}
	f.note(k, OpBackward)
	if !f.held[k] {
		f.t.Errorf("stage %d: backward of microbatch %d without its forward", f.stage, mb)
	}
	delete(f.held, k)
	if f.stage == 0 {
		f.dout0[k] = slices.Clone(dout)
		return nil, nil
	}
	din := make([]float32, len(dout))
	for i, v := range dout {
		din[i] = 2*v + float32(f.stage)
	}
	return din, nil
}

func (f *fakeRunner) Drop(iter uint64, mb int) {
	k := fakeKey{iter, mb}
	f.note(k, OpDrop)
	delete(f.held, k)
}

// fakeExpect returns the loss of microbatch mb on path p and the gradient
// stage 0 should get back, by fakeRunner's arithmetic.
func fakeExpect(p Path, mb, n int) (float32, []float32) {
	x := fakeEmbed(mb, n)
	for _, s := range p.Stages[1:] {
		for i := range x {
			x[i] = 2*x[i] + float32(s)
		}
	}
	var loss float32
	for _, v := range x {
		loss += v
	}
	d := make([]float32, n)
	for i := range d {
		d[i] = 1
	}
	for k := len(p.Stages) - 1; k >= 1; k-- {
		for i := range d {
			d[i] = 2*d[i] + float32(p.Stages[k])
		}
	}
	return loss, d
}

type simMsg struct {
	at       int64
	from, to int
	payload  []byte
}

type simDrop struct {
	from, to int // -1: any
	kind     string
}

// relaySim runs relays on a simulated clock: messages take a sender's
// delay in ticks (1 by default), each node computes one work item at a
// time taking its compute time in ticks (1 by default; drops are free),
// and crashed nodes neither tick nor send nor receive.
type relaySim struct {
	t      testing.TB
	cfg    RelayConfig
	pl     Placement
	m      []*Relay
	run    []*fakeRunner
	paths  []Path
	now    int64
	queue  []simMsg
	work   [][]Work
	due    []int64 // when the head of work[v] completes; -1: not started
	comp   []int64
	delay  []int64
	drops  []simDrop
	crash  []bool
	garble []bool
	begun  []uint64 // per node: the iteration it began last (0: none)
	want   map[[2]uint64]int
	out    []map[uint64]map[int]Outcome // per node, iteration, microbatch
	bytes  int64
}

func newRelaySim(t testing.TB, cfg RelayConfig, stageOf []int) *relaySim {
	pl := Placement{Stages: cfg.Placement.Stages, StageOf: stageOf}
	s := &relaySim{t: t, cfg: cfg, pl: pl, want: map[[2]uint64]int{}}
	for v := range stageOf {
		c := cfg
		c.Self, c.Placement = v, pl
		m, err := NewRelay(c)
		if err != nil {
			t.Fatalf("node %d: %v", v, err)
		}
		t.Cleanup(m.Close)
		s.m = append(s.m, m)
		s.run = append(s.run, newFakeRunner(t, stageOf[v], cfg.Len, cfg.Mu))
		s.work = append(s.work, nil)
		s.due = append(s.due, -1)
		s.comp = append(s.comp, 1)
		s.delay = append(s.delay, 1)
		s.crash = append(s.crash, false)
		s.garble = append(s.garble, false)
		s.begun = append(s.begun, 0)
		s.out = append(s.out, map[uint64]map[int]Outcome{})
	}
	return s
}

func (s *relaySim) collect(v int) {
	rd := s.m[v].Ready()
	s.bytes += rd.BytesSent
	for _, e := range rd.Messages {
		p := e.Payload
		if m, err := parseRelayMsg(p); err == nil && s.garble[v] && (m.kind == kindAct || m.kind == kindGrad) {
			p = slices.Clone(p)
			p[len(p)-1] ^= 0x55 // inside the tensor's frame: its checksum fails
		}
		s.queue = append(s.queue, simMsg{at: s.now + s.delay[v], from: v, to: e.To, payload: p})
	}
	s.work[v] = append(s.work[v], rd.Work...)
	for _, o := range rd.Outcomes {
		byMB := s.out[v][o.Iter]
		if byMB == nil {
			byMB = map[int]Outcome{}
			s.out[v][o.Iter] = byMB
		}
		if prev, dup := byMB[o.MB]; dup {
			s.t.Fatalf("node %d: two outcomes for microbatch %d of iteration %d: %+v then %+v", v, o.MB, o.Iter, prev, o)
		}
		byMB[o.MB] = o
	}
	if h := s.m[v].Held(); h > s.cfg.Mu || h < 0 {
		s.t.Fatalf("node %d holds %d activations, mu %d", v, h, s.cfg.Mu)
	}
}

func (s *relaySim) dropped(m simMsg) bool {
	if s.crash[m.from] || s.crash[m.to] {
		return true
	}
	k := ""
	if msg, err := parseRelayMsg(m.payload); err == nil {
		k = msg.kind.String()
	}
	for _, r := range s.drops {
		if (r.from < 0 || r.from == m.from) && (r.to < 0 || r.to == m.to) && (r.kind == "" || r.kind == k) {
			return true
		}
	}
	return false
}

func (s *relaySim) begin(iter uint64, nodes []int) {
	for _, v := range nodes {
		n, err := s.m[v].Begin(iter, s.paths)
		if err != nil {
			s.t.Fatalf("node %d: begin %d: %v", v, iter, err)
		}
		s.begun[v] = iter
		s.want[[2]uint64{uint64(v), iter}] = n
		s.collect(v)
	}
}

// settled reports whether every live node that began an iteration has an
// outcome for each of its visits in it.
func (s *relaySim) settled() bool {
	for v, it := range s.begun {
		if it != 0 && !s.crash[v] && len(s.out[v][it]) < s.want[[2]uint64{uint64(v), it}] {
			return false
		}
	}
	return true
}

// step advances the clock by one tick: due messages, finished work, ticks.
func (s *relaySim) step() {
	s.now++
	var due, later []simMsg
	for _, m := range s.queue {
		if m.at <= s.now {
			due = append(due, m)
		} else {
			later = append(later, m)
		}
	}
	s.queue = later
	for _, m := range due {
		if !s.dropped(m) {
			s.m[m.to].Step(m.from, m.payload)
			s.collect(m.to)
		}
	}
	for v := range s.m {
		for !s.crash[v] && len(s.work[v]) > 0 {
			w := s.work[v][0]
			if s.due[v] < 0 {
				s.due[v] = s.now + s.comp[v]
				if w.Op == OpDrop {
					s.due[v] = s.now
				}
			}
			if s.now < s.due[v] {
				break
			}
			s.work[v], s.due[v] = s.work[v][1:], -1
			if res, ok := w.Run(s.run[v]); ok {
				s.m[v].Done(res)
			}
			s.collect(v)
		}
	}
	for v := range s.m {
		if !s.crash[v] {
			s.m[v].Tick()
			s.collect(v)
		}
	}
}

// runUntil advances up to n ticks, stopping once settled and no message
// or work is left.
func (s *relaySim) runUntil(n int) {
	for range n {
		if s.settled() && len(s.queue) == 0 && !s.busy() {
			return
		}
		s.step()
	}
}

func (s *relaySim) busy() bool {
	for v, w := range s.work {
		if len(w) > 0 && !s.crash[v] {
			return true
		}
	}
	return false
}

// origin returns microbatch mb's outcome at its stage-0 node in iter.
func (s *relaySim) origin(iter uint64, mb int) (Outcome, bool) {
	o, ok := s.out[s.paths[mb].Nodes[0]][iter][mb]
	return o, ok
}

// checkOK requires microbatch mb of iter to have finished with the loss
// and the stage-0 gradient its path implies (exactly with a lossless
// codec, to 1% with a lossy one).
func (s *relaySim) checkOK(iter uint64, mb int) error {
	o, ok := s.origin(iter, mb)
	if !ok || o.Err != nil {
		return fmt.Errorf("microbatch %d: outcome %+v (present %v)", mb, o, ok)
	}
	loss, d := fakeExpect(s.paths[mb], mb, s.cfg.Len)
	near := func(a, b float32) bool {
		if !s.cfg.Codec.Codec.Lossy() {
			return a == b
		}
		return math.Abs(float64(a-b)) <= 0.01*math.Abs(float64(b))+1e-6
	}
	if !near(o.Loss, loss) {
		return fmt.Errorf("microbatch %d: loss %v, path %v implies %v", mb, o.Loss, s.paths[mb].Stages, loss)
	}
	got := s.run[s.paths[mb].Nodes[0]].dout0[fakeKey{iter, mb}]
	if len(got) != len(d) {
		return fmt.Errorf("microbatch %d: stage 0 got a gradient of %d elements", mb, len(got))
	}
	for i := range d {
		if !near(got[i], d[i]) {
			return fmt.Errorf("microbatch %d: stage-0 gradient[%d] = %v, want %v", mb, i, got[i], d[i])
		}
	}
	for k, v := range s.paths[mb].Nodes {
		if h := s.run[v].history[fakeKey{iter, mb}]; k > 0 && !slices.Equal(h, []Op{OpForward, OpBackward}) {
			return fmt.Errorf("microbatch %d: node %d ran %v", mb, v, h)
		}
	}
	return nil
}

var failKinds = map[string]error{
	"timeout": ErrTimeout, "memory": ErrNodeMemory, "aborted": ErrAborted, "hop": ErrHopFailed,
	"compute": ErrCompute, "bad": ErrBadMessage,
}

// TestRelayScenarios runs the scripted scenarios of testdata/relay: every
// interleaving worth keeping, as a deterministic test (runRelayScenario
// and relayExpect document the commands).
func TestRelayScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/relay/*.txt")
	if len(files) < 5 {
		t.Fatalf("%d scenarios", len(files))
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runRelayScenario(t, f) })
	}
}

func runRelayScenario(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg := RelayConfig{Len: 16, Mu: 3, HopWait: 10, MaxStashBytes: 1 << 20, Placement: Placement{Stages: 3}}
	cfg.Codec = compression.DefaultConfig()
	cfg.Codec.Codec, cfg.Codec.ZstdLevel, cfg.Codec.Workers = compression.FP32, 0, 1
	var s *relaySim
	focus := uint64(1)
	for _, l := range scenario.Parse(data) {
		line, text, f := l.No, l.Text, l.Fields
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s:%d: %s: %s", filepath.Base(path), line, text, fmt.Sprintf(format, args...))
		}
		atoi := func(v string) int {
			x, err := strconv.Atoi(v)
			if err != nil {
				fail("%v", err)
			}
			return x
		}
		ints := func(fs []string) []int {
			var out []int
			for _, v := range fs {
				out = append(out, atoi(v))
			}
			return out
		}
		needSim := func() {
			if s == nil {
				fail("no nodes yet")
			}
		}
		switch f[0] {
		case "stages":
			cfg.Placement.Stages = atoi(f[1])
		case "mu":
			cfg.Mu = atoi(f[1])
		case "hopwait":
			cfg.HopWait = int64(atoi(f[1]))
		case "len":
			cfg.Len = atoi(f[1])
		case "codec":
			c, err := compression.ParseCodec(f[1])
			if err != nil {
				fail("%v", err)
			}
			cfg.Codec.Codec = c
		case "nodes": // nodes STAGE...: node i serves the i-th stage listed
			s = newRelaySim(t, cfg, ints(f[1:]))
		case "path": // path NODE...: the next microbatch's path; stages from the placement
			needSim()
			p := Path{}
			for _, v := range ints(f[1:]) {
				p.Nodes = append(p.Nodes, v)
				p.Stages = append(p.Stages, s.pl.StageOf[v])
			}
			s.paths = append(s.paths, p)
		case "valid": // valid SKIP: the paths obey every SkipPipe rule with that skip
			needSim()
			r := Rules{Stages: s.pl.Stages, Skip: atoi(f[1]), MaxJump: 3, MaxSwaps: 2, Mu: cfg.Mu}
			if err := Validate(s.paths, s.pl, r); err != nil {
				fail("%v", err)
			}
		case "begin": // begin ITER [NODE...]: default every live node
			needSim()
			nodes := ints(f[2:])
			if len(nodes) == 0 {
				for v := range s.m {
					if !s.crash[v] {
						nodes = append(nodes, v)
					}
				}
			}
			focus = uint64(atoi(f[1]))
			s.begin(focus, nodes)
		case "beginerr": // beginerr ITER NODE KIND: Begin fails with KIND
			needSim()
			_, err := s.m[atoi(f[2])].Begin(uint64(atoi(f[1])), s.paths)
			if want := failKinds[f[3]]; want == nil || !errors.Is(err, want) {
				fail("begin: %v, want %s", err, f[3])
			}
		case "focus": // focus ITER: later expectations are about ITER
			focus = uint64(atoi(f[1]))
		case "run":
			needSim()
			s.runUntil(atoi(f[1]))
		case "crash":
			needSim()
			for _, v := range ints(f[1:]) {
				s.crash[v] = true
			}
		case "drop": // drop FROM TO [KIND]; * for any node
			needSim()
			d := simDrop{from: -1, to: -1}
			if f[1] != "*" {
				d.from = atoi(f[1])
			}
			if f[2] != "*" {
				d.to = atoi(f[2])
			}
			if len(f) > 3 {
				d.kind = f[3]
			}
			s.drops = append(s.drops, d)
		case "heal":
			s.drops = nil
		case "delay": // delay NODE TICKS: its messages take TICKS
			s.delay[atoi(f[1])] = int64(atoi(f[2]))
		case "compute": // compute NODE TICKS: each of its work items takes TICKS
			s.comp[atoi(f[1])] = int64(atoi(f[2]))
		case "garble": // garble NODE: the last byte of its messages is flipped
			s.garble[atoi(f[1])] = true
		case "failcompute": // failcompute NODE MB: its forward of MB fails
			s.run[atoi(f[1])].fail[atoi(f[2])] = true
		case "expect":
			needSim()
			relayExpect(s, focus, f[1:], ints, atoi, fail)
		default:
			fail("unknown command")
		}
	}
	if s != nil {
		t.Logf("%d ticks, %d bytes sent", s.now, s.bytes)
	}
}

func relayExpect(s *relaySim, iter uint64, f []string, ints func([]string) []int, atoi func(string) int, fail func(string, ...any)) {
	switch f[0] {
	case "ok": // expect ok MB...: finished, with the loss and gradient its path implies
		for _, mb := range ints(f[1:]) {
			if err := s.checkOK(iter, mb); err != nil {
				fail("%v", err)
			}
		}
	case "failed": // expect failed KIND MB...
		want := failKinds[f[1]]
		if want == nil {
			fail("unknown kind %q", f[1])
		}
		for _, mb := range ints(f[2:]) {
			if o, ok := s.origin(iter, mb); !ok || !errors.Is(o.Err, want) {
				fail("microbatch %d: outcome %+v (present %v), want %s", mb, o, ok, f[1])
			}
		}
	case "pending": // expect pending MB...: no outcome yet at the stage-0 node
		for _, mb := range ints(f[1:]) {
			if o, ok := s.origin(iter, mb); ok {
				fail("microbatch %d has an outcome: %+v", mb, o)
			}
		}
	case "visit": // expect visit NODE ok|failed MB...: that node's outcome of its visit
		v := atoi(f[1])
		for _, mb := range ints(f[3:]) {
			o, ok := s.out[v][iter][mb]
			if !ok || (o.Err == nil) != (f[2] == "ok") {
				fail("node %d, microbatch %d: outcome %+v (present %v)", v, mb, o, ok)
			}
		}
	case "clean": // expect clean [NODE...]: default every live node: nothing held by the machine or the runner
		nodes := ints(f[1:])
		if len(nodes) == 0 {
			for v := range s.m {
				if !s.crash[v] {
					nodes = append(nodes, v)
				}
			}
		}
		for _, v := range nodes {
			if h, r := s.m[v].Held(), len(s.run[v].held); h != 0 || r != 0 {
				fail("node %d: machine holds %d, runner %d", v, h, r)
			}
		}
	case "settled": // every live node that began the focus iteration has all its outcomes
		if !s.settled() {
			fail("not settled at tick %d", s.now)
		}
	case "ticks<":
		if s.now >= int64(atoi(f[1])) {
			fail("took %d ticks", s.now)
		}
	case "ticks>=":
		if s.now < int64(atoi(f[1])) {
			fail("took only %d ticks", s.now)
		}
	case "ran": // expect ran NODE OP COUNT: the runner ran OP (forward, head, backward, drop) COUNT times
		var op Op
		for _, o := range []Op{OpForward, OpHead, OpBackward, OpDrop} {
			if o.String() == f[2] {
				op = o
			}
		}
		if got := s.run[atoi(f[1])].counts[op]; op == 0 || got != atoi(f[3]) {
			fail("ran %s %d times", f[2], got)
		}
	default:
		fail("unknown expectation")
	}
}
