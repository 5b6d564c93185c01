/* ---- matrix products: a layer over a batch --------------------------------------------------
 * One register-blocked micro-kernel (BLIS's design, llm.c's matmul_forward): a tile of rows of
 * C by vectors of columns held in registers while the sum runs over p, each load of B serving
 * the tile's rows and each A value (broadcast) its vectors; the tile and the vectors' width
 * chosen for the CPU when the module runs (gemm_variant), the sum's slices for its L2 cache
 * (gemm_depth). The three products of a layer over a batch are this one kernel with other
 * strides (codegen/write/loops.py's layer_over_batch, Matmul and WeightGradient call them):
 *   forward             Y = W X:    matmul_set (C = Y from the bias, A = W, B = X)
 *   inputs' gradients   dX += W^T dY: matmul_acc (A = W read down its columns, B = dY; or =)
 *   weights' gradients  dW += dY X^T: matmul_nt (A = dY, B = X^T, packed once per call)
 * C[i * c_i + n] = init + sum over p < P of A[i * a_i + p * a_p] * B[p * b_p + n], for i < M and
 * n < N, where init is C's own value (accumulate), the bias (bias[i * bias_i]) or 0. Every
 * element is summed the same way, in p order from its init, wherever its rows fall (a thread's
 * share of rows, templates/pool.c, is whole tiles; a tile or a single row), whatever the slices:
 * the same bits for any number of threads, any slice depth and any vector variant (the plain
 * loops round each product before adding it). With a list of p (the input rows of a batch that
 * hold a nonzero: sparse_inputs), the sums skip the others, whose terms are all 0. GCC and Clang
 * build the vector variants for AVX2 with FMA and for AVX-512 and take the widest the CPU has
 * when it runs (with -march=native, only the CPU's own width is built); TCC runs a plain loop. */
#if HAVE_THREAD_POOL /* a module's C, which has libc: sysconf for the L2's size */
#include <unistd.h>
#endif

/* A function of each value of a row of the product, applied as soon as the row is done (while it
 * is in the cache, and on the thread that made it), for n < count: a layer's activation,
 * y[n] = f(x[n]) (after matmul_set), or the activation's gradient, y[n] += f'(a[n], o[n]) * x[n]
 * (or y[n] = 0 + ..., where nothing else adds to y) with a and o its argument's and its own values
 * (after matmul_acc, which finished x, the activation's gradient). codegen/write/statements.py's
 * _epilogue writes the statement from the op table, templates/epilogue.c the function around it. */
typedef void (*Epilogue)(const real *restrict x, real *restrict y, const real *restrict a, const real *restrict o,
                         long count);

/* A module's products are defined once, in the module runtime's unit of products
 * (templates/products.c: RUNTIME_PRODUCTS 2, compiled once and kept, on one core while
 * templates/runtime.c compiles on another), and only declared in the runtime's other unit and in
 * a model's units (1), each of which would otherwise compile them again (1.75 s of gcc -O2 a unit);
 * exported and jit C (0) defines them static in its one file. The prototypes are checked against
 * the definitions in the products' unit. */
#if RUNTIME_PRODUCTS
/* the micro-kernel this CPU runs (gemm_variant) and the L2's size, for the runtime's gemm_kernel() */
SHARED void gemm_describe(const char **name, int *tile_rows, int *tile_columns, int *vector_bytes, long *l2_bytes);
/* the products', the convolutions' and exp_range's declarations, from the kernel table
 * (codegen/write/kernels.py's PRODUCTS: templates/kernels/kernels.h's prototypes) */
PRODUCT_DECLARATIONS
#define PRODUCT SHARED_KERNEL
#else
#define PRODUCT KERNEL
#endif
#if RUNTIME_PRODUCTS != 1

/* (filled by field name: a field left out is 0) */
typedef struct {
    real *C;
    const real *A, *B, *bias;
    long c_i, a_i, a_p, b_p, bias_i, N, P;
    int accumulate;
    const int32_t *p_list; /* 0: p runs over 0..P-1; else over p_list[0..P-1] (increasing) */
    Epilogue epilogue;     /* 0, or f: row i's f(C) into y + i * y_i (reading arg + i * arg_i, res + i * res_i) */
    real *y;
    const real *arg, *res;
    long y_i, arg_i, res_i;
    real *step;            /* 0, or parameters laid out as C: step[...] -= rate * sum instead of C = sum */
    real rate;
    int clear;             /* with step: C (which held part of the sums) back to 0 */
    int relu;              /* C's final sums stored as their ReLU (GEMM_RELU), in the registers that hold them */
    unsigned long product; /* gemm()'s call, for the threads' packed B (gemm_packed); 0: not packed */
    long rows;             /* and its rows (M) */
} GemmArgs;

/* rows [i, i + count) of C done: their epilogue */
#define GEMM_EPILOGUE(g, i, count)                                                                 \
    if ((g)->epilogue)                                                                             \
        for (long r_ = (i); r_ < (i) + (count); r_++)                                              \
            (g)->epilogue((g)->C + r_ * (g)->c_i, (g)->y + r_ * (g)->y_i,                          \
                          (g)->arg ? (g)->arg + r_ * (g)->arg_i : 0, (g)->res ? (g)->res + r_ * (g)->res_i : 0, (g)->N);

/* The op table's ReLU, where(x < 0, 0, x) (micrograd_c/ops.py), of a sum as it is stored: the
 * same bits as the epilogue's pass over the stored row (-0 and NaN kept), without that pass;
 * GEMM_RELU_VECTOR for each lane of a vector of GCC's and Clang's extension (a comparison's lanes
 * are all ones where true). matmul_set's `relu`. */
#define GEMM_RELU(x) ((x) < 0 ? 0 : (x))
#define GEMM_RELU_VECTOR(x) ((__typeof__(x))((__typeof__((x) < (x)))(x) & ~((x) < (__typeof__(x)){0})))

/* the initial value of row i's sums */
#define GEMM_INIT(g, i) ((g)->accumulate ? 0 : (g)->bias ? (g)->bias[(i) * (g)->bias_i] : (real)0)

/* rows [first, last) of a product, one element at a time in plain C (TCC) */
static void gemm_rows_plain(const GemmArgs *g, long first, long last)
{
    for (long i = first; i < last; i++) {
        real *c = g->C + i * g->c_i;
        if (!g->accumulate)
            for (long n = 0; n < g->N; n++)
                c[n] = GEMM_INIT(g, i);
        for (long t = 0; t < g->P; t++) {
            const long p = g->p_list ? g->p_list[t] : t;
            const real a = g->A[i * g->a_i + p * g->a_p], *b = g->B + p * g->b_p;
            for (long n = 0; n < g->N; n++)
                c[n] += a * b[n];
        }
        if (g->step) {
            real *w = g->step + i * g->c_i;
            for (long n = 0; n < g->N; n++) {
                w[n] -= g->rate * c[n];
                c[n] = 0;
            }
        }
        for (long n = 0; g->relu && n < g->N; n++)
            c[n] = GEMM_RELU(c[n]);
        GEMM_EPILOGUE(g, i, 1)
    }
}

typedef void (*GemmRows)(const GemmArgs *, long, long);

/* A micro-kernel: its rows, the register tile it holds (rows of C by vectors of columns) and
 * the CPU feature it needs. */
typedef struct {
    GemmRows rows;
    int tile_rows, vectors, vector_bytes;
    const char *name;
} GemmVariant;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__) /* GCC, Clang */
#define GEMM_VECTOR_KERNELS 1
/* A tile's rows of A packed (copied into a panel on the stack, term after term) before its
 * columns run, when A is read down its columns (matmul_acc reads W so: a tile's
 * 6 values of a term in one row of W, the next term a row further, so the slice's terms fall in
 * few cache sets and left the L1 between the tile's column blocks) and more than one block of
 * columns reads them; up to GEMM_PANEL terms (a slice of the sum, gemm_depth, is fewer), else
 * read in place. Zen 3, float32, thread CPU time: matmul_acc at 512x256x128 32.5 -> 37.8 G
 * multiply-adds/s. (Packing the listed terms of sparse inputs' gather measured slower.) */
