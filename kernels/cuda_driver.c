// The CUDA driver API, loaded at run time with dlopen (cuda.go): no CUDA
// toolkit at build time, only these declarations of our own. Every entry
// point is looked up once; a machine without libcuda.so.1 gets a clear
// error and the CPU backend.
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>
#include "cuda_driver.h"

typedef int (*fn_init)(unsigned);
typedef int (*fn_count)(int *);
typedef int (*fn_get)(int *, int);
typedef int (*fn_name)(char *, int, int);
typedef int (*fn_ctx_create)(void **, unsigned, int);
typedef int (*fn_ctx_destroy)(void *);
typedef int (*fn_ctx_set)(void *);
typedef int (*fn_mod_load)(void **, const void *);
typedef int (*fn_mod_unload)(void *);
typedef int (*fn_mod_fn)(void **, void *, const char *);
typedef int (*fn_alloc)(unsigned long long *, size_t);
typedef int (*fn_free)(unsigned long long);
typedef int (*fn_htod)(unsigned long long, const void *, size_t);
typedef int (*fn_dtoh)(void *, unsigned long long, size_t);
typedef int (*fn_launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         void *, void **, void **);
typedef int (*fn_sync)(void);
typedef int (*fn_errstr)(int, const char **);
typedef int (*fn_memset)(unsigned long long, unsigned, size_t);
typedef int (*fn_meminfo)(size_t *, size_t *);

static void *lib;
static fn_init p_init;
static fn_count p_count;
static fn_get p_get;
static fn_name p_name;
static fn_ctx_create p_ctx_create;
static fn_ctx_destroy p_ctx_destroy;
static fn_ctx_set p_ctx_set;
static fn_mod_load p_mod_load;
static fn_mod_unload p_mod_unload;
static fn_mod_fn p_mod_fn;
static fn_alloc p_alloc;
static fn_free p_free;
static fn_htod p_htod;
static fn_dtoh p_dtoh;
static fn_launch p_launch;
static fn_sync p_sync;
static fn_errstr p_errstr;
static fn_memset p_memset;
static fn_meminfo p_meminfo;

#define LOOKUP(var, name)                                                                         \
    do {                                                                                          \
        var = dlsym(lib, name);                                                                   \
        if (!var) {                                                                               \
            return name;                                                                          \
        }                                                                                         \
    } while (0)

// skcu_load opens the driver; it returns NULL on success, else what failed.
const char *skcu_load(void) {
    if (lib) {
        return NULL;
    }
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        return "libcuda.so.1 not found (no NVIDIA driver on this machine)";
    }
    LOOKUP(p_init, "cuInit");
    LOOKUP(p_count, "cuDeviceGetCount");
    LOOKUP(p_get, "cuDeviceGet");
    LOOKUP(p_name, "cuDeviceGetName");
    LOOKUP(p_ctx_create, "cuCtxCreate_v2");
    LOOKUP(p_ctx_destroy, "cuCtxDestroy_v2");
    LOOKUP(p_ctx_set, "cuCtxSetCurrent");
    LOOKUP(p_mod_load, "cuModuleLoadData");
    LOOKUP(p_mod_unload, "cuModuleUnload");
    LOOKUP(p_mod_fn, "cuModuleGetFunction");
    LOOKUP(p_alloc, "cuMemAlloc_v2");
    LOOKUP(p_free, "cuMemFree_v2");
    LOOKUP(p_htod, "cuMemcpyHtoD_v2");
    LOOKUP(p_dtoh, "cuMemcpyDtoH_v2");
    LOOKUP(p_launch, "cuLaunchKernel");
    LOOKUP(p_sync, "cuCtxSynchronize");
    LOOKUP(p_errstr, "cuGetErrorString");
    LOOKUP(p_memset, "cuMemsetD32_v2");
    LOOKUP(p_meminfo, "cuMemGetInfo_v2");
    return NULL;
}

const char *skcu_error(int code) {
    const char *s = NULL;
    if (p_errstr && p_errstr(code, &s) == 0 && s) {
        return s;
    }
    return "unknown CUDA error";
}

