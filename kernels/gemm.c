// Single-precision GEMM for the CPU backend, in the BLIS/GotoBLAS style.
//
// C (M,N) = alpha * op(A) (M,K) @ op(B) (K,N) + beta * C, all row-major.
//
// Blocking (loop order outside in; the names are BLIS's):
//   jc  over N in blocks of NC columns     -> the packed B block lives in L3
//   pc  over K in blocks of KC             -> B block (KC x NC) packed once,
//                                             by the whole thread team
//   ic  over M in blocks of MC rows        -> A block (MC x KC) packed by each
//                                             thread into its own buffer (L2)
//   jr  over the NC block, NR at a time    -> one B micro-panel (KC x NR)
//                                             is reused across the ir loop
//   ir  over the MC block, MR at a time    -> micro-kernel: an MR x NR tile of
//                                             C in registers, KC rank-1 updates
// Packed panels are k-major: for each k, the MR values of A (broadcast one by
// one) and the NR values of B (loaded as NR/16 or NR/8 vectors) are adjacent,
// and zero-padded at the edges, so the micro-kernel always computes a full
// tile. Edge tiles run that same kernel on a scratch tile, so every element of
// C sees exactly the same arithmetic: the k order within a KC block, the KC
// blocks in order, and the write-back C = alpha*acc + beta*C (beta = 1 after
// the first KC block). Threads split M (ranges of micro-tile rows) and N
// (ranges of B micro-panels), never K, so the result is bit-identical for any
// thread count.
//
// Micro-kernels and blocking, chosen once at run time (__builtin_cpu_supports),
// tuned on AMD Zen 5 (48 KiB L1d, 1 MiB L2 per core, 2x512-bit FMA):
//   avx512   MR=12 NR=32 (24 zmm accumulators)  MC=240 KC=384 NC=4096
//   avx2     MR=6  NR=16 (12 ymm accumulators)  MC=120 KC=256 NC=4096
//   portable MR=4  NR=8  (plain C; the compiler vectorizes for the baseline)
// KC=384 makes the common K = C = 384 one block; K is cut into equal blocks
// (gemm_kstep) so there is no thin last block. The A panel (240x384 floats,
// 360 KiB) stays in L2; the B micro-panel (384x32, 48 KiB) is reloaded from
// L2 as A streams past, which Zen 5's L2 bandwidth absorbs (measured: KC from
// 192 to 512 and MC from 120 to 960 are within a few percent at 1024^3).
// Row-major A is packed with an in-register 12x16 transpose and transposed B
// (the forward's weights) with a 16x16 one (avx512). skein_sgemm_ex can add a
// bias row in the first write of C and sum the rows of op(A) while packing
// them (the layer kernels' matmul bias and dbias).
// SKEIN_GEMM_ISA=portable|avx2|avx512 in the environment forces a lower
// instruction set; skein_gemm_force_isa does the same at run time (tests).
//
// Buffers: each thread keeps its packing buffers in thread-local storage,
// grown on demand and reused, so steady-state calls do not allocate.
#include "skein_kernels.h"

#include <immintrin.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int transA, transB, M, N, K;
    float alpha, beta;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    int tm, tn;    // thread grid: tm thread rows split M, tn split N
    float *bpack;  // shared packed B block, KC x roundup(min(N,NC), NR)
    const float *bias;  // N, added by the first KC block (beta 0); or NULL
    float *rowsum;      // M, += the rows of op(A); or NULL
} gemm_job;

static __thread float *tl_abuf, *tl_bbuf;
static __thread size_t tl_acap, tl_bcap;

static float *grow_buffer(float **buf, size_t *cap, size_t n) {
    if (n > *cap) {
        free(*buf);
        size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
        *buf = aligned_alloc(64, bytes);
        if (*buf == NULL) abort();
        *cap = n;
    }
    return *buf;
}

// gemm_kstep splits K into equal KC blocks (a multiple of 8, at most kc):
// K = 1024 with kc = 384 gives 344+344+336 rather than 384+384+256. It
// depends on K only, never on the thread count.
static int gemm_kstep(int K, int kc) {
    int nb = (K + kc - 1) / kc;
    int step = (K + nb - 1) / nb;
    step = (step + 7) & ~7;
    return step < kc ? step : kc;
}

