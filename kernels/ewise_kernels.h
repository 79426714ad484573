// Element-wise kernels of the training step, written once in a subset of C
// that two compilers take:
//
//   - gcc, for the CPU (ewise_cpu.c): each kernel is a function that loops
//     over its index; the tests run this build against the CPU backend,
//     whose fused attention is this build's row functions over threads;
//   - clang as CUDA (cuda/kernels.cu, `go generate`), to PTX that the CUDA
//     backend embeds and the driver JIT-compiles for the GPU present: each
//     kernel is a __global__ function over one index per thread.
//
// No CUDA headers are used: the qualifiers are clang's attributes, thread
// indices come from the __nvvm_read_ptx_sreg_* builtins, and the only math
// is exp, log and sqrt (SK_EXPF, SK_LOGF, SK_SQRTF), which map to PTX
// instructions on the GPU and to libm on the CPU. The bias corrections of
// AdamW (a pow) are computed by the caller.
//
// Row-wise kernels (SK_ROW_KERNEL) run one row per warp on the GPU: lane
// `lane` of `nl` = 32 takes columns lane, lane+32, ..., and SK_SUM and
// SK_MAX combine the lanes' values with warp shuffles. On the CPU the same
// code runs with one lane (nl = 1), where SK_SUM and SK_MAX are the value
// itself. A row's scalar results are written by lane 0. Reductions over
// rows (a column sum: layernorm's dweight and dbias, the matmul's dbias)
// run in two passes that depend only on the shape, like the CPU backend's:
// partial sums over chunks of SK_RB rows, one (chunk, column) per thread,
// then the chunks in order, one column per thread. The encoder's backward
// runs one (token, column) per thread over the rows grouped by token (no
// two threads write one element).
//
// A lane may keep its columns lane, lane+nl, ... of a row in local arrays
// (the fused attention's q, k, v and accumulators), of a length fixed at
// compile time (SK_FLASH_NJ = SK_FLASH_MAX_HS / SK_NL, SK_NL being nl's
// value), and loop over its nj columns with SK_FOR_LANE_COLS(j, nj): on
// the GPU a fully unrolled loop over the whole array, guarded by j < nj,
// so that the arrays live in registers; on the CPU a plain loop of nj, the
// arrays on the stack. SK_SIMD_SUM(x) before a loop that only adds into x
// lets gcc vectorize that reduction on the CPU (an OpenMP simd reduction:
// a fixed order for a given build); it is empty on the GPU, where the
// lanes already split the loop.
#ifndef SKEIN_EWISE_KERNELS_H
#define SKEIN_EWISE_KERNELS_H

#if defined(__CUDA__)
#define SK_FN static __attribute__((device)) inline
#define SK_EXPF(x) __nvvm_ex2_approx_f((x) * 1.44269504088896341f)
#define SK_LOGF(x) (__nvvm_lg2_approx_f(x) * 0.69314718055994531f)
#define SK_SQRTF(x) __nvvm_sqrt_rn_f(x)
#define SK_NEG_INF (-__builtin_inff())
#define SK_NL 32
#define SK_SIMD_SUM(x)
#define SK_FOR_LANE_COLS(j, nj)                                                                \
    _Pragma("unroll") for (int j = 0; j < SK_FLASH_NJ; j++) if (j < (nj))
#define SK_KERNEL(name, params, n, call)                                                       \
    extern "C" __attribute__((global)) void name params {                                     \
        long i = (long)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() +         \
                 __nvvm_read_ptx_sreg_tid_x();                                                 \
        if (i < (n)) {                                                                         \
            call;                                                                              \
        }                                                                                      \
    }
// One warp per row: launched with 32 threads per row (blocks are whole
// warps, so a warp is all in range or all out and its shuffles are full).
#define SK_ROW_KERNEL(name, params, rows, call)                                                \
    extern "C" __attribute__((global)) void name params {                                     \
        long t = (long)__nvvm_read_ptx_sreg_ctaid_x() * __nvvm_read_ptx_sreg_ntid_x() +         \
                 __nvvm_read_ptx_sreg_tid_x();                                                 \
        long i = t >> 5;                                                                       \
        const int lane = (int)(t & 31), nl = SK_NL;                                            \
        if (i < (rows)) {                                                                      \
            call;                                                                              \
        }                                                                                      \
    }
