// Layer kernels of the CPU backend: everything except the GEMM itself.
//
// Structure. Every kernel is a driver (an exported skein_* function) that
// splits its work into independent rows, column blocks or fixed-size chunks
// and runs them with OpenMP, calling a worker for each piece. Workers are
// written once as always-inline generic C and compiled three times (AVX-512,
// AVX2+FMA, baseline x86-64); the variant is chosen once at load time from
// the CPU's features. OpenMP regions stay in the drivers because gcc outlines
// them before inlining, which would lose the target attribute.
//
// Determinism. No kernel uses atomics or scheduling-dependent reductions.
// Reductions across rows are either done by one thread per column in an
// order fixed by the shape (the matmul's dbias, summed by the dweight GEMM
// while it packs dout; the encoder's dwte/dwpe, over fixed column blocks) or
// over fixed chunks of rows whose partial sums are added in chunk order
// (LayerNorm dweight/dbias); SumSquares uses a chunking that depends only on
// the length. Results are therefore bit-identical across runs and across
// thread counts (given skein_sgemm's own guarantee, which splits M and N
// only).
//
// Fusion. The matmul's bias is added by the GEMM's first write of its output
// and dbias is summed inside the dweight GEMM, so neither costs a pass over
// memory; LayerNorm backward reads each row once for dinp, dweight and dbias.
#include "skein_kernels.h"

#include <math.h>
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))

// Column block width for cross-row reductions, and chunk length for
// elementwise kernels. Both are fixed so results never depend on threads.
enum { COLBLOCK = 32, CHUNK = 16384, SSQ_PARTS = 1024, ATT_RB = 32, LN_RB = 64 };

// Lanes of the explicit vectors used by the attention softmax rows.
#define VB 16

static const float GELU_S = 0.7978845608028654f; // sqrt(2/pi)
static const float GELU_K = 0.044715f;
static const float LN_EPS = 1e-5f;

// --- scalar helpers (vectorizable inside omp simd loops) ---

static inline float bits_to_f(int i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static inline int f_to_bits(float f) {
    int i;
    memcpy(&i, &f, sizeof i);
    return i;
}

// fast_sqrtf for x >= 0: bit-trick reciprocal square root refined by two
// Newton steps (relative error ~1e-7). sqrtf itself may set errno, which
// stops gcc from vectorizing the loop (cgo does not allow -fno-math-errno).
INLINE float fast_sqrtf(float x) {
    float y = bits_to_f(0x5f375a86 - (f_to_bits(x) >> 1));
    float hx = 0.5f * x;
    y = y * (1.5f - hx * y * y);
    y = y * (1.5f - hx * y * y);
    return x * y;
}

// fast_expf: Cephes-style range reduction and degree-6 polynomial, relative
// error about 2e-7. Inputs below -87 give 0; above 88 saturate near FLT_MAX.
INLINE float fast_expf(float x) {
    float xc = x > 88.0f ? 88.0f : x;
    xc = xc < -87.0f ? -87.0f : xc;
    const float magic = 12582912.0f; // 1.5 * 2^23: round to nearest int
    float t = xc * 1.44269504088896341f + magic;
    float n = t - magic;
    int ni = (int)n;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    y = y * bits_to_f((ni + 127) << 23);
    return x < -87.0f ? 0.0f : y;
}

// --- generic workers ---

INLINE void k_add(float *out, const float *a, const float *b, long n) {
#pragma omp simd
    for (long i = 0; i < n; i++) out[i] = a[i] + b[i];
}

INLINE void k_acc(float *dst, const float *src, long n) {
#pragma omp simd
    for (long i = 0; i < n; i++) dst[i] += src[i];
}

INLINE void k_scale(float *x, float s, long n) {
#pragma omp simd
    for (long i = 0; i < n; i++) x[i] *= s;
}

// gelu(x) = 0.5x(1+tanh(u)) = x * sigmoid(2u), u = s(x + k x^3).
INLINE void k_gelu_fwd(float *out, const float *inp, long n) {
#pragma omp simd
    for (long i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_S * (x + GELU_K * x * x * x);
        out[i] = x / (1.0f + fast_expf(-2.0f * u));
    }
}

// d gelu/dx = sig + 2 x sig (1-sig) u', sig = sigmoid(2u) = (1+tanh u)/2.
INLINE void k_gelu_bwd(float *dinp, const float *inp, const float *dout, long n) {
#pragma omp simd
    for (long i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_S * (x + GELU_K * x * x * x);
        float du = GELU_S * (1.0f + 3.0f * GELU_K * x * x);
        float sig = 1.0f / (1.0f + fast_expf(-2.0f * u));
        float g = sig + 2.0f * x * sig * (1.0f - sig) * du;
        dinp[i] += g * dout[i];
    }
}

INLINE void k_ln_fwd_row(float *out, float *mean, float *rstd, const float *x,
                         const float *w, const float *b, int C) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < C; i++) s += x[i];
    float m = s / (float)C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int i = 0; i < C; i++) {
        float d = x[i] - m;
        v += d * d;
    }
    float rs = 1.0f / sqrtf(v / (float)C + LN_EPS);
#pragma omp simd
    for (int i = 0; i < C; i++) out[i] = (x[i] - m) * rs * w[i] + b[i];
    *mean = m;
    *rstd = rs;
}

// LayerNorm backward of rows [n0, n1): dx += the input gradient, and pdw, pdb
// (C each, overwritten) get this chunk's dweight and dbias, summed in row
// order. One pass: each row is read once and is in L1 for the second loop.
INLINE void k_ln_bwd_rows(float *dx, float *pdw, float *pdb, const float *dout, const float *x,
                          const float *w, const float *mean, const float *rstd, int n0, int n1,
                          int C) {
#pragma omp simd
    for (int i = 0; i < C; i++) pdw[i] = pdb[i] = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t o = (size_t)n * C;
        const float *d = dout + o, *xr = x + o;
        float *dxr = dx + o;
        float m = mean[n], rs = rstd[n];
        float a = 0.0f, bsum = 0.0f;
#pragma omp simd reduction(+ : a, bsum)
        for (int i = 0; i < C; i++) {
            float dn = w[i] * d[i];
            a += dn;
            bsum += dn * (xr[i] - m) * rs;
        }
        a /= (float)C;
        bsum /= (float)C;
#pragma omp simd
        for (int i = 0; i < C; i++) {
            float nrm = (xr[i] - m) * rs;
            dxr[i] += rs * (w[i] * d[i] - a - nrm * bsum);
            pdw[i] += nrm * d[i];
            pdb[i] += d[i];
        }
    }
}

