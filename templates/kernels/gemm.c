/* ---- matrix products: a layer over a batch --------------------------------------------------
 * One register-blocked micro-kernel (BLIS's design, llm.c's matmul_forward): GEMM_MR rows of
 * C by two vectors of columns held in registers while the sum runs over p, each load of B
 * serving GEMM_MR rows and each A value (broadcast) two vectors. The three products of a layer
 * over a batch are this one kernel with other strides (codegen/emit.py emits them):
 *   forward             Y = W X:    matmul_set (C = Y from the bias, A = W, B = X)
 *   inputs' gradients   dX += W^T dY: matmul_acc (A = W read down its columns, B = dY)
 *   weights' gradients  dW += dY X^T: matmul_nt (A = dY, B = X^T, packed once per call)
 * C[i * c_i + n] = init + sum over p < P of A[i * a_i + p * a_p] * B[p * b_p + n], for i < M and
 * n < N, where init is C's own value (accumulate), the bias (bias[i * bias_i]) or 0. Every
 * element is summed the same way, in p order from its init, wherever its rows fall: the rows
 * are split between threads (templates/pool.c) in whole blocks of GEMM_MR, so the result is
 * the same bits for any number of threads. With a list of p (the input rows of a batch that
 * hold a nonzero: sparse_inputs), the sums skip the others, whose terms are all 0. GCC and
 * Clang build the kernel for AVX2 with FMA and for AVX-512 and take the widest the CPU has when
 * it runs (with -march=native, only the CPU's own width is built); TCC runs a plain loop. */
#define GEMM_MR 6

/* A function of each value of a row of the product, applied as soon as the row is done (while it
 * is in the cache, and on the thread that made it), for n < count: a layer's activation,
 * y[n] = f(x[n]) (after matmul_set), or the activation's gradient, y[n] += f'(a[n], o[n]) * x[n]
 * with a and o its argument's and its own values (after matmul_acc, which finished x, the
 * activation's gradient). codegen/statements.py writes them from the op table. */
typedef void (*Epilogue)(const real *restrict x, real *restrict y, const real *restrict a, const real *restrict o,
                         long count);

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
} GemmArgs;

/* rows [i, i + count) of C done: their epilogue */
#define GEMM_EPILOGUE(g, i, count)                                                                 \
    if ((g)->epilogue)                                                                             \
        for (long r_ = (i); r_ < (i) + (count); r_++)                                              \
            (g)->epilogue((g)->C + r_ * (g)->c_i, (g)->y + r_ * (g)->y_i,                          \
                          (g)->arg ? (g)->arg + r_ * (g)->arg_i : 0, (g)->res ? (g)->res + r_ * (g)->res_i : 0, (g)->N);

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
        GEMM_EPILOGUE(g, i, 1)
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__) /* GCC, Clang */
#define GEMM_VECTOR_KERNELS 1
#define GEMM_ROW6(op) op(0) op(1) op(2) op(3) op(4) op(5)
#define GEMM_ROW1(op) op(0)
/* rows [first, last) with vectors of vec_t: GEMM_MR rows at a time, then one at a time (blocks of
 * 4 and 2 for the rest made the zoo's demo, layers of 16, 5% faster, but each block is another
 * copy of the loops: gcc -O3 took 0.35 s more per unit that uses the kernels), each by two
 * vectors of columns, then one vector, then single columns */
#define GEMM_KERNEL(name, attributes, vec_t)                                                        \
    static attributes void name(const GemmArgs *g, long first, long last)                          \
    {                                                                                              \
        typedef vec_t vec;                                                                         \
        enum { V = sizeof(vec) / sizeof(real) };                                                   \
        const real *restrict A = g->A, *restrict B = g->B;                                         \
        const long a_i = g->a_i, a_p = g->a_p, b_p = g->b_p, c_i = g->c_i, N = g->N, P = g->P;    \
        const int32_t *restrict p_list = g->p_list;                                                \
        const real rate = g->rate;                                                                 \
        long i = first;                                                                            \
        for (; i + GEMM_MR <= last; i += GEMM_MR)                                                  \
            GEMM_BLOCK(GEMM_ROW6, GEMM_MR)                                                         \
        for (; i < last; i++)                                                                      \
            GEMM_BLOCK(GEMM_ROW1, 1)                                                               \
    }