static __attribute__((device)) inline float sk_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 0x1f);
    return v;
}
static __attribute__((device)) inline float sk_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) {
        float u = __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 0x1f);
        v = u > v ? u : v;
    }
    return v;
}
#define SK_SUM(x) sk_warp_sum(x)
#define SK_MAX(x) sk_warp_max(x)
#else
#include <math.h>
#define SK_FN static inline
#define SK_EXPF(x) expf(x)
#define SK_LOGF(x) logf(x)
#define SK_SQRTF(x) sqrtf(x)
#define SK_NEG_INF (-INFINITY)
#define SK_NL 1
#define SK_PRAGMA(x) _Pragma(#x)
#define SK_SIMD_SUM(x) SK_PRAGMA(omp simd reduction(+ : x))
#define SK_FOR_LANE_COLS(j, nj) for (int j = 0; j < (nj); j++)
#define SK_KERNEL(name, params, n, call)                                                       \
    void name params {                                                                         \
        for (long i = 0; i < (n); i++) {                                                       \
            call;                                                                              \
        }                                                                                      \
    }
#define SK_ROW_KERNEL(name, params, rows, call)                                                \
    void name params {                                                                         \
        const int lane = 0, nl = SK_NL;                                                        \
        for (long i = 0; i < (rows); i++) {                                                    \
            call;                                                                              \
        }                                                                                      \
    }
#define SK_SUM(x) (x)
#define SK_MAX(x) (x)
#endif

// SK_RB is the rows of one chunk of a column sum.
#define SK_RB 64

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
SK_FN void sk_adamw_upd(long i, float *p, float gi, float *m, float *v, float lr, float b1,
                        float b2, float eps, float wd, float bc1, float bc2) {
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * ((mi / bc1) / (SK_SQRTF(vi / bc2) + eps) + wd * p[i]);
}

SK_FN void sk_adamw_at(long i, float *p, const float *g, float *m, float *v, float lr, float b1,
                       float b2, float eps, float wd, float bc1, float bc2) {
    sk_adamw_upd(i, p, g[i], m, v, lr, b1, b2, eps, wd, bc1, bc2);
}

// AdamW over the segments of flat buffers (one launch for a whole model):
// seg holds the nseg segments' ends (increasing, the last n), then their
// decay flags; element i takes the weight decay of the first segment
// ending past it, and its gradient times gscale (a clip's scale).
SK_FN void sk_adamw_seg_at(long i, float *p, const float *g, float *m, float *v, const int *seg,
                           int nseg, float gscale, float lr, float b1, float b2, float eps,
                           float wd, float bc1, float bc2) {
    int a = 0, b = nseg;
    while (a < b) {
        int mid = (a + b) / 2;
        if ((long)seg[mid] > i)
            b = mid;
        else
            a = mid + 1;
    }
    float d = a < nseg && seg[nseg + a] ? wd : 0.0f;
    sk_adamw_upd(i, p, g[i] * gscale, m, v, lr, b1, b2, eps, d, bc1, bc2);
}

#define SK_LN_EPS 1e-5f

// LayerNorm of row n: out = (x - mean) * rstd * w + b; mean and rstd saved.
SK_FN void sk_ln_fwd_row(long n, int lane, int nl, float *out, float *mean, float *rstd,
                         const float *inp, const float *w, const float *b, int C) {
    const float *x = inp + n * C;
    float *o = out + n * C;
    float s = 0.0f;
    for (int i = lane; i < C; i += nl) s += x[i];
    float m = SK_SUM(s) / (float)C;
    float v = 0.0f;
    for (int i = lane; i < C; i += nl) v += (x[i] - m) * (x[i] - m);
    float rs = 1.0f / SK_SQRTF(SK_SUM(v) / (float)C + SK_LN_EPS);
    for (int i = lane; i < C; i += nl) o[i] = (x[i] - m) * rs * w[i] + b[i];
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = rs;
    }
}