// dst[c0..c0+nc) += the sum, in order, of np partial rows (leading dimension
// ld) of parts.
INLINE void k_sum_parts(float *dst, const float *parts, int np, int ld, int c0, int nc) {
#pragma omp simd
    for (int i = c0; i < c0 + nc; i++) {
        float s = parts[i];
        for (int p = 1; p < np; p++) s += parts[(size_t)p * ld + i];
        dst[i] += s;
    }
}

// Encoder backward for columns [c0, c0+nc): rows in (b,t) order.
INLINE void k_enc_bwd_block(float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                            int B, int T, int C, int c0, int nc) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            const float *d = dout + n * C + c0;
            float *we = dwte + (size_t)tok[n] * C + c0;
            float *pe = dwpe + (size_t)t * C + c0;
#pragma omp simd
            for (int i = 0; i < nc; i++) {
                we[i] += d[i];
                pe[i] += d[i];
            }
        }
    }
}

// Pairwise (tree) reductions of a VB-lane accumulator, in a fixed order: a
// serial chain of VB scalar adds costs more than the vector work of a row.
INLINE float hsum(float *v) {
    for (int w = VB / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) v[l] += v[l + w];
    return v[0];
}

INLINE float hmax(float *v) {
    for (int w = VB / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) v[l] = v[l + w] > v[l] ? v[l + w] : v[l];
    return v[0];
}

// Causal softmax of row t: preatt[0..t] (already scaled) -> att; entries
// after t are set to 0 in both. When T is a multiple of VB the row is
// processed in whole blocks of VB lanes (masked by j <= t), so the compiler
// emits full vectors with no scalar remainder loop: rows are short (t+1 <= T)
// and the remainders would otherwise cost more than the vector work.
INLINE void k_softmax_causal_row(float *preatt, float *att, int t, int T) {
    if (T % VB != 0) {
        float mx = -INFINITY;
        for (int j = 0; j <= t; j++) mx = preatt[j] > mx ? preatt[j] : mx;
        float s = 0.0f;
        for (int j = 0; j <= t; j++) {
            att[j] = fast_expf(preatt[j] - mx);
            s += att[j];
        }
        float inv = 1.0f / s;
        for (int j = 0; j <= t; j++) att[j] *= inv;
        for (int j = t + 1; j < T; j++) att[j] = preatt[j] = 0.0f;
        return;
    }
    int L = (t + VB) / VB * VB; // t+1 rounded up to whole blocks
    float mv[VB], sv[VB];
    for (int l = 0; l < VB; l++) mv[l] = -INFINITY, sv[l] = 0.0f;
    for (int j0 = 0; j0 < L; j0 += VB)
        for (int l = 0; l < VB; l++) {
            float p = j0 + l <= t ? preatt[j0 + l] : -INFINITY;
            mv[l] = p > mv[l] ? p : mv[l];
        }
    float mx = hmax(mv);
    for (int j0 = 0; j0 < L; j0 += VB)
        for (int l = 0; l < VB; l++) {
            int in = j0 + l <= t;
            float e = fast_expf(preatt[j0 + l] - mx);
            e = in ? e : 0.0f;
            preatt[j0 + l] = in ? preatt[j0 + l] : 0.0f;
            att[j0 + l] = e;
            sv[l] += e;
        }
    float inv = 1.0f / hsum(sv);
    for (int j0 = 0; j0 < L; j0 += VB)
        for (int l = 0; l < VB; l++) att[j0 + l] *= inv;
    for (int j = L; j < T; j++) att[j] = preatt[j] = 0.0f;
}

// dpre[j] = att[j] (datt[j] - sum_k att[k] datt[k]) for j <= t, 0 after.
// att is 0 after t, so whole blocks need no mask.
INLINE void k_softmax_bwd_row(float *dpre, const float *att, const float *datt, int t, int T) {
    if (T % VB != 0) {
        float dot = 0.0f;
        for (int j = 0; j <= t; j++) dot += att[j] * datt[j];
        for (int j = 0; j <= t; j++) dpre[j] = att[j] * (datt[j] - dot);
        for (int j = t + 1; j < T; j++) dpre[j] = 0.0f;
        return;
    }
    int L = (t + VB) / VB * VB;
    float dv[VB];
    for (int l = 0; l < VB; l++) dv[l] = 0.0f;
    for (int j0 = 0; j0 < L; j0 += VB)
        for (int l = 0; l < VB; l++) {
            float a = j0 + l <= t ? att[j0 + l] : 0.0f;
            dv[l] += a * datt[j0 + l];
        }
    float dot = hsum(dv);
    for (int j0 = 0; j0 < L; j0 += VB)
        for (int l = 0; l < VB; l++) {
            float a = j0 + l <= t ? att[j0 + l] : 0.0f;
            dpre[j0 + l] = a * (datt[j0 + l] - dot);
        }
    for (int j = L; j < T; j++) dpre[j] = 0.0f;
}

// exp(x - max) of a row's first V logits into e (which may be x itself:
// each element is read before it is written); returns their sum, and the
// max in *mxp.
INLINE float k_exp_row(float *e, const float *x, int V, float *mxp) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int i = 0; i < V; i++) {
        float ei = fast_expf(x[i] - mx);
        e[i] = ei;
        s += ei;
    }
    *mxp = mx;
    return s;
}

// One row of softmax + cross-entropy; returns the loss.
INLINE float k_smce_fwd_row(float *probs, const float *logits, int target, int V, int Vp) {
    float mx;
    float s = k_exp_row(probs, logits, V, &mx);
    float inv = 1.0f / s;
#pragma omp simd
    for (int i = 0; i < V; i++) probs[i] *= inv;
    for (int i = V; i < Vp; i++) probs[i] = 0.0f;
    return logf(s) - (logits[target] - mx);
}

// The classifier's forward and backward in one pass over a row of logits,
// in place: returns the loss and leaves dloss * (softmax - onehot(target))
// in the first V columns and 0 in the padding, the bits k_smce_fwd_row,
// then k_smce_bwd_row into zeroed dlogits, give (no probs row).
INLINE float k_smce_fused_row(float *l, int target, float dloss, int V, int Vp) {
    const float lt = l[target];
    float mx;
    float s = k_exp_row(l, l, V, &mx);
    float inv = 1.0f / s;
#pragma omp simd
    for (int i = 0; i < V; i++) l[i] = dloss * (l[i] * inv);
    l[target] -= dloss;
    for (int i = V; i < Vp; i++) l[i] = 0.0f;
    return logf(s) - (lt - mx);
}

INLINE void k_smce_bwd_row(float *dlogits, const float *probs, int target, float dloss, int V) {
#pragma omp simd
    for (int i = 0; i < V; i++) dlogits[i] += dloss * probs[i];
    dlogits[target] -= dloss;
}