/* rows [i, i + count) of C, ROWS(op) expanding op for each */
#define GEMM_BLOCK(ROWS, count)                                                                    \
    {                                                                                              \
        real *restrict c = g->C + i * c_i;                                                         \
        real *restrict w = g->step ? g->step + i * c_i : 0;                                        \
        const real *restrict a = A + i * a_i;                                                      \
        long n = 0;                                                                                \
        for (; n + 2 * V <= N; n += 2 * V) {                                                       \
            ROWS(GEMM_DECLARE2)                                                                    \
            ROWS(GEMM_INIT2)                                                                       \
            GEMM_OVER_P(vec b0; vec b1; memcpy(&b0, B + p * b_p + n, sizeof b0);                  \
                        memcpy(&b1, B + p * b_p + n + V, sizeof b1); ROWS(GEMM_FMA2))              \
            ROWS(GEMM_STORE2)                                                                      \
        }                                                                                          \
        for (; n + V <= N; n += V) {                                                               \
            ROWS(GEMM_DECLARE1)                                                                    \
            ROWS(GEMM_INIT1)                                                                       \
            GEMM_OVER_P(vec b0; memcpy(&b0, B + p * b_p + n, sizeof b0); ROWS(GEMM_FMA1))          \
            ROWS(GEMM_STORE1)                                                                      \
        }                                                                                          \
        for (; n < N; n++) {                                                                       \
            ROWS(GEMM_DECLARE_SCALAR)                                                              \
            ROWS(GEMM_INIT_SCALAR)                                                                 \
            GEMM_OVER_P(const real b0 = B[p * b_p + n]; ROWS(GEMM_FMA_SCALAR))                     \
            ROWS(GEMM_STORE_SCALAR)                                                                \
        }                                                                                          \
        GEMM_EPILOGUE(g, i, count)                                                                 \
    }
/* the sum's loop over p, written twice: the dense one counts, the listed one reads the list */
#define GEMM_OVER_P(...)                                                                           \
    if (p_list)                                                                                    \
        for (long t = 0; t < P; t++) {                                                             \
            const long p = p_list[t];                                                              \
            __VA_ARGS__                                                                            \
        }                                                                                          \
    else                                                                                           \
        for (long p = 0; p < P; p++) {                                                             \
            __VA_ARGS__                                                                            \
        }
