// Package blasref loads OpenBLAS at run time (dlopen) so that the kernels
// tests and benchmarks can compare against it. Only test code imports it:
// the kernels package itself never links a BLAS library.
package blasref

// #cgo LDFLAGS: -ldl
// #include <dlfcn.h>
// #include <stdlib.h>
//
// typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
//                          const float *, int, float, float *, int);
// typedef void (*set_threads_fn)(int);
// typedef char *(*corename_fn)(void);
//
// static void *blas_lib;
// static sgemm_fn blas_sgemm;
// static set_threads_fn blas_set_threads;
// static corename_fn blas_corename;
//
// static const char *blas_open(const char *name) {
//     blas_lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
//     if (blas_lib == NULL) return dlerror();
//     blas_sgemm = (sgemm_fn)dlsym(blas_lib, "cblas_sgemm");
//     blas_set_threads = (set_threads_fn)dlsym(blas_lib, "openblas_set_num_threads");
//     blas_corename = (corename_fn)dlsym(blas_lib, "openblas_get_corename");
//     if (blas_sgemm == NULL) return "cblas_sgemm not found";
//     return NULL;
// }
//
// static void blas_call_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a,
//                             int lda, const float *b, int ldb, float beta, float *c, int ldc) {
//     // 101 CblasRowMajor, 111 CblasNoTrans, 112 CblasTrans.
//     blas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
// }
// static void blas_call_set_threads(int n) { if (blas_set_threads) blas_set_threads(n); }
// static const char *blas_call_corename(void) { return blas_corename ? blas_corename() : "unknown"; }
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// Library is the soname loaded by Load (Debian: libopenblas0-pthread).
const Library = "libopenblas.so.0"

var (
	loadOnce sync.Once
	loadErr  error
)

// Load opens OpenBLAS once; it reports why if the library is absent.
func Load() error {
	loadOnce.Do(func() {
		name := C.CString(Library)
		defer C.free(unsafe.Pointer(name))
		if msg := C.blas_open(name); msg != nil {
			loadErr = fmt.Errorf("blasref: cannot load %s (apt-get install libopenblas0-pthread): %s",
				Library, C.GoString(msg))
		}
	})
	return loadErr
}

// SetThreads calls openblas_set_num_threads.
func SetThreads(n int) { C.blas_call_set_threads(C.int(n)) }

// CoreName is OpenBLAS's name for the kernels it chose (for example
// "Haswell" or "SkylakeX"); OPENBLAS_CORETYPE overrides its choice.
func CoreName() string { return C.GoString(C.blas_call_corename()) }

// Sgemm calls cblas_sgemm, row-major, with the argument order of
// kernels.Sgemm. Load must have succeeded; slices are not checked.
func Sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []float32, ldb int, beta float32, c []float32, ldc int) {
	C.blas_call_sgemm(cbool(transA), cbool(transB), C.int(m), C.int(n), C.int(k), C.float(alpha),
		(*C.float)(unsafe.Pointer(&a[0])), C.int(lda), (*C.float)(unsafe.Pointer(&b[0])), C.int(ldb),
		C.float(beta), (*C.float)(unsafe.Pointer(&c[0])), C.int(ldc))
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
