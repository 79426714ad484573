package optimizer

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/internal/scenario"
	"github.com/skein-ml/skein/transport"
)

// gsSim runs Gossip machines over a simulated network with a simulated
// clock, like bfSim: every message takes one tick plus its sender's delay.
type gsSim struct {
	t        *testing.T
	cfg      NoLoCoConfig
	n        int
	ids      []transport.PeerID
	m        map[transport.PeerID]*Gossip
	phi, d   map[transport.PeerID][]float32 // what each member starts a step with (honest)
	res      map[transport.PeerID]*GossipResult
	began    map[transport.PeerID]int64
	took     map[transport.PeerID]int64
	rejected map[transport.PeerID][]transport.PeerID
	crashed  map[transport.PeerID]bool
	delay    map[transport.PeerID]int64
	drops    []dropRule
	hostile  map[transport.PeerID][]string // mode and its argument
	queue    []simMsg
	now      int64
}

// The scenarios' clock: MinDeadline 80 ms in ticks of 10 ms (NoLoCoConfig.tick)
// is 8 ticks, InitialDeadline and MaxDeadline 40.
func gossipScenarioConfig() NoLoCoConfig {
	c := DefaultNoLoCo()
	c.InitialDeadline, c.MinDeadline, c.MaxDeadline = 400*time.Millisecond, 80*time.Millisecond, 400*time.Millisecond
	return c
}

func newGSSim(t *testing.T, cfg NoLoCoConfig, n int, ids []transport.PeerID) *gsSim {
	s := &gsSim{t: t, cfg: cfg, n: n, ids: ids, m: map[transport.PeerID]*Gossip{}, phi: map[transport.PeerID][]float32{}, d: map[transport.PeerID][]float32{},
		res: map[transport.PeerID]*GossipResult{}, began: map[transport.PeerID]int64{}, took: map[transport.PeerID]int64{},
		rejected: map[transport.PeerID][]transport.PeerID{}, crashed: map[transport.PeerID]bool{}, delay: map[transport.PeerID]int64{},
		hostile: map[transport.PeerID][]string{}}
	phi0 := randomVec(n, 1, 1)
	for k, id := range ids {
		g, err := NewGossip(cfg, id, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Close)
		g.SetMembers(ids)
		s.m[id] = g
		s.phi[id], s.d[id] = slices.Clone(phi0), randomVec(n, uint64(100+k), 0.01)
		for j, noise := range randomVec(n, uint64(200+k), 0.01) {
			s.phi[id][j] += noise
			s.d[id][j] += 0.01
		}
	}
	return s
}

func (s *gsSim) collect(id transport.PeerID) {
	msgs, rejs, res := s.m[id].Ready()
	for _, r := range rejs {
		s.rejected[id] = append(s.rejected[id], r.peer)
	}
	if res != nil {
		s.res[id], s.took[id] = res, s.now-s.began[id]
	}
	for _, e := range msgs {
		s.queue = append(s.queue, simMsg{from: id, to: e.To, payload: s.tamper(id, e.Payload), at: s.now + 1 + s.delay[id]})
	}
}

// tamper applies a hostile member's behaviour to what it sends.
func (s *gsSim) tamper(from transport.PeerID, payload []byte) []byte {
	h, body, _ := parseMessage(payload)
	switch mode := s.hostile[from]; {
	case len(mode) == 0:
	case mode[0] == "bomb": // a phi frame of a few KiB declaring 4M elements
		c := s.cfg.PhiCodec
		c.ZstdLevel = 3
		enc, err := compression.NewEncoder(c)
		if err != nil {
			s.t.Fatal(err)
		}
		defer enc.Close()
		b, _ := enc.Append(make([]byte, 4), make([]float32, 1<<22), 0)
		putUint32(b, uint32(len(b)-4))
		return appendMessage(nil, h, append(b, body[4+binary.LittleEndian.Uint32(body):]...))
	case mode[0] == "garbage": // the right size, bytes of nothing
		return appendMessage(nil, h, make([]byte, len(body)))
	case mode[0] == "huge": // more than any gossip of this model
		return appendMessage(nil, h, make([]byte, maxGossipBody(s.n)+1))
	case mode[0] == "wrongkind":
		h.kind = kindReady
		return appendMessage(nil, h, make([]byte, 8))
	}
	return payload
}

