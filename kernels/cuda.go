package kernels

// #include <stdlib.h>
// #include "cuda_driver.h"
import "C"

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// The CUDA backend: a Device whose buffers live in GPU memory. Nothing of
// CUDA is needed to build it: the driver API (libcuda.so.1) and cuBLAS are
// loaded at run time with dlopen (cuda_driver.c, our own declarations),
// and every kernel is PTX compiled ahead of time by clang from
// cuda/kernels.cu and embedded, which the driver JIT-compiles for the GPU
// present. The element-wise and row-wise kernels share their source with a
// CPU build that the ordinary tests hold to the CPU backend
// (ewise_kernels.h); the GEMMs run on cuBLAS (TF32 tensor cores unless
// CUDAConfig.FP32, fp32 accumulate) or, without it, on our tiled kernel;
// the materialized attention is GEMMs and row kernels (gemm_plan.go), the
// fused one (which the GPU prefers) row kernels alone. Parameters,
// gradients, moments and activations stay on the GPU across steps: only
// CopyIn, CopyOut, the token ids and SumSquares's partial sums cross the bus.

//go:generate clang -x cuda --cuda-device-only --cuda-gpu-arch=sm_60 -nocudainc -nocudalib -O3 -S -Xclang -target-feature -Xclang +ptx70 -o cuda/kernels.ptx cuda/kernels.cu

// ptxFlags are go:generate's clang flags (TestPTXUpToDate runs them).
var ptxFlags = []string{"-x", "cuda", "--cuda-device-only", "--cuda-gpu-arch=sm_60", "-nocudainc", "-nocudalib", "-O3", "-S",
	"-Xclang", "-target-feature", "-Xclang", "+ptx70"} // PTX 7.0: the warp shuffles

// ewisePTX is cuda/kernels.ptx, for sm_60 (Pascal) and every later GPU:
// the driver JIT-compiles PTX forward, and the kernels use nothing newer
// (warp shuffles, fast exp2/log2). cuBLAS uses TF32 only where the GPU
// has it (sm_80 on) and plain fp32 before.
//
//go:embed cuda/kernels.ptx
var ewisePTX []byte

// cudaKernels are the entry points of ewisePTX.
var cudaKernels = []string{"sk_gelu_forward", "sk_gelu_backward", "sk_residual_forward", "sk_residual_backward",
	"sk_scale", "sk_adamw", "sk_adamw_segments", "sk_layernorm_forward", "sk_layernorm_backward_dinp",
	"sk_softmax_xent_forward", "sk_softmax_xent_backward", "sk_softmax_xent_fused", "sk_residual_layernorm_forward", "sk_encoder_forward", "sk_encoder_backward_wte",
	"sk_encoder_backward_wpe",
	"sk_attention_softmax", "sk_attention_softmax_backward",
	"sk_flash_attention_forward", "sk_flash_attention_backward_q", "sk_flash_attention_backward_kv",
	"sk_bias_add", "sk_bias_backward_part",
	"sk_bias_backward_sum", "sk_layernorm_dparams_part", "sk_layernorm_dparams_sum", "sk_sumsq_parts", "sk_gemm_tiled"}

// ErrNoCUDA is returned (wrapped) when there is no usable NVIDIA GPU: no
// driver, no device, or a device the driver refuses.
var ErrNoCUDA = errors.New("kernels: no CUDA GPU")

// ErrDevice is the sticky error of a device that failed at run time (a
// kernel, a copy, memory exhausted): see Err.
var ErrDevice = errors.New("kernels: device failed")

// CUDAConfig says which GPU and how its GEMMs run.
type CUDAConfig struct {
	// Ordinal is the GPU's index (cuda:N).
	Ordinal int
	// FP32 keeps the GEMMs in full single precision. By default cuBLAS may
	// round their inputs to TF32 on the tensor cores (fp32 accumulate):
	// about 3e-4 relative error per product, several times the speed.
	FP32 bool
	// FusedAttention makes the model use the fused attention
	// (FlashAttention* methods: no (B,NH,T,T) matrices, recompute in the
	// backward) instead of the GEMM path with materialised scores. Off by
	// default until a GPU has timed it against that path (issue [4/4]:
	// BenchmarkCUDAOps' attention and flash-attention lines); it saves the
	// memory of the scores either way.
	FusedAttention bool
	// NoCUBLAS runs the GEMMs on our tiled kernel even where cuBLAS is
	// present (tests; a cuBLAS that misbehaves).
	NoCUBLAS bool
	// CUBLASPath, if set, is tried before the usual library names
	// (libcublas.so.13, .12, .11); SKEIN_CUBLAS in the environment is the
	// default. cuBLAS is loaded once per process: only the first NewCUDA
	// that asks for it chooses.
	CUBLASPath string
}

// sumsqParts is how many partial sums SumSquares reduces on the GPU; the
// host adds them in order (deterministic for a given length).
const sumsqParts = 1 << 16

// CUDA is one GPU as a Device. Every method may be called from any
// goroutine (calls are serialized); kernels are queued on the GPU in call
// order and CopyOut and SumSquares wait for them.
//
// The Device interface returns no errors: a failure on the GPU (a kernel
// fault, memory exhausted) is kept as a sticky error that Err returns and
// that turns every later call into a no-op. Callers check Err (through
// kernels.Err) after the values they read back, as model.Stage does.
type CUDA struct {
	cfg  CUDAConfig
	name string
	gemm string // what runs the GEMMs, for Name

	mu     sync.Mutex
	ctx    unsafe.Pointer
	mod    unsafe.Pointer
	blas   unsafe.Pointer // cublasHandle_t, nil: sk_gemm_tiled
	fns    map[string]unsafe.Pointer
	err    error
	params *[32]unsafe.Pointer // C memory: one launch's parameter pointers
	cells  *[32]uint64         // C memory: their values
	ids    *gpuMem             // token ids and targets, grown on demand
	segTab []int32             // AdamWSegments' table, reused under mu
	part   *gpuMem             // column sums' partial sums, grown on demand
	groups groupScratch        // the encoder backward's grouping of rows by token
	parts  *gpuMem             // SumSquares's partial sums (doubles)
	host   []float64
}

