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

// skcu_launch runs fn over n elements, 256 threads a block, with the
// kernel's parameters as an array of pointers to their values.
int skcu_launch(void *fn, long n, void **params) {
    unsigned blocks = (unsigned)((n + 255) / 256);
    if (n <= 0) {
        return 0;
    }
    return p_launch(fn, blocks, 1, 1, 256, 1, 1, 0, NULL, params, NULL);
}