// AdamW over n elements, the gradient read times gscale (a clip's scale;
// 1 reads it as it is: x * 1 is x).
INLINE void k_adamw_scaled(float *p, const float *g, float *m, float *v, long n, float gscale,
                           float lr, float b1, float b2, float eps, float wd, float bc1,
                           float bc2) {
#pragma omp simd
    for (long i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1;
        float vhat = vi / bc2;
        p[i] -= lr * (mhat / (fast_sqrtf(vhat) + eps) + wd * p[i]);
    }
}

INLINE double k_sumsq(const float *x, long n) {
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (long i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

// --- attention, small-head path ---
//
// For T and hs multiples of 16 (AVX-512 variant only, see DEFINE_ISA below),
// attention runs per (b,h) without packing or the GEMM driver: register-tiled
// micro-kernels read q/k/v straight from inp (k, and v in the backward,
// transposed once per head into a thread-local buffer), MR query rows at a
// time. For a row tile [i0, i0+MR) the forward
// computes the scores only up to column i0+MR (rounded up to 16), runs the
// causal softmax of those rows and multiplies by v while the rows are in L1.
// The backward computes datt, the softmax backward and dq the same way per
// row tile, then dv and dk per tile of MR key rows (columns of att/dpreatt)
// from that key row down. Every element is computed by one thread in a
// fixed order, so results depend neither on runs nor on thread counts.

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));

INLINE v16 ld16(const float *p) { return *(const v16u *)p; }
INLINE void st16(float *p, v16 x) { *(v16u *)p = x; }

enum { ATT_MAXR = 8, ATT_MAXV = 4 };

// C[i, 0..16NV) (+)= alpha * sum_k A[i*sai + k*sak] * B[k*ldb + 0..16NV),
// for i < MR. MR and NV are compile-time constants after inlining.
INLINE void att_mk(const int MR, const int NV, int kn, const float *A, long sai, long sak,
                   const float *B, long ldb, float *C, long ldc, float alpha, int acc) {
    v16 c[ATT_MAXR][ATT_MAXV];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) c[i][v] = (v16){0};
    for (int k = 0; k < kn; k++) {
        v16 b[ATT_MAXV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) b[v] = ld16(B + (size_t)k * ldb + 16 * v);
        const float *a = A + (size_t)k * sak;
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            float ai = a[i * sai];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) c[i][v] += ai * b[v];
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            float *p = C + (size_t)i * ldc + 16 * v;
            v16 r = alpha * c[i][v];
            if (acc) r += ld16(p);
            st16(p, r);
        }
}

// att_mk over W columns (a multiple of 16): NV vectors at a time, then single
// vectors.
INLINE void att_tile(const int MR, const int NV, int W, int kn, const float *A, long sai,
                     long sak, const float *B, long ldb, float *C, long ldc, float alpha,
                     int acc) {
    int j = 0;
    for (; j + 16 * NV <= W; j += 16 * NV)
        att_mk(MR, NV, kn, A, sai, sak, B + j, ldb, C + j, ldc, alpha, acc);
    for (; j < W; j += 16) att_mk(MR, 1, kn, A, sai, sak, B + j, ldb, C + j, ldc, alpha, acc);
}

typedef int v16i __attribute__((vector_size(64)));

INLINE v16 vsplat(float x) { return (v16){0} + x; }
INLINE v16 vsel(v16i m, v16 a, v16 b) { return (v16)((m & (v16i)a) | (~m & (v16i)b)); }
INLINE v16 vmax(v16 a, v16 b) { return vsel(a > b, a, b); }

// The rest of the small-head path, and the AVX-512 workers after it, are
// compiled for the avx512 variant only (X512), with intrinsics where the
// generic vectors have no operator (rcp14, scalef, masked loads).
#if defined(__x86_64__)
#define X512 __attribute__((target("arch=x86-64-v4,prefer-vector-width=512")))

// 1/d within about one ulp: the 14-bit estimate and one Newton step.
X512 static inline v16 x512_rcp(v16 d) {
    v16 r = (v16)_mm512_rcp14_ps((__m512)d);
    return r + r * (1.0f - d * r);
}

X512 static inline __mmask16 x512_tail(long left) { return (__mmask16)((1u << left) - 1); }

// exp(x) with x clamped to [-87, 88] (so x < -87 gives e^-87, about 1.6e-38,
// where fast_expf gives 0): fast_expf's range reduction and polynomial
// (relative error about 2e-7), the polynomial evaluated in Estrin form and
// 2^n applied with scalef, for fewer instructions and a shorter dependency
// chain than the scalar formula vectorized.
X512 static inline v16 x512_exp(v16 x) {
    __m512 xc = _mm512_min_ps(_mm512_max_ps((__m512)x, _mm512_set1_ps(-87.0f)),
                              _mm512_set1_ps(88.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v16 r = (v16)_mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = (v16)_mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), (__m512)r);
    v16 r2 = r * r;
    v16 p01 = 1.9875691500e-4f * r + 1.3981999507e-3f;
    v16 p23 = 8.3334519073e-3f * r + 4.1665795894e-2f;
    v16 p45 = 1.6666665459e-1f * r + 5.0000001201e-1f;
    v16 p = (p01 * r2 + p23) * r2 + p45;
    v16 y = p * r2 + (r + 1.0f);
    return (v16)_mm512_scalef_ps((__m512)y, n);
}

// Tree reductions of the 16 lanes, in a fixed order.
#define SHUF_HI8 ((v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7})
#define SHUF_HI4 ((v16i){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11})
#define SHUF_HI2 ((v16i){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13})
#define SHUF_HI1 ((v16i){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14})

INLINE float vhsum(v16 v) {
    v += __builtin_shuffle(v, SHUF_HI8);
    v += __builtin_shuffle(v, SHUF_HI4);
    v += __builtin_shuffle(v, SHUF_HI2);
    v += __builtin_shuffle(v, SHUF_HI1);
    return v[0];
}

INLINE float vhmax(v16 v) {
    v = vmax(v, __builtin_shuffle(v, SHUF_HI8));
    v = vmax(v, __builtin_shuffle(v, SHUF_HI4));
    v = vmax(v, __builtin_shuffle(v, SHUF_HI2));
    v = vmax(v, __builtin_shuffle(v, SHUF_HI1));
    return v[0];
}

#define LANES ((v16i){0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})

// dp[j] = a[j] (da[j] - sum_k a[k] da[k]) for j <= t, 0 for the rest of the
// diagonal block; dp after that block is left as is (scratch).
INLINE void att_softmax_bwd_row(float *dp, const float *a, const float *da, int t) {
    int nb = t / 16, jd = 16 * nb;
    v16i in = LANES <= t - jd;
    v16 ad = vsel(in, ld16(a + jd), vsplat(0.0f)), dd = vsel(in, ld16(da + jd), vsplat(0.0f));
    v16 s = ad * dd;
    for (int j = 0; j < jd; j += 16) s += ld16(a + j) * ld16(da + j);
    float dot = vhsum(s);
    for (int j = 0; j < jd; j += 16) st16(dp + j, ld16(a + j) * (ld16(da + j) - dot));
    st16(dp + jd, ad * (dd - dot));
}