func (s *gsSim) dropped(m simMsg) bool {
	if s.crashed[m.from] || s.crashed[m.to] {
		return true
	}
	return slices.ContainsFunc(s.drops, func(r dropRule) bool {
		return (r.from == "*" || r.from == m.from) && (r.to == "*" || r.to == m.to)
	})
}

// run advances n ticks.
func (s *gsSim) run(n int) {
	for range n {
		s.now++
		var due []simMsg
		s.queue = slices.DeleteFunc(s.queue, func(m simMsg) bool {
			if m.at <= s.now {
				due = append(due, m)
			}
			return m.at <= s.now
		})
		for _, m := range due {
			if s.m[m.to] != nil && !s.dropped(m) {
				s.m[m.to].Step(m.from, m.payload)
				s.collect(m.to)
			}
		}
		for _, id := range s.ids {
			if !s.crashed[id] {
				s.m[id].Tick()
				s.collect(id)
			}
		}
	}
}

// start runs step on id with its phi (shifted or with its outer gradient
// scaled when hostile so) and a copy of its outer gradient.
func (s *gsSim) start(id transport.PeerID, step uint64) error {
	phi, d := slices.Clone(s.phi[id]), slices.Clone(s.d[id])
	if mode := s.hostile[id]; len(mode) == 2 {
		v, err := strconv.ParseFloat(mode[1], 32)
		if err != nil {
			return err
		}
		for j := range phi {
			switch mode[0] {
			case "shift":
				phi[j] += float32(v)
			case "scale":
				d[j] *= float32(v)
			}
		}
	}
	delete(s.res, id)
	s.began[id] = s.now
	if err := s.m[id].Start(step, phi, d); err != nil {
		return err
	}
	s.collect(id)
	return nil
}

// TestGossipScenarios runs the scripted scenarios of testdata/noloco.
func TestGossipScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/noloco/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runGossipScenario(t, f) })
	}
}

func runGossipScenario(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s *gsSim
	cfg, n := gossipScenarioConfig(), 64
	for _, l := range scenario.Parse(data) {
		f := l.Fields
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s:%d: %s: %s", filepath.Base(path), l.No, l.Text, fmt.Sprintf(format, args...))
		}
		num := func(v string) float64 {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				fail("%v", err)
			}
			return x
		}
		ids := func(fs []string) (out []transport.PeerID) {
			for _, f := range fs {
				out = append(out, transport.PeerID(f))
			}
			return out
		}
		// ID : ids...
		split := func(fs []string) (transport.PeerID, []transport.PeerID) {
			if len(fs) < 2 || fs[1] != ":" {
				fail("want ID : IDs")
			}
			return transport.PeerID(fs[0]), ids(fs[2:])
		}
		switch f[0] {
		case "group":
			cfg.GroupSize = int(num(f[1]))
		case "nodes":
			s = newGSSim(t, cfg, n, ids(f[1:]))
		case "start": // start STEP ids...
			for _, id := range ids(f[2:]) {
				if err := s.start(id, uint64(num(f[1]))); err != nil {
					fail("%s: %v", id, err)
				}
			}
		case "advance": // advance ID STEP: ID adopts a state at STEP
			s.m[transport.PeerID(f[1])].Advance(uint64(num(f[2])))
		case "announce": // announce ID STEP: the others hear ID announce STEP as its next
			for _, g := range s.m {
				g.Announce(transport.PeerID(f[1]), uint64(num(f[2])))
			}
		case "send": // send FROM TO STEP: FROM sends TO a well-formed gossip message for STEP
			body, err := s.m[transport.PeerID(f[2])].encode(s.phi[s.ids[0]], s.d[s.ids[0]], 0)
			if err != nil {
				fail("%v", err)
			}
			msg := appendMessage(nil, header{kind: kindGossip, round: uint64(num(f[3]))}, body)
			s.queue = append(s.queue, simMsg{from: transport.PeerID(f[1]), to: transport.PeerID(f[2]), payload: msg, at: s.now + 1})
		case "crash": // never heard from again; the others still see it
			for _, id := range ids(f[1:]) {
				s.crashed[id] = true
			}
		case "drop": // drop FROM TO
			s.drops = append(s.drops, dropRule{from: transport.PeerID(f[1]), to: transport.PeerID(f[2])})
		case "heal":
			s.drops = nil
		case "delay": // delay ID TICKS: what ID sends from now on
			s.delay[transport.PeerID(f[1])] = int64(num(f[2]))
		case "hostile": // hostile ID MODE [ARG]
			s.hostile[transport.PeerID(f[1])] = f[2:]
		case "run":
			s.run(int(num(f[1])))
		case "expect":
			expectGossip(s, f[1:], ids, split, num, fail)
		default:
			fail("unknown command")
		}
	}
}

