package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// gemmCase is one Sgemm call; ldPad is added to every leading dimension.
type gemmCase struct {
	transA, transB bool
	M, N, K        int
	alpha, beta    float32
	ldPad          int
}

func (c gemmCase) String() string {
	t := func(b bool) string {
		if b {
			return "T"
		}
		return "N"
	}
	return fmt.Sprintf("%s%s_%dx%dx%d_a%g_b%g_pad%d", t(c.transA), t(c.transB), c.M, c.N, c.K,
		c.alpha, c.beta, c.ldPad)
}

// gemmOperands holds the matrices of one case, with their leading dimensions.
type gemmOperands struct {
	a, b, c       []float32
	lda, ldb, ldc int
}

func newOperands(c gemmCase, rng *rand.Rand) gemmOperands {
	aRows, aCols := c.M, c.K
	if c.transA {
		aRows, aCols = c.K, c.M
	}
	bRows, bCols := c.K, c.N
	if c.transB {
		bRows, bCols = c.N, c.K
	}
	o := gemmOperands{lda: aCols + c.ldPad, ldb: bCols + c.ldPad, ldc: c.N + c.ldPad}
	fill := func(rows, ld int) []float32 {
		x := make([]float32, rows*ld)
		for i := range x {
			x[i] = rng.Float32()*2 - 1
		}
		return x
	}
	o.a = fill(aRows, o.lda)
	o.b = fill(bRows, o.ldb)
	o.c = fill(c.M, o.ldc)
	if c.beta == 0 {
		// beta = 0 must ignore C entirely, NaN included.
		for i := range c.M {
			for j := range c.N {
				o.c[i*o.ldc+j] = float32(math.NaN())
			}
		}
	}
	// Padding past column N of C is a sentinel the call must not touch.
	for i := range c.M {
		for j := c.N; j < o.ldc; j++ {
			o.c[i*o.ldc+j] = 12345
		}
	}
	return o
}

// refGemm computes the case in float64 and, per element, the bound
// sum_k |alpha a_ik b_kj| + |beta c_ij| used to scale the tolerance.
func refGemm(c gemmCase, o gemmOperands) (want, bound []float64) {
	want = make([]float64, c.M*c.N)
	bound = make([]float64, c.M*c.N)
	for i := range c.M {
		for j := range c.N {
			var s, abs float64
			for k := range c.K {
				var a, b float64
				if c.transA {
					a = float64(o.a[k*o.lda+i])
				} else {
					a = float64(o.a[i*o.lda+k])
				}
				if c.transB {
					b = float64(o.b[j*o.ldb+k])
				} else {
					b = float64(o.b[k*o.ldb+j])
				}
				s += a * b
				abs += math.Abs(a * b)
			}
			v := float64(c.alpha) * s
			bd := math.Abs(float64(c.alpha)) * abs
			if c.beta != 0 {
				old := float64(o.c[i*o.ldc+j])
				v += float64(c.beta) * old
				bd += math.Abs(float64(c.beta) * old)
			}
			want[i*c.N+j] = v
			bound[i*c.N+j] = bd
		}
	}
	return want, bound
}

