// The element-wise kernels as CUDA (../ewise_kernels.h): `go generate
// ./kernels` compiles this file to ewise.ptx with clang, no CUDA toolkit.
#include "../ewise_kernels.h"