// The residual and the LayerNorm that follows it, row n: res = a + b, then
// out = LayerNorm(res). Each lane reads back only the columns it wrote
// (sk_ln_fwd_row takes the same columns), so no lane waits for another.
SK_FN void sk_res_ln_fwd_row(long n, int lane, int nl, float *res, float *out, float *mean,
                             float *rstd, const float *a, const float *b, const float *w,
                             const float *bias, int C) {
    long o = n * C;
    for (int i = lane; i < C; i += nl) res[o + i] = a[o + i] + b[o + i];
    sk_ln_fwd_row(n, lane, nl, out, mean, rstd, res, w, bias, C);
}

// LayerNorm backward, the input gradient of row n (accumulated).
SK_FN void sk_ln_bwd_dinp_row(long n, int lane, int nl, float *dinp, const float *dout,
                              const float *inp, const float *w, const float *mean,
                              const float *rstd, int C) {
    const float *d = dout + n * C, *x = inp + n * C;
    float *dx = dinp + n * C;
    float m = mean[n], rs = rstd[n], a = 0.0f, bs = 0.0f;
    for (int i = lane; i < C; i += nl) {
        a += w[i] * d[i];
        bs += w[i] * d[i] * (x[i] - m) * rs;
    }
    a = SK_SUM(a) / (float)C;
    bs = SK_SUM(bs) / (float)C;
    for (int i = lane; i < C; i += nl) dx[i] += rs * (w[i] * d[i] - a - (x[i] - m) * rs * bs);
}

// LayerNorm backward, pass 1 of the weight and bias gradients: element q =
// p*C + i sums column i over rows [p*SK_RB, (p+1)*SK_RB) into part (two
// rows of C per chunk: dweight's, then dbias's).
SK_FN void sk_ln_dparams_part(long q, float *part, const float *dout, const float *inp,
                              const float *mean, const float *rstd, int N, int C) {
    long p = q / C, i = q % C;
    long n1 = (p + 1) * SK_RB < N ? (p + 1) * SK_RB : N;
    float sw = 0.0f, sb = 0.0f;
    for (long n = p * SK_RB; n < n1; n++) {
        float d = dout[n * C + i];
        sw += (inp[n * C + i] - mean[n]) * rstd[n] * d;
        sb += d;
    }
    part[p * 2 * C + i] = sw;
    part[p * 2 * C + C + i] = sb;
}

// Pass 2: the chunks of column i, in order, added to dw and db.
SK_FN void sk_ln_dparams_sum(long i, float *dw, float *db, const float *part, int N, int C) {
    long np = (N + SK_RB - 1) / SK_RB;
    float sw = 0.0f, sb = 0.0f;
    for (long p = 0; p < np; p++) {
        sw += part[p * 2 * C + i];
        sb += part[p * 2 * C + C + i];
    }
    dw[i] += sw;
    db[i] += sb;
}

// Softmax and cross-entropy of row n over the first V of Vp logits.
SK_FN void sk_smce_fwd_row(long n, int lane, int nl, float *losses, float *probs,
                           const float *logits, const int *targets, int V, int Vp) {
    const float *l = logits + n * Vp;
    float *p = probs + n * Vp;
    float mx = SK_NEG_INF;
    for (int i = lane; i < V; i += nl) mx = l[i] > mx ? l[i] : mx;
    mx = SK_MAX(mx);
    float s = 0.0f;
    for (int i = lane; i < V; i += nl) {
        p[i] = SK_EXPF(l[i] - mx);
        s += p[i];
    }
    s = SK_SUM(s);
    float inv = 1.0f / s;
    for (int i = lane; i < V; i += nl) p[i] *= inv;
    for (int i = V + lane; i < Vp; i += nl) p[i] = 0.0f;
    if (lane == 0) losses[n] = SK_LOGF(s) - (l[targets[n]] - mx);
}