// checkGemm runs one case and compares it with the float64 reference.
// Tolerance: |got - want| <= (K+2) * 2^-23 * bound, the classical
// worst-case error of a length-K float32 dot product plus the alpha/beta
// update. A wrong index or a lost term misses it by orders of magnitude.
func checkGemm(t *testing.T, c gemmCase, threads int, rng *rand.Rand) {
	t.Helper()
	o := newOperands(c, rng)
	want, bound := refGemm(c, o)
	got := append([]float32(nil), o.c...)
	Sgemm(c.transA, c.transB, c.M, c.N, c.K, c.alpha, o.a, o.lda, o.b, o.ldb, c.beta, got, o.ldc, threads)
	eps := float64(c.K+2) * math.Pow(2, -23)
	bad := 0
	for i := range c.M {
		for j := range c.N {
			g := float64(got[i*o.ldc+j])
			w := want[i*c.N+j]
			if !(math.Abs(g-w) <= eps*bound[i*c.N+j]+1e-30) {
				if bad < 3 {
					t.Errorf("%v threads=%d isa=%s: C[%d,%d] = %g, want %g (tol %g)",
						c, threads, GemmISA(), i, j, g, w, eps*bound[i*c.N+j])
				}
				bad++
			}
		}
		for j := c.N; j < o.ldc; j++ {
			if got[i*o.ldc+j] != 12345 {
				t.Fatalf("%v: wrote C[%d,%d] past column N (ldc=%d)", c, i, j, o.ldc)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%v threads=%d isa=%s: %d of %d elements out of tolerance", c, threads, GemmISA(), bad, c.M*c.N)
	}
}

// isaPaths lists the instruction sets this CPU can run, best last.
func isaPaths() []string {
	var paths []string
	for _, name := range []string{"portable", "avx2", "avx512"} {
		if forceGemmISA(name) == nil {
			paths = append(paths, name)
		}
	}
	if err := forceGemmISA(""); err != nil {
		panic(err)
	}
	return paths
}

// forEachISA runs f with Sgemm forced to every supported instruction set.
func forEachISA(t *testing.T, f func(t *testing.T)) {
	paths := isaPaths()
	t.Logf("gemm ISA paths on this CPU: %v (default %s)", paths, GemmISA())
	for _, name := range paths {
		t.Run(name, func(t *testing.T) {
			if err := forceGemmISA(name); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = forceGemmISA("") }()
			if got := GemmISA(); got != name {
				t.Fatalf("GemmISA() = %q after forcing %q", got, name)
			}
			f(t)
		})
	}
}

func TestSgemmMatchesReference(t *testing.T) {
	sizes := [][3]int{
		{1, 1, 1}, {1, 7, 3}, {7, 1, 5}, {7, 17, 33}, {17, 33, 7}, {33, 7, 17},
		{12, 32, 64}, {13, 33, 65}, {100, 100, 100}, {48, 64, 257}, {257, 31, 300},
		{5, 300, 600}, {64, 96, 513}, {25, 4100, 3},
	}
	coefs := [][2]float32{{1, 0}, {1, 1}, {0.5, -1.5}, {-2, 0}}
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, s := range sizes {
			for tr := range 4 {
				for ci, co := range coefs {
					c := gemmCase{transA: tr&1 != 0, transB: tr&2 != 0, M: s[0], N: s[1], K: s[2],
						alpha: co[0], beta: co[1], ldPad: (ci + tr) % 3 * 5}
					checkGemm(t, c, 1+(ci+tr)%3, rng)
				}
			}
		}
	})
}

func TestSgemmModelShapes(t *testing.T) {
	// The matmul forward and backward of the tiny model at N = 256 rows.
	const n, ch, oc = 256, 128, 384
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		checkGemm(t, gemmCase{false, true, n, oc, ch, 1, 0, 0}, 2, rng)  // out = inp @ W^T
		checkGemm(t, gemmCase{false, false, n, ch, oc, 1, 1, 0}, 2, rng) // dinp += dout @ W
		checkGemm(t, gemmCase{true, false, oc, ch, n, 1, 1, 0}, 2, rng)  // dW += dout^T @ inp
	})
}

func TestSgemmZeroK(t *testing.T) {
	c := []float32{1, 2, 3, 4}
	Sgemm(false, false, 2, 2, 0, 1, nil, 0, nil, 0, 3, c, 2, 1)
	for i, want := range []float32{3, 6, 9, 12} {
		if c[i] != want {
			t.Fatalf("K=0, beta=3: C = %v, want [3 6 9 12]", c)
		}
	}
	c[0] = float32(math.NaN())
	Sgemm(false, false, 2, 2, 0, 1, nil, 0, nil, 0, 0, c, 2, 1)
	for _, v := range c {
		if v != 0 {
			t.Fatalf("K=0, beta=0: C = %v, want zeros", c)
		}
	}
}

