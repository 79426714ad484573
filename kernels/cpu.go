package kernels

// #include <stdlib.h>
// #include "skein_kernels.h"
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// HostBuffer is a Buffer in host memory, the CPU device's buffer type.
type HostBuffer []float32

// Len is the number of float32 elements.
func (b HostBuffer) Len() int { return len(b) }

// Slice returns the view [off, off+n); its capacity ends at off+n so that an
// append can never write into the parent.
func (b HostBuffer) Slice(off, n int) Buffer { return b[off : off+n : off+n] }

// Host returns the memory of a CPU buffer; nil for a nil Buffer. It panics if
// b belongs to another device.
func Host(b Buffer) []float32 {
	if b == nil {
		return nil
	}
	h, ok := b.(HostBuffer)
	if !ok {
		panic(fmt.Sprintf("kernels: Host of a %T, not a CPU buffer", b))
	}
	return h
}

// CPU is the Device that runs the kernels in C on the host, vectorized and
// multi-threaded with OpenMP. Results are bit-identical across runs and
// across thread counts. Masked (future) entries of the attention's preatt and
// att are written as 0.
type CPU struct {
	threads int
	name    string
}

var _ Device = (*CPU)(nil)

// NewCPU returns a CPU device that uses threads worker threads;
// threads <= 0 means runtime.NumCPU().
func NewCPU(threads int) *CPU {
	if threads <= 0 {
		threads = runtime.NumCPU()
	}
	isa := C.GoString(C.skein_layers_isa())
	gemm := C.GoString(C.skein_gemm_isa())
	unit := "threads"
	if threads == 1 {
		unit = "thread"
	}
	name := fmt.Sprintf("cpu (%s, %d %s)", isa, threads, unit)
	if gemm != isa {
		name = fmt.Sprintf("cpu (%s, gemm %s, %d %s)", isa, gemm, threads, unit)
	}
	return &CPU{threads: threads, name: name}
}

// Name describes the device, for example "cpu (avx512, 2 threads)".
func (c *CPU) Name() string { return c.name }

// Threads is the number of OpenMP threads each kernel uses.
func (c *CPU) Threads() int { return c.threads }

// Alloc returns a zeroed HostBuffer of n float32s.
func (c *CPU) Alloc(n int) Buffer { return make(HostBuffer, n) }

// Zero sets every element of b to 0.
func (c *CPU) Zero(b Buffer) { clear(host("Zero", "b", b)) }

// CopyIn copies src into dst.
func (c *CPU) CopyIn(dst Buffer, src []float32) {
	d := host("CopyIn", "dst", dst)
	if len(d) != len(src) {
		panic(shapeError("CopyIn", "src", len(src), len(d)))
	}
	copy(d, src)
}

// CopyOut copies src into dst.
func (c *CPU) CopyOut(dst []float32, src Buffer) {
	s := host("CopyOut", "src", src)
	if len(s) != len(dst) {
		panic(shapeError("CopyOut", "dst", len(dst), len(s)))
	}
	copy(dst, s)
}

// shapeError wraps ErrShape naming the kernel, the argument and the lengths.
func shapeError(op, arg string, got, want int) error {
	return fmt.Errorf("%w: %s: %s has %d elements, want %d", ErrShape, op, arg, got, want)
}

func host(op, arg string, b Buffer) HostBuffer {
	h, ok := b.(HostBuffer)
	if !ok {
		panic(fmt.Sprintf("kernels: %s: %s is a %T, not a CPU buffer", op, arg, b))
	}
	return h
}

// ptr checks that b is a CPU buffer of exactly want elements and returns a
// pointer to its first element (nil when want is 0).
func ptr(op, arg string, b Buffer, want int) *C.float {
	h := host(op, arg, b)
	if len(h) != want {
		panic(shapeError(op, arg, len(h), want))
	}
	if want == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&h[0]))
}

