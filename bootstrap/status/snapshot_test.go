package status

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/skein-ml/skein/telemetry"
)

func TestMajorityRound(t *testing.T) {
	for _, c := range []struct {
		in   []uint64
		want uint64
	}{
		{[]uint64{5}, 5},
		{[]uint64{10, 9}, 9}, // both have reached 9, only one 10
		{[]uint64{9, 10, 10}, 10},
		{[]uint64{1 << 60, 10, 10, 9}, 10}, // one far ahead moves nothing
		{[]uint64{1 << 60, 1 << 60, 3}, 1 << 60},
	} {
		if got := majorityRound(append([]uint64(nil), c.in...)); got != c.want {
			t.Errorf("majorityRound(%v) = %d, want %d", c.in, got, c.want)
		}
	}
}

// TestSnapshotMath checks a small run computed by hand.
//
// ParamCount 1000, InnerSteps 10. Round 1: A, B, C train in a group of 3,
// each sends 1000 bytes: fp32 DP would send 10 x 2(3-1)/3 x 4 x 1000 =
// 53333.33 bytes each. Round 2: A, B, C again (group 3, hashes H, H, G),
// and D adopts the state (hash H, group 4, 500 bytes, counts for nothing in
// DP). E is live at round 3 by gossip only. F reports round 4 (within the
// lead of 2 past the certified round 2) but is alone there, so round 4 is
// not certified; its report of round 500 is refused. Losses and tokens count
// the members in each round's certified state (C differs in round 2).
func TestSnapshotMath(t *testing.T) {
	s, _ := openStore(t, testConfig())
	const H, G = 0x1111, 0x2222
	A, B, C, D, E, F := peerID(1), peerID(2), peerID(3), peerID(4), peerID(5), peerID(6)
	rep := func(round uint64, train, val float32, hash uint64, tps float64) telemetry.Report {
		return telemetry.Report{Round: round, StateHash: hash, TrainLoss: train, ValLoss: val,
			Tokens: 100, TokensPerSec: tps, BytesSent: 1000, BytesRecv: 900, WallSeconds: 10, Members: 3}
	}
	nan := float32(math.NaN())
	at := t0
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Record(A, rep(1, 3, 2.5, H, 10), at))
	must(s.Record(B, rep(1, 4, nan, H, 10), at))
	must(s.Record(C, rep(1, 5, nan, H, 10), at))
	at = at.Add(time.Minute)
	must(s.Record(A, rep(2, 2, nan, H, 100), at))
	must(s.Record(B, rep(2, 3, 2.0, H, 200), at))
	must(s.Record(C, rep(2, 4, 3.0, G, 300), at))
	d := rep(2, 9, nan, H, 0)
	d.Adopted, d.Members, d.BytesSent, d.Tokens = true, 4, 500, 0
	must(s.Record(D, d, at))
	f := rep(500, 1, 1, 0x9999, 50)
	f.Members = 1 // alone: no DP traffic either
	if err := s.Record(F, f, at); !errors.Is(err, ErrRoundAhead) {
		t.Fatalf("round 500 with the run at 2: %v, want ErrRoundAhead", err)
	}
	f.Round = 4
	must(s.Record(F, f, at))

	info := RunInfo{RunID: "hand", ManifestHash: "0123456789abcdef0123", Preset: "tiny", ParamCount: 1000,
		InnerSteps: 10, Optimizer: "diloco", BootstrapAddrs: []string{"/dns4/boot.example/udp/4001/quic-v1"}, Started: t0}
	live := func() []Member {
		return []Member{
			{Peer: A, Role: "trainer", Device: "cpu", Round: 2, StateHash: H},
			{Peer: B, Role: "trainer", Round: 2, StateHash: H},
			{Peer: C, Role: "trainer", Round: 2, StateHash: G},
			{Peer: D, Role: "trainer", Round: 2, StateHash: H},
			{Peer: E, Role: "trainer", Round: 3, StateHash: H},
			{Peer: F, Role: "trainer", Round: 500, StateHash: 0x9999},
			{Peer: "bad peer", Role: "x"},
		}
	}
	now := at.Add(30 * time.Second)
	snap, err := s.Snapshot(info, live, now)
	if err != nil {
		t.Fatal(err)
	}

	if snap.Round != 2 {
		t.Errorf("round %d, want 2 (the majority; F alone at 500)", snap.Round)
	}
	if snap.Manifest != "0123456789ab" || snap.RunID != "hand" || snap.Params != 1000 || len(snap.Bootstrap) != 1 {
		t.Errorf("run info: %+v", snap)
	}
	// 6 reports count (A, B, C in rounds 1 and 2), each 10 x 2(3-1)/3 x 4 x 1000 bytes.
	wantDP := 6 * 10 * 2 * 2.0 / 3 * 4 * 1000 // 320000
	if math.Abs(float64(snap.FP32DPBytes)-wantDP) > 1 {
		t.Errorf("fp32 DP bytes %d, want %.0f", snap.FP32DPBytes, wantDP)
	}
	if snap.BytesSent != 7*1000+500 || snap.BytesRecv != 8*900 {
		t.Errorf("bytes sent %d recv %d", snap.BytesSent, snap.BytesRecv)
	}
	if want := wantDP / 7500; math.Abs(snap.TrafficSaved-want) > 0.005 {
		t.Errorf("traffic saved %v, want %v", snap.TrafficSaved, want)
	}
	if snap.TokensTrained != 5*100 {
		t.Errorf("tokens %d, want 500 (A, B, C in round 1; A, B, D in round 2)", snap.TokensTrained)
	}
	if snap.TokensPerSec != 100+200+300+0+50 {
		t.Errorf("tokens/s %v, want 650 (latest reports of live members)", snap.TokensPerSec)
	}
	if snap.BytesPerSec != 4*1000/10+500/10 { // A, B, C, F: 1000 B in 10 s; D: 500 B
		t.Errorf("bytes/s %v, want 450", snap.BytesPerSec)
	}
	if snap.ValLoss == nil || *snap.ValLoss != 2 || snap.ValLossRound != 2 {
		t.Errorf("val loss %v round %d, want 2 (B's; C differs) at round 2", snap.ValLoss, snap.ValLossRound)
	}
	if snap.TrainLoss == nil || *snap.TrainLoss != 2.5 {
		t.Errorf("train loss %v, want 2.5 (median of A and B; C differs, D adopted)", snap.TrainLoss)
	}
	if snap.MembersOnline != 6 {
		t.Errorf("members online %d, want 6 (the invalid one dropped)", snap.MembersOnline)
	}

	want := map[string]struct {
		round uint64
		agree string
	}{
		ShortID(A): {2, Agree}, ShortID(B): {2, Agree}, ShortID(C): {2, Differs}, ShortID(D): {2, Agree},
		ShortID(E): {3, Unknown}, // one vote only
		ShortID(F): {500, Unknown},
	}
	if len(snap.Members) != len(want) {
		t.Fatalf("%d member rows, want %d: %+v", len(snap.Members), len(want), snap.Members)
	}
	for i, m := range snap.Members {
		w, ok := want[m.Peer]
		if !ok || m.Round != w.round || m.Agreement != w.agree || !m.Online {
			t.Errorf("row %s: round %d %s online %v, want round %d %s", m.Peer, m.Round, m.Agreement, m.Online, w.round, w.agree)
		}
		if i > 0 && snap.Members[i-1].Peer > m.Peer {
			t.Errorf("rows not sorted: %s before %s", snap.Members[i-1].Peer, m.Peer)
		}
	}
	if m := snap.Members[0]; m.StateHash != "0000000000001111" || m.Device != "cpu" || m.BytesSent != 2000 || m.LastSeen != at.UTC() {
		t.Errorf("row A: %+v", m)
	}
	if len(snap.Curve) != 2 || snap.Curve[1].Round != 2 || *snap.Curve[1].Train != 2.5 || *snap.Curve[0].Train != 4 || *snap.Curve[0].Val != 2.5 {
		t.Errorf("curve %+v", snap.Curve)
	}

	// C, D, E and F leave: those with reports stay in the table, offline, while the reports are current.
	snap, err = s.Snapshot(info, func() []Member { return live()[:2] }, now)
	if err != nil {
		t.Fatal(err)
	}
	if snap.MembersOnline != 2 || len(snap.Members) != 5 || snap.Members[2].Online || snap.Members[2].TokensPerSec != 0 {
		t.Errorf("after C, D, E, F left: online %d, rows %+v", snap.MembersOnline, snap.Members)
	}
	if snap.TokensPerSec != 300 {
		t.Errorf("tokens/s %v, want 300 (A and B)", snap.TokensPerSec)
	}

	// An hour later nobody is current: no throughput, the round stays.
	snap, err = s.Snapshot(info, nil, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if snap.TokensPerSec != 0 || snap.BytesPerSec != 0 || snap.MembersOnline != 0 || len(snap.Members) != 0 || snap.Round != 2 {
		t.Errorf("an hour later: %v tok/s, %v B/s, %d online, %d rows, round %d", snap.TokensPerSec, snap.BytesPerSec, snap.MembersOnline, len(snap.Members), snap.Round)
	}
}

