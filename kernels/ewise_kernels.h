// Element-wise kernels of the training step, written once in a subset of C
// that two compilers take:
//
//   - gcc, for the CPU (ewise_cpu.c): each kernel is a function that loops
//     over its index; the tests run this build against the CPU backend;
//   - clang as CUDA (cuda/ewise.cu, `go generate`), to PTX that the CUDA
//     backend embeds and the driver JIT-compiles for the GPU present: each
//     kernel is a __global__ function over one index per thread.
//
// No CUDA headers are used: the qualifiers are clang's attributes, thread
// indices come from the __nvvm_read_ptx_sreg_* builtins, and the only math
// is exp, log and sqrt (SK_EXPF, SK_LOGF, SK_SQRTF), which map to PTX
// instructions on the GPU and to libm on the CPU. The bias corrections of
// AdamW (a pow) are computed by the caller. Row-wise kernels run one row
// per thread (a first version: correct, not fast), and a reduction over
// rows (layernorm's dweight, dbias) one column per thread, so that no two
// threads write one element.
#ifndef SKEIN_EWISE_KERNELS_H
#define SKEIN_EWISE_KERNELS_H

#if defined(__CUDA__)
#define SK_FN static __attribute__((device)) inline
#define SK_EXPF(x) __nvvm_ex2_approx_f((x) * 1.44269504088896341f)
#define SK_LOGF(x) (__nvvm_lg2_approx_f(x) * 0.69314718055994531f)
#define SK_SQRTF(x) __nvvm_sqrt_rn_f(x)
#define SK_NEG_INF (-__builtin_inff())
#define SK_KERNEL(name, params, n, call)                                                       \
    extern "C" __attribute__((global)) void name params {                                     \
        long i = (long)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() +         \
                 __nvvm_read_ptx_sreg_tid_x();                                                 \
        if (i < (n)) {                                                                         \
            call;                                                                              \
        }                                                                                      \
    }
#else
#include <math.h>
#define SK_FN static inline
#define SK_EXPF(x) expf(x)
#define SK_LOGF(x) logf(x)
#define SK_SQRTF(x) sqrtf(x)
#define SK_NEG_INF (-INFINITY)
#define SK_KERNEL(name, params, n, call)                                                       \
    void name params {                                                                         \
        for (long i = 0; i < (n); i++) {                                                       \
            call;                                                                              \
        }                                                                                      \
    }
#endif

#define SK_GELU_S 0.7978845608028654f // sqrt(2/pi)
#define SK_GELU_K 0.044715f

// GELU, tanh approximation: x * sigmoid(2u), u = sqrt(2/pi) (x + k x^3).
SK_FN void sk_gelu_fwd_at(long i, float *out, const float *inp) {
    float x = inp[i];
    float u = SK_GELU_S * (x + SK_GELU_K * x * x * x);
    out[i] = x / (1.0f + SK_EXPF(-2.0f * u));
}

// d gelu/dx = sig + 2 x sig (1 - sig) u', accumulated into dinp.
SK_FN void sk_gelu_bwd_at(long i, float *dinp, const float *inp, const float *dout) {
    float x = inp[i];
    float u = SK_GELU_S * (x + SK_GELU_K * x * x * x);
    float du = SK_GELU_S * (1.0f + 3.0f * SK_GELU_K * x * x);
    float sig = 1.0f / (1.0f + SK_EXPF(-2.0f * u));
    dinp[i] += (sig + 2.0f * x * sig * (1.0f - sig) * du) * dout[i];
}

SK_FN void sk_add_at(long i, float *out, const float *a, const float *b) { out[i] = a[i] + b[i]; }

SK_FN void sk_acc2_at(long i, float *da, float *db, const float *dout) {
    da[i] += dout[i];
    db[i] += dout[i];
}

SK_FN void sk_scale_at(long i, float *x, float s) { x[i] *= s; }

// One AdamW step with decoupled weight decay; bc1 and bc2 are the bias
// corrections 1 - beta^t.
SK_FN void sk_adamw_at(long i, float *p, const float *g, float *m, float *v, float lr, float b1,
                       float b2, float eps, float wd, float bc1, float bc2) {
    float gi = g[i];
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * ((mi / bc1) / (SK_SQRTF(vi / bc2) + eps) + wd * p[i]);
}

#define SK_LN_EPS 1e-5f

// LayerNorm of row n: out = (x - mean) * rstd * w + b; mean and rstd saved.
SK_FN void sk_ln_fwd_row(long n, float *out, float *mean, float *rstd, const float *inp,
                         const float *w, const float *b, int C) {
    const float *x = inp + n * C;
    float *o = out + n * C;
    float s = 0.0f;
    for (int i = 0; i < C; i++) s += x[i];
    float m = s / (float)C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) v += (x[i] - m) * (x[i] - m);
    float rs = 1.0f / SK_SQRTF(v / (float)C + SK_LN_EPS);
    for (int i = 0; i < C; i++) o[i] = (x[i] - m) * rs * w[i] + b[i];
    mean[n] = m;
    rstd[n] = rs;
}

