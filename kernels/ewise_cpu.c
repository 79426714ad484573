// The CPU build of the element-wise kernels written once for the CPU and
// the GPU (ewise_kernels.h): the reference the CUDA backend's kernels are
// held to, itself checked against the CPU backend (ewise_test.go). The CPU
// backend's fused attention is also here: the same row functions, over
// OpenMP threads.
#include "ewise_kernels.h"
#include "skein_kernels.h"
const int sk_rb_value = SK_RB;
const int sk_flash_max_hs_value = SK_FLASH_MAX_HS;

// The CPU backend's fused attention (declared in skein_kernels.h): one row
// per iteration, each computed whole by one thread in the order the GPU's
// warp uses, so the result does not depend on the threads or the schedule
// (dynamic: causal rows differ in length). The backward's pass 2 reads the
// delta of every row that pass 1 wrote: two loops.
void skein_flash_attention_forward(float *out, float *lse, const float *inp, int B, int T, int C,
                                   int NH, int nthreads) {
    long rows = (long)B * NH * T;
#pragma omp parallel for num_threads(nthreads) schedule(dynamic, 16) if (nthreads > 1)
    for (long r = 0; r < rows; r++) sk_flash_fwd_row(r, 0, 1, out, lse, inp, T, C, NH);
}

void skein_flash_attention_backward(float *dinp, float *delta, const float *dout,
                                    const float *out, const float *inp, const float *lse, int B,
                                    int T, int C, int NH, int nthreads) {
    long rows = (long)B * NH * T;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
#pragma omp for schedule(dynamic, 16)
        for (long r = 0; r < rows; r++)
            sk_flash_bwd_q_row(r, 0, 1, dinp, delta, dout, out, inp, lse, T, C, NH);
#pragma omp for schedule(dynamic, 16)
        for (long r = 0; r < rows; r++)
            sk_flash_bwd_kv_row(r, 0, 1, dinp, delta, dout, inp, lse, T, C, NH);
    }
}