// gemm_thread_buffer is the calling thread's A packing buffer.
static float *gemm_thread_buffer(size_t n) { return grow_buffer(&tl_abuf, &tl_acap, n); }

// ---------------------------------------------------------------- avx512

#define AVX512_TARGET __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,fma")))
#ifndef AVX512_MR
#define AVX512_MR 12
#endif
#ifndef AVX512_MC
#define AVX512_MC 240
#endif
#ifndef AVX512_KC
#define AVX512_KC 384
#endif
#ifndef AVX512_NC
#define AVX512_NC 4096
#endif
#define AVX512_NR 32

// The micro-kernels write C = alpha*acc + beta*C, or alpha*acc + bias (one
// row of NR values, for every row of the tile) when bias is not NULL.
static AVX512_TARGET void kernel_avx512(int kc, const float *restrict A, const float *restrict B,
                                        float *restrict C, size_t ldc, float alpha, float beta,
                                        const float *restrict bias) {
    enum { MR = AVX512_MR };
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) c0[i] = c1[i] = _mm512_setzero_ps();
    // The C tile is read at the end: start fetching it now.
    if (beta != 0.0f) {
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
            _mm_prefetch((const char *)(C + i * ldc + 31), _MM_HINT_T0);
        }
    }
    for (int k = 0; k < kc; k++) {
        __m512 b0 = _mm512_loadu_ps(B), b1 = _mm512_loadu_ps(B + 16);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(A[i]);
            c0[i] = _mm512_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm512_fmadd_ps(a, b1, c1[i]);
        }
        A += MR;
        B += 32;
    }
    __m512 va = _mm512_set1_ps(alpha);
    if (bias != NULL) {
        __m512 b0 = _mm512_loadu_ps(bias), b1 = _mm512_loadu_ps(bias + 16);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            _mm512_storeu_ps(C + i * ldc, _mm512_fmadd_ps(va, c0[i], b0));
            _mm512_storeu_ps(C + i * ldc + 16, _mm512_fmadd_ps(va, c1[i], b1));
        }
    } else if (beta == 0.0f) {
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            _mm512_storeu_ps(C + i * ldc, _mm512_mul_ps(va, c0[i]));
            _mm512_storeu_ps(C + i * ldc + 16, _mm512_mul_ps(va, c1[i]));
        }
    } else if (beta == 1.0f) {
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            _mm512_storeu_ps(C + i * ldc, _mm512_fmadd_ps(va, c0[i], _mm512_loadu_ps(C + i * ldc)));
            _mm512_storeu_ps(C + i * ldc + 16,
                             _mm512_fmadd_ps(va, c1[i], _mm512_loadu_ps(C + i * ldc + 16)));
        }
    } else {
        __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            _mm512_storeu_ps(C + i * ldc,
                             _mm512_fmadd_ps(va, c0[i], _mm512_mul_ps(vb, _mm512_loadu_ps(C + i * ldc))));
            _mm512_storeu_ps(C + i * ldc + 16,
                             _mm512_fmadd_ps(va, c1[i], _mm512_mul_ps(vb, _mm512_loadu_ps(C + i * ldc + 16))));
        }
    }
}

