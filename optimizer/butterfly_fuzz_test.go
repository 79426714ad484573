package optimizer

import (
	"testing"

	"github.com/skein-ml/skein/transport"
)

// FuzzButterflyStep feeds arbitrary bytes to a machine in every phase of a
// round: nothing may panic, allocate past the bounds, or end the round of
// an honest member. The corpus starts from every message of a real round.
func FuzzButterflyStep(f *testing.F) {
	s := newBFSim(f, 64, []transport.PeerID{"a", "b", "c"}, nil)
	for _, id := range s.ids {
		s.start(id, 1, 7)
	}
	seen := map[kind]bool{}
	for range 50 {
		for _, m := range s.queue {
			if h, _, err := parseMessage(m.payload); err == nil && !seen[h.kind] {
				seen[h.kind] = true
				f.Add(m.payload, uint8(0))
			}
		}
		s.run(1)
	}
	f.Add([]byte("SK\x01\x09"), uint8(1))
	f.Fuzz(func(t *testing.T, payload []byte, phase uint8) {
		sim := newBFSim(t, 64, []transport.PeerID{"a", "b", "c"}, nil)
		for _, id := range sim.ids {
			sim.start(id, 1, 7)
		}
		sim.run(int(phase % 8))
		for _, from := range []transport.PeerID{"b", "c", "z"} {
			sim.m["a"].Step(from, payload)
			sim.collect("a")
		}
		sim.run(200)
		if r := sim.res["a"]; r == nil {
			t.Fatal("no result")
		}
	})
}

// FuzzButterflyBodies fuzzes the body parsers directly.
func FuzzButterflyBodies(f *testing.F) {
	f.Add(appendGroupBody(nil, 7, []transport.PeerID{"a", "b"}, "a"))
	f.Add(appendDecls(nil, []decl{{idx: 1}}))
	f.Add(appendInputs(nil, []signedInput{{decl: decl{idx: 0}}}))
	f.Add(appendAudit(nil, []auditInput{{frame: []byte{1, 2, 3}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if g, err := parseGroup(b); err == nil && len(g.members) == 0 {
			t.Fatal("empty group accepted")
		}
		if ds, rest, err := parseDecls(b, 16); err == nil && len(ds)*declLen+4+len(rest) != len(b) {
			t.Fatal("decls: bytes unaccounted")
		}
		if in, err := parseInputs(b, 16); err == nil && len(in)*inputLen+4 != len(b) {
			t.Fatal("inputs: bytes unaccounted")
		}
		if in, err := parseAudit(b, 16, 1024); err == nil {
			for _, x := range in {
				if len(x.frame) > 1024 {
					t.Fatal("audit frame past the bound")
				}
			}
		}
	})
}
