package kernels

// #include "ewise_proto.h"
import "C"

import "unsafe"

// The element-wise kernels of ewise_kernels.h, CPU build: one plain loop
// each (no SIMD, one thread). They are the same source the CUDA backend
// runs as PTX (cuda.go), so testing them against the CPU backend tests the
// GPU's arithmetic on every machine.

func fp(x []float32) *C.float {
	if len(x) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&x[0]))
}

func ewiseGeluForward(out, inp []float32) {
	C.sk_gelu_forward(fp(out), fp(inp), C.long(len(out)))
}

func ewiseGeluBackward(dinp, inp, dout []float32) {
	C.sk_gelu_backward(fp(dinp), fp(inp), fp(dout), C.long(len(dinp)))
}

func ewiseResidualForward(out, a, b []float32) {
	C.sk_residual_forward(fp(out), fp(a), fp(b), C.long(len(out)))
}

func ewiseResidualBackward(da, db, dout []float32) {
	C.sk_residual_backward(fp(da), fp(db), fp(dout), C.long(len(da)))
}

func ewiseScale(x []float32, s float32) { C.sk_scale(fp(x), C.float(s), C.long(len(x))) }

func ewiseAdamW(p, g, m, v []float32, lr, b1, b2, eps, wd, bc1, bc2 float32) {
	C.sk_adamw(fp(p), fp(g), fp(m), fp(v), C.float(lr), C.float(b1), C.float(b2), C.float(eps), C.float(wd),
		C.float(bc1), C.float(bc2), C.long(len(p)))
}

func ip(x []int32) *C.int {
	if len(x) == 0 {
		return nil
	}
	return (*C.int)(unsafe.Pointer(&x[0]))
}

func ewiseLayerNormForward(out, mean, rstd, inp, w, b []float32, rows, cols int) {
	C.sk_layernorm_forward(fp(out), fp(mean), fp(rstd), fp(inp), fp(w), fp(b), C.int(rows), C.int(cols))
}

func ewiseLayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd []float32, rows, cols int) {
	C.sk_layernorm_backward_dinp(fp(dinp), fp(dout), fp(inp), fp(w), fp(mean), fp(rstd), C.int(rows), C.int(cols))
	part := make([]float32, colSumParts(rows)*2*cols)
	C.sk_layernorm_dparams_part(fp(part), fp(dout), fp(inp), fp(mean), fp(rstd), C.int(rows), C.int(cols))
	C.sk_layernorm_dparams_sum(fp(dw), fp(db), fp(part), C.int(rows), C.int(cols))
}

func ewiseSoftmaxXentForward(losses, probs, logits []float32, targets []int32, rows, v, vp int) {
	C.sk_softmax_xent_forward(fp(losses), fp(probs), fp(logits), ip(targets), C.int(rows), C.int(v), C.int(vp))
}

func ewiseSoftmaxXentBackward(dlogits, probs []float32, targets []int32, dloss float32, rows, v, vp int) {
	C.sk_softmax_xent_backward(fp(dlogits), fp(probs), ip(targets), C.float(dloss), C.int(rows), C.int(v), C.int(vp))
}

func ewiseSoftmaxXentFused(losses, logits []float32, targets []int32, dloss float32, rows, v, vp int) {
	C.sk_softmax_xent_fused(fp(losses), fp(logits), ip(targets), C.float(dloss), C.int(rows), C.int(v), C.int(vp))
}

func ewiseAdamWSegments(p, g, m, v []float32, seg []int32, gscale, lr, b1, b2, eps, wd, bc1, bc2 float32) {
	C.sk_adamw_segments(fp(p), fp(g), fp(m), fp(v), ip(seg), C.int(len(seg)/2), C.float(gscale), C.float(lr), C.float(b1),
		C.float(b2), C.float(eps), C.float(wd), C.float(bc1), C.float(bc2), C.long(len(p)))
}

func ewiseResidualLayerNormForward(res, out, mean, rstd, a, b, w, bias []float32, rows, cols int) {
	C.sk_residual_layernorm_forward(fp(res), fp(out), fp(mean), fp(rstd), fp(a), fp(b), fp(w), fp(bias), C.int(rows), C.int(cols))
}

func ewiseEncoderForward(out []float32, tokens []int32, wte, wpe []float32, b, t, c int) {
	C.sk_encoder_forward(fp(out), ip(tokens), fp(wte), fp(wpe), C.int(b), C.int(t), C.int(c))
}

func ewiseEncoderBackward(dwte, dwpe, dout []float32, tokens []int32, b, t, c int) {
	g := tokenGroups(tokens, len(dwte)/c)
	C.sk_encoder_backward_wte(fp(dwte), fp(dout), ip(g.toks()), ip(g.starts()), ip(g.order()), C.int(g.u), C.int(c))
	C.sk_encoder_backward_wpe(fp(dwpe), fp(dout), C.int(b), C.int(t), C.int(c))
}

func ewiseAttentionSoftmax(pre, att []float32, rows, T int) {
	C.sk_attention_softmax(fp(pre), fp(att), C.long(rows), C.int(T))
}

func ewiseAttentionSoftmaxBackward(dpre, att, datt []float32, rows, T int) {
	C.sk_attention_softmax_backward(fp(dpre), fp(att), fp(datt), C.long(rows), C.int(T))
}

func ewiseFlashAttentionForward(out, lse, inp []float32, b, t, c, nh int) {
	C.sk_flash_attention_forward(fp(out), fp(lse), fp(inp), C.long(b*nh*t), C.int(t), C.int(c), C.int(nh))
}

func ewiseFlashAttentionBackward(dinp, delta, dout, out, inp, lse []float32, b, t, c, nh int) {
	rows := C.long(b * nh * t)
	C.sk_flash_attention_backward_q(fp(dinp), fp(delta), fp(dout), fp(out), fp(inp), fp(lse), rows, C.int(t), C.int(c), C.int(nh))
	C.sk_flash_attention_backward_kv(fp(dinp), fp(delta), fp(dout), fp(inp), fp(lse), rows, C.int(t), C.int(c), C.int(nh))
}

// flashMaxHeadSize is SK_FLASH_MAX_HS, which FlashMaxHeadSize must equal.
var flashMaxHeadSize = int(C.sk_flash_max_hs_value)

func ewiseBiasAdd(out, bias []float32) {
	C.sk_bias_add(fp(out), fp(bias), C.long(len(out)), C.int(len(bias)))
}

func ewiseBiasBackward(dbias, dout []float32, rows int) {
	part := make([]float32, colSumParts(rows)*len(dbias))
	C.sk_bias_backward_part(fp(part), fp(dout), C.int(rows), C.int(len(dbias)))
	C.sk_bias_backward_sum(fp(dbias), fp(part), C.int(rows), C.int(len(dbias)))
}

// colSumRows is SK_RB: the rows of one chunk of a two-pass column sum.
var colSumRows = int(C.sk_rb_value)

// colSumParts is how many chunks a column sum over rows takes.
func colSumParts(rows int) int { return (rows + colSumRows - 1) / colSumRows }

// ewiseSumSquares is SumSquares as the GPU computes it: P partial sums of
// strided elements, added in order.
func ewiseSumSquares(x []float32, P int) float64 {
	part := make([]float64, P)
	C.sk_sumsq_parts((*C.double)(unsafe.Pointer(&part[0])), fp(x), C.long(len(x)), C.long(P))
	s := 0.0
	for _, p := range part {
		s += p
	}
	return s
}
