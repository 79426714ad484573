package optimizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/compression"
)

func testRingConfig() RingConfig {
	c := DefaultRingConfig()
	if os.Getenv("SKEIN_TEST_LOG") != "" {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c.InitialDeadline, c.MinDeadline, c.MaxDeadline = 1500*time.Millisecond, 100*time.Millisecond, 1500*time.Millisecond
	return c
}

type member struct {
	id   PeerID
	peer *MemPeer
	ring *Ring
}

// swarm builds n members on one MemNetwork, rings started.
func swarm(t *testing.T, n int, cfg RingConfig) (*MemNetwork, []*member) {
	t.Helper()
	net := NewMemNetwork()
	ctx, cancel := context.WithCancel(context.Background())
	var ms []*member
	for i := 0; i < n; i++ {
		ms = append(ms, addMember(t, ctx, net, PeerID(fmt.Sprintf("peer-%02d", i)), cfg))
	}
	t.Cleanup(func() {
		cancel()
		for _, m := range ms {
			m.ring.Close()
		}
		net.Close()
	})
	return net, ms
}

func addMember(t *testing.T, ctx context.Context, net *MemNetwork, id PeerID, cfg RingConfig) *member {
	p := net.Join(id)
	r, err := NewRing(p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.Start(ctx)
	return &member{id: id, peer: p, ring: r}
}

func randomVec(n int, seed uint64, scale float64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 9))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

func runAll(ms []*member, f func(i int, m *member) error) []error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i, m) }()
	}
	wg.Wait()
	return errs
}

func sameBits(a, b []float32) bool {
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

func TestRingAllReduceMean(t *testing.T) {
	tests := []struct {
		name  string
		codec compression.Codec
		n, M  int
		tol   float64 // relative L2 error of the result vs the exact mean
	}{
		{"fp32 exact", compression.FP32, 1001, 5, 1e-6},
		{"minmax8", compression.MinMax8, 5000, 4, 2e-2},
		{"int8", compression.Int8, 3000, 3, 2e-2},
		{"single member", compression.FP32, 10, 1, 0},
		{"fewer elements than members", compression.FP32, 3, 5, 1e-6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testRingConfig()
			cfg.Codec.Codec = tt.codec
			_, ms := swarm(t, tt.M, cfg)
			xs := make([][]float32, tt.M)
			want := make([]float64, tt.n)
			for i := range xs {
				xs[i] = randomVec(tt.n, uint64(i+1), 1)
				for j, v := range xs[i] {
					want[j] += float64(v) / float64(tt.M)
				}
			}
			outs := make([][]float32, tt.M)
			errs := runAll(ms, func(i int, m *member) error {
				outs[i] = make([]float32, tt.n)
				_, err := m.ring.AllReduceMean(context.Background(), 0, xs[i], outs[i])
				return err
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("member %d: %v", i, err)
				}
				if !sameBits(outs[i], outs[0]) {
					t.Fatalf("member %d's result differs from member 0's", i)
				}
			}
			var num, den float64
			for j, w := range want {
				d := float64(outs[0][j]) - w
				num += d * d
				den += w * w
			}
			if rel := math.Sqrt(num / den); rel > tt.tol {
				t.Errorf("relative error %.2e, want <= %.0e", rel, tt.tol)
			}
		})
	}
}

func TestNesterovStepByHand(t *testing.T) {
	// eta 0.5, mu 0.9; round 1 from m = 0: m = d, phi -= eta*(d + mu*d).
	phi, m := []float32{1, -2}, []float32{0, 0}
	NesterovStep(phi, m, []float32{0.1, -0.2}, 0.5, 0.9)
	want := []float32{1 - 0.5*(0.1+0.9*0.1), -2 - 0.5*(-0.2+0.9*-0.2)}
	for i := range phi {
		if math.Abs(float64(phi[i]-want[i])) > 1e-6 || math.Abs(float64(m[i]-[]float32{0.1, -0.2}[i])) > 1e-7 {
			t.Fatalf("round 1: phi %v m %v, want phi %v", phi, m, want)
		}
	}
	// round 2: m = 0.9*0.1 + 0.3 = 0.39; phi -= 0.5*(0.3 + 0.9*0.39)
	before := phi[0]
	NesterovStep(phi, m, []float32{0.3, 0}, 0.5, 0.9)
	if math.Abs(float64(m[0])-0.39) > 1e-6 || math.Abs(float64(before-phi[0])-0.5*(0.3+0.9*0.39)) > 1e-6 {
		t.Fatalf("round 2: m %v, step %v", m[0], before-phi[0])
	}
}