// The forward and the backward in one pass, in place: logits' row n
// becomes dloss * (softmax - onehot(target)) in its first V columns and 0
// in the padding, the bits sk_smce_fwd_row then sk_smce_bwd_row into zeroed
// dlogits give, without a probs row. Every lane reads the target's logit
// before the max's shuffle, which no lane passes before all arrive, and
// writes only after it.
SK_FN void sk_smce_fused_row(long n, int lane, int nl, float *losses, float *logits,
                             const int *targets, float dloss, int V, int Vp) {
    float *l = logits + n * Vp;
    const int t = targets[n];
    const float lt = l[t];
    float mx = SK_NEG_INF;
    for (int i = lane; i < V; i += nl) mx = l[i] > mx ? l[i] : mx;
    mx = SK_MAX(mx);
    float s = 0.0f;
    for (int i = lane; i < V; i += nl) {
        float e = SK_EXPF(l[i] - mx);
        l[i] = e;
        s += e;
    }
    s = SK_SUM(s);
    float inv = 1.0f / s;
    for (int i = lane; i < V; i += nl) {
        float p = l[i] * inv;
        l[i] = dloss * (i == t ? p - 1.0f : p);
    }
    for (int i = V + lane; i < Vp; i += nl) l[i] = 0.0f;
    if (lane == 0) losses[n] = SK_LOGF(s) - (lt - mx);
}

// Its backward: dlogits += dloss * (probs - onehot(target)) (accumulated;
// each lane writes only its own columns).
SK_FN void sk_smce_bwd_row(long n, int lane, int nl, float *dlogits, const float *probs,
                           const int *targets, float dloss, int V, int Vp) {
    float *dl = dlogits + n * Vp;
    const float *p = probs + n * Vp;
    int t = targets[n];
    for (int i = lane; i < V; i += nl) dl[i] += dloss * (i == t ? p[i] - 1.0f : p[i]);
}

// The encoder, element q = n*C + i of row n = b*T + t: out = wte[token] +
// wpe[t] (one element per thread: adjacent threads, adjacent columns).
SK_FN void sk_enc_fwd_at(long q, float *out, const int *tokens, const float *wte, const float *wpe,
                         int T, int C) {
    long n = q / C, i = q % C;
    out[q] = wte[(long)tokens[n] * C + i] + wpe[(n % T) * C + i];
}

// Its backward, the token embeddings' gradient: element q = u*C + i adds
// column i of the rows that hold token toks[u] (rows order[starts[u]] ..
// order[starts[u+1]-1], in row order) to dwte's row of that token. The
// caller groups the rows by token (tokenGroups); each (token, column) has
// one thread, and the additions come in the CPU's order: bit-identical.
SK_FN void sk_enc_bwd_wte_at(long q, float *dwte, const float *dout, const int *toks,
                             const int *starts, const int *order, int C) {
    long u = q / C, i = q % C;
    float *d = dwte + (long)toks[u] * C + i;
    float acc = *d;
    for (int k = starts[u]; k < starts[u + 1]; k++) acc += dout[(long)order[k] * C + i];
    *d = acc;
}

// The position embeddings' gradient: element q = t*C + i adds column i of
// rows t, T+t, 2T+t, ... in order.
SK_FN void sk_enc_bwd_wpe_at(long q, float *dwpe, const float *dout, int B, int T, int C) {
    long t = q / C, i = q % C;
    float acc = dwpe[q];
    for (long b = 0; b < B; b++) acc += dout[(b * T + t) * C + i];
    dwpe[q] = acc;
}

// Causal softmax of attention row r of B*NH*T rows (t = r % T), over the
// preatt row that the GEMM wrote (already scaled): att[j] for j <= t, and
// 0 in both att and preatt after t (the CPU backend's convention).
SK_FN void sk_att_softmax_row(long r, int lane, int nl, float *pre, float *att, int T) {
    int t = (int)(r % T);
    float *p = pre + r * T, *a = att + r * T;
    float mx = SK_NEG_INF;
    for (int j = lane; j <= t; j += nl) mx = p[j] > mx ? p[j] : mx;
    mx = SK_MAX(mx);
    float s = 0.0f;
    for (int j = lane; j <= t; j += nl) {
        a[j] = SK_EXPF(p[j] - mx);
        s += a[j];
    }
    float inv = 1.0f / SK_SUM(s);
    for (int j = lane; j <= t; j += nl) a[j] *= inv;
    for (int j = t + 1 + lane; j < T; j += nl) {
        a[j] = 0.0f;
        p[j] = 0.0f;
    }
}

