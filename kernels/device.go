// Package kernels owns local compute: the layer kernels of a GPT-2-style decoder
// (forward and backward), matrix multiplication, AdamW and gradient-norm
// clipping, behind the Device interface. The CPU backend is C compiled through
// cgo (vectorized, multi-threaded with OpenMP where rows are independent); a
// CUDA backend implements the same interface.
//
// Conventions follow llm.c: activations are (B,T,C) row-major float32,
// weights are (OC,C), N = B*T rows, and every backward kernel accumulates
// (+=) into its gradient outputs, which the caller zeroes once per step.
//
// Attention comes two ways on every device: materialized (the (B,NH,T,T)
// scores and weights kept for the backward) and fused (FlashAttention-2:
// an online softmax, (B,NH,T) kept, the weights recomputed in the
// backward). PrefersFusedAttention says which a device would rather run.
//
// kernels must not import any other Skein package and must not know about
// models, checkpoints, the network or the optimizer's outer loop. Nothing above
// kernels may assume the device is the CPU: it only holds Buffers.
package kernels

import "errors"

// Buffer is a float32 array resident on a Device. Buffers are created by
// Device.Alloc and sliced into views with Slice; views share memory with their
// parent. A Buffer from one device must not be passed to another.
type Buffer interface {
	// Len is the number of float32 elements.
	Len() int
	// Slice returns the view [off, off+n). It panics if out of range, like a
	// Go slice expression: callers build views once, not on the hot path.
	Slice(off, n int) Buffer
}

// ErrShape is returned (wrapped) when a kernel is called with buffers whose
// lengths do not match the shape arguments.
var ErrShape = errors.New("kernels: buffer length does not match shape")

