package kernels

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/skein-ml/skein/kernels/internal/blasref"
)

// benchShape is one GEMM the model runs, named for its role.
type benchShape struct {
	name           string
	transA, transB bool
	M, N, K        int
	beta           float32
}

// benchShapes: 1024^3, the matmuls of the tiny (C=128) and small (C=384)
// models at N = B*T = 2048 rows (qkv, attention projection, fc, vocabulary
// and the reverse fc_proj), each as forward (transB), dinp (NN, beta=1) and
// dW (transA, K=N, beta=1), and per-head attention products.
func benchShapes() []benchShape {
	shapes := []benchShape{{"sq1024", false, false, 1024, 1024, 1024, 0}}
	const n = 2048
	for _, m := range []struct {
		name string
		c    int
		ocs  []int
	}{
		{"tiny", 128, []int{384, 128, 512, 256}},
		{"small", 384, []int{1152, 384, 1536, 256}},
	} {
		for _, oc := range m.ocs {
			c := m.c
			shapes = append(shapes,
				benchShape{fmt.Sprintf("%s_fwd_C%d_OC%d", m.name, c, oc), false, true, n, oc, c, 0},
				benchShape{fmt.Sprintf("%s_dinp_C%d_OC%d", m.name, c, oc), false, false, n, c, oc, 1},
				benchShape{fmt.Sprintf("%s_dW_C%d_OC%d", m.name, c, oc), true, false, oc, c, n, 1},
			)
		}
		// fc_proj: C = 4*channels in, channels out.
		c4 := 4 * m.c
		shapes = append(shapes,
			benchShape{fmt.Sprintf("%s_fwd_C%d_OC%d", m.name, c4, m.c), false, true, n, m.c, c4, 0},
			benchShape{fmt.Sprintf("%s_dinp_C%d_OC%d", m.name, c4, m.c), false, false, n, c4, m.c, 1},
			benchShape{fmt.Sprintf("%s_dW_C%d_OC%d", m.name, c4, m.c), true, false, m.c, c4, n, 1},
		)
	}
	for _, t := range []int{128, 256} {
		for _, hs := range []int{32, 64} {
			shapes = append(shapes,
				// preatt = q @ k^T; out = att @ v; dk = datt^T @ q.
				benchShape{fmt.Sprintf("att_qk_T%d_hs%d", t, hs), false, true, t, t, hs, 0},
				benchShape{fmt.Sprintf("att_av_T%d_hs%d", t, hs), false, false, t, hs, t, 0},
				benchShape{fmt.Sprintf("att_dk_T%d_hs%d", t, hs), true, false, t, hs, t, 1},
			)
		}
	}
	return shapes
}

// BenchmarkSgemm runs every shape with our kernel and, when libopenblas.so.0
// can be loaded, with OpenBLAS's cblas_sgemm on the same data, reporting
// GFLOPS. Run with and without OPENBLAS_CORETYPE to see both of OpenBLAS's
// kernels (the name reported in the openblas=... element).
func BenchmarkSgemm(b *testing.B) {
	blasErr := blasref.Load()
	blasName := "openblas"
	if blasErr == nil {
		blasName = "openblas-" + blasref.CoreName()
	}
	b.Logf("skein gemm ISA %s; OPENBLAS_CORETYPE=%q; %s", GemmISA(), os.Getenv("OPENBLAS_CORETYPE"), blasName)
	for _, s := range benchShapes() {
		threadCounts := []int{1}
		if s.name == "sq1024" {
			threadCounts = []int{1, 2}
		}
		for _, threads := range threadCounts {
			c := gemmCase{transA: s.transA, transB: s.transB, M: s.M, N: s.N, K: s.K, alpha: 1, beta: s.beta}
			o := newOperands(c, rand.New(rand.NewPCG(1, uint64(s.M*s.N+s.K))))
			for i := range o.c {
				o.c[i] = 0
			}
			flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)
			prefix := fmt.Sprintf("%s/threads=%d", s.name, threads)
			b.Run(prefix+"/impl=skein", func(b *testing.B) {
				measureGemm(b, flops, threads, func() {
					Sgemm(s.transA, s.transB, s.M, s.N, s.K, 1, o.a, o.lda, o.b, o.ldb, s.beta, o.c, o.ldc, threads)
				})
			})
			b.Run(prefix+"/impl="+blasName, func(b *testing.B) {
				if blasErr != nil {
					b.Skipf("OpenBLAS reference skipped: %v", blasErr)
				}
				blasref.SetThreads(threads)
				measureGemm(b, flops, threads, func() {
					blasref.Sgemm(s.transA, s.transB, s.M, s.N, s.K, 1, o.a, o.lda, o.b, o.ldb, s.beta, o.c, o.ldc)
				})
			})
		}
	}
}

// measureGemm runs call in the benchmark loop and reports GFLOPS over wall
// time and, for one thread, GFLOPS-cpu over the calling thread's CPU time:
// both libraries then compute on the calling thread, and CPU time is robust
// to other processes sharing the cores.
func measureGemm(b *testing.B, flops float64, threads int, call func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0, cpuOK := threadCPUTime()
	for b.Loop() {
		call()
	}
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOPS")
	if cpu1, ok := threadCPUTime(); threads == 1 && cpuOK && ok && cpu1 > cpu0 {
		b.ReportMetric(flops*float64(b.N)/(cpu1-cpu0).Seconds()/1e9, "GFLOPS-cpu")
	}
}

// threadCPUTime is the CPU time of the calling OS thread (Linux
// RUSAGE_THREAD); ok is false where that is unavailable.
func threadCPUTime() (d time.Duration, ok bool) {
	const rusageThread = 1
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
