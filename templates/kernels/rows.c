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
 * pairwise, into out[0..3]; chunks whose mask bit is clear are skipped. GCC and Clang get the
 * lanes as vectors (their vector extension): left to vectorise scalar lanes, GCC groups lane l
 * of the four rows into one vector instead and gathers every element. TCC sums the same lanes
 * in scalars. */
#if defined(__GNUC__) && !defined(__TINYC__)
/* A row's lanes are ROW_PARTS vectors of the CPU's width, each its own variable: GCC 12 kept one
 * vector of 64 bytes a row on the stack where the CPU's are 32 bytes (AVX2), a load and a store
 * around every multiply-add (Clang split it into registers) */
#if defined(__AVX512F__)
#define ROW_PART_BYTES 64
#elif defined(__AVX__)
#define ROW_PART_BYTES 32
#else
#define ROW_PART_BYTES 16
#endif
typedef real row_part __attribute__((vector_size(ROW_PART_BYTES), aligned(sizeof(real)), may_alias));
enum { ROW_PART_LANES = ROW_PART_BYTES / (int)sizeof(real), ROW_PARTS = ROW_LANES / ROW_PART_LANES };
#define ROW_PART(p, h) (*(const row_part *)((p) + (h) * ROW_PART_LANES))
#define DOT4_DECLARE(h) row_part p##h = {0}, q##h = {0}, r##h = {0}, t##h = {0};
#define DOT4_PART(h)                                                                               \
    if ((h) < ROW_PARTS) {                                                                         \
        const row_part x = ROW_PART(a, h);                                                         \
        p##h += x * ROW_PART(b0, h);                                                               \
        q##h += x * ROW_PART(b1, h);                                                               \
        r##h += x * ROW_PART(b2, h);                                                               \
        t##h += x * ROW_PART(b3, h);                                                               \
    }
#define DOT4_LANES(h)                                                                              \
    if ((h) < ROW_PARTS) {                                                                         \
        memcpy(sp + (h) * ROW_PART_LANES, &p##h, sizeof p##h);                                     \
        memcpy(sq + (h) * ROW_PART_LANES, &q##h, sizeof q##h);                                     \
        memcpy(sr + (h) * ROW_PART_LANES, &r##h, sizeof r##h);                                     \
        memcpy(st + (h) * ROW_PART_LANES, &t##h, sizeof t##h);                                     \
    }
KERNEL void dot4(const real *restrict a, const real *restrict b0, const real *restrict b1,
                 const real *restrict b2, const real *restrict b3, long n, const uint64_t *mask,
                 real *restrict out)
{
    DOT4_DECLARE(0) DOT4_DECLARE(1) DOT4_DECLARE(2) DOT4_DECLARE(3)
    long chunks = n / ROW_LANES;
    for (long c = 0; c < chunks; c++, a += ROW_LANES, b0 += ROW_LANES, b1 += ROW_LANES, b2 += ROW_LANES,
                                      b3 += ROW_LANES) {
        if (!CHUNK_SET(mask, c))
            continue;
        DOT4_PART(0) DOT4_PART(1) DOT4_PART(2) DOT4_PART(3)
    }
    real sp[ROW_LANES], sq[ROW_LANES], sr[ROW_LANES], st[ROW_LANES];
    DOT4_LANES(0) DOT4_LANES(1) DOT4_LANES(2) DOT4_LANES(3)
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