// One stage of a 16x16 transpose: swaps bit b of the row and column indices.
#define TR_STAGE(r, b, MA, MB)                                                                 \
    for (int i = 0; i < 16; i++)                                                               \
        if (!(i & (b))) {                                                                      \
            v16 x = r[i], y = r[i + (b)];                                                      \
            r[i] = __builtin_shuffle(x, y, MA);                                                \
            r[i + (b)] = __builtin_shuffle(x, y, MB);                                          \
        }

// dst (hs, T) = src (T rows of hs, leading dimension ld) transposed, in
// 16x16 blocks (T and hs multiples of 16).
INLINE void att_transpose(float *restrict dst, const float *restrict src, int T, int hs,
                          long ld) {
    for (int j0 = 0; j0 < T; j0 += 16)
        for (int d0 = 0; d0 < hs; d0 += 16) {
            v16 r[16];
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) r[i] = ld16(src + (size_t)(j0 + i) * ld + d0);
#pragma GCC unroll 16
            TR_STAGE(r, 8, ((v16i){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
                     ((v16i){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}))
#pragma GCC unroll 16
            TR_STAGE(r, 4, ((v16i){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}),
                     ((v16i){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}))
#pragma GCC unroll 16
            TR_STAGE(r, 2, ((v16i){0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}),
                     ((v16i){2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}))
#pragma GCC unroll 16
            TR_STAGE(r, 1, ((v16i){0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}),
                     ((v16i){1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}))
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) st16(dst + (size_t)(d0 + c) * T + j0, r[c]);
        }
}

// st16nt stores with a non-temporal hint when NT (a compile-time constant,
// set for the AVX-512 variant) and the caller found p's rows 64-byte aligned.
INLINE void st16nt(const int NT, int aligned, float *p, v16 x) {
#if defined(__x86_64__)
    if (NT && aligned) {
        __asm__("vmovntps %1, %0" : "=m"(*(v16u *)p) : "v"(x));
        return;
    }
#endif
    st16(p, x);
}

// The forward's softmax row: scores s[0..t] (scaled; in thread scratch) ->
// pre (the masked scores) and a (the probabilities), both written to the
// end of the row with zeros, and al (scratch) gets a's first 16*ceil((t+1)/16).
INLINE void att_softmax_out(const int NT, int aligned, const float *s, float *pre, float *al,
                            float *a, int t, int T) {
    int jd = t / 16 * 16;
    v16i in = LANES <= t - jd;
    v16 xd = vsel(in, ld16(s + jd), vsplat(-INFINITY));
    v16 m = xd;
    for (int j = 0; j < jd; j += 16) m = vmax(m, ld16(s + j));
    float mx = vhmax(m);
    v16 sum = {0};
    for (int j = 0; j < jd; j += 16) {
        v16 x = ld16(s + j), e = x512_exp(x - mx);
        st16nt(NT, aligned, pre + j, x);
        st16(al + j, e);
        sum += e;
    }
    v16 ed = vsel(in, x512_exp(xd - mx), vsplat(0.0f));
    sum += ed;
    st16nt(NT, aligned, pre + jd, vsel(in, xd, vsplat(0.0f)));
    float inv = 1.0f / vhsum(sum);
    for (int j = 0; j < jd; j += 16) {
        v16 e = ld16(al + j) * inv;
        st16(al + j, e);
        st16nt(NT, aligned, a + j, e);
    }
    ed *= inv;
    st16(al + jd, ed);
    st16nt(NT, aligned, a + jd, ed);
    for (int j = jd + 16; j < T; j += 16) {
        st16nt(NT, aligned, a + j, vsplat(0.0f));
        st16nt(NT, aligned, pre + j, vsplat(0.0f));
    }
}

// Forward of one head. Scores and probabilities of the current row tile live
// in thread scratch (s, al: MR x T each, after kt); pre and att are only
// written, with non-temporal stores on AVX-512 (they are read again only by
// the backward, long after they would have left the cache).
INLINE void k_att_fwd_head(const int MR, const int NV, const int NT, float *o, float *pre,
                           float *a, const float *q, const float *kk, const float *v, int T,
                           int hs, int C, float scale, float *scratch) {
    long C3 = 3L * C;
    float *kt = scratch, *s = kt + (size_t)hs * T, *al = s + (size_t)MR * T;
    int aligned = (((uintptr_t)pre | (uintptr_t)a) & 63) == 0;
    att_transpose(kt, kk, T, hs, C3);
    for (int i0 = 0; i0 < T; i0 += MR) {
        int r1 = i0 + MR, W = (r1 + 15) & ~15;
        att_tile(MR, NV, W, hs, q + (size_t)i0 * C3, C3, 1, kt, T, s, T, scale, 0);
        for (int t = i0; t < r1; t++) {
            size_t ro = (size_t)t * T, rl = (size_t)(t - i0) * T;
            att_softmax_out(NT, aligned, s + rl, pre + ro, al + rl, a + ro, t, T);
        }
        att_tile(MR, NV, hs, r1, al, T, 1, v, C3, o + (size_t)i0 * C, C, 1.0f, 0);
    }
#if defined(__x86_64__)
    if (NT && aligned) __asm__ volatile("sfence" ::: "memory");
#endif
}

// Floats of thread scratch the forward needs.
static size_t att_fwd_scratch(int T, int hs) {
    return (size_t)hs * T + 2 * (size_t)ATT_MAXR * T;
}

// The backward keeps datt (one row tile) and dpreatt (the head's T x T) in
// the thread's scratch after vt rather than in the caller's buffers, which
// are scratch too: the working set stays in L2 instead of streaming
// 2 T^2 floats per head through memory.
INLINE void k_att_bwd_head(const int MR, const int NV, float *dq, const float *dO,
                           const float *q, const float *kk, const float *v, const float *a,
                           int T, int hs, int C, float scale, float *scratch) {
    long C3 = 3L * C;
    float *dk = dq + C, *dv = dq + 2 * C;
    float *vt = scratch, *dp = vt + (size_t)hs * T, *da = dp + (size_t)T * T;
    att_transpose(vt, v, T, hs, C3);
    for (int i0 = 0; i0 < T; i0 += MR) {
        int r1 = i0 + MR, W = (r1 + 15) & ~15;
        // att of the next row tile (read once, from memory): fetch it now.
        if (r1 < T)
            for (int t = r1; t < r1 + MR; t++)
                for (int j = 0; j <= t; j += 16) __builtin_prefetch(a + (size_t)t * T + j);
        // datt[t, j<W] = dout[t] . v[j]
        att_tile(MR, NV, W, hs, dO + (size_t)i0 * C, C, 1, vt, T, da, T, 1.0f, 0);
        for (int t = i0; t < r1; t++)
            att_softmax_bwd_row(dp + (size_t)t * T, a + (size_t)t * T, da + (size_t)(t - i0) * T,
                                t);
        // dq[t] += scale * sum_{j<r1} dpre[t,j] k[j]
        att_tile(MR, NV, hs, r1, dp + (size_t)i0 * T, T, 1, kk, C3, dq + (size_t)i0 * C3, C3,
                 scale, 1);
    }
    for (int j0 = 0; j0 < T; j0 += MR) {
        size_t o = (size_t)j0 * T + j0;
        // dv[j] += sum_{t>=j0} att[t,j] dout[t]; dk[j] += scale sum dpre[t,j] q[t]
        att_tile(MR, NV, hs, T - j0, a + o, 1, T, dO + (size_t)j0 * C, C, dv + (size_t)j0 * C3,
                 C3, 1.0f, 1);
        att_tile(MR, NV, hs, T - j0, dp + o, 1, T, q + (size_t)j0 * C3, C3,
                 dk + (size_t)j0 * C3, C3, scale, 1);
    }
}

