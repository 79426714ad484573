package compression

import (
	"bytes"
	"fmt"
	"math"
	"testing"
)

// The same input, seed and options give identical bytes for any worker count,
// and through Writer; decoding in parallel gives the same values as Reader.
func TestDeterminismAcrossWorkers(t *testing.T) {
	x := gaussian(10_000, 5)
	for _, c := range Codecs() {
		for _, sr := range []bool{false, true} {
			var want []byte
			for _, workers := range []int{1, 2, 3, 8} {
				cfg := testConfig(c, sr, 1)
				cfg.ChunkElems = 1024
				cfg.Workers = workers
				enc, _ := NewEncoder(cfg)
				got, err := enc.Append(nil, x, 11)
				if err != nil {
					t.Fatal(err)
				}
				if want == nil {
					want = got
				} else if !bytes.Equal(got, want) {
					t.Fatalf("%v sr=%v: %d workers give different bytes", c, sr, workers)
				}
				// Error feedback too.
				ef, _ := NewErrorFeedback(EF, len(x))
				var a, b bytes.Buffer
				_ = ef.Encode(enc, &a, x, 1)
				_ = ef.Encode(enc, &b, x, 2)
				efBytes := fmt.Sprint(a.Bytes(), b.Bytes(), ef.State())
				cfg.Workers = 1
				enc1, _ := NewEncoder(cfg)
				ef1, _ := NewErrorFeedback(EF, len(x))
				a.Reset()
				b.Reset()
				_ = ef1.Encode(enc1, &a, x, 1)
				_ = ef1.Encode(enc1, &b, x, 2)
				if fmt.Sprint(a.Bytes(), b.Bytes(), ef1.State()) != efBytes {
					t.Fatalf("%v sr=%v: error feedback with %d workers differs", c, sr, workers)
				}
			}
			if sr && c.Lossy() {
				// A different seed gives different bytes.
				enc, _ := NewEncoder(testConfig(c, sr, 1))
				other, _ := enc.Append(nil, x, 12)
				if bytes.Equal(other, want) {
					t.Errorf("%v: seeds 11 and 12 give identical bytes", c)
				}
			}
			// Parallel Decode and the one-chunk-at-a-time Reader agree.
			dec, _ := NewDecoder(Config{Workers: 3, MaxElements: 1 << 20})
			y, err := dec.DecodeBytes(want, nil)
			if err != nil {
				t.Fatal(err)
			}
			rd, err := dec.NewReader(bytes.NewReader(want))
			if err != nil {
				t.Fatal(err)
			}
			var z []float32
			buf := make([]float32, 700) // not a divisor of the chunk size
			for {
				n, err := rd.Read(buf)
				z = append(z, buf[:n]...)
				if err != nil {
					break
				}
			}
			if fmt.Sprint(y) != fmt.Sprint(z) {
				t.Fatalf("%v: Decode and Reader disagree", c)
			}
		}
	}
}

// Stochastic rounding is unbiased: for each element, the mean decoding error
// over S seeds has standard deviation at most step/(2*sqrt(S)) (the rounding
// error lies in (-step, step) with mean zero and variance <= step^2/4), so we
// require |mean| <= 5 step/(2 sqrt(S)) for every element, and the mean over
// all elements within 5 step/(2 sqrt(S*n)). Nearest rounding fails this.
func TestStochasticRoundingUnbiased(t *testing.T) {
	const S, n = 1000, 512
	x := gaussian(n, 77)
	for _, c := range []Codec{Int8, Int4, MinMax8, Int2, Sign, BF16, FP16} {
		for _, sr := range []bool{true, false} {
			cfg := testConfig(c, sr, 0)
			enc, _ := NewEncoder(cfg)
			dec, _ := NewDecoder(cfg)
			sum := make([]float64, n)
			var y []float32
			for s := range uint64(S) {
				frame, _ := enc.Append(nil, x, s)
				y, _ = dec.DecodeBytes(frame, y)
				for i := range x {
					sum[i] += float64(y[i]) - float64(x[i])
				}
			}
			worst, total, totalStep := 0.0, 0.0, 0.0
			for i := range x {
				step := 2 * elementBound(c, true, x, i, cfg.BlockSize) // one step, with slack
				mean := sum[i] / S
				worst = max(worst, math.Abs(mean)/(step/(2*math.Sqrt(S))))
				total += mean
				totalStep += step
			}
			meanStep := totalStep / n
			overall := math.Abs(total/n) / (meanStep / (2 * math.Sqrt(S*n)))
			if sr && (worst > 5 || overall > 5) {
				t.Errorf("%v stochastic: worst element bias %.2f sigma, overall %.2f sigma (bound 5)", c, worst, overall)
			}
			if !sr && worst < 5 {
				t.Errorf("%v nearest: worst element bias only %.2f sigma; the test cannot see bias", c, worst)
			}
		}
	}
}