/* B's columns in whole tiles copied into panels (BLIS's packing: a tile's columns of a term side
 * by side, the next term after them) where a product's rows read them often enough to pay for
 * the copy (GEMM_PACK_B_ROWS rows; any number when the terms are listed, a sparse input's gather)
 * and a slice of the sum fits in GEMM_PACK_B values: the tiles then read B as one stream instead
 * of a vector every b_p values (a batch's rows of 128 samples are 512 bytes apart). Each thread
 * packs a slice once for all the chunks of rows it takes of the product (gemm_packed). Zen 3,
 * float32, MLP(784, [512, 256, 10]) on MNIST, 2 threads, one process alternating: predict()
 * 0.80x the time unpacked, train() at B = 128 0.88x, B = 32 0.94x (packed once a chunk instead:
 * 0.89x, 0.91x, 0.99x); a product of 64 rows by 64 terms (a GPT's layer of 64) took 1.13x with
 * its 11 tiles packed, hence the rows' bound. A copy: the same bits. The panels (and matmul_nt's
 * transposed block) start on a 64-byte line, so that a vector loads one: Intel Xeon with AVX-512,
 * the same MLP at B = 32 took 0.93-0.94x the time so (15 rounds twice). */
#if HAVE_THREAD_POOL
#ifndef GEMM_PACK_B /* (tests/test_gemm.py's CHUNKED build: smaller) */
#define GEMM_PACK_B (131072 / (long)sizeof(real))
#define GEMM_PACK_B_ROWS 96
#endif
#define GEMM_PACK_SLICES 4
#define GEMM_PANEL 512
#else /* exported C's small stack (see GEMM_NT_COLUMNS): no thread's packed B */
#define GEMM_PACK_SLICES 0
#define GEMM_PANEL 128
#endif
#if GEMM_PACK_SLICES
/* A thread's packed slices of B (the last GEMM_PACK_SLICES it packed) for the product it works
 * on: gemm() numbers its calls, so a slice packed for one product is never read by another; within
 * one, a slice is known by where it starts (B, or its list of terms: gemm_sliced's). */
typedef struct {
    unsigned long product;
    const real *b[GEMM_PACK_SLICES];
    const int32_t *list[GEMM_PACK_SLICES];
    int next;
    real panels[GEMM_PACK_SLICES][GEMM_PACK_B] __attribute__((aligned(64)));
} GemmPacked;
static __thread GemmPacked gemm_packed;

/* This thread's panels for g's slice of B, and whether they still need filling. */
static real *gemm_packed_panels(const GemmArgs *g, int *fill)
{
    GemmPacked *k = &gemm_packed;
    if (k->product != g->product) {
        k->product = g->product, k->next = 0;
        memset(k->b, 0, sizeof k->b);
    }
    for (int e = 0; e < GEMM_PACK_SLICES; e++)
        if (k->b[e] == g->B && k->list[e] == g->p_list) {
            *fill = 0;
            return k->panels[e];
        }
    const int e = k->next;
    k->next = (e + 1) % GEMM_PACK_SLICES;
    k->b[e] = g->B, k->list[e] = g->p_list;
    *fill = 1;
    return k->panels[e];
}
#endif
/* rows [first, last) with vectors of vec_t: a register tile of ROWS rows (TILE_ROWS(op, VECS)
 * expands op for each) by VECS vectors of columns at a time, then a block of 4 rows if 4 are
 * left (a layer of 16: 6 + 6 + 4), then single rows of 4 vectors (a single row of 2 vectors is 2
 * chains of multiply-adds, which wait on each other's latency: the zoo's demo, layers of 16,
 * ran its products 8-40% faster, float64 on Zen 3); along a row, VECS vectors of columns at a
 * time, then the rest as vectors of which the last is part (GEMM_TAIL), or (when the kernel
 * steps the parameters, or N is whole vectors) one vector at a time and single columns. Every
 * element of C is
 * summed the same way in each of these loops (a multiply-add per p, in p order, from its init),
 * so a variant's tile changes no bit of the result. */
#define GEMM_KERNEL(name, attributes, vec_t, TILE_ROWS, ROWS, VECS, vectors)                        \
    static attributes void name(const GemmArgs *g, long first, long last)                          \
    {                                                                                              \
        typedef vec_t vec;                                                                         \
        enum { V = sizeof(vec) / sizeof(real) };                                                   \
        const real *restrict A = g->A, *restrict B = g->B;                                         \
        const long a_i = g->a_i, a_p = g->a_p, b_p = g->b_p, c_i = g->c_i, N = g->N, P = g->P;    \
        const int32_t *restrict p_list = g->p_list;                                                \
        const real rate = g->rate;                                                                 \
        const int pack = a_i == 1 && a_p != 1 && N > (vectors) * V && P <= GEMM_PANEL;             \
        const int tail = N % V && !g->step; /* (see GEMM_TAIL) */                                  \
        real panel[(ROWS) * GEMM_PANEL];                                                           \
        enum { PW = (vectors) * V }; /* a panel's columns (GEMM_PACK_B): the tile's */              \
        real *b_panels = 0;                                                                        \
        GEMM_PACK_B_PANELS                                                                         \
        const int pack_b = b_panels != 0;                                                          \
        long i = first;                                                                            \
        for (; i + (ROWS) <= last; i += (ROWS))                                                    \
            GEMM_BLOCK(TILE_ROWS, ROWS, VECS, vectors)                                             \
        if (i + 4 <= last) {                                                                       \
            GEMM_BLOCK(GEMM_ROWS4, 4, VECS, vectors)                                               \
            i += 4;                                                                                \
        }                                                                                          \
        for (; i < last; i++) /* single rows of 4 vectors: 4 chains hide the latency */        \
            GEMM_BLOCK(GEMM_ROWS1, 1, GEMM_VECS4, 4)                                               \
    }
/* the tile's rows, and a row's vectors */
#define GEMM_ROWS6(op, VECS) op(0, VECS) op(1, VECS) op(2, VECS) op(3, VECS) op(4, VECS) op(5, VECS)
#define GEMM_ROWS4(op, VECS) op(0, VECS) op(1, VECS) op(2, VECS) op(3, VECS)
#define GEMM_ROWS1(op, VECS) op(0, VECS)
#define GEMM_VECS4(op, r) op(r, 0) op(r, 1) op(r, 2) op(r, 3)
#define GEMM_VECS2(op, r) op(r, 0) op(r, 1)
#define GEMM_VECS1(op, r) op(r, 0)
/* rows [i, i + count) of C, ROWS(op, VECS) expanding op for each */
#define GEMM_BLOCK(ROWS, count, VECS, vectors)                                                     \
    {                                                                                              \
        real *restrict c = g->C + i * c_i;                                                         \
        real *restrict w = g->step ? g->step + i * c_i : 0;                                        \
        if (pack) { /* a tile's values of a term side by side in A, a term after another */       \
            GEMM_OVER_P(memcpy(panel + t * (count), A + i + p * a_p, (count) * sizeof(real));)     \
        }                                                                                          \
        /* A's value for row r and the sum's term q at a[r * a_r + q * a_q] */                      \
        const real *restrict a = pack ? panel : A + i * a_i;                                       \
        const long a_r = pack ? 1 : a_i, a_q = pack ? (count) : a_p;                               \
        long n = 0;                                                                                \
        if (pack_b)                                                                                \
            for (; n + (vectors) * V <= N; n += (vectors) * V)                                     \
                GEMM_COLUMNS_WITH(ROWS, VECS, GEMM_LOAD_B_PANEL)                                   \
        else                                                                                       \
            for (; n + (vectors) * V <= N; n += (vectors) * V)                                     \
                GEMM_COLUMNS(ROWS, VECS)                                                           \
        if (tail && n < N)                                                                         \
            GEMM_TAIL(ROWS, vectors)                                                               \
        else                                                                                       \
            for (; n + V <= N; n += V)                                                             \
                GEMM_COLUMNS(ROWS, GEMM_VECS1)                                                     \
        for (; !tail && n < N; n++) {                                                              \
            ROWS(GEMM_DECLARE_SCALAR, _)                                                           \
            ROWS(GEMM_INIT_SCALAR, _)                                                              \
            GEMM_OVER_P(const real b0 = B[p * b_p + n]; ROWS(GEMM_FMA_SCALAR, _))                  \
            ROWS(GEMM_STORE_SCALAR, _)                                                             \
        }                                                                                          \
        GEMM_EPILOGUE(g, i, count)                                                                 \
    }
