package optimizer

import (
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/internal/scenario"
	"github.com/skein-ml/skein/transport"
)

// testSigner signs with a deterministic ed25519 key per member (derived from
// its ID), so scripted scenarios are reproducible.
type testSigner struct{ self transport.PeerID }

func testKey(id transport.PeerID) ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("skein-test-key/" + id))
	return ed25519.NewKeyFromSeed(seed[:])
}

func (s testSigner) Sign(msg []byte) ([]byte, error) { return ed25519.Sign(testKey(s.self), msg), nil }

func (s testSigner) Verify(id transport.PeerID, msg, sig []byte) bool {
	return len(sig) == ed25519.SignatureSize && ed25519.Verify(testKey(id).Public().(ed25519.PublicKey), msg, sig)
}

// bfSim runs butterfly machines over a simulated network with a simulated
// clock: every message takes one tick (plus the sender's delay), and rules
// drop, delay or tamper with messages.
type bfSim struct {
	t        testing.TB
	cfg      ButterflyConfig
	ids      []transport.PeerID
	m        map[transport.PeerID]*Butterfly
	x, out   map[transport.PeerID][]float32
	res      map[transport.PeerID]*RoundResult
	offenses map[transport.PeerID][]Offense
	crashed  map[transport.PeerID]bool
	delay    map[transport.PeerID]int64
	lagParts map[transport.PeerID]int64 // extra delay of a member's parts
	drops    []dropRule
	hostile  map[transport.PeerID]string
	queue    []simMsg
	now      int64
	started  map[transport.PeerID]bool
	isolated map[transport.PeerID]bool
	bytes    int64
}

type simMsg struct {
	from, to transport.PeerID
	payload  []byte
	at       int64
}

type dropRule struct {
	from, to transport.PeerID // "*" for any
	kind     string           // "" for any
}

func newBFSim(t testing.TB, n int, ids []transport.PeerID, mod func(*ButterflyConfig)) *bfSim {
	cfg := DefaultButterflyConfig(n, nil, 1)
	cfg.ReadyWait, cfg.LeaderWait, cfg.PhaseWait, cfg.MinPhase, cfg.MaxPhase = 5, 20, 10, 2, 50
	if mod != nil {
		mod(&cfg)
	}
	s := &bfSim{t: t, cfg: cfg, m: map[transport.PeerID]*Butterfly{}, x: map[transport.PeerID][]float32{}, out: map[transport.PeerID][]float32{},
		res: map[transport.PeerID]*RoundResult{}, offenses: map[transport.PeerID][]Offense{}, crashed: map[transport.PeerID]bool{},
		delay: map[transport.PeerID]int64{}, lagParts: map[transport.PeerID]int64{}, hostile: map[transport.PeerID]string{}, started: map[transport.PeerID]bool{}, isolated: map[transport.PeerID]bool{}}
	for _, id := range ids {
		s.add(id)
	}
	return s
}

func (s *bfSim) add(id transport.PeerID) {
	c := s.cfg
	c.Signer = testSigner{id}
	b, err := NewButterfly(c, id)
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(b.Close)
	s.ids = append(s.ids, id)
	slices.Sort(s.ids)
	s.m[id] = b
	x := make([]float32, c.Len)
	k := float64(len(s.ids))
	for j := range x {
		x[j] = float32(0.1*math.Sin(float64(j)*0.013+k) + 0.01*k)
	}
	s.x[id], s.out[id] = x, make([]float32, c.Len)
	for _, p := range s.ids {
		s.m[p].SetMembers(s.live())
	}
}

func (s *bfSim) live() []transport.PeerID {
	var out []transport.PeerID
	for _, p := range s.ids {
		if !s.crashed[p] {
			out = append(out, p)
		}
	}
	return out
}

func (s *bfSim) collect(id transport.PeerID) {
	rd := s.m[id].Ready()
	s.offenses[id] = append(s.offenses[id], rd.Offenses...)
	if rd.Result != nil {
		s.res[id] = rd.Result
	}
	for _, e := range rd.Messages {
		for _, p := range s.tamper(id, e) {
			s.bytes += int64(len(p.Payload))
			at := s.now + 1 + s.delay[id]
			if h, _, err := parseMessage(p.Payload); err == nil && h.kind == kindPart {
				at += s.lagParts[id]
			}
			s.queue = append(s.queue, simMsg{from: id, to: p.To, payload: p.Payload, at: at})
		}
	}
}

