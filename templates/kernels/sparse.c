/* ---- sparse inputs ------------------------------------------------------------------------ */
/* An input range that dots read (a layer's pixels) has lists of its chunks of eight values that
 * hold a nonzero, built by scan_nonzeros() before each forward and backward. dot() sums in
 * sixteen lanes, chunk c in lanes 8 (c % 2) .. 8 (c % 2) + 7; chunks are listed by that lane
 * group: nz[0] and nz[1] count the even and the odd chunks, listed from nz + 2 and from
 * nz + 2 + NZ_GROUP_SIZE(n); 2 + NZ_CHUNKS(n) words in all (codegen/write/sides.py's nonzero_words).
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
/* (a chunk's lanes as vectors of the CPU's width at most, each its own variable: rows.c's
 * row_part, for the same reason) */
#define CHUNK_PART_BYTES (NZ_LANES * (int)sizeof(real) < ROW_PART_BYTES ? NZ_LANES * (int)sizeof(real) : ROW_PART_BYTES)
typedef real chunk_part __attribute__((vector_size(CHUNK_PART_BYTES), aligned(sizeof(real)), may_alias));
enum { CHUNK_PART_LANES = CHUNK_PART_BYTES / (int)sizeof(real), CHUNK_PARTS = NZ_LANES / CHUNK_PART_LANES };
#define CHUNK_PART(p, h) (*(const chunk_part *)((p) + (h) * CHUNK_PART_LANES))
#define ROWS4_DECLARE_PART(group, h) chunk_part group##0_##h = {0}, group##1_##h = {0}, group##2_##h = {0}, group##3_##h = {0};
#define ROWS4_DECLARE(group)                                                                    \
    ROWS4_DECLARE_PART(group, 0) ROWS4_DECLARE_PART(group, 1) ROWS4_DECLARE_PART(group, 2) ROWS4_DECLARE_PART(group, 3)
#define ROWS4_CHUNK_PART(o, group, h)                                                           \
    if ((h) < CHUNK_PARTS) {                                                                    \
        const chunk_part v_ = CHUNK_PART(x + (o), h);                                           \
        group##0_##h += CHUNK_PART(w0 + (o), h) * v_;                                           \
        group##1_##h += CHUNK_PART(w1 + (o), h) * v_;                                           \
        group##2_##h += CHUNK_PART(w2 + (o), h) * v_;                                           \
        group##3_##h += CHUNK_PART(w3 + (o), h) * v_;                                           \
    }
#define ROWS4_CHUNK(c, group)                                                                   \
    {                                                                                           \
        long o_ = NZ_LANES * (long)(c);                                                         \
        ROWS4_CHUNK_PART(o_, group, 0) ROWS4_CHUNK_PART(o_, group, 1)                           \
        ROWS4_CHUNK_PART(o_, group, 2) ROWS4_CHUNK_PART(o_, group, 3)                           \
    }
#define ROWS4_LANES_PART(group, r, s, h)                                                        \
    if ((h) < CHUNK_PARTS)                                                                      \
        memcpy((s) + (h) * CHUNK_PART_LANES, &group##r##_##h, sizeof group##r##_##h);
#define ROWS4_LANES(group, r, s)                                                                \
    ROWS4_LANES_PART(group, r, s, 0) ROWS4_LANES_PART(group, r, s, 1)                           \
    ROWS4_LANES_PART(group, r, s, 2) ROWS4_LANES_PART(group, r, s, 3)
#else
typedef real chunk_part; /* (a part a lane) */
enum { CHUNK_PART_LANES = 1, CHUNK_PARTS = NZ_LANES };
#define CHUNK_PART(p, h) ((p)[h])
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
/* stmt for each part of chunk c: y_part points at y's lanes of it, x_part holds x's (vectors of
 * the CPU's width at most, as the dots take them: GCC 12 stepped a chunk's lanes one at a time,
 * scalar, where clang took vectors; MNIST's batch-1 step, gcc -O2 -march=native, Intel Xeon with
 * AVX-512: 0.86x the time in float64, 0.79x in float32, the same bits) */
#define EACH_CHUNK_PART(c, y, x, y_part, x_part, stmt)                                          \
    for (int h_ = 0; h_ < CHUNK_PARTS; h_++) {                                                  \
        chunk_part *y_part = (chunk_part *)((y) + NZ_LANES * (c) + h_ * CHUNK_PART_LANES);      \
        const chunk_part x_part = CHUNK_PART((x) + NZ_LANES * (c), h_);                         \
        stmt                                                                                    \
    }

/* y[i] += alpha * x[i] over the listed chunks */
KERNEL void axpy_nz(real *restrict y, real alpha, const real *restrict x, long n, const int32_t *restrict nz)
{
    if (!NZ_SHORT(nz, n)) {
        axpy(y, alpha, x, n);
        return;
    }
    if (alpha == 0)
        return;
    EACH_NONZERO(nz, n, c, EACH_CHUNK_PART(c, y, x, y_c, x_c, *y_c += alpha * x_c;), i, y[i] += alpha * x[i];)
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
    EACH_NONZERO(nz, n, c, EACH_CHUNK_PART(c, w, x, w_c, x_c, *w_c -= lr * (alpha * x_c);), i,
                 w[i] -= lr * (alpha * x[i]);)
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
