package kernels

// #include <stdlib.h>
// #include "cuda_driver.h"
import "C"

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// The CUDA backend, as far as it goes: the driver API loaded at run time
// (cuda_driver.c, dlopen of libcuda.so.1: `go build` needs gcc alone), the
// element-wise and row-wise kernels of the training step (GELU, residual,
// scale, AdamW, layernorm, softmax cross-entropy, the encoder) compiled
// ahead of time to PTX
// from the same source as their CPU build (ewise_kernels.h, `go generate`)
// and JIT-compiled by the driver for the GPU present, device buffers, and
// launches. The GEMMs (cuBLAS, and a tiled fallback) and attention are not
// built yet, so CUDA is not a
// Device: training runs on the CPU (SelectDevice says so). None of this
// has run on a GPU yet; the parity tests skip without one.

//go:generate clang -x cuda --cuda-device-only --cuda-gpu-arch=sm_80 -nocudainc -nocudalib -O3 -S -o cuda/ewise.ptx cuda/ewise.cu

// ptxFlags are go:generate's clang flags (TestPTXUpToDate runs them).
var ptxFlags = []string{"-x", "cuda", "--cuda-device-only", "--cuda-gpu-arch=sm_80", "-nocudainc", "-nocudalib", "-O3", "-S"}

// ewisePTX is cuda/ewise.ptx: the element-wise kernels for sm_80 and later
// (the driver JIT-compiles PTX forward to newer GPUs).
//
//go:embed cuda/ewise.ptx
var ewisePTX []byte

// cudaKernels are the entry points of ewisePTX.
var cudaKernels = []string{"sk_gelu_forward", "sk_gelu_backward", "sk_residual_forward", "sk_residual_backward",
	"sk_scale", "sk_adamw", "sk_layernorm_forward", "sk_layernorm_backward_dinp", "sk_layernorm_backward_dparams",
	"sk_softmax_xent_forward", "sk_softmax_xent_backward", "sk_encoder_forward", "sk_encoder_backward"}

// ErrNoCUDA is returned (wrapped) when there is no usable NVIDIA GPU: no
// driver, no device, or a device the driver refuses.
var ErrNoCUDA = errors.New("kernels: no CUDA GPU")

// CUDA is one GPU's context with the element-wise kernels loaded. Its
// methods must be called from one goroutine at a time.
type CUDA struct {
	ordinal int
	name    string
	ctx     unsafe.Pointer
	mod     unsafe.Pointer
	fns     map[string]unsafe.Pointer
	mu      sync.Mutex
}

var cudaLoad struct {
	once sync.Once
	err  error
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

// OpenCUDA opens GPU ordinal and loads the element-wise kernels.
func OpenCUDA(ordinal int) (*CUDA, error) {
	if err := loadDriver(); err != nil {
		return nil, err
	}
	var n C.int
	if rc := C.skcu_device_count(&n); rc != 0 {
		return nil, fmt.Errorf("%w: cuDeviceGetCount: %s", ErrNoCUDA, cuErr(rc))
	}
	if ordinal < 0 || ordinal >= int(n) {
		return nil, fmt.Errorf("%w: cuda:%d asked for, %d GPU(s) present", ErrNoCUDA, ordinal, int(n))
	}
	runtime.LockOSThread() // the context is current on this thread while it is set up
	defer runtime.UnlockOSThread()
	c := &CUDA{ordinal: ordinal, fns: map[string]unsafe.Pointer{}}
	var name [256]C.char
	if rc := C.skcu_device_name(C.int(ordinal), &name[0], C.int(len(name))); rc == 0 {
		c.name = C.GoString(&name[0])
	}
	if rc := C.skcu_ctx_create(&c.ctx, C.int(ordinal)); rc != 0 {
		return nil, fmt.Errorf("%w: cuCtxCreate on cuda:%d: %s", ErrNoCUDA, ordinal, cuErr(rc))
	}
	ptx := C.CString(string(ewisePTX))
	defer C.free(unsafe.Pointer(ptx))
	if rc := C.skcu_module_load(&c.mod, ptx); rc != 0 {
		C.skcu_ctx_destroy(c.ctx)
		return nil, fmt.Errorf("%w: loading the kernels' PTX on %s: %s", ErrNoCUDA, c.name, cuErr(rc))
	}
	for _, fn := range cudaKernels {
		cs := C.CString(fn)
		var f unsafe.Pointer
		rc := C.skcu_function(&f, c.mod, cs)
		C.free(unsafe.Pointer(cs))
		if rc != 0 {
			c.Close()
			return nil, fmt.Errorf("%w: kernel %s: %s", ErrNoCUDA, fn, cuErr(rc))
		}
		c.fns[fn] = f
	}
	return c, nil
}

// Name is the GPU's name, as the driver gives it.
func (c *CUDA) Name() string { return fmt.Sprintf("cuda:%d (%s)", c.ordinal, c.name) }

// Close frees the context and everything in it.
func (c *CUDA) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	C.skcu_ctx_set(c.ctx)
	if c.mod != nil {
		C.skcu_module_unload(c.mod)
	}
	C.skcu_ctx_destroy(c.ctx)
	c.ctx, c.mod = nil, nil
}

