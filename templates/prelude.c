/* What every generated C file starts with: the op table's primitives and the kernels that
 * fused dot products call. Spliced into templates/module.c and into each extra unit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The element type of every slot, kernel and optimizer state: codegen/emit.py defines
 * REAL_IS_FLOAT before this file (dtype="float32": float, else double). The op table's
 * primitives go through real_exp, real_log, real_tanh and real_pow in float mode (the emitter
 * renames them), so that float code calls expf & co. instead of widening to double. */
#if REAL_IS_FLOAT
typedef float real;
#define REAL_FORMAT "f"
#define real_exp expf
#define real_log logf
#define real_tanh tanhf
#define real_pow powf
#define real_sqrt sqrtf
#else
typedef double real;
#define REAL_FORMAT "d"
#define real_exp exp
#define real_log log
#define real_tanh tanh
#define real_pow pow
#define real_sqrt sqrt
#endif

/* Generated straight-line code comes in many small functions, perhaps spread over several
 * files compiled in parallel. Keep GCC and Clang from inlining them back into one huge
 * function (they optimise that in superlinear time) and out of the module's exports. Kernels
 * start on a cache line: dot's loop (five instructions) straddling two lines made MNIST's
 * train() 10% slower (gcc -O3 -march=native, AMD EPYC), depending on what code came before. */
#if defined(__GNUC__) && !defined(__TINYC__)
#define SHARED __attribute__((visibility("hidden")))
#define CHUNK __attribute__((noinline, visibility("hidden")))
#define KERNEL __attribute__((noinline, aligned(64))) static
#else
#define SHARED
#define CHUNK
#define KERNEL static
#endif

/* Before a generated loop whose iterations are independent (a group's forward): vectorise it
 * without run-time overlap checks, which compilers give up on when a loop reads many arrays. */
#if defined(__clang__)
/* where vectorising does not pay (a short loop, a call inside), Clang would warn that it did not */
#pragma clang diagnostic ignored "-Wpass-failed"
#define INDEPENDENT _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__) && !defined(__TINYC__)
#define INDEPENDENT _Pragma("GCC ivdep")
#else
#define INDEPENDENT
#endif

/* The op table's `where(cond, x, y)` primitive. */
#define where(c, x, y) ((c) ? (x) : (y))

/* ---- kernels for fused dot products -------------------------------------------------- */
/* Written unrolled, eight elements a step with eight independent accumulators (dot() and
 * sum_range(): sixteen, below): GCC and Clang turn each step into vector instructions without reassociating anything (no -ffast-math),
 * and TCC, which does not optimise, still gets short dependency chains and few loop branches.
 * Every compiler sums in the same order, so their results agree. */
#define STEP8(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7)
/* Clang's loop vectoriser would turn an unrolled step into gathers and scatters across steps;
 * its SLP vectoriser, left to it, makes each step's eight statements two plain vectors. */
#if defined(__clang__)
#define UNROLLED _Pragma("clang loop vectorize(disable)")
#else
#define UNROLLED
#endif

/* Sixteen lanes, two accumulator chains of 512-bit vectors in float64 (one in float32): a dot's
 * multiply-adds wait for their lane's last one, so the dense MNIST step is bound by this chain's
 * latency (README, the roofline); sixteen double lanes measured 0.71-0.79x the epoch time of
 * eight. In float32, eight lanes would make GCC's loop vectoriser vectorise across steps, with
 * permutes, at half the speed; thirty-two did not go faster than sixteen. */
#define STEP16(op) STEP8(op) op(8) op(9) op(10) op(11) op(12) op(13) op(14) op(15)
#define LANES16(s) ((((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + \
                    (((s[8] + s[9]) + (s[10] + s[11])) + ((s[12] + s[13]) + (s[14] + s[15]))))
/* the same sum of the sixteen accumulators s0..s15 of dot() and sum_range() */
#define ACCUMULATORS16 ((((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) + \
                        (((s8 + s9) + (s10 + s11)) + ((s12 + s13) + (s14 + s15))))
/* The last n & 15 elements into lanes 0..14, as if the loop went on, then the lanes' sum. Clang keeps an array of the
 * lanes indexed in a loop on the stack (it doubled the time of a convolution's many short dots),
 * so it gets a switch; GCC makes slower code of the switch (1.2x on the same convolution) than
 * of the loop. Both add the same products into the same lanes. */