// optPtr is ptr for an optional argument: nil stays nil.
func optPtr(op, arg string, b Buffer, want int) *C.float {
	if b == nil {
		return nil
	}
	return ptr(op, arg, b, want)
}

// rowsPtr checks that b holds a whole number (at least min) of rows of C.
func rowsPtr(op, arg string, b Buffer, min, Ch int) (*C.float, int) {
	h := host(op, arg, b)
	rows := checkRows(op, arg, len(h), min, Ch)
	return (*C.float)(unsafe.Pointer(&h[0])), rows
}

// checkRows panics unless n elements are a whole number (at least min) of
// rows of Ch, and returns the rows.
func checkRows(op, arg string, n, min, Ch int) int {
	if Ch <= 0 || n%Ch != 0 || n/Ch < min {
		panic(fmt.Errorf("%w: %s: %s has %d elements, want a multiple of C = %d, at least %d rows",
			ErrShape, op, arg, n, Ch, min))
	}
	return n / Ch
}

// ids checks len(ids) == n and every id in [0, limit).
func ids(op, arg string, ids []int32, n, limit int) *C.int32_t {
	checkIDs(op, arg, ids, n, limit)
	if n == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&ids[0]))
}

// checkIDs panics unless len(ids) == n and every id is in [0, limit).
func checkIDs(op, arg string, ids []int32, n, limit int) {
	if len(ids) != n {
		panic(shapeError(op, arg, len(ids), n))
	}
	for i, id := range ids {
		if id < 0 || int(id) >= limit {
			panic(fmt.Sprintf("kernels: %s: %s[%d] = %d out of range [0, %d)", op, arg, i, id, limit))
		}
	}
}

func positive(op string, dims ...int) {
	for _, d := range dims {
		if d <= 0 {
			panic(fmt.Errorf("%w: %s: dimensions %v must be positive", ErrShape, op, dims))
		}
	}
}

// EncoderForward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
func (c *CPU) EncoderForward(out Buffer, tokens []int32, wte, wpe Buffer, B, T, Ch int) {
	const op = "EncoderForward"
	if B <= 0 || T <= 0 || Ch <= 0 {
		positive(op, B, T, Ch)
	}
	o := ptr(op, "out", out, B*T*Ch)
	we, V := rowsPtr(op, "wte", wte, 1, Ch)
	pe, _ := rowsPtr(op, "wpe", wpe, T, Ch)
	tk := ids(op, "tokens", tokens, B*T, V)
	C.skein_encoder_forward(o, tk, we, pe, C.int(B), C.int(T), C.int(Ch), C.int(c.threads))
}

// EncoderBackward accumulates dout into the dwte rows of tokens and dwpe.
func (c *CPU) EncoderBackward(dwte, dwpe, dout Buffer, tokens []int32, B, T, Ch int) {
	const op = "EncoderBackward"
	if B <= 0 || T <= 0 || Ch <= 0 {
		positive(op, B, T, Ch)
	}
	d := ptr(op, "dout", dout, B*T*Ch)
	we, V := rowsPtr(op, "dwte", dwte, 1, Ch)
	pe, _ := rowsPtr(op, "dwpe", dwpe, T, Ch)
	tk := ids(op, "tokens", tokens, B*T, V)
	C.skein_encoder_backward(we, pe, d, tk, C.int(B), C.int(T), C.int(Ch), C.int(c.threads))
}

// LayerNormForward normalizes N rows of C (eps 1e-5), saving mean and rstd.
func (c *CPU) LayerNormForward(out, mean, rstd, inp, weight, bias Buffer, N, Ch int) {
	const op = "LayerNormForward"
	if N <= 0 || Ch <= 0 {
		positive(op, N, Ch)
	}
	C.skein_layernorm_forward(ptr(op, "out", out, N*Ch), ptr(op, "mean", mean, N),
		ptr(op, "rstd", rstd, N), ptr(op, "inp", inp, N*Ch), ptr(op, "weight", weight, Ch),
		ptr(op, "bias", bias, Ch), C.int(N), C.int(Ch), C.int(c.threads))
}