// Its backward for row r: dpre[j] = att[j] (datt[j] - sum_k att[k] datt[k])
// for j <= t, and 0 after t (so that the GEMMs that follow may run over
// the whole square).
SK_FN void sk_att_softmax_bwd_row(long r, int lane, int nl, float *dpre, const float *att,
                                  const float *datt, int T) {
    int t = (int)(r % T);
    const float *a = att + r * T, *da = datt + r * T;
    float *dp = dpre + r * T;
    float s = 0.0f;
    for (int j = lane; j <= t; j += nl) s += a[j] * da[j];
    s = SK_SUM(s);
    for (int j = lane; j <= t; j += nl) dp[j] = a[j] * (da[j] - s);
    for (int j = t + 1 + lane; j < T; j += nl) dp[j] = 0.0f;
}

// Fused causal attention (FlashAttention-2's algorithm, one row per warp):
// the scores and the softmax are recomputed where they are needed, so no
// (B,NH,T,T) matrix exists in memory. inp (B,T,3C) holds q, k, v; head h
// of row (b, t) is columns h*hs .. h*hs+hs-1 of each third (hs = C/NH); out
// and dout are (B,T,C); lse and delta are (B,NH,T). A row r of B*NH*T is
// (b, h, t) with r = (b*NH + h)*T + t. A lane keeps its columns lane,
// lane+nl, ... of a head's vectors in arrays of SK_FLASH_NJ, which bounds
// the head size by SK_FLASH_MAX_HS (the callers check). Every score is
// dot(q_t, k_s) summed in the same order and then scaled, in all three
// kernels, so the backward sees the forward's scores.

// SK_FLASH_MAX_HS is the largest head size of the fused attention.
#define SK_FLASH_MAX_HS 256
#define SK_FLASH_NJ (SK_FLASH_MAX_HS / SK_NL)

// sk_flash_nj is how many columns of a head of hs lane takes (clamped to
// SK_FLASH_NJ, which the callers' check of hs makes a no-op).
SK_FN int sk_flash_nj(int hs, int lane, int nl) {
    int nj = (hs - lane + nl - 1) / nl;
    return nj < SK_FLASH_NJ ? nj : SK_FLASH_NJ;
}

// Forward of query row r: for each key s <= t, in order, the score x =
// dot(q_t, k_s) / sqrt(hs) updates the running maximum m and sum l of
// exp(x - m) (rescaling the sum and the accumulator when m grows), and the
// accumulator adds exp(x - m) v_s. out = acc / l; lse = m + log(l).
SK_FN void sk_flash_fwd_row(long r, int lane, int nl, float *out, float *lse, const float *inp,
                            int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C, nj = sk_flash_nj(hs, lane, nl);
    long t = r % T, bh = r / T, b = bh / NH;
    int h = (int)(bh % NH);
    const float *head = inp + b * T * C3 + h * hs; // q of (b, 0, h)
    const float *q = head + t * C3;
    float qr[SK_FLASH_NJ], acc[SK_FLASH_NJ];
    SK_FOR_LANE_COLS(j, nj) {
        qr[j] = q[lane + j * nl];
        acc[j] = 0.0f;
    }
    float scale = 1.0f / SK_SQRTF((float)hs);
    float m = SK_NEG_INF, l = 0.0f;
    for (long s = 0; s <= t; s++) {
        const float *k = head + s * C3 + C, *v = k + C;
        float x = 0.0f;
        SK_SIMD_SUM(x)
        SK_FOR_LANE_COLS(j, nj) x += qr[j] * k[lane + j * nl];
        x = SK_SUM(x) * scale;
        if (x > m) { // the same in every lane: x is the warp's sum
            float c = SK_EXPF(m - x);
            l *= c;
            SK_FOR_LANE_COLS(j, nj) acc[j] *= c;
            m = x;
        }
        float p = SK_EXPF(x - m);
        l += p;
        SK_FOR_LANE_COLS(j, nj) acc[j] += p * v[lane + j * nl];
    }
    float inv = 1.0f / l, *o = out + (b * T + t) * C + h * hs;
    SK_FOR_LANE_COLS(j, nj) o[lane + j * nl] = acc[j] * inv;
    if (lane == 0) lse[r] = m + SK_LOGF(l);
}