// LayerNorm backward, the input gradient of row n (accumulated).
SK_FN void sk_ln_bwd_dinp_row(long n, float *dinp, const float *dout, const float *inp,
                              const float *w, const float *mean, const float *rstd, int C) {
    const float *d = dout + n * C, *x = inp + n * C;
    float *dx = dinp + n * C;
    float m = mean[n], rs = rstd[n], a = 0.0f, bs = 0.0f;
    for (int i = 0; i < C; i++) {
        a += w[i] * d[i];
        bs += w[i] * d[i] * (x[i] - m) * rs;
    }
    a /= (float)C;
    bs /= (float)C;
    for (int i = 0; i < C; i++) dx[i] += rs * (w[i] * d[i] - a - (x[i] - m) * rs * bs);
}

// LayerNorm backward, the weight and bias gradients of column i over all N
// rows, in row order (accumulated).
SK_FN void sk_ln_bwd_dparams_col(long i, float *dw, float *db, const float *dout, const float *inp,
                                 const float *mean, const float *rstd, int N, int C) {
    float sw = 0.0f, sb = 0.0f;
    for (long n = 0; n < N; n++) {
        float d = dout[n * C + i];
        sw += (inp[n * C + i] - mean[n]) * rstd[n] * d;
        sb += d;
    }
    dw[i] += sw;
    db[i] += sb;
}

// Softmax and cross-entropy of row n over the first V of Vp logits.
SK_FN void sk_smce_fwd_row(long n, float *losses, float *probs, const float *logits,
                           const int *targets, int V, int Vp) {
    const float *l = logits + n * Vp;
    float *p = probs + n * Vp;
    float mx = SK_NEG_INF;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    float s = 0.0f;
    for (int i = 0; i < V; i++) {
        p[i] = SK_EXPF(l[i] - mx);
        s += p[i];
    }
    for (int i = 0; i < V; i++) p[i] /= s;
    for (int i = V; i < Vp; i++) p[i] = 0.0f;
    losses[n] = SK_LOGF(s) - (l[targets[n]] - mx);
}

// Its backward: dlogits += dloss * (probs - onehot(target)) (accumulated).
SK_FN void sk_smce_bwd_row(long n, float *dlogits, const float *probs, const int *targets,
                           float dloss, int V, int Vp) {
    float *dl = dlogits + n * Vp;
    const float *p = probs + n * Vp;
    for (int i = 0; i < V; i++) dl[i] += dloss * p[i];
    dl[targets[n]] -= dloss;
}

// The encoder of row n = b*T + t: out = wte[token] + wpe[t].
SK_FN void sk_enc_fwd_row(long n, float *out, const int *tokens, const float *wte, const float *wpe,
                          int T, int C) {
    float *o = out + n * C;
    const float *we = wte + (long)tokens[n] * C, *pe = wpe + (n % T) * C;
    for (int i = 0; i < C; i++) o[i] = we[i] + pe[i];
}

// Its backward for column i: every row's gradient added, in row order, to
// its token's and its position's rows (a column per thread: two rows with
// one token never race, and the sums are in the same order as the CPU's).
SK_FN void sk_enc_bwd_col(long i, float *dwte, float *dwpe, const float *dout, const int *tokens,
                          int B, int T, int C) {
    for (long n = 0; n < (long)B * T; n++) {
        float d = dout[n * C + i];
        dwte[(long)tokens[n] * C + i] += d;
        dwpe[(n % T) * C + i] += d;
    }
}

// Causal softmax of attention row r of B*NH*T rows (t = r % T), over the
// preatt row that the GEMM wrote (already scaled): att[j] for j <= t, and
// 0 in both att and preatt after t (the CPU backend's convention).
SK_FN void sk_att_softmax_row(long r, float *pre, float *att, int T) {
    int t = (int)(r % T);
    float *p = pre + r * T, *a = att + r * T;
    float mx = SK_NEG_INF;
    for (int j = 0; j <= t; j++) mx = p[j] > mx ? p[j] : mx;
    float s = 0.0f;
    for (int j = 0; j <= t; j++) {
        a[j] = SK_EXPF(p[j] - mx);
        s += a[j];
    }
    float inv = 1.0f / s;
    for (int j = 0; j <= t; j++) a[j] *= inv;
    for (int j = t + 1; j < T; j++) {
        a[j] = 0.0f;
        p[j] = 0.0f;
    }
}