var _ Device = (*CUDA)(nil)

var cudaLoad struct {
	once sync.Once
	err  error
}

// cublasLoad serializes the loading of cuBLAS: the first call's outcome
// (and library) holds for the process.
var cublasLoad struct {
	sync.Mutex
	done bool
	msg  string
}

// loadCUBLAS loads cuBLAS once ("" on success, else why not); path is
// tried first on that first call only.
func loadCUBLAS(path string) string {
	cublasLoad.Lock()
	defer cublasLoad.Unlock()
	if !cublasLoad.done {
		cp := C.CString(path)
		if msg := C.skcb_load(cp); msg != nil {
			cublasLoad.msg = C.GoString(msg)
		}
		C.free(unsafe.Pointer(cp))
		cublasLoad.done = true
	}
	return cublasLoad.msg
}

func loadDriver() error {
	cudaLoad.once.Do(func() {
		if msg := C.skcu_load(); msg != nil {
			cudaLoad.err = fmt.Errorf("%w: %s", ErrNoCUDA, C.GoString(msg))
			return
		}
		if rc := C.skcu_init(); rc != 0 {
			cudaLoad.err = fmt.Errorf("%w: cuInit: %s", ErrNoCUDA, cuErr(rc))
		}
	})
	return cudaLoad.err
}

func cuErr(rc C.int) string { return fmt.Sprintf("%s (%d)", C.GoString(C.skcu_error(rc)), int(rc)) }

// OpenCUDA opens GPU ordinal with the default configuration.
func OpenCUDA(ordinal int) (*CUDA, error) { return NewCUDA(CUDAConfig{Ordinal: ordinal}) }