// Backward, pass 1, query row r: delta_t = dot(dout_t, out_t) (saved for
// pass 2), and for each key s <= t the recomputed p = exp(x - lse_t), dp =
// dot(dout_t, v_s) and ds = p (dp - delta_t) give dq_t += ds k_s; dq_t /
// sqrt(hs) is added to dinp's q.
SK_FN void sk_flash_bwd_q_row(long r, int lane, int nl, float *dinp, float *delta,
                              const float *dout, const float *out, const float *inp,
                              const float *lse, int T, int C, int NH) {
    int hs = C / NH, C3 = 3 * C, nj = sk_flash_nj(hs, lane, nl);
    long t = r % T, bh = r / T, b = bh / NH;
    int h = (int)(bh % NH);
    const float *head = inp + b * T * C3 + h * hs;
    const float *q = head + t * C3;
    const float *d = dout + (b * T + t) * C + h * hs, *o = out + (b * T + t) * C + h * hs;
    float qr[SK_FLASH_NJ], dr[SK_FLASH_NJ], dq[SK_FLASH_NJ];
    float D = 0.0f;
    SK_FOR_LANE_COLS(j, nj) {
        qr[j] = q[lane + j * nl];
        dr[j] = d[lane + j * nl];
        dq[j] = 0.0f;
    }
    SK_SIMD_SUM(D)
    SK_FOR_LANE_COLS(j, nj) D += dr[j] * o[lane + j * nl];
    D = SK_SUM(D);
    if (lane == 0) delta[r] = D;
    float scale = 1.0f / SK_SQRTF((float)hs), L = lse[r];
    for (long s = 0; s <= t; s++) {
        const float *k = head + s * C3 + C, *v = k + C;
        float x = 0.0f, dp = 0.0f;
        SK_SIMD_SUM(x)
        SK_FOR_LANE_COLS(j, nj) x += qr[j] * k[lane + j * nl];
        SK_SIMD_SUM(dp)
        SK_FOR_LANE_COLS(j, nj) dp += dr[j] * v[lane + j * nl];
        x = SK_SUM(x) * scale;
        dp = SK_SUM(dp);
        float ds = SK_EXPF(x - L) * (dp - D);
        SK_FOR_LANE_COLS(j, nj) dq[j] += ds * k[lane + j * nl];
    }
    float *g = dinp + (b * T + t) * C3 + h * hs;
    SK_FOR_LANE_COLS(j, nj) g[lane + j * nl] += dq[j] * scale;
}