// GPUBuffer is device memory of n float32s.
type GPUBuffer struct {
	ptr C.ulonglong
	n   int
}

// Len is the buffer's length in float32s.
func (b *GPUBuffer) Len() int { return b.n }

// do runs f with c's context current on a locked thread.
func (c *CUDA) do(f func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return errors.New("kernels: CUDA context closed")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if rc := C.skcu_ctx_set(c.ctx); rc != 0 {
		return fmt.Errorf("kernels: cuCtxSetCurrent: %s", cuErr(rc))
	}
	return f()
}

// Upload copies x into new device memory.
func (c *CUDA) Upload(x []float32) (*GPUBuffer, error) {
	b := &GPUBuffer{n: len(x)}
	err := c.do(func() error {
		if rc := C.skcu_alloc(&b.ptr, C.size_t(max(4*len(x), 4))); rc != 0 {
			return fmt.Errorf("kernels: cuMemAlloc of %d floats: %s", len(x), cuErr(rc))
		}
		if len(x) > 0 {
			if rc := C.skcu_htod(b.ptr, unsafe.Pointer(&x[0]), C.size_t(4*len(x))); rc != 0 {
				C.skcu_free(b.ptr)
				return fmt.Errorf("kernels: cuMemcpyHtoD: %s", cuErr(rc))
			}
		}
		return nil
	})
	return b, err
}

// Download copies b into dst (len(dst) == b.Len()).
func (c *CUDA) Download(dst []float32, b *GPUBuffer) error {
	if len(dst) != b.n {
		return fmt.Errorf("kernels: download of %d floats into %d", b.n, len(dst))
	}
	return c.do(func() error {
		if rc := C.skcu_sync(); rc != 0 {
			return fmt.Errorf("kernels: a kernel failed: %s", cuErr(rc))
		}
		if b.n > 0 {
			if rc := C.skcu_dtoh(unsafe.Pointer(&dst[0]), b.ptr, C.size_t(4*b.n)); rc != 0 {
				return fmt.Errorf("kernels: cuMemcpyDtoH: %s", cuErr(rc))
			}
		}
		return nil
	})
}

// Free releases b.
func (c *CUDA) Free(b *GPUBuffer) {
	c.do(func() error { C.skcu_free(b.ptr); return nil })
}

// launch runs kernel fn over n elements with the given parameter values
// (pointers to C values, allocated in C memory for the call).
func (c *CUDA) launch(fn string, n int, args ...any) error {
	return c.do(func() error {
		// Every parameter in C memory: cgo forbids passing Go pointers to
		// Go memory that holds Go pointers.
		params := (*[16]unsafe.Pointer)(C.malloc(C.size_t(16 * unsafe.Sizeof(unsafe.Pointer(nil)))))
		defer C.free(unsafe.Pointer(params))
		var cells []unsafe.Pointer
		defer func() {
			for _, p := range cells {
				C.free(p)
			}
		}()
		for i, a := range args {
			p := C.malloc(8)
			cells = append(cells, p)
			switch v := a.(type) {
			case *GPUBuffer:
				*(*C.ulonglong)(p) = v.ptr
			case float32:
				*(*C.float)(p) = C.float(v)
			case int:
				*(*C.long)(p) = C.long(v)
			case int32:
				*(*C.int)(p) = C.int(v)
			default:
				return fmt.Errorf("kernels: parameter %d of %s: %T", i, fn, a)
			}
			params[i] = p
		}
		if rc := C.skcu_launch(c.fns[fn], C.long(n), &params[0]); rc != 0 {
			return fmt.Errorf("kernels: launching %s: %s", fn, cuErr(rc))
		}
		return nil
	})
}

// GeluForward, GeluBackward, ResidualForward, ResidualBackward, Scale and
// AdamW are the Device methods of the same names, on device buffers.
func (c *CUDA) GeluForward(out, inp *GPUBuffer) error {
	return c.launch("sk_gelu_forward", out.n, out, inp, out.n)
}

func (c *CUDA) GeluBackward(dinp, inp, dout *GPUBuffer) error {
	return c.launch("sk_gelu_backward", dinp.n, dinp, inp, dout, dinp.n)
}