int skcu_init(void) { return p_init(0); }
int skcu_device_count(int *n) { return p_count(n); }
int skcu_device_name(int ordinal, char *name, int len) {
    int dev;
    int rc = p_get(&dev, ordinal);
    if (rc) {
        return rc;
    }
    return p_name(name, len, dev);
}
int skcu_ctx_create(void **ctx, int ordinal) {
    int dev;
    int rc = p_get(&dev, ordinal);
    if (rc) {
        return rc;
    }
    return p_ctx_create(ctx, 0, dev);
}
int skcu_ctx_destroy(void *ctx) { return p_ctx_destroy(ctx); }
int skcu_ctx_set(void *ctx) { return p_ctx_set(ctx); }
int skcu_module_load(void **mod, const char *ptx) { return p_mod_load(mod, ptx); }
int skcu_module_unload(void *mod) { return p_mod_unload(mod); }
int skcu_function(void **fn, void *mod, const char *name) { return p_mod_fn(fn, mod, name); }
int skcu_alloc(unsigned long long *ptr, size_t bytes) { return p_alloc(ptr, bytes); }
int skcu_free(unsigned long long ptr) { return p_free(ptr); }
int skcu_htod(unsigned long long dst, const void *src, size_t bytes) { return p_htod(dst, src, bytes); }
int skcu_dtoh(void *dst, unsigned long long src, size_t bytes) { return p_dtoh(dst, src, bytes); }
int skcu_sync(void) { return p_sync(); }
int skcu_memset32(unsigned long long dst, unsigned v, size_t n) { return p_memset(dst, v, n); }
int skcu_meminfo(size_t *free, size_t *total) { return p_meminfo(free, total); }

// skcu_launch_grid runs fn on a grid of gx*gy*gz blocks of bx threads.
int skcu_launch_grid(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, void **params) {
    if (gx == 0 || gy == 0 || gz == 0) {
        return 0;
    }
    return p_launch(fn, gx, gy, gz, bx, 1, 1, 0, NULL, params, NULL);
}

// cuBLAS, also loaded at run time and optional: without it the GEMMs run
// on sk_gemm_tiled. Only the entry points below are declared; a handle is
// bound to the context current when it is created, and works on the
// legacy default stream, like our launches, so the two stay ordered.
typedef int (*fb_create)(void **);
typedef int (*fb_destroy)(void *);
typedef int (*fb_math)(void *, int);
typedef int (*fb_version)(void *, int *);
typedef int (*fb_sgemm_sb)(void *, int, int, int, int, int, const float *, const float *, int,
                           long long, const float *, int, long long, const float *, float *, int,
                           long long, int);

static void *blas;
static fb_create b_create;
static fb_destroy b_destroy;
static fb_math b_math;
static fb_version b_version;
static fb_sgemm_sb b_sgemm_sb;

#define BLOOKUP(var, name)                                                                        \
    do {                                                                                          \
        var = dlsym(blas, name);                                                                  \
        if (!var) {                                                                               \
            blas = NULL;                                                                          \
            return name;                                                                          \
        }                                                                                         \
    } while (0)

// skcb_load opens the newest cuBLAS it finds (path, if not NULL, first);
// NULL on success, else why not.
const char *skcb_load(const char *path) {
    static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
                                  "libcublas.so"};
    if (blas) {
        return NULL;
    }
    if (path && *path) {
        blas = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    for (size_t i = 0; !blas && i < sizeof(names) / sizeof(names[0]); i++) {
        blas = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (!blas) {
        return "libcublas.so.{13,12,11} not found";
    }
    BLOOKUP(b_create, "cublasCreate_v2");
    BLOOKUP(b_destroy, "cublasDestroy_v2");
    BLOOKUP(b_math, "cublasSetMathMode");
    BLOOKUP(b_version, "cublasGetVersion_v2");
    BLOOKUP(b_sgemm_sb, "cublasSgemmStridedBatched");
    return NULL;
}

int skcb_create(void **h, int tf32, int *version) {
    int rc = b_create(h);
    if (rc) {
        return rc;
    }
    // CUBLAS_TF32_TENSOR_OP_MATH (3) lets single-precision GEMMs round
    // their inputs to TF32 on the tensor cores, accumulating in fp32;
    // CUBLAS_DEFAULT_MATH (0) keeps them in full fp32.
    if ((rc = b_math(*h, tf32 ? 3 : 0)) != 0 || (rc = b_version(*h, version)) != 0) {
        b_destroy(*h);
        *h = NULL;
    }
    return rc;
}

int skcb_destroy(void *h) { return b_destroy(h); }

// skcb_sgemm is a row-major strided-batched GEMM: C = alpha op(A) op(B) +
// beta C, C (M,N). Column-major cuBLAS computes C^T = op(B)^T op(A)^T, so
// the operands swap.
int skcb_sgemm(void *h, int ta, int tb, int M, int N, int K, float alpha, unsigned long long A,
               int lda, long long sa, unsigned long long B, int ldb, long long sb, float beta,
               unsigned long long C, int ldc, long long sc, int batch) {
    return b_sgemm_sb(h, tb, ta, N, M, K, &alpha, (const float *)B, ldb, sb, (const float *)A, lda,
                      sa, &beta, (float *)C, ldc, sc, batch);
}
