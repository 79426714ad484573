package status

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/skein-ml/skein/telemetry"
)

func TestStoreReopenKeepsHistory(t *testing.T) {
	cfg := testConfig()
	s, path := openStore(t, cfg)
	feedRun(t, s, 3, 1, 12)
	for i := range 3 {
		if err := s.RecordEvent(Event{At: t0.Add(time.Duration(i) * time.Second), Peer: peerID(i), Kind: Join, Role: "trainer", Device: "cpu"}); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(125 * time.Second)
	info := RunInfo{RunID: "r", ParamCount: 1000, InnerSteps: 10}
	before, err := s.Snapshot(info, liveMembers(0, 1, 2), now)
	if err != nil {
		t.Fatal(err)
	}
	histBefore, err := s.History(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close: %v, want ErrClosed", err)
	}

	s2, err := Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	after, err := s2.Snapshot(info, liveMembers(0, 1, 2), now)
	if err != nil {
		t.Fatal(err)
	}
	histAfter, err := s2.History(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Errorf("snapshot changed across reopen:\nbefore %+v\nafter  %+v", before, after)
	}
	if !reflect.DeepEqual(histBefore, histAfter) {
		t.Errorf("history changed across reopen")
	}
	if len(histAfter) != 12 || after.Round != 12 || after.Reports != 36 || len(after.Events) != 3 {
		t.Errorf("after reopen: %d rounds, round %d, %d reports, %d events; want 12, 12, 36, 3",
			len(histAfter), after.Round, after.Reports, len(after.Events))
	}
	// And it keeps recording where it stopped.
	feedRun(t, s2, 3, 13, 13)
	if h, _ := s2.History(13, 10); len(h) != 1 || h[0].Reporters != 3 {
		t.Errorf("round 13 after reopen: %+v", h)
	}
}

// bucketKeys counts the keys of a bucket path in the file.
func bucketKeys(t *testing.T, s *Store, path ...string) int {
	t.Helper()
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(path[0]))
		for _, p := range path[1:] {
			if b = b.Bucket([]byte(p)); b == nil {
				return nil
			}
		}
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			n++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStoreBounds(t *testing.T) {
	cfg := testConfig()
	cfg.MaxReportsPerPeer, cfg.MaxPeers, cfg.MaxRounds, cfg.MaxEvents = 8, 6, 40, 30
	s, path := openStore(t, cfg)

	fill := func(scale int) {
		// Rounds: 3 steady peers over scale x MaxRounds rounds (each also
		// exceeds MaxReportsPerPeer), then scale x MaxPeers one-off peers,
		// then scale x MaxEvents events.
		base := uint64(s.totals.Reports) // distinct rounds per call
		feedRun(t, s, 3, base+1, base+uint64(scale*cfg.MaxRounds))
		last := base + uint64(scale*cfg.MaxRounds)
		for i := range scale * cfg.MaxPeers {
			id := peerID(1000 + int(base) + i)
			if err := s.Record(id, fakeReport(last, 2, 2, 3), t0.Add(time.Duration(last)*10*time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := s.RecordEvent(Event{At: t0, Peer: id, Kind: Join}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range scale * cfg.MaxEvents {
			if err := s.RecordEvent(Event{At: t0, Peer: peerID(i), Kind: Leave}); err != nil {
				t.Fatal(err)
			}
		}
	}
	check := func(when string) {
		t.Helper()
		if n := len(s.peers); n > cfg.MaxPeers {
			t.Errorf("%s: %d peers in memory, cap %d", when, n, cfg.MaxPeers)
		}
		if n := bucketKeys(t, s, "peers"); n > cfg.MaxPeers {
			t.Errorf("%s: %d peers on disk, cap %d", when, n, cfg.MaxPeers)
		}
		if n := bucketKeys(t, s, "reports"); n > cfg.MaxPeers {
			t.Errorf("%s: %d report buckets on disk, cap %d", when, n, cfg.MaxPeers)
		}
		for id, rec := range s.peers {
			if n := bucketKeys(t, s, "reports", id); n > cfg.MaxReportsPerPeer || n != rec.Kept {
				t.Errorf("%s: peer %s keeps %d reports (record says %d), cap %d", when, ShortID(id), n, rec.Kept, cfg.MaxReportsPerPeer)
			}
		}
		if n := len(s.rounds); n > cfg.MaxRounds {
			t.Errorf("%s: %d rounds in memory, cap %d", when, n, cfg.MaxRounds)
		}
		if n := bucketKeys(t, s, "rounds"); n != len(s.rounds) {
			t.Errorf("%s: %d rounds on disk, %d in memory", when, n, len(s.rounds))
		}
		if n := bucketKeys(t, s, "events"); n > cfg.MaxEvents || n != s.nEvents {
			t.Errorf("%s: %d events on disk (counted %d), cap %d", when, n, s.nEvents, cfg.MaxEvents)
		}
		if len(s.events) > eventsInMem {
			t.Errorf("%s: %d events in memory", when, len(s.events))
		}
	}

	fill(1)
	check("1x")
	st, _ := os.Stat(path)
	size1 := st.Size()
	fill(10)
	check("11x")
	st, _ = os.Stat(path)
	size11 := st.Size()
	t.Logf("file %d bytes at the caps, %d bytes after 10x more", size1, size11)
	if size11 > 2*size1+256<<10 {
		t.Errorf("file grew from %d to %d bytes while at its caps", size1, size11)
	}
	snap, err := s.Snapshot(RunInfo{}, nil, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Curve) > cfg.MaxRounds || snap.Reports != s.totals.Reports {
		t.Errorf("curve %d points, reports %d", len(snap.Curve), snap.Reports)
	}

	// Lower caps on reopen evict the excess at once.
	s.Close()
	cfg.MaxPeers, cfg.MaxRounds, cfg.MaxEvents, cfg.MaxReportsPerPeer = 2, 5, 3, 2
	s2, err := Open(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	s = s2
	check("reopened with lower caps")
}

func TestStoreRefuses(t *testing.T) {
	cfg := testConfig()
	cfg.MaxReportsPerPeer, cfg.MaxRounds, cfg.MaxRoundLead = 4, 10, 100
	s, _ := openStore(t, cfg)
	at := t0
	for _, bad := range []string{"", strings.Repeat("a", 129), "peer id", "peer\nid", "peér", "\x00"} {
		if err := s.Record(bad, fakeReport(1, 2, 2, 2), at); !errors.Is(err, ErrBadPeer) {
			t.Errorf("peer %q: %v, want ErrBadPeer", bad, err)
		}
		if err := s.RecordEvent(Event{Peer: bad, Kind: Join}); !errors.Is(err, ErrBadPeer) {
			t.Errorf("event peer %q: %v, want ErrBadPeer", bad, err)
		}
	}
	if err := s.Record(strings.Repeat("a", 128), fakeReport(1, 2, 2, 2), at); err != nil {
		t.Errorf("128-byte peer id: %v", err)
	}
	if err := s.RecordEvent(Event{Peer: peerID(1), Kind: "explode"}); !errors.Is(err, ErrBadEvent) {
		t.Errorf("bad kind: %v, want ErrBadEvent", err)
	}

	feedRun(t, s, 2, 1, 20) // rounds 11..20 kept; each peer keeps 17..20
	at = t0.Add(200 * time.Second)
	if err := s.Record(peerID(0), fakeReport(16, 2, 2, 2), at); !errors.Is(err, ErrStale) {
		t.Errorf("report below the peer's kept reports: %v, want ErrStale", err)
	}
	if err := s.Record(peerID(5), fakeReport(3, 2, 2, 2), at); !errors.Is(err, ErrStale) {
		t.Errorf("report below the kept rounds: %v, want ErrStale", err)
	}
	if err := s.Record(peerID(5), fakeReport(20+101, 2, 2, 2), at); !errors.Is(err, ErrRoundAhead) {
		t.Errorf("report 101 rounds ahead: %v, want ErrRoundAhead", err)
	}
	if err := s.Record(peerID(5), fakeReport(20+100, 2, 2, 2), at); err != nil {
		t.Errorf("report 100 rounds ahead: %v", err)
	}
	if got := s.Refused(); got != 6+3 {
		t.Errorf("Refused() = %d, want 9", got)
	}
	// A replacement of a kept (peer, round) is fine.
	if err := s.Record(peerID(0), fakeReport(18, 2, 2, 2), at); err != nil {
		t.Errorf("replacing a kept report: %v", err)
	}
	// Once the run has been quiet for longer than Fresh (a bootstrap
	// restarted late), its last certified round bounds nothing.
	if err := s.Record(peerID(6), fakeReport(20+101, 2, 2, 2), at.Add(cfg.Fresh+time.Second)); err != nil {
		t.Errorf("report 101 rounds ahead of a quiet run: %v", err)
	}
}

func TestStoreReplacesSameRound(t *testing.T) {
	s, _ := openStore(t, testConfig())
	a := fakeReport(7, 3, 2, 2)
	a.Tokens, a.BytesSent = 100, 1000
	b := a
	b.Tokens, b.BytesSent, b.TrainLoss, b.StateHash = 300, 5000, 1, 42
	for _, r := range []telemetry.Report{a, b} {
		if err := s.Record(peerID(1), r, t0); err != nil {
			t.Fatal(err)
		}
	}
	h, err := s.History(0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 1 || h[0].Reporters != 1 || h[0].Tokens != 300 || h[0].BytesSent != 5000 || *h[0].TrainLoss != 1 || h[0].HashVotes != 1 || h[0].MajorityHash != "000000000000002a" {
		t.Errorf("after a replaced report: %+v", h)
	}
	if s.totals.Tokens != 300 || s.totals.BytesSent != 5000 || s.totals.Reports != 2 || s.peers[peerID(1)].Tokens != 300 {
		t.Errorf("totals %+v, peer tokens %d", s.totals, s.peers[peerID(1)].Tokens)
	}
}

func TestStoreSanitizes(t *testing.T) {
	s, _ := openStore(t, testConfig())
	inf := math.Inf(1)
	rep := telemetry.Report{
		Round: 1, TrainLoss: float32(math.NaN()), ValLoss: float32(inf), Tokens: math.MaxUint64,
		TokensPerSec: math.NaN(), BytesSent: math.MaxUint64, BytesRecv: math.MaxUint64,
		ComputeSeconds: inf, WallSeconds: -1, Members: -5,
		Device: "gpu\x1b[31m \u202eevil\u0000 \n  name" + strings.Repeat("x", 200), Version: "\xff\xfe",
	}
	for i := range 3 {
		if err := s.Record(peerID(i), rep, t0); err != nil {
			t.Fatal(err)
		}
	}
	neg := fakeReport(1, -3, 1e9, 3)
	neg.TokensPerSec = inf
	if err := s.Record(peerID(3), neg, t0); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(RunInfo{ParamCount: math.MaxInt, InnerSteps: math.MaxInt}, nil, t0)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(snap)
	if err != nil {
		t.Fatalf("snapshot of hostile reports does not encode: %v", err)
	}
	if snap.ValLoss != nil || snap.TrainLoss != nil {
		t.Errorf("losses from NaN/Inf/negative/huge reports: train %v val %v", snap.TrainLoss, snap.ValLoss)
	}
	// Peer 3's state differs from the majority's (hash 0): its tokens do not count.
	if snap.TokensTrained != 3*maxTokens || snap.TokensPerSec != 3*0+maxRate {
		t.Errorf("tokens %d, tokens/s %v", snap.TokensTrained, snap.TokensPerSec)
	}
	for _, m := range snap.Members {
		if strings.ContainsAny(m.Device, "\x1b\u202e\x00\n") || len(m.Device) > telemetry.MaxString {
			t.Errorf("device not cleaned: %q", m.Device)
		}
		if m.Peer != "fake0003" && m.Device != "gpu[31m evil name"+strings.Repeat("x", 64-len("gpu[31m evil name")) {
			t.Errorf("device = %q", m.Device)
		}
	}
	if strings.Contains(string(data), "NaN") || strings.Contains(string(data), "Inf") {
		t.Errorf("JSON carries a non-finite number: %s", data)
	}
}

func TestCleanString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"  cpu   (8 threads) ", "cpu (8 threads)"},
		{"a\tb\nc", "a b c"},
		{"\u202eabc\u2066", "abc"},
		{"héllo", "héllo"},
		{"\xffok", "ok"},
		{"ééééé", "éé"}, // 5 bytes max: no half rune
	} {
		max := 64
		if c.want == "éé" {
			max = 5
		}
		if got := cleanString(c.in, max); got != c.want {
			t.Errorf("cleanString(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if ShortID("12D3KooWAbCdEfGhIjKl") != "AbCdEfGh" || ShortID("QmXyZ12345678") != "XyZ12345" || ShortID("short") != "short" {
		t.Errorf("ShortID")
	}
}

func TestStoreConfigValidate(t *testing.T) {
	if err := DefaultStoreConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	bad := DefaultStoreConfig()
	bad.MaxRounds = 0
	if err := bad.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "max rounds 0") {
		t.Errorf("Validate = %v", err)
	}
	if _, err := Open(t.TempDir()+"/x.db", bad); !errors.Is(err, ErrConfig) {
		t.Errorf("Open with a bad config: %v", err)
	}
}

// TestStoreHostileReporter is the reviewer's attack on the page: 1 volunteer
// of 5 reports a loss of 200002, 1e13 tokens and round 1010 in a run at
// round 10. Every round it sends, before the honest four: a report of the
// round with 1e13 tokens (refused: more than the manifest allows), the same
// with the allowed tokens (kept, so the medians must absorb its losses) and
// one of round 1010 (refused: past the certified round); after them, one of
// round r+2 with a made-up state (kept, never certified). The page's curve,
// losses and tokens must stay within what the honest members report.
func TestStoreHostileReporter(t *testing.T) {
	const (
		rounds   = 10
		maxToks  = 8 * 64 * 10 // batch x seq_len x inner steps
		evil     = 200002
		evilHash = 0xbad
	)
	honest := func(r uint64, i int) (train, val float32) {
		return 4.5/float32(1+0.1*float64(r)) + 0.01*float32(i), 4/float32(1+0.1*float64(r)) + 0.01*float32(i)
	}
	for _, c := range []struct {
		name       string
		hash       func(r uint64) uint64 // the honest members' state after round r
		hostileOwn bool                  // the hostile reports a state of its own
	}{
		{"diloco, hostile in the honest state", func(r uint64) uint64 { return 1000 + r }, false},
		{"diloco, hostile in its own state", func(r uint64) uint64 { return 1000 + r }, true},
		{"noloco, no state hashes", func(uint64) uint64 { return 0 }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxRoundTokens = maxToks
			s, _ := openStore(t, cfg)
			rep := func(r uint64, hash uint64, train, val float32, tokens uint64) telemetry.Report {
				return telemetry.Report{Round: r, StateHash: hash, TrainLoss: train, ValLoss: val, Tokens: tokens,
					TokensPerSec: 100, BytesSent: 1000, WallSeconds: 10, Members: 5}
			}
			lie := func(rep telemetry.Report) telemetry.Report { rep.BytesSent = math.MaxUint64; return rep }
			hostile := peerID(4)
			var at time.Time
			for r := uint64(1); r <= rounds; r++ {
				at = t0.Add(time.Duration(r) * 10 * time.Second)
				h := c.hash(r)
				if c.hostileOwn {
					h = evilHash + r
				}
				if err := s.Record(hostile, rep(r, h, evil, evil, 1e13), at); !errors.Is(err, ErrTooManyTokens) {
					t.Fatalf("round %d, 1e13 tokens: %v, want ErrTooManyTokens", r, err)
				}
				if err := s.Record(hostile, lie(rep(r, h, evil, evil, maxToks)), at); err != nil {
					t.Fatalf("round %d, the allowed tokens: %v", r, err)
				}
				if err := s.Record(hostile, rep(1010, h, evil, evil, maxToks), at); !errors.Is(err, ErrRoundAhead) {
					t.Fatalf("round 1010 at round %d: %v, want ErrRoundAhead", r, err)
				}
				for i := range 4 {
					train, val := honest(r, i)
					if err := s.Record(peerID(i), rep(r, c.hash(r), train, val, maxToks), at.Add(time.Millisecond)); err != nil {
						t.Fatal(err)
					}
				}
				if err := s.Record(hostile, lie(rep(r+2, evilHash, evil, evil, maxToks)), at.Add(2*time.Millisecond)); err != nil {
					t.Fatalf("round %d at round %d (within the lead): %v", r+2, r, err)
				}
			}

			now := at.Add(5 * time.Second)
			srv := NewServer(s, RunInfo{RunID: "hostile", InnerSteps: 10, ParamCount: 1000}, liveMembers(0, 1, 2, 3, 4), WithClock(func() time.Time { return now }))
			t.Cleanup(srv.Close)
			var snap Snapshot
			if err := json.NewDecoder(get(t, srv, "GET", "/api/status").Body).Decode(&snap); err != nil {
				t.Fatal(err)
			}
			// Each loss within the honest members' values of its round.
			inRange := func(what string, r uint64, v *float64, val bool) {
				t.Helper()
				lo, vlo := honest(r, 0)
				hi, vhi := honest(r, 3)
				if val {
					lo, hi = vlo, vhi
				}
				if v == nil || *v < float64(lo)-1e-4 || *v > float64(hi)+1e-4 {
					t.Errorf("round %d %s = %s, outside the honest range [%v, %v]", r, what, ptrString(v), lo, hi)
				}
			}
			if snap.Round != rounds || len(snap.Curve) != rounds {
				t.Errorf("round %d, %d curve points; want %d, %d", snap.Round, len(snap.Curve), rounds, rounds)
			}
			for _, p := range snap.Curve {
				if p.Round > rounds+1 {
					t.Errorf("curve point at round %d of a run at round %d", p.Round, rounds)
				}
				inRange("train", p.Round, p.Train, false)
				inRange("val", p.Round, p.Val, true)
				if p.BitsPerParam == nil || *p.BitsPerParam != 8 {
					t.Errorf("round %d bits/param %s, want the honest 8", p.Round, ptrString(p.BitsPerParam))
				}
			}
			inRange("train loss", rounds, snap.TrainLoss, false)
			inRange("val loss", rounds, snap.ValLoss, true)
			if snap.BitsPerParam == nil || *snap.BitsPerParam != 8 {
				t.Errorf("bits/param %s, want the honest 8 (8 x 1000 bytes / 1000 parameters)", ptrString(snap.BitsPerParam))
			}
			// At most what five honest members train (the hostile one may have).
			if snap.TokensTrained < 4*maxToks*rounds || snap.TokensTrained > 5*maxToks*rounds {
				t.Errorf("tokens trained %d, want within [%d, %d]", snap.TokensTrained, 4*maxToks*rounds, 5*maxToks*rounds)
			}
			hist, err := s.History(0, 100)
			if err != nil {
				t.Fatal(err)
			}
			if last := hist[len(hist)-1]; last.Round > rounds+2 || last.Certified {
				t.Errorf("last round kept %+v, want the hostile's uncertified %d at most", last, rounds+2)
			}
			if got := s.Refused(); got != 2*rounds {
				t.Errorf("Refused() = %d, want %d", got, 2*rounds)
			}
		})
	}
}

func ptrString(v *float64) string {
	if v == nil {
		return "absent"
	}
	return fmt.Sprint(*v)
}

// A round's curve point and tokens count the reporters in its certified
// state: the certificate's hash when StoreConfig.Certified knows one, else
// a strict majority of its reporters (and of the current ones).
func TestStoreCertifies(t *testing.T) {
	const H, G = 0x1111, 0x2222
	for _, c := range []struct {
		name   string
		hashes []uint64 // reporter i's state hash; its val loss is 1+i, its tokens 100
		cert   func(uint64) (uint64, bool)
		want   []float64 // the agreeing reporters' val losses; nil: not certified
	}{
		{"all agree", []uint64{H, H, H}, nil, []float64{1, 2, 3}},
		{"one differs", []uint64{H, G, H}, nil, []float64{1, 3}},
		{"split", []uint64{H, G}, nil, nil},
		{"noloco: no hashes", []uint64{0, 0, 0, G}, nil, []float64{1, 2, 3}},
		{"certificate", []uint64{H, G, H}, func(uint64) (uint64, bool) { return G, true }, []float64{2}},
		{"no certificate yet: the majority", []uint64{H, G, H}, func(uint64) (uint64, bool) { return 0, false }, []float64{1, 3}},
		{"no certificate yet, split", []uint64{H, G}, func(uint64) (uint64, bool) { return 0, false }, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.Certified = c.cert
			s, _ := openStore(t, cfg)
			for i, h := range c.hashes {
				rep := telemetry.Report{Round: 3, StateHash: h, TrainLoss: float32(math.NaN()), ValLoss: float32(1 + i), Tokens: 100}
				if err := s.Record(peerID(i), rep, t0); err != nil {
					t.Fatal(err)
				}
			}
			hist, err := s.History(0, 10)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := s.Snapshot(RunInfo{}, nil, t0)
			if err != nil {
				t.Fatal(err)
			}
			r := hist[0]
			if c.want == nil {
				if r.Certified || r.ValLoss != nil || r.Tokens != 0 || snap.TokensTrained != 0 || len(snap.Curve) != 0 {
					t.Errorf("uncertified round: %+v, tokens trained %d, curve %+v", r, snap.TokensTrained, snap.Curve)
				}
				return
			}
			want := median(slices.Clone(c.want))
			if !r.Certified || r.ValLoss == nil || *r.ValLoss != want || r.Tokens != uint64(100*len(c.want)) {
				t.Errorf("round %+v (val %s), want certified, val %v, %d tokens", r, ptrString(r.ValLoss), want, 100*len(c.want))
			}
			if snap.TokensTrained != r.Tokens || len(snap.Curve) != 1 || *snap.Curve[0].Val != want {
				t.Errorf("tokens trained %d, curve %+v", snap.TokensTrained, snap.Curve)
			}
		})
	}
}

// One reporter alone in a round certifies nothing in a run of five; past
// maxSamples reporters, a round's tokens still count every agreeing one.
func TestStoreCertifyQuorumAndSamples(t *testing.T) {
	s, _ := openStore(t, testConfig())
	feedRun(t, s, 5, 1, 1)
	at := t0.Add(20 * time.Second)
	if err := s.Record(peerID(0), fakeReport(2, 2, 2, 5), at); err != nil {
		t.Fatal(err)
	}
	const n = maxSamples + 8
	for i := range n {
		if err := s.Record(peerID(100+i), fakeReport(3, 2, 2, n), at); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := s.History(2, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 2 || hist[0].Certified || !hist[1].Certified || hist[1].Tokens != n*4096 {
		t.Errorf("rounds 2 and 3: %+v", hist)
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{2, 2.1, 1.9, 200002}, 2.05},
		{[]float64{2, 2.1, 1.9, 200002, 0}, 2},
	} {
		if got := median(slices.Clone(c.in)); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Errorf("median of nothing is not NaN")
	}
}

// A volunteer that goes on alone after the others left certifies its
// rounds: a member that left (or failed) after its last report no longer
// counts among the current reporters (TestBootstrapAndVolunteersTrainTogether
// restarts one volunteer alone after the run).
func TestStoreDepartedDoNotCount(t *testing.T) {
	s, _ := openStore(t, testConfig())
	feedRun(t, s, 3, 1, 2)
	at := t0.Add(30 * time.Second)
	for i := 1; i < 3; i++ {
		if err := s.RecordEvent(Event{At: at, Peer: peerID(i), Kind: Leave, Role: "volunteer"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Record(peerID(0), fakeReport(3, 2, 2, 1), at.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	hist, err := s.History(3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 1 || !hist[0].Certified {
		t.Fatalf("the lone survivor's round 3 is not certified: %+v", hist)
	}
}

// Members that all move ahead together (a staged run skipping iterations
// after a re-plan) are followed: the first report past the lead is refused,
// the others' move the reference; a lone reporter far ahead still is not.
func TestStoreFollowsMembersThatJumpTogether(t *testing.T) {
	s, _ := openStore(t, testConfig())
	feedRun(t, s, 3, 1, 3)
	at := t0.Add(40 * time.Second)
	if err := s.Record(peerID(0), fakeReport(12, 2, 2, 3), at); !errors.Is(err, ErrRoundAhead) {
		t.Fatalf("a lone jump of 9 rounds: %v", err)
	}
	for i := 1; i < 3; i++ {
		if err := s.Record(peerID(i), fakeReport(12, 2, 2, 3), at.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatalf("member %d jumping with the others: %v", i, err)
		}
	}
	if err := s.Record(peerID(0), fakeReport(12, 2, 2, 3), at.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	hist, err := s.History(12, 1)
	if err != nil || len(hist) != 1 || !hist[0].Certified {
		t.Fatalf("round 12 not certified: %+v, %v", hist, err)
	}
	if err := s.Record(peerID(1), fakeReport(1012, 2, 2, 3), at.Add(4*time.Second)); !errors.Is(err, ErrRoundAhead) {
		t.Fatalf("a lone jump past the others: %v", err)
	}
}

// A round's bits per parameter is the median over its contributors (not
// the adopted reports; whatever their state) of 8 x bytes sent / params:
// one liar among three or more cannot move it out of the honest range. The
// snapshot shows the latest certified round's, the history and the curve
// every round's, /metrics the snapshot's.
func TestStoreBitsPerParam(t *testing.T) {
	const H, G = 0x1111, 0x2222
	type reporter struct {
		peer    int
		sent    uint64
		hash    uint64
		adopted bool
	}
	honest := func(sent ...uint64) []reporter {
		var out []reporter
		for i, b := range sent {
			out = append(out, reporter{peer: i, sent: b, hash: H})
		}
		return out
	}
	for _, c := range []struct {
		name      string
		params    int
		reports   []reporter // in order; a peer's second report replaces its first
		want      float64    // bits per parameter of the round; -1: absent
		certified bool       // the snapshot and the curve show it
	}{
		{"three agree", 1000, honest(100, 200, 300), 1.6, true},
		{"one liar among five, high", 1000, honest(100, 100, 125, 125, math.MaxUint64), 1, true},
		{"one liar among five, low", 1000, honest(0, 100, 100, 125, 125), 0.8, true},
		{"even: the mean of the middle two", 1000, honest(100, 200, 300, 1<<40), 2, true},
		{"adopted reports do not count", 1000, []reporter{{0, 100, H, false}, {1, 1 << 40, H, true}, {2, 300, H, false},
			{3, 1 << 40, H, true}, {4, 200, H, false}}, 1.6, true},
		{"only adopted reports", 1000, []reporter{{0, 100, H, true}, {1, 200, H, true}}, -1, true},
		{"another state's contributor counts", 1000, []reporter{{0, 100, H, false}, {1, 200, G, false}, {2, 300, H, false}}, 1.6, true},
		{"a replaced report counts once", 1000, []reporter{{0, 1 << 40, H, false}, {1, 200, H, false}, {2, 300, H, false},
			{0, 100, H, false}}, 1.6, true},
		{"uncertified: history only", 1000, []reporter{{0, 100, H, false}, {1, 300, G, false}}, 1.6, false},
		{"no parameter count", 0, honest(100, 200, 300), -1, true},
		{"few parameters, many bytes", 10, honest(1<<20, 1<<20, 1<<20), 838860.8, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := openStore(t, testConfig())
			for _, r := range c.reports {
				rep := telemetry.Report{Round: 3, StateHash: r.hash, Adopted: r.adopted, TrainLoss: 2, ValLoss: float32(math.NaN()),
					Tokens: 100, BytesSent: r.sent, WallSeconds: 10, Members: len(c.reports)}
				if err := s.Record(peerID(r.peer), rep, t0); err != nil {
					t.Fatal(err)
				}
			}
			srv := NewServer(s, RunInfo{RunID: "bits", ParamCount: c.params}, nil, WithClock(func() time.Time { return t0.Add(time.Second) }))
			t.Cleanup(srv.Close)
			var snap Snapshot
			if err := json.NewDecoder(get(t, srv, "GET", "/api/status").Body).Decode(&snap); err != nil {
				t.Fatal(err)
			}
			var page historyPage
			if err := json.NewDecoder(get(t, srv, "GET", "/api/history").Body).Decode(&page); err != nil {
				t.Fatal(err)
			}
			metrics, _ := io.ReadAll(get(t, srv, "GET", "/metrics").Body)
			is := func(what string, got *float64, want float64) {
				t.Helper()
				if want < 0 && got != nil || want >= 0 && (got == nil || math.Abs(*got-want) > 1e-9) {
					t.Errorf("%s = %s, want %v (-1: absent)", what, ptrString(got), want)
				}
			}
			if len(page.Rounds) != 1 {
				t.Fatalf("history %+v, want round 3", page.Rounds)
			}
			is("history", page.Rounds[0].BitsPerParam, c.want)
			shown := c.want
			if !c.certified {
				shown = -1
			}
			is("snapshot", snap.BitsPerParam, shown)
			if len(snap.Curve) != 1 && c.certified || len(snap.Curve) != 0 && !c.certified {
				t.Fatalf("curve %+v", snap.Curve)
			}
			if c.certified {
				is("curve", snap.Curve[0].BitsPerParam, c.want)
			}
			if got := strings.Contains(string(metrics), "skein_run_bits_per_param "); got != (shown >= 0) {
				t.Errorf("/metrics has skein_run_bits_per_param: %v, want %v", got, shown >= 0)
			} else if got && !strings.Contains(string(metrics), fmt.Sprintf("skein_run_bits_per_param %v\n", shown)) {
				t.Errorf("/metrics lacks skein_run_bits_per_param %v", shown)
			}
			if hist, err := s.History(0, 1); err != nil || len(hist) != 1 || hist[0].BitsPerParam != nil {
				t.Errorf("Store.History, which does not know the parameter count: %+v (%v)", hist, err)
			}
		})
	}
}

// A report that replaces one stored before bytes sent were kept in the
// round's samples takes the old sample out.
func TestRoundRecordReplacesOldSample(t *testing.T) {
	old := report{Round: 3, StateHash: 0x1111, Train: 2, HasTrain: true, Tokens: 100, BytesSent: 500}
	rr := roundRecord{Round: 3, Reporters: 1, Contributors: 1, TrainN: 1, BytesSent: 500,
		Hashes: []hashVote{{0x1111, 1}}, Samples: []sample{{Hash: 0x1111, Train: 2, Val: -1, Tokens: 100}}} // no Contrib, no Sent
	if p := rr.point(); !math.IsNaN(float64(p.Sent)) {
		t.Errorf("an old sample counts %v bytes sent", p.Sent)
	}
	rr.apply(&old, -1)
	now := old
	now.BytesSent = 700
	rr.apply(&now, +1)
	if len(rr.Samples) != 1 || !rr.Samples[0].Contrib || rr.Samples[0].Sent != 700 || rr.point().Sent != 700 {
		t.Errorf("samples after the replacement: %+v", rr.Samples)
	}
}
