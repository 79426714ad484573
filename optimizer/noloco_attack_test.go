package optimizer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/transport"
)

// nolocoProgress runs honest members and one more from the same weights
// phi0 for steps outer steps, each inner phase moving theta by 0.01 per
// element plus noise of its own, and returns the honest members' mean
// progress in inner phases' worth and how many partners they clipped.
// With rollback the last member is hostile: every step it sends the run's
// initial weights and no outer gradient (every value in range); otherwise
// it trains like the others.
func nolocoProgress(t *testing.T, honest, steps int, rollback bool) (progress float64, clipped int) {
	const n = 256
	net := transport.NewMemNetwork()
	defer net.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := testNoLoCoConfig()
	cfg.InitialDeadline, cfg.MinDeadline, cfg.MaxDeadline = 30*time.Second, 30*time.Second, 30*time.Second
	phi0 := randomVec(n, 1, 1)
	M := honest + 1
	ns, clips := make([]*NoLoCo, M), make([]int, M)
	for i := range ns {
		nl, err := NewNoLoCo(ctx, cfg, net.Join(transport.PeerID(fmt.Sprintf("peer-%d", i))), phi0)
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		ns[i] = nl
	}
	for step := range steps {
		errs := each(M, func(i int) error {
			nl := ns[i]
			theta := slices.Clone(nl.Phi)
			if i == honest && rollback {
				if err := nl.SetState(nl.Step, phi0, make([]float32, n)); err != nil {
					return err
				}
				copy(theta, phi0)
			} else {
				noise := randomVec(n, uint64(1000*i+step), 0.01)
				for j := range theta {
					theta[j] += 0.01 + noise[j]
				}
			}
			st, err := nl.OuterStep(ctx, theta)
			if err == nil && len(st.Heard) != len(st.Group)-1 {
				err = fmt.Errorf("heard %d of %d partners", len(st.Heard), len(st.Group)-1)
			}
			clips[i] += len(st.Clipped)
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("step %d member %d: %v", step, i, err)
			}
		}
	}
	for i, nl := range ns[:honest] {
		clipped += clips[i]
		var s float64
		for j := range nl.Phi {
			s += float64(nl.Phi[j] - phi0[j])
		}
		progress += s / n / 0.01 / float64(honest)
	}
	return progress, clipped
}

// A hostile member that sends the run's initial weights every step pulls
// its partners back by at most PhiClip times the scale of an outer step, not
// by all the progress made: with 4 honest members, after 30 steps most of
// the progress stays (before the bound it lost 87%: the pull grows with the
// progress, so progress stalls). Honest partners are not clipped.
func TestNoLoCoRollbackAttack(t *testing.T) {
	const honest, steps = 4, 30
	good, clipped := nolocoProgress(t, honest, steps, false)
	if clipped != 0 {
		t.Errorf("honest run: %d honest partners clipped", clipped)
	}
	bad, _ := nolocoProgress(t, honest, steps, true)
	lost := 1 - bad/good
	t.Logf("progress %.2f honest, %.2f with a partner sending the initial weights: %.0f%% lost", good, bad, 100*lost)
	if !(lost < 0.5) {
		t.Errorf("the rollback attack erased %.0f%% of the progress", 100*lost)
	}
}

