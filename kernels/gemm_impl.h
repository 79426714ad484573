// Blocked SGEMM driver, instantiated once per instruction set by gemm.c.
// Before including, gemm.c defines:
//   GEMM_SFX     suffix for the generated names (avx512, avx2, portable)
//   GEMM_TARGET  function attribute selecting the instruction set (may be empty)
//   GEMM_MR      rows of the micro-tile (broadcast from the packed A panel)
//   GEMM_NR      columns of the micro-tile (vector loads from the packed B panel)
//   GEMM_MC, GEMM_KC, GEMM_NC  cache blocking (see gemm.c)
//   GEMM_KERNEL  the micro-kernel: kernel(kc, Apanel, Bpanel, C, ldc, alpha, beta, bias)
// and this file defines gemm_body_<GEMM_SFX>, the work of one thread.

#define GEMM_CAT2(a, b) a##_##b
#define GEMM_CAT(a, b) GEMM_CAT2(a, b)
#define GEMM_FN(name) GEMM_CAT(name, GEMM_SFX)

// Packs rows [i0, i0+mc) and depth [p0, p0+kc) of op(A) into micro-panels of
// GEMM_MR rows: panel r holds, for each k, the GEMM_MR values A(i0+r*MR+i, p0+k)
// contiguously. Rows past mc are zero. If rowsum is not NULL, rowsum[i0+i]
// += the sum of A(i0+i, p0+k) over the block, summed in a fixed order (from
// the packed panel, while it is in L1).
static GEMM_TARGET void GEMM_FN(pack_a)(int trans, const float *A, size_t lda, int i0, int mc,
                                        int p0, int kc, float *restrict dst,
                                        float *restrict rowsum) {
    enum { MR = GEMM_MR };
    for (int ir = 0; ir < mc; ir += MR) {
        int mr = mc - ir < MR ? mc - ir : MR;
        float *restrict d = dst + (size_t)ir * kc;
        if (!trans) {
            // A(i,k) = A[i*lda + k]: gather MR rows, k at a time.
            const float *src[MR];
            for (int i = 0; i < MR; i++) src[i] = A + (size_t)(i0 + ir + (i < mr ? i : 0)) * lda + p0;
            if (mr == MR) {
                int k = 0;
#ifdef GEMM_PACK_A_ROWS16
                // Transpose 16 columns at a time with vector shuffles.
                for (; k + 16 <= kc; k += 16) GEMM_PACK_A_ROWS16(src, k, d + (size_t)k * MR);
#endif
                for (; k < kc; k++)
                    for (int i = 0; i < MR; i++) d[(size_t)k * MR + i] = src[i][k];
            } else {
                for (int k = 0; k < kc; k++)
                    for (int i = 0; i < MR; i++) d[(size_t)k * MR + i] = i < mr ? src[i][k] : 0.0f;
            }
        } else {
            // A(i,k) = A[k*lda + i]: MR contiguous values per k.
            const float *src = A + (size_t)p0 * lda + i0 + ir;
            if (mr == MR) {
                for (int k = 0; k < kc; k++) memcpy(d + (size_t)k * MR, src + (size_t)k * lda, MR * sizeof(float));
            } else {
                for (int k = 0; k < kc; k++)
                    for (int i = 0; i < MR; i++)
                        d[(size_t)k * MR + i] = i < mr ? src[(size_t)k * lda + i] : 0.0f;
            }
        }
        if (rowsum != NULL) {
            // Four partial sums (k mod 4) so that the adds are not one
            // latency-bound chain, then the block's sum is added to rowsum.
            float acc[4][MR];
            for (int u = 0; u < 4; u++)
                for (int i = 0; i < MR; i++) acc[u][i] = 0.0f;
            int k = 0;
            for (; k + 4 <= kc; k += 4)
                for (int u = 0; u < 4; u++)
                    for (int i = 0; i < MR; i++) acc[u][i] += d[(size_t)(k + u) * MR + i];
            for (; k < kc; k++)
                for (int i = 0; i < MR; i++) acc[0][i] += d[(size_t)k * MR + i];
            float *rs = rowsum + i0 + ir;
            for (int i = 0; i < mr; i++) rs[i] += (acc[0][i] + acc[1][i]) + (acc[2][i] + acc[3][i]);
        }
    }
}

