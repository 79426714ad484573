// The CUDA driver entry points Skein uses, loaded with dlopen (cuda_driver.c).
#ifndef SKEIN_CUDA_DRIVER_H
#define SKEIN_CUDA_DRIVER_H
#include <stddef.h>
const char *skcu_load(void);
const char *skcu_error(int code);
int skcu_init(void);
int skcu_device_count(int *n);
int skcu_device_name(int ordinal, char *name, int len);
int skcu_ctx_create(void **ctx, int ordinal);
int skcu_ctx_destroy(void *ctx);
int skcu_ctx_set(void *ctx);
int skcu_module_load(void **mod, const char *ptx);
int skcu_module_unload(void *mod);
int skcu_function(void **fn, void *mod, const char *name);
int skcu_alloc(unsigned long long *ptr, size_t bytes);
int skcu_free(unsigned long long ptr);
int skcu_htod(unsigned long long dst, const void *src, size_t bytes);
int skcu_dtoh(void *dst, unsigned long long src, size_t bytes);
int skcu_sync(void);
int skcu_memset32(unsigned long long dst, unsigned v, size_t n);
int skcu_meminfo(size_t *free, size_t *total);
int skcu_launch_grid(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, void **params);
const char *skcb_load(const char *path);
int skcb_create(void **h, int tf32, int *version);
int skcb_destroy(void *h);
int skcb_sgemm(void *h, int ta, int tb, int M, int N, int K, float alpha, unsigned long long A,
               int lda, long long sa, unsigned long long B, int ldb, long long sb, float beta,
               unsigned long long C, int ldc, long long sc, int batch);
#endif
