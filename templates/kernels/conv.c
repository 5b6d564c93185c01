/* ---- convolutions over a batch ---------------------------------------------------------------
 * A convolution written with scalar Values (the zoo's CNN: each output a sum of a filter's K
 * weights times a window of K inputs, at P x Q positions) becomes, over a batch (the samples
 * innermost, S of them, stride 1), loops whose window is a list of K offsets (a 3x3 window of a
 * 28-wide image: 0, 1, 2, 28, 29, 30, 56, 57, 58, times the batch's capacity). Its three products
 * (codegen/write/convolution.py calls them), with X(p, q, k) = x + p * x_p + q * x_q + offsets[k]:
 *   forward             conv_set: out[f, p, q, s] = bias[f] + sum over k of w[f, k] * X(p, q, k)[s],
 *                                 and with an epilogue (kernels/gemm.c's), its activation into y
 *   weights' gradients  conv_nt:  gw[f, k] += sum over p, q, s of go[f, p, q, s] * X(p, q, k)[s],
 *                                 and gb[f] += the sum of go[f, ...] (the bias's)
 *   inputs' gradients   conv_acc: X(p, q, k)[s] += sum over f of w[f, k] * go[f, p, q, s], at every
 *                                 position in turn (windows overlap)
 * The forward's outputs and the weights' sums each run whole in one thread (a filter's rows, a
 * filter), in a fixed order of p, q and the lanes: the same bits for any thread count; the
 * inputs' gradients, whose windows overlap, on the caller's thread. The samples go in vectors of
 * CONV_LANES (GCC's and Clang's vector extension; TCC runs the same lanes as scalars), each
 * lane's sum in position order, the lanes summed pairwise at the end, the samples after the last
 * whole vector in scalars; the forward's sums run in k order from the bias, lane or not. */
#if REAL_IS_FLOAT
#define CONV_LANES 8
#define CONV_SUM(s) ((((s)[0] + (s)[1]) + ((s)[2] + (s)[3])) + (((s)[4] + (s)[5]) + ((s)[6] + (s)[7])))
#else
#define CONV_LANES 4
#define CONV_SUM(s) (((s)[0] + (s)[1]) + ((s)[2] + (s)[3]))
#endif
#if defined(__GNUC__) && !defined(__TINYC__)
typedef real conv_lanes __attribute__((vector_size(CONV_LANES * sizeof(real)), aligned(sizeof(real)), may_alias));
#define LANES(v) conv_lanes v
#define LANES_SET(v, x) (v) = (conv_lanes){0} + (x)
#define LANES_FMA(v, w, p) (v) += (w) * *(const conv_lanes *)(p)        /* v += w * p[0..L) */
#define LANES_FMA2(v, p, q) (v) += *(const conv_lanes *)(p) * *(const conv_lanes *)(q)
#define LANES_FMA_BY(v, w, u) (v) += (w) * (u)                             /* v += w * u (lanes) */
#define LANES_ADD(v, u) (v) += (u)
#define LANES_ACC(v, p) (v) += *(const conv_lanes *)(p)                 /* v += p[0..L) */
#define LANES_LOAD(v, p) (v) = *(const conv_lanes *)(p)
#define LANES_STORE(p, v) (*(conv_lanes *)(p) = (v))
#define LANES_GET(v, lanes) memcpy(lanes, &(v), sizeof(v))
#else
#define LANES(v) real v[CONV_LANES]
#define LANES_EACH(statement)                                                                      \
    for (int l_ = 0; l_ < CONV_LANES; l_++) statement
#define LANES_SET(v, x) LANES_EACH((v)[l_] = (x))
#define LANES_FMA(v, w, p) LANES_EACH((v)[l_] += (w) * (p)[l_])
#define LANES_FMA2(v, p, q) LANES_EACH((v)[l_] += (p)[l_] * (q)[l_])
#define LANES_FMA_BY(v, w, u) LANES_EACH((v)[l_] += (w) * (u)[l_])
#define LANES_ADD(v, u) LANES_EACH((v)[l_] += (u)[l_])
#define LANES_ACC(v, p) LANES_EACH((v)[l_] += (p)[l_])
#define LANES_LOAD(v, p) LANES_EACH((v)[l_] = (p)[l_])
#define LANES_STORE(p, v) LANES_EACH((p)[l_] = (v)[l_])
#define LANES_GET(v, lanes) memcpy(lanes, v, sizeof(v))
#endif