// tamper applies a hostile member's behaviour to what it sends.
func (s *bfSim) tamper(from transport.PeerID, e Envelope) []Envelope {
	mode := s.hostile[from]
	if mode == "" {
		return []Envelope{e}
	}
	h, body, err := parseMessage(e.Payload)
	if err != nil {
		return []Envelope{e}
	}
	resign := func(frame []byte) []byte {
		hash := sha256.Sum256(frame)
		sig, _ := testSigner{from}.Sign(partSigMsg(h.round, h.step, h.group, h.chunk, hash))
		return appendMessage(nil, h, append(sig, frame...))
	}
	encode := func(v float32, n int) []byte {
		enc, _ := compression.NewEncoder(s.cfg.Codec)
		defer enc.Close()
		x := make([]float32, n)
		for i := range x {
			x[i] = v
		}
		f, _ := enc.Append(nil, x, 1)
		return f
	}
	switch {
	case mode == "splitgroup" && h.kind == kindGroup && slices.Index(s.ids, e.To)%2 == 1:
		// A leader that tells half the members another group (one member
		// fewer), signed like the real one.
		g, err := parseGroup(body)
		if err != nil || len(g.members) < 2 {
			return []Envelope{e}
		}
		fake := appendGroupBody(nil, g.stateHash, g.members[:len(g.members)-1], g.leader)
		sig, _ := testSigner{from}.Sign(groupSigMsg(h.round, h.step, fake))
		e.Payload = appendMessage(nil, h, append(fake, sig...))
	case mode == "forge" && h.kind == kindResult:
		// An owner that tampers with its aggregate (its declared inputs
		// unchanged).
		ds, frame, err := parseDecls(body, 1<<16)
		if err != nil {
			return []Envelope{e}
		}
		g := s.m[from].cur.group
		lo, hi := chunkBounds(s.cfg.Len, len(g), int(h.chunk))
		_ = frame
		e.Payload = appendMessage(nil, h, append(appendDecls(nil, ds), encode(3, hi-lo)...))
	case mode == "mutesome" && h.kind == kindPart && slices.Index(s.ids, e.To)%2 == 0:
		// Silent to some: its parts never reach the members of even rank.
		return nil
	case mode == "bad" && h.kind == kindPart:
		g := s.m[from].cur.group
		lo, hi := chunkBounds(s.cfg.Len, len(g), int(h.chunk))
		e.Payload = resign(encode(1e6, hi-lo))
	case mode == "equivocate" && h.kind == kindPart:
		g := s.m[from].cur.group
		if e.To == g[h.chunk] { // the first owner gets another frame
			lo, hi := chunkBounds(s.cfg.Len, len(g), int(h.chunk))
			e.Payload = resign(encode(0.5, hi-lo))
		}
	}
	return []Envelope{e}
}

func (s *bfSim) dropped(m simMsg) bool {
	if s.crashed[m.from] || s.crashed[m.to] {
		return true
	}
	h, _, err := parseMessage(m.payload)
	for _, r := range s.drops {
		if (r.from == "*" || r.from == m.from) && (r.to == "*" || r.to == m.to) &&
			(r.kind == "" || (err == nil && h.kind.String() == r.kind)) {
			return true
		}
	}
	return false
}

// run advances up to n ticks, stopping once every started live member has
// a result.
func (s *bfSim) run(n int) {
	for range n {
		if s.settled() {
			return
		}
		s.now++
		s.step()
	}
}

// step delivers the messages due now and ticks every live member.
func (s *bfSim) step() {
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
		if s.m[m.to] == nil || s.dropped(m) {
			continue
		}
		s.m[m.to].Step(m.from, m.payload)
		s.collect(m.to)
	}
	for _, id := range s.ids {
		if !s.crashed[id] {
			s.m[id].Tick()
			s.collect(id)
		}
	}
}

func (s *bfSim) settled() bool {
	for id := range s.started {
		if !s.crashed[id] && !s.isolated[id] && s.res[id] == nil {
			return false
		}
	}
	return true
}