// Its backward for row r: dpre[j] = att[j] (datt[j] - sum_k att[k] datt[k])
// for j <= t, and 0 after t (so that the GEMMs that follow may run over
// the whole square).
SK_FN void sk_att_softmax_bwd_row(long r, float *dpre, const float *att, const float *datt, int T) {
    int t = (int)(r % T);
    const float *a = att + r * T, *da = datt + r * T;
    float *dp = dpre + r * T;
    float s = 0.0f;
    for (int j = 0; j <= t; j++) s += a[j] * da[j];
    for (int j = 0; j <= t; j++) dp[j] = a[j] * (da[j] - s);
    for (int j = t + 1; j < T; j++) dp[j] = 0.0f;
}

// The matmul's bias, added to element i of out (N,OC): out[i] += bias[i % OC].
SK_FN void sk_bias_add_at(long i, float *out, const float *bias, int OC) { out[i] += bias[i % OC]; }

// The bias gradient of column i: the sum of dout's column over N rows, in
// row order (accumulated).
SK_FN void sk_bias_bwd_col(long i, float *dbias, const float *dout, int N, int OC) {
    float s = 0.0f;
    for (long n = 0; n < N; n++) s += dout[n * OC + i];
    dbias[i] += s;
}

// Part p of P of a sum of squares in double: elements p, p+P, p+2P, ...
// (adjacent threads read adjacent elements). The caller adds the P parts
// in order, so the result depends only on n and P.
SK_FN void sk_sumsq_part_at(long p, double *part, const float *x, long n, long P) {
    double s = 0.0;
    for (long i = p; i < n; i += P) s += (double)x[i] * (double)x[i];
    part[p] = s;
}

SK_KERNEL(sk_gelu_forward, (float *out, const float *inp, long n), n, sk_gelu_fwd_at(i, out, inp))
SK_KERNEL(sk_gelu_backward, (float *dinp, const float *inp, const float *dout, long n), n,
          sk_gelu_bwd_at(i, dinp, inp, dout))
SK_KERNEL(sk_residual_forward, (float *out, const float *a, const float *b, long n), n,
          sk_add_at(i, out, a, b))
SK_KERNEL(sk_residual_backward, (float *da, float *db, const float *dout, long n), n,
          sk_acc2_at(i, da, db, dout))
SK_KERNEL(sk_scale, (float *x, float s, long n), n, sk_scale_at(i, x, s))
SK_KERNEL(sk_adamw, (float *p, const float *g, float *m, float *v, float lr, float b1, float b2,
                     float eps, float wd, float bc1, float bc2, long n),
          n, sk_adamw_at(i, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2))
SK_KERNEL(sk_layernorm_forward,
          (float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
           int N, int C),
          N, sk_ln_fwd_row(i, out, mean, rstd, inp, w, b, C))
SK_KERNEL(sk_layernorm_backward_dinp,
          (float *dinp, const float *dout, const float *inp, const float *w, const float *mean,
           const float *rstd, int N, int C),
          N, sk_ln_bwd_dinp_row(i, dinp, dout, inp, w, mean, rstd, C))
SK_KERNEL(sk_layernorm_backward_dparams,
          (float *dw, float *db, const float *dout, const float *inp, const float *mean,
           const float *rstd, int N, int C),
          C, sk_ln_bwd_dparams_col(i, dw, db, dout, inp, mean, rstd, N, C))
SK_KERNEL(sk_encoder_forward,
          (float *out, const int *tokens, const float *wte, const float *wpe, int B, int T, int C),
          (long)B * T, sk_enc_fwd_row(i, out, tokens, wte, wpe, T, C))
SK_KERNEL(sk_encoder_backward,
          (float *dwte, float *dwpe, const float *dout, const int *tokens, int B, int T, int C), C,
          sk_enc_bwd_col(i, dwte, dwpe, dout, tokens, B, T, C))
SK_KERNEL(sk_softmax_xent_forward,
          (float *losses, float *probs, const float *logits, const int *targets, int N, int V,
           int Vp),
          N, sk_smce_fwd_row(i, losses, probs, logits, targets, V, Vp))
SK_KERNEL(sk_softmax_xent_backward,
          (float *dlogits, const float *probs, const int *targets, float dloss, int N, int V,
           int Vp),
          N, sk_smce_bwd_row(i, dlogits, probs, targets, dloss, V, Vp))

SK_KERNEL(sk_attention_softmax, (float *pre, float *att, long rows, int T), rows,
          sk_att_softmax_row(i, pre, att, T))
SK_KERNEL(sk_attention_softmax_backward,
          (float *dpre, const float *att, const float *datt, long rows, int T), rows,
          sk_att_softmax_bwd_row(i, dpre, att, datt, T))
SK_KERNEL(sk_bias_add, (float *out, const float *bias, long n, int OC), n,
          sk_bias_add_at(i, out, bias, OC))
SK_KERNEL(sk_bias_backward, (float *dbias, const float *dout, int N, int OC), OC,
          sk_bias_bwd_col(i, dbias, dout, N, OC))
SK_KERNEL(sk_sumsq_parts, (double *part, const float *x, long n, long P), P,
          sk_sumsq_part_at(i, part, x, n, P))

#endif