/* the tile's columns [n, n + VECS vectors), B's vectors loaded by LOAD */
#define GEMM_COLUMNS(ROWS, VECS) GEMM_COLUMNS_WITH(ROWS, VECS, GEMM_LOAD_B)
#define GEMM_COLUMNS_WITH(ROWS, VECS, LOAD)                                                        \
    {                                                                                              \
        ROWS(GEMM_DECLARE, VECS)                                                                   \
        ROWS(GEMM_START, VECS)                                                                     \
        GEMM_OVER_P(VECS(LOAD, _) ROWS(GEMM_FMA, VECS))                                            \
        ROWS(GEMM_STORE, VECS)                                                                     \
    }
/* The columns after a block's whole tiles, N - n of them (fewer than a tile's), as ceil((N - n)
 * / V) vectors (1, 2 or 4), the last one loaded and stored in part (AVX's masked moves: lanes
 * past N are neither read nor written): microgpt's projections over a document's ~7 positions
 * ran 3 of their 7 columns as single ones, chains of multiply-adds waiting on their latency
 * (the step's largest cost in the kernel). */
#define GEMM_TAIL(ROWS, vectors)                                                                   \
    {                                                                                              \
        const long rest = N - n;                                                                   \
        if (rest <= V)                                                                             \
            GEMM_COLUMNS_PART(ROWS, GEMM_VECS1)                                                    \
        else if ((vectors) == 2 || rest <= 2 * V) /* (a tile's rest is under 2 vectors) */         \
            GEMM_COLUMNS_PART(ROWS, GEMM_VECS2)                                                    \
        else                                                                                       \
            GEMM_COLUMNS_PART(ROWS, GEMM_VECS4)                                                    \
    }
#define GEMM_COLUMNS_PART(ROWS, VECS)                                                              \
    {                                                                                              \
        ROWS(GEMM_DECLARE, VECS)                                                                   \
        ROWS(GEMM_START_PART, VECS)                                                                \
        GEMM_OVER_P(VECS(GEMM_LOAD_B_PART, _) ROWS(GEMM_FMA, VECS))                                \
        ROWS(GEMM_STORE_PART, VECS)                                                                \
    }
#define GEMM_START_PART(r, VECS)                                                                   \
    if (g->accumulate) {                                                                           \
        VECS(GEMM_LOAD_C_PART, r)                                                                  \
    } else {                                                                                       \
        VECS(GEMM_START_VECTOR, r)                                                                 \
    }
/* (GEMM_PART_LOAD(p, count): lanes [0, count) of a vector at p, count clamped to 0..V, 0 in the
 * others; GEMM_PART_STORE(p, count, x) stores them: the width's, defined around each kernel) */