#if AVX512_MR == 12
// Packs 12 rows x 16 columns of a row-major A block (src[i] + k0 is row i)
// into 16 k-steps of 12 values: two shuffle stages of a 16x16 transpose
// leave rows 4g..4g+3 of column 4j+m in 128-bit lane j of u[g][m].
static AVX512_TARGET inline void pack_a_rows16_avx512(const float *const *src, int k0, float *restrict d) {
    __m512 r[12], t[12];
    for (int i = 0; i < 12; i++) r[i] = _mm512_loadu_ps(src[i] + k0);
    for (int i = 0; i < 12; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int g = 0; g < 3; g++) {
        __m512 u[4];
        u[0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
        u[1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
        u[2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
        u[3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
        for (int m = 0; m < 4; m++) {
            _mm_storeu_ps(d + (0 + m) * 12 + 4 * g, _mm512_castps512_ps128(u[m]));
            _mm_storeu_ps(d + (4 + m) * 12 + 4 * g, _mm512_extractf32x4_ps(u[m], 1));
            _mm_storeu_ps(d + (8 + m) * 12 + 4 * g, _mm512_extractf32x4_ps(u[m], 2));
            _mm_storeu_ps(d + (12 + m) * 12 + 4 * g, _mm512_extractf32x4_ps(u[m], 3));
        }
    }
}
#define GEMM_PACK_A_ROWS16 pack_a_rows16_avx512
#endif

// Packs 16 rows of a row-major B block read transposed (src + j*ldb + k is
// B(k, j) for j, k < 16) as 16 k-steps of 16 values, d + k*NR + j: a 16x16
// in-register transpose, four stages that each swap one bit of the row and
// column indices.
static AVX512_TARGET inline void pack_b_trans16_avx512(const float *src, size_t ldb, float *restrict d) {
    typedef int v16i __attribute__((vector_size(64)));
    static const v16i lo[4] = {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
                               {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                               {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                               {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}};
    static const v16i hi[4] = {{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31},
                               {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                               {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                               {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}};
    __m512 r[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + (size_t)i * ldb);
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        const int b = 8 >> s;
        __m512i ml = (__m512i)lo[s], mh = (__m512i)hi[s];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            if (!(i & b)) {
                __m512 x = r[i], y = r[i + b];
                r[i] = _mm512_permutex2var_ps(x, ml, y);
                r[i + b] = _mm512_permutex2var_ps(x, mh, y);
            }
    }
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) _mm512_storeu_ps(d + (size_t)k * AVX512_NR, r[k]);
}
#define GEMM_PACK_B_TRANS16 pack_b_trans16_avx512

#define GEMM_SFX avx512
#define GEMM_TARGET AVX512_TARGET
#define GEMM_MR AVX512_MR
#define GEMM_NR AVX512_NR
#define GEMM_MC AVX512_MC
#define GEMM_KC AVX512_KC
#define GEMM_NC AVX512_NC
#define GEMM_KERNEL kernel_avx512
#include "gemm_impl.h"
#undef GEMM_SFX
#undef GEMM_TARGET
#undef GEMM_MR
#undef GEMM_NR
#undef GEMM_MC
#undef GEMM_KC
#undef GEMM_NC
#undef GEMM_KERNEL
#undef GEMM_PACK_A_ROWS16
#undef GEMM_PACK_B_TRANS16

// ---------------------------------------------------------------- avx2

#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define AVX2_MR 6
#ifndef AVX2_MC
#define AVX2_MC 120
#endif
#ifndef AVX2_KC
#define AVX2_KC 256
#endif
#ifndef AVX2_NC
#define AVX2_NC 4096
#endif
#define AVX2_NR 16

static AVX2_TARGET void kernel_avx2(int kc, const float *restrict A, const float *restrict B,
                                    float *restrict C, size_t ldc, float alpha, float beta,
                                    const float *restrict bias) {
    enum { MR = AVX2_MR };
    __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; i++) c0[i] = c1[i] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(B), b1 = _mm256_loadu_ps(B + 8);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            __m256 a = _mm256_broadcast_ss(A + i);
            c0[i] = _mm256_fmadd_ps(a, b0, c0[i]);
            c1[i] = _mm256_fmadd_ps(a, b1, c1[i]);
        }
        A += MR;
        B += 16;
    }
    __m256 va = _mm256_set1_ps(alpha);
    if (bias != NULL) {
        __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(C + i * ldc, _mm256_fmadd_ps(va, c0[i], b0));
            _mm256_storeu_ps(C + i * ldc + 8, _mm256_fmadd_ps(va, c1[i], b1));
        }
    } else if (beta == 0.0f) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(C + i * ldc, _mm256_mul_ps(va, c0[i]));
            _mm256_storeu_ps(C + i * ldc + 8, _mm256_mul_ps(va, c1[i]));
        }
    } else if (beta == 1.0f) {
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(C + i * ldc, _mm256_fmadd_ps(va, c0[i], _mm256_loadu_ps(C + i * ldc)));
            _mm256_storeu_ps(C + i * ldc + 8, _mm256_fmadd_ps(va, c1[i], _mm256_loadu_ps(C + i * ldc + 8)));
        }
    } else {
        __m256 vb = _mm256_set1_ps(beta);
#pragma GCC unroll 8
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(C + i * ldc,
                             _mm256_fmadd_ps(va, c0[i], _mm256_mul_ps(vb, _mm256_loadu_ps(C + i * ldc))));
            _mm256_storeu_ps(C + i * ldc + 8,
                             _mm256_fmadd_ps(va, c1[i], _mm256_mul_ps(vb, _mm256_loadu_ps(C + i * ldc + 8))));
        }
    }
}