// NewCUDA opens a GPU: a context, the kernels loaded and cuBLAS if it can
// be found (if not, the tiled GEMM, and Name says why).
func NewCUDA(cfg CUDAConfig) (*CUDA, error) {
	if err := loadDriver(); err != nil {
		return nil, err
	}
	var n C.int
	if rc := C.skcu_device_count(&n); rc != 0 {
		return nil, fmt.Errorf("%w: cuDeviceGetCount: %s", ErrNoCUDA, cuErr(rc))
	}
	if cfg.Ordinal < 0 || cfg.Ordinal >= int(n) {
		return nil, fmt.Errorf("%w: cuda:%d asked for, %d GPU(s) present", ErrNoCUDA, cfg.Ordinal, int(n))
	}
	runtime.LockOSThread() // the context is current on this thread while it is set up
	defer runtime.UnlockOSThread()
	c := &CUDA{cfg: cfg, fns: map[string]unsafe.Pointer{}}
	var name [256]C.char
	if rc := C.skcu_device_name(C.int(cfg.Ordinal), &name[0], C.int(len(name))); rc == 0 {
		c.name = C.GoString(&name[0])
	}
	if rc := C.skcu_ctx_create(&c.ctx, C.int(cfg.Ordinal)); rc != 0 {
		return nil, fmt.Errorf("%w: cuCtxCreate on cuda:%d: %s", ErrNoCUDA, cfg.Ordinal, cuErr(rc))
	}
	c.params = (*[32]unsafe.Pointer)(C.calloc(32, C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	c.cells = (*[32]uint64)(C.calloc(32, 8))
	ptx := C.CString(string(ewisePTX))
	defer C.free(unsafe.Pointer(ptx))
	if rc := C.skcu_module_load(&c.mod, ptx); rc != 0 {
		c.closeLocked()
		return nil, fmt.Errorf("%w: loading the kernels' PTX on %s: %s", ErrNoCUDA, c.name, cuErr(rc))
	}
	for _, fn := range cudaKernels {
		cs := C.CString(fn)
		var f unsafe.Pointer
		rc := C.skcu_function(&f, c.mod, cs)
		C.free(unsafe.Pointer(cs))
		if rc != 0 {
			c.closeLocked()
			return nil, fmt.Errorf("%w: kernel %s: %s", ErrNoCUDA, fn, cuErr(rc))
		}
		c.fns[fn] = f
	}
	c.gemm = "tiled gemm (cuBLAS not asked for)"
	if !cfg.NoCUBLAS {
		path := cfg.CUBLASPath
		if path == "" {
			path = os.Getenv("SKEIN_CUBLAS")
		}
		if msg := loadCUBLAS(path); msg != "" {
			c.gemm = "tiled gemm (" + msg + ")"
		} else {
			var ver C.int
			tf32 := C.int(1)
			if cfg.FP32 {
				tf32 = 0
			}
			if rc := C.skcb_create(&c.blas, tf32, &ver); rc != 0 {
				c.blas = nil
				c.gemm = fmt.Sprintf("tiled gemm (cublasCreate failed: status %d)", int(rc))
			} else {
				mode := "tf32"
				if cfg.FP32 {
					mode = "fp32"
				}
				c.gemm = fmt.Sprintf("cublas %d.%d %s", int(ver)/10000, int(ver)%10000/100, mode)
			}
		}
	}
	if c.parts = c.allocLocked(2 * sumsqParts); c.err != nil {
		err := c.err
		c.closeLocked()
		return nil, err
	}
	c.host = make([]float64, sumsqParts)
	return c, nil
}

// Name is "cuda:N (GPU model, what runs the GEMMs)".
func (c *CUDA) Name() string { return fmt.Sprintf("cuda:%d (%s, %s)", c.cfg.Ordinal, c.name, c.gemm) }

// GPU is the GPU's model name, as the driver gives it.
func (c *CUDA) GPU() string { return c.name }

// Threads is 1: the GPU's parallelism is not the host's.
func (c *CUDA) Threads() int { return 1 }

// Err is the first failure on the GPU, wrapping ErrDevice; nil while all is
// well. Once set, every call is a no-op.
func (c *CUDA) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// MemInfo is the GPU's free and total memory in bytes.
func (c *CUDA) MemInfo() (free, total uint64, err error) {
	err = c.do(func() error {
		var f, t C.size_t
		if rc := C.skcu_meminfo(&f, &t); rc != 0 {
			return fmt.Errorf("cuMemGetInfo: %s", cuErr(rc))
		}
		free, total = uint64(f), uint64(t)
		return nil
	})
	return free, total, err
}

// Close frees the context and everything in it; buffers of c must not be
// used after.
func (c *CUDA) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	c.closeLocked()
}

func (c *CUDA) closeLocked() {
	if c.ctx == nil {
		return
	}
	C.skcu_ctx_set(c.ctx)
	if c.blas != nil {
		C.skcb_destroy(c.blas)
		c.blas = nil
	}
	if c.mod != nil {
		C.skcu_module_unload(c.mod)
	}
	C.skcu_ctx_destroy(c.ctx)
	c.ctx, c.mod = nil, nil
	C.free(unsafe.Pointer(c.params))
	C.free(unsafe.Pointer(c.cells))
	c.params, c.cells = nil, nil
	if c.err == nil {
		c.err = fmt.Errorf("%w: closed", ErrDevice)
	}
}

// gpuMem is one allocation; buffers are views of it. It is freed when no
// view of it is left (a finalizer) or with the context.
type gpuMem struct {
	c   *CUDA
	ptr C.ulonglong
	n   int
}

// GPUBuffer is a view of n float32s of GPU memory.
type GPUBuffer struct {
	mem *gpuMem
	off int
	n   int
}

// Len is the buffer's length in float32s.
func (b *GPUBuffer) Len() int { return b.n }

// Slice returns the view [off, off+n).
func (b *GPUBuffer) Slice(off, n int) Buffer {
	if off < 0 || n < 0 || off+n > b.n {
		panic(fmt.Sprintf("kernels: slice [%d:%d] of a GPU buffer of %d", off, off+n, b.n))
	}
	return &GPUBuffer{mem: b.mem, off: b.off + off, n: n}
}

func (b *GPUBuffer) dptr() C.ulonglong { return b.mem.ptr + C.ulonglong(4*b.off) }

// do runs f with c's context current on a locked thread, unless c has
// failed; an error f returns becomes c's sticky error.
func (c *CUDA) do(f func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := C.skcu_ctx_set(c.ctx); rc != 0 {
		c.err = fmt.Errorf("%w: cuCtxSetCurrent: %s", ErrDevice, cuErr(rc))
		return c.err
	}
	if err := f(); err != nil {
		if !errors.Is(err, ErrDevice) {
			err = fmt.Errorf("%w: %s: %w", ErrDevice, c.Name(), err)
		}
		c.err = err
	}
	return c.err
}

// allocLocked allocates n zeroed float32s (n >= 1 bytes are reserved for n
// = 0); on failure it sets c.err and returns an empty allocation.
func (c *CUDA) allocLocked(n int) *gpuMem {
	m := &gpuMem{c: c, n: n}
	if c.err != nil {
		return m
	}
	if rc := C.skcu_alloc(&m.ptr, C.size_t(max(4*n, 4))); rc != 0 {
		c.err = fmt.Errorf("%w: %s: allocating %d MiB: %s", ErrDevice, c.name, (4*n)>>20, cuErr(rc))
		return m
	}
	if rc := C.skcu_memset32(m.ptr, 0, C.size_t(n)); rc != 0 {
		c.err = fmt.Errorf("%w: cuMemsetD32: %s", ErrDevice, cuErr(rc))
	}
	runtime.SetFinalizer(m, func(m *gpuMem) {
		m.c.mu.Lock()
		defer m.c.mu.Unlock()
		if m.c.ctx == nil || m.ptr == 0 {
			return
		}
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// Kernels queued before may still read it: wait for them (a
		// freed buffer is rare: scratch grown, a stage rebuilt).
		if C.skcu_ctx_set(m.c.ctx) == 0 && C.skcu_sync() == 0 {
			C.skcu_free(m.ptr)
		}
	})
	return m
}

// Alloc returns n zeroed float32s of GPU memory. Out of memory is c's
// sticky error (and the buffer is unusable).
func (c *CUDA) Alloc(n int) Buffer {
	var m *gpuMem
	c.do(func() error { m = c.allocLocked(n); return nil })
	if m == nil {
		m = &gpuMem{c: c, n: n}
	}
	return &GPUBuffer{mem: m, n: n}
}

// gbuf checks that b is a buffer of c of exactly want elements.
func (c *CUDA) gbuf(op, arg string, b Buffer, want int) *GPUBuffer {
	g, ok := b.(*GPUBuffer)
	if !ok || g.mem.c != c {
		panic(fmt.Sprintf("kernels: %s: %s is a %T, not a buffer of %s", op, arg, b, c.Name()))
	}
	if want >= 0 && g.n != want {
		panic(shapeError(op, arg, g.n, want))
	}
	return g
}

// Zero sets every element of b to 0.
func (c *CUDA) Zero(b Buffer) {
	g := c.gbuf("Zero", "b", b, -1)
	c.do(func() error {
		if rc := C.skcu_memset32(g.dptr(), 0, C.size_t(g.n)); rc != 0 {
			return fmt.Errorf("cuMemsetD32: %s", cuErr(rc))
		}
		return nil
	})
}

// CopyIn copies src into dst.
func (c *CUDA) CopyIn(dst Buffer, src []float32) {
	g := c.gbuf("CopyIn", "dst", dst, len(src))
	if len(src) == 0 {
		return
	}
	c.do(func() error {
		if rc := C.skcu_htod(g.dptr(), unsafe.Pointer(&src[0]), C.size_t(4*len(src))); rc != 0 {
			return fmt.Errorf("cuMemcpyHtoD: %s", cuErr(rc))
		}
		return nil
	})
}

// CopyOut waits for the queued kernels and copies src into dst. If the GPU
// has failed, dst is left as it was and Err says why.
func (c *CUDA) CopyOut(dst []float32, src Buffer) {
	g := c.gbuf("CopyOut", "src", src, len(dst))
	c.do(func() error {
		if rc := C.skcu_sync(); rc != 0 {
			return fmt.Errorf("a kernel failed: %s", cuErr(rc))
		}
		if len(dst) == 0 {
			return nil
		}
		if rc := C.skcu_dtoh(unsafe.Pointer(&dst[0]), g.dptr(), C.size_t(4*len(dst))); rc != 0 {
			return fmt.Errorf("cuMemcpyDtoH: %s", cuErr(rc))
		}
		return nil
	})
}

// uploadInts copies x into the ids scratch buffer (the copy from pageable
// memory waits for the kernels queued before it, which may still read the
// buffer).
func (c *CUDA) uploadInts(x []int32) C.ulonglong {
	if c.ids == nil || c.ids.n < len(x) {
		c.ids = c.allocLocked(max(len(x), 1024))
	}
	if c.err == nil && len(x) > 0 {
		if rc := C.skcu_htod(c.ids.ptr, unsafe.Pointer(&x[0]), C.size_t(4*len(x))); rc != 0 {
			c.err = fmt.Errorf("%w: cuMemcpyHtoD of token ids: %s", ErrDevice, cuErr(rc))
		}
	}
	return c.ids.ptr
}

// arg is one kernel parameter.
type arg = any

// launch queues kernel fn on a grid of gx*gy*gz blocks of bx threads;
// parameters are *GPUBuffer, C.ulonglong (a device pointer), float32, int
// (a C long) or int32.
func (c *CUDA) launch(fn string, gx, gy, gz, bx int, args ...arg) error {
	if c.err != nil {
		return c.err
	}
	for i, a := range args {
		p := unsafe.Pointer(&c.cells[i])
		switch v := a.(type) {
		case *GPUBuffer:
			*(*C.ulonglong)(p) = v.dptr()
		case C.ulonglong:
			*(*C.ulonglong)(p) = v
		case float32:
			*(*C.float)(p) = C.float(v)
		case int:
			*(*C.long)(p) = C.long(v)
		case int32:
			*(*C.int)(p) = C.int(v)
		default:
			return fmt.Errorf("kernels: parameter %d of %s: %T", i, fn, a)
		}
		c.params[i] = p
	}
	if rc := C.skcu_launch_grid(c.fns[fn], C.uint(gx), C.uint(gy), C.uint(gz), C.uint(bx), &c.params[0]); rc != 0 {
		return fmt.Errorf("launching %s: %s", fn, cuErr(rc))
	}
	return nil
}

// rowsOf queues a row kernel (SK_ROW_KERNEL): one warp per row.
func (c *CUDA) rowsOf(fn string, rows int, args ...arg) error {
	if rows <= 0 {
		return nil
	}
	return c.launch(fn, (rows+7)/8, 1, 1, 256, args...)
}

// partials returns scratch for n float32s of partial sums.
func (c *CUDA) partials(n int) *GPUBuffer {
	if c.part == nil || c.part.n < n {
		c.part = c.allocLocked(max(n, 1<<16))
	}
	return &GPUBuffer{mem: c.part, n: n}
}

// over queues fn with one thread per index in [0, n).
func (c *CUDA) over(fn string, n int, args ...arg) error {
	if n <= 0 {
		return nil
	}
	return c.launch(fn, (n+255)/256, 1, 1, 256, args...)
}

// dptrOf is the device address of an operand's first element.
func (c *CUDA) dptrOf(op string, o operand) C.ulonglong {
	return c.gbuf(op, "operand", o.buf, -1).dptr() + C.ulonglong(4*o.off)
}

// runGemm queues one planned GEMM: on cuBLAS, strided-batched over z2 and
// looped over z1; else on sk_gemm_tiled, one launch for all batches.
func (c *CUDA) runGemm(op string, g gemmOp) error {
	a, b, cc := c.dptrOf(op, g.a), c.dptrOf(op, g.b), c.dptrOf(op, g.c)
	if c.blas != nil {
		ta, lda := 0, g.a.rs
		if g.a.rs == 1 && g.a.cs != 1 {
			ta, lda = 1, g.a.cs
		}
		tb, ldb := 0, g.b.rs
		if g.b.rs == 1 && g.b.cs != 1 {
			tb, ldb = 1, g.b.cs
		}
		// A dimension of size 1 never uses its stride, but cuBLAS wants
		// every leading dimension at least the stored rows' length.
		if ta == 0 {
			lda = max(lda, g.K)
		} else {
			lda = max(lda, g.M)
		}
		if tb == 0 {
			ldb = max(ldb, g.N)
		} else {
			ldb = max(ldb, g.K)
		}
		for z1 := 0; z1 < g.nb1; z1++ {
			o := C.ulonglong(4 * z1)
			if rc := C.skcb_sgemm(c.blas, C.int(ta), C.int(tb), C.int(g.M), C.int(g.N), C.int(g.K), C.float(g.alpha),
				a+o*C.ulonglong(g.a.s1), C.int(lda), C.longlong(g.a.s2), b+o*C.ulonglong(g.b.s1), C.int(ldb), C.longlong(g.b.s2),
				C.float(g.beta), cc+o*C.ulonglong(g.c.s1), C.int(g.c.rs), C.longlong(g.c.s2), C.int(g.nb2)); rc != 0 {
				return fmt.Errorf("%s: cublasSgemmStridedBatched (%dx%dx%d): status %d", op, g.M, g.N, g.K, int(rc))
			}
		}
		return nil
	}
	// The grid's y and z are at most 65535 blocks: rows in slices of
	// 65535*64, batches in slices of whole z1 groups.
	const maxGrid = 65535
	if g.nb2 > maxGrid || (g.N+63)/64 > 1<<31-1 {
		return fmt.Errorf("%s: %d heads or %d columns exceed the tiled GEMM's grid", op, g.nb2, g.N)
	}
	per := max(maxGrid/g.nb2, 1) // z1 groups per launch
	for z1 := 0; z1 < g.nb1; z1 += per {
		nz := min(per, g.nb1-z1)
		for m0 := 0; m0 < g.M; m0 += maxGrid * 64 {
			m := min(maxGrid*64, g.M-m0)
			ao := C.ulonglong(4 * (z1*g.a.s1 + m0*g.a.rs))
			bo := C.ulonglong(4 * z1 * g.b.s1)
			co := C.ulonglong(4 * (z1*g.c.s1 + m0*g.c.rs))
			if err := c.launch("sk_gemm_tiled", (g.N+63)/64, (m+63)/64, nz*g.nb2, 256,
				int32(m), int32(g.N), int32(g.K), g.alpha,
				a+ao, g.a.rs, g.a.cs, g.a.s1, g.a.s2,
				b+bo, g.b.rs, g.b.cs, g.b.s1, g.b.s2,
				g.beta, cc+co, g.c.rs, g.c.s1, g.c.s2, int32(g.nb2)); err != nil {
				return err
			}
		}
	}
	return nil
}

// EncoderForward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
func (c *CUDA) EncoderForward(out Buffer, tokens []int32, wte, wpe Buffer, B, T, Ch int) {
	const op = "EncoderForward"
	if B <= 0 || T <= 0 || Ch <= 0 {
		positive(op, B, T, Ch)
	}
	o := c.gbuf(op, "out", out, B*T*Ch)
	we, V := c.rows(op, "wte", wte, 1, Ch)
	pe, _ := c.rows(op, "wpe", wpe, T, Ch)
	checkIDs(op, "tokens", tokens, B*T, V)
	c.do(func() error {
		tk := c.uploadInts(tokens)
		return c.over("sk_encoder_forward", B*T*Ch, o, tk, we, pe, int32(B), int32(T), int32(Ch))
	})
}

// EncoderBackward accumulates dout into the dwte rows of tokens and dwpe.
func (c *CUDA) EncoderBackward(dwte, dwpe, dout Buffer, tokens []int32, B, T, Ch int) {
	const op = "EncoderBackward"
	if B <= 0 || T <= 0 || Ch <= 0 {
		positive(op, B, T, Ch)
	}
	d := c.gbuf(op, "dout", dout, B*T*Ch)
	we, V := c.rows(op, "dwte", dwte, 1, Ch)
	pe, _ := c.rows(op, "dwpe", dwpe, T, Ch)
	checkIDs(op, "tokens", tokens, B*T, V)
	c.do(func() error {
		g := c.groups.group(tokens, V)
		p := c.uploadInts(g.packed)
		u := C.ulonglong(4 * g.u)
		if err := c.over("sk_encoder_backward_wte", g.u*Ch, we, d, p, p+u, p+2*u+4, int32(g.u), int32(Ch)); err != nil {
			return err
		}
		return c.over("sk_encoder_backward_wpe", T*Ch, pe, d, int32(B), int32(T), int32(Ch))
	})
}

// rows checks that b holds a whole number (at least min) of rows of Ch.
func (c *CUDA) rows(op, arg string, b Buffer, min, Ch int) (*GPUBuffer, int) {
	g := c.gbuf(op, arg, b, -1)
	return g, checkRows(op, arg, g.n, min, Ch)
}

// LayerNormForward normalizes N rows of C (eps 1e-5), saving mean and rstd.
func (c *CUDA) LayerNormForward(out, mean, rstd, inp, weight, bias Buffer, N, Ch int) {
	const op = "LayerNormForward"
	if N <= 0 || Ch <= 0 {
		positive(op, N, Ch)
	}
	args := []arg{c.gbuf(op, "out", out, N*Ch), c.gbuf(op, "mean", mean, N), c.gbuf(op, "rstd", rstd, N),
		c.gbuf(op, "inp", inp, N*Ch), c.gbuf(op, "weight", weight, Ch), c.gbuf(op, "bias", bias, Ch), int32(N), int32(Ch)}
	c.do(func() error { return c.rowsOf("sk_layernorm_forward", N, args...) })
}

// ResidualLayerNormForward: res = a + b, then its LayerNorm, one warp per
// row (Device).
func (c *CUDA) ResidualLayerNormForward(res, out, mean, rstd, a, b, weight, bias Buffer, N, Ch int) {
	const op = "ResidualLayerNormForward"
	if N <= 0 || Ch <= 0 {
		positive(op, N, Ch)
	}
	args := []arg{c.gbuf(op, "res", res, N*Ch), c.gbuf(op, "out", out, N*Ch), c.gbuf(op, "mean", mean, N), c.gbuf(op, "rstd", rstd, N),
		c.gbuf(op, "a", a, N*Ch), c.gbuf(op, "b", b, N*Ch), c.gbuf(op, "weight", weight, Ch), c.gbuf(op, "bias", bias, Ch), int32(N), int32(Ch)}
	c.do(func() error { return c.rowsOf("sk_residual_layernorm_forward", N, args...) })
}

// LayerNormBackward accumulates dinp, dweight and dbias.
func (c *CUDA) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd Buffer, N, Ch int) {
	const op = "LayerNormBackward"
	if N <= 0 || Ch <= 0 {
		positive(op, N, Ch)
	}
	dx, dw, db := c.gbuf(op, "dinp", dinp, N*Ch), c.gbuf(op, "dweight", dweight, Ch), c.gbuf(op, "dbias", dbias, Ch)
	d, x, w := c.gbuf(op, "dout", dout, N*Ch), c.gbuf(op, "inp", inp, N*Ch), c.gbuf(op, "weight", weight, Ch)
	m, r := c.gbuf(op, "mean", mean, N), c.gbuf(op, "rstd", rstd, N)
	c.do(func() error {
		if err := c.rowsOf("sk_layernorm_backward_dinp", N, dx, d, x, w, m, r, int32(N), int32(Ch)); err != nil {
			return err
		}
		np := colSumParts(N)
		part := c.partials(np * 2 * Ch)
		if err := c.over("sk_layernorm_dparams_part", np*Ch, part, d, x, m, r, int32(N), int32(Ch)); err != nil {
			return err
		}
		return c.over("sk_layernorm_dparams_sum", Ch, dw, db, part, int32(N), int32(Ch))
	})
}