/* the pieces, for row r of the block: two vector accumulators s<r>, u<r>; one, s<r>; a scalar t<r> */
#define GEMM_DECLARE2(r) vec s##r, u##r;
#define GEMM_DECLARE1(r) vec s##r;
#define GEMM_DECLARE_SCALAR(r) real t##r;
#define GEMM_INIT2(r)                                                                              \
    if (g->accumulate) {                                                                           \
        memcpy(&s##r, c + r * c_i + n, sizeof s##r);                                               \
        memcpy(&u##r, c + r * c_i + n + V, sizeof u##r);                                           \
    } else {                                                                                       \
        s##r = u##r = (vec){0} + GEMM_INIT(g, i + r);                                            \
    }
#define GEMM_INIT1(r)                                                                              \
    if (g->accumulate)                                                                             \
        memcpy(&s##r, c + r * c_i + n, sizeof s##r);                                               \
    else                                                                                           \
        s##r = (vec){0} + GEMM_INIT(g, i + r);
#define GEMM_INIT_SCALAR(r) t##r = g->accumulate ? c[r * c_i + n] : GEMM_INIT(g, i + r);
#define GEMM_FMA2(r)                                                                               \
    {                                                                                              \
        const real x = a[r * a_i + p * a_p];                                                       \
        s##r += x * b0;                                                                            \
        u##r += x * b1;                                                                            \
    }
#define GEMM_FMA1(r) s##r += a[r * a_i + p * a_p] * b0;
#define GEMM_FMA_SCALAR(r) t##r += a[r * a_i + p * a_p] * b0;
#define GEMM_STORE2(r) GEMM_STORE_VECTOR(r * c_i + n, s##r) GEMM_STORE_VECTOR(r * c_i + n + V, u##r)
#define GEMM_STORE1(r) GEMM_STORE_VECTOR(r * c_i + n, s##r)
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
        memcpy(c + (at), &(sum), sizeof(sum));                                                     \
    }
#define GEMM_STORE_SCALAR(r)                                                                       \
    if (w) {                                                                                       \
        w[r * c_i + n] -= rate * t##r;                                                             \
        if (g->clear)                                                                              \
            c[r * c_i + n] = 0;                                                                    \
    } else {                                                                                       \
        c[r * c_i + n] = t##r;                                                                     \
    }

typedef real gemm_vec32 __attribute__((vector_size(32)));
typedef real gemm_vec64 __attribute__((vector_size(64)));
#if defined(__AVX512F__) /* built for this CPU (-march=native), which has AVX-512: that width alone */
GEMM_KERNEL(gemm_rows_avx512, , gemm_vec64)
#elif defined(__AVX2__) && defined(__FMA__)
GEMM_KERNEL(gemm_rows_avx2, , gemm_vec32)
#else /* chosen when it runs (a CPU without AVX2, before 2013-2017, gets the plain loops) */
#define GEMM_RUNTIME_CHOICE 1
GEMM_KERNEL(gemm_rows_avx2, __attribute__((target("avx2,fma"))), gemm_vec32)
GEMM_KERNEL(gemm_rows_avx512, __attribute__((target("avx512f"))), gemm_vec64)
#endif
#endif

typedef void (*GemmRows)(const GemmArgs *, long, long);

/* The widest kernel built that the CPU runs; GEMM_VECTOR_BYTES (64, 32, or 0: the plain loops)
 * forces one (tests/test_gemm.py builds each). */
static GemmRows gemm_kernel(void)
{
#if defined(GEMM_VECTOR_BYTES) && defined(GEMM_VECTOR_KERNELS)
    return GEMM_VECTOR_BYTES == 64 ? gemm_rows_avx512 : GEMM_VECTOR_BYTES == 32 ? gemm_rows_avx2 : gemm_rows_plain;
#elif defined(GEMM_RUNTIME_CHOICE)
    return __builtin_cpu_supports("avx512f") ? gemm_rows_avx512
         : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? gemm_rows_avx2 : gemm_rows_plain;
#elif defined(__AVX512F__) && defined(GEMM_VECTOR_KERNELS)
    return gemm_rows_avx512;
#elif defined(GEMM_VECTOR_KERNELS)
    return gemm_rows_avx2;
#else
    return gemm_rows_plain;
#endif
}

static void gemm_task(void *args, long first, long last)
{
    gemm_kernel()((const GemmArgs *)args, first, last);
}

/* The product on the module's threads when it is big enough to pay for waking them. */
#define GEMM_PARALLEL_MIN 32768 /* multiply-adds */
static void gemm(const GemmArgs *g, long M)
{
    if (M <= 0 || g->N <= 0)
        return;
    if ((double)M * (double)g->N * (double)g->P < GEMM_PARALLEL_MIN)
        gemm_task((void *)g, 0, M);
    else
        parallel_rows(gemm_task, (void *)g, M, GEMM_MR);
}

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

/* out[j * out_j + s] = bias[j * bias_j] + sum over k < K of w[j * w_j + k * w_k] * x[k * x_k + s],
 * for j < J and s < S (bias 0: no bias), over the listed k only (rows: see above): a layer's J
 * neurons over a batch of S (x: its K inputs' rows); with an epilogue f (else 0), also
 * y[j * y_j + s] = f(out[j * out_j + s]): the layer's activation. */
KERNEL void matmul_set(real *restrict out, long out_j, const real *restrict bias, long bias_j,
                       const real *restrict w, long w_j, long w_k, const real *restrict x, long x_k,
                       long J, long S, long K, const int32_t *rows, Epilogue epilogue, real *y, long y_j)
{
    const GemmArgs g = {out, w, x, bias, out_j, w_j, w_k, x_k, bias_j, S, LISTED_COUNT(rows, K), 0,
                        LISTED_INDEX(rows), epilogue, y, 0, 0, y_j, 0, 0, 0, 0, 0};
    gemm(&g, J);
}

/* out[k * out_k + s] += sum over j < J of w[j * w_j + k * w_k] * go[j * go_j + s], for k < K and
 * s < S: a layer's inputs' gradients over a batch of S (go: its J neurons' gradient rows, w: its
 * weights, K inputs each). Neurons whose gradient row is 0 over the whole batch (a ReLU that is
 * off, a hinge that is flat) are left out of the sums: what they would add is 0. With an
 * epilogue (else 0), the gradient of the activation whose results the inputs are, into
 * y[k * y_k + s], from a[k * a_k + s] and o[k * o_k + s] (see Epilogue). */
#define GEMM_ACC_LISTED 4096 /* neurons a list is kept for (on the stack); more run dense */
KERNEL void matmul_acc(real *restrict out, long out_k, const real *restrict w, long w_j, long w_k,
                       const real *restrict go, long go_j, long J, long S, long K, Epilogue epilogue, real *y,
                       long y_k, const real *a, long a_k, const real *o, long o_k)
{
    int32_t active[GEMM_ACC_LISTED];
    long count = J;
    if (J <= GEMM_ACC_LISTED) {
        count = 0;
        for (long j = 0; j < J; j++) {
            int nonzero = 0;
            for (long s = 0; s < S; s++)
                nonzero |= go[j * go_j + s] != 0;
            if (nonzero)
                active[count++] = (int32_t)j;
        }
    }
    const GemmArgs g = {out, w, go, 0, out_k, w_k, w_j, go_j, 0, S, count, 1, count < J ? active : 0,
                        epilogue, y, a, o, y_k, a_k, o_k, 0, 0, 0};
    if (count > 0)
        gemm(&g, K);
    else if (epilogue) /* the inputs' gradients are what they were: the epilogue still runs */
        for (long k = 0; k < K; k++)
            epilogue(out + k * out_k, y + k * y_k, a ? a + k * a_k : 0, o ? o + k * o_k : 0, S);
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
 * them, reading and writing weights and gradients once more, is saved. */
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
} WeightGradientArgs;

/* Whether the list holds a row in [first, last) (binary search: the list is increasing). */
static int listed_between(const int32_t *rows, long first, long last)
{
    long lo = 0, hi = rows[0];
    while (lo < hi) {
        const long mid = (lo + hi) / 2;
        if (rows[1 + mid] < first)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < rows[0] && rows[1 + lo] < last;
}

/* Blocks [first_block, last_block) of columns, rows [first, last) of the weights. */
static void matmul_nt_part(const WeightGradientArgs *a, long first_block, long last_block, long first, long last)
{
    const GemmRows kernel = gemm_kernel();
    real xt[GEMM_NT_SAMPLES * GEMM_NT_COLUMNS];
    for (long block = first_block; block < last_block; block++) {
        const long k0 = block * GEMM_NT_COLUMNS, n = a->K - k0 < GEMM_NT_COLUMNS ? a->K - k0 : GEMM_NT_COLUMNS;
        if (a->rows && !listed_between(a->rows, k0, k0 + n))
            continue;
        for (long s0 = 0; s0 < a->S; s0 += GEMM_NT_SAMPLES) {
            const long p = a->S - s0 < GEMM_NT_SAMPLES ? a->S - s0 : GEMM_NT_SAMPLES;
            for (long k = 0; k < n; k++) {
                const real *row = a->x + (k0 + k) * a->x_k + s0;
                for (long s = 0; s < p; s++)
                    xt[s * n + k] = row[s];
            }
            /* stepping: the sums start from 0 (the gradients are 0) and step the weights at the end */
            const int first_part = s0 == 0, last_part = s0 + p >= a->S;
            const GemmArgs g = {a->out + k0, a->go + s0, xt, 0, a->out_j, a->go_j, 1, n, 0, n, p,
                                !(a->w && first_part), 0, 0, 0, 0, 0, 0, 0, 0,
                                a->w && last_part ? a->w + k0 : 0, a->rate, !first_part};
            kernel(&g, first, last);
        }
    }
}

static long matmul_nt_blocks(const WeightGradientArgs *a)
{
    return (a->K + GEMM_NT_COLUMNS - 1) / GEMM_NT_COLUMNS;
}

/* The threads' shares: column blocks, each packed once; or, with too few of them to go round,
 * one share of weights' rows per thread, each thread packing every block. */
static void matmul_nt_columns(void *args, long first, long last)
{
    const WeightGradientArgs *a = (const WeightGradientArgs *)args;
    matmul_nt_part(a, first, last, 0, a->J);
}

static void matmul_nt_rows(void *args, long first, long last)
{
    const WeightGradientArgs *a = (const WeightGradientArgs *)args;
    matmul_nt_part(a, 0, matmul_nt_blocks(a), first, last);
}

KERNEL void matmul_nt(real *restrict out, long out_j, const real *restrict go, long go_j,
                      const real *restrict x, long x_k, long J, long K, long S, const int32_t *rows, real *w,
                      real rate)
{
    WeightGradientArgs args = {out, go, x, out_j, go_j, x_k, J, K, S, rows, w, rate};
    if (J <= 0 || K <= 0 || S <= 0)
        return;
    const long blocks = matmul_nt_blocks(&args), threads = pool_parts();
    if ((double)J * (double)K * (double)S < GEMM_PARALLEL_MIN)
        matmul_nt_part(&args, 0, blocks, 0, J);
    else if (blocks >= 2 * threads)
        parallel_rows(matmul_nt_columns, &args, blocks, 1);
    else
        parallel_rows(matmul_nt_rows, &args, J, GEMM_MR * ((J + GEMM_MR * threads - 1) / (GEMM_MR * threads)));
}