#if defined(__clang__)
#define TAIL16(op)                                                                              \
    switch (n & 15) {                                                                           \
    case 15: op(14) /* fall through */                                                          \
    case 14: op(13) /* fall through */                                                          \
    case 13: op(12) /* fall through */                                                          \
    case 12: op(11) /* fall through */                                                          \
    case 11: op(10) /* fall through */                                                          \
    case 10: op(9) /* fall through */                                                           \
    case 9: op(8) /* fall through */                                                            \
    case 8: op(7) /* fall through */                                                            \
    case 7: op(6) /* fall through */                                                            \
    case 6: op(5) /* fall through */                                                            \
    case 5: op(4) /* fall through */                                                            \
    case 4: op(3) /* fall through */                                                            \
    case 3: op(2) /* fall through */                                                            \
    case 2: op(1) /* fall through */                                                            \
    case 1: op(0)                                                                               \
    }                                                                                           \
    return ACCUMULATORS16;
#else
#define TAIL16(op)                                                                              \
    real s[16] = {s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15};      \
    for (long i = 0; i < (n & 15); i++)                                                         \
        op##_LANE(i)                                                                            \
    return LANES16(s);
#endif

KERNEL real dot(const real *restrict a, const real *restrict b, long n)
{
    real s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    real s8 = 0, s9 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0, s14 = 0, s15 = 0;
    const real *end = a + (n & ~15L);
#define DOT(l) s##l += a[l] * b[l];
#define DOT_LANE(i) s[i] += a[i] * b[i];
    UNROLLED
    for (; a < end; a += 16, b += 16) {
        STEP16(DOT)
    }
    TAIL16(DOT)
#undef DOT
#undef DOT_LANE
}

/* The sum of x[0..n), in sixteen lanes like dot() */
KERNEL real sum_range(const real *restrict x, long n)
{
    real s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    real s8 = 0, s9 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0, s14 = 0, s15 = 0;
    const real *end = x + (n & ~15L);
#define SUM(l) s##l += x[l];
#define SUM_LANE(i) s[i] += x[i];
    UNROLLED
    for (; x < end; x += 16) {
        STEP16(SUM)
    }
    TAIL16(SUM)
#undef SUM
#undef SUM_LANE
}

/* ---- a layer over a batch: the batch's gradients against rows -------------------------------
 * A layer applied to a batch (the batch innermost in memory) gets, in backward, its weights'
 * gradients as dots of each neuron's gradient row against its inputs' rows (dot_rows) and its
 * inputs' gradients as a product of the weights with the neurons' gradient rows (matmul_acc).
 * Both skip the chunks of ROW_LANES samples whose gradients are all 0 (a hinge that is flat, a
 * ReLU that is off): their terms are exact zeros (unless a value they multiply is inf or NaN),
 * so the sums are those of the dense loops, but for the sign of a zero. */
#if REAL_IS_FLOAT
#define ROW_LANES 16
#define ROW_SUM LANES16
#else
#define ROW_LANES 8
#define ROW_SUM(s) (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])))
#endif
/* Longer gradient rows are not screened for zero chunks (one mask word per 64 chunks) */
#define ROW_MASK_WORDS 64

/* Whether x[0..count) has a value other than 0 or -0 (NaN counts): an OR of the bits without
 * the sign, which compilers vectorise, where comparing doubles takes a branch-free but serial
 * unordered compare per lane. */
static int any_nonzero(const real *x, int count)
{
#if REAL_IS_FLOAT
    uint32_t bits = 0, v;
#else
    uint64_t bits = 0, v;
#endif
    for (int l = 0; l < count; l++) {
        memcpy(&v, x + l, sizeof v);
        bits |= v << 1;
    }
    return bits != 0;
}
#define lanes_nonzero(x) any_nonzero(x, ROW_LANES)

/* Bit c of mask: chunk c of x[0..n) (ROW_LANES values) has a nonzero. Returns whether x has
 * any nonzero (the values after the last whole chunk included). */