// Device is one compute device. All methods are synchronous from the caller's
// point of view (a GPU backend may queue work but must finish it before
// CopyOut returns). Kernels never allocate Go memory.
//
// Shape arguments: B batch, T time, C channels, OC output channels, NH heads,
// N = B*T rows, V vocabulary, Vp padded vocabulary (rows of logits are Vp
// long; columns >= V are ignored by the loss).
type Device interface {
	// Name is a short human-readable name, for example "cpu (avx512, 2 threads)".
	Name() string
	// Threads is the number of worker threads the device uses (CPU) or 1.
	Threads() int
	// Alloc returns a zeroed buffer of n float32s.
	Alloc(n int) Buffer
	// Zero sets every element of b to 0.
	Zero(b Buffer)
	// CopyIn copies src (host memory) into dst; len(src) must equal dst.Len().
	CopyIn(dst Buffer, src []float32)
	// CopyOut copies src into dst (host memory); len(dst) must equal src.Len().
	CopyOut(dst []float32, src Buffer)

	// EncoderForward: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
	// out (B,T,C), wte (V,C), wpe (maxT,C), tokens B*T.
	EncoderForward(out Buffer, tokens []int32, wte, wpe Buffer, B, T, C int)
	// EncoderBackward accumulates dout into dwte rows and dwpe rows.
	EncoderBackward(dwte, dwpe, dout Buffer, tokens []int32, B, T, C int)

	// LayerNormForward normalizes each of N rows of C; mean and rstd (N) are
	// saved for the backward. eps = 1e-5.
	LayerNormForward(out, mean, rstd, inp, weight, bias Buffer, N, C int)
	LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd Buffer, N, C int)
	// ResidualLayerNormForward is ResidualForward (res = a + b, N*C) and
	// LayerNormForward of res into out, mean and rstd, in one pass over
	// the rows (the same bits).
	ResidualLayerNormForward(res, out, mean, rstd, a, b, weight, bias Buffer, N, C int)

	// MatmulForward: out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC).
	// bias may be nil.
	MatmulForward(out, inp, weight, bias Buffer, N, C, OC int)
	// MatmulBackward accumulates dinp (N,C), dweight (OC,C) and dbias (OC,
	// may be nil).
	MatmulBackward(dinp, dweight, dbias, dout, inp, weight Buffer, N, C, OC int)

	// AttentionForward: inp (B,T,3C) holds q,k,v; out (B,T,C); preatt and att
	// (B,NH,T,T) are saved for the backward. Causal, scale 1/sqrt(C/NH).
	AttentionForward(out, preatt, att, inp Buffer, B, T, C, NH int)
	// AttentionBackward accumulates dinp (B,T,3C); dpreatt and datt are
	// scratch (B,NH,T,T) that the kernel may overwrite.
	AttentionBackward(dinp, dpreatt, datt, dout, inp, att Buffer, B, T, C, NH int)

	// FlashAttentionForward is AttentionForward fused (FlashAttention-2): an
	// online softmax over the keys of each query row, so no (B,NH,T,T)
	// matrix is kept or even stored. out (B,T,C); lse (B,NH,T) gets each
	// row's log-sum-exp of its scaled scores (natural log), which the
	// backward needs. The head size C/NH is at most FlashMaxHeadSize.
	FlashAttentionForward(out, lse, inp Buffer, B, T, C, NH int)
	// FlashAttentionBackward accumulates dinp (B,T,3C) for dout (B,T,C),
	// recomputing the attention from inp and the forward's out and lse.
	// delta (B,NH,T) is scratch that the kernel overwrites (each row's
	// dot(dout, out)). No atomics: every gradient element is summed by one
	// thread in a fixed order.
	FlashAttentionBackward(dinp, delta, dout, out, inp, lse Buffer, B, T, C, NH int)

	// GeluForward (tanh approximation) over n elements.
	GeluForward(out, inp Buffer, n int)
	GeluBackward(dinp, inp, dout Buffer, n int)

	// ResidualForward: out = a + b over n elements.
	ResidualForward(out, a, b Buffer, n int)
	// ResidualBackward: da += dout, db += dout.
	ResidualBackward(da, db, dout Buffer, n int)

	// SoftmaxCrossEntropyForward: for each of N rows of logits (Vp wide,
	// first V used) writes probs (N,Vp) and losses (N) = -log p[target].
	SoftmaxCrossEntropyForward(losses, probs, logits Buffer, targets []int32, N, V, Vp int)
	// SoftmaxCrossEntropyBackward accumulates into dlogits (N,Vp)
	// dloss * (probs - onehot(target)) for columns < V (padding columns get 0).
	SoftmaxCrossEntropyBackward(dlogits, probs Buffer, targets []int32, dloss float32, N, V, Vp int)

	// SoftmaxCrossEntropyFused is the classifier's forward and backward in
	// one pass, in place: for each of N rows of logits it writes losses
	// (N) = -log p[target] and overwrites the row with its gradient
	// dloss * (probs - onehot(target)) in the first V columns and 0 in
	// the padding: the bits of SoftmaxCrossEntropyForward, then
	// SoftmaxCrossEntropyBackward into zeroed dlogits, without the (N,Vp)
	// probs (GPT-2 small at 8 x 1024 tokens: 1.6 GB) or their passes.
	SoftmaxCrossEntropyFused(losses, logits Buffer, targets []int32, dloss float32, N, V, Vp int)

	// SumSquares returns the sum of squares of b, accumulated in float64.
	SumSquares(b Buffer) float64
	// Scale multiplies every element of b by s.
	Scale(b Buffer, s float32)
	// AdamW updates params in place from grads with moments m and v (all the
	// same length). t is the 1-based step for bias correction. Weight decay is
	// decoupled: p -= lr * (mhat/(sqrt(vhat)+eps) + wd*p).
	AdamW(params, grads, m, v Buffer, lr, beta1, beta2, eps, wd float32, t int)
	// AdamWSegments is AdamW over a whole model's flat buffers in one call
	// (a multi-tensor AdamW: one launch on a GPU, not one per tensor):
	// segment j is [ends[j-1], ends[j]) (ends increasing, from above 0 to
	// params.Len()), decayed by wd where decay[j] and not elsewhere, and
	// the gradients are read times gscale (a clip's scale, folded in: the
	// grads are left as they are). Each element gets AdamW's update with
	// its segment's decay, the bits of AdamW on the segment after Scale.
	AdamWSegments(params, grads, m, v Buffer, ends []int, decay []bool, gscale, lr, beta1, beta2, eps, wd float32, t int)
}

// FlashMaxHeadSize is the largest head size (C/NH) of FlashAttentionForward
// and FlashAttentionBackward: a lane of the GPU keeps its share of a head's
// vectors in registers, in arrays of a size fixed at compile time
// (SK_FLASH_MAX_HS in ewise_kernels.h).
const FlashMaxHeadSize = 256

// PrefersFusedAttention reports whether dev wants a model's attention to run
// on FlashAttentionForward and FlashAttentionBackward rather than on
// AttentionForward and AttentionBackward: a device says so with a method
// PrefersFusedAttention() bool (the CUDA backend does); false for one that
// does not. Both pairs work on every device; this is only the faster or
// leaner choice (the CPU keeps the materialized matrices: see
// CPU.PrefersFusedAttention).
func PrefersFusedAttention(dev Device) bool {
	if f, ok := dev.(interface{ PrefersFusedAttention() bool }); ok {
		return f.PrefersFusedAttention()
	}
	return false
}

// Err returns dev's sticky failure, for a device that can fail
// asynchronously (CUDA); nil for the CPU.
func Err(dev Device) error {
	if f, ok := dev.(interface{ Err() error }); ok {
		return f.Err()
	}
	return nil
}