// TestSgemmThreadsBitIdentical checks that 1, 2 and 3 threads give the same
// bits, on shapes that split M, split N, and span several KC blocks.
func TestSgemmThreadsBitIdentical(t *testing.T) {
	shapes := [][3]int{{300, 260, 700}, {12, 2000, 300}, {2048, 128, 384}, {384, 128, 2048}, {97, 101, 103}}
	forEachISA(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for _, s := range shapes {
			for tr := range 4 {
				c := gemmCase{transA: tr&1 != 0, transB: tr&2 != 0, M: s[0], N: s[1], K: s[2],
					alpha: 0.75, beta: 1, ldPad: 3}
				o := newOperands(c, rng)
				var first []float32
				for _, threads := range []int{1, 2, 3} {
					got := append([]float32(nil), o.c...)
					Sgemm(c.transA, c.transB, c.M, c.N, c.K, c.alpha, o.a, o.lda, o.b, o.ldb, c.beta,
						got, o.ldc, threads)
					if first == nil {
						first = got
						continue
					}
					for i := range got {
						if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
							t.Fatalf("%v: threads=%d differs from threads=1 at %d: %g vs %g",
								c, threads, i, got[i], first[i])
						}
					}
				}
			}
		}
	})
}

// TestSgemmConcurrentCallers checks that calls from several goroutines at
// once (each with its own thread-local packing buffers) do not interfere.
func TestSgemmConcurrentCallers(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	c := gemmCase{M: 200, N: 150, K: 300, alpha: 1, beta: 0}
	o := newOperands(c, rng)
	want := make([]float32, len(o.c))
	Sgemm(false, false, c.M, c.N, c.K, 1, o.a, o.lda, o.b, o.ldb, 0, want, o.ldc, 1)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				got := make([]float32, len(o.c))
				Sgemm(false, false, c.M, c.N, c.K, 1, o.a, o.lda, o.b, o.ldb, 0, got, o.ldc, 1+g%2)
				for i := range got {
					if got[i] != want[i] {
						errs <- fmt.Sprintf("goroutine %d: C[%d] = %g, want %g", g, i, got[i], want[i])
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestSgemmPanicsOnShortSlices(t *testing.T) {
	a, b, c := make([]float32, 6), make([]float32, 6), make([]float32, 6)
	cases := []struct {
		name string
		call func()
		want string
	}{
		{"short A", func() { Sgemm(false, false, 2, 2, 3, 1, a[:5], 3, b, 2, 0, c, 2, 1) }, "A has 5 elements"},
		{"short B", func() { Sgemm(false, false, 2, 2, 3, 1, a, 3, b[:3], 2, 0, c, 2, 1) }, "B has 3 elements"},
		{"short C", func() { Sgemm(false, false, 2, 2, 3, 1, a, 3, b, 2, 0, c[:3], 2, 1) }, "C has 3 elements"},
		{"transposed A", func() { Sgemm(true, false, 3, 2, 2, 1, a, 2, b, 2, 0, c, 2, 1) }, "ldA=2 smaller"},
		{"small ldc", func() { Sgemm(false, false, 2, 2, 3, 1, a, 3, b, 2, 0, c, 1, 1) }, "ldC=1 smaller"},
		{"negative", func() { Sgemm(false, false, -1, 2, 3, 1, a, 3, b, 2, 0, c, 2, 1) }, "negative dimension"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg, _ := r.(string)
				if !strings.Contains(msg, tc.want) {
					t.Fatalf("panic %v, want a message containing %q", r, tc.want)
				}
			}()
			tc.call()
		})
	}
}

func TestGemmISA(t *testing.T) {
	isa := GemmISA()
	if isa != "avx512" && isa != "avx2" && isa != "portable" {
		t.Fatalf("GemmISA() = %q", isa)
	}
	if err := forceGemmISA("sse9"); err == nil {
		t.Fatal(`forceGemmISA("sse9") succeeded`)
	}
	if GemmISA() != isa {
		t.Fatalf("a failed force changed the ISA to %q", GemmISA())
	}
}

// TestGemmISAEnv runs this test binary again with SKEIN_GEMM_ISA=portable
// and checks that the child chose the portable path.
func TestGemmISAEnv(t *testing.T) {
	if os.Getenv("SKEIN_GEMM_ISA_CHILD") == "1" {
		fmt.Printf("isa=%s\n", GemmISA())
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGemmISAEnv$")
	cmd.Env = append(os.Environ(), "SKEIN_GEMM_ISA_CHILD=1", "SKEIN_GEMM_ISA=portable")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "isa=portable") {
		t.Fatalf("SKEIN_GEMM_ISA=portable: child reported %q", out)
	}
}