#if RUNTIME_PRODUCTS != 1

/* (filled by field name; x's fields are the inputs' or, for conv_acc, their gradients') */
typedef struct {
    real *out, *bias;
    const real *w, *x, *go, *bias_in;
    const int32_t *offsets;
    long out_f, out_p, out_q, out_k, bias_f, w_f, w_k, x_p, x_q, go_f, go_p, go_q, F, P, Q, S, K;
    Epilogue epilogue; /* conv_set's: 0, or f: y[f, p, q, s] = f(out[f, p, q, s]) (an activation) */
    real *y;
    long y_f, y_p, y_q;
} ConvArgs;

/* A kernel's parts [0, parts) (rows, filters), on the module's threads when it is big enough. */
static void conv_run(RowTask task, const ConvArgs *a, long parts)
{
    if (a->F <= 0 || a->P <= 0 || a->Q <= 0 || a->S <= 0)
        return;
    if ((double)a->F * a->P * a->Q * a->S * a->K < GEMM_PARALLEL_MIN)
        task((void *)a, 0, parts);
    else
        parallel_rows(task, (void *)a, parts, 1);
}

/* A register tile's functions are inlined where each is called with constant sizes, and their
 * loops over the tile unrolled: the tile's sums (or weights) stay in registers. The weights'
 * gradients take the window in groups of CONV_GROUP elements, then of 3, then single ones. */
#define CONV_GROUP 9
#if defined(__GNUC__) && !defined(__TINYC__)
#define CONV_INLINE static inline __attribute__((always_inline))
#define CONV_UNROLLED _Pragma("GCC unroll 9")
#else
#define CONV_INLINE static
#define CONV_UNROLLED
#endif

/* conv_set's filters [f0, f0 + m) (m at most CONV_FILTERS) at row p: a tile of the m filters by
 * two vectors of samples held in registers while the window runs (each load of the inputs serves
 * every filter, each weight both vectors), then a tile of one vector, then single samples; every
 * sum in k order from the bias. */
#define CONV_FILTERS 4
CONV_INLINE void conv_set_filters(const ConvArgs *a, long f0, int m, long p)
{
    real init[CONV_FILTERS], *out[CONV_FILTERS];
    const real *w[CONV_FILTERS];
    CONV_UNROLLED
    for (int j = 0; j < m; j++) {
        init[j] = a->bias_in ? a->bias_in[(f0 + j) * a->bias_f] : 0;
        w[j] = a->w + (f0 + j) * a->w_f;
        out[j] = a->out + (f0 + j) * a->out_f + p * a->out_p;
    }
    const long S = a->S, K = a->K, w_k = a->w_k;
    const int32_t *offsets = a->offsets;
    for (long q = 0; q < a->Q; q++) {
        const real *x = a->x + p * a->x_p + q * a->x_q;
        const long at = q * a->out_q;
        long s = 0;
        for (; s + 2 * CONV_LANES <= S; s += 2 * CONV_LANES) {
            LANES(v[CONV_FILTERS][2]);
            CONV_UNROLLED
            for (int j = 0; j < m; j++) {
                LANES_SET(v[j][0], init[j]);
                LANES_SET(v[j][1], init[j]);
            }
            for (long k = 0; k < K; k++) {
                const real *xk = x + offsets[k] + s;
                LANES(x0);
                LANES(x1);
                LANES_LOAD(x0, xk);
                LANES_LOAD(x1, xk + CONV_LANES);
                CONV_UNROLLED
                for (int j = 0; j < m; j++) {
                    const real wk = w[j][k * w_k];
                    LANES_FMA_BY(v[j][0], wk, x0);
                    LANES_FMA_BY(v[j][1], wk, x1);
                }
            }
            CONV_UNROLLED
            for (int j = 0; j < m; j++) {
                LANES_STORE(out[j] + at + s, v[j][0]);
                LANES_STORE(out[j] + at + s + CONV_LANES, v[j][1]);
            }
        }
        for (; s + CONV_LANES <= S; s += CONV_LANES) {
            LANES(v[CONV_FILTERS]);
            CONV_UNROLLED
            for (int j = 0; j < m; j++)
                LANES_SET(v[j], init[j]);
            for (long k = 0; k < K; k++) {
                LANES(x0);
                LANES_LOAD(x0, x + offsets[k] + s);
                CONV_UNROLLED
                for (int j = 0; j < m; j++)
                    LANES_FMA_BY(v[j], w[j][k * w_k], x0);
            }
            CONV_UNROLLED
            for (int j = 0; j < m; j++)
                LANES_STORE(out[j] + at + s, v[j]);
        }
        for (; s < S; s++)
            for (int j = 0; j < m; j++) {
                real sum = init[j];
                for (long k = 0; k < K; k++)
                    sum += w[j][k * w_k] * x[offsets[k] + s];
                out[j][at + s] = sum;
            }
        if (a->epilogue) /* the position's results done: their activation, while they are in the cache */
            for (int j = 0; j < m; j++)
                a->epilogue(out[j] + at, a->y + (f0 + j) * a->y_f + p * a->y_p + q * a->y_q, 0, 0, S);
    }
}