func expectGossip(s *gsSim, f []string, ids func([]string) []transport.PeerID, split func([]string) (transport.PeerID, []transport.PeerID),
	num func(string) float64, fail func(string, ...any)) {
	sameSet := func(a, b []transport.PeerID) bool {
		return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
	}
	switch f[0] {
	case "done": // done ids...: a result, no error
		for _, id := range ids(f[1:]) {
			if r := s.res[id]; r == nil || r.Err != nil {
				fail("%s: result %+v", id, r)
			}
		}
	case "pending":
		for _, id := range ids(f[1:]) {
			if r := s.res[id]; r != nil {
				fail("%s has a result: %+v", id, r.GossipStats)
			}
		}
	case "heard", "clipped", "rejected": // heard ID : ids... (exactly)
		id, want := split(f[1:])
		var got []transport.PeerID
		if r := s.res[id]; f[0] == "rejected" {
			got = s.rejected[id]
		} else if r == nil {
			fail("%s has no result", id)
		} else if f[0] == "heard" {
			got = r.Heard
		} else {
			got = r.Clipped
		}
		if !sameSet(got, want) {
			fail("%s %s %v", id, f[0], got)
		}
	case "ticks": // ticks ID < N | ticks ID >= N: from Start to the result
		id, v := transport.PeerID(f[1]), int64(num(f[3]))
		got, ok := s.took[id]
		if !ok || (f[2] == "<") != (got < v) {
			fail("%s took %d ticks (result: %v)", id, got, ok)
		}
	case "near": // near ID X : ids...: ID's means within X (L2) of the listed members' phi and outer gradient
		id, members := split(slices.Delete(slices.Clone(f[1:]), 1, 2))
		r := s.res[id]
		if r == nil {
			fail("%s has no result", id)
		}
		for _, v := range []struct {
			name string
			got  []float32
			of   map[transport.PeerID][]float32
		}{{"phi", r.PhiBar, s.phi}, {"outer gradient", r.DBar, s.d}} {
			mean := make([]float32, s.n)
			for _, m := range members {
				for j, x := range v.of[m] {
					mean[j] += x / float32(len(members))
				}
			}
			if d := distance(v.got, mean); !(d < num(f[2])) {
				fail("%s's mean %s is %.3g from the members', want < %s", id, v.name, d, f[2])
			}
		}
	case "stashed": // stashed ID N: messages kept for later steps
		g := s.m[transport.PeerID(f[1])]
		k := len(g.ahead)
		for _, es := range g.arrived {
			k += len(es)
		}
		if k != int(num(f[2])) {
			fail("%d messages kept", k)
		}
	default:
		fail("unknown expectation")
	}
}