#define GEMM_SFX avx2
#define GEMM_TARGET AVX2_TARGET
#define GEMM_MR AVX2_MR
#define GEMM_NR AVX2_NR
#define GEMM_MC AVX2_MC
#define GEMM_KC AVX2_KC
#define GEMM_NC AVX2_NC
#define GEMM_KERNEL kernel_avx2
#include "gemm_impl.h"
#undef GEMM_SFX
#undef GEMM_TARGET
#undef GEMM_MR
#undef GEMM_NR
#undef GEMM_MC
#undef GEMM_KC
#undef GEMM_NC
#undef GEMM_KERNEL

// ---------------------------------------------------------------- portable

#define PORTABLE_MR 4
#ifndef PORTABLE_MC
#define PORTABLE_MC 128
#endif
#ifndef PORTABLE_KC
#define PORTABLE_KC 256
#endif
#ifndef PORTABLE_NC
#define PORTABLE_NC 4096
#endif
#define PORTABLE_NR 8

static void kernel_portable(int kc, const float *restrict A, const float *restrict B, float *restrict C,
                            size_t ldc, float alpha, float beta, const float *restrict bias) {
    enum { MR = PORTABLE_MR, NR = PORTABLE_NR };
    float acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = 0.0f;
    for (int k = 0; k < kc; k++) {
        for (int i = 0; i < MR; i++)
            for (int j = 0; j < NR; j++) acc[i][j] += A[i] * B[j];
        A += MR;
        B += NR;
    }
    for (int i = 0; i < MR; i++) {
        float *c = C + i * ldc;
        if (bias != NULL)
            for (int j = 0; j < NR; j++) c[j] = alpha * acc[i][j] + bias[j];
        else if (beta == 0.0f)
            for (int j = 0; j < NR; j++) c[j] = alpha * acc[i][j];
        else if (beta == 1.0f)
            for (int j = 0; j < NR; j++) c[j] = alpha * acc[i][j] + c[j];
        else
            for (int j = 0; j < NR; j++) c[j] = alpha * acc[i][j] + beta * c[j];
    }
}

#define GEMM_SFX portable
#define GEMM_TARGET
#define GEMM_MR PORTABLE_MR
#define GEMM_NR PORTABLE_NR
#define GEMM_MC PORTABLE_MC
#define GEMM_KC PORTABLE_KC
#define GEMM_NC PORTABLE_NC
#define GEMM_KERNEL kernel_portable
#include "gemm_impl.h"
#undef GEMM_SFX
#undef GEMM_TARGET
#undef GEMM_MR
#undef GEMM_NR
#undef GEMM_MC
#undef GEMM_KC
#undef GEMM_NC
#undef GEMM_KERNEL

// ---------------------------------------------------------------- dispatch

typedef struct {
    const char *name;
    int mr, nr, mc, kc, nc;
    void (*body)(const gemm_job *, int);
} gemm_isa;

static const gemm_isa isa_avx512 = {"avx512", AVX512_MR, AVX512_NR, AVX512_MC, AVX512_KC, AVX512_NC, gemm_body_avx512};
static const gemm_isa isa_avx2 = {"avx2", AVX2_MR, AVX2_NR, AVX2_MC, AVX2_KC, AVX2_NC, gemm_body_avx2};
static const gemm_isa isa_portable = {"portable", PORTABLE_MR, PORTABLE_NR, PORTABLE_MC, PORTABLE_KC, PORTABLE_NC,
                                      gemm_body_portable};

static const gemm_isa *isa_best(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma"))
        return &isa_avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return &isa_avx2;
    return &isa_portable;
}