// diloco wraps members in DiLoCo optimizers with a shared initial phi.
func dilocos(t *testing.T, ms []*member, n int) ([]*DiLoCo, [][]float32) {
	phi0 := randomVec(n, 77, 1)
	var ds []*DiLoCo
	var thetas [][]float32
	for range ms {
		d, err := NewDiLoCo(DefaultDiLoCo(), nil, phi0)
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
		thetas = append(thetas, append([]float32(nil), phi0...))
	}
	for i, m := range ms {
		ds[i].coll = m.ring
	}
	return ds, thetas
}

// innerPhase stands in for H AdamW steps: a member-specific drift.
func innerPhase(theta []float32, member int, round uint64) {
	d := randomVec(len(theta), uint64(member)*1000+round, 0.01)
	for i := range theta {
		theta[i] += d[i] - 0.001
	}
}

// checkRound runs one DiLoCo round on the live members and requires them to
// agree on the state hash and the round number.
func checkRound(t *testing.T, ms []*member, ds []*DiLoCo, thetas [][]float32, live []int, wantRound uint64) {
	t.Helper()
	sub := make([]*member, len(live))
	for k, i := range live {
		sub[k] = ms[i]
		innerPhase(thetas[i], i, ds[i].Round)
	}
	errs := runAll(sub, func(k int, m *member) error {
		_, err := ds[live[k]].OuterStep(context.Background(), thetas[live[k]])
		return err
	})
	for k, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", live[k], err)
		}
	}
	h0 := ds[live[0]].StateHash()
	for _, i := range live {
		if ds[i].Round != wantRound {
			t.Fatalf("member %d at round %d, want %d", i, ds[i].Round, wantRound)
		}
		if ds[i].StateHash() != h0 {
			t.Fatalf("member %d's state hash differs after round %d", i, wantRound)
		}
		if !sameBits(thetas[i], ds[i].Phi) {
			t.Fatalf("member %d's local weights not reset to phi", i)
		}
	}
}

func TestDiLoCoMembersAgreeEveryRound(t *testing.T) {
	for _, M := range []int{4, 8} {
		t.Run(fmt.Sprint(M), func(t *testing.T) {
			_, ms := swarm(t, M, testRingConfig())
			ds, thetas := dilocos(t, ms, 2000)
			all := make([]int, M)
			for i := range all {
				all[i] = i
			}
			for r := uint64(1); r <= 3; r++ {
				checkRound(t, ms, ds, thetas, all, r)
			}
		})
	}
}

func TestDiLoCoFaults(t *testing.T) {
	const M, n = 5, 3000
	tests := []struct {
		name   string
		detect time.Duration // failure detector delay
		inject func(net *MemNetwork, victim PeerID)
		killed bool
	}{
		{"fails before sending", time.Hour, func(net *MemNetwork, v PeerID) { net.Kill(v) }, true},
		{"fails while sending", time.Hour, func(net *MemNetwork, v PeerID) { net.FailAfterSends(v, 1) }, true},
		{"fails while reducing", time.Hour, func(net *MemNetwork, v PeerID) { net.FailAfterSends(v, M) }, true},
		{"fails, detector notices", 50 * time.Millisecond, func(net *MemNetwork, v PeerID) { net.FailAfterSends(v, 2) }, true},
		{"is slow", time.Hour, func(net *MemNetwork, v PeerID) { net.SetDelay(v, 400*time.Millisecond, 0) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			net, ms := swarm(t, M, testRingConfig())
			net.DetectAfter = tt.detect
			ds, thetas := dilocos(t, ms, n)
			all := []int{0, 1, 2, 3, 4}
			checkRound(t, ms, ds, thetas, all, 1) // warm the deadline estimators
			victim := 2
			tt.inject(net, ms[victim].id)
			live := all
			if tt.killed {
				live = []int{0, 1, 3, 4}
				// the victim runs too, and fails
				done := make(chan error, 1)
				go func() { _, err := ds[victim].OuterStep(context.Background(), thetas[victim]); done <- err }()
				defer func() { <-done }()
			}
			checkRound(t, ms, ds, thetas, live, 2)
			checkRound(t, ms, ds, thetas, live, 3) // and the next round runs normally
		})
	}
}