// MatmulForward: out = inp @ weight^T + bias (bias may be nil).
func (c *CUDA) MatmulForward(out, inp, weight, bias Buffer, N, Ch, OC int) {
	const op = "MatmulForward"
	if N <= 0 || Ch <= 0 || OC <= 0 {
		positive(op, N, Ch, OC)
	}
	o := c.gbuf(op, "out", out, N*OC)
	c.gbuf(op, "inp", inp, N*Ch)
	c.gbuf(op, "weight", weight, OC*Ch)
	var bs *GPUBuffer
	if bias != nil {
		bs = c.gbuf(op, "bias", bias, OC)
	}
	g := matmulForwardPlan(out, inp, weight, N, Ch, OC)
	c.do(func() error {
		if err := c.runGemm(op, g); err != nil || bs == nil {
			return err
		}
		return c.over("sk_bias_add", N*OC, o, bs, N*OC, int32(OC))
	})
}

// MatmulBackward accumulates dinp, dweight and dbias (which may be nil).
func (c *CUDA) MatmulBackward(dinp, dweight, dbias, dout, inp, weight Buffer, N, Ch, OC int) {
	const op = "MatmulBackward"
	if N <= 0 || Ch <= 0 || OC <= 0 {
		positive(op, N, Ch, OC)
	}
	c.gbuf(op, "dinp", dinp, N*Ch)
	c.gbuf(op, "dweight", dweight, OC*Ch)
	d := c.gbuf(op, "dout", dout, N*OC)
	c.gbuf(op, "inp", inp, N*Ch)
	c.gbuf(op, "weight", weight, OC*Ch)
	var db *GPUBuffer
	if dbias != nil {
		db = c.gbuf(op, "dbias", dbias, OC)
	}
	gs := matmulBackwardPlan(dinp, dweight, dout, inp, weight, N, Ch, OC)
	c.do(func() error {
		for _, g := range gs {
			if err := c.runGemm(op, g); err != nil {
				return err
			}
		}
		if db == nil {
			return nil
		}
		np := colSumParts(N)
		part := c.partials(np * OC)
		if err := c.over("sk_bias_backward_part", np*OC, part, d, int32(N), int32(OC)); err != nil {
			return err
		}
		return c.over("sk_bias_backward_sum", OC, db, part, int32(N), int32(OC))
	})
}