func (c *CUDA) ResidualForward(out, a, b *GPUBuffer) error {
	return c.launch("sk_residual_forward", out.n, out, a, b, out.n)
}

func (c *CUDA) ResidualBackward(da, db, dout *GPUBuffer) error {
	return c.launch("sk_residual_backward", da.n, da, db, dout, da.n)
}

func (c *CUDA) Scale(x *GPUBuffer, s float32) error { return c.launch("sk_scale", x.n, x, s, x.n) }

func (c *CUDA) AdamW(p, g, m, v *GPUBuffer, lr, b1, b2, eps, wd float32, t int) error {
	bc1, bc2 := float32(1-math.Pow(float64(b1), float64(t))), float32(1-math.Pow(float64(b2), float64(t)))
	return c.launch("sk_adamw", p.n, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2, p.n)
}

// UploadInt32 copies x (token ids, targets) into new device memory.
func (c *CUDA) UploadInt32(x []int32) (*GPUBuffer, error) {
	bits := make([]float32, len(x))
	for i, v := range x {
		bits[i] = math.Float32frombits(uint32(v))
	}
	return c.Upload(bits)
}

// LayerNormForward, LayerNormBackward, SoftmaxCrossEntropyForward and
// SoftmaxCrossEntropyBackward are the Device methods of the same names, on
// device buffers (targets from UploadInt32), one row per GPU thread.
func (c *CUDA) LayerNormForward(out, mean, rstd, inp, w, b *GPUBuffer, rows, cols int) error {
	return c.launch("sk_layernorm_forward", rows, out, mean, rstd, inp, w, b, int32(rows), int32(cols))
}

func (c *CUDA) LayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd *GPUBuffer, rows, cols int) error {
	if err := c.launch("sk_layernorm_backward_dinp", rows, dinp, dout, inp, w, mean, rstd, int32(rows), int32(cols)); err != nil {
		return err
	}
	return c.launch("sk_layernorm_backward_dparams", cols, dw, db, dout, inp, mean, rstd, int32(rows), int32(cols))
}

func (c *CUDA) SoftmaxCrossEntropyForward(losses, probs, logits, targets *GPUBuffer, rows, v, vp int) error {
	return c.launch("sk_softmax_xent_forward", rows, losses, probs, logits, targets, int32(rows), int32(v), int32(vp))
}

func (c *CUDA) SoftmaxCrossEntropyBackward(dlogits, probs, targets *GPUBuffer, dloss float32, rows, v, vp int) error {
	return c.launch("sk_softmax_xent_backward", rows, dlogits, probs, targets, dloss, int32(rows), int32(v), int32(vp))
}

// EncoderForward and EncoderBackward are the Device methods of the same
// names, on device buffers (tokens from UploadInt32).
func (c *CUDA) EncoderForward(out, tokens, wte, wpe *GPUBuffer, b, t, cols int) error {
	return c.launch("sk_encoder_forward", b*t, out, tokens, wte, wpe, int32(b), int32(t), int32(cols))
}

func (c *CUDA) EncoderBackward(dwte, dwpe, dout, tokens *GPUBuffer, b, t, cols int) error {
	return c.launch("sk_encoder_backward", cols, dwte, dwpe, dout, tokens, int32(b), int32(t), int32(cols))
}

// SelectDevice is --device: "cpu", "auto" or "cuda:N". The CUDA backend
// runs only the element-wise and row-wise kernels so far, so every choice trains on the
// CPU; note says why when a GPU was asked for or found, and cuda:N fails
// rather than pretend.
func SelectDevice(spec string, threads int) (dev Device, note string, err error) {
	switch {
	case spec == "" || spec == "cpu":
		return NewCPU(threads), "", nil
	case spec == "auto":
		c, err := OpenCUDA(0)
		if err != nil {
			return NewCPU(threads), fmt.Sprintf("--device auto: the CPU (%v)", err), nil
		}
		name := c.Name()
		c.Close()
		return NewCPU(threads), fmt.Sprintf("--device auto: found %s, but the CUDA backend runs only the element-wise and row-wise kernels so far (GEMMs and attention are not built): training on the CPU", name), nil
	}
	var ordinal int
	if n, err := fmt.Sscanf(spec, "cuda:%d", &ordinal); n != 1 || err != nil {
		return nil, "", fmt.Errorf("kernels: --device %q: want auto, cpu or cuda:N", spec)
	}
	return nil, "", fmt.Errorf("kernels: --device %s: the CUDA backend is not built yet (its element-wise and row-wise kernels are; GEMMs and attention are not); use --device cpu or auto", spec)
}
