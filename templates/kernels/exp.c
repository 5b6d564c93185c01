/* ---- exp, tanh and sigmoid over a row ----------------------------------------------------
 * exp_range(y, x, n): y[i] = exp(x[i]) for i < n (y may be x), the innermost loop of a group of
 * exponentials whose values and arguments lie side by side (codegen/write/forward.py): a
 * softmax's over a batch's lanes, a document's positions, an attention's keys; tanh_range and
 * sigmoid_range the same for tanh and the op table's sigmoid (also a layer's activations over a
 * batch, in its product's epilogue: codegen/write/statements.py); exp_gather, tanh_gather and
 * sigmoid_gather over the table form's rows (codegen/write/table.py). The C library's exp and
 * tanh are a call per value that no compiler vectorises (microgpt: 6-9% of a step; tanh 12-15 ns
 * a value on an Intel Xeon); these are four values a vector on x86-64 with AVX2: exp within an
 * ulp of the library's, tanh within TANH_ULPS, sigmoid within 2 ulps of the op table's formula
 * with the library's exp (to the fused bound, not their bits). Every value goes through the same
 * operations, correctly rounded each and none fused, in vectors or one by one (TCC, other CPUs,
 * the freestanding exports): the same bits with every compiler, tier and CPU, wherever a value
 * sits in a row (a row's last values are loaded and stored in part). float32 computes in double
 * and rounds once.
 * The method (fdlibm's reduction): k = round(x / ln 2) (by adding and taking away 1.5 * 2^52),
 * r = x - k ln 2 with ln 2 in two parts, the first's 32 bits making k times it exact (|r| <= ln 2
 * / 2), exp(r) - 1 = r + r^2 P(r) with P Taylor's to r^11 / 13! (its remainder under 1e-17
 * relative; Estrin's scheme, for a short row's latency); exp(x) = (1 + that) times 2^k in two
 * halves of k, so that overflow gives inf and a result under the normal numbers rounds once (to
 * 0 below exp(-745.13)); NaN stays NaN. tanh |x| = -m / (m + 2) with m = exp(-2|x|) - 1 =
 * 2^k (exp(r) - 1) + (2^k - 1), which has no cancellation (k = 0 near 0, where m is exp(r) - 1
 * itself, and m + 2 lies in (1, 2]); 1 beyond |x| = 20 (tanh 20 is 1 - 8e-18: 1 in double);
 * the sign of x put back. */
#if RUNTIME_PRODUCTS != 1
#define EXP_SHIFT 6755399441055744.0 /* 1.5 * 2^52: z + it - it rounds z to an integer */
#define EXP_SHIFT_BITS 0x4338000000000000ULL
/* m = exp(c) / 2^k - 1 and z = k + EXP_SHIFT, for c clamped to [-746, 710] (c_log2e: c times log2 e,
 * which a caller may have a step sooner): double or a vector of them. The polynomial summed over
 * r's powers to r^8 (28 cycles after r, where the nested sum before took 40): a table form's run
 * of tanh rows is one call, whose latency the rows after it wait for (a random 20,000-Value
 * graph's step: 0.97x the time with tanh's select at its clamp left out too) */
#define EXP_REDUCED(T, c, c_log2e, z, m)                                                           \
    do {                                                                                           \
        z = c_log2e + EXP_SHIFT;                                                                   \
        const T k_ = z - EXP_SHIFT;                                                                \
        const T r = (c - k_ * 0.6931471803691238) - k_ * 1.9082149292705877e-10;                   \
        const T r2 = r * r, r4 = r2 * r2, r8 = r4 * r4;                                            \
        const T q0 = 0.5 + r * 0.16666666666666666, q1 = 0.041666666666666664 + r * 0.008333333333333333; \
        const T q2 = 0.001388888888888889 + r * 0.0001984126984126984;                             \
        const T q3 = 2.48015873015873e-05 + r * 2.7557319223985893e-06;                            \
        const T q4 = 2.755731922398589e-07 + r * 2.505210838544172e-08;                            \
        const T q5 = 2.08767569878681e-09 + r * 1.6059043836821613e-10;                            \
        m = ((r + r2 * q0) + r4 * (q1 + r2 * q2)) + r8 * ((q3 + r2 * q4) + r4 * q5);                \
    } while (0)