func (s *bfSim) start(id transport.PeerID, round, hash uint64) {
	x := s.x[id]
	if s.hostile[id] == "scale" {
		x = slices.Clone(x)
		for i := range x {
			x[i] *= 1000
		}
	}
	delete(s.res, id)
	if err := s.m[id].Start(round, hash, x, s.out[id]); err != nil {
		s.t.Fatalf("start %s: %v", id, err)
	}
	s.started[id] = true
	s.collect(id)
}

// TestButterflyScenarios runs the scripted scenarios of testdata/butterfly:
// every interleaving that broke the ring, as a deterministic test.
func TestButterflyScenarios(t *testing.T) {
	files, _ := filepath.Glob("testdata/butterfly/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f, nil) })
	}
}

// TestButterflyScenariosDemoWire runs every scripted scenario again with
// the demo's wire (manifest.Demo: 1-bit signs with a scale per 256
// values, parts and aggregates alike): each fault must end with the same
// bits on every member that finishes, the same offenders reported, and
// results that are the robust aggregate of the decoded contributions,
// re-encoded (codec-aware "mean" and "within").
func TestButterflyScenariosDemoWire(t *testing.T) {
	files, _ := filepath.Glob("testdata/butterfly/*.txt")
	if len(files) == 0 {
		t.Fatal("no scenarios")
	}
	wire := func(c *ButterflyConfig) { c.Codec.Codec, c.Codec.BlockSize = compression.Sign, 256 }
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runScenario(t, f, wire) })
	}
}

func runScenario(t *testing.T, path string, wire func(*ButterflyConfig)) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s *bfSim
	var leader transport.PeerID
	n := 1000
	var mods []func(*ButterflyConfig)
	if wire != nil {
		mods = append(mods, wire)
	}
	ids := func(fs []string) []transport.PeerID {
		var out []transport.PeerID
		for _, f := range fs {
			out = append(out, transport.PeerID(f))
		}
		return out
	}
	for _, l := range scenario.Parse(data) {
		line, text, f := l.No, l.Text, l.Fields
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s:%d: %s: %s", filepath.Base(path), line, text, fmt.Sprintf(format, args...))
		}
		atoi := func(v string) int64 {
			x, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				fail("%v", err)
			}
			return x
		}
		// lhs : rhs
		split := func() ([]transport.PeerID, []transport.PeerID) {
			i := slices.Index(f, ":")
			if i < 0 {
				fail("want ': '")
			}
			return ids(f[2:i]), ids(f[i+1:])
		}
		switch f[0] {
		case "len":
			n = int(atoi(f[1]))
		case "trim":
			v := int(atoi(f[1]))
			mods = append(mods, func(c *ButterflyConfig) { c.Robust.Trim = v })
		case "replicas":
			v := int(atoi(f[1]))
			mods = append(mods, func(c *ButterflyConfig) { c.Replicas = v })
		case "nodes":
			s = newBFSim(t, n, ids(f[1:]), func(c *ButterflyConfig) {
				for _, m := range mods {
					m(c)
				}
			})
		case "join":
			s.add(transport.PeerID(f[1]))
		case "start": // start ROUND HASH ids...
			round, hash := uint64(atoi(f[1])), uint64(atoi(f[2]))
			for _, id := range ids(f[3:]) {
				s.start(id, round, hash)
			}
		case "crash":
			for _, id := range ids(f[1:]) {
				s.crashed[id] = true
			}
			for _, id := range s.live() {
				s.m[id].SetMembers(s.live())
			}
		case "crashleader": // the round's first leader dies unseen: its messages are lost, members still list it
			l := s.m[s.ids[0]].rank(uint64(atoi(f[1])))[0]
			s.isolated[l] = true
			s.drops = append(s.drops, dropRule{from: l, to: "*"}, dropRule{from: "*", to: l})
		case "hostileleader": // hostileleader ROUND MODE: the round's first leader misbehaves
			leader = s.m[s.ids[0]].rank(uint64(atoi(f[1])))[0]
			s.hostile[leader] = f[2]
		case "expectleader": // expectleader offender|same: the honest members reported the hostile leader / agree
			var honest []string
			for _, id := range s.live() {
				if id != leader && !s.isolated[id] {
					honest = append(honest, string(id))
				}
			}
			switch f[1] {
			case "offender":
				f = append(append([]string{"expect", "offender"}, honest...), ":", string(leader))
			case "same":
				var ok []string
				for _, id := range honest {
					if r := s.res[transport.PeerID(id)]; r != nil && r.Err == nil {
						ok = append(ok, id)
					}
				}
				if len(ok) == 0 {
					fail("no honest member finished the round")
				}
				f = append([]string{"expect", "same"}, ok...)
			}
			expect(t, s, f, split, ids, fail)
		case "startlive": // startlive ROUND HASH: every member neither crashed nor isolated
			for _, id := range s.live() {
				if !s.isolated[id] {
					s.start(id, uint64(atoi(f[1])), uint64(atoi(f[2])))
				}
			}
		case "expectlive":
			var live []string
			for _, id := range s.live() {
				if !s.isolated[id] {
					live = append(live, string(id))
				}
			}
			f = append([]string{"expect", f[1]}, live...)
			expect(t, s, f, split, ids, fail)
		case "cutoff": // cutoff ID: ID sees only itself and no message reaches it or leaves it
			id := transport.PeerID(f[1])
			s.m[id].SetMembers(nil)
			s.drops = append(s.drops, dropRule{from: id, to: "*"}, dropRule{from: "*", to: id})
		case "hide": // hide VIEWER MEMBER: VIEWER's membership lacks MEMBER
			var v []transport.PeerID
			for _, p := range s.live() {
				if p != transport.PeerID(f[2]) {
					v = append(v, p)
				}
			}
			s.m[transport.PeerID(f[1])].SetMembers(v)
		case "drop": // drop FROM TO [KIND]
			r := dropRule{from: transport.PeerID(f[1]), to: transport.PeerID(f[2])}
			if len(f) > 3 {
				r.kind = f[3]
			}
			s.drops = append(s.drops, r)
		case "heal":
			s.drops = nil
		case "delay":
			s.delay[transport.PeerID(f[1])] = atoi(f[2])
		case "hostile":
			s.hostile[transport.PeerID(f[1])] = f[2]
		case "run":
			s.run(int(atoi(f[1])))
		case "expect":
			expect(t, s, f, split, ids, fail)
		default:
			fail("unknown command")
		}
	}
	if s != nil {
		t.Logf("%d ticks, %d bytes sent", s.now, s.bytes)
	}
}