// ResidualLayerNormForward: res = a + b, then its LayerNorm, a row at a
// time (Device).
func (c *CPU) ResidualLayerNormForward(res, out, mean, rstd, a, b, weight, bias Buffer, N, Ch int) {
	const op = "ResidualLayerNormForward"
	if N <= 0 || Ch <= 0 {
		positive(op, N, Ch)
	}
	C.skein_residual_layernorm_forward(ptr(op, "res", res, N*Ch), ptr(op, "out", out, N*Ch),
		ptr(op, "mean", mean, N), ptr(op, "rstd", rstd, N), ptr(op, "a", a, N*Ch), ptr(op, "b", b, N*Ch),
		ptr(op, "weight", weight, Ch), ptr(op, "bias", bias, Ch), C.int(N), C.int(Ch), C.int(c.threads))
}

// LayerNormBackward accumulates dinp, dweight and dbias.
func (c *CPU) LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd Buffer, N, Ch int) {
	const op = "LayerNormBackward"
	if N <= 0 || Ch <= 0 {
		positive(op, N, Ch)
	}
	C.skein_layernorm_backward(ptr(op, "dinp", dinp, N*Ch), ptr(op, "dweight", dweight, Ch),
		ptr(op, "dbias", dbias, Ch), ptr(op, "dout", dout, N*Ch), ptr(op, "inp", inp, N*Ch),
		ptr(op, "weight", weight, Ch), ptr(op, "mean", mean, N), ptr(op, "rstd", rstd, N),
		C.int(N), C.int(Ch), C.int(c.threads))
}

// MatmulForward: out = inp @ weight^T + bias (bias may be nil).
func (c *CPU) MatmulForward(out, inp, weight, bias Buffer, N, Ch, OC int) {
	const op = "MatmulForward"
	if N <= 0 || Ch <= 0 || OC <= 0 {
		positive(op, N, Ch, OC)
	}
	C.skein_matmul_forward(ptr(op, "out", out, N*OC), ptr(op, "inp", inp, N*Ch),
		ptr(op, "weight", weight, OC*Ch), optPtr(op, "bias", bias, OC),
		C.int(N), C.int(Ch), C.int(OC), C.int(c.threads))
}

// MatmulBackward accumulates dinp, dweight and dbias (which may be nil).
func (c *CPU) MatmulBackward(dinp, dweight, dbias, dout, inp, weight Buffer, N, Ch, OC int) {
	const op = "MatmulBackward"
	if N <= 0 || Ch <= 0 || OC <= 0 {
		positive(op, N, Ch, OC)
	}
	C.skein_matmul_backward(ptr(op, "dinp", dinp, N*Ch), ptr(op, "dweight", dweight, OC*Ch),
		optPtr(op, "dbias", dbias, OC), ptr(op, "dout", dout, N*OC), ptr(op, "inp", inp, N*Ch),
		ptr(op, "weight", weight, OC*Ch), C.int(N), C.int(Ch), C.int(OC), C.int(c.threads))
}

func attentionShape(op string, B, T, Ch, NH int) {
	if B <= 0 || T <= 0 || Ch <= 0 || NH <= 0 {
		positive(op, B, T, Ch, NH)
	}
	if Ch%NH != 0 {
		panic(fmt.Errorf("%w: %s: C = %d not divisible by NH = %d", ErrShape, op, Ch, NH))
	}
}

// AttentionForward: causal multi-head attention over inp = (q,k,v).
func (c *CPU) AttentionForward(out, preatt, att, inp Buffer, B, T, Ch, NH int) {
	const op = "AttentionForward"
	attentionShape(op, B, T, Ch, NH)
	C.skein_attention_forward(ptr(op, "out", out, B*T*Ch), ptr(op, "preatt", preatt, B*NH*T*T),
		ptr(op, "att", att, B*NH*T*T), ptr(op, "inp", inp, B*T*3*Ch),
		C.int(B), C.int(T), C.int(Ch), C.int(NH), C.int(c.threads))
}

