// Every GPU kernel of the CUDA backend: `go generate ./kernels` compiles
// this file to kernels.ptx with clang, no CUDA toolkit. The element-wise
// and row-wise kernels are written once for the CPU and the GPU
// (../ewise_kernels.h); the tiled GEMM, the fallback when cuBLAS is
// absent, is the GPU's alone (gemm_tiled.cuh).
#include "../ewise_kernels.h"
#include "gemm_tiled.cuh"
