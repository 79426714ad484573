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
#endif