// Floats of thread scratch the backward needs (the forward needs hs*T).
static size_t att_bwd_scratch(int T, int hs) {
    return (size_t)hs * T + (size_t)T * T + (size_t)ATT_MAXR * T;
}

// The avx512 variant's heads: 8-row micro-tiles of two vectors, and
// non-temporal stores of pre and att.
X512 static void att_fwd_head_x512(float *o, float *p, float *a, const float *q, const float *k,
                                   const float *v, int T, int hs, int C, float sc, float *kt) {
    k_att_fwd_head(8, 2, 1, o, p, a, q, k, v, T, hs, C, sc, kt);
}

X512 static void att_bwd_head_x512(float *dq, const float *dO, const float *q, const float *k,
                                   const float *v, const float *a, int T, int hs, int C,
                                   float sc, float *scr) {
    k_att_bwd_head(8, 2, dq, dO, q, k, v, a, T, hs, C, sc, scr);
}

// --- other AVX-512 workers ---
//
// GELU forward and backward, which the generic code leaves compute-bound on
// AVX-512 (a division and a long dependency chain per vector): x512_exp, and
// a reciprocal estimate refined by one Newton step instead of the division.
// Tails use masked loads and stores, so a tail element gets exactly the
// arithmetic of the others. (AdamW, SumSquares and the elementwise kernels
// are memory-bound; the generic code is as fast.)

// gelu(x) = x * sigmoid(2u), u = s x (1 + k x^2). For large |x| the
// clamped exp gives x (x > 0) or x e^-88, about 0 (x < 0), as gelu does.
X512 static inline v16 x512_gelu(v16 x) {
    v16 m2u = x * ((-2.0f * GELU_S) + (-2.0f * GELU_S * GELU_K) * (x * x));
    return x * x512_rcp(1.0f + x512_exp(m2u));
}

// gelu'(x) = sig (1 + 2 x (1 - sig) u'), sig = sigmoid(2u).
X512 static inline v16 x512_gelu_grad(v16 x) {
    v16 x2 = x * x;
    v16 m2u = x * ((-2.0f * GELU_S) + (-2.0f * GELU_S * GELU_K) * x2);
    v16 du2x = (2.0f * x) * (GELU_S + (3.0f * GELU_S * GELU_K) * x2);
    v16 sig = x512_rcp(1.0f + x512_exp(m2u));
    return sig + sig * ((1.0f - sig) * du2x);
}

X512 static void gelu_fwd_x512(float *out, const float *inp, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16) st16(out + i, x512_gelu(ld16(inp + i)));
    if (i < n) {
        __mmask16 k = x512_tail(n - i);
        v16 y = x512_gelu((v16)_mm512_maskz_loadu_ps(k, inp + i));
        _mm512_mask_storeu_ps(out + i, k, (__m512)y);
    }
}

X512 static void gelu_bwd_x512(float *dinp, const float *inp, const float *dout, long n) {
    long i = 0;
    for (; i + 16 <= n; i += 16)
        st16(dinp + i, ld16(dinp + i) + x512_gelu_grad(ld16(inp + i)) * ld16(dout + i));
    if (i < n) {
        __mmask16 k = x512_tail(n - i);
        v16 x = (v16)_mm512_maskz_loadu_ps(k, inp + i);
        v16 d = (v16)_mm512_maskz_loadu_ps(k, dout + i);
        v16 dx = (v16)_mm512_maskz_loadu_ps(k, dinp + i);
        _mm512_mask_storeu_ps(dinp + i, k, (__m512)(dx + x512_gelu_grad(x) * d));
    }
}

// The avx512 variant's workers that differ from the generic ones.
#define ATT_FWD_v4 att_fwd_head_x512
#define ATT_BWD_v4 att_bwd_head_x512
#define ATT_FWD_v3 NULL
#define ATT_BWD_v3 NULL
#define GELU_FWD_v4 gelu_fwd_x512
#define GELU_BWD_v4 gelu_bwd_x512
#define GELU_FWD_v3 gelu_fwd_v3
#define GELU_BWD_v3 gelu_bwd_v3
#endif
#define ATT_FWD_v0 NULL
#define ATT_BWD_v0 NULL
#define GELU_FWD_v0 gelu_fwd_v0
#define GELU_BWD_v0 gelu_bwd_v0
#define ISA_FN(NAME, SUF) NAME##_##SUF

// --- ISA variants ---

struct isa {
    const char *name;
    void (*add)(float *, const float *, const float *, long);
    void (*acc)(float *, const float *, long);
    void (*scale)(float *, float, long);
    void (*gelu_fwd)(float *, const float *, long);
    void (*gelu_bwd)(float *, const float *, const float *, long);
    void (*ln_fwd_row)(float *, float *, float *, const float *, const float *, const float *,
                       int);
    void (*ln_bwd_rows)(float *, float *, float *, const float *, const float *, const float *,
                        const float *, const float *, int, int, int);
    void (*sum_parts)(float *, const float *, int, int, int, int);
    void (*enc_bwd_block)(float *, float *, const float *, const int32_t *, int, int, int, int,
                          int);
    void (*softmax_causal_row)(float *, float *, int, int);
    void (*softmax_bwd_row)(float *, const float *, const float *, int, int);
    float (*smce_fwd_row)(float *, const float *, int, int, int);
    void (*smce_bwd_row)(float *, const float *, int, float, int);
    float (*smce_fused_row)(float *, int, float, int, int);
    void (*adamw_scaled)(float *, const float *, float *, float *, long, float, float, float,
                         float, float, float, float, float);
    double (*sumsq)(const float *, long);
    void (*att_fwd_head)(float *, float *, float *, const float *, const float *, const float *,
                         int, int, int, float, float *);
    void (*att_bwd_head)(float *, const float *, const float *, const float *, const float *,
                         const float *, int, int, int, float, float *);
};