// AttentionForward: causal multi-head attention over inp = (q,k,v).
// Masked (future) entries of preatt and att are written as 0, as on the CPU.
func (c *CUDA) AttentionForward(out, preatt, att, inp Buffer, B, T, Ch, NH int) {
	const op = "AttentionForward"
	attentionShape(op, B, T, Ch, NH)
	c.gbuf(op, "out", out, B*T*Ch)
	pre, a := c.gbuf(op, "preatt", preatt, B*NH*T*T), c.gbuf(op, "att", att, B*NH*T*T)
	c.gbuf(op, "inp", inp, B*T*3*Ch)
	p := newAttentionPlan(B, T, Ch, NH)
	scores, values := p.forward(out, preatt, inp, att)
	c.do(func() error {
		if err := c.runGemm(op, scores); err != nil {
			return err
		}
		if err := c.rowsOf("sk_attention_softmax", p.rows, pre, a, p.rows, int32(T)); err != nil {
			return err
		}
		return c.runGemm(op, values)
	})
}

// AttentionBackward accumulates dinp; dpreatt and datt are overwritten.
func (c *CUDA) AttentionBackward(dinp, dpreatt, datt, dout, inp, att Buffer, B, T, Ch, NH int) {
	const op = "AttentionBackward"
	attentionShape(op, B, T, Ch, NH)
	c.gbuf(op, "dinp", dinp, B*T*3*Ch)
	dp, da := c.gbuf(op, "dpreatt", dpreatt, B*NH*T*T), c.gbuf(op, "datt", datt, B*NH*T*T)
	c.gbuf(op, "dout", dout, B*T*Ch)
	c.gbuf(op, "inp", inp, B*T*3*Ch)
	a := c.gbuf(op, "att", att, B*NH*T*T)
	p := newAttentionPlan(B, T, Ch, NH)
	before, after := p.backward(dinp, dpreatt, datt, dout, inp, att)
	c.do(func() error {
		for _, g := range before {
			if err := c.runGemm(op, g); err != nil {
				return err
			}
		}
		if err := c.rowsOf("sk_attention_softmax_backward", p.rows, dp, a, da, p.rows, int32(T)); err != nil {
			return err
		}
		for _, g := range after {
			if err := c.runGemm(op, g); err != nil {
				return err
			}
		}
		return nil
	})
}