func expect(t *testing.T, s *bfSim, f []string, split func() ([]transport.PeerID, []transport.PeerID), ids func([]string) []transport.PeerID, fail func(string, ...any)) {
	t.Helper()
	switch f[1] {
	case "ok":
		for _, id := range ids(f[2:]) {
			if r := s.res[id]; r == nil || r.Err != nil {
				fail("%s: result %+v", id, r)
			}
		}
	case "err": // expect err KIND ids...
		want := map[string]error{"behind": ErrBehind, "failed": ErrRoundFailed, "excluded": ErrExcluded}[f[2]]
		for _, id := range ids(f[3:]) {
			if r := s.res[id]; r == nil || !errorsIs(r.Err, want) {
				fail("%s: result %+v, want %v", id, r, want)
			}
		}
	case "pending":
		for _, id := range ids(f[2:]) {
			if s.res[id] != nil {
				fail("%s has a result: %+v", id, s.res[id])
			}
		}
	case "same":
		var first []float32
		for _, id := range ids(f[2:]) {
			if first == nil {
				first = s.out[id]
				continue
			}
			if !bitsEqual(first, s.out[id]) {
				fail("%s's result differs", id)
			}
		}
	case "group":
		lhs, rhs := split()
		for _, id := range lhs {
			if r := s.res[id]; r == nil || !slices.Equal(r.Group, rhs) {
				fail("%s: group %v", id, r)
			}
		}
	case "leftout":
		for _, id := range ids(f[2:]) {
			if r := s.res[id]; r == nil || !r.LeftOut {
				fail("%s not left out: %+v", id, r)
			}
		}
	case "verified": // every part of these members' results was confirmed
		for _, id := range ids(f[2:]) {
			if r := s.res[id]; r == nil || r.Verified != len(r.Group) {
				fail("%s: %+v", id, r)
			}
		}
	case "offender": // expect offender reporters... : offenders...
		lhs, rhs := split()
		for _, id := range lhs {
			for _, o := range rhs {
				if !slices.ContainsFunc(s.offenses[id], func(x Offense) bool { return x.Peer == o }) {
					fail("%s did not report %s (reported %v)", id, o, s.offenses[id])
				}
			}
		}
	case "clean": // nobody reported an offense
		for id, os := range s.offenses {
			if len(os) > 0 {
				fail("%s reported %v", id, os)
			}
		}
	case "within": // expect within ids : honest...: every coordinate within the honest range (plus codec slack)
		lhs, rhs := split()
		if s.cfg.Codec.Codec == compression.Sign {
			withinSigns(s, lhs, rhs, fail)
			return
		}
		for _, id := range lhs {
			for j, v := range s.out[id] {
				lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
				for _, h := range rhs {
					lo, hi = min(lo, s.x[h][j]), max(hi, s.x[h][j])
				}
				if slack := 0.02 * (hi - lo + 0.01); v < lo-slack || v > hi+slack {
					fail("%s[%d] = %v outside the honest range [%v, %v]", id, j, v, lo, hi)
				}
			}
		}
	case "mean": // expect mean ids : members: the result is the (trimmed) mean of the members' contributions, to codec precision
		lhs, rhs := split()
		want := make([]float32, s.cfg.Len)
		var ins [][]float32
		for _, h := range rhs {
			ins = append(ins, s.x[h])
		}
		tol := 0.01
		if s.cfg.Codec.Codec == compression.Sign {
			want, tol = signMean(s, lhs, rhs), 1e-6
		} else {
			s.cfg.Robust.Aggregate(want, ins, nil)
		}
		for _, id := range lhs {
			for j, v := range s.out[id] {
				if math.Abs(float64(v-want[j])) > tol {
					fail("%s[%d] = %v, want %v", id, j, v, want[j])
				}
			}
		}
	case "ticks<":
		if s.now >= atoiT(f[2]) {
			fail("took %d ticks", s.now)
		}
	default:
		fail("unknown expectation")
	}
}

