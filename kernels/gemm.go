package kernels

// #include <stdlib.h>
// #include "skein_kernels.h"
import "C"

import (
	"fmt"
	"math"
	"unsafe"
)

// Sgemm computes C = alpha * op(A) @ op(B) + beta * C in single precision,
// all matrices row-major. op(A) is (M,K): A is (M,K) with leading dimension
// lda, or (K,M) when transA. op(B) is (K,N): B is (K,N) with leading
// dimension ldb, or (N,K) when transB. C is (M,N) with leading dimension ldc.
// beta = 0 ignores C's old contents, NaN included.
//
// threads is the number of OpenMP threads (<= 0: the OpenMP default). Threads
// split M and N, never K, so the result is bit-identical for any thread
// count. Small products use fewer threads than asked.
//
// Sgemm panics with a message naming the argument if a dimension is negative,
// a leading dimension is smaller than its row width, or a slice is too short
// for its shape.
func Sgemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int,
	B []float32, ldb int, beta float32, C []float32, ldc int, threads int) {
	if M < 0 || N < 0 || K < 0 {
		panic(fmt.Sprintf("kernels: Sgemm: negative dimension M=%d N=%d K=%d", M, N, K))
	}
	if M > math.MaxInt32 || N > math.MaxInt32 || K > math.MaxInt32 ||
		lda > math.MaxInt32 || ldb > math.MaxInt32 || ldc > math.MaxInt32 {
		panic(fmt.Sprintf("kernels: Sgemm: dimension over 2^31-1 (M=%d N=%d K=%d lda=%d ldb=%d ldc=%d)",
			M, N, K, lda, ldb, ldc))
	}
	if M == 0 || N == 0 {
		return
	}
	aRows, aCols := M, K
	if transA {
		aRows, aCols = K, M
	}
	bRows, bCols := K, N
	if transB {
		bRows, bCols = N, K
	}
	checkOperand("C", C, M, N, ldc)
	if K > 0 {
		checkOperand("A", A, aRows, aCols, lda)
		checkOperand("B", B, bRows, bCols, ldb)
	} else {
		A, B = nil, nil
	}
	sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads)
}

// sgemm calls the C kernel; the arguments are checked. (Sgemm's parameter C
// hides the cgo package name, hence this second function.)
func sgemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []float32, ldb int, beta float32, c []float32, ldc int, threads int) {
	var pa, pb *C.float
	if k > 0 {
		pa = (*C.float)(unsafe.Pointer(&a[0]))
		pb = (*C.float)(unsafe.Pointer(&b[0]))
	}
	C.skein_sgemm(cbool(transA), cbool(transB), C.int(m), C.int(n), C.int(k), C.float(alpha),
		pa, C.int(max(lda, 1)), pb, C.int(max(ldb, 1)), C.float(beta),
		(*C.float)(unsafe.Pointer(&c[0])), C.int(ldc), C.int(threads))
}

// checkOperand panics unless x can hold a rows x cols row-major matrix with
// leading dimension ld.
func checkOperand(name string, x []float32, rows, cols, ld int) {
	if ld < cols {
		panic(fmt.Sprintf("kernels: Sgemm: ld%s=%d smaller than the %d columns of %s", name, ld, cols, name))
	}
	need := (rows-1)*ld + cols
	if len(x) < need {
		panic(fmt.Sprintf("kernels: Sgemm: %s has %d elements, needs %d for %dx%d with ld%s=%d",
			name, len(x), need, rows, cols, name, ld))
	}
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// GemmISA names the instruction set Sgemm uses: "avx512", "avx2" or
// "portable". It is the best the CPU supports unless the environment variable
// SKEIN_GEMM_ISA names a lower one.
func GemmISA() string {
	return C.GoString(C.skein_gemm_isa())
}

// forceGemmISA makes Sgemm use the named instruction set ("" restores the
// best available). It reports an error if the name is unknown or the CPU
// lacks it. Tests use it to cover every path.
func forceGemmISA(name string) error {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	if C.skein_gemm_force_isa(cs) != 0 {
		return fmt.Errorf("kernels: gemm ISA %q unknown or not supported by this CPU", name)
	}
	return nil
}