// PrefersFusedAttention is CUDAConfig.FusedAttention (--device
// cuda:N,flash): the fused attention keeps no (B,NH,T,T) matrices (at
// GPT-2 small's T = 1024, 48 MiB per sequence and layer, and three more of
// scratch in the backward), but it is one warp per query row without
// shared-memory tiles, not yet timed on a GPU against the GEMM path.
func (c *CUDA) PrefersFusedAttention() bool { return c.cfg.FusedAttention }

// FlashAttentionForward: causal attention over inp = (q,k,v) without the
// (B,NH,T,T) matrices, one warp per (b, h, t) row; lse (B,NH,T) is kept for
// the backward.
func (c *CUDA) FlashAttentionForward(out, lse, inp Buffer, B, T, Ch, NH int) {
	const op = "FlashAttentionForward"
	flashShape(op, B, T, Ch, NH)
	o, l, x := c.gbuf(op, "out", out, B*T*Ch), c.gbuf(op, "lse", lse, B*NH*T), c.gbuf(op, "inp", inp, B*T*3*Ch)
	rows := B * NH * T
	c.do(func() error {
		return c.rowsOf("sk_flash_attention_forward", rows, o, l, x, rows, int32(T), int32(Ch), int32(NH))
	})
}

// FlashAttentionBackward accumulates dinp, recomputing the attention: pass
// 1 per query row (dq, and delta), then pass 2 per key row (dk, dv), which
// reads every row's delta (kernels on one stream run in order).
func (c *CUDA) FlashAttentionBackward(dinp, delta, dout, out, inp, lse Buffer, B, T, Ch, NH int) {
	const op = "FlashAttentionBackward"
	flashShape(op, B, T, Ch, NH)
	dx, dl := c.gbuf(op, "dinp", dinp, B*T*3*Ch), c.gbuf(op, "delta", delta, B*NH*T)
	d, o := c.gbuf(op, "dout", dout, B*T*Ch), c.gbuf(op, "out", out, B*T*Ch)
	x, l := c.gbuf(op, "inp", inp, B*T*3*Ch), c.gbuf(op, "lse", lse, B*NH*T)
	rows := B * NH * T
	c.do(func() error {
		if err := c.rowsOf("sk_flash_attention_backward_q", rows, dx, dl, d, o, x, l, rows, int32(T), int32(Ch), int32(NH)); err != nil {
			return err
		}
		return c.rowsOf("sk_flash_attention_backward_kv", rows, dx, dl, d, x, l, rows, int32(T), int32(Ch), int32(NH))
	})
}

