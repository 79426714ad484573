// Portable placeholder GEMM; replaced by a blocked, dispatched kernel.
#include "skein_kernels.h"
#include <omp.h>

const char *skein_gemm_isa(void) { return "portable"; }

void skein_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta,
                 float *C, int ldc, int nthreads) {
    if (nthreads <= 0) nthreads = omp_get_max_threads();
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        for (int j = 0; j < N; j++) c[j] = beta == 0.0f ? 0.0f : beta * c[j];
        for (int p = 0; p < K; p++) {
            float a = alpha * (transA ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p]);
            if (transB) {
                for (int j = 0; j < N; j++) c[j] += a * B[(size_t)j * ldb + p];
            } else {
                const float *b = B + (size_t)p * ldb;
                for (int j = 0; j < N; j++) c[j] += a * b[j];
            }
        }
    }
}