// AttentionBackward accumulates dinp; dpreatt and datt are overwritten.
func (c *CPU) AttentionBackward(dinp, dpreatt, datt, dout, inp, att Buffer, B, T, Ch, NH int) {
	const op = "AttentionBackward"
	attentionShape(op, B, T, Ch, NH)
	C.skein_attention_backward(ptr(op, "dinp", dinp, B*T*3*Ch),
		ptr(op, "dpreatt", dpreatt, B*NH*T*T), ptr(op, "datt", datt, B*NH*T*T),
		ptr(op, "dout", dout, B*T*Ch), ptr(op, "inp", inp, B*T*3*Ch), ptr(op, "att", att, B*NH*T*T),
		C.int(B), C.int(T), C.int(Ch), C.int(NH), C.int(c.threads))
}

// PrefersFusedAttention is false: on the CPU the materialized attention's
// GEMMs are faster than the fused kernels' one row at a time, by more than
// the 1.25x its memory would be worth at the shapes the CPU trains. Forward
// plus backward on an AMD EPYC (AVX2), 1 thread (BenchmarkFlashAttention):
// the tiny preset's B=16, T=128, C=128, 4 heads, 29.9 ms materialized
// against 53.3 ms fused (1.8x); the small preset's B=8, T=256, C=384, 6
// heads, 82 ms against 301 ms (3.7x); GPT-2 small's attention at B=1,
// T=1024, 0.28 s against 1.67 s (5.9x), where the materialized matrices
// take 101 MB (and as much again of scratch in the backward). The fused
// kernels run here all the same, for the tests and for a caller that
// needs the memory more than the time.
func (c *CPU) PrefersFusedAttention() bool { return false }

// flashShape is attentionShape with the fused kernels' bound on the head
// size.
func flashShape(op string, B, T, Ch, NH int) {
	attentionShape(op, B, T, Ch, NH)
	if hs := Ch / NH; hs > FlashMaxHeadSize {
		panic(fmt.Errorf("%w: %s: head size C/NH = %d/%d = %d exceeds FlashMaxHeadSize = %d (use AttentionForward and AttentionBackward)",
			ErrShape, op, Ch, NH, hs, FlashMaxHeadSize))
	}
}

// FlashAttentionForward: causal attention over inp = (q,k,v) without the
// (B,NH,T,T) matrices; lse (B,NH,T) is kept for the backward.
func (c *CPU) FlashAttentionForward(out, lse, inp Buffer, B, T, Ch, NH int) {
	const op = "FlashAttentionForward"
	flashShape(op, B, T, Ch, NH)
	C.skein_flash_attention_forward(ptr(op, "out", out, B*T*Ch), ptr(op, "lse", lse, B*NH*T),
		ptr(op, "inp", inp, B*T*3*Ch), C.int(B), C.int(T), C.int(Ch), C.int(NH), C.int(c.threads))
}

// FlashAttentionBackward accumulates dinp, recomputing the attention; delta
// is overwritten.
func (c *CPU) FlashAttentionBackward(dinp, delta, dout, out, inp, lse Buffer, B, T, Ch, NH int) {
	const op = "FlashAttentionBackward"
	flashShape(op, B, T, Ch, NH)
	C.skein_flash_attention_backward(ptr(op, "dinp", dinp, B*T*3*Ch), ptr(op, "delta", delta, B*NH*T),
		ptr(op, "dout", dout, B*T*Ch), ptr(op, "out", out, B*T*Ch), ptr(op, "inp", inp, B*T*3*Ch),
		ptr(op, "lse", lse, B*NH*T), C.int(B), C.int(T), C.int(Ch), C.int(NH), C.int(c.threads))
}