static int chunk_mask(const real *x, long n, uint64_t *mask)
{
    long chunks = n / ROW_LANES;
    if (chunks > 64 * ROW_MASK_WORDS) {
        memset(mask, 0xff, ROW_MASK_WORDS * sizeof *mask);
        return 1;
    }
    uint64_t any = 0;
    memset(mask, 0, (size_t)(chunks + 63) / 64 * sizeof *mask);
    for (long c = 0; c < chunks; c++)
        mask[c / 64] |= (uint64_t)lanes_nonzero(x + c * ROW_LANES) << (c % 64);
    for (long w = 0; w < (chunks + 63) / 64; w++)
        any |= mask[w];
    for (long i = chunks * ROW_LANES; i < n; i++)
        any |= x[i] != 0;
    return any != 0;
}
#define CHUNK_SET(mask, c) ((c) >= 64 * ROW_MASK_WORDS || ((mask)[(c) / 64] >> ((c) % 64) & 1))

/* Four rows against a, each in ROW_LANES lanes (eight in float64, sixteen in float32) summed
 * pairwise, into out[0..3]; chunks whose mask bit is clear are skipped. GCC and Clang get the lanes as one vector per row (their vector
 * extension): left to vectorise scalar lanes, GCC groups lane l of the four rows into one
 * vector instead and gathers every element. TCC sums the same lanes in scalars. */