/* 2^k as two factors 2^h and 2^(k - h), h = floor(k / 2) (k + 2048 > 0: a logical shift halves
 * it), from the bits of z (its last ones are k's): their bits b1, b2 */
#define EXP_HALVES(T, k, b1, b2)                                                                   \
    do {                                                                                           \
        const T h_ = (k + 2048) >> 1;                                                              \
        b1 = (h_ - 1) << 52;                                                                       \
        b2 = (k - h_ + 2047) << 52;                                                                \
    } while (0)

/* y = exp(c) for c clamped to [-746, 710]: (1 + m) times 2^k in its two halves; T double or a
 * vector, B its bits */
#define EXP_CLAMPED(T, B, c, y)                                                                    \
    do {                                                                                           \
        T z_, m_, s1_, s2_;                                                                        \
        EXP_REDUCED(T, c, c * 1.4426950408889634, z_, m_);                                         \
        const T e_ = 1.0 + m_;                                                                     \
        B k_, b1_, b2_;                                                                            \
        memcpy(&k_, &z_, sizeof k_);                                                               \
        k_ -= EXP_SHIFT_BITS;                                                                      \
        EXP_HALVES(B, k_, b1_, b2_);                                                               \
        memcpy(&s1_, &b1_, sizeof s1_);                                                            \
        memcpy(&s2_, &b2_, sizeof s2_);                                                            \
        y = e_ * s1_ * s2_;                                                                        \
    } while (0)

/* No multiply and add fused into one rounding, even where the unit is built for a CPU that has
 * them (-march=native): every path rounds each operation (UNFUSED, templates/prelude.c). */
static UNFUSED_FUNCTION inline double exp_value(double x)
{
    UNFUSED
    if (x != x)
        return x + x;
    const double c = x < -746.0 ? -746.0 : x > 710.0 ? 710.0 : x;
    double y;
    EXP_CLAMPED(double, uint64_t, c, y);
    return y;
}

/* tanh |x| for a = |x| in [0, 20]: -m / (m + 2), m = exp(-2a) - 1 = 2^k (exp(r) - 1) + (2^k - 1)
 * (k in [-58, 0]: 2^k from z's bits at once); T double or a vector, B its bits */
#define TANH_ABSOLUTE(T, B, a, t)                                                                  \
    do {                                                                                           \
        const T c_ = -2.0 * a;                                                                     \
        T z_, m_, s_;                                                                              \
        EXP_REDUCED(T, c_, a * -2.8853900817779268, z_, m_); /* (c_ times log2 e, one step sooner) */ \
        B k_;                                                                                      \
        memcpy(&k_, &z_, sizeof k_);                                                               \
        k_ = (k_ - EXP_SHIFT_BITS + 1023) << 52;                                                   \
        memcpy(&s_, &k_, sizeof s_);                                                               \
        const T e_ = s_ * m_ + (s_ - 1.0);                                                         \
        t = -e_ / (e_ + 2.0);                                                                      \
    } while (0)
#define TANH_ULPS 4 /* from the C library's tanh (tests/test_kernels.py: 3 from glibc's; 2.5 from the exact value) */

static UNFUSED_FUNCTION inline double tanh_value(double x)
{
    UNFUSED
    const double a = x < 0 ? -x : x;
    if (!(a <= 20.0))
        return x != x ? x + x : x < 0 ? -1.0 : 1.0;
    double t;
    TANH_ABSOLUTE(double, uint64_t, a, t);
    uint64_t bits, sign; /* |t| with the sign of x (t is -0 at x = 0) */
    memcpy(&bits, &t, sizeof bits);
    memcpy(&sign, &x, sizeof sign);
    bits = (bits & ~(1ULL << 63)) | (sign & 1ULL << 63);
    memcpy(&t, &bits, sizeof t);
    return t;
}

