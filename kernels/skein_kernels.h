// C interface of Skein's CPU kernels. Shapes follow llm.c: row-major float32,
// activations (B,T,C), weights (OC,C); backward kernels accumulate.
#ifndef SKEIN_KERNELS_H
#define SKEIN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

// skein_sgemm computes C = alpha * op(A) @ op(B) + beta * C, all row-major.
// op(A) is (M,K): A is (M,K) with leading dimension lda, or (K,M) when transA.
// op(B) is (K,N): B is (K,N) with leading dimension ldb, or (N,K) when transB.
// C is (M,N) with leading dimension ldc. beta = 0 ignores C's old contents
// (NaN included). Threads split M and N only, never K, so the result is
// bit-identical for any thread count. nthreads <= 0 means the OpenMP default.
void skein_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta,
                 float *C, int ldc, int nthreads);

// skein_gemm_isa names the instruction set the dispatcher chose:
// "avx512", "avx2" or "portable".
const char *skein_gemm_isa(void);

#endif