#if defined(__GNUC__) && !defined(__TINYC__)
typedef real row_lanes __attribute__((vector_size(ROW_LANES * sizeof(real)), aligned(sizeof(real)), may_alias));
#define ROW_LOAD(p) (*(const row_lanes *)(p))
#define ROW_ADD(p, v) (*(row_lanes *)(p) += (v))
KERNEL void dot4(const real *restrict a, const real *restrict b0, const real *restrict b1,
                 const real *restrict b2, const real *restrict b3, long n, const uint64_t *mask,
                 real *restrict out)
{
    row_lanes p = {0}, q = {0}, r = {0}, t = {0};
    long chunks = n / ROW_LANES;
    for (long c = 0; c < chunks; c++, a += ROW_LANES, b0 += ROW_LANES, b1 += ROW_LANES, b2 += ROW_LANES,
                                      b3 += ROW_LANES) {
        if (!CHUNK_SET(mask, c))
            continue;
        row_lanes x = ROW_LOAD(a);
        p += x * ROW_LOAD(b0);
        q += x * ROW_LOAD(b1);
        r += x * ROW_LOAD(b2);
        t += x * ROW_LOAD(b3);
    }
    real sp[ROW_LANES], sq[ROW_LANES], sr[ROW_LANES], st[ROW_LANES];
    memcpy(sp, &p, sizeof sp);
    memcpy(sq, &q, sizeof sq);
    memcpy(sr, &r, sizeof sr);
    memcpy(st, &t, sizeof st);
#else
KERNEL void dot4(const real *restrict a, const real *restrict b0, const real *restrict b1,
                 const real *restrict b2, const real *restrict b3, long n, const uint64_t *mask,
                 real *restrict out)
{
    real sp[ROW_LANES] = {0}, sq[ROW_LANES] = {0}, sr[ROW_LANES] = {0}, st[ROW_LANES] = {0};
    long chunks = n / ROW_LANES;
    for (long c = 0; c < chunks; c++, a += ROW_LANES, b0 += ROW_LANES, b1 += ROW_LANES, b2 += ROW_LANES,
                                      b3 += ROW_LANES) {
        if (!CHUNK_SET(mask, c))
            continue;
        for (long l = 0; l < ROW_LANES; l++) {
            sp[l] += a[l] * b0[l];
            sq[l] += a[l] * b1[l];
            sr[l] += a[l] * b2[l];
            st[l] += a[l] * b3[l];
        }
    }
#endif
    for (long l = 0; l < n % ROW_LANES; l++) { /* the tail, lane by lane as in dot() */
        sp[l] += a[l] * b0[l];
        sq[l] += a[l] * b1[l];
        sr[l] += a[l] * b2[l];
        st[l] += a[l] * b3[l];
    }
    out[0] = ROW_SUM(sp);
    out[1] = ROW_SUM(sq);
    out[2] = ROW_SUM(sr);
    out[3] = ROW_SUM(st);
}

/* out[k * out_step] += dot(a, b + k * b_step, n) for k < m: a neuron's gradient row a over a
 * batch against each of its inputs' rows (its weights' gradients), four rows at a time sharing
 * the loads of a. */
KERNEL void dot_rows(const real *restrict a, const real *restrict b, long b_step, long n, long m,
                     real *restrict out, long out_step)
{
    uint64_t mask[ROW_MASK_WORDS];
    if (!chunk_mask(a, n, mask))
        return; /* a is all 0: nothing to add */
    long k = 0;
    for (; k + 4 <= m; k += 4) {
        const real *row = b + k * b_step;
        real s[4];
        dot4(a, row, row + b_step, row + 2 * b_step, row + 3 * b_step, n, mask, s);
        out[k * out_step] += s[0];
        out[(k + 1) * out_step] += s[1];
        out[(k + 2) * out_step] += s[2];
        out[(k + 3) * out_step] += s[3];
    }
    if (k < m) { /* one to three rows left: the last one stands in for the missing ones */
        const real *row = b + k * b_step, *last = b + (m - 1) * b_step;
        real s[4];
        dot4(a, row, k + 1 < m ? row + b_step : last, k + 2 < m ? row + 2 * b_step : last, last, n, mask, s);
        for (long r = 0; k + r < m; r++)
            out[(k + r) * out_step] += s[r];
    }
}

/* A product's rows run on the module's threads (templates/pool.c, defined in the module's own
 * unit); exported C (codegen.export: no Python, perhaps no libc) runs them in the caller. */
typedef void (*RowTask)(void *args, long first, long last);
#if HAVE_THREAD_POOL
SHARED void parallel_rows(RowTask task, void *args, long rows, long align);
#else
static void parallel_rows(RowTask task, void *args, long rows, long align)
{
    (void)align;
    task(args, 0, rows);
}
#endif

/*@INCLUDE gemm.c@*/

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

/* The step-by-step API's update of a parameter row (codegen/emit.py's step_rows), plain SGD as
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

KERNEL void sgd_axpy_offsets(real *w, const int32_t *ow, real lr, real alpha, const real *x,
                             const int32_t *ox, long n)
{
    if (alpha == 0)
        return;
    for (long i = 0; i < n; i++)
        w[ow[i]] -= lr * (alpha * x[ox[i]]);
}

/* ---- sparse inputs ------------------------------------------------------------------------ */
/* An input range that dots read (a layer's pixels) has lists of its chunks of eight values that
 * hold a nonzero, built by scan_nonzeros() before each forward and backward. dot() sums in
 * sixteen lanes, chunk c in lanes 8 (c % 2) .. 8 (c % 2) + 7; chunks are listed by that lane
 * group: nz[0] and nz[1] count the even and the odd chunks, listed from nz + 2 and from
 * nz + 2 + NZ_GROUP_SIZE(n); 2 + NZ_CHUNKS(n) words in all (codegen/emit.py's _nonzero_words).
 * The kernels add the listed chunks into the lanes dot() adds them to, in the same order, and
 * sum the lanes as dot() does, so their dots are dot()'s exactly: the chunks left out add exact
 * zeros (w * 0; only a weight that is inf or NaN would have made them otherwise). Updates of
 * the weights a dot read step the listed chunks with the dense kernels' expression. The values
 * after the last whole chunk are always visited. Whole chunks keep the loads in vector
 * registers, where a list of single nonzeros needs a gather and a scatter per value (slower
 * than the dense kernels on this project's AVX-512 machine); in float32 a chunk of sixteen (a
 * cache line) made the first layer 1.2x slower than eight, dense or sparse (four accumulator
 * chains instead of eight), and one list of all chunks in order made the updates no faster. */
#define NZ_LANES 8
#define NZ_CHUNKS(n) ((n) / NZ_LANES)
#define NZ_GROUP_SIZE(n) ((NZ_CHUNKS(n) + 1) / 2)
#define NZ_LIST(nz, n, group) ((nz) + 2 + (group) * NZ_GROUP_SIZE(n))
/* Lists of three quarters of the chunks or more go to the dense loops, which stream (a chosen
 * line: MNIST's 40% gains, a full list would lose) */
#define NZ_SHORT(nz, n) (4 * ((long)(nz)[0] + (nz)[1]) < 3 * NZ_CHUNKS(n))

/* ---- a layer on one sample ------------------------------------------------------------------
 * out[j * out_j] = bias[j * bias_j] + dot(w + j * w_j, x, n) for j < J (bias NULL: no bias), nz
 * x's chunk lists. Over a short list, four rows at a time share the walk through it and the
 * loads of x, and run eight chains of multiply-adds; each row is summed in dot()'s lanes, in its
 * order, and its lanes summed as dot() sums them, so every result is dot()'s exactly
 * (tests/test_kernels.py), provided the compiler fuses the multiply-adds here as it does in
 * dot(): GCC's tuning for AMD leaves some chains of 256-bit ones unfused (a float32 dot_nz of its
 * own, with one chain per lane group, rounded otherwise), hence one routine for every sparse dot;
 * -ffp-contract=off would rule that out, but it made the CNN 1.3x slower with Clang. Otherwise
 * dot() a row at a time: dense rows stream faster so (0.85x the time of four at a time). */
#if defined(__GNUC__) && !defined(__TINYC__)
typedef real chunk_lanes __attribute__((vector_size(NZ_LANES * sizeof(real)), aligned(sizeof(real)), may_alias));
#define CHUNK_LOAD(p) (*(const chunk_lanes *)(p))
#define ROWS4_DECLARE(group) chunk_lanes group##0 = {0}, group##1 = {0}, group##2 = {0}, group##3 = {0};
#define ROWS4_CHUNK(c, group)                                                                   \
    {                                                                                           \
        long o_ = NZ_LANES * (long)(c);                                                         \
        chunk_lanes v_ = CHUNK_LOAD(x + o_);                                                    \
        group##0 += CHUNK_LOAD(w0 + o_) * v_;                                                   \
        group##1 += CHUNK_LOAD(w1 + o_) * v_;                                                   \
        group##2 += CHUNK_LOAD(w2 + o_) * v_;                                                   \
        group##3 += CHUNK_LOAD(w3 + o_) * v_;                                                   \
    }
#define ROWS4_LANES(group, r, s) memcpy(s, &group##r, sizeof group##r);
#else
#define ROWS4_DECLARE(group) real group[4][NZ_LANES] = {{0}};
#define ROWS4_CHUNK(c, group)                                                                   \
    for (long o_ = NZ_LANES * (long)(c), l_ = 0; l_ < NZ_LANES; l_++) {                         \
        group[0][l_] += w0[o_ + l_] * x[o_ + l_];                                               \
        group[1][l_] += w1[o_ + l_] * x[o_ + l_];                                               \
        group[2][l_] += w2[o_ + l_] * x[o_ + l_];                                               \
        group[3][l_] += w3[o_ + l_] * x[o_ + l_];                                               \
    }
#define ROWS4_LANES(group, r, s) memcpy(s, group[r], sizeof group[r]);
#endif
/* four rows' dots over x's chunk lists nz */
static void dot4_listed(const real *restrict x, const real *restrict w0, const real *restrict w1,
                        const real *restrict w2, const real *restrict w3, long n,
                        const int32_t *restrict nz, real *restrict out)
{
    ROWS4_DECLARE(g0) /* lanes 0-7: the even chunks */
    ROWS4_DECLARE(g1) /* lanes 8-15: the odd ones */
    const int32_t *list0 = NZ_LIST(nz, n, 0), *list1 = NZ_LIST(nz, n, 1);
    long n0 = nz[0], n1 = nz[1], k = 0;
    for (; k < n0 && k < n1; k++) {
        ROWS4_CHUNK(list0[k], g0)
        ROWS4_CHUNK(list1[k], g1)
    }
    for (; k < n0; k++)
        ROWS4_CHUNK(list0[k], g0)
    for (; k < n1; k++)
        ROWS4_CHUNK(list1[k], g1)
    const real *rows[4] = {w0, w1, w2, w3};
    real s[16];
#define ROWS4_SUM(r)                                                                            \
    ROWS4_LANES(g0, r, s)                                                                       \
    ROWS4_LANES(g1, r, s + NZ_LANES)                                                            \
    for (long i = NZ_CHUNKS(n) * NZ_LANES; i < n; i++)                                          \
        s[i & 15] += rows[r][i] * x[i];                                                         \
    out[r] = LANES16(s);
    ROWS4_SUM(0)
    ROWS4_SUM(1)
    ROWS4_SUM(2)
    ROWS4_SUM(3)
#undef ROWS4_SUM
}

KERNEL void matvec(real *restrict out, long out_j, const real *restrict bias, long bias_j,
                   const real *restrict w, long w_j, const real *restrict x, long n, long J,
                   const int32_t *restrict nz)
{
    if (!NZ_SHORT(nz, n)) {
        for (long j = 0; j < J; j++)
            out[j * out_j] = bias ? bias[j * bias_j] + dot(w + j * w_j, x, n) : dot(w + j * w_j, x, n);
        return;
    }
    const real *last = w + (J - 1) * w_j; /* stands in for the rows missing from the last four */
    for (long j = 0; j < J; j += 4) {
        const real *w0 = w + j * w_j;
        real s[4];
        dot4_listed(x, w0, j + 1 < J ? w0 + w_j : last, j + 2 < J ? w0 + 2 * w_j : last,
                    j + 3 < J ? w0 + 3 * w_j : last, n, nz, s);
        for (long r = 0; r < 4 && j + r < J; r++)
            out[(j + r) * out_j] = bias ? bias[(j + r) * bias_j] + s[r] : s[r];
    }
}

/* dot(a, x, n) over x's chunk lists: a single dot waits on its chains anyway, so three copies
 * beside it cost little */
KERNEL real dot_nz(const real *restrict a, const real *restrict x, long n, const int32_t *restrict nz)
{
    if (!NZ_SHORT(nz, n))
        return dot(a, x, n);
    real s[4];
    dot4_listed(x, a, a, a, a, n, nz, s);
    return s[0];
}

/* chunk_stmt for each chunk c listed in nz, then value_stmt for each value i after the last
 * whole chunk */
#define EACH_NONZERO(nz, n, c, chunk_stmt, i, value_stmt)                                       \
    for (int group_ = 0; group_ < 2; group_++)                                                  \
        for (long k_ = 0; k_ < (nz)[group_]; k_++) {                                            \
            long c = NZ_LIST(nz, n, group_)[k_];                                                \
            chunk_stmt                                                                          \
        }                                                                                       \
    for (long i = NZ_CHUNKS(n) * NZ_LANES; i < (n); i++) {                                      \
        value_stmt                                                                              \
    }
#define EACH_LANE(c, l) for (long l = NZ_LANES * (c); l < NZ_LANES * ((c) + 1); l++)

/* y[i] += alpha * x[i] over the listed chunks */
KERNEL void axpy_nz(real *restrict y, real alpha, const real *restrict x, long n, const int32_t *restrict nz)
{
    if (!NZ_SHORT(nz, n)) {
        axpy(y, alpha, x, n);
        return;
    }
    if (alpha == 0)
        return;
    EACH_NONZERO(nz, n, c, EACH_LANE(c, l) y[l] += alpha * x[l];, i, y[i] += alpha * x[i];)
}

/* sgd_axpy over the listed chunks: w[i] -= lr * (alpha * x[i]) */
KERNEL void sgd_axpy_nz(real *restrict w, real lr, real alpha, const real *restrict x, long n,
                        const int32_t *restrict nz)
{
    if (!NZ_SHORT(nz, n)) {
        sgd_axpy(w, lr, alpha, x, n);
        return;
    }
    if (alpha == 0)
        return;
    EACH_NONZERO(nz, n, c, EACH_LANE(c, l) w[l] -= lr * (alpha * x[l]);, i, w[i] -= lr * (alpha * x[i]);)
}

/* The chunk lists of the n values x[0..n) into nz (branch-free: the scan runs every sample) */
static void scan_range(const real *restrict x, long n, int32_t *restrict nz)
{
    int32_t counts[2] = {0, 0};
    for (long c = 0; c < NZ_CHUNKS(n); c++) {
        int group = (int)(c % 2);
        NZ_LIST(nz, n, group)[counts[group]] = (int32_t)c;
        counts[group] += any_nonzero(x + NZ_LANES * c, NZ_LANES);
    }
    nz[0] = counts[0];
    nz[1] = counts[1];
}