// Packs columns [j0, j0+nc) and depth [p0, p0+kc) of op(B) into micro-panels
// of GEMM_NR columns: panel r holds, for each k, the GEMM_NR values
// B(p0+k, j0+r*NR+j) contiguously. Columns past nc are zero.
static GEMM_TARGET void GEMM_FN(pack_b)(int trans, const float *B, size_t ldb, int j0, int nc,
                                        int p0, int kc, float *restrict dst) {
    enum { NR = GEMM_NR };
    for (int jr = 0; jr < nc; jr += NR) {
        int nr = nc - jr < NR ? nc - jr : NR;
        float *restrict d = dst + (size_t)jr * kc;
        if (!trans) {
            // B(k,j) = B[k*ldb + j]: NR contiguous values per k.
            const float *src = B + (size_t)p0 * ldb + j0 + jr;
            if (nr == NR) {
                for (int k = 0; k < kc; k++)
                    for (int j = 0; j < NR; j++) d[(size_t)k * NR + j] = src[(size_t)k * ldb + j];
            } else {
                for (int k = 0; k < kc; k++)
                    for (int j = 0; j < NR; j++)
                        d[(size_t)k * NR + j] = j < nr ? src[(size_t)k * ldb + j] : 0.0f;
            }
        } else {
            // B(k,j) = B[j*ldb + k]: transpose NR rows of B, KB deep at a time
            // so that the reads stay within a few cache lines per row.
            enum { KB = 16 };
            int k0 = 0;
#ifdef GEMM_PACK_B_TRANS16
            // Whole 16x16 blocks with an in-register transpose.
            if (nr == NR)
                for (; k0 + 16 <= kc; k0 += 16)
                    for (int j = 0; j < NR; j += 16)
                        GEMM_PACK_B_TRANS16(B + (size_t)(j0 + jr + j) * ldb + p0 + k0, ldb,
                                            d + (size_t)k0 * NR + j);
#endif
            for (; k0 < kc; k0 += KB) {
                int kb = kc - k0 < KB ? kc - k0 : KB;
                for (int j = 0; j < NR; j++) {
                    if (j < nr) {
                        const float *src = B + (size_t)(j0 + jr + j) * ldb + p0 + k0;
                        for (int k = 0; k < kb; k++) d[(size_t)(k0 + k) * NR + j] = src[k];
                    } else {
                        for (int k = 0; k < kb; k++) d[(size_t)(k0 + k) * NR + j] = 0.0f;
                    }
                }
            }
        }
    }
}