func atoiT(v string) int64 { x, _ := strconv.ParseInt(v, 10, 64); return x }

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func errorsIs(err, target error) bool { return target != nil && err != nil && errors.Is(err, target) }

// TestButterflyRandomSchedules runs many random schedules (members' link
// delays, start times, one member dying unseen at a random tick) and
// requires what the protocol promises: every member that ends the round
// with a result holds the same bits, and the survivors all end it.
func TestButterflyRandomSchedules(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 60
	}
	for seed := range seeds {
		rng := newRand(uint64(seed))
		s, ids := randomSim(t, rng, 4)
		m := len(ids)
		victim := transport.PeerID("")
		if rng.IntN(2) == 0 {
			victim = ids[rng.IntN(m)]
		}
		killAt := int64(rng.IntN(30))
		hostile := transport.PeerID("")
		if rng.IntN(3) == 0 {
			hostile = ids[rng.IntN(m)]
			if hostile != victim {
				s.hostile[hostile] = []string{"scale", "forge", "bad", "equivocate", "splitgroup"}[rng.IntN(5)]
			} else {
				hostile = ""
			}
		}
		starts := map[transport.PeerID]int64{}
		for _, id := range ids {
			starts[id] = int64(rng.IntN(8))
		}
		for tick := int64(0); tick < 3000 && !(tick > 10 && s.settled()); tick++ {
			for _, id := range ids {
				if starts[id] == tick && !s.crashed[id] {
					s.start(id, 1, 7)
				}
			}
			if victim != "" && tick == killAt {
				s.isolated[victim] = true
				s.drops = append(s.drops, dropRule{from: victim, to: "*"}, dropRule{from: "*", to: victim})
			}
			s.run(1)
		}
		var first []float32
		var firstID transport.PeerID
		for _, id := range ids {
			if id == victim || id == hostile {
				continue
			}
			r := s.res[id]
			if r == nil {
				t.Fatalf("seed %d: %s has no result after %d ticks", seed, id, s.now)
			}
			if r.Err != nil {
				continue // failed or behind: the caller retries or re-syncs
			}
			if first == nil {
				first, firstID = s.out[id], id
			} else if !bitsEqual(first, s.out[id]) {
				if os.Getenv("SKEIN_BF_DEBUG") != "" {
					dumpParts(s)
				}
				t.Fatalf("seed %d (M=%d, victim %q at %d, hostile %q %s): %s and %s hold different results", seed, m, victim, killAt, hostile, s.hostile[hostile], firstID, id)
			}
		}
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 99)) }