// A partner's phi and outer gradient are clipped to the scale of this
// member's own outer steps, whatever values within MaxAbs it sends; others
// are refused.
func TestNoLoCoPartnerClipped(t *testing.T) {
	for _, tt := range []struct {
		name     string
		phi, d   float32 // added to the partner's honest phi, per element; its outer gradient per element
		rejected bool
	}{
		{"honest", 0, 0.1, false},
		{"phi +6994", 6994, 0.1, false},
		{"phi -6994", -6994, 0.1, false},
		{"outer gradient 1e4", 0, 1e4, false},
		{"both", 5000, -1e4, false},
		{"phi beyond MaxAbs", 2e4, 0.1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const n = 64
			net := transport.NewMemNetwork()
			defer net.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			phi := randomVec(n, 3, 1)
			var rejected bool
			cfg := testNoLoCoConfig()
			cfg.OnReject = func(transport.PeerID, error) { rejected = true }
			a, err := NewNoLoCo(ctx, cfg, net.Join("a"), phi)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := NewNoLoCo(ctx, testNoLoCoConfig(), net.Join("b"), phi)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			hostile := slices.Clone(phi)
			for i := range hostile {
				hostile[i] += tt.phi
			}
			b.Phi = hostile // b sends this phi and outer gradient tt.d
			thetaB := slices.Clone(hostile)
			for i := range thetaB {
				thetaB[i] += tt.d
			}
			thetaA := slices.Clone(phi)
			for i := range thetaA {
				thetaA[i] += 0.1
			}
			errs := each(2, func(i int) error {
				var err error
				if i == 0 {
					_, err = a.OuterStep(ctx, thetaA)
				} else {
					_, err = b.OuterStep(ctx, thetaB)
				}
				return err
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			// a's own outer gradient has norm 0.1*sqrt(n): a moves by at
			// most eta/2 of it and of the partner's (clipped to 2x) plus
			// gamma/2 of the partner's phi's distance (clipped to 1.5x).
			own := 0.1 * math.Sqrt(n)
			moved := distance(a.Phi, phi)
			limit := 0.7*(1+2)*own/2 + 0.7*1.5*own/2 + 1e-3
			if moved > limit || rejected != tt.rejected {
				t.Fatalf("a moved %.3g (at most %.3g), rejected %v (want %v)", moved, limit, rejected, tt.rejected)
			}
		})
	}
}

// The gossip decoder is capped at the model's size: a frame of a few KiB
// that declares millions of elements is refused before anything is
// allocated for them, and a frame of the wrong size is refused.
func TestNoLoCoDecodeBounded(t *testing.T) {
	const n = 64
	enc, err := compression.NewEncoder(DefaultNoLoCo().DeltaCodec)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	cfg := DefaultNoLoCo().DeltaCodec
	cfg.ZstdLevel = 3
	zenc, err := compression.NewEncoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer zenc.Close()
	body := func(e *compression.Encoder, phiLen, dLen int) []byte {
		b := make([]byte, 4)
		b, err := e.Append(b, make([]float32, phiLen), 0)
		if err != nil {
			t.Fatal(err)
		}
		putUint32(b, uint32(len(b)-4))
		b, err = e.Append(b, make([]float32, dLen), 0)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bomb := body(zenc, 1<<22, n) // 16 MiB of zeros in a few KiB
	if len(bomb) > 64<<10 {
		t.Fatalf("bomb of %d bytes", len(bomb))
	}
	g, err := NewGossip(DefaultNoLoCo(), "a", n)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	dec := g.dec
	phi, d := make([]float32, n), make([]float32, n)
	for _, tt := range []struct {
		name string
		body []byte
		want error
	}{
		{"good", body(enc, n, n), nil},
		{"bomb", bomb, compression.ErrTooLarge},
		{"short phi", body(enc, n-1, n), ErrRejected},
		{"long outer gradient", body(enc, n, n+1), compression.ErrTooLarge},
		{"truncated", body(enc, n, n)[:40], ErrBadMessage},
		{"outer gradient truncated", body(enc, n, n)[:180], ErrRejected},
		{"no frame", []byte{1, 2}, ErrBadMessage},
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := decodeGossip(dec, tt.body, phi, d, 1e4)
		runtime.ReadMemStats(&after)
		if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.want)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
			t.Errorf("%s: decoding allocated %d bytes", tt.name, alloc)
		}
	}
}

func putUint32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// Messages are kept only from a member's partners at the message's step,
// one per sender and step, and within the byte budget: members that are
// not partners (sybils) are ignored, and a partner gets at most a quarter
// of the budget, messages beyond the next two steps half of it.
func TestNoLoCoKeepsOnlyPartners(t *testing.T) {
	const n = 64
	var ids []transport.PeerID
	for i := range 12 {
		ids = append(ids, transport.PeerID(fmt.Sprintf("m%02d", i)))
	}
	cfg := testNoLoCoConfig()
	cfg.MaxStashBytes = 1 // raised to 8 messages of the model's size
	a, err := NewGossip(cfg, "a", n)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.SetMembers(ids)
	msg := func(step uint64, size int64) []byte {
		return appendMessage(nil, header{kind: kindGossip, round: step}, make([]byte, size))
	}
	max := int64(a.maxBody)
	if a.budget != 8*max {
		t.Fatalf("budget %d, want %d", a.budget, 8*max)
	}
	// Every member offers a message for steps 0 to 2 and 40, twice.
	for range 2 {
		for _, step := range []uint64{0, 1, 2, 40} {
			for _, id := range ids {
				kept := a.offer(id, msg(step, 100))
				if want := slices.Contains(a.groupAt(step), id); kept && !want {
					t.Errorf("kept a message of %s, not a partner at step %d", id, step)
				}
			}
		}
	}
	for step := range uint64(3) {
		if got, want := len(a.arrived[step]), len(a.groupAt(step))-1; got != want {
			t.Errorf("step %d: %d messages kept, want one from each of %d partners", step, got, want)
		}
	}
	if got, want := len(a.ahead), len(a.groupAt(40))-1; got != want {
		t.Errorf("%d messages kept ahead, want %d", got, want)
	}
	// A partner at step 1 and 50 has a quarter of the budget; messages of
	// the largest size beyond the next two steps fill half of it, then
	// nothing more is kept for them.
	p := slices.DeleteFunc(slices.Clone(a.groupAt(1)), func(id transport.PeerID) bool { return id == "a" })[0]
	if a.offer(p, msg(50, max+1)) {
		t.Error("kept a message larger than the model allows")
	}
	if a.offer(p, msg(1, a.budget/4)) {
		t.Error("kept a message past the sender's share")
	}
	for step := uint64(100); step < 400; step++ {
		for _, id := range a.groupAt(step) {
			if id != "a" {
				a.offer(id, msg(step, max))
			}
		}
	}
	var later int64
	for _, e := range a.ahead {
		later += int64(len(e.body))
	}
	if later > a.budget/2 || len(a.ahead) < 2 {
		t.Errorf("%d messages of %d bytes in all kept ahead, budget %d", len(a.ahead), later, a.budget)
	}
}