// The work of thread tid of a team of j->tm * j->tn threads: thread row
// tid / tn owns a contiguous range of micro-tile rows of C, thread column
// tid % tn a range of B micro-panels in every NC block. B blocks are packed by
// the whole team into the shared j->bpack. Every element of C is computed by
// the same micro-kernel with the same k order whatever the partition, so the
// result does not depend on the thread count. The first KC block writes
// alpha*acc + bias[j] when j->bias is set (beta is then 0). j->rowsum, if
// set, gets each row of op(A) summed, KC block by KC block, by the thread of
// column 0 that owns the row, while it packs the first NC block.
static GEMM_TARGET void GEMM_FN(gemm_body)(const gemm_job *j, int tid) {
    enum { MR = GEMM_MR, NR = GEMM_NR, MC = GEMM_MC, KC = GEMM_KC, NC = GEMM_NC };
    const int M = j->M, N = j->N, K = j->K;
    const int nt = j->tm * j->tn, tr = tid / j->tn, tc = tid % j->tn;
    const size_t ldc = (size_t)j->ldc;

    const int mtiles = (M + MR - 1) / MR;
    const int m0 = (int)((long)tr * mtiles / j->tm) * MR;
    int m1 = (int)((long)(tr + 1) * mtiles / j->tm) * MR;
    if (m1 > M) m1 = M;

    const int kstep = gemm_kstep(K, KC);
    float *abuf = gemm_thread_buffer((size_t)MC * KC);
    float *bpack = j->bpack;
    float ctile[MR * NR] __attribute__((aligned(64)));
    for (int i = 0; i < MR * NR; i++) ctile[i] = 0.0f;

    for (int jc = 0; jc < N; jc += NC) {
        const int nc = N - jc < NC ? N - jc : NC;
        const int npanels = (nc + NR - 1) / NR;
        const int cp0 = (int)((long)tc * npanels / j->tn);
        const int cp1 = (int)((long)(tc + 1) * npanels / j->tn);
        for (int pc = 0; pc < K; pc += kstep) {
            const int kc = K - pc < kstep ? K - pc : kstep;
            // The team packs the B block (kc x nc), split by micro-panels.
            {
                int p0 = (int)((long)tid * npanels / nt), p1 = (int)((long)(tid + 1) * npanels / nt);
                int c0 = p0 * NR, c1 = p1 * NR < nc ? p1 * NR : nc;
                if (c1 > c0)
                    GEMM_FN(pack_b)(j->transB, j->B, (size_t)j->ldb, jc + c0, c1 - c0, pc, kc,
                                    bpack + (size_t)c0 * kc);
            }
            if (nt > 1) {
#pragma omp barrier
            }
            const float beta = pc == 0 ? j->beta : 1.0f;
            const float *bias = pc == 0 && j->bias != NULL ? j->bias + jc : NULL;
            float *rowsum = jc == 0 && tc == 0 ? j->rowsum : NULL;
            for (int ic = m0; ic < m1; ic += MC) {
                const int mc = m1 - ic < MC ? m1 - ic : MC;
                GEMM_FN(pack_a)(j->transA, j->A, (size_t)j->lda, ic, mc, pc, kc, abuf, rowsum);
                for (int jp = cp0; jp < cp1; jp++) {
                    const int jr = jp * NR;
                    const int nr = nc - jr < NR ? nc - jr : NR;
                    const float *bp = bpack + (size_t)jr * kc;
                    for (int ir = 0; ir < mc; ir += MR) {
                        const int mr = mc - ir < MR ? mc - ir : MR;
                        float *c = j->C + (size_t)(ic + ir) * ldc + jc + jr;
                        const float *ap = abuf + (size_t)ir * kc;
                        if (mr == MR && nr == NR) {
                            GEMM_KERNEL(kc, ap, bp, c, ldc, j->alpha, beta, bias ? bias + jr : NULL);
                        } else {
                            // Edge tile: run the same kernel on a full tile in
                            // ctile so the arithmetic matches interior tiles
                            // (a bias row in ctile with beta 1 is the bias path).
                            float tbeta = beta;
                            if (bias != NULL) {
                                for (int i = 0; i < mr; i++)
                                    for (int jj = 0; jj < nr; jj++) ctile[i * NR + jj] = bias[jr + jj];
                                tbeta = 1.0f;
                            } else if (beta != 0.0f) {
                                for (int i = 0; i < mr; i++)
                                    for (int jj = 0; jj < nr; jj++) ctile[i * NR + jj] = c[i * ldc + jj];
                            }
                            GEMM_KERNEL(kc, ap, bp, ctile, NR, j->alpha, tbeta, NULL);
                            for (int i = 0; i < mr; i++)
                                for (int jj = 0; jj < nr; jj++) c[i * ldc + jj] = ctile[i * NR + jj];
                        }
                    }
                }
            }
            if (nt > 1) {
#pragma omp barrier
            }
        }
    }
}

#undef GEMM_FN
#undef GEMM_CAT
#undef GEMM_CAT2
