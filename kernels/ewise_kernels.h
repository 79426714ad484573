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
// is exp and sqrt (SK_EXPF, SK_SQRTF), which map to PTX instructions on the
// GPU and to libm on the CPU. The bias corrections of AdamW (a pow) are
// computed by the caller.
#ifndef SKEIN_EWISE_KERNELS_H
#define SKEIN_EWISE_KERNELS_H

#if defined(__CUDA__)
#define SK_FN static __attribute__((device)) inline
#define SK_EXPF(x) __nvvm_ex2_approx_f((x) * 1.44269504088896341f)
#define SK_SQRTF(x) __nvvm_sqrt_rn_f(x)
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
#define SK_SQRTF(x) sqrtf(x)
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

#endif