#define DEFINE_ISA(SUF, NAME, TGT)                                                             \
    TGT static void add_##SUF(float *o, const float *a, const float *b, long n) {              \
        k_add(o, a, b, n);                                                                     \
    }                                                                                          \
    TGT static void acc_##SUF(float *d, const float *s, long n) { k_acc(d, s, n); }            \
    TGT static void scale_##SUF(float *x, float s, long n) { k_scale(x, s, n); }               \
    TGT static void gelu_fwd_##SUF(float *o, const float *x, long n) { k_gelu_fwd(o, x, n); }  \
    TGT static void gelu_bwd_##SUF(float *dx, const float *x, const float *d, long n) {        \
        k_gelu_bwd(dx, x, d, n);                                                               \
    }                                                                                          \
    TGT static void ln_fwd_row_##SUF(float *o, float *m, float *r, const float *x,             \
                                     const float *w, const float *b, int C) {                  \
        k_ln_fwd_row(o, m, r, x, w, b, C);                                                     \
    }                                                                                          \
    TGT static void ln_bwd_rows_##SUF(float *dx, float *pw, float *pb, const float *d,         \
                                      const float *x, const float *w, const float *m,          \
                                      const float *r, int n0, int n1, int C) {                 \
        k_ln_bwd_rows(dx, pw, pb, d, x, w, m, r, n0, n1, C);                                   \
    }                                                                                          \
    TGT static void sum_parts_##SUF(float *d, const float *p, int np, int ld, int c0, int nc) { \
        k_sum_parts(d, p, np, ld, c0, nc);                                                     \
    }                                                                                          \
    TGT static void enc_bwd_block_##SUF(float *we, float *pe, const float *d,                  \
                                        const int32_t *tok, int B, int T, int C, int c0,       \
                                        int nc) {                                              \
        k_enc_bwd_block(we, pe, d, tok, B, T, C, c0, nc);                                      \
    }                                                                                          \
    TGT static void softmax_causal_row_##SUF(float *p, float *a, int t, int T) {               \
        k_softmax_causal_row(p, a, t, T);                                                      \
    }                                                                                          \
    TGT static void softmax_bwd_row_##SUF(float *dp, const float *a, const float *da, int t,   \
                                          int T) {                                             \
        k_softmax_bwd_row(dp, a, da, t, T);                                                    \
    }                                                                                          \
    TGT static float smce_fwd_row_##SUF(float *p, const float *l, int tg, int V, int Vp) {     \
        return k_smce_fwd_row(p, l, tg, V, Vp);                                                \
    }                                                                                          \
    TGT static void smce_bwd_row_##SUF(float *dl, const float *p, int tg, float dloss, int V) { \
        k_smce_bwd_row(dl, p, tg, dloss, V);                                                   \
    }                                                                                          \
    TGT static float smce_fused_row_##SUF(float *l, int tg, float dloss, int V, int Vp) {      \
        return k_smce_fused_row(l, tg, dloss, V, Vp);                                          \
    }                                                                                          \
    TGT static void adamw_scaled_##SUF(float *p, const float *g, float *m, float *v, long n,   \
                                       float gs, float lr, float b1, float b2, float eps,      \
                                       float wd, float bc1, float bc2) {                       \
        k_adamw_scaled(p, g, m, v, n, gs, lr, b1, b2, eps, wd, bc1, bc2);                      \
    }                                                                                          \
    TGT static double sumsq_##SUF(const float *x, long n) { return k_sumsq(x, n); }            \
    static const struct isa isa_##SUF = {                                                      \
        NAME,           add_##SUF,           acc_##SUF,          scale_##SUF,                  \
        ISA_FN(GELU_FWD, SUF), ISA_FN(GELU_BWD, SUF), ln_fwd_row_##SUF, ln_bwd_rows_##SUF,     \
        sum_parts_##SUF, enc_bwd_block_##SUF,                                                  \
        softmax_causal_row_##SUF, softmax_bwd_row_##SUF, smce_fwd_row_##SUF,                   \
        smce_bwd_row_##SUF, smce_fused_row_##SUF, adamw_scaled_##SUF, sumsq_##SUF,              \
        ISA_FN(ATT_FWD, SUF), ISA_FN(ATT_BWD, SUF),                                            \
    };

// Only AVX-512 uses the small-head attention path (ATT_FWD_v4): with 16-lane
// generic vectors split into halves or quarters, AVX2 and baseline code was
// slower than their GEMM-based path.
#if defined(__x86_64__)
DEFINE_ISA(v4, "avx512", X512)
DEFINE_ISA(v3, "avx2", __attribute__((target("arch=x86-64-v3"))))
#endif
DEFINE_ISA(v0, "portable", )

static const struct isa *K = &isa_v0;

__attribute__((constructor)) static void skein_layers_init(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
        K = &isa_v4;
    else if (__builtin_cpu_supports("x86-64-v3"))
        K = &isa_v3;
#endif
}

const char *skein_layers_isa(void) { return K->name; }

int skein_layers_set_isa(const char *name) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (strcmp(name, "avx512") == 0 && __builtin_cpu_supports("x86-64-v4")) {
        K = &isa_v4;
        return 1;
    }
    if (strcmp(name, "avx2") == 0 && __builtin_cpu_supports("x86-64-v3")) {
        K = &isa_v3;
        return 1;
    }
#endif
    if (strcmp(name, "portable") == 0) {
        K = &isa_v0;
        return 1;
    }
    return 0;
}

// --- drivers ---

// att_scratch is the calling thread's buffer of n floats for the attention
// transposes, grown on demand and reused (steady state: no allocation).
static __thread float *tl_att;
static __thread size_t tl_att_cap;

static float *att_scratch(size_t n) {
    if (n > tl_att_cap) {
        free(tl_att);
        tl_att = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
        if (tl_att == NULL) abort();
        tl_att_cap = n;
    }
    return tl_att;
}

// att_small says whether the small-head path handles this shape.
static int att_small(int T, int hs) { return T % 16 == 0 && hs % 16 == 0 && T > 0 && hs > 0; }

// red_scratch is the calling thread's buffer of n floats for the partial
// sums of row reductions (LayerNorm backward), shared with its team for the
// call, grown on demand and reused.
static __thread float *tl_red;
static __thread size_t tl_red_cap;

static float *red_scratch(size_t n) {
    if (n > tl_red_cap) {
        free(tl_red);
        tl_red = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
        if (tl_red == NULL) abort();
        tl_red_cap = n;
    }
    return tl_red;
}

static inline long nchunks(long n) { return (n + CHUNK - 1) / CHUNK; }
static inline long mn(long a, long b) { return a < b ? a : b; }