// TestSnapshotGossipVotes: a round nobody has reported yet is judged by the
// live members' gossiped hashes.
func TestSnapshotGossipVotes(t *testing.T) {
	s, _ := openStore(t, testConfig())
	live := func() []Member {
		return []Member{
			{Peer: peerID(1), Round: 9, StateHash: 7},
			{Peer: peerID(2), Round: 9, StateHash: 7},
			{Peer: peerID(3), Round: 9, StateHash: 8},
			{Peer: peerID(4), Round: 9},
		}
	}
	snap, err := s.Snapshot(RunInfo{}, live, t0)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, m := range snap.Members {
		got[m.Peer] = m.Agreement
	}
	want := map[string]string{"fake0001": Agree, "fake0002": Agree, "fake0003": Differs, "fake0004": Unknown}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s, want %s", k, got[k], v)
		}
	}
}

func TestCurveDownsamples(t *testing.T) {
	var rounds []point
	for r := uint64(1); r <= 2500; r++ {
		rounds = append(rounds, point{Round: r, Last: int64(r), Train: float64(r), Val: math.NaN(), Sent: float32(r), Reporters: 2, Certified: true},
			point{Round: r, Train: 1e5, Val: 1e5, Sent: 1e5}) // uncertified: not drawn (the rounds are not in order; curve does not care)
	}
	c := curve(rounds, 8) // 8 parameters: bits per parameter = bytes sent
	if len(c) > maxCurvePoints || len(c) < maxCurvePoints/2 {
		t.Fatalf("%d points from 2500 rounds", len(c))
	}
	if last := c[len(c)-1]; last.Round != 2500 || *last.Train != 2500 || *last.BitsPerParam != 2500 {
		t.Errorf("last point %+v (a bucket of round 2500 alone)", last)
	}
	if len(c) != 834 || c[0].Round != 3 || *c[0].Train != 2 || c[0].Val != nil || *c[0].BitsPerParam != 2 { // buckets of 3 rounds
		t.Errorf("first point %+v", c[0])
	}
	if c := curve(rounds[:2], 0); len(c) != 1 || c[0].BitsPerParam != nil {
		t.Errorf("curve without a parameter count: %+v", c)
	}
}

