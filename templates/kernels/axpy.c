/* Lists that are not contiguous: element i at base + offsets[i], the same offsets for every
 * iteration of a loop (a convolution's window), so one small table serves the whole loop. */
KERNEL real dot_offsets(const real *a, const int32_t *oa, const real *b, const int32_t *ob, long n)
{
    real s[8] = {0};
    for (long i = 0; i < n; i++)
        s[i & 7] += a[oa[i]] * b[ob[i]];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

KERNEL real sum_offsets(const real *x, const int32_t *ox, long n)
{
    real s[8] = {0};
    for (long i = 0; i < n; i++)
        s[i & 7] += x[ox[i]];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* y[i] += alpha * x[i] */
KERNEL void axpy(real *restrict y, real alpha, const real *restrict x, long n)
{
    if (alpha == 0) /* adds nothing; skipping saves a pass over y (ReLUs that are off) */
        return;
    for (; n > 0 && (uintptr_t)y % 32; n--) /* stores that straddle cache lines cost double */
        *y++ += alpha * *x++;
    const real *end = x + (n & ~7L);
#define AXPY(l) y[l] += alpha * x[l];
    UNROLLED
    for (; x < end; x += 8, y += 8) {
        STEP8(AXPY)
    }
#undef AXPY
    for (long i = 0; i < (n & 7); i++)
        y[i] += alpha * x[i];
}

/* A batch-1 SGD step fused into backward: w[i] -= lr * (alpha * x[i]), the same rounding as
 * accumulating the gradient alpha * x[i] into a zeroed grad and then updating. Skipped when
 * alpha is 0 (a ReLU that is off), which is most of the saving. */
KERNEL void sgd_axpy(real *restrict w, real lr, real alpha, const real *restrict x, long n)
{
    if (alpha == 0)
        return;
    for (; n > 0 && (uintptr_t)w % 32; n--) /* stores that straddle cache lines cost double */
        *w++ -= lr * (alpha * *x++);
    const real *end = x + (n & ~7L);
#define SGD_AXPY(l) w[l] -= lr * (alpha * x[l]);
    UNROLLED
    for (; x < end; x += 8, w += 8) {
        STEP8(SGD_AXPY)
    }
#undef SGD_AXPY
    for (long i = 0; i < (n & 7); i++)
        w[i] -= lr * (alpha * x[i]);
}

/* The step-by-step API's update of a parameter row (templates/model.c's sgd_live_rows), plain SGD as
 * update() always did it, w[i] + -lr * grad[i]: from the row's gradient g (sgd_row), or from
 * the one contribution it had, grad[i] = 0 + alpha * x[i], never written out (sgd_rank1_row).
 * Stores aligned to a cache line: a 512-bit store straddling two (sgd_axpy aligns to 32 bytes)
 * made update() 10% slower on AVX-512 (MNIST, gcc -O3 -march=native). */
KERNEL void sgd_row(real *restrict w, real lr, const real *restrict g, long n)
{
    for (; n > 0 && (uintptr_t)w % 64; n--)
        *w = *w + -lr * *g++, w++;
    const real *end = g + (n & ~7L);
#define SGD_ROW(l) w[l] = w[l] + -lr * g[l];
    UNROLLED
    for (; g < end; g += 8, w += 8) {
        STEP8(SGD_ROW)
    }
#undef SGD_ROW
    for (long i = 0; i < (n & 7); i++)
        w[i] = w[i] + -lr * g[i];
}

KERNEL void sgd_rank1_row(real *restrict w, real lr, real alpha, const real *restrict x, long n)
{
    for (; n > 0 && (uintptr_t)w % 64; n--)
        *w = *w + -lr * ((real)0 + alpha * *x++), w++;
    const real *end = x + (n & ~7L);
#define SGD_RANK1(l) w[l] = w[l] + -lr * ((real)0 + alpha * x[l]);
    UNROLLED
    for (; x < end; x += 8, w += 8) {
        STEP8(SGD_RANK1)
    }
#undef SGD_RANK1
    for (long i = 0; i < (n & 7); i++)
        w[i] = w[i] + -lr * ((real)0 + alpha * x[i]);
}

/* w[i] -= lr * g[i], then g[i] = 0: train()'s SGD step after a batch (templates/driver.c) */
KERNEL void sgd_step(real *restrict w, real *restrict g, real lr, long n)
{
    real *end = w + (n & ~7L);
#define SGD(l) w[l] -= lr * g[l]; g[l] = 0;
    UNROLLED
    for (; w < end; w += 8, g += 8) {
        STEP8(SGD)
    }
#undef SGD
    for (long i = 0; i < (n & 7); i++) {
        w[i] -= lr * g[i];
        g[i] = 0;
    }
}

/* y[i] += alpha (a sum's gradient to its terms; with alpha = -(lr * g), their SGD step) */
KERNEL void add_range(real *restrict y, real alpha, long n)
{
    if (alpha == 0)
        return;
    for (long i = 0; i < n; i++)
        y[i] += alpha;
}

/* J rows of S values, y_j apart, set to 0: a gradient's rows cleared once read (codegen/write/
 * loops.py's cleared), one memset where the rows lie end to end (a layer's gradients over a
 * batch's full positions), else one a row, or a loop for rows shorter than CLEAR_RUN_MIN values
 * (a position's few samples), where a call costs more than the stores. */
#define CLEAR_RUN_MIN 64
KERNEL void clear_rows(real *y, long y_j, long J, long S)
{
    if (J == 1 || y_j == S)
        memset(y, 0, (size_t)(J * S) * sizeof(real));
    else if (S >= CLEAR_RUN_MIN)
        for (long j = 0; j < J; j++)
            memset(y + j * y_j, 0, (size_t)S * sizeof(real));
    else
        for (long j = 0; j < J; j++)
            for (long s = 0; s < S; s++)
                y[j * y_j + s] = 0;
}

/* Sequential, so repeated offsets accumulate correctly. */
KERNEL void add_offsets(real *y, const int32_t *oy, real alpha, long n)
{
    for (long i = 0; i < n; i++)
        y[oy[i]] += alpha;
}

KERNEL void axpy_offsets(real *restrict y, const int32_t *oy, real alpha, const real *restrict x,
                         const int32_t *ox, long n)
{
    if (alpha == 0)
        return;
    for (long i = 0; i < n; i++)
        y[oy[i]] += alpha * x[ox[i]];
}

/* The batch's lanes side by side: in the batched program a sample's slots are its lanes of the
 * batch buffers (codegen/lower/batch.py), so a loop over the samples of dot_offsets or
 * axpy_offsets calls (an attention's weighted sums and their gradients, RMSNorm's sums of
 * squares: a call per sample, its terms a capacity apart) is these kernels over `lanes` samples,
 * in blocks of lanes that are a vector each, each lane's sums the same terms in the same order as
 * the call's: the same bits, whatever the block. LANE_BLOCK: the vector the unit is built for
 * (32 bytes with AVX: compilers.host_vector_flags; 16 with SSE2), so that a block's 8 sums stay
 * in its registers; after the whole blocks a half one (a 16-byte vector), then lane by lane. */
#define HALF_BLOCK (16 / (long)sizeof(real)) /* a 16-byte vector's lanes */
#define LANES_MOST (64 / (long)sizeof(real))   /* and a 64-byte one's: the widest block */
#if REAL_IS_FLOAT
typedef int32_t lanes_int; /* an integer as wide as a real (a lane's mask, a position) */
#else
typedef int64_t lanes_int;
#endif
#if defined(__AVX__)
#define LANE_BLOCK (2 * HALF_BLOCK)
#else
#define LANE_BLOCK HALF_BLOCK
#endif
#if defined(__GNUC__) && !defined(__TINYC__)
#define LANES_INLINE static inline __attribute__((always_inline)) /* (with a constant width) */
#else
#define LANES_INLINE static inline
#endif

/* The n terms of a lanes kernel's sums in eight partial sums, term i into part i & 7 as
 * dot_offsets and sum_offsets add them: ADD(k) adds term i + k into part k, unrolled (parts by
 * constant indices: the compiler keeps them in registers), then the last terms. */
#define EIGHT_PARTS(n, ADD)                                                                        \
    long i = 0;                                                                                    \
    for (; i + 8 <= (n); i += 8) {                                                                 \
        ADD(0) ADD(1) ADD(2) ADD(3) ADD(4) ADD(5) ADD(6) ADD(7)                                    \
    }                                                                                              \
    if (i + 0 < (n)) { ADD(0) if (i + 1 < (n)) { ADD(1) if (i + 2 < (n)) { ADD(2)                  \
    if (i + 3 < (n)) { ADD(3) if (i + 4 < (n)) { ADD(4) if (i + 5 < (n)) { ADD(5)                  \
    if (i + 6 < (n)) { ADD(6) }}}}}}}
/* X(k) for k < 1, 4, 8: a body written once for registers named by constant indices */
#define ONE(X) X(0)
#define FOUR(X) X(0) X(1) X(2) X(3)
#define EIGHT(X) FOUR(X) X(4) X(5) X(6) X(7)
/* x where `keep` (a comparison's lanes: all bits or none), else -0 (OR_MINUS_ZERO) or +0
 * (OR_ZERO), in GCC vector types VEC and MASK: a lane that a call would skip (its alpha 0, or a
 * term that does not reach it) adds -0 * +0 = -0 to its sum, which leaves any value as it is
 * (x + -0 is x, and -0 stays -0), fused or not, with neither a branch nor a blend on the sum's
 * chain. (A blend of the sum and the old value put two more operations on the chain of a sum held
 * over rows; without it, and four sums side by side, axpy_offsets_wide_rows went from 6.2% of the
 * bigger GPT's step to 5.3%.) */
#define OR_MINUS_ZERO(VEC, MASK, x, keep) ((VEC)(((MASK)(x) & (keep)) | ((MASK)(-(VEC){0}) & ~(keep))))
#define OR_ZERO(VEC, MASK, x, keep) ((VEC)((MASK)(x) & (keep)))
/* the eight parts summed pairwise, as the calls sum them */
#define EIGHT_SUMMED(s) (((s)[0] + (s)[1]) + ((s)[2] + (s)[3])) + (((s)[4] + (s)[5]) + ((s)[6] + (s)[7]))

/* dot_offsets of lanes l0 .. l0 + width - 1 */
LANES_INLINE void dot_offsets_block(real *restrict out, const real *a, const int32_t *oa, const real *b,
                                    const int32_t *ob, long n, long width)
{
    real s[8][LANE_BLOCK] = {{0}};
#define DOT_LANES(k)                                                                               \
    for (long l = 0; l < width; l++)                                                               \
        s[k][l] += a[oa[i + k] + l] * b[ob[i + k] + l];
    EIGHT_PARTS(n, DOT_LANES)
#undef DOT_LANES
    for (long l = 0; l < width; l++)
        out[l] = ((s[0][l] + s[1][l]) + (s[2][l] + s[3][l])) + ((s[4][l] + s[5][l]) + (s[6][l] + s[7][l]));
}

/* largest_at of a vector's lanes (VEC, MASK: GCC vector types of reals and of lanes_int): each
 * lane's largest into top, its position into at, its compares in largest_at's order (a NaN never
 * replaces, nor an equal) and free of branches */
#define LARGEST_AT_VECTOR(VEC, MASK)                                                               \
    {                                                                                              \
        VEC best;                                                                                  \
        MASK k = {0};                                                                              \
        memcpy(&best, x, sizeof best);                                                             \
        for (long i = 1; i < n; i++) {                                                             \
            VEC v;                                                                                 \
            memcpy(&v, x + i * step, sizeof v);                                                    \
            const MASK more = best < v;                                                            \
            best = (VEC)(((MASK)v & more) | ((MASK)best & ~more));                                 \
            k = (more & (lanes_int)i) | (k & ~more);                                               \
        }                                                                                          \
        memcpy(top, &best, sizeof best);                                                           \
        memcpy(at, &k, sizeof k);                                                                  \
    }

/* AVX-512's blocks where the CPU has it (cpu_features): a 64-byte vector of lanes (16 float32
 * samples: microgpt's pass of 16 documents, in one block instead of two), each lane's operations
 * those of the blocks above, multiplies and adds fused where the unit fuses them (-march=native)
 * and else not (WIDE_UNFUSED: AVX-512 implies FMA). The bigger GPT (n_embd 64, B = 32, float32,
 * Intel Xeon with AVX-512): the step 0.92x the time, these kernels 12% of it before. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__)
#define WIDE_BLOCK (64 / (long)sizeof(real))
typedef real lanes_vec __attribute__((vector_size(64)));
#if defined(__FMA__)
#define WIDE_UNFUSED
#define LANES_AVX512_FUNCTION static __attribute__((target("avx512f"), noinline)) void
#else
#define WIDE_UNFUSED UNFUSED
#define LANES_AVX512_FUNCTION static __attribute__((target("avx512f"), noinline)) UNFUSED_FUNCTION void
#endif

LANES_AVX512_FUNCTION dot_offsets_wide(real *restrict out, const real *a, const int32_t *oa, const real *b,
                                       const int32_t *ob, long n)
{
    WIDE_UNFUSED
    lanes_vec s[8] = {{0}};
#define DOT_WIDE(k)                                                                                \
    {                                                                                              \
        lanes_vec x, y;                                                                            \
        memcpy(&x, a + oa[i + k], sizeof x);                                                       \
        memcpy(&y, b + ob[i + k], sizeof y);                                                       \
        s[k] += x * y;                                                                             \
    }
    EIGHT_PARTS(n, DOT_WIDE)
#undef DOT_WIDE
    const lanes_vec sum = EIGHT_SUMMED(s);
    memcpy(out, &sum, sizeof sum);
}

LANES_AVX512_FUNCTION sum_offsets_wide(real *restrict out, const real *x, const int32_t *ox, long n)
{
    WIDE_UNFUSED
    lanes_vec s[8] = {{0}};
#define SUM_WIDE(k)                                                                                \
    {                                                                                              \
        lanes_vec y;                                                                               \
        memcpy(&y, x + ox[i + k], sizeof y);                                                       \
        s[k] += y;                                                                                 \
    }
    EIGHT_PARTS(n, SUM_WIDE)
#undef SUM_WIDE
    const lanes_vec sum = EIGHT_SUMMED(s);
    memcpy(out, &sum, sizeof sum);
}

/* (a block one of whose alphas is 0 lane by lane, as axpy_offsets_block) */
LANES_AVX512_FUNCTION axpy_offsets_wide(real *restrict y, const int32_t *oy, const real *alpha,
                                        const real *restrict x, const int32_t *ox, long n)
{
    WIDE_UNFUSED
    int zero = 0;
    for (long l = 0; l < WIDE_BLOCK; l++)
        zero |= alpha[l] == 0;
    if (zero) {
        for (long l = 0; l < WIDE_BLOCK; l++)
            axpy_offsets(y + l, oy, alpha[l], x + l, ox, n);
        return;
    }
    lanes_vec go;
    memcpy(&go, alpha, sizeof go);
    for (long i = 0; i < n; i++) {
        lanes_vec to, from;
        memcpy(&to, y + oy[i], sizeof to);
        memcpy(&from, x + ox[i], sizeof from);
        to += go * from;
        memcpy(y + oy[i], &to, sizeof to);
    }
}
/* dot_offsets_wide for `rows` rows of b a b_step apart, two at a time: a's terms read once a pair */
LANES_AVX512_FUNCTION dot_offsets_wide_rows(real *out, long out_step, const real *a, const int32_t *oa, const real *b,
                                            long b_step, const int32_t *ob, long n, long rows)
{
    WIDE_UNFUSED
    long r = 0;
    for (; r + 2 <= rows; r += 2) {
        const real *b0 = b + r * b_step, *b1 = b0 + b_step;
        lanes_vec s[8] = {{0}}, t[8] = {{0}};
#define DOT_WIDE2(k)                                                                               \
    {                                                                                              \
        lanes_vec x, y0, y1;                                                                       \
        memcpy(&x, a + oa[i + k], sizeof x);                                                       \
        memcpy(&y0, b0 + ob[i + k], sizeof y0);                                                    \
        memcpy(&y1, b1 + ob[i + k], sizeof y1);                                                    \
        s[k] += x * y0;                                                                            \
        t[k] += x * y1;                                                                            \
    }
        EIGHT_PARTS(n, DOT_WIDE2)
#undef DOT_WIDE2
        const lanes_vec first = EIGHT_SUMMED(s), second = EIGHT_SUMMED(t);
        memcpy(out + r * out_step, &first, sizeof first);
        memcpy(out + (r + 1) * out_step, &second, sizeof second);
    }
    if (r < rows)
        dot_offsets_wide(out + r * out_step, a, oa, b + r * b_step, ob, n);
}

/* a lane whose alpha (go) is 0 skipped as axpy_offsets skips it: go made -0, the term +0 */
typedef lanes_int lanes_mask __attribute__((vector_size(64))); /* (a comparison's lanes: all bits or none) */
#define SKIPPING(go) OR_MINUS_ZERO(lanes_vec, lanes_mask, go, (go) != 0)
#define SKIPPED(go, term) OR_ZERO(lanes_vec, lanes_mask, term, (go) != 0)

/* axpy_offsets_wide for `rows` rows (axpy_offsets_lanes_rows), a lane whose alpha is 0 skipped as
 * it skips it (TERM: SKIPPING where a row has such a lane, else each term as it is). A target the
 * same for every row (y_step 0) gets their terms in order in a register, read and written once,
 * four targets at a time (their sums' chains side by side; each row's alphas read once for the
 * four); an x the same for every row is read once a term. */
#define HELD_OVER_ROWS(K, EACH)                                                                    \
    for (; i + (K) <= n; i += (K)) {                                                               \
        lanes_vec to[K];                                                                           \
        EACH(TO_READ)                                                                              \
        for (long r = 0; r < rows; r++) {                                                          \
            lanes_vec go;                                                                          \
            memcpy(&go, alpha + r * alpha_step, sizeof go);                                        \
            EACH(TO_ADD)                                                                           \
        }                                                                                          \
        EACH(TO_WRITE)                                                                             \
    }
#define TO_READ(k) memcpy(&to[k], y + oy[i + (k)], sizeof to[k]);
#define TO_ADD(k)                                                                                  \
    {                                                                                              \
        lanes_vec term;                                                                            \
        memcpy(&term, x + ox[i + (k)] + r * x_step, sizeof term);                                  \
        to[k] += TERM(go, term);                                                                   \
    }
#define TO_WRITE(k) memcpy(y + oy[i + (k)], &to[k], sizeof to[k]);
#define AXPY_WIDE_ROWS                                                                             \
    if (y_step == 0) {                                                                             \
        long i = 0;                                                                                \
        HELD_OVER_ROWS(4, FOUR)                                                                    \
        HELD_OVER_ROWS(1, ONE)                                                                     \
    } else                                                                                         \
        for (long i = 0; i < n; i++) {                                                             \
            real *into = y + oy[i];                                                                \
            lanes_vec term;                                                                        \
            memcpy(&term, x + ox[i], sizeof term);                                                 \
            for (long r = 0; r < rows; r++) {                                                      \
                lanes_vec go, to;                                                                  \
                memcpy(&go, alpha + r * alpha_step, sizeof go);                                    \
                memcpy(&to, into + r * y_step, sizeof to);                                         \
                to += TERM(go, term);                                                              \
                memcpy(into + r * y_step, &to, sizeof to);                                         \
            }                                                                                      \
        }
LANES_AVX512_FUNCTION axpy_offsets_wide_rows(real *restrict y, const int32_t *oy, long y_step, const real *alpha,
                                             long alpha_step, const real *restrict x, const int32_t *ox,
                                             long x_step, long n, long rows)
{
    WIDE_UNFUSED
    if (y_step != 0 && x_step != 0) {
        for (long r = 0; r < rows; r++)
            axpy_offsets_wide(y + r * y_step, oy, alpha + r * alpha_step, x + r * x_step, ox, n);
        return;
    }
    lanes_mask zero = {0};
    for (long r = 0; r < rows; r++) {
        lanes_vec go;
        memcpy(&go, alpha + r * alpha_step, sizeof go);
        zero |= go == 0;
    }
    int any = 0;
    for (long l = 0; l < WIDE_BLOCK; l++)
        any |= zero[l] != 0;
    if (any) {
#define TERM(go, term) SKIPPING(go) * SKIPPED(go, term)
        AXPY_WIDE_ROWS
#undef TERM
    } else {
#define TERM(go, term) (go) * (term)
        AXPY_WIDE_ROWS
#undef TERM
    }
}
#undef HELD_OVER_ROWS
#undef TO_READ
#undef TO_ADD
#undef TO_WRITE
#undef AXPY_WIDE_ROWS

/* add_offsets_lanes' block of WIDE_BLOCK lanes (a lane whose alpha is 0 skipped) */
LANES_AVX512_FUNCTION add_offsets_wide(real *y, const int32_t *oy, const real *alpha, long n)
{
    lanes_vec go;
    memcpy(&go, alpha, sizeof go);
    const lanes_vec add = SKIPPING(go);
    for (long i = 0; i < n; i++) {
        lanes_vec to;
        memcpy(&to, y + oy[i], sizeof to);
        to += add;
        memcpy(y + oy[i], &to, sizeof to);
    }
}
#undef SKIPPING
#undef SKIPPED

/* largest_at of WIDE_BLOCK lanes: each lane's largest value into top, its position into at */
LANES_AVX512_FUNCTION largest_at_wide(real *top, lanes_int *at, const real *x, long step, long n)
LARGEST_AT_VECTOR(lanes_vec, lanes_mask)

#define LANES_WIDE(WIDE)                                                                           \
    if (lanes >= WIDE_BLOCK && cpu_features() & CPU_AVX512F)                                       \
        for (; l0 + WIDE_BLOCK <= lanes; l0 += WIDE_BLOCK)                                         \
            WIDE(l0);
#else
#define LANES_WIDE(WIDE)
#endif

/* A lanes kernel's body over lanes [0, lanes): AVX-512's blocks where the CPU has it (WIDE(l0):
 * WIDE_BLOCK lanes from l0), then the unit's (BLOCK(l0, width): LANE_BLOCK lanes, then a half
 * block), then ONE(l0) lane by lane. */
#define LANES_IN_BLOCKS(WIDE, BLOCK, ONE)                                                          \
    long l0 = 0;                                                                                   \
    LANES_WIDE(WIDE)                                                                               \
    for (; l0 + LANE_BLOCK <= lanes; l0 += LANE_BLOCK)                                             \
        BLOCK(l0, LANE_BLOCK);                                                                     \
    if (LANE_BLOCK > HALF_BLOCK && l0 + HALF_BLOCK <= lanes) {                                     \
        BLOCK(l0, HALF_BLOCK);                                                                     \
        l0 += HALF_BLOCK;                                                                          \
    }                                                                                              \
    for (; l0 < lanes; l0++)                                                                       \
        ONE(l0);

KERNEL void dot_offsets_lanes(real *restrict out, const real *a, const int32_t *oa, const real *b,
                              const int32_t *ob, long n, long lanes)
{
#define DOT_WIDE(l) dot_offsets_wide(out + (l), a + (l), oa, b + (l), ob, n)
#define DOT_BLOCK(l, width) dot_offsets_block(out + (l), a + (l), oa, b + (l), ob, n, width)
#define DOT_ONE(l) out[l] = dot_offsets(a + (l), oa, b + (l), ob, n)
    LANES_IN_BLOCKS(DOT_WIDE, DOT_BLOCK, DOT_ONE)
#undef DOT_WIDE
#undef DOT_BLOCK
#undef DOT_ONE
}

/* sum_offsets of lanes l0 .. l0 + width - 1 (a softmax's denominators over a causal attention's
 * keys, a sum a lane at a time before: 1.5% of the bigger GPT's step) */
LANES_INLINE void sum_offsets_block(real *restrict out, const real *x, const int32_t *ox, long n, long width)
{
    real s[8][LANE_BLOCK] = {{0}};
#define SUM_LANES(k)                                                                               \
    for (long l = 0; l < width; l++)                                                               \
        s[k][l] += x[ox[i + k] + l];
    EIGHT_PARTS(n, SUM_LANES)
#undef SUM_LANES
    for (long l = 0; l < width; l++)
        out[l] = ((s[0][l] + s[1][l]) + (s[2][l] + s[3][l])) + ((s[4][l] + s[5][l]) + (s[6][l] + s[7][l]));
}

KERNEL void sum_offsets_lanes(real *restrict out, const real *x, const int32_t *ox, long n, long lanes)
{
#define SUM_WIDE(l) sum_offsets_wide(out + (l), x + (l), ox, n)
#define SUM_BLOCK(l, width) sum_offsets_block(out + (l), x + (l), ox, n, width)
#define SUM_ONE(l) out[l] = sum_offsets(x + (l), ox, n)
    LANES_IN_BLOCKS(SUM_WIDE, SUM_BLOCK, SUM_ONE)
#undef SUM_WIDE
#undef SUM_BLOCK
#undef SUM_ONE
}

/* alpha[0 .. width) copied into go; whether one of them is 0 (a lane the calls skip) */
LANES_INLINE int lanes_copied_with_a_zero(real *go, const real *alpha, long width)
{
    int zero = 0;
    for (long l = 0; l < width; l++)
        zero |= (go[l] = alpha[l]) == 0;
    return zero;
}

/* axpy_offsets of lanes l0 .. l0 + width - 1 (a block one of whose alphas is 0 lane by lane:
 * the call skips such a lane, which adding 0 times x would not quite, for a y of -0 or an x not
 * finite) */
LANES_INLINE void axpy_offsets_block(real *restrict y, const int32_t *oy, const real *alpha,
                                     const real *restrict x, const int32_t *ox, long n, long width)
{
    real go[LANE_BLOCK];
    if (lanes_copied_with_a_zero(go, alpha, width)) {
        for (long l = 0; l < width; l++)
            axpy_offsets(y + l, oy, go[l], x + l, ox, n);
        return;
    }
    for (long i = 0; i < n; i++)
        for (long l = 0; l < width; l++)
            y[oy[i] + l] += go[l] * x[ox[i] + l];
}

/* axpy_offsets(y + l, oy, alpha[l], x + l, ox, n) for every lane l < lanes */
KERNEL void axpy_offsets_lanes(real *restrict y, const int32_t *oy, const real *alpha, const real *restrict x,
                               const int32_t *ox, long n, long lanes)
{
#define AXPY_WIDE(l) axpy_offsets_wide(y + (l), oy, alpha + (l), x + (l), ox, n)
#define AXPY_BLOCK(l, width) axpy_offsets_block(y + (l), oy, alpha + (l), x + (l), ox, n, width)
#define AXPY_ONE(l) axpy_offsets(y + (l), oy, alpha[l], x + (l), ox, n)
    LANES_IN_BLOCKS(AXPY_WIDE, AXPY_BLOCK, AXPY_ONE)
#undef AXPY_WIDE
#undef AXPY_BLOCK
#undef AXPY_ONE
}

/* largest_at of lanes l0 .. l0 + width - 1 (see largest_at_wide): in the unit's vectors where the
 * compiler has GCC's (the loop over the lanes, left to GCC -O2, kept the largest in memory by masked
 * stores, each loaded again at the next candidate), else lane by lane */
#if defined(__GNUC__) && !defined(__TINYC__)
typedef real block_vec __attribute__((vector_size(LANE_BLOCK * sizeof(real))));
typedef lanes_int block_mask __attribute__((vector_size(LANE_BLOCK * sizeof(real))));
typedef real half_vec __attribute__((vector_size(HALF_BLOCK * sizeof(real))));
typedef lanes_int half_mask __attribute__((vector_size(HALF_BLOCK * sizeof(real))));
static inline void largest_at_whole(real *top, lanes_int *at, const real *x, long step, long n)
LARGEST_AT_VECTOR(block_vec, block_mask)
static inline void largest_at_half(real *top, lanes_int *at, const real *x, long step, long n)
LARGEST_AT_VECTOR(half_vec, half_mask)
#endif
LANES_INLINE void largest_at_block(real *top, lanes_int *at, const real *x, long step, long n, long width)
{
#if defined(__GNUC__) && !defined(__TINYC__)
    if (width == LANE_BLOCK)
        largest_at_whole(top, at, x, step, n);
    else
        largest_at_half(top, at, x, step, n);
#else
    for (long l = 0; l < width; l++) {
        at[l] = largest_at(x + l, step, n);
        top[l] = x[l + step * at[l]];
    }
#endif
}

/* A maximum over a batch's lanes (the op table's MAXIMUM, its n candidates `step` apart, lane l's
 * from x + l: a softmax's largest logit over an attention's keys, a sample a lane), a loop of
 * largest_at a lane before (each a chain of compares and branches the data decides: 2.5% of the
 * bigger GPT's step): each lane's compares in the same order, so the same largest and the same
 * position. largest_lanes writes the largest, out[l]; add_to_largest_lanes adds go[l] to the
 * gradient of the candidate it is, g[l + step * k], lane after lane as the loop did. */
KERNEL void largest_lanes(real *restrict out, const real *x, long step, long n, long lanes)
{
    lanes_int at[LANES_MOST];
#define LARGEST_WIDE(l) largest_at_wide(out + (l), at, x + (l), step, n)
#define LARGEST_BLOCK(l, width) largest_at_block(out + (l), at, x + (l), step, n, width)
#define LARGEST_ONE(l) out[l] = x[(l) + step * largest_at(x + (l), step, n)]
    LANES_IN_BLOCKS(LARGEST_WIDE, LARGEST_BLOCK, LARGEST_ONE)
#undef LARGEST_WIDE
#undef LARGEST_BLOCK
#undef LARGEST_ONE
}

KERNEL void add_to_largest_lanes(real *g, const real *x, long step, long n, const real *go, long lanes)
{
    real top[LANES_MOST];
    lanes_int at[LANES_MOST];
#define TO_LARGEST(l, width)                                                                       \
    for (long j = 0; j < (width); j++)                                                             \
        g[(l) + j + step * at[j]] += go[(l) + j];
#define LARGEST_WIDE(l)                                                                            \
    {                                                                                              \
        largest_at_wide(top, at, x + (l), step, n);                                                \
        TO_LARGEST(l, WIDE_BLOCK)                                                                  \
    }
#define LARGEST_BLOCK(l, width)                                                                    \
    {                                                                                              \
        largest_at_block(top, at, x + (l), step, n, width);                                        \
        TO_LARGEST(l, width)                                                                       \
    }
#define LARGEST_ONE(l) g[(l) + step * largest_at(x + (l), step, n)] += go[l]
    LANES_IN_BLOCKS(LARGEST_WIDE, LARGEST_BLOCK, LARGEST_ONE)
#undef TO_LARGEST
#undef LARGEST_WIDE
#undef LARGEST_BLOCK
#undef LARGEST_ONE
}

/* add_offsets of lanes l0 .. l0 + width - 1 whose alpha is not 0 */
LANES_INLINE void add_offsets_block(real *y, const int32_t *oy, const real *alpha, long n, long width)
{
    real go[LANE_BLOCK];
    if (lanes_copied_with_a_zero(go, alpha, width)) {
        for (long l = 0; l < width; l++)
            if (go[l] != 0)
                add_offsets(y + l, oy, go[l], n);
        return;
    }
    for (long i = 0; i < n; i++)
        for (long l = 0; l < width; l++)
            y[oy[i] + l] += go[l];
}

/* add_offsets(y + l, oy, alpha[l], n) for every lane l < lanes whose alpha is not 0: a sum's
 * gradient to its terms at offsets, a call a sample behind `if (go != 0)` before (a softmax's
 * denominators' over an attention's keys) */
KERNEL void add_offsets_lanes(real *y, const int32_t *oy, const real *alpha, long n, long lanes)
{
#define ADD_WIDE(l) add_offsets_wide(y + (l), oy, alpha + (l), n)
#define ADD_BLOCK(l, width) add_offsets_block(y + (l), oy, alpha + (l), n, width)
#define ADD_ONE(l)                                                                                 \
    if (alpha[l] != 0)                                                                             \
    add_offsets(y + (l), oy, alpha[l], n)
    LANES_IN_BLOCKS(ADD_WIDE, ADD_BLOCK, ADD_ONE)
#undef ADD_WIDE
#undef ADD_BLOCK
#undef ADD_ONE
}

/* A loop of dot_offsets_lanes calls along `rows` whose out and b move by fixed steps (an
 * attention's weighted sums, a row a dimension of the values: codegen/write/rows.py) as one call:
 * dot_offsets_lanes(out + r * out_step, a, oa, b + r * b_step, ob, n, lanes) for every r < rows,
 * each the same bits. The caller's rows write no slot that one of them reads. */
KERNEL void dot_offsets_lanes_rows(real *out, long out_step, const real *a, const int32_t *oa, const real *b,
                                   long b_step, const int32_t *ob, long n, long lanes, long rows)
{
#define DOT_WIDE(l) dot_offsets_wide_rows(out + (l), out_step, a + (l), oa, b + (l), b_step, ob, n, rows)
#define DOT_BLOCK(l, width)                                                                        \
    for (long r = 0; r < rows; r++)                                                                \
        dot_offsets_block(out + r * out_step + (l), a + (l), oa, b + r * b_step + (l), ob, n, width)
#define DOT_ONE(l)                                                                                 \
    for (long r = 0; r < rows; r++)                                                                \
        out[r * out_step + (l)] = dot_offsets(a + (l), oa, b + r * b_step + (l), ob, n)
    LANES_IN_BLOCKS(DOT_WIDE, DOT_BLOCK, DOT_ONE)
#undef DOT_WIDE
#undef DOT_BLOCK
#undef DOT_ONE
}

/* Likewise axpy_offsets_lanes(y + r * y_step, oy, alpha + r * alpha_step, x + r * x_step, ox, n,
 * lanes) for every r < rows, each target's terms in the same order: the caller's targets are
 * apart, a row and term each (or a term each, for every row: y_step 0), and none is an alpha.
 * An attention's weighted sums' backward: into the weights' gradients (y_step 0) and into the
 * values' (x_step 0), a row a dimension. */
KERNEL void axpy_offsets_lanes_rows(real *restrict y, const int32_t *oy, long y_step, const real *alpha,
                                    long alpha_step, const real *restrict x, const int32_t *ox, long x_step,
                                    long n, long lanes, long rows)
{
#define AXPY_WIDE(l) axpy_offsets_wide_rows(y + (l), oy, y_step, alpha + (l), alpha_step, x + (l), ox, x_step, n, rows)
#define AXPY_BLOCK(l, width)                                                                       \
    for (long r = 0; r < rows; r++)                                                                \
        axpy_offsets_block(y + r * y_step + (l), oy, alpha + r * alpha_step + (l), x + r * x_step + (l), ox, n, width)
#define AXPY_ONE(l)                                                                                \
    for (long r = 0; r < rows; r++)                                                                \
        axpy_offsets(y + r * y_step + (l), oy, alpha[r * alpha_step + (l)], x + r * x_step + (l), ox, n)
    LANES_IN_BLOCKS(AXPY_WIDE, AXPY_BLOCK, AXPY_ONE)
#undef AXPY_WIDE
#undef AXPY_BLOCK
#undef AXPY_ONE
}

/* Sums held over a causal triangle's terms (codegen/write/triangle.py: the attention's query-key
 * dots' backward, a query's gradients summed over its keys, a key's over its queries), a row
 * each, over the batch's lanes: for every lane l < lanes and row r < rows
 *     y[r * y_row + l] += alpha[oa[i] + l] * x[i * x_step + r * x_row + l]
 * for the terms first <= i < n in order, term i only in its first (long)active[i * active_step]
 * lanes (the documents that reach its query); then, with `clear`, each term's alphas in those
 * lanes set to 0 (the gradient read, cleared). The loop nest held the sums in an array over its
 * loop over the lanes, so each term loaded and stored every row's sums; here each block of lanes
 * keeps eight rows' in registers over the terms. A lane a term does not reach gets -0 * +0
 * (OR_MINUS_ZERO, OR_ZERO): the same bits. */
#define HELD_READ(k) memcpy(&sum[k], y + (r0 + (k)) * y_row, sizeof sum[k]);
#define HELD_ADD(k)                                                                                \
    {                                                                                              \
        HELD_VEC term;                                                                             \
        memcpy(&term, from + (r0 + (k)) * x_row, sizeof term);                                     \
        sum[k] += a * OR_ZERO(HELD_VEC, HELD_MASK, term, live);                                    \
    }
#define HELD_WRITE(k) memcpy(y + (r0 + (k)) * y_row, &sum[k], sizeof sum[k]);
#define HELD_PASS(EACH)                                                                            \
    {                                                                                              \
        HELD_VEC sum[8];                                                                           \
        EACH(HELD_READ)                                                                            \
        for (long i = first; i < n; i++) {                                                         \
            const long reach = (long)active[i * active_step] - l0;                                 \
            if (reach <= 0)                                                                        \
                continue;                                                                          \
            const HELD_MASK live = lane < (lanes_int)reach;                                        \
            const real *from = x + i * x_step;                                                     \
            HELD_VEC a;                                                                            \
            memcpy(&a, alpha + oa[i], sizeof a);                                                   \
            a = OR_MINUS_ZERO(HELD_VEC, HELD_MASK, a, live);                                       \
            EACH(HELD_ADD)                                                                         \
        }                                                                                          \
        EACH(HELD_WRITE)                                                                           \
    }
/* held_sums_lanes' rows for the lanes from l0 that a HELD_VEC holds (y, alpha and x from l0) */
#define HELD_SUMS_VECTOR                                                                           \
    (real *restrict y, long y_row, const real *alpha, const int32_t *oa, const real *restrict x,   \
     long x_row, long x_step, const real *active, long active_step, long first, long n, long l0,   \
     long rows)                                                                                    \
    {                                                                                              \
        HELD_UNFUSED                                                                               \
        HELD_MASK lane;                                                                            \
        for (long l = 0; l < (long)(sizeof lane / sizeof lane[0]); l++)                            \
            lane[l] = l;                                                                           \
        long r0 = 0;                                                                               \
        for (; r0 + 8 <= rows; r0 += 8)                                                            \
            HELD_PASS(EIGHT)                                                                       \
        for (; r0 + 4 <= rows; r0 += 4)                                                            \
            HELD_PASS(FOUR)                                                                        \
        for (; r0 < rows; r0++)                                                                    \
            HELD_PASS(ONE)                                                                         \
    }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__)
#define HELD_VEC lanes_vec
#define HELD_MASK lanes_mask
#define HELD_UNFUSED WIDE_UNFUSED
LANES_AVX512_FUNCTION held_sums_wide HELD_SUMS_VECTOR
#undef HELD_VEC
#undef HELD_MASK
#undef HELD_UNFUSED
#define HELD_WIDE(l)                                                                               \
    held_sums_wide(y + (l), y_row, alpha + (l), oa, x + (l), x_row, x_step, active, active_step, first, n, l, rows)
#else
#define HELD_WIDE(l)
#endif
#define HELD_UNFUSED
#if defined(__GNUC__) && !defined(__TINYC__)
#define HELD_VEC block_vec
#define HELD_MASK block_mask
static inline void held_sums_whole HELD_SUMS_VECTOR
#undef HELD_VEC
#undef HELD_MASK
#define HELD_VEC half_vec
#define HELD_MASK half_mask
static inline void held_sums_half HELD_SUMS_VECTOR
#undef HELD_VEC
#undef HELD_MASK
#define HELD_BLOCK(l, width)                                                                       \
    ((width) == LANE_BLOCK ? held_sums_whole : held_sums_half)                                     \
    (y + (l), y_row, alpha + (l), oa, x + (l), x_row, x_step, active, active_step, first, n, l, rows)
#else
#define HELD_BLOCK(l, width)                                                                       \
    for (long j = (l); j < (l) + (width); j++)                                                     \
        HELD_ONE(j)
#endif
#define HELD_ONE(l)                                                                                \
    for (long r = 0; r < rows; r++) {                                                              \
        real sum = y[r * y_row + (l)];                                                             \
        for (long i = first; i < n; i++)                                                           \
            if ((l) < (long)active[i * active_step])                                               \
                sum += alpha[oa[i] + (l)] * x[i * x_step + r * x_row + (l)];                       \
        y[r * y_row + (l)] = sum;                                                                  \
    }
KERNEL void held_sums_lanes(real *restrict y, long y_row, real *alpha, const int32_t *oa, int clear,
                            const real *restrict x, long x_row, long x_step, const real *active, long active_step,
                            long first, long n, long lanes, long rows)
{
    LANES_IN_BLOCKS(HELD_WIDE, HELD_BLOCK, HELD_ONE)
    for (long i = first; clear && i < n; i++)
        memset(alpha + oa[i], 0, (size_t)(long)active[i * active_step] * sizeof(real));
}
#undef HELD_READ
#undef HELD_ADD
#undef HELD_WRITE
#undef HELD_PASS
#undef HELD_SUMS_VECTOR
#undef HELD_WIDE
#undef HELD_BLOCK
#undef HELD_ONE
#undef HELD_UNFUSED
#undef LANES_IN_BLOCKS
#undef LANES_WIDE
#undef EIGHT_PARTS
#undef EIGHT_SUMMED
#undef ONE
#undef FOUR
#undef EIGHT
#undef OR_MINUS_ZERO
#undef OR_ZERO
#undef LANE_BLOCK
#undef HALF_BLOCK
#undef LANES_MOST
#undef LARGEST_AT_VECTOR
#undef LANES_INLINE
#undef WIDE_BLOCK
#undef WIDE_UNFUSED
#undef LANES_AVX512_FUNCTION

KERNEL void sgd_axpy_offsets(real *w, const int32_t *ow, real lr, real alpha, const real *x,
                             const int32_t *ox, long n)
{
    if (alpha == 0)
        return;
    for (long i = 0; i < n; i++)
        w[ow[i]] -= lr * (alpha * x[ox[i]]);
}