/* Rows [first, last) of conv_set's P rows: every filter, CONV_FILTERS at a time. */
static void conv_set_rows(void *args, long first, long last)
{
    const ConvArgs *a = (const ConvArgs *)args;
    for (long p = first; p < last; p++) {
        long f = 0;
        for (; f + CONV_FILTERS <= a->F; f += CONV_FILTERS)
            conv_set_filters(a, f, CONV_FILTERS, p);
        for (; f + 2 <= a->F; f += 2)
            conv_set_filters(a, f, 2, p);
        for (; f < a->F; f++)
            conv_set_filters(a, f, 1, p);
    }
}

PRODUCT void conv_set(real *restrict out, long out_f, long out_p, long out_q, const real *restrict bias,
                      long bias_f, const real *restrict w, long w_f, long w_k, const real *restrict x, long x_p,
                      long x_q, const int32_t *offsets, long F, long P, long Q, long S, long K, Epilogue epilogue,
                      real *y, long y_f, long y_p, long y_q)
{
    const ConvArgs a = {.out = out, .out_f = out_f, .out_p = out_p, .out_q = out_q, .bias_in = bias,
                        .bias_f = bias_f, .w = w, .w_f = w_f, .w_k = w_k, .x = x, .x_p = x_p, .x_q = x_q,
                        .offsets = offsets, .F = F, .P = P, .Q = Q, .S = S, .K = K, .epilogue = epilogue, .y = y,
                        .y_f = y_f, .y_p = y_p, .y_q = y_q};
    conv_run(conv_set_rows, &a, P);
}

/* conv_nt's filter f, window elements [k0, k0 + n): each weight's sum in lanes over every
 * position's vectors of samples (lane l: sample l of each vector, in position order), the lanes
 * summed pairwise, then the samples after the last whole vector, each in position order. */
CONV_INLINE void conv_nt_group(const ConvArgs *a, long f, long k0, int n)
{
    LANES(sums[CONV_GROUP]);
    CONV_UNROLLED
    for (int k = 0; k < n; k++)
        LANES_SET(sums[k], 0);
    const long S = a->S, Q = a->Q, x_q = a->x_q, go_q = a->go_q, vectors = S - S % CONV_LANES;
    for (long p = 0; p < a->P; p++) {
        const real *go = a->go + f * a->go_f + p * a->go_p, *x[CONV_GROUP];
        CONV_UNROLLED
        for (int k = 0; k < n; k++)
            x[k] = a->x + p * a->x_p + a->offsets[k0 + k];
        for (long q = 0; q < Q; q++) {
            const real *g = go + q * go_q;
            const long from = q * x_q;
            for (long s = 0; s < vectors; s += CONV_LANES) {
                CONV_UNROLLED
                for (int k = 0; k < n; k++)
                    LANES_FMA2(sums[k], g + s, x[k] + from + s);
            }
        }
    }
    real lanes[CONV_LANES], rest[CONV_GROUP], *out = a->out + f * a->out_f;
    for (int k = 0; k < n; k++)
        rest[k] = 0;
    if (vectors < S) /* (apart: scalars live across the vectors' loop would push its sums out of the registers) */
        for (long p = 0; p < a->P; p++)
            for (long q = 0; q < Q; q++) {
                const real *g = a->go + f * a->go_f + p * a->go_p + q * go_q;
                const real *x = a->x + p * a->x_p + q * x_q;
                for (long s = vectors; s < S; s++)
                    for (int k = 0; k < n; k++)
                        rest[k] += g[s] * x[a->offsets[k0 + k] + s];
            }
    for (int k = 0; k < n; k++) {
        LANES_GET(sums[k], lanes);
        out[(k0 + k) * a->out_k] += CONV_SUM(lanes) + rest[k];
    }
}

