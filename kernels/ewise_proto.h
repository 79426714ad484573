// Prototypes of the CPU build of ewise_kernels.h (ewise_cpu.c).
#ifndef SKEIN_EWISE_PROTO_H
#define SKEIN_EWISE_PROTO_H
void sk_gelu_forward(float *out, const float *inp, long n);
void sk_gelu_backward(float *dinp, const float *inp, const float *dout, long n);
void sk_residual_forward(float *out, const float *a, const float *b, long n);
void sk_residual_backward(float *da, float *db, const float *dout, long n);
void sk_scale(float *x, float s, long n);
void sk_adamw(float *p, const float *g, float *m, float *v, float lr, float b1, float b2, float eps,
              float wd, float bc1, float bc2, long n);
void sk_adamw_segments(float *p, const float *g, float *m, float *v, const int *seg, int nseg,
                       float gscale, float lr, float b1, float b2, float eps, float wd, float bc1,
                       float bc2, long n);
void sk_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C);
void sk_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd, const float *a,
                                   const float *b, const float *w, const float *bias, int N, int C);
void sk_layernorm_backward_dinp(float *dinp, const float *dout, const float *inp, const float *w,
                                const float *mean, const float *rstd, int N, int C);
void sk_layernorm_dparams_part(float *part, const float *dout, const float *inp,
                               const float *mean, const float *rstd, int N, int C);
void sk_layernorm_dparams_sum(float *dw, float *db, const float *part, int N, int C);
void sk_softmax_xent_forward(float *losses, float *probs, const float *logits, const int *targets,
                             int N, int V, int Vp);
void sk_softmax_xent_fused(float *losses, float *logits, const int *targets, float dloss, int N,
                          int V, int Vp);
void sk_softmax_xent_backward(float *dlogits, const float *probs, const int *targets, float dloss,
                              int N, int V, int Vp);
void sk_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                        int T, int C);
void sk_encoder_backward_wte(float *dwte, const float *dout, const int *toks, const int *starts,
                             const int *order, int U, int C);
void sk_encoder_backward_wpe(float *dwpe, const float *dout, int B, int T, int C);
void sk_attention_softmax(float *pre, float *att, long rows, int T);
void sk_attention_softmax_backward(float *dpre, const float *att, const float *datt, long rows, int T);
void sk_flash_attention_forward(float *out, float *lse, const float *inp, long rows, int T, int C,
                                int NH);
void sk_flash_attention_backward_q(float *dinp, float *delta, const float *dout, const float *out,
                                   const float *inp, const float *lse, long rows, int T, int C,
                                   int NH);
void sk_flash_attention_backward_kv(float *dinp, const float *delta, const float *dout,
                                    const float *inp, const float *lse, long rows, int T, int C,
                                    int NH);
void sk_bias_add(float *out, const float *bias, long n, int OC);
void sk_bias_backward_part(float *part, const float *dout, int N, int OC);
void sk_bias_backward_sum(float *dbias, const float *part, int N, int OC);
void sk_sumsq_parts(double *part, const float *x, long n, long P);
extern const int sk_rb_value; // SK_RB, the rows of one chunk of a column sum
extern const int sk_flash_max_hs_value; // SK_FLASH_MAX_HS, the fused attention's largest head
#endif