func TestDiLoCoCancelledRoundIsRetried(t *testing.T) {
	const M, n = 4, 1000
	net, ms := swarm(t, M, testRingConfig())
	ds, thetas := dilocos(t, ms, n)
	all := []int{0, 1, 2, 3}
	checkRound(t, ms, ds, thetas, all, 1)
	for _, m := range ms {
		net.SetDelay(m.id, 300*time.Millisecond, 0)
	}
	saved := make([][]float32, M)
	for i := range ms {
		innerPhase(thetas[i], i, 1)
		saved[i] = append([]float32(nil), thetas[i]...)
	}
	// Cancel before any member's deadline (100ms) so that no member has
	// suspected another: the round is abandoned by all, cleanly.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
	defer cancel()
	errs := runAll(ms, func(i int, m *member) error { _, err := ds[i].OuterStep(ctx, thetas[i]); return err })
	for i, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("member %d: %v, want deadline exceeded", i, err)
		}
		if ds[i].Round != 1 || !sameBits(thetas[i], saved[i]) {
			t.Fatalf("member %d changed state in a cancelled round", i)
		}
	}
	for _, m := range ms {
		net.SetDelay(m.id, 0, 0)
	}
	time.Sleep(700 * time.Millisecond) // let the cancelled round's messages drain
	errs = runAll(ms, func(i int, m *member) error { _, err := ds[i].OuterStep(context.Background(), thetas[i]); return err })
	for i, err := range errs {
		if err != nil {
			t.Fatalf("retry, member %d: %v", i, err)
		}
		if ds[i].Round != 2 || ds[i].StateHash() != ds[0].StateHash() {
			t.Fatalf("member %d: round %d, hash agrees %v", i, ds[i].Round, ds[i].StateHash() == ds[0].StateHash())
		}
	}
}