/* Filters [first, last) of conv_nt: the bias's sum, then the weights' three at a time. */
static void conv_nt_filters(void *args, long first, long last)
{
    const ConvArgs *a = (const ConvArgs *)args;
    for (long f = first; f < last; f++) {
        if (a->bias) {
            LANES(s0);
            LANES_SET(s0, 0);
            real r0 = 0, lanes[CONV_LANES];
            for (long p = 0; p < a->P; p++)
                for (long q = 0; q < a->Q; q++) {
                    const real *go = a->go + f * a->go_f + p * a->go_p + q * a->go_q;
                    long s = 0;
                    for (; s + CONV_LANES <= a->S; s += CONV_LANES)
                        LANES_ACC(s0, go + s);
                    for (; s < a->S; s++)
                        r0 += go[s];
                }
            LANES_GET(s0, lanes);
            a->bias[f * a->bias_f] += CONV_SUM(lanes) + r0;
        }
        long k0 = 0;
        for (; k0 + CONV_GROUP <= a->K; k0 += CONV_GROUP)
            conv_nt_group(a, f, k0, CONV_GROUP);
        for (; k0 + 3 <= a->K; k0 += 3)
            conv_nt_group(a, f, k0, 3);
        for (; k0 < a->K; k0++)
            conv_nt_group(a, f, k0, 1);
    }
}

PRODUCT void conv_nt(real *restrict out, long out_f, long out_k, real *restrict bias, long bias_f,
                     const real *restrict go, long go_f, long go_p, long go_q, const real *restrict x, long x_p,
                     long x_q, const int32_t *offsets, long F, long P, long Q, long S, long K)
{
    const ConvArgs a = {.out = out, .out_f = out_f, .out_k = out_k, .bias = bias, .bias_f = bias_f, .go = go,
                        .go_f = go_f, .go_p = go_p, .go_q = go_q, .x = x, .x_p = x_p, .x_q = x_q,
                        .offsets = offsets, .F = F, .P = P, .Q = Q, .S = S, .K = K};
    conv_run(conv_nt_filters, &a, F);
}

/* The inputs' gradients, position by position (windows overlap): each window element's vector
 * of samples read once, the filters' terms added in f order, written back. */
PRODUCT void conv_acc(real *restrict out, long out_p, long out_q, const int32_t *offsets, const real *restrict w,
                      long w_f, long w_k, const real *restrict go, long go_f, long go_p, long go_q, long F, long P,
                      long Q, long S, long K)
{
    for (long p = 0; p < P; p++)
        for (long q = 0; q < Q; q++) {
            const real *g = go + p * go_p + q * go_q;
            for (long k = 0; k < K; k++) {
                real *o = out + p * out_p + q * out_q + offsets[k];
                long s = 0;
                for (; s + CONV_LANES <= S; s += CONV_LANES) {
                    LANES(v);
                    LANES_LOAD(v, o + s);
                    for (long f = 0; f < F; f++)
                        LANES_FMA(v, w[f * w_f + k * w_k], g + f * go_f + s);
                    LANES_STORE(o + s, v);
                }
                for (; s < S; s++) {
                    real sum = o[s];
                    for (long f = 0; f < F; f++)
                        sum += w[f * w_f + k * w_k] * g[f * go_f + s];
                    o[s] = sum;
                }
            }
        }
}
#endif