void skein_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int B, int T, int C, int nthreads) {
    const struct isa *k = K;
    int N = B * T;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int n = 0; n < N; n++) {
        int t = n % T;
        k->add(out + (size_t)n * C, wte + (size_t)tokens[n] * C, wpe + (size_t)t * C, C);
    }
}

void skein_encoder_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                            int B, int T, int C, int nthreads) {
    const struct isa *k = K;
    int nb = (C + COLBLOCK - 1) / COLBLOCK;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nb > 1)
    for (int blk = 0; blk < nb; blk++) {
        int c0 = blk * COLBLOCK;
        k->enc_bwd_block(dwte, dwpe, dout, tokens, B, T, C, c0, (int)mn(COLBLOCK, C - c0));
    }
}

void skein_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, int N, int C,
                             int nthreads) {
    const struct isa *k = K;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        k->ln_fwd_row(out + o, mean + n, rstd + n, inp + o, weight, bias, C);
    }
}

// The residual and the LayerNorm that follows it, a row at a time: res =
// a + b, out = LayerNorm(res); the bits of ResidualForward then
// LayerNormForward, the row still in cache for the second.
void skein_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                      const float *a, const float *b, const float *weight,
                                      const float *bias, int N, int C, int nthreads) {
    const struct isa *k = K;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * C;
        k->add(res + o, a + o, b + o, C);
        k->ln_fwd_row(out + o, mean + n, rstd + n, res + o, weight, bias, C);
    }
}

// LayerNorm backward in one pass over fixed chunks of LN_RB rows: each chunk
// writes its partial dweight and dbias to scratch, and the partials are then
// summed in chunk order per column. The chunking depends only on N.
void skein_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const float *mean,
                              const float *rstd, int N, int C, int nthreads) {
    const struct isa *k = K;
    int np = (N + LN_RB - 1) / LN_RB, nb = (C + COLBLOCK - 1) / COLBLOCK;
    size_t ld = 2 * (size_t)C;
    float *part = red_scratch((size_t)np * ld);
#pragma omp parallel num_threads(nthreads) if (nthreads > 1 && np > 1)
    {
#pragma omp for schedule(static)
        for (int p = 0; p < np; p++)
            k->ln_bwd_rows(dinp, part + p * ld, part + p * ld + C, dout, inp, weight, mean, rstd,
                           p * LN_RB, (int)mn((long)p * LN_RB + LN_RB, N), C);
#pragma omp for schedule(static)
        for (int blk = 0; blk < 2 * nb; blk++) {
            int c0 = (blk % nb) * COLBLOCK;
            float *dst = blk < nb ? dweight : dbias;
            k->sum_parts(dst, part + (blk < nb ? 0 : C), np, (int)ld, c0,
                         (int)mn(COLBLOCK, C - c0));
        }
    }
}

// The bias is added by the GEMM's first write of out, and dbias is summed
// while the dweight GEMM packs dout: neither costs a pass of its own.
void skein_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                          int N, int C, int OC, int nthreads) {
    skein_sgemm_ex(0, 1, N, OC, C, 1.0f, inp, C, weight, C, 0.0f, out, OC, bias, NULL, nthreads);
}

void skein_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int C, int OC,
                           int nthreads) {
    // dinp (N,C) += dout (N,OC) @ weight (OC,C)
    skein_sgemm(0, 0, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C, nthreads);
    // dweight (OC,C) += dout^T (OC,N) @ inp (N,C); dbias (OC) += rows of dout^T
    skein_sgemm_ex(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, NULL, dbias,
                   nthreads);
}

// Attention works per (b,h) on one thread: the small-head path above when T
// and hs are multiples of 16, otherwise single-threaded GEMMs over row blocks
// of ATT_RB that stop at the causal diagonal.
void skein_attention_forward(float *out, float *preatt, float *att, const float *inp, int B,
                             int T, int C, int NH, int nthreads) {
    const struct isa *k = K;
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int BH = B * NH;
#if defined(__x86_64__)
    if (k->att_fwd_head != NULL && att_small(T, hs)) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
        for (int bh = 0; bh < BH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float *q = inp + (size_t)b * T * C3 + (size_t)h * hs;
            k->att_fwd_head(out + (size_t)b * T * C + (size_t)h * hs, preatt + (size_t)bh * T * T,
                            att + (size_t)bh * T * T, q, q + C, q + 2 * C, T, hs, C, scale,
                            att_scratch(att_fwd_scratch(T, hs)));
        }
        return;
    }
#endif
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int bh = 0; bh < BH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = inp + (size_t)b * T * C3 + (size_t)h * hs;
        const float *kk = q + C;
        const float *v = q + 2 * C;
        float *pre = preatt + (size_t)bh * T * T;
        float *a = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * C + (size_t)h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_RB) {
            int rn = (int)mn(ATT_RB, T - r0), r1 = r0 + rn;
            skein_sgemm(0, 1, rn, r1, hs, scale, q + (size_t)r0 * C3, C3, kk, C3, 0.0f,
                        pre + (size_t)r0 * T, T, 1);
            for (int t = r0; t < r1; t++)
                k->softmax_causal_row(pre + (size_t)t * T, a + (size_t)t * T, t, T);
            skein_sgemm(0, 0, rn, hs, r1, 1.0f, a + (size_t)r0 * T, T, v, C3, 0.0f,
                        o + (size_t)r0 * C, C, 1);
        }
    }
}

void skein_attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                              const float *inp, const float *att, int B, int T, int C, int NH,
                              int nthreads) {
    const struct isa *k = K;
    int hs = C / NH;
    int C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    int BH = B * NH;
#if defined(__x86_64__)
    if (k->att_bwd_head != NULL && att_small(T, hs)) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
        for (int bh = 0; bh < BH; bh++) {
            int b = bh / NH, h = bh % NH;
            size_t qo = (size_t)b * T * C3 + (size_t)h * hs, ao = (size_t)bh * T * T;
            const float *q = inp + qo;
            k->att_bwd_head(dinp + qo, dout + (size_t)b * T * C + (size_t)h * hs, q, q + C,
                            q + 2 * C, att + ao, T, hs, C, scale,
                            att_scratch(att_bwd_scratch(T, hs)));
        }
        return;
    }