// TestSnapshotDataProgress: the data progress of a round is the lower
// median, by epoch then share, of its reporters in the certified state, so
// one liar among three agreeing members cannot move it; the snapshot shows
// the latest round up to its round that has one, and it survives a reopen.
//
// Round 1: A and B say epoch 0, 12.5%; C (same state) lies, epoch 7, 90%;
// D is in another state and says epoch 9. Round 2: A and B 30%, C lies low
// (1%). Round 3: A, B and D (now in the certified state) send no data
// progress, C sends some from another state: the round has none, so the
// snapshot shows round 2's.
func TestSnapshotDataProgress(t *testing.T) {
	s, path := openStore(t, testConfig())
	const H, G = 0x1111, 0x2222
	A, B, C, D := peerID(1), peerID(2), peerID(3), peerID(4)
	rep := func(round, hash uint64, data bool, epoch uint64, trained float32) telemetry.Report {
		r := telemetry.Report{Round: round, StateHash: hash, TrainLoss: 3, ValLoss: float32(math.NaN()),
			Tokens: 100, WallSeconds: 10, Members: 3}
		if data {
			r.HasData, r.Epoch, r.EpochTrained = true, epoch, trained
		}
		return r
	}
	record := func(peer string, r telemetry.Report) {
		t.Helper()
		if err := s.Record(peer, r, t0.Add(time.Duration(r.Round)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	record(A, rep(1, H, true, 0, 0.125))
	record(B, rep(1, H, true, 0, 0.125))
	record(C, rep(1, H, true, 7, 0.9))
	record(D, rep(1, G, true, 9, 0.5))
	record(A, rep(2, H, true, 0, 0.3))
	record(B, rep(2, H, true, 0, 0.3))
	record(C, rep(2, H, true, 0, 0.01))
	record(A, rep(3, H, false, 0, 0))
	record(B, rep(3, H, false, 0, 0))
	record(D, rep(3, H, false, 0, 0))
	record(C, rep(3, G, true, 5, 0.5))

	now := t0.Add(3*time.Minute + time.Second)
	check := func(s *Store, when string) {
		t.Helper()
		snap, err := s.Snapshot(RunInfo{RunID: "data"}, liveMembers(1, 2, 3, 4), now)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Round != 3 || snap.Data == nil || *snap.Data != (DataProgress{Epoch: 0, Trained: 0.3}) {
			t.Errorf("%s: round %d, data %+v; want round 3, epoch 0, 0.3 trained (round 2's median)", when, snap.Round, snap.Data)
		}
		body, err := json.Marshal(snap)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(body), `"data":{"epoch":0,"trained":0.3}`) {
			t.Errorf("%s: JSON %s lacks the data progress", when, body)
		}
		h, err := s.History(0, 10)
		if err != nil {
			t.Fatal(err)
		}
		want := []*DataProgress{{Epoch: 0, Trained: 0.125}, {Epoch: 0, Trained: 0.3}, nil}
		if len(h) != 3 || !h[2].Certified || h[2].MajorityHash != "0000000000001111" {
			t.Fatalf("%s: history %+v, want 3 rounds, round 3 certified in state H", when, h)
		}
		for i, w := range want {
			if got := h[i].Data; (got == nil) != (w == nil) || got != nil && *got != *w {
				t.Errorf("%s: round %d data %+v, want %+v", when, h[i].Round, got, w)
			}
		}
	}
	check(s, "before reopen")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(path, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	check(s2, "after reopen")
}

// TestSnapshotWithoutData: a run without a dataset has no data progress,
// and its JSON no "data" field; neither has a round record written before
// the store kept data progress.
func TestSnapshotWithoutData(t *testing.T) {
	s, path := openStore(t, testConfig())
	feedRun(t, s, 3, 1, 4)
	// Round 9 as the store wrote it before it kept data progress.
	old := `{"round":9,"first":1772366490000,"last":1772366490002,"reporters":2,"contributors":2,"train_n":2,"val_n":0,` +
		`"sent":2097152,"recv":2097152,"dp_units":1,"hashes":[{"h":42,"n":2}],` +
		`"samples":[{"h":42,"t":2.5,"v":-1,"k":4096},{"h":42,"t":2.75,"v":-1,"k":4096}],"certified":true,"cert_hash":42}`
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketRounds).Put(beKey(9), []byte(old)) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	snap, err := s.Snapshot(RunInfo{RunID: "plain"}, liveMembers(0, 1, 2), t0.Add(45*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if snap.Data != nil {
		t.Errorf("data progress %+v in a run without data", snap.Data)
	}
	body, err := json.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), `"data"`) {
		t.Errorf("JSON has a data field: %s", body)
	}
	h, err := s.History(0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 5 || h[4].Round != 9 || h[4].TrainLoss == nil || *h[4].TrainLoss != 2.625 || h[4].Tokens != 8192 {
		t.Fatalf("history with the old record: %+v", h)
	}
	for _, r := range h {
		if r.Data != nil {
			t.Errorf("round %d: data progress %+v", r.Round, r.Data)
		}
	}
	body, err = json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(body), `"data"`) {
		t.Errorf("history JSON has a data field: %s", body)
	}
}

// TestSanitizeData: data progress out of range is clamped, and none is kept
// without HasData.
func TestSanitizeData(t *testing.T) {
	for _, c := range []struct {
		in      telemetry.Report
		has     bool
		epoch   uint64
		trained float64
	}{
		{telemetry.Report{HasData: true, Epoch: 3, EpochTrained: 0.5}, true, 3, 0.5},
		{telemetry.Report{HasData: true, Epoch: 1, EpochTrained: float32(math.NaN())}, true, 1, 0},
		{telemetry.Report{HasData: true, EpochTrained: float32(math.Inf(1))}, true, 0, 1},
		{telemetry.Report{HasData: true, EpochTrained: 1.5}, true, 0, 1},
		{telemetry.Report{HasData: true, EpochTrained: -0.5}, true, 0, 0},
		{telemetry.Report{Epoch: 5, EpochTrained: 0.5}, false, 0, 0},
	} {
		r := sanitize(c.in, 0)
		if r.HasData != c.has || r.Epoch != c.epoch || r.EpochTrained != c.trained {
			t.Errorf("sanitize(%+v): data %v epoch %d trained %v, want %v %d %v", c.in, r.HasData, r.Epoch, r.EpochTrained, c.has, c.epoch, c.trained)
		}
	}
}