// Backward, pass 2, key row r (s = r % T): for each query t >= s the same
// p and ds as pass 1 (delta_t from it) give dk_s += ds q_t and dv_s += p
// dout_t; dk_s / sqrt(hs) and dv_s are added to dinp's k and v.
SK_FN void sk_flash_bwd_kv_row(long r, int lane, int nl, float *dinp, const float *delta,
                               const float *dout, const float *inp, const float *lse, int T,
                               int C, int NH) {
    int hs = C / NH, C3 = 3 * C, nj = sk_flash_nj(hs, lane, nl);
    long s = r % T, bh = r / T, b = bh / NH;
    int h = (int)(bh % NH);
    const float *head = inp + b * T * C3 + h * hs;
    const float *k = head + s * C3 + C, *v = k + C;
    const float *L = lse + bh * T, *Dl = delta + bh * T;
    float kr[SK_FLASH_NJ], vr[SK_FLASH_NJ], dk[SK_FLASH_NJ], dv[SK_FLASH_NJ];
    SK_FOR_LANE_COLS(j, nj) {
        kr[j] = k[lane + j * nl];
        vr[j] = v[lane + j * nl];
        dk[j] = 0.0f;
        dv[j] = 0.0f;
    }
    float scale = 1.0f / SK_SQRTF((float)hs);
    for (long t = s; t < T; t++) {
        const float *q = head + t * C3, *d = dout + (b * T + t) * C + h * hs;
        float x = 0.0f, dp = 0.0f;
        SK_SIMD_SUM(x)
        SK_FOR_LANE_COLS(j, nj) x += q[lane + j * nl] * kr[j];
        SK_SIMD_SUM(dp)
        SK_FOR_LANE_COLS(j, nj) dp += d[lane + j * nl] * vr[j];
        x = SK_SUM(x) * scale;
        dp = SK_SUM(dp);
        float p = SK_EXPF(x - L[t]), ds = p * (dp - Dl[t]);
        SK_FOR_LANE_COLS(j, nj) {
            dk[j] += ds * q[lane + j * nl];
            dv[j] += p * d[lane + j * nl];
        }
    }
    float *g = dinp + (b * T + s) * C3 + C + h * hs;
    SK_FOR_LANE_COLS(j, nj) {
        g[lane + j * nl] += dk[j] * scale;
        g[C + lane + j * nl] += dv[j];
    }
}

// The matmul's bias, added to element i of out (N,OC): out[i] += bias[i % OC].
SK_FN void sk_bias_add_at(long i, float *out, const float *bias, int OC) { out[i] += bias[i % OC]; }

// The bias gradient, pass 1: element q = p*OC + i sums column i of dout
// over the rows of chunk p into part.
SK_FN void sk_bias_part(long q, float *part, const float *dout, int N, int OC) {
    long p = q / OC, i = q % OC;
    long n1 = (p + 1) * SK_RB < N ? (p + 1) * SK_RB : N;
    float s = 0.0f;
    for (long n = p * SK_RB; n < n1; n++) s += dout[n * OC + i];
    part[p * OC + i] = s;
}