/* the op table's sigmoid, 1 / (1 + exp(-x)), with exp_value */
static UNFUSED_FUNCTION inline double sigmoid_value(double x)
{
    UNFUSED
    return 1.0 / (1.0 + exp_value(-x));
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__) /* GCC, Clang */
#include <immintrin.h>
#define EXP_AVX2 __attribute__((target("avx2"))) UNFUSED_FUNCTION
typedef double exp_vec __attribute__((vector_size(32)));
typedef unsigned long long exp_bits __attribute__((vector_size(32)));
static EXP_AVX2 inline exp_vec exp_avx2(exp_vec x)
{
    UNFUSED
    const exp_vec c = (exp_vec)_mm256_min_pd(_mm256_max_pd((__m256d)x, _mm256_set1_pd(-746.0)), _mm256_set1_pd(710.0));
    exp_vec y;
    EXP_CLAMPED(exp_vec, exp_bits, c, y);
    return (exp_vec)_mm256_blendv_pd((__m256d)y, (__m256d)(x + x), _mm256_cmp_pd((__m256d)x, (__m256d)x, _CMP_UNORD_Q));
}

static EXP_AVX2 inline exp_vec tanh_avx2(exp_vec x)
{
    UNFUSED
    const __m256d sign = _mm256_set1_pd(-0.0), a = _mm256_andnot_pd(sign, (__m256d)x);
    /* (beyond 20 the clamp's value, which this formula makes 1, as tanh_value's branch: no select) */
    const exp_vec clamped = (exp_vec)_mm256_min_pd(a, _mm256_set1_pd(20.0));
    exp_vec t;
    TANH_ABSOLUTE(exp_vec, exp_bits, clamped, t);
    const __m256d y = _mm256_or_pd(_mm256_andnot_pd(sign, (__m256d)t), _mm256_and_pd(sign, (__m256d)x));
    return (exp_vec)_mm256_blendv_pd(y, (__m256d)(x + x), _mm256_cmp_pd((__m256d)x, (__m256d)x, _CMP_UNORD_Q));
}

static EXP_AVX2 inline exp_vec sigmoid_avx2(exp_vec x)
{
    UNFUSED
    return 1.0 / (1.0 + exp_avx2(-x));
}

/* whole vectors loaded and stored plainly, the last one in part (gemm.c's: lanes past n neither
 * read nor written, and no masked store, slow on AMD) */
#if REAL_IS_FLOAT
#define EXP_LOAD(p) (exp_vec)_mm256_cvtps_pd(_mm_loadu_ps(p))
#define EXP_STORE(p, v) _mm_storeu_ps((p), _mm256_cvtpd_ps((__m256d)(v)))
#define EXP_LOAD_PART(p, n) (exp_vec)_mm256_cvtps_pd(_mm_maskload_ps((p), gemm_part_mask16(n)))
#define EXP_STORE_PART(p, n, v) gemm_part_store16((p), (n), _mm_castps_si128(_mm256_cvtpd_ps((__m256d)(v))))
#else
#define EXP_LOAD(p) (exp_vec)_mm256_loadu_pd(p)
#define EXP_STORE(p, v) _mm256_storeu_pd((p), (__m256d)(v))
#define EXP_LOAD_PART(p, n) (exp_vec)gemm_part_load_avx2((p), (n))
#define EXP_STORE_PART(p, n, v) gemm_part_store_avx2((p), (n), (gemm_vec32)(v))
#endif
/* f's AVX2 forms: f_range_avx2 over a row; f_gather_avx2 over the table's rows, four rows'
 * operands loaded into a vector and its lanes stored to the rows' results (no array between: four
 * stores then a vector load of them would wait for the stores) */
