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

// skein_sgemm_ex is skein_sgemm with two optional fusions (NULL: off), for
// the layer kernels: bias (N) makes the result alpha * op(A) @ op(B) + bias
// (beta and C's old contents are ignored), and rowsum (M) gets += each row
// of op(A) summed in an order that depends only on K (the dbias of a matmul
// backward, read while A is packed). Both keep skein_sgemm's bit-identity
// across thread counts.
void skein_sgemm_ex(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc,
                    const float *bias, float *rowsum, int nthreads);

// skein_gemm_isa names the instruction set the dispatcher chose:
// "avx512", "avx2" or "portable".
const char *skein_gemm_isa(void);

// skein_gemm_force_isa selects "portable", "avx2" or "avx512" for later
// calls (NULL or "" restores the best the CPU supports). It returns -1, and
// changes nothing, if the name is unknown or the CPU lacks the instructions.
// The environment variable SKEIN_GEMM_ISA does the same at first use.
int skein_gemm_force_isa(const char *name);

// ---- Layer kernels (layers.c) ----
// Semantics are documented on the Go Device interface (device.go). Every
// kernel takes nthreads (>= 1) and is bit-identical across runs and thread
// counts. Backward kernels accumulate into their gradient outputs.

// skein_layers_isa names the variant the layer kernels use: "avx512", "avx2"
// or "portable". skein_layers_set_isa forces one (for tests); it returns 0 if
// the CPU cannot run it.
const char *skein_layers_isa(void);
int skein_layers_set_isa(const char *name);

void skein_encoder_forward(float *out, const int32_t *tokens, const float *wte,
                           const float *wpe, int B, int T, int C, int nthreads);
void skein_encoder_backward(float *dwte, float *dwpe, const float *dout,
                            const int32_t *tokens, int B, int T, int C, int nthreads);
void skein_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                             const float *weight, const float *bias, int N, int C,
                             int nthreads);
void skein_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                              const float *inp, const float *weight, const float *mean,
                              const float *rstd, int N, int C, int nthreads);
// bias and dbias may be NULL.
void skein_matmul_forward(float *out, const float *inp, const float *weight,
                          const float *bias, int N, int C, int OC, int nthreads);
void skein_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, int N, int C, int OC,
                           int nthreads);
// Masked (j > t) entries of preatt and att are written as 0.
void skein_attention_forward(float *out, float *preatt, float *att, const float *inp, int B,
                             int T, int C, int NH, int nthreads);
void skein_attention_backward(float *dinp, float *dpreatt, float *datt, const float *dout,
                              const float *inp, const float *att, int B, int T, int C,
                              int NH, int nthreads);
// The fused attention (FlashAttention-2; ewise_cpu.c, the row functions of
// ewise_kernels.h over OpenMP): lse and delta are (B,NH,T); delta is
// scratch. Head size C/NH at most 256 (SK_FLASH_MAX_HS).
void skein_flash_attention_forward(float *out, float *lse, const float *inp, int B, int T, int C,
                                   int NH, int nthreads);
void skein_flash_attention_backward(float *dinp, float *delta, const float *dout,
                                    const float *out, const float *inp, const float *lse, int B,
                                    int T, int C, int NH, int nthreads);
void skein_gelu_forward(float *out, const float *inp, long n, int nthreads);
void skein_gelu_backward(float *dinp, const float *inp, const float *dout, long n,
                         int nthreads);
void skein_residual_forward(float *out, const float *a, const float *b, long n, int nthreads);
void skein_residual_backward(float *da, float *db, const float *dout, long n, int nthreads);
void skein_softmax_xent_forward(float *losses, float *probs, const float *logits,
                                const int32_t *targets, int N, int V, int Vp, int nthreads);
void skein_softmax_xent_backward(float *dlogits, const float *probs, const int32_t *targets,
                                 float dloss, int N, int V, int Vp, int nthreads);
void skein_softmax_xent_fused(float *losses, float *logits, const int32_t *targets, float dloss,
                              int N, int V, int Vp, int nthreads);
void skein_adamw_segments(float *params, const float *grads, float *m, float *v, long n,
                          const int64_t *ends, const uint8_t *decay, int nseg, float gscale,
                          float lr, float beta1, float beta2, float eps, float wd, int t,
                          int nthreads);
void skein_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                      const float *a, const float *b, const float *weight,
                                      const float *bias, int N, int C, int nthreads);
double skein_sum_squares(const float *x, long n, int nthreads);
void skein_scale(float *x, float s, long n, int nthreads);
void skein_adamw(float *params, const float *grads, float *m, float *v, long n, float lr,
                 float beta1, float beta2, float eps, float wd, int t, int nthreads);

#endif