func TestDiLoCoJoinerParticipatesFromNextRound(t *testing.T) {
	const n = 1500
	cfg := testRingConfig()
	net, ms := swarm(t, 3, cfg)
	ds, thetas := dilocos(t, ms, n)
	checkRound(t, ms, ds, thetas, []int{0, 1, 2}, 1)
	checkRound(t, ms, ds, thetas, []int{0, 1, 2}, 2)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	j := addMember(t, ctx, net, "peer-99", cfg)
	defer j.ring.Close()
	jd, err := NewDiLoCo(DefaultDiLoCo(), j.ring, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	round, phi, mom := ds[0].State()
	if err := jd.SetState(round, phi, mom); err != nil {
		t.Fatal(err)
	}
	ms, ds, thetas = append(ms, j), append(ds, jd), append(thetas, append([]float32(nil), phi...))
	st := checkRoundStats(t, ms, ds, thetas)
	if len(st.Group) != 4 {
		t.Fatalf("round 3 group %v, want 4 members", st.Group)
	}
}

func checkRoundStats(t *testing.T, ms []*member, ds []*DiLoCo, thetas [][]float32) RoundStats {
	t.Helper()
	stats := make([]RoundStats, len(ms))
	for i := range ms {
		innerPhase(thetas[i], i, ds[i].Round)
	}
	errs := runAll(ms, func(i int, m *member) error {
		var err error
		stats[i], err = ds[i].OuterStep(context.Background(), thetas[i])
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		if ds[i].StateHash() != ds[0].StateHash() {
			t.Fatalf("member %d disagrees", i)
		}
	}
	return stats[0]
}

// Delayed DiLoCo: every member ends with the same phi after the flush, and
// no local progress is lost while a round is in flight.
func TestDiLoCoDelayedAgrees(t *testing.T) {
	const M, n = 4, 800
	_, ms := swarm(t, M, testRingConfig())
	ds, thetas := dilocos(t, ms, n)
	for phase := 0; phase < 4; phase++ {
		for i := range ms {
			innerPhase(thetas[i], i, uint64(phase))
		}
		before := make([][]float32, M)
		for i := range ms {
			before[i] = append([]float32(nil), thetas[i]...)
		}
		errs := runAll(ms, func(i int, m *member) error {
			_, err := ds[i].OuterStepDelayed(context.Background(), thetas[i])
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("phase %d member %d: %v", phase, i, err)
			}
		}
		if phase == 0 && !sameBits(before[0], thetas[0]) {
			t.Fatal("first delayed step changed theta with nothing to apply")
		}
	}
	errs := runAll(ms, func(i int, m *member) error { _, err := ds[i].Flush(thetas[i]); return err })
	for i, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
		if ds[i].Round != 4 || ds[i].StateHash() != ds[0].StateHash() || !sameBits(thetas[i], ds[i].Phi) {
			t.Fatalf("member %d: round %d, agrees %v", i, ds[i].Round, ds[i].StateHash() == ds[0].StateHash())
		}
	}
}

// Adopting a state while a delayed round is in flight abandons that round:
// the state is exactly the one adopted, nothing of the round in flight is
// applied later, and the next delayed step measures progress from the new
// phi.
func TestDiLoCoSetStateAbandonsDelayedRound(t *testing.T) {
	const M, n = 3, 600
	_, ms := swarm(t, M, testRingConfig())
	ds, thetas := dilocos(t, ms, n)
	for i := range ms {
		innerPhase(thetas[i], i, 0)
	}
	errs := runAll(ms, func(i int, m *member) error {
		_, err := ds[i].OuterStepDelayed(context.Background(), thetas[i])
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	if !ds[0].InFlight() {
		t.Fatal("no delayed round in flight")
	}
	phi, mom := make([]float32, n), make([]float32, n)
	for i := range phi {
		phi[i], mom[i] = float32(i)/n, 0.5
	}
	if err := ds[0].SetState(7, phi, mom); err != nil {
		t.Fatal(err)
	}
	if ds[0].InFlight() || ds[0].Round != 7 || !sameBits(ds[0].Phi, phi) || !sameBits(ds[0].Mom, mom) {
		t.Fatalf("after SetState: in flight %v, round %d, phi adopted %v", ds[0].InFlight(), ds[0].Round, sameBits(ds[0].Phi, phi))
	}
	// Flush has nothing to land; theta becomes the adopted phi.
	if _, err := ds[0].Flush(thetas[0]); err != nil || !sameBits(thetas[0], phi) || ds[0].Round != 7 {
		t.Fatalf("flush after abandon: %v, round %d", err, ds[0].Round)
	}
	for i := 1; i < M; i++ {
		ds[i].Abandon()
	}
}

// Error feedback on a biased codec: int4 pseudo-gradients with EF move phi
// closer to the fp32 result than without, over several rounds.
func TestDiLoCoErrorFeedback(t *testing.T) {
	const M, n, rounds = 3, 2048, 6
	run := func(codec compression.Codec, ef bool) []float32 {
		cfg := testRingConfig()
		cfg.Codec.Codec = compression.FP32
		_, ms := swarm(t, M, cfg)
		ds, thetas := dilocos(t, ms, n)
		if codec != compression.FP32 {
			fc := compression.DefaultConfig()
			fc.Codec, fc.ZstdLevel = codec, 0
			for i := range ds {
				var err error
				dc := DefaultDiLoCo()
				dc.Feedback = &fc
				if ds[i], err = NewDiLoCo(dc, ms[i].ring, ds[i].Phi); err != nil {
					t.Fatal(err)
				}
				if !ef {
					ds[i].ef = nil // quantize without feedback
					ds[i].efEncOnly = true
				}
			}
		}
		for r := 0; r < rounds; r++ {
			for i := range ms {
				// a small, consistent drift: the kind of signal int4 rounds away
				for j := range thetas[i] {
					thetas[i][j] -= 0.002 * float32(1.3+math.Sin(float64(j)*0.37))
				}
			}
			errs := runAll(ms, func(i int, m *member) error { _, err := ds[i].OuterStep(context.Background(), thetas[i]); return err })
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		return ds[0].Phi
	}
	exact := run(compression.FP32, false)
	dist := func(a []float32) float64 {
		var s float64
		for i := range a {
			d := float64(a[i] - exact[i])
			s += d * d
		}
		return math.Sqrt(s)
	}
	withEF, without := dist(run(compression.Int4, true)), dist(run(compression.Int4, false))
	t.Logf("distance to fp32 phi after %d rounds: int4+EF %.4f, int4 %.4f", rounds, withEF, without)
	if !(withEF < without) {
		t.Errorf("error feedback did not help: %.4f vs %.4f", withEF, without)
	}
}

// TestExcludedMemberLearnsResultIsGone: a member that offers a round the
// others finished long ago (its result no longer kept) is told so and gets
// ErrExcluded within a few deadlines, not after MaxDeadline, so that its
// caller re-syncs from a member's state at once.
func TestExcludedMemberLearnsResultIsGone(t *testing.T) {
	const n = 500
	cfg := testRingConfig()
	cfg.InitialDeadline, cfg.MaxDeadline = 300*time.Millisecond, time.Minute
	net, ms := swarm(t, 2, cfg)
	x := randomVec(n, 1, 1)
	for round := uint64(1); round <= keepDone+2; round++ {
		errs := runAll(ms, func(i int, m *member) error {
			_, err := m.ring.AllReduceMean(context.Background(), round, x, make([]float32, n))
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, member %d: %v", round, i, err)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	late := addMember(t, ctx, net, "peer-late", cfg)
	defer late.ring.Close()
	began := time.Now()
	_, err := late.ring.AllReduceMean(context.Background(), 1, x, make([]float32, n))
	if !errors.Is(err, ErrExcluded) {
		t.Fatalf("late member: %v, want ErrExcluded", err)
	}
	if took := time.Since(began); took > 15*time.Second {
		t.Fatalf("late member gave up after %v; the others' answer should end its wait well before MaxDeadline (%v)", took, cfg.MaxDeadline)
	}
}

// TestDiLoCoViewsDisagreeAtRoundStart: one member does not see a joiner yet
// when the round starts, so it forms a ring without it while the others
// form one with it. Every member retries a failed round with the same
// pseudo-gradient, as volunteers do; all end the round with one state, and
// the round advances once.
func TestDiLoCoViewsDisagreeAtRoundStart(t *testing.T) {
	const n = 2000
	cfg := testRingConfig()
	for _, hidden := range []int{0, 1, 2} { // who is unseen by member 0 (0: nobody)
		t.Run(fmt.Sprintf("member 0 does not see %d", hidden), func(t *testing.T) {
			net, ms := swarm(t, 4, cfg)
			if hidden > 0 {
				net.Hide(ms[0].id, ms[hidden].id, 700*time.Millisecond)
				net.Hide(ms[3].id, ms[hidden].id, 300*time.Millisecond)
			}
			ds, thetas := dilocos(t, ms, n)
			for i := range ms {
				innerPhase(thetas[i], i, 0)
			}
			errs := runAll(ms, func(i int, m *member) error {
				var err error
				for try := 0; try < 6; try++ {
					if _, err = ds[i].OuterStep(context.Background(), thetas[i]); err == nil {
						return nil
					}
					t.Logf("member %d, try %d: %v", i, try, err)
				}
				return err
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("member %d: %v", i, err)
				}
				if ds[i].Round != 1 || ds[i].StateHash() != ds[0].StateHash() {
					t.Fatalf("member %d: round %d, same state as member 0: %v", i, ds[i].Round, ds[i].StateHash() == ds[0].StateHash())
				}
			}
		})
	}
}

// TestMemberWaitingForResultIsNotAwaited: a member that left the round to
// wait for its result (its queries say so) is suspected at once by a member
// waiting for its ring message, instead of after a whole deadline (a
// newcomer's first one is InitialDeadline, minutes on a WAN).
func TestMemberWaitingForResultIsNotAwaited(t *testing.T) {
	const n = 300
	cfg := testRingConfig()
	cfg.InitialDeadline, cfg.MaxDeadline = 30*time.Second, time.Minute
	net, ms := swarm(t, 1, cfg)
	x := net.Join("peer-x") // a bare member: it only asks for the result
	query := appendMessage(nil, header{kind: kindQuery, round: 0, step: queryWaiting}, nil)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
				x.Send(context.Background(), ms[0].id, query)
			}
		}
	}()
	began := time.Now()
	_, err := ms[0].ring.AllReduceMean(context.Background(), 0, randomVec(n, 1, 1), make([]float32, n))
	if !errors.Is(err, ErrExcluded) {
		t.Fatalf("got %v, want ErrExcluded (the only other member waits for the result too)", err)
	}
	if took := time.Since(began); took > 10*time.Second {
		t.Fatalf("took %v: waited for a member that said it was waiting (InitialDeadline %v)", took, cfg.InitialDeadline)
	}
}

// One member sending thousands of large messages for a future round cannot
// pin more than the stash's byte bound, nor more than half of it, nor push
// out another member's message (issue: 2000 messages kept 243 MiB alive).
func TestRingStashBoundedInBytes(t *testing.T) {
	net := NewMemNetwork()
	defer net.Close()
	cfg := testRingConfig()
	cfg.MaxStashBytes = 1 << 20
	r, err := NewRing(net.Join("a"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 64<<10)
	r.mu.Lock()
	r.stashLocked(envelope{from: "honest", h: header{kind: kindReduce, round: 5}, body: body})
	for i := 0; i < 2000; i++ {
		r.stashLocked(envelope{from: "flood", h: header{kind: kindReduce, round: 9, chunk: uint32(i)}, body: body})
	}
	r.stashLocked(envelope{from: "flood", h: header{kind: kindReduce, round: 9}, body: make([]byte, 600<<10)}) // over its share
	r.mu.Unlock()
	total, n := r.stashBytes()
	if total > cfg.MaxStashBytes {
		t.Fatalf("stash holds %d bytes, bound %d", total, cfg.MaxStashBytes)
	}
	var honest, flood int64
	r.mu.Lock()
	for _, e := range r.stash {
		switch e.from {
		case "honest":
			honest += int64(len(e.body))
		case "flood":
			flood += int64(len(e.body))
		}
	}
	r.mu.Unlock()
	if honest != int64(len(body)) {
		t.Fatalf("the honest member's message was pushed out (%d bytes left of it)", honest)
	}
	if flood > cfg.MaxStashBytes/2 {
		t.Fatalf("one sender holds %d bytes, more than half of %d", flood, cfg.MaxStashBytes)
	}
	t.Logf("stash: %d messages, %d bytes (flood %d)", n, total, flood)
}

// One member adding +3000 to every element of its pseudo-gradient (issue 9:
// it passed the fixed bounds) makes the round's average far larger than the
// recent ones: every member rejects it identically and nothing is applied;
// the next honest round goes through.
func TestDiLoCoRejectsOutsizedAverage(t *testing.T) {
	const M, n = 4, 1000
	_, ms := swarm(t, M, testRingConfig())
	ds, thetas := dilocos(t, ms, n)
	step := func(poison bool) []error {
		for i := range ms {
			innerPhase(thetas[i], i, ds[i].Round)
			if poison && i == 0 {
				for k := range thetas[i] {
					thetas[i][k] -= 3000 // delta = phi - theta grows by 3000
				}
			}
		}
		return runAll(ms, func(i int, m *member) error { _, err := ds[i].OuterStep(context.Background(), thetas[i]); return err })
	}
	for r := 0; r < normMinHistory+1; r++ {
		for i, err := range step(false) {
			if err != nil {
				t.Fatalf("honest round %d member %d: %v", r, i, err)
			}
		}
	}
	before, round := ds[1].StateHash(), ds[1].Round
	for i, err := range step(true) {
		if !errors.Is(err, ErrRejected) {
			t.Fatalf("poisoned round, member %d: %v, want ErrRejected", i, err)
		}
	}
	for i := range ds {
		if ds[i].Round != round || (i > 0 && ds[i].StateHash() != before) {
			t.Fatalf("member %d applied the poisoned round (round %d, want %d)", i, ds[i].Round, round)
		}
		copy(thetas[i], ds[i].Phi) // the members go back to phi, as volunteers do
	}
	for i, err := range step(false) {
		if err != nil {
			t.Fatalf("honest round after the poisoned one, member %d: %v", i, err)
		}
	}
}
