// A tiled single-precision GEMM of our own, the CUDA backend's fallback
// when cuBLAS cannot be loaded. Row-major and fully strided, so that one
// kernel serves the matmuls (plain and transposed operands) and attention's
// per-head products (a two-level batch: sequence, then head):
//
//   C[z](m,n) = alpha * sum_k A[z](m,k) B[z](k,n) + beta * C[z](m,n)
//
// with A[z](m,k) = A[z1*as1 + z2*as2 + m*ars + k*acs], likewise B, and
// C[z](m,n) = C[z1*cs1 + z2*cs2 + m*ldc + n], z = blockIdx.z = z1*nb2 + z2.
// beta == 0 never reads C. Each block of 256 threads computes a 64x64 tile
// of C, 4x4 per thread, over K in steps of 16 staged in shared memory; the
// loads walk the operand's contiguous dimension so that a warp's reads
// coalesce. Accumulation is fp32 in k order.
#ifndef SKEIN_GEMM_TILED_CUH
#define SKEIN_GEMM_TILED_CUH

#define SK_TM 64
#define SK_TN 64
#define SK_TK 16

extern "C" __attribute__((global)) void sk_gemm_tiled(
    int M, int N, int K, float alpha, const float *A, long ars, long acs, long as1, long as2,
    const float *B, long brs, long bcs, long bs1, long bs2, float beta, float *C, long ldc,
    long cs1, long cs2, int nb2) {
    __attribute__((shared)) float As[SK_TK][SK_TM + 4];
    __attribute__((shared)) float Bs[SK_TK][SK_TN + 4];
    int z = __nvvm_read_ptx_sreg_ctaid_z();
    long z1 = z / nb2, z2 = z % nb2;
    A += z1 * as1 + z2 * as2;
    B += z1 * bs1 + z2 * bs2;
    C += z1 * cs1 + z2 * cs2;
    int tid = __nvvm_read_ptx_sreg_tid_x();
    int tx = tid % 16, ty = tid / 16;
    int m0 = __nvvm_read_ptx_sreg_ctaid_y() * SK_TM, n0 = __nvvm_read_ptx_sreg_ctaid_x() * SK_TN;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += SK_TK) {
        for (int e = tid; e < SK_TM * SK_TK; e += 256) {
            int mm, kk;
            if (acs == 1) {
                mm = e / SK_TK;
                kk = e % SK_TK;
            } else {
                kk = e / SK_TM;
                mm = e % SK_TM;
            }
            int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? A[gm * ars + gk * acs] : 0.0f;
        }
        for (int e = tid; e < SK_TK * SK_TN; e += 256) {
            int nn, kk;
            if (bcs == 1) {
                kk = e / SK_TN;
                nn = e % SK_TN;
            } else {
                nn = e / SK_TK;
                kk = e % SK_TK;
            }
            int gk = k0 + kk, gn = n0 + nn;
            Bs[kk][nn] = (gk < K && gn < N) ? B[gk * brs + gn * bcs] : 0.0f;
        }
        __syncthreads();
        for (int kk = 0; kk < SK_TK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int gm = m0 + ty + 16 * i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; j++) {
            int gn = n0 + tx + 16 * j;
            if (gn >= N) continue;
            float *c = C + gm * ldc + gn;
            *c = beta == 0.0f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * *c;
        }
    }
}

#endif