// randomSim is a simulation of 3 to 2+spread members (p0, p1, ...) with
// random link delays of 0-3 ticks, drawn from rng.
func randomSim(t *testing.T, rng *rand.Rand, spread int) (*bfSim, []transport.PeerID) {
	m := 3 + rng.IntN(spread)
	var ids []transport.PeerID
	for i := range m {
		ids = append(ids, transport.PeerID(fmt.Sprintf("p%d", i)))
	}
	s := newBFSim(t, 257, ids, nil)
	for _, id := range ids {
		s.delay[id] = int64(rng.IntN(4))
	}
	return s, ids
}

func dumpParts(s *bfSim) {
	for _, id := range s.ids {
		c := s.m[id].cur
		fmt.Println(id, "group", c.group, "res", c.result, "delay", s.delay[id], "isolated", s.isolated[id])
		for p, pt := range c.parts {
			h, fa, fb := sha256.Sum256(pt.accepted), sha256.Sum256(pt.frameA), sha256.Sum256(pt.frameB)
			fmt.Printf("  part %d owners %s,%s acc %x A %x B %x dig %x ver %v audit %v gotA %v gotB %v fetchAt %d\n", p, pt.a, pt.b, h[:3], fa[:3], fb[:3],
				pt.digestB[:min(3, len(pt.digestB))], pt.verified, pt.audit, pt.gotAudA, pt.gotAudB, pt.fetchAt)
		}
	}
}

// TestButterflyForgerWithStalledCoOwner: a forger owns parts beside honest
// co-owners, and one honest member stalls for a while (a paused process:
// its messages lost, the others still listing it) at a random moment, then
// comes back. Members that heard the stalled co-owner's digest before it
// stalled and members that did not must not end with different bits: a
// member holding one owner's aggregate alone checks it against the inputs
// that owner declared instead of taking its word (before, some members
// took the forger's aggregate and others rejected it; seeds 3, 127 and 171
// split that way). The stalled member itself may still end apart when it
// comes back after the others decided without it; the state-hash re-sync
// repairs that, so it is left out here.
func TestButterflyForgerWithStalledCoOwner(t *testing.T) {
	seeds := 400
	if testing.Short() {
		seeds = 200
	}
	for seed := range seeds {
		rng := newRand(uint64(seed) + 7777)
		s, ids := randomSim(t, rng, 3)
		m := len(ids)
		forger := ids[rng.IntN(m)]
		victim := ids[rng.IntN(m)]
		for victim == forger {
			victim = ids[rng.IntN(m)]
		}
		s.hostile[forger] = "forge"
		stallAt := int64(rng.IntN(40))
		backAt := stallAt + 3 + int64(rng.IntN(60))
		for _, id := range ids {
			s.start(id, 1, 7)
		}
		for tick := int64(0); tick < 3000 && !(tick > 10 && s.settled()); tick++ {
			switch tick {
			case stallAt:
				s.isolated[victim] = true
				s.drops = append(s.drops, dropRule{from: victim, to: "*"}, dropRule{from: "*", to: victim})
			case backAt:
				s.isolated[victim] = false
				s.drops = nil
			}
			s.run(1)
		}
		var first []float32
		var firstID transport.PeerID
		for _, id := range ids {
			if id == forger || id == victim {
				continue
			}
			r := s.res[id]
			if r == nil {
				t.Fatalf("seed %d: %s has no result after %d ticks", seed, id, s.now)
			}
			if r.Err != nil {
				continue // failed: the caller retries or re-syncs
			}
			if first == nil {
				first, firstID = s.out[id], id
			} else if !bitsEqual(first, s.out[id]) {
				t.Fatalf("seed %d (M=%d, %s stalled at %d until %d, forger %s): %s and %s hold different results",
					seed, m, victim, stallAt, backAt, forger, firstID, id)
			}
		}
	}
}