#define GEMM_LOAD_C_PART(r, v) s##r##_##v = GEMM_PART_LOAD(c + r * c_i + n + v * V, rest - v * V);
#define GEMM_LOAD_B_PART(_, v) const vec b##v = GEMM_PART_LOAD(B + p * b_p + n + v * V, rest - v * V);
#define GEMM_STORE_PART(r, VECS) VECS(GEMM_STORE_PART_VECTOR, r)
#define GEMM_STORE_PART_VECTOR(r, v)                                                               \
    if (g->relu)                                                                                   \
        s##r##_##v = GEMM_RELU_VECTOR(s##r##_##v);                                                 \
    GEMM_PART_STORE(c + r * c_i + n + v * V, rest - v * V, s##r##_##v);
/* the sum's loop over p, written twice: the dense one counts, the listed one reads the list (t
 * counts its terms, q is A's: t in the panel, p in A) */
#define GEMM_OVER_P(...)                                                                           \
    if (p_list)                                                                                    \
        for (long t = 0; t < P; t++) {                                                             \
            const long p = p_list[t], q = pack ? t : p;                                            \
            (void)q;                                                                               \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    else                                                                                           \
        for (long p = 0; p < P; p++) {                                                             \
            const long t = p, q = p;                                                               \
            (void)t, (void)q;                                                                      \
            __VA_ARGS__                                                                            \
        }
/* the pieces, for row r of the tile: vector accumulators s<r>_<v>, B's vectors b<v>; a scalar t<r> */
#define GEMM_DECLARE(r, VECS) VECS(GEMM_DECLARE_VECTOR, r)
#define GEMM_DECLARE_VECTOR(r, v) vec s##r##_##v;
#define GEMM_START(r, VECS)                                                                        \
    if (g->accumulate) {                                                                           \
        VECS(GEMM_LOAD_C, r)                                                                       \
    } else {                                                                                       \
        VECS(GEMM_START_VECTOR, r)                                                                 \
    }
#define GEMM_LOAD_C(r, v) memcpy(&s##r##_##v, c + r * c_i + n + v * V, sizeof(vec));
#define GEMM_START_VECTOR(r, v) s##r##_##v = (vec){0} + GEMM_INIT(g, i + r);
#define GEMM_LOAD_B(_, v)                                                                          \
    vec b##v;                                                                                      \
    memcpy(&b##v, B + p * b_p + n + v * V, sizeof b##v);
/* b_panels: this thread's packed slice of B (gemm_packed), filled if it is new, where it pays */
#if GEMM_PACK_SLICES
#define GEMM_PACK_B_PANELS                                                                         \
    const long whole = N / PW * PW; /* (the columns in whole tiles) */                             \
    if (g->product && (p_list || g->rows >= GEMM_PACK_B_ROWS) && b_p > PW && whole > 0             \
        && P * whole <= GEMM_PACK_B) {                                                             \
        int fill;                                                                                  \
        b_panels = gemm_packed_panels(g, &fill);                                                   \
        if (fill) {                                                                                \
            GEMM_OVER_P(for (long n0 = 0; n0 < whole; n0 += PW)                                    \
                            memcpy(b_panels + n0 * P + t * PW, B + p * b_p + n0, PW * sizeof(real));) \
        }                                                                                          \
    }
#else
#define GEMM_PACK_B_PANELS
#endif
/* (the same vector from B's panels: column n + v * V's panel starts at its first column times P) */
#define GEMM_LOAD_B_PANEL(_, v)                                                                    \
    vec b##v;                                                                                      \
    memcpy(&b##v, b_panels + (n + (v) * V / PW * PW) * P + t * PW + (v) * V % PW, sizeof b##v);
#define GEMM_FMA(r, VECS)                                                                          \
    {                                                                                              \
        const real x = a[r * a_r + q * a_q];                                                       \
        VECS(GEMM_FMA_VECTOR, r)                                                                   \
    }
#define GEMM_FMA_VECTOR(r, v) s##r##_##v += x * b##v;
#define GEMM_STORE(r, VECS) VECS(GEMM_STORE_COLUMNS, r)
#define GEMM_STORE_COLUMNS(r, v) GEMM_STORE_VECTOR(r * c_i + n + v * V, s##r##_##v)
#define GEMM_DECLARE_SCALAR(r, _) real t##r;
#define GEMM_INIT_SCALAR(r, _) t##r = g->accumulate ? c[r * c_i + n] : GEMM_INIT(g, i + r);
#define GEMM_FMA_SCALAR(r, _) t##r += a[r * a_r + q * a_q] * b0;
/* a sum into C at `at`, or (step) into the parameters' step, C cleared if asked */
#define GEMM_STORE_VECTOR(at, sum)                                                                 \
    if (w) {                                                                                       \
        vec w0;                                                                                    \
        memcpy(&w0, w + (at), sizeof w0);                                                          \
        w0 -= rate * (sum);                                                                        \
        memcpy(w + (at), &w0, sizeof w0);                                                          \
        if (g->clear)                                                                              \
            memset(c + (at), 0, sizeof w0);                                                        \
    } else {                                                                                       \
        if (g->relu)                                                                               \
            (sum) = GEMM_RELU_VECTOR(sum);                                                         \
        memcpy(c + (at), &(sum), sizeof(sum));                                                     \
    }
#define GEMM_STORE_SCALAR(r, _)                                                                    \
    if (w) {                                                                                       \
        w[r * c_i + n] -= rate * t##r;                                                             \
        if (g->clear)                                                                              \
            c[r * c_i + n] = 0;                                                                    \
    } else {                                                                                       \
        c[r * c_i + n] = g->relu ? GEMM_RELU(t##r) : t##r;                                         \
    }

/* The tiles: as many accumulators as the registers hold with B's vectors and A's broadcast
 * beside them. AVX2's 16 registers: 6 rows by 2 vectors (12 accumulators, 2 of B, 1 of A; no
 * spill, gcc and clang -O2/-O3); 4 by 3 (12, 3, 1) took 1.8x as long on Zen 3 (its loads of B,
 * folded into the multiply-adds, are 16 loads per 12 of them, and 24 columns split cache lines).
 * AVX-512's 32: 6 by 2, as tuned on Zen 4. */
typedef real gemm_vec32 __attribute__((vector_size(32)));
typedef real gemm_vec64 __attribute__((vector_size(64)));
#if defined(__AVX512F__) /* built for this CPU (-march=native), which has AVX-512: that width alone */
#define GEMM_AVX512_KERNELS 1
#define GEMM_TARGET_AVX512
#elif defined(__AVX2__) && defined(__FMA__) /* likewise, AVX2 */
#define GEMM_AVX2_KERNELS 1
#define GEMM_TARGET_AVX2
#else /* chosen when it runs (a CPU without AVX2, before 2013-2017, gets the plain loops) */
#define GEMM_RUNTIME_CHOICE 1
#define GEMM_AVX512_KERNELS 1
#define GEMM_AVX2_KERNELS 1
#define GEMM_TARGET_AVX512 __attribute__((target("avx512f")))
#define GEMM_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif
/* GEMM_TAIL's loads and stores in part: AVX's masked moves (which neither read nor write a lane
 * left out, whatever memory lies there), each width's */
#include <immintrin.h>
static inline long gemm_part_count(long count, long lanes)
{
    return count < 0 ? 0 : count > lanes ? lanes : count;
}
#if REAL_IS_FLOAT
static const int32_t gemm_part_lanes[16] = {-1, -1, -1, -1, -1, -1, -1, -1};
#else
static const int64_t gemm_part_lanes[8] = {-1, -1, -1, -1};
#endif
enum { GEMM_PART_AVX2_LANES = 32 / sizeof(real), GEMM_PART_AVX512_LANES = 64 / sizeof(real) };
static __attribute__((target("avx2,fma"))) inline __m256i gemm_part_mask_avx2(long count)
{
    count = gemm_part_count(count, GEMM_PART_AVX2_LANES);
    return _mm256_loadu_si256((const __m256i *)(gemm_part_lanes + GEMM_PART_AVX2_LANES - count));
}
/* the same for a 16-byte vector */
static inline __m128i gemm_part_mask16(long count)
{
    count = gemm_part_count(count, 16 / sizeof(real));
    return _mm_loadu_si128((const __m128i *)(gemm_part_lanes + GEMM_PART_AVX2_LANES - count));
}
static __attribute__((target("avx2,fma"))) inline gemm_vec32 gemm_part_load_avx2(const real *p, long count)
{
#if REAL_IS_FLOAT
    return (gemm_vec32)_mm256_maskload_ps(p, gemm_part_mask_avx2(count));
#else
    return (gemm_vec32)_mm256_maskload_pd(p, gemm_part_mask_avx2(count));
#endif
}
/* The stores are plain ones of a whole vector, its halves and single lanes: AMD's masked stores
 * (vmaskmovps/pd) take many times a plain store's time (Zen 3: microgpt's projections over a
 * document's positions, whose rows end in part, spent a fifth of the kernel's time in them). */
static __attribute__((target("avx2"))) inline void gemm_part_store16(real *p, long count, __m128i x)
{
    long bytes = gemm_part_count(count, 16 / sizeof(real)) * (long)sizeof(real);
    if (bytes == 16) {
        _mm_storeu_si128((__m128i *)p, x);
        return;
    }
    char *to = (char *)p;
    if (bytes >= 8) {
        _mm_storel_epi64((__m128i *)to, x);
        x = _mm_srli_si128(x, 8), to += 8, bytes -= 8;
    }
    if (bytes) {
        const int32_t lane = _mm_cvtsi128_si32(x);
        memcpy(to, &lane, 4);
    }
}
static __attribute__((target("avx2,fma"))) inline void gemm_part_store_avx2(real *p, long count, gemm_vec32 x)
{
    enum { HALF = 16 / sizeof(real) };
    if (count >= GEMM_PART_AVX2_LANES) {
        memcpy(p, &x, sizeof x);
        return;
    }
    __m128i half = _mm256_castsi256_si128((__m256i)x);
    if (count >= HALF) {
        _mm_storeu_si128((__m128i *)p, half);
        half = _mm256_extracti128_si256((__m256i)x, 1), p += HALF, count -= HALF;
    }
    gemm_part_store16(p, count, half);
}
static __attribute__((target("avx512f"))) inline gemm_vec64 gemm_part_load_avx512(const real *p, long count)
{
    const unsigned mask = (1u << gemm_part_count(count, GEMM_PART_AVX512_LANES)) - 1;
#if REAL_IS_FLOAT
    return (gemm_vec64)_mm512_maskz_loadu_ps((__mmask16)mask, p);
#else
    return (gemm_vec64)_mm512_maskz_loadu_pd((__mmask8)mask, p);
#endif
}
static __attribute__((target("avx512f"))) inline void gemm_part_store_avx512(real *p, long count, gemm_vec64 x)
{
    const unsigned mask = (1u << gemm_part_count(count, GEMM_PART_AVX512_LANES)) - 1;
#if REAL_IS_FLOAT
    _mm512_mask_storeu_ps(p, (__mmask16)mask, (__m512)x);
#else
    _mm512_mask_storeu_pd(p, (__mmask8)mask, (__m512d)x);
#endif
}
#if GEMM_AVX2_KERNELS
#define GEMM_PART_LOAD gemm_part_load_avx2
#define GEMM_PART_STORE gemm_part_store_avx2
GEMM_KERNEL(gemm_rows_avx2_6x2, GEMM_TARGET_AVX2, gemm_vec32, GEMM_ROWS6, 6, GEMM_VECS2, 2)
#undef GEMM_PART_LOAD
#undef GEMM_PART_STORE
#endif
#if GEMM_AVX512_KERNELS
#define GEMM_PART_LOAD gemm_part_load_avx512
#define GEMM_PART_STORE gemm_part_store_avx512
GEMM_KERNEL(gemm_rows_avx512_6x2, GEMM_TARGET_AVX512, gemm_vec64, GEMM_ROWS6, 6, GEMM_VECS2, 2)
#undef GEMM_PART_LOAD
#undef GEMM_PART_STORE
#endif
#endif

/* Every variant built, the plain loops first (tests/test_gemm.py runs each the CPU has, forced:
 * gemm_forced_variant below). */
static const GemmVariant gemm_variants[] = {
    {gemm_rows_plain, 6, 1, 0, "plain"},
#if GEMM_AVX2_KERNELS
    {gemm_rows_avx2_6x2, 6, 2, 32, "avx2 6x2"},
#endif
#if GEMM_AVX512_KERNELS
    {gemm_rows_avx512_6x2, 6, 2, 64, "avx512 6x2"},
#endif
};

/* The variant this CPU runs, chosen on first use and kept: the widest vectors it has (a CPU
 * without AVX2, and TCC: the plain loops), the first tile of that width in the table. Every
 * variant sums each element the same way, so which one runs changes no bit, except that the
 * plain loops round a product before adding it where the vector variants fuse the two. */
/* A variant (an index into gemm_variants) and a depth (gemm_depth) set by tests/test_gemm.py's
 * harness, which runs them all in one build; -1 and 0: the machine's choice. */
static int gemm_forced_variant = -1;
static long gemm_forced_depth;

static const GemmVariant *gemm_variant(void)
{
    static const GemmVariant *chosen; /* every thread that chooses chooses the same */
    const int count = (int)(sizeof gemm_variants / sizeof gemm_variants[0]);
    if (gemm_forced_variant >= 0)
        return &gemm_variants[gemm_forced_variant < count ? gemm_forced_variant : 0];
    if (!chosen) {
        int pick = 0;
        for (int v = 1; v < count; v++) {
#if defined(GEMM_RUNTIME_CHOICE)
            const int needs = gemm_variants[v].vector_bytes == 64 ? CPU_AVX512F : CPU_AVX2_FMA;
            const int runs = (cpu_features() & needs) != 0;
#else
            const int runs = 1;
#endif
            if (runs && gemm_variants[v].vector_bytes > gemm_variants[pick].vector_bytes)
                pick = v;
        }
        chosen = &gemm_variants[pick];
    }
    return chosen;
}

/* The depth of a product's slices (its cache blocking): the sum over p runs in slices of this
 * many terms, each slice over every row of the call's share before the next, so that a slice of
 * B (depth rows of B, b_p apart) stays in the core's L2 cache while every tile of rows reads it,
 * instead of all of B (a batch of MNIST's 784 inputs: 400 KB in float32) passing through the
 * L2 for each tile. A quarter of the L2 for the slice (the rest for A's and C's rows); a row of
 * B counted as b_p values. On Zen 3 (512 KiB, float32 slices of 256 rows of 128 samples),
 * MLP(784, [512, 256, 10])'s first layer's products at B = 128 ran 15-40% faster than whole
 * (slices of half the L1 did not gain). The L2's size is the CPU's (sysconf) where the module
 * has libc, 512 KiB in exported C. A slice ends with C holding its partial sums, which the
 * next continues from: every element is summed in p order from its init whatever the depth,
 * so the depth changes no bit. tests/test_gemm.py forces one (gemm_forced_depth). */
#define GEMM_DEPTH_MIN 16
static long gemm_l2_bytes(void)
{
#if HAVE_THREAD_POOL && defined(_SC_LEVEL2_CACHE_SIZE)
    static long bytes; /* the CPU's, asked once (every thread that asks gets the same) */
    if (!bytes) {
        const long asked = sysconf(_SC_LEVEL2_CACHE_SIZE);
        bytes = asked >= 65536 ? asked : 524288;
    }
    return bytes;
#else
    return 524288;
#endif
}

static long gemm_depth(long b_p)
{
    if (gemm_forced_depth > 0)
        return gemm_forced_depth;
    const long depth = gemm_l2_bytes() / 4 / ((b_p > 0 ? b_p : 1) * (long)sizeof(real));
    return depth < GEMM_DEPTH_MIN ? GEMM_DEPTH_MIN : depth;
}

/* g's product over the sum's terms [t0, t1) only: the first slice starts from g's init, the others
 * from the partial sums in C; only the last steps the parameters (clearing C if an earlier slice,
 * or g, left partial sums there), stores the ReLU and runs the epilogue. */
static GemmArgs gemm_terms(const GemmArgs *g, long t0, long t1)
{
    GemmArgs slice = *g;
    slice.P = t1 - t0;
    if (g->p_list)
        slice.p_list = g->p_list + t0;
    else
        slice.A += t0 * g->a_p, slice.B += t0 * g->b_p;
    slice.accumulate = t0 == 0 ? g->accumulate : 1;
    slice.clear = g->clear || t0 != 0;
    if (t1 < g->P)
        slice.step = 0, slice.epilogue = 0, slice.relu = 0;
    return slice;
}

/* Rows [first, last) of g's product, in slices of the sum (gemm_depth). */
static void gemm_sliced(GemmRows kernel, const GemmArgs *g, long first, long last)
{
    const long depth = gemm_depth(g->b_p);
    if (g->P <= depth) {
        kernel(g, first, last);
        return;
    }
    for (long t0 = 0; t0 < g->P; t0 += depth) {
        const GemmArgs slice = gemm_terms(g, t0, t0 + depth < g->P ? t0 + depth : g->P);
        kernel(&slice, first, last);
    }
}

static void gemm_task(void *args, long first, long last)
{
    gemm_sliced(gemm_variant()->rows, (const GemmArgs *)args, first, last);
}

/* A product whose terms are J rows of the layer's weights (see gemm), and the product each thread
 * runs on its share of those rows after its part (then(then_args, first, last), or none) */
typedef struct {
    GemmArgs g;
    long J;
    RowTask then;
    void *then_args;
} GemmParts;

/* The first of the n increasing values list[0..n) that is at least j (n if none). */
static long gemm_first_at_least(const int32_t *list, long n, long j)
{
    long lo = 0, hi = n;
    while (lo < hi) {
        const long mid = (lo + hi) / 2;
        if (list[mid] < j)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first of the sum's terms (p_list's, else 0..P-1) at or after term row j. */
static long gemm_term_from(const GemmArgs *g, long j)
{
    if (!g->p_list)
        return j < g->P ? j : g->P;
    return gemm_first_at_least(g->p_list, g->P, j);
}

/* Of a sum in parts on two threads, the first part's share of the terms in thousandths: the
 * second part also reads the first's partial sums from the other core's cache and runs the
 * epilogue. MLP(784, [512, 256, 10]) float32 at B = 32 (the second layer's inputs' gradients,
 * then its weights' gradients and step), Intel Xeon with AVX-512, 2 vCPUs, cycles a batch counted
 * around the pass: even shares 213 K, the caller then waiting 44 K for the worker; 560 of 1,000:
 * 200-213 K, waiting 2-4 K (train() 0.976-0.981x the time on 2 threads, one process alternating
 * the builds); the `then` cut even instead (the worker stepping rows the caller read): 234 K.
 * AMD Zen 5 (2 vCPUs), with the pipeline's chunks halved (pool.c's POOL_PIPELINE_CHUNKS): 530
 * 0.965-0.972x the time of 560, 545 0.975x, 500 0.986x (train(), our processes' windows in turn) */
#define GEMM_PIPELINE_FIRST 530

/* Thread part's share [*j0, *j1) of a sum's J terms cut in blocks of align (parallel_share's, but
 * with two parts the first GEMM_PIPELINE_FIRST of them): which terms a part sums, and the rows
 * of the weights its `then` steps. Any cut gives the same sums (each continued part after part). */
static void gemm_pipeline_share(long J, long align, int part, int parts, long *j0, long *j1)
{
    parallel_share(J, align, part, parts, j0, j1);
    if (parts == 2) {
        const long blocks = (J + align - 1) / align;
        const long cut = (blocks * GEMM_PIPELINE_FIRST + 500) / 1000 * align;
        const long at = cut < J ? cut : J;
        if (part == 0)
            *j1 = at;
        else
            *j0 = at;
    }
}

/* Rows [first, last), the terms of thread part's share of the J rows (after the parts before it:
 * parallel_pipeline). */
static void gemm_part_task(void *args, long first, long last, int part, int parts)
{
    const GemmParts *a = (const GemmParts *)args;
    long j0, j1;
    gemm_pipeline_share(a->J, gemm_variant()->tile_rows, part, parts, &j0, &j1);
    const long t0 = gemm_term_from(&a->g, j0), t1 = gemm_term_from(&a->g, j1);
    if (t0 < t1) {
        const GemmArgs g = gemm_terms(&a->g, t0, t1);
        gemm_sliced(gemm_variant()->rows, &g, first, last);
    }
}

/* After part `part`: the product that follows, on that thread's share of the J rows. */
static void gemm_part_then(void *args, long first, long last, int part, int parts)
{
    (void)first, (void)last;
    const GemmParts *a = (const GemmParts *)args;
    long j0, j1;
    gemm_pipeline_share(a->J, gemm_variant()->tile_rows, part, parts, &j0, &j1);
    a->then(a->then_args, j0, j1);
}

/* The product on the module's threads when it is big enough to pay for sharing it: each thread
 * reads the inputs into its own cache and the next step reads the other's results from there.
 * Zen 3, 2 cores: microgpt's products over a batch's positions (0.2-0.5 M multiply-adds at 16 to
 * 64 documents) ran 1.09x slower on 2 threads than on 1 at 16 documents and no faster at 64
 * (with 32 K as the bound); MNIST's layers (12 M at 32 images) 1.8x faster. */
#ifndef GEMM_PARALLEL_MIN /* (tests/test_gemm.py's CHUNKED build: 0, every product shared) */
#define GEMM_PARALLEL_MIN 524288 /* multiply-adds */
#endif
/* With J (else 0): the sum's terms are rows p < J of weights whose rows the layer's other products
 * share among the threads (matmul_set over its neurons, matmul_nt): where the batch's columns are
 * at most J / GEMM_PIPELINE_COLUMNS, the sum runs in parts along those shares (parallel_pipeline),
 * and a chunk's partial sums (N values a row) move between the cores instead of the weights (J a
 * row), which a split by rows of C read in the other core's cache and that core then stepped.
 * Intel Xeon with AVX-512 (2 vCPUs, a cache line between them ~120 ns), MLP(784, [512, 256, 10])
 * float32 at B = 32: the second layer's inputs' and weights' gradients took 290 K cycles a batch
 * on 1 thread, 270 K on 2 split by rows (1.07x), 207 K in parts (1.40x); train() 0.92x the time
 * on 2 threads. At B = 64 and 128 (N >= J / 4) in parts took 1.02-1.03x the time of rows: the
 * part after the first also runs the epilogue, and waits for the first part's chunks. */
#define GEMM_PIPELINE_COLUMNS 8
/* With `then` (else 0): a product over the same J rows that each thread runs on its share of them
 * once its part is done, when the sum runs in parts (see matmul_acc_nt); whether it ran. */
static int gemm(const GemmArgs *args, long M, long J, RowTask then, void *then_args)
{
    if (M <= 0 || args->N <= 0)
        return 0;
    GemmArgs g = *args;
    g.rows = M;
#if GEMM_PACK_SLICES
    static unsigned long products; /* (gemm_packed's numbers: any thread may call) */
    g.product = __atomic_add_fetch(&products, 1, __ATOMIC_RELAXED);
#endif
    if ((double)M * (double)g.N * (double)g.P < GEMM_PARALLEL_MIN)
        gemm_task(&g, 0, M);
    else if (GEMM_PIPELINE_COLUMNS * g.N <= J) {
        const GemmParts parts = {g, J, then, then_args};
        parallel_pipeline(gemm_part_task, then ? gemm_part_then : 0, (void *)&parts, M, gemm_variant()->tile_rows,
                          J, gemm_variant()->tile_rows);
        return then != 0;
    } else
        parallel_rows(gemm_task, &g, M, gemm_variant()->tile_rows);
    return 0;
}

#if RUNTIME_PRODUCTS
SHARED void gemm_describe(const char **name, int *tile_rows, int *tile_columns, int *vector_bytes, long *l2_bytes)
{
    const GemmVariant *v = gemm_variant();
    *name = v->name, *tile_rows = v->tile_rows, *vector_bytes = v->vector_bytes, *l2_bytes = gemm_l2_bytes();
    *tile_columns = v->vector_bytes ? v->vectors * v->vector_bytes / (int)sizeof(real) : 1;
}
#endif
#endif

/* A list of input rows (sparse_inputs: the rows of a batch that hold a nonzero, found by
 * scan_rows): rows[0] of them, at rows[1..], increasing; 0: all K. */
#define LISTED_COUNT(rows, K) ((rows) ? (long)(rows)[0] : (K))
#define LISTED_INDEX(rows) ((rows) ? (rows) + 1 : 0)

/* The list of the rows k < n of x (row k at x + k * stride, nb values) that hold a nonzero. */
KERNEL void scan_rows(const real *restrict x, long stride, long nb, long n, int32_t *restrict list)
{
    int32_t count = 0;
    for (long k = 0; k < n; k++) {
        const real *row = x + k * stride;
        int nonzero = 0;
        for (long b = 0; b < nb; b++)
            nonzero |= row[b] != 0;
        if (nonzero)
            list[1 + count++] = (int32_t)k;
    }
    list[0] = count;
}

#if RUNTIME_PRODUCTS != 1
/* out[j * out_j + s] = bias[j * bias_j] + sum over k < K of w[j * w_j + k * w_k] * x[k * x_k + s],
 * for j < J and s < S (bias 0: no bias), over the listed k only (rows: see above): a layer's J
 * neurons over a batch of S (x: its K inputs' rows); with an epilogue f (else 0), also
 * y[j * y_j + s] = f(out[j * out_j + s]): the layer's activation; with relu, out is the sums'
 * ReLU instead (an activation in place, applied as they are stored). */
PRODUCT void matmul_set(real *restrict out, long out_j, const real *restrict bias, long bias_j,
                       const real *restrict w, long w_j, long w_k, const real *restrict x, long x_k,
                       long J, long S, long K, const int32_t *rows, Epilogue epilogue, real *y, long y_j, int relu)
{
    const GemmArgs g = {.C = out, .A = w, .B = x, .bias = bias, .c_i = out_j, .a_i = w_j, .a_p = w_k, .b_p = x_k,
                        .bias_i = bias_j, .N = S, .P = LISTED_COUNT(rows, K), .p_list = LISTED_INDEX(rows),
                        .epilogue = epilogue, .y = y, .y_i = y_j, .relu = relu};
    gemm(&g, J, 0, 0, 0);
}

/* out[k * out_k + s] += sum over j < J of w[j * w_j + k * w_k] * go[j * go_j + s], for k < K and
 * s < S: a layer's inputs' gradients over a batch of S (go: its J neurons' gradient rows, w: its
 * weights, K inputs each). Neurons whose gradient row is 0 over the whole batch (a ReLU that is
 * off, a hinge that is flat) are left out of the sums: what they would add is 0. With an
 * epilogue (else 0), the gradient of the activation whose results the inputs are, into
 * y[k * y_k + s], from a[k * a_k + s] and o[k * o_k + s] (see Epilogue). With overwrite, out is
 * the sum from 0 instead (the same bits as adding it to a cleared out: nothing else adds to it,
 * and the runtime need not clear it first). */
#define GEMM_ACC_LISTED 4096 /* neurons a list is kept for (on the stack); more run dense */
/* matmul_acc, then (gemm's `then`) on the threads' shares of the J rows when the sum ran in parts:
 * whether it ran */
static int matmul_acc_then(real *restrict out, long out_k, const real *restrict w, long w_j, long w_k,
                           const real *restrict go, long go_j, long J, long S, long K, Epilogue epilogue, real *y,
                           long y_k, const real *a, long a_k, const real *o, long o_k, int overwrite, RowTask then,
                           void *then_args)
{
    int32_t active[GEMM_ACC_LISTED];
    long count = J;
    if (J <= GEMM_ACC_LISTED) {
        count = 0;
        for (long j = 0; j < J; j++) {
            const real *row = go + j * go_j;
            long s = 0;
            int nonzero = 0; /* (a row that is on stops at its first chunk with a nonzero) */
            for (; s + ROW_LANES <= S && !nonzero; s += ROW_LANES)
                nonzero = lanes_nonzero(row + s);
            if (nonzero || any_nonzero(row + s, (int)(S - s)))
                active[count++] = (int32_t)j;
        }
    }
    const GemmArgs g = {.C = out, .A = w, .B = go, .c_i = out_k, .a_i = w_k, .a_p = w_j, .b_p = go_j, .N = S,
                        .P = count, .accumulate = !overwrite, .p_list = count < J ? active : 0, .epilogue = epilogue,
                        .y = y, .arg = a, .res = o, .y_i = y_k, .arg_i = a_k, .res_i = o_k};
    if (count > 0)
        return gemm(&g, K, J, then, then_args);
    /* the inputs' gradients are what they were (0, overwritten): the epilogue still runs */
    for (long k = 0; overwrite && k < K; k++)
        memset(out + k * out_k, 0, (size_t)S * sizeof(real));
    for (long k = 0; epilogue && k < K; k++)
        epilogue(out + k * out_k, y + k * y_k, a ? a + k * a_k : 0, o ? o + k * o_k : 0, S);
    return 0;
}

PRODUCT void matmul_acc(real *restrict out, long out_k, const real *restrict w, long w_j, long w_k,
                       const real *restrict go, long go_j, long J, long S, long K, Epilogue epilogue, real *y,
                       long y_k, const real *a, long a_k, const real *o, long o_k, int overwrite)
{
    matmul_acc_then(out, out_k, w, w_j, w_k, go, go_j, J, S, K, epilogue, y, y_k, a, a_k, o, o_k, overwrite, 0, 0);
}

/* out[j * out_j + k] += sum over s < S of go[j * go_j + s] * x[k * x_k + s], for j < J and k < K:
 * a layer's weights' gradients over a batch of S. The product runs along the weights' rows, on
 * blocks of GEMM_NT_COLUMNS columns: each block's inputs copied transposed (S rows of the block's
 * columns) into a buffer on the stack, GEMM_NT_SAMPLES samples at a time (a sum continued from
 * the value it stored, so the same bits as in one go). With a list of the input rows that hold a
 * nonzero (rows: see above), a block that holds none is skipped: what it would add is 0 (gathering
 * the listed columns of the others cost more than it saved, measured on MNIST's first layer).
 * Each weight's sum runs whole in one thread, the same way for any thread count. With w (else
 * 0; out's gradients must then be 0), the batch's SGD step on the weights w (laid out as out)
 * instead: w[j * out_j + k] -= rate * that sum, as the step after the batch would, bit for bit;
 * out is left 0. The weights' gradients never go through memory, and the step's pass over
 * them, reading and writing weights and gradients once more, is saved. With bias (else 0), also
 * bias[j * bias_j] += sum_range(go + j * go_j, S): the layer's biases' gradients, summed by the
 * thread that reads those gradient rows for the product (on the caller's thread, after the
 * layer's inputs' gradients had been summed in parts on the other core, they took 5% of MNIST's
 * B = 32 step on 2 threads); with w, bias are the biases instead, stepped as the weights are:
 * bias[j * bias_j] -= rate * (0 + that sum), the step's bits from a gradient of 0 plus the sum. */
#if HAVE_THREAD_POOL
#define GEMM_NT_COLUMNS 64
#define GEMM_NT_SAMPLES 128
#else /* exported C may run on a small stack (WebAssembly's is 64 KiB): 2 KiB of buffer */
#define GEMM_NT_COLUMNS 16
#define GEMM_NT_SAMPLES 32
#endif
typedef struct {
    real *out;
    const real *go, *x;
    long out_j, go_j, x_k, J, K, S;
    const int32_t *rows; /* the list of nonzero rows (rows[0] of them), or 0 */
    real *w;             /* 0, or the weights, stepped instead (see matmul_nt) */
    real rate;
    real *bias;          /* 0, or the biases' gradients (with w: the biases, stepped; see matmul_nt) */
    long bias_j;
} WeightGradientArgs;

/* Whether the list holds a row in [first, last) (binary search: the list is increasing). */
static int listed_between(const int32_t *rows, long first, long last)
{
    const long at = gemm_first_at_least(rows + 1, rows[0], first);
    return at < rows[0] && rows[1 + at] < last;
}

/* xt[s * xt_s + k] = x[k * x_k + s] for k < n and s < p: a block of inputs transposed, in plain C. */
static void gemm_transpose_plain(const real *restrict x, long x_k, long n, long p, real *restrict xt, long xt_s)
{
    for (long k = 0; k < n; k++)
        for (long s = 0; s < p; s++)
            xt[s * xt_s + k] = x[k * x_k + s];
}

#if GEMM_VECTOR_KERNELS
/* The same by squares of one vector's lanes (AVX's shuffles: 8 by 8 floats, 4 by 4 doubles), the
 * edges in plain C: the copy one element at a time, its stores a row of xt apart, took 3-4
 * cycles an element (Zen 3), as long as the product itself at the GPT's small layers (a
 * projection of 64 inputs over 256 samples packs 16 K elements for 0.5-3 M multiply-adds). The
 * same bits: a copy. */
static __attribute__((target("avx"))) void gemm_transpose_avx(const real *restrict x, long x_k, long n, long p,
                                                               real *restrict xt)
{
#if REAL_IS_FLOAT
    enum { L = 8 };
#else
    enum { L = 4 };
#endif
    const long whole_k = n - n % L, whole_s = p - p % L;
    for (long k = 0; k < whole_k; k += L) {
        const real *row = x + k * x_k;
        for (long s = 0; s < whole_s; s += L) {
            real *to = xt + s * n + k;
#if REAL_IS_FLOAT
            const __m256 r0 = _mm256_loadu_ps(row + s), r1 = _mm256_loadu_ps(row + x_k + s),
                         r2 = _mm256_loadu_ps(row + 2 * x_k + s), r3 = _mm256_loadu_ps(row + 3 * x_k + s),
                         r4 = _mm256_loadu_ps(row + 4 * x_k + s), r5 = _mm256_loadu_ps(row + 5 * x_k + s),
                         r6 = _mm256_loadu_ps(row + 6 * x_k + s), r7 = _mm256_loadu_ps(row + 7 * x_k + s);
            /* pairs of rows interleaved, then fours (lanes 0-3 of each half), then the halves */
            const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                         t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                         t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee),
                         u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee),
                         u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee),
                         u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
            _mm256_storeu_ps(to, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(to + n, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(to + 2 * n, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(to + 3 * n, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(to + 4 * n, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(to + 5 * n, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(to + 6 * n, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(to + 7 * n, _mm256_permute2f128_ps(u3, u7, 0x31));
#else
            const __m256d r0 = _mm256_loadu_pd(row + s), r1 = _mm256_loadu_pd(row + x_k + s),
                          r2 = _mm256_loadu_pd(row + 2 * x_k + s), r3 = _mm256_loadu_pd(row + 3 * x_k + s);
            const __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1),
                          t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
            _mm256_storeu_pd(to, _mm256_permute2f128_pd(t0, t2, 0x20));
            _mm256_storeu_pd(to + n, _mm256_permute2f128_pd(t1, t3, 0x20));
            _mm256_storeu_pd(to + 2 * n, _mm256_permute2f128_pd(t0, t2, 0x31));
            _mm256_storeu_pd(to + 3 * n, _mm256_permute2f128_pd(t1, t3, 0x31));
#endif
        }
        /* the samples after the squares */
        gemm_transpose_plain(row + whole_s, x_k, L, p - whole_s, xt + whole_s * n + k, n);
    }
    gemm_transpose_plain(x + whole_k * x_k, x_k, n - whole_k, p, xt + whole_k, n); /* the columns after them */
}
#endif

/* xt[s * n + k] = x[k * x_k + s] for k < n and s < p (a block of inputs transposed), with AVX where
 * the CPU has it; the plain loops where a test forces them (gemm_forced_variant 0). */
static void gemm_transpose(const real *restrict x, long x_k, long n, long p, real *restrict xt)
{
#if GEMM_VECTOR_KERNELS
    if (gemm_forced_variant != 0 && (cpu_features() & CPU_AVX)) {
        gemm_transpose_avx(x, x_k, n, p, xt);
        return;
    }
#endif
    gemm_transpose_plain(x, x_k, n, p, xt, n);
}

/* Blocks [first_block, last_block) of columns, rows [first, last) of the weights. */
static void matmul_nt_part(const WeightGradientArgs *a, long first_block, long last_block, long first, long last)
{
    const GemmRows kernel = gemm_variant()->rows;
    real xt[GEMM_NT_SAMPLES * GEMM_NT_COLUMNS] __attribute__((aligned(64))); /* (see GemmPacked) */
    for (long block = first_block; block < last_block; block++) {
        const long k0 = block * GEMM_NT_COLUMNS, n = a->K - k0 < GEMM_NT_COLUMNS ? a->K - k0 : GEMM_NT_COLUMNS;
        if (a->rows && !listed_between(a->rows, k0, k0 + n))
            continue;
        for (long s0 = 0; s0 < a->S; s0 += GEMM_NT_SAMPLES) {
            const long p = a->S - s0 < GEMM_NT_SAMPLES ? a->S - s0 : GEMM_NT_SAMPLES;
            gemm_transpose(a->x + k0 * a->x_k + s0, a->x_k, n, p, xt);
            /* stepping: the sums start from 0 (the gradients are 0) and step the weights at the end */
            const int first_part = s0 == 0, last_part = s0 + p >= a->S;
            const GemmArgs g = {.C = a->out + k0, .A = a->go + s0, .B = xt, .c_i = a->out_j, .a_i = a->go_j,
                                .a_p = 1, .b_p = n, .N = n, .P = p, .accumulate = !(a->w && first_part),
                                .step = a->w && last_part ? a->w + k0 : 0, .rate = a->rate, .clear = !first_part};
            kernel(&g, first, last); /* not sliced: the packed block is its cache blocking (slicing it measured slower) */
        }
    }
}

static long matmul_nt_blocks(const WeightGradientArgs *a)
{
    return (a->K + GEMM_NT_COLUMNS - 1) / GEMM_NT_COLUMNS;
}

/* The threads' shares: rows of the weights, a share a thread (parallel_shares), cut where gemm()
 * cuts a product of J rows among them, so that a thread steps the rows of the weights it read in
 * the layer's forward product and reads the gradient rows it wrote in the backward one: those
 * stay in its core's cache. Each thread transposes every block of the inputs (K x S copies beside
 * its J x K x S / threads multiply-adds). Intel Xeon with AVX-512, 2 vCPUs (a cache line between
 * them: 127-231 ns a round trip, `make roofline`), MLP(784, [512, 256, 10]) float32 on 2 threads:
 * train() at B = 32 took 0.87x the time of shares of column blocks (whose gradient rows and
 * weights came from the other core half the time), B = 128 0.94x; float64 B = 32 1.00x. */
static void matmul_nt_rows(void *args, long first, long last)
{
    const WeightGradientArgs *a = (const WeightGradientArgs *)args;
    for (long j = first; a->bias && j < last; j++)
        if (a->w)
            a->bias[j * a->bias_j] -= a->rate * ((real)0 + sum_range(a->go + j * a->go_j, a->S));
        else
            a->bias[j * a->bias_j] += sum_range(a->go + j * a->go_j, a->S);
    matmul_nt_part(a, 0, matmul_nt_blocks(a), first, last);
}

PRODUCT void matmul_nt(real *restrict out, long out_j, const real *restrict go, long go_j,
                      const real *restrict x, long x_k, long J, long K, long S, const int32_t *rows, real *w,
                      real rate, real *restrict bias, long bias_j)
{
    WeightGradientArgs args = {.out = out, .go = go, .x = x, .out_j = out_j, .go_j = go_j, .x_k = x_k, .J = J,
                               .K = K, .S = S, .rows = rows, .w = w, .rate = rate, .bias = bias, .bias_j = bias_j};
    if (J <= 0 || S <= 0)
        return;
    if ((double)J * (double)K * (double)S < GEMM_PARALLEL_MIN)
        matmul_nt_rows(&args, 0, J);
    else
        parallel_shares(matmul_nt_rows, &args, J, gemm_variant()->tile_rows);
}

/* A layer's inputs' gradients, then its weights' gradients (matmul_acc's arguments, then
 * matmul_nt's that differ: its out as grad, grad_j, its w as step): the same as the two calls one
 * after the other, but where the first sums in parts along the threads' shares of the neurons
 * (gemm's GEMM_PIPELINE_COLUMNS), each thread starts its share of the second as soon as its part
 * is done (it steps the weights' rows only it read), instead of waiting for the last part (which
 * also runs the epilogue). MNIST's MLP(784, [512, 256, 10]) float32 at B = 32 on 2 threads, Intel
 * Xeon with AVX-512: train() 0.983-0.984x the time (the caller had waited ~39 K cycles a step for
 * the other's part); one thread and B = 128 (no parts) 0.99-1.00x. codegen/write/loops.py's
 * _layer_backward writes it where a layer's two products follow each other. */
PRODUCT void matmul_acc_nt(real *restrict out, long out_k, const real *restrict w, long w_j, long w_k,
                          const real *restrict go, long go_j, long J, long S, long K, Epilogue epilogue, real *y,
                          long y_k, const real *a, long a_k, const real *o, long o_k, int overwrite,
                          real *restrict grad, long grad_j, const real *restrict x, long x_k, const int32_t *rows,
                          real *step, real rate, real *restrict bias, long bias_j)
{
    WeightGradientArgs nt = {.out = grad, .go = go, .x = x, .out_j = grad_j, .go_j = go_j, .x_k = x_k, .J = J,
                             .K = K, .S = S, .rows = rows, .w = step, .rate = rate, .bias = bias, .bias_j = bias_j};
    if (!matmul_acc_then(out, out_k, w, w_j, w_k, go, go_j, J, S, K, epilogue, y, y_k, a, a_k, o, o_k, overwrite,
                         matmul_nt_rows, &nt))
        matmul_nt(grad, grad_j, go, go_j, x, x_k, J, K, S, rows, step, rate, bias, bias_j);
}
#endif