// GeluForward applies the tanh-approximated GELU to n elements.
func (c *CPU) GeluForward(out, inp Buffer, n int) {
	const op = "GeluForward"
	if n == 0 {
		return
	}
	C.skein_gelu_forward(ptr(op, "out", out, n), ptr(op, "inp", inp, n), C.long(n), C.int(c.threads))
}

// GeluBackward accumulates dinp += gelu'(inp) * dout.
func (c *CPU) GeluBackward(dinp, inp, dout Buffer, n int) {
	const op = "GeluBackward"
	if n == 0 {
		return
	}
	C.skein_gelu_backward(ptr(op, "dinp", dinp, n), ptr(op, "inp", inp, n), ptr(op, "dout", dout, n),
		C.long(n), C.int(c.threads))
}

// ResidualForward: out = a + b.
func (c *CPU) ResidualForward(out, a, b Buffer, n int) {
	const op = "ResidualForward"
	if n == 0 {
		return
	}
	C.skein_residual_forward(ptr(op, "out", out, n), ptr(op, "a", a, n), ptr(op, "b", b, n),
		C.long(n), C.int(c.threads))
}

// ResidualBackward: da += dout, db += dout.
func (c *CPU) ResidualBackward(da, db, dout Buffer, n int) {
	const op = "ResidualBackward"
	if n == 0 {
		return
	}
	C.skein_residual_backward(ptr(op, "da", da, n), ptr(op, "db", db, n), ptr(op, "dout", dout, n),
		C.long(n), C.int(c.threads))
}

func vocabShape(op string, N, V, Vp int) {
	if N <= 0 || V <= 0 || Vp <= 0 {
		positive(op, N, V, Vp)
	}
	if V > Vp {
		panic(fmt.Errorf("%w: %s: V = %d > Vp = %d", ErrShape, op, V, Vp))
	}
}

// SoftmaxCrossEntropyForward writes probs (padding columns 0) and losses.
func (c *CPU) SoftmaxCrossEntropyForward(losses, probs, logits Buffer, targets []int32, N, V, Vp int) {
	const op = "SoftmaxCrossEntropyForward"
	vocabShape(op, N, V, Vp)
	C.skein_softmax_xent_forward(ptr(op, "losses", losses, N), ptr(op, "probs", probs, N*Vp),
		ptr(op, "logits", logits, N*Vp), ids(op, "targets", targets, N, V),
		C.int(N), C.int(V), C.int(Vp), C.int(c.threads))
}

// SoftmaxCrossEntropyBackward accumulates dloss*(probs - onehot) into the
// first V columns of dlogits; padding columns are left untouched.
func (c *CPU) SoftmaxCrossEntropyBackward(dlogits, probs Buffer, targets []int32, dloss float32, N, V, Vp int) {
	const op = "SoftmaxCrossEntropyBackward"
	vocabShape(op, N, V, Vp)
	C.skein_softmax_xent_backward(ptr(op, "dlogits", dlogits, N*Vp), ptr(op, "probs", probs, N*Vp),
		ids(op, "targets", targets, N, V), C.float(dloss), C.int(N), C.int(V), C.int(Vp),
		C.int(c.threads))
}

// SoftmaxCrossEntropyFused writes losses and overwrites logits with their
// gradient (Device).
func (c *CPU) SoftmaxCrossEntropyFused(losses, logits Buffer, targets []int32, dloss float32, N, V, Vp int) {
	const op = "SoftmaxCrossEntropyFused"
	vocabShape(op, N, V, Vp)
	C.skein_softmax_xent_fused(ptr(op, "losses", losses, N), ptr(op, "logits", logits, N*Vp),
		ids(op, "targets", targets, N, V), C.float(dloss), C.int(N), C.int(V), C.int(Vp), C.int(c.threads))
}