#define EXP_AVX2_FORMS(f)                                                                          \
    static EXP_AVX2 void f##_range_avx2(real *y, const real *x, long n)                            \
    {                                                                                              \
        long i = 0;                                                                                \
        for (; i + 4 <= n; i += 4)                                                                 \
            EXP_STORE(y + i, f##_avx2(EXP_LOAD(x + i)));                                           \
        if (i < n)                                                                                 \
            EXP_STORE_PART(y + i, n - i, f##_avx2(EXP_LOAD_PART(x + i, n - i)));                   \
        _mm256_zeroupper(); /* (GCC left it out after the part's store, which takes a vector: \
                             * the C library's SSE code after it, its tanh, took 20x its time) */ \
    }                                                                                              \
    static EXP_AVX2 void f##_gather_avx2(real *d, const int32_t *w, long n)                        \
    {                                                                                              \
        long i = 0;                                                                                \
        for (; i + 4 <= n; i += 4, w += 8) {                                                       \
            const exp_vec y = f##_avx2((exp_vec){d[w[0]], d[w[2]], d[w[4]], d[w[6]]});             \
            d[w[1]] = (real)y[0], d[w[3]] = (real)y[1], d[w[5]] = (real)y[2], d[w[7]] = (real)y[3]; \
        }                                                                                          \
        if (i < n) {                                                                               \
            const long m = n - i;                                                                  \
            const exp_vec y = f##_avx2((exp_vec){d[w[0]], m > 1 ? d[w[2]] : 0, m > 2 ? d[w[4]] : 0, 0}); \
            d[w[1]] = (real)y[0];                                                                  \
            if (m > 1)                                                                             \
                d[w[3]] = (real)y[1];                                                              \
            if (m > 2)                                                                             \
                d[w[5]] = (real)y[2];                                                              \
        }                                                                                          \
        _mm256_zeroupper();                                                                        \
    }
EXP_AVX2_FORMS(exp)
EXP_AVX2_FORMS(tanh)
EXP_AVX2_FORMS(sigmoid)
#undef EXP_AVX2_FORMS
#undef EXP_LOAD
#undef EXP_STORE
#undef EXP_LOAD_PART
#undef EXP_STORE_PART

/* AVX-512's forms over a row, eight values a vector (the same operations: the same bits), the
 * row's last values by the AVX2 form: a softmax's exponentials, 3.4% of the bigger GPT's step on
 * the AVX2 form, Intel Xeon with AVX-512 (its multiplies and adds at twice the values a cycle) */
#define EXP_AVX512 __attribute__((target("avx512f"))) UNFUSED_FUNCTION
typedef double exp_vec8 __attribute__((vector_size(64)));
typedef unsigned long long exp_bits8 __attribute__((vector_size(64)));
static EXP_AVX512 inline exp_vec8 exp_unordered_avx512(exp_vec8 x, exp_vec8 y) /* y, or x + x where x is NaN */
{
    UNFUSED
    return (exp_vec8)_mm512_mask_blend_pd(_mm512_cmp_pd_mask((__m512d)x, (__m512d)x, _CMP_UNORD_Q), (__m512d)y,
                                          (__m512d)(x + x));
}

static EXP_AVX512 inline exp_vec8 exp_avx512(exp_vec8 x)
{
    UNFUSED
    const exp_vec8 c = (exp_vec8)_mm512_min_pd(_mm512_max_pd((__m512d)x, _mm512_set1_pd(-746.0)), _mm512_set1_pd(710.0));
    exp_vec8 y;
    EXP_CLAMPED(exp_vec8, exp_bits8, c, y);
    return exp_unordered_avx512(x, y);
}

static EXP_AVX512 inline exp_vec8 tanh_avx512(exp_vec8 x)
{
    UNFUSED
    const exp_bits8 sign = (exp_bits8){0} + (1ULL << 63), bits = (exp_bits8)x;
    const exp_vec8 clamped = (exp_vec8)_mm512_min_pd((__m512d)(bits & ~sign), _mm512_set1_pd(20.0));
    exp_vec8 t;
    TANH_ABSOLUTE(exp_vec8, exp_bits8, clamped, t);
    return exp_unordered_avx512(x, (exp_vec8)(((exp_bits8)t & ~sign) | (bits & sign)));
}

static EXP_AVX512 inline exp_vec8 sigmoid_avx512(exp_vec8 x)
{
    UNFUSED
    return 1.0 / (1.0 + exp_avx512(-x));
}

#if REAL_IS_FLOAT
#define EXP_LOAD8(p) (exp_vec8)_mm512_cvtps_pd(_mm256_loadu_ps(p))
#define EXP_STORE8(p, v) _mm256_storeu_ps((p), _mm512_cvtpd_ps((__m512d)(v)))
#else
#define EXP_LOAD8(p) (exp_vec8)_mm512_loadu_pd(p)
#define EXP_STORE8(p, v) _mm512_storeu_pd((p), (__m512d)(v))
#endif
#define EXP_AVX512_FORMS(f)                                                                        \
    static EXP_AVX512 void f##_range_avx512(real *y, const real *x, long n)                        \
    {                                                                                              \
        long i = 0;                                                                                \
        for (; i + 8 <= n; i += 8)                                                                 \
            EXP_STORE8(y + i, f##_avx512(EXP_LOAD8(x + i)));                                       \
        f##_range_avx2(y + i, x + i, n - i); /* (and its vzeroupper) */                            \
    }
EXP_AVX512_FORMS(exp)
EXP_AVX512_FORMS(tanh)
EXP_AVX512_FORMS(sigmoid)
#undef EXP_AVX512_FORMS
#undef EXP_LOAD8
#undef EXP_STORE8
#define EXP_VECTORS 1
#endif

/* f_range(y, x, n): y[i] = f(x[i]) for i < n; f_gather(d, rows, n): d[rows[2i + 1]] =
 * f(d[rows[2i]]) for i < n, the table form's rows of the op (codegen/write/table.py), none reading
 * another's result. Each on the vectors where the CPU has them, else value by value (the same bits). */
#if defined(EXP_VECTORS)
#define EXP_RUN_IF(features, call) /* (the AVX-512 forms end on the AVX2 ones: both features) */   \
    if ((cpu_features() & (features)) == (features)) {                                             \
        call;                                                                                      \
        return;                                                                                    \
    }
#else
#define EXP_RUN_IF(features, call)
#endif
#define EXP_RANGE(f)                                                                               \
    EXP_RUN_IF(CPU_AVX512F | CPU_AVX2_FMA, f##_range_avx512(y, x, n))                              \
    EXP_RUN_IF(CPU_AVX2_FMA, f##_range_avx2(y, x, n))                                              \
    for (long i = 0; i < n; i++)                                                                   \
        y[i] = (real)f##_value((double)x[i]);
#define EXP_GATHER(f)                                                                              \
    EXP_RUN_IF(CPU_AVX2_FMA, f##_gather_avx2(d, rows, n))                                                   \
    for (long i = 0; i < n; i++)                                                                   \
        d[rows[2 * i + 1]] = (real)f##_value((double)d[rows[2 * i]]);
PRODUCT void exp_range(real *y, const real *x, long n) { EXP_RANGE(exp) }
PRODUCT void tanh_range(real *y, const real *x, long n) { EXP_RANGE(tanh) }
PRODUCT void sigmoid_range(real *y, const real *x, long n) { EXP_RANGE(sigmoid) }
PRODUCT void exp_gather(real *d, const int32_t *rows, long n) { EXP_GATHER(exp) }
PRODUCT void tanh_gather(real *d, const int32_t *rows, long n) { EXP_GATHER(tanh) }
PRODUCT void sigmoid_gather(real *d, const int32_t *rows, long n) { EXP_GATHER(sigmoid) }
#undef EXP_RANGE
#undef EXP_GATHER
#undef EXP_RUN_IF
#endif
