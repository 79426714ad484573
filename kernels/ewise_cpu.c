// The CPU build of the element-wise kernels written once for the CPU and
// the GPU (ewise_kernels.h): the reference the CUDA backend's kernels are
// held to, itself checked against the CPU backend (ewise_test.go).
#include "ewise_kernels.h"
const int sk_rb_value = SK_RB;