// isa_named returns the named ISA if this CPU supports it, else NULL.
static const gemm_isa *isa_named(const char *name) {
    const gemm_isa *best = isa_best();
    const gemm_isa *order[] = {&isa_portable, &isa_avx2, &isa_avx512};
    for (int i = 0; i < 3; i++) {
        if (strcmp(name, order[i]->name) == 0) {
            for (int b = i; b < 3; b++)
                if (order[b] == best) return order[i];
            return NULL;
        }
    }
    return NULL;
}

static const gemm_isa *gemm_selected;

static const gemm_isa *isa_current(void) {
    const gemm_isa *isa = __atomic_load_n(&gemm_selected, __ATOMIC_ACQUIRE);
    if (isa == NULL) {
        const char *env = getenv("SKEIN_GEMM_ISA");
        if (env == NULL || *env == 0 || (isa = isa_named(env)) == NULL) isa = isa_best();
        __atomic_store_n(&gemm_selected, isa, __ATOMIC_RELEASE);
    }
    return isa;
}

const char *skein_gemm_isa(void) { return isa_current()->name; }

int skein_gemm_force_isa(const char *name) {
    const gemm_isa *isa = (name == NULL || *name == 0) ? isa_best() : isa_named(name);
    if (isa == NULL) return -1;
    __atomic_store_n(&gemm_selected, isa, __ATOMIC_RELEASE);
    return 0;
}

// Below this many flops per thread, extra threads cost more than they save.
#define GEMM_FLOPS_PER_THREAD 1.5e6

void skein_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc, int nthreads) {
    skein_sgemm_ex(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL,
                   nthreads);
}

void skein_sgemm_ex(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                    int lda, const float *B, int ldb, float beta, float *C, int ldc,
                    const float *bias, float *rowsum, int nthreads) {
    if (M <= 0 || (N <= 0 && rowsum == NULL)) return;
    if (bias != NULL) beta = 0.0f;
    if (N <= 0 || K <= 0 || alpha == 0.0f) {
        for (int i = 0; i < M && N > 0; i++) {
            float *c = C + (size_t)i * ldc;
            if (bias != NULL)
                memcpy(c, bias, (size_t)N * sizeof(float));
            else if (beta == 0.0f)
                memset(c, 0, (size_t)N * sizeof(float));
            else if (beta != 1.0f)
                for (int j = 0; j < N; j++) c[j] *= beta;
        }
        if (rowsum != NULL)
            for (int i = 0; i < M; i++)
                for (int k = 0; k < K; k++)
                    rowsum[i] += transA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
        return;
    }
    const gemm_isa *isa = isa_current();

    int nt = nthreads > 0 ? nthreads : omp_get_max_threads();
    const int mt = (M + isa->mr - 1) / isa->mr;
    const int ncb = N < isa->nc ? N : isa->nc;
    const int ntl = (ncb + isa->nr - 1) / isa->nr;
    double flops = 2.0 * M * N * (double)K;
    if (nt > flops / GEMM_FLOPS_PER_THREAD) nt = (int)(flops / GEMM_FLOPS_PER_THREAD);
    if ((long)nt > (long)mt * ntl) nt = mt * ntl;
    if (nt < 1) nt = 1;

    // Thread grid: minimize the largest per-thread tile count; on ties prefer
    // splitting M, which lets the team share one packed B block.
    int tm = nt, tn = 1;
    long bestcost = -1;
    for (int r = nt; r >= 1; r--) {
        if (nt % r) continue;
        long cost = (long)((mt + r - 1) / r) * ((ntl + nt / r - 1) / (nt / r));
        if (bestcost < 0 || cost < bestcost) bestcost = cost, tm = r, tn = nt / r;
    }

    int ncr = (ncb + isa->nr - 1) / isa->nr * isa->nr;
    int kcb = K < isa->kc ? K : isa->kc;
    gemm_job job = {transA, transB, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, tm, tn,
                    grow_buffer(&tl_bbuf, &tl_bcap, (size_t)kcb * ncr), bias, rowsum};

    if (nt == 1) {
        isa->body(&job, 0);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        if (omp_get_num_threads() == nt) {
            isa->body(&job, omp_get_thread_num());
        } else if (omp_get_thread_num() == 0) {
            // Fewer threads than asked (nested region, thread limit): the
            // partition does not change the result, so run it alone.
            gemm_job solo = job;
            solo.tm = solo.tn = 1;
            isa->body(&solo, 0);
        }
    }
}