// Pass 2: column i's chunks, in order, added to dbias.
SK_FN void sk_bias_sum(long i, float *dbias, const float *part, int N, int OC) {
    long np = (N + SK_RB - 1) / SK_RB;
    float s = 0.0f;
    for (long p = 0; p < np; p++) s += part[p * OC + i];
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
SK_KERNEL(sk_adamw_segments,
          (float *p, const float *g, float *m, float *v, const int *seg, int nseg, float gscale,
           float lr, float b1, float b2, float eps, float wd, float bc1, float bc2, long n),
          n, sk_adamw_seg_at(i, p, g, m, v, seg, nseg, gscale, lr, b1, b2, eps, wd, bc1, bc2))
SK_KERNEL(sk_adamw, (float *p, const float *g, float *m, float *v, float lr, float b1, float b2,
                     float eps, float wd, float bc1, float bc2, long n),
          n, sk_adamw_at(i, p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2))
SK_ROW_KERNEL(sk_layernorm_forward,
              (float *out, float *mean, float *rstd, const float *inp, const float *w,
               const float *b, int N, int C),
              N, sk_ln_fwd_row(i, lane, nl, out, mean, rstd, inp, w, b, C))
SK_ROW_KERNEL(sk_layernorm_backward_dinp,
              (float *dinp, const float *dout, const float *inp, const float *w,
               const float *mean, const float *rstd, int N, int C),
              N, sk_ln_bwd_dinp_row(i, lane, nl, dinp, dout, inp, w, mean, rstd, C))
SK_KERNEL(sk_layernorm_dparams_part,
          (float *part, const float *dout, const float *inp, const float *mean, const float *rstd,
           int N, int C),
          (long)(N + SK_RB - 1) / SK_RB * C, sk_ln_dparams_part(i, part, dout, inp, mean, rstd, N, C))
SK_KERNEL(sk_layernorm_dparams_sum, (float *dw, float *db, const float *part, int N, int C), C,
          sk_ln_dparams_sum(i, dw, db, part, N, C))
SK_KERNEL(sk_encoder_forward,
          (float *out, const int *tokens, const float *wte, const float *wpe, int B, int T, int C),
          (long)B * T * C, sk_enc_fwd_at(i, out, tokens, wte, wpe, T, C))
SK_KERNEL(sk_encoder_backward_wte,
          (float *dwte, const float *dout, const int *toks, const int *starts, const int *order,
           int U, int C),
          (long)U * C, sk_enc_bwd_wte_at(i, dwte, dout, toks, starts, order, C))
SK_KERNEL(sk_encoder_backward_wpe, (float *dwpe, const float *dout, int B, int T, int C),
          (long)T * C, sk_enc_bwd_wpe_at(i, dwpe, dout, B, T, C))
SK_ROW_KERNEL(sk_softmax_xent_forward,
              (float *losses, float *probs, const float *logits, const int *targets, int N,
               int V, int Vp),
              N, sk_smce_fwd_row(i, lane, nl, losses, probs, logits, targets, V, Vp))
SK_ROW_KERNEL(sk_residual_layernorm_forward,
              (float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
               const float *w, const float *bias, int N, int C),
              N, sk_res_ln_fwd_row(i, lane, nl, res, out, mean, rstd, a, b, w, bias, C))
SK_ROW_KERNEL(sk_softmax_xent_fused,
              (float *losses, float *logits, const int *targets, float dloss, int N, int V, int Vp),
              N, sk_smce_fused_row(i, lane, nl, losses, logits, targets, dloss, V, Vp))
SK_ROW_KERNEL(sk_softmax_xent_backward,
              (float *dlogits, const float *probs, const int *targets, float dloss, int N,
               int V, int Vp),
              N, sk_smce_bwd_row(i, lane, nl, dlogits, probs, targets, dloss, V, Vp))

SK_ROW_KERNEL(sk_attention_softmax, (float *pre, float *att, long rows, int T), rows,
              sk_att_softmax_row(i, lane, nl, pre, att, T))
SK_ROW_KERNEL(sk_attention_softmax_backward,
              (float *dpre, const float *att, const float *datt, long rows, int T), rows,
              sk_att_softmax_bwd_row(i, lane, nl, dpre, att, datt, T))
SK_ROW_KERNEL(sk_flash_attention_forward,
              (float *out, float *lse, const float *inp, long rows, int T, int C, int NH), rows,
              sk_flash_fwd_row(i, lane, nl, out, lse, inp, T, C, NH))
SK_ROW_KERNEL(sk_flash_attention_backward_q,
              (float *dinp, float *delta, const float *dout, const float *out, const float *inp,
               const float *lse, long rows, int T, int C, int NH),
              rows, sk_flash_bwd_q_row(i, lane, nl, dinp, delta, dout, out, inp, lse, T, C, NH))
SK_ROW_KERNEL(sk_flash_attention_backward_kv,
              (float *dinp, const float *delta, const float *dout, const float *inp,
               const float *lse, long rows, int T, int C, int NH),
              rows, sk_flash_bwd_kv_row(i, lane, nl, dinp, delta, dout, inp, lse, T, C, NH))
SK_KERNEL(sk_bias_add, (float *out, const float *bias, long n, int OC), n,
          sk_bias_add_at(i, out, bias, OC))
SK_KERNEL(sk_bias_backward_part, (float *part, const float *dout, int N, int OC),
          (long)(N + SK_RB - 1) / SK_RB * OC, sk_bias_part(i, part, dout, N, OC))
SK_KERNEL(sk_bias_backward_sum, (float *dbias, const float *part, int N, int OC), OC,
          sk_bias_sum(i, dbias, part, N, OC))
SK_KERNEL(sk_sumsq_parts, (double *part, const float *x, long n, long P), P,
          sk_sumsq_part_at(i, part, x, n, P))

#endif