#endif
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int bh = 0; bh < BH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t qo = (size_t)b * T * C3 + (size_t)h * hs;
        const float *q = inp + qo, *kk = q + C, *v = q + 2 * C;
        float *dq = dinp + qo, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + (size_t)bh * T * T;
        float *da = datt + (size_t)bh * T * T;
        float *dp = dpreatt + (size_t)bh * T * T;
        const float *dO = dout + (size_t)b * T * C + (size_t)h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_RB) {
            int rn = (int)mn(ATT_RB, T - r0), r1 = r0 + rn;
            // datt[t, j<r1] = dout[t] . v[j]
            skein_sgemm(0, 1, rn, r1, hs, 1.0f, dO + (size_t)r0 * C, C, v, C3, 0.0f,
                        da + (size_t)r0 * T, T, 1);
            // dv[j] += sum_{t>=j} att[t,j] dout[t], for j in the block
            skein_sgemm(1, 0, rn, hs, T - r0, 1.0f, a + (size_t)r0 * T + r0, T,
                        dO + (size_t)r0 * C, C, 1.0f, dv + (size_t)r0 * C3, C3, 1);
            for (int t = r0; t < r1; t++)
                k->softmax_bwd_row(dp + (size_t)t * T, a + (size_t)t * T, da + (size_t)t * T, t,
                                   T);
        }
        for (int r0 = 0; r0 < T; r0 += ATT_RB) {
            int rn = (int)mn(ATT_RB, T - r0), r1 = r0 + rn;
            // dq[t] += scale * sum_{j<=t} dpre[t,j] k[j]
            skein_sgemm(0, 0, rn, hs, r1, scale, dp + (size_t)r0 * T, T, kk, C3, 1.0f,
                        dq + (size_t)r0 * C3, C3, 1);
            // dk[j] += scale * sum_{t>=j} dpre[t,j] q[t]
            skein_sgemm(1, 0, rn, hs, T - r0, scale, dp + (size_t)r0 * T + r0, T,
                        q + (size_t)r0 * C3, C3, 1.0f, dk + (size_t)r0 * C3, C3, 1);
        }
    }
}

void skein_gelu_forward(float *out, const float *inp, long n, int nthreads) {
    const struct isa *k = K;
    long nc = nchunks(n);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nc > 1)
    for (long c = 0; c < nc; c++) {
        long o = c * CHUNK;
        k->gelu_fwd(out + o, inp + o, mn(CHUNK, n - o));
    }
}

void skein_gelu_backward(float *dinp, const float *inp, const float *dout, long n,
                         int nthreads) {
    const struct isa *k = K;
    long nc = nchunks(n);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nc > 1)
    for (long c = 0; c < nc; c++) {
        long o = c * CHUNK;
        k->gelu_bwd(dinp + o, inp + o, dout + o, mn(CHUNK, n - o));
    }
}

void skein_residual_forward(float *out, const float *a, const float *b, long n, int nthreads) {
    const struct isa *k = K;
    long nc = nchunks(n);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nc > 1)
    for (long c = 0; c < nc; c++) {
        long o = c * CHUNK;
        k->add(out + o, a + o, b + o, mn(CHUNK, n - o));
    }
}

void skein_residual_backward(float *da, float *db, const float *dout, long n, int nthreads) {
    const struct isa *k = K;
    long nc = nchunks(n);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nc > 1)
    for (long c = 0; c < nc; c++) {
        long o = c * CHUNK, m = mn(CHUNK, n - o);
        k->acc(da + o, dout + o, m);
        k->acc(db + o, dout + o, m);
    }
}

void skein_softmax_xent_forward(float *losses, float *probs, const float *logits,
                                const int32_t *targets, int N, int V, int Vp, int nthreads) {
    const struct isa *k = K;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * Vp;
        losses[n] = k->smce_fwd_row(probs + o, logits + o, targets[n], V, Vp);
    }
}

void skein_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                                 float dloss, int N, int V, int Vp, int nthreads) {
    const struct isa *k = K;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int n = 0; n < N; n++) {
        size_t o = (size_t)n * Vp;
        k->smce_bwd_row(dlogits + o, probs + o, targets[n], dloss, V);
    }
}

void skein_softmax_xent_fused(float *losses, float *logits, const int32_t *targets, float dloss,
                              int N, int V, int Vp, int nthreads) {
    const struct isa *k = K;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1)
    for (int n = 0; n < N; n++) {
        losses[n] = k->smce_fused_row(logits + (size_t)n * Vp, targets[n], dloss, V, Vp);
    }
}

// AdamW over nseg consecutive segments of flat buffers of n in one
// parallel region (the chunks do not depend on the segments): segment j
// ends at ends[j] and decays by wd where decay[j]; gradients are read
// times gscale. Each element's update is k_adamw_scaled's with its segment's wd,
// so the result does not depend on the thread count.
void skein_adamw_segments(float *params, const float *grads, float *m, float *v, long n,
                          const int64_t *ends, const uint8_t *decay, int nseg, float gscale,
                          float lr, float beta1, float beta2, float eps, float wd, int t,
                          int nthreads) {
    const struct isa *k = K;
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    long nc = nchunks(n);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nc > 1)
    for (long c = 0; c < nc; c++) {
        long lo = c * CHUNK, hi = lo + mn(CHUNK, n - lo);
        int a = 0, b = nseg; // the first segment ending past lo
        while (a < b) {
            int mid = (a + b) / 2;
            if (ends[mid] > lo)
                b = mid;
            else
                a = mid + 1;
        }
        for (int j = a; lo < hi && j < nseg; j++) {
            long e = ends[j] < hi ? ends[j] : hi;
            k->adamw_scaled(params + lo, grads + lo, m + lo, v + lo, e - lo, gscale, lr, beta1,
                            beta2, eps, decay[j] ? wd : 0.0f, bc1, bc2);
            lo = e;
        }
    }
}

double skein_sum_squares(const float *x, long n, int nthreads) {
    const struct isa *k = K;
    // The partition depends only on n: SSQ_PARTS parts of equal length
    // (rounded up to a multiple of 64), summed in order at the end.
    double part[SSQ_PARTS];
    long len = (n + SSQ_PARTS - 1) / SSQ_PARTS;
    len = (len + 63) / 64 * 64;
    if (len < 4096) len = 4096;
    long np = (n + len - 1) / len;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && np > 1)
    for (long p = 0; p < np; p++) {
        long o = p * len;
        part[p] = k->sumsq(x + o, mn(len, n - o));
    }
    double s = 0.0;
    for (long p = 0; p < np; p++) s += part[p];
    return s;
}

void skein_scale(float *x, float s, long n, int nthreads) {
    const struct isa *k = K;
    long nc = nchunks(n);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nc > 1)
    for (long c = 0; c < nc; c++) {
        long o = c * CHUNK;
        k->scale(x + o, s, mn(CHUNK, n - o));
    }
}

void skein_adamw(float *params, const float *grads, float *m, float *v, long n, float lr,
                 float beta1, float beta2, float eps, float wd, int t, int nthreads) {
    const struct isa *k = K;
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    long nc = nchunks(n);
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && nc > 1)
    for (long c = 0; c < nc; c++) {
        long o = c * CHUNK;
        k->adamw_scaled(params + o, grads + o, m + o, v + o, mn(CHUNK, n - o), 1.0f, lr, beta1,
                        beta2, eps, wd, bc1, bc2);
    }
}