// SumSquares returns the sum of squares of b, accumulated in float64 with a
// summation order that depends only on b.Len().
func (c *CPU) SumSquares(b Buffer) float64 {
	h := host("SumSquares", "b", b)
	if len(h) == 0 {
		return 0
	}
	return float64(C.skein_sum_squares((*C.float)(unsafe.Pointer(&h[0])), C.long(len(h)), C.int(c.threads)))
}

// Scale multiplies every element of b by s.
func (c *CPU) Scale(b Buffer, s float32) {
	h := host("Scale", "b", b)
	if len(h) == 0 {
		return
	}
	C.skein_scale((*C.float)(unsafe.Pointer(&h[0])), C.float(s), C.long(len(h)), C.int(c.threads))
}

// AdamW takes one bias-corrected AdamW step with decoupled weight decay.
func (c *CPU) AdamW(params, grads, m, v Buffer, lr, beta1, beta2, eps, wd float32, t int) {
	const op = "AdamW"
	n := params.Len()
	if t < 1 {
		panic(fmt.Sprintf("kernels: %s: step t = %d, want >= 1", op, t))
	}
	if n == 0 {
		return
	}
	C.skein_adamw(ptr(op, "params", params, n), ptr(op, "grads", grads, n), ptr(op, "m", m, n),
		ptr(op, "v", v, n), C.long(n), C.float(lr), C.float(beta1), C.float(beta2), C.float(eps),
		C.float(wd), C.int(t), C.int(c.threads))
}

// checkSegments panics unless ends partition [0, n) (increasing, above 0,
// the last n) with one decay flag each, and t >= 1.
func checkSegments(op string, n int, ends []int, decay []bool, t int) {
	if t < 1 {
		panic(fmt.Sprintf("kernels: %s: step t = %d, want >= 1", op, t))
	}
	if len(decay) != len(ends) {
		panic(fmt.Errorf("%w: %s: %d decay flags for %d segments", ErrShape, op, len(decay), len(ends)))
	}
	prev := 0
	for j, e := range ends {
		if e <= prev {
			panic(fmt.Errorf("%w: %s: segment %d ends at %d, after %d", ErrShape, op, j, e, prev))
		}
		prev = e
	}
	if prev != n {
		panic(fmt.Errorf("%w: %s: the segments end at %d, the buffers hold %d", ErrShape, op, prev, n))
	}
}

// The package does not compile where an int is not an int64_t, which
// AdamWSegments hands C its segment ends as.
var _ = [1]struct{}{}[unsafe.Sizeof(int(0))-8]

// AdamWSegments is AdamW over a whole model's segments in one parallel
// region (Device).
func (c *CPU) AdamWSegments(params, grads, m, v Buffer, ends []int, decay []bool, gscale, lr, beta1, beta2, eps, wd float32, t int) {
	const op = "AdamWSegments"
	n := params.Len()
	checkSegments(op, n, ends, decay, t)
	if n == 0 {
		return
	}
	// ends and decay go to C as they are: an int is 64 bits (checked at build time above) and
	// a bool one byte, 0 or 1.
	C.skein_adamw_segments(ptr(op, "params", params, n), ptr(op, "grads", grads, n), ptr(op, "m", m, n),
		ptr(op, "v", v, n), C.long(n), (*C.int64_t)(unsafe.Pointer(&ends[0])), (*C.uint8_t)(unsafe.Pointer(&decay[0])),
		C.int(len(ends)), C.float(gscale), C.float(lr), C.float(beta1), C.float(beta2), C.float(eps), C.float(wd),
		C.int(t), C.int(c.threads))
}

// setLayersISA forces the layer kernels' instruction set ("avx512", "avx2",
// "portable") for tests; it reports false if the CPU cannot run it.
func setLayersISA(name string) bool {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	return C.skein_layers_set_isa(cs) != 0
}

// layersISA names the instruction set the layer kernels use.
func layersISA() string { return C.GoString(C.skein_layers_isa()) }