// Over many rounds of a fixed signal, the running sum of decoded messages
// tracks the running sum of inputs: with EF the gap is the residual, bounded
// and not growing; without EF it grows linearly for a biased (nearest) codec.
func TestErrorFeedbackTracksSum(t *testing.T) {
	const n, rounds = 2048, 300
	x := gaussian(n, 3)
	for _, c := range []Codec{Int4, Int8, MinMax8, Int2, BF16} {
		for _, mode := range []FeedbackMode{0, EF, EF21} {
			cfg := testConfig(c, false, 1)
			enc, _ := NewEncoder(cfg)
			dec, _ := NewDecoder(cfg)
			var ef *ErrorFeedback
			if mode != 0 {
				ef, _ = NewErrorFeedback(mode, n)
			}
			sumIn := make([]float64, n)
			sumOut := make([]float64, n) // EF21: the receiver's estimate g is the running value
			g := make([]float32, n)
			var y []float32
			gap := make([]float64, rounds)
			for r := range rounds {
				var buf bytes.Buffer
				var err error
				if ef != nil {
					err = ef.Encode(enc, &buf, x, uint64(r))
				} else {
					err = enc.Encode(&buf, x, uint64(r))
				}
				if err != nil {
					t.Fatal(err)
				}
				if y, err = dec.Decode(&buf, y); err != nil {
					t.Fatal(err)
				}
				var d float64
				for i := range x {
					sumIn[i] += float64(x[i])
					if mode == EF21 {
						g[i] += y[i]
						sumOut[i] += float64(g[i])
					} else {
						sumOut[i] += float64(y[i])
					}
					d += (sumIn[i] - sumOut[i]) * (sumIn[i] - sumOut[i])
				}
				gap[r] = math.Sqrt(d)
			}
			early := 0.0
			for _, v := range gap[:20] {
				early = max(early, v)
			}
			name := fmt.Sprintf("%v/%v", c, mode)
			switch {
			case mode == EF:
				if late := gap[rounds-1]; late > 1.5*early+1e-6 {
					t.Errorf("%s: gap grew from %.4g (first 20 rounds) to %.4g", name, early, late)
				}
			case mode == EF21:
				// g converges to x, so the gap settles at a constant.
				if late, mid := gap[rounds-1], gap[rounds/2]; late > 1.5*early+1e-6 && late > mid*1.01 {
					t.Errorf("%s: gap %.4g at round %d, %.4g at the end", name, mid, rounds/2, late)
				}
			default:
				if gap[rounds-1] < 100*gap[0] {
					t.Errorf("%s: without feedback gap went %.4g -> %.4g, expected linear growth", name, gap[0], gap[rounds-1])
				}
			}
		}
	}
}

// Error feedback state survives a restart: saving after round k and loading
// into a fresh state gives the same bytes afterwards.
func TestErrorFeedbackRestart(t *testing.T) {
	const n = 3000
	cfg := testConfig(Int4, true, 1)
	cfg.ChunkElems = 1024
	enc, _ := NewEncoder(cfg)
	for _, mode := range []FeedbackMode{EF, EF21} {
		a, _ := NewErrorFeedback(mode, n)
		var saved []byte
		var tail [][]byte
		for r := range 10 {
			x := gaussian(n, uint64(r))
			if r == 5 {
				saved, _ = a.MarshalBinary()
			}
			var buf bytes.Buffer
			if err := a.Encode(enc, &buf, x, uint64(r)); err != nil {
				t.Fatal(err)
			}
			if r >= 5 {
				tail = append(tail, buf.Bytes())
			}
		}
		var b ErrorFeedback
		if err := b.UnmarshalBinary(saved); err != nil {
			t.Fatal(err)
		}
		c, _ := NewErrorFeedback(mode, n)
		if _, err := c.ReadFrom(bytes.NewReader(saved)); err != nil {
			t.Fatal(err)
		}
		for r := 5; r < 10; r++ {
			x := gaussian(n, uint64(r))
			for _, f := range []*ErrorFeedback{&b, c} {
				var buf bytes.Buffer
				if err := f.Encode(enc, &buf, x, uint64(r)); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf.Bytes(), tail[r-5]) {
					t.Fatalf("%v: round %d differs after restart", mode, r)
				}
			}
		}
	}
}

// Steady-state encoding and decoding of a one-chunk message allocates nothing.
func TestNoAllocSteadyState(t *testing.T) {
	x := gaussian(100_000, 1)
	for _, c := range Codecs() {
		cfg := testConfig(c, true, 3)
		enc, _ := NewEncoder(cfg)
		dec, _ := NewDecoder(cfg)
		frame, _ := enc.Append(nil, x, 1)
		y, _ := dec.DecodeBytes(frame, nil)
		allocs := testing.AllocsPerRun(20, func() {
			frame, _ = enc.Append(frame[:0], x, 1)
			y, _ = dec.DecodeBytes(frame, y)
		})
		if allocs > 0 {
			t.Errorf("%v: %.1f allocations per encode+decode", c, allocs)
		}
	}
}

// The sign codec's nearest rounding keeps each block's projection: the
// decoded block d has <d, x> = |x|^2, whatever the values' distribution
// (Gaussian, uniform like a sum of Adam steps, heavy-tailed), for whole
// blocks and a short last one. The mean |x| would shrink it by (sum |x|)^2
// / (n sum x^2): 2/pi, 3/4 and far less here, so a scale that shrinks
// fails the test.
func TestSignKeepsProjection(t *testing.T) {
	const block, n = 1024, 5*1024 + 200
	g := gaussian(n, 21)
	dists := map[string]func(i int) float32{
		"gaussian":     func(i int) float32 { return g[i] },
		"uniform":      func(i int) float32 { return float32(2*math.Mod(float64(i)*0.6180339887, 1) - 1) },
		"heavy-tailed": func(i int) float32 { return g[i] * g[i] * g[i] },
	}
	for name, f := range dists {
		x := make([]float32, n)
		for i := range x {
			x[i] = f(i)
		}
		cfg := testConfig(Sign, false, 1)
		cfg.BlockSize = block
		y, _ := roundTrip(t, cfg, x, 1)
		for lo := 0; lo < n; lo += block {
			hi := min(lo+block, n)
			var dot, sq float64
			for i := lo; i < hi; i++ {
				dot += float64(y[i]) * float64(x[i])
				sq += float64(x[i]) * float64(x[i])
			}
			if r := dot / sq; math.Abs(r-1) > 1e-5 {
				t.Errorf("%s, block at %d: <d, x>/|x|^2 = %.6f, want 1", name, lo, r)
			}
		}
	}
}