// GeluForward applies the tanh-approximated GELU to n elements.
func (c *CUDA) GeluForward(out, inp Buffer, n int) {
	const op = "GeluForward"
	o, x := c.gbuf(op, "out", out, n), c.gbuf(op, "inp", inp, n)
	c.do(func() error { return c.over("sk_gelu_forward", n, o, x, n) })
}

// GeluBackward accumulates dinp += gelu'(inp) * dout.
func (c *CUDA) GeluBackward(dinp, inp, dout Buffer, n int) {
	const op = "GeluBackward"
	dx, x, d := c.gbuf(op, "dinp", dinp, n), c.gbuf(op, "inp", inp, n), c.gbuf(op, "dout", dout, n)
	c.do(func() error { return c.over("sk_gelu_backward", n, dx, x, d, n) })
}

// ResidualForward: out = a + b.
func (c *CUDA) ResidualForward(out, a, b Buffer, n int) {
	const op = "ResidualForward"
	o, x, y := c.gbuf(op, "out", out, n), c.gbuf(op, "a", a, n), c.gbuf(op, "b", b, n)
	c.do(func() error { return c.over("sk_residual_forward", n, o, x, y, n) })
}

// ResidualBackward: da += dout, db += dout.
func (c *CUDA) ResidualBackward(da, db, dout Buffer, n int) {
	const op = "ResidualBackward"
	x, y, d := c.gbuf(op, "da", da, n), c.gbuf(op, "db", db, n), c.gbuf(op, "dout", dout, n)
	c.do(func() error { return c.over("sk_residual_backward", n, x, y, d, n) })
}

// SoftmaxCrossEntropyForward writes probs (padding columns 0) and losses.
func (c *CUDA) SoftmaxCrossEntropyForward(losses, probs, logits Buffer, targets []int32, N, V, Vp int) {
	const op = "SoftmaxCrossEntropyForward"
	vocabShape(op, N, V, Vp)
	l, p, lg := c.gbuf(op, "losses", losses, N), c.gbuf(op, "probs", probs, N*Vp), c.gbuf(op, "logits", logits, N*Vp)
	checkIDs(op, "targets", targets, N, V)
	c.do(func() error {
		tg := c.uploadInts(targets)
		return c.rowsOf("sk_softmax_xent_forward", N, l, p, lg, tg, int32(N), int32(V), int32(Vp))
	})
}

// SoftmaxCrossEntropyBackward accumulates dloss*(probs - onehot) into the
// first V columns of dlogits; padding columns are left untouched.
func (c *CUDA) SoftmaxCrossEntropyBackward(dlogits, probs Buffer, targets []int32, dloss float32, N, V, Vp int) {
	const op = "SoftmaxCrossEntropyBackward"
	vocabShape(op, N, V, Vp)
	dl, p := c.gbuf(op, "dlogits", dlogits, N*Vp), c.gbuf(op, "probs", probs, N*Vp)
	checkIDs(op, "targets", targets, N, V)
	c.do(func() error {
		tg := c.uploadInts(targets)
		return c.rowsOf("sk_softmax_xent_backward", N, dl, p, tg, dloss, int32(N), int32(V), int32(Vp))
	})
}

// SoftmaxCrossEntropyFused writes losses and overwrites logits with their
// gradient (Device), one warp per row.
func (c *CUDA) SoftmaxCrossEntropyFused(losses, logits Buffer, targets []int32, dloss float32, N, V, Vp int) {
	const op = "SoftmaxCrossEntropyFused"
	vocabShape(op, N, V, Vp)
	l, lg := c.gbuf(op, "losses", losses, N), c.gbuf(op, "logits", logits, N*Vp)
	checkIDs(op, "targets", targets, N, V)
	c.do(func() error {
		tg := c.uploadInts(targets)
		return c.rowsOf("sk_softmax_xent_fused", N, l, lg, tg, dloss, int32(N), int32(V), int32(Vp))
	})
}

// SumSquares returns the sum of squares of b in float64: sumsqParts
// partial sums on the GPU, added in order on the host.
func (c *CUDA) SumSquares(b Buffer) float64 {
	g := c.gbuf("SumSquares", "b", b, -1)
	var s float64
	c.do(func() error {
		if g.n == 0 {
			return nil
		}
		P := min(g.n, sumsqParts)
		if err := c.over("sk_sumsq_parts", P, c.parts.ptr, g, g.n, P); err != nil {
			return err
		}
		if rc := C.skcu_sync(); rc != 0 {
			return fmt.Errorf("a kernel failed: %s", cuErr(rc))
		}
		if rc := C.skcu_dtoh(unsafe.Pointer(&c.host[0]), c.parts.ptr, C.size_t(8*P)); rc != 0 {
			return fmt.Errorf("cuMemcpyDtoH: %s", cuErr(rc))
		}
		for _, x := range c.host[:P] {
			s += x
		}
		return nil
	})
	return s
}