// TestButterflyLateFirstOwner: the first owner of a part aggregates long
// after the second (its deadlines are longer: each member learns its own;
// it waited for a part lost on the way), which gave up on the first's list
// and aggregated every input it held; the first took only the inputs on
// the second's list, fewer. The members that decided before the first
// owner's aggregate came took the second owner's alone (checked against
// its inputs); the first owner, which holds both, must take the same.
// Before, it took its own (both are consistent: "the first owner's") and
// ended the round with other bits than every other member.
func TestButterflyLateFirstOwner(t *testing.T) {
	s := newBFSim(t, 1000, fiveIDs, nil)
	// d owns part 3 first (e second) and part 2 second (c first); b's
	// parts never reach it, so it waits for them until its deadline.
	s.m["d"].cfg.PhaseWait = 5 * s.cfg.PhaseWait
	s.drops = append(s.drops, dropRule{from: "b", to: "d", kind: "part"})
	for _, id := range fiveIDs {
		s.start(id, 1, 7)
	}
	s.run(1000)
	for _, id := range fiveIDs {
		if r := s.res[id]; r == nil || r.Err != nil || len(r.Group) != 5 {
			t.Fatalf("%s: %+v", id, r)
		}
		if !bitsEqual(s.out[id], s.out["a"]) {
			t.Fatalf("%s and a hold different results", id)
		}
	}
	if pt := s.m["a"].cur.parts[3]; !pt.audit || !slices.Equal(pt.accepted, pt.frameB) {
		t.Fatal("a did not take e's aggregate of part 3 after an audit: the schedule no longer tests this")
	}
}

// signRoundTrip is x through the sim's wire codec and back: what an owner
// decodes from a part, or a member from an aggregate.
func signRoundTrip(t testing.TB, cfg compression.Config, x []float32) []float32 {
	t.Helper()
	enc, err := compression.NewEncoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	dec, err := compression.NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	f, err := enc.Append(nil, x, 0)
	if err != nil {
		t.Fatal(err)
	}
	out, err := dec.DecodeBytes(f, make([]float32, len(x)))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// signMean is what a round of the members rhs gives with a lossy wire, part
// by part over the group of lhs[0]'s result: the robust aggregate of each
// member's part as its owners decode it, encoded and decoded again as the
// aggregate travels.
func signMean(s *bfSim, lhs, rhs []transport.PeerID) []float32 {
	group := s.res[lhs[0]].Group
	want := make([]float32, s.cfg.Len)
	for p := range group {
		lo, hi := chunkBounds(s.cfg.Len, len(group), p)
		var ins [][]float32
		for _, h := range rhs {
			ins = append(ins, signRoundTrip(s.t, s.cfg.Codec, s.x[h][lo:hi]))
		}
		agg := make([]float32, hi-lo)
		s.cfg.Robust.Aggregate(agg, ins, nil)
		copy(want[lo:hi], signRoundTrip(s.t, s.cfg.Codec, agg))
	}
	return want
}

// withinSigns is "within" for a 1-bit wire, where a value is a sign times
// its block's scale and may lie outside the honest values' range: every
// part of the result must be no larger than the largest honest value its
// owners decoded there (a robust aggregate of values that are each at most
// that, re-encoded, stays under it), so a hostile member's large or forged
// values would show.
func withinSigns(s *bfSim, lhs, rhs []transport.PeerID, fail func(string, ...any)) {
	for _, id := range lhs {
		group := s.res[id].Group
		for p := range group {
			lo, hi := chunkBounds(s.cfg.Len, len(group), p)
			var bound float32
			for _, h := range rhs {
				for _, v := range signRoundTrip(s.t, s.cfg.Codec, s.x[h][lo:hi]) {
					bound = max(bound, float32(math.Abs(float64(v))))
				}
			}
			for j, v := range s.out[id][lo:hi] {
				if float32(math.Abs(float64(v))) > bound*1.0001 {
					fail("%s[%d] = %v, beyond the honest members' largest decoded value %v in its part", id, lo+j, v, bound)
				}
			}
		}
	}
}