// Scale multiplies every element of b by s.
func (c *CUDA) Scale(b Buffer, s float32) {
	g := c.gbuf("Scale", "b", b, -1)
	c.do(func() error { return c.over("sk_scale", g.n, g, s, g.n) })
}

// AdamW takes one bias-corrected AdamW step with decoupled weight decay.
func (c *CUDA) AdamW(params, grads, m, v Buffer, lr, beta1, beta2, eps, wd float32, t int) {
	const op = "AdamW"
	n := params.Len()
	if t < 1 {
		panic(fmt.Sprintf("kernels: %s: step t = %d, want >= 1", op, t))
	}
	p, g, mb, vb := c.gbuf(op, "params", params, n), c.gbuf(op, "grads", grads, n), c.gbuf(op, "m", m, n), c.gbuf(op, "v", v, n)
	bc1 := float32(1 - math.Pow(float64(beta1), float64(t)))
	bc2 := float32(1 - math.Pow(float64(beta2), float64(t)))
	c.do(func() error {
		return c.over("sk_adamw", n, p, g, mb, vb, lr, beta1, beta2, eps, wd, bc1, bc2, n)
	})
}

// AdamWSegments is AdamW over a whole model's segments, one launch
// (Device): each element finds its segment in a table of ends and decay
// flags uploaded with it. Buffers of 2^31 elements or more take one launch
// a segment.
func (c *CUDA) AdamWSegments(params, grads, m, v Buffer, ends []int, decay []bool, gscale, lr, beta1, beta2, eps, wd float32, t int) {
	const op = "AdamWSegments"
	n := params.Len()
	checkSegments(op, n, ends, decay, t)
	p, g, mb, vb := c.gbuf(op, "params", params, n), c.gbuf(op, "grads", grads, n), c.gbuf(op, "m", m, n), c.gbuf(op, "v", v, n)
	bc1 := float32(1 - math.Pow(float64(beta1), float64(t)))
	bc2 := float32(1 - math.Pow(float64(beta2), float64(t)))
	// The kernel's table: the segments' ends (from lo), then their decay
	// flags, in scratch reused under c.mu.
	table := func(ends []int, decay []bool, lo int) C.ulonglong {
		c.segTab = c.segTab[:0]
		for _, e := range ends {
			c.segTab = append(c.segTab, int32(e-lo))
		}
		for _, d := range decay {
			f := int32(0)
			if d {
				f = 1
			}
			c.segTab = append(c.segTab, f)
		}
		return c.uploadInts(c.segTab)
	}
	if n < 1<<31 {
		c.do(func() error {
			return c.over("sk_adamw_segments", n, p, g, mb, vb, table(ends, decay, 0), int32(len(ends)), gscale, lr, beta1, beta2, eps, wd, bc1, bc2, n)
		})
		return
	}
	lo := 0
	for j, e := range ends {
		k := e - lo
		if k >= 1<<31 {
			panic(fmt.Errorf("%w: %s: segment %d holds %d elements, over 2^31", ErrShape, op, j, k))
		}
		ps, gs := c.gbuf(op, "params", params.Slice(lo, k), k), c.gbuf(op, "grads", grads.Slice(lo, k), k)
		ms, vs := c.gbuf(op, "m", m.Slice(lo, k), k), c.gbuf(op, "v", v.Slice(lo, k), k)
		c.do(func() error {
			return c.over("sk_adamw_segments", k, ps, gs, ms, vs, table(ends[j:j+1], decay[j:j+1], lo), int32(1), gscale, lr, beta1, beta2, eps, wd, bc1, bc2, k)
		})
		lo = e
	}
}

// SelectDevice is --device: "cpu", "auto", or "cuda:N" with options after
// commas: "fp32" (full-precision GEMMs; TF32 by default) and "flash" (the
// fused attention, CUDAConfig.FusedAttention). auto takes GPU 0 if one
// answers, else the CPU, and note says which and why.
func SelectDevice(spec string, threads int) (dev Device, note string, err error) {
	switch {
	case spec == "" || spec == "cpu":
		return NewCPU(threads), "", nil
	case spec == "auto":
		c, err := OpenCUDA(0)
		if err != nil {
			return NewCPU(threads), fmt.Sprintf("--device auto: training on the CPU (%v)", err), nil
		}
		return c, fmt.Sprintf("--device auto: training on %s", c.Name()), nil
	}
	cfg, err := ParseCUDASpec(spec)
	if err != nil {
		return nil, "", err
	}
	c, err := NewCUDA(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("kernels: --device %s: %w", spec, err)
	}
	return c, "", nil
}

// ParseCUDASpec parses "cuda:N[,fp32][,flash]" (SelectDevice).
func ParseCUDASpec(spec string) (CUDAConfig, error) {
	base, opts, _ := strings.Cut(spec, ",")
	var cfg CUDAConfig
	if n, err := fmt.Sscanf(base, "cuda:%d", &cfg.Ordinal); n != 1 || err != nil || fmt.Sprintf("cuda:%d", cfg.Ordinal) != base {
		return cfg, fmt.Errorf("kernels: --device %q: want auto, cpu or cuda:N[,fp32][,flash]", spec)
	}
	if opts == "" {
		return cfg, nil
	}
	seen := map[string]bool{}
	for _, opt := range strings.Split(opts, ",") {
		if seen[opt] {
			return cfg, fmt.Errorf("kernels: --device %q: option %q twice", spec, opt)
		}
		seen[opt] = true
		switch opt {
		case "fp32":
			cfg.FP32 = true
		case "flash":
			cfg.FusedAttention = true
		default:
			return cfg, fmt.Errorf("kernels: --device %q: unknown option %q (want fp32 or flash)", spec, opt)
		}
	}
	return cfg, nil
}
