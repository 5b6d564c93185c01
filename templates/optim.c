/* ---- optimizer steps ----------------------------------------------------------------------- */
/* One optimizer step over the parameter block, PyTorch's formulas in PyTorch's order of
 * operations (torch.optim.SGD with dampening 0, Adam, AdamW). The model's descriptor holds the
 * rule (MODEL.optimizer: kind 0 SGD, 1 SGD with momentum, 2 Adam/AdamW, codegen/write/optim.py)
 * and its hyperparameters; every combination of the switches that change a loop's operations
 * (weight decay or not, Nesterov, AdamW's decoupled decay, zeroing the gradients) is compiled
 * here as its own loop, chosen once per step, so that no loop tests them per parameter and the
 * module runtime serves every optimizer. `m` and `v` are the optimizer's per-parameter state
 * (momentum buffer; exp_avg and exp_avg_sq), `step` Adam's step count. */
#if defined(__GNUC__) && !defined(__TINYC__)
#define SPECIALISED __attribute__((always_inline)) inline
#else
#define SPECIALISED inline
#endif
/* Adam's update of one parameter (p, its gradient g, moments m and v): written once, used on
 * reals and on vectors of reals. DECOUPLED (AdamW) decays p; L2 (Adam with weight decay) adds
 * to the gradient. The scalars are reals (k below), so that float32 modules compute in float
 * (and vector arithmetic takes them). */
#define ADAM_ELEMENT(SQRT, DECOUPLED, L2, p, g, m, v)                                           \
    do {                                                                                         \
        if (DECOUPLED)                                                                           \
            p = p * k.decay;                                                                     \
        if (k.weight < 0.5)                                                                      \
            m = m + k.weight * (ADAM_GRAD(L2, p, g) - m);                                        \
        else                                                                                     \
            m = ADAM_GRAD(L2, p, g) - (ADAM_GRAD(L2, p, g) - m) * k.rest1;                       \
        v = v * k.beta2 + (k.rest2 * ADAM_GRAD(L2, p, g)) * ADAM_GRAD(L2, p, g);                 \
        p = p + (-k.step_size * m) / (SQRT(v) * k.inv_correction2_sqrt + k.eps);                 \
    } while (0)
#define ADAM_GRAD(L2, p, g) (L2 ? (g) + k.weight_decay * (p) : (g))

/* A step's scalars, as reals: step_size = lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t), AdamW's
 * 1 - lr * weight_decay, torch's lerp weight 1 - beta1 and its 1 - weight, beta2 and 1 - beta2,
 * eps, weight_decay. */
typedef struct {
    real step_size, inv_correction2_sqrt, decay, weight, rest1, beta2, rest2, eps, weight_decay;
} AdamScalars;

/* Adam's pass over the parameters in vectors of `vec_t` (its square root SQRT, one per lane:
 * the C library's sqrt would set errno and serialise the loop); returns how many parameters it
 * stepped, whole vectors from the first (the rest are done one by one). A function per vector
 * width and kind of decay, chosen when the step runs (adam_vectors below), so that a build
 * without -march=native still gets the widest vectors the CPU has: this AMD EPYC's divider,
 * which bounds the pass, does a 512-bit vector in about the time of a 256-bit one (the pass over
 * MNIST's 39,760 parameters: 31 us -> 16 us). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__) /* GCC, Clang */
#define ADAM_VECTOR_PASSES 1
#include <immintrin.h>
#define ADAM_PASS(name, attributes, vec_t, SQRT, DECOUPLED, L2)                                    \
    static attributes long name(real *restrict p, real *restrict g, real *restrict m,              \
                                real *restrict v, long n, AdamScalars k, int clear)                \
    {                                                                                              \
        const long lanes = (long)(sizeof(vec_t) / sizeof(real));                                   \
        long i = 0;                                                                                \
        for (; i + lanes <= n; i += lanes) {                                                       \
            vec_t P, G, M, V;                                                                      \
            memcpy(&P, p + i, sizeof P);                                                           \
            memcpy(&G, g + i, sizeof G);                                                           \
            memcpy(&M, m + i, sizeof M);                                                           \
            memcpy(&V, v + i, sizeof V);                                                           \
            ADAM_ELEMENT(SQRT, DECOUPLED, L2, P, G, M, V);                                         \
            memcpy(p + i, &P, sizeof P);                                                           \
            memcpy(m + i, &M, sizeof M);                                                           \
            memcpy(v + i, &V, sizeof V);                                                           \
            if (clear)                                                                             \
                memset(g + i, 0, sizeof G);                                                        \
        }                                                                                          \
        return i;                                                                                  \
    }
/* one width's three passes: no weight decay, Adam's L2, AdamW's decoupled decay */
#define ADAM_PASSES(name, attributes, vec_t, SQRT)                                                 \
    ADAM_PASS(name##_plain, attributes, vec_t, SQRT, 0, 0)                                         \
    ADAM_PASS(name##_l2, attributes, vec_t, SQRT, 0, 1)                                            \
    ADAM_PASS(name##_decoupled, attributes, vec_t, SQRT, 1, 0)
typedef real vec16 __attribute__((vector_size(16)));
typedef real vec32 __attribute__((vector_size(32)));
typedef real vec64 __attribute__((vector_size(64)));
#if REAL_IS_FLOAT
#define SQRT16(x) ((vec16)_mm_sqrt_ps((__m128)(x)))
#define SQRT32(x) ((vec32)_mm256_sqrt_ps((__m256)(x)))
#define SQRT64(x) ((vec64)_mm512_sqrt_ps((__m512)(x)))
#else
#define SQRT16(x) ((vec16)_mm_sqrt_pd((__m128d)(x)))
#define SQRT32(x) ((vec32)_mm256_sqrt_pd((__m256d)(x)))
#define SQRT64(x) ((vec64)_mm512_sqrt_pd((__m512d)(x)))
#endif
ADAM_PASSES(adam_pass_sse2, , vec16, SQRT16)
ADAM_PASSES(adam_pass_avx, __attribute__((target("avx"))), vec32, SQRT32)
ADAM_PASSES(adam_pass_avx512, __attribute__((target("avx512f"))), vec64, SQRT64)
/* The batch's mean of the gradients, g / by in vectors of vec_t (divided in reals, not in the
 * double of mean_division's remaining ones: the same bits, below); returns how many it divided. */
#define DIVIDE_PASS(name, attributes, vec_t)                                                       \
    static attributes long name(real *restrict g, long n, real by)                                \
    {                                                                                              \
        const long lanes = (long)(sizeof(vec_t) / sizeof(real));                                   \
        long i = 0;                                                                                \
        for (; i + lanes <= n; i += lanes) {                                                       \
            vec_t G;                                                                               \
            memcpy(&G, g + i, sizeof G);                                                           \
            G = G / by;                                                                            \
            memcpy(g + i, &G, sizeof G);                                                           \
        }                                                                                          \
        return i;                                                                                  \
    }
DIVIDE_PASS(divide_pass_sse2, , vec16)
DIVIDE_PASS(divide_pass_avx, __attribute__((target("avx"))), vec32)
DIVIDE_PASS(divide_pass_avx512, __attribute__((target("avx512f"))), vec64)
#define ADAM_WIDTH(name, decoupled, l2)                                                            \
    ((decoupled) ? name##_decoupled(p, g, m, v, n, k, clear)                                       \
     : (l2) ? name##_l2(p, g, m, v, n, k, clear) : name##_plain(p, g, m, v, n, k, clear))
#endif

static long adam_vectors(real *p, real *g, real *m, real *v, long n, AdamScalars k, int clear, int decoupled,
                         int l2)
{
#ifdef ADAM_VECTOR_PASSES
#ifndef ADAM_VECTOR_BYTES /* the widest the CPU has (tests/test_optim.py sets it, to hold each pass) */
#define ADAM_VECTOR_BYTES (cpu_features() & CPU_AVX512F ? 64 : cpu_features() & CPU_AVX ? 32 : 16)
#endif
    switch (ADAM_VECTOR_BYTES) {
    case 64: return ADAM_WIDTH(adam_pass_avx512, decoupled, l2);
    case 32: return ADAM_WIDTH(adam_pass_avx, decoupled, l2);
    default: return ADAM_WIDTH(adam_pass_sse2, decoupled, l2);
    }
#else /* TCC, other CPUs: the parameters one by one */
    (void)p, (void)g, (void)m, (void)v, (void)n, (void)k, (void)clear, (void)decoupled, (void)l2;
    return 0;
#endif
}

/* g[0..n) divided by mean_of (a batch's sum of gradients: its mean), each as g[i] /= mean_of:
 * in vectors of reals where mean_of is a real (a count of samples), whose quotient rounded once
 * to float32 is the double's rounded twice (53 bits hold 2 x 24 + 2: the double rounding of a
 * quotient is innocuous), the rest one by one. GCC -O2 leaves the loop of double divisions scalar:
 * 2.8% of the bigger GPT's step (Zen 5), its Adam pass beside it 0.6%. */
static void mean_division(real *restrict g, long n, double mean_of)
{
    long i = 0;
#if defined(ADAM_VECTOR_PASSES) && !defined(MEAN_DIVISION_ONE_BY_ONE) /* (tests/test_optim.py sets it) */
    const real by = (real)mean_of;
    if ((double)by == mean_of)
        switch (ADAM_VECTOR_BYTES) {
        case 64: i = divide_pass_avx512(g, n, by); break;
        case 32: i = divide_pass_avx(g, n, by); break;
        default: i = divide_pass_sse2(g, n, by); break;
        }
#endif
    for (; i < n; i++)
        g[i] /= mean_of;
}

/* The loops of one kind of step, each specialised by its callers' constants (DECAY: weight decay
 * added to the gradient; CLEAR: the gradients zeroed in the same pass, train()'s next batch
 * starting from zero). */
static SPECIALISED void sgd_loop(real *restrict p, real *restrict g, long n, real rate, real weight_decay,
                                 const int DECAY, const int CLEAR)
{
    for (long i = 0; i < n; i++) {
        real grad = DECAY ? g[i] + weight_decay * p[i] : g[i];
        p[i] = p[i] + -rate * grad;
        if (CLEAR)
            g[i] = 0;
    }
}

/* PyTorch starts the buffer as a copy of the first gradient: momentum * 0 + grad is that. */
static SPECIALISED void momentum_loop(real *restrict p, real *restrict g, real *restrict m, long n, real rate,
                                      real weight_decay, real momentum, const int DECAY, const int NESTEROV,
                                      const int CLEAR)
{
    for (long i = 0; i < n; i++) {
        real grad = DECAY ? g[i] + weight_decay * p[i] : g[i];
        m[i] = m[i] * momentum + grad;
        grad = NESTEROV ? grad + momentum * m[i] : m[i];
        p[i] = p[i] + -rate * grad;
        if (CLEAR)
            g[i] = 0;
    }
}

/* Adam's parameters from `first` one by one (after the vector passes) */
static SPECIALISED void adam_loop(real *restrict p, real *restrict g, real *restrict m, real *restrict v, long first,
                                  long n, AdamScalars k, const int DECOUPLED, const int L2, const int CLEAR)
{
    for (long i = first; i < n; i++) {
        ADAM_ELEMENT(real_sqrt, DECOUPLED, L2, p[i], g[i], m[i], v[i]);
        if (CLEAR)
            g[i] = 0;
    }
}

/* One step's constants and buffers (optimizer_step's), for its rows. */
typedef struct {
    real *p, *g, *m, *v;
    real rate;
    AdamScalars k;
    double mean_of; /* the gradients are divided by this first (a batch's sum: its mean), or 1 */
    int clear;
} StepRows;

/* The step on parameters [first, last): the rows of one thread (each parameter's update is its
 * own: the same bits whoever steps it), with subnormals flushed, as every call of the module
 * computes (templates/threads.c's lock_state).
 * Compiled once each way of `clear` (optimizer_rows). */
static SPECIALISED void optimizer_rows_of(const StepRows *a, long first, long last, const int clear)
{
    const ModelOptimizer *o = &MODEL.optimizer;
    real *restrict p = a->p + first, *restrict g = a->g + first;
    real *restrict m = a->m ? a->m + first : NULL, *restrict v = a->v ? a->v + first : NULL;
    const long n = last - first;
    const real rate = a->rate, weight_decay = (real)o->weight_decay;
    const int decay = o->weight_decay != 0.0;
    if (a->mean_of != 1.0)
        mean_division(g, n, a->mean_of);
    if (o->kind == 0) {
        if (decay)
            sgd_loop(p, g, n, rate, weight_decay, 1, clear);
        else
            sgd_loop(p, g, n, rate, weight_decay, 0, clear);
    } else if (o->kind == 1) {
        const real momentum = (real)o->momentum;
        if (decay && o->nesterov)
            momentum_loop(p, g, m, n, rate, weight_decay, momentum, 1, 1, clear);
        else if (decay)
            momentum_loop(p, g, m, n, rate, weight_decay, momentum, 1, 0, clear);
        else if (o->nesterov)
            momentum_loop(p, g, m, n, rate, weight_decay, momentum, 0, 1, clear);
        else
            momentum_loop(p, g, m, n, rate, weight_decay, momentum, 0, 0, clear);
    } else {
        const int decoupled = o->decoupled_decay, l2 = !o->decoupled_decay && decay;
        long i = adam_vectors(p, g, m, v, n, a->k, clear, decoupled, l2);
        if (decoupled)
            adam_loop(p, g, m, v, i, n, a->k, 1, 0, clear);
        else if (l2)
            adam_loop(p, g, m, v, i, n, a->k, 0, 1, clear);
        else
            adam_loop(p, g, m, v, i, n, a->k, 0, 0, clear);
    }
}

static void optimizer_rows(void *args, long first, long last)
{
    const StepRows *a = (const StepRows *)args;
    if (a->clear)
        optimizer_rows_of(a, first, last, 1);
    else
        optimizer_rows_of(a, first, last, 0);
}

/* parameters from which a step runs on the module's threads (each a share of them): MNIST's
 * 535,818-parameter MLP, the bigger GPT's 103,936 (its Adam step and the batch's mean: 2.3% of
 * its step on the caller alone, the other core idle, Intel Xeon); not the demo's 337 */
#define STEP_PARALLEL_MIN 65536

/* One step of the module's optimizer on the parameters p and gradients g (their first N_PARAMS),
 * m and v its state; mean_of: the gradients are a sum of that many samples', divided first (1:
 * as they are). With `clear` the step also zeroes the gradients, in the same pass (train(): the
 * next batch starts from zero). On the module's threads from STEP_PARALLEL_MIN parameters
 * with `parallel` (train()'s batched passes: templates/driver.c's batch_step). */
static void optimizer_step(real *restrict p, real *restrict g, real *restrict m, real *restrict v, real *step,
                           double lr, double mean_of, const int clear, int parallel)
{
    const ModelOptimizer *o = &MODEL.optimizer;
    StepRows rows = {p, g, m, v, (real)lr, {0}, mean_of, clear};
    if (o->kind == 2) {
        double t = *step += 1;
        /* PyTorch divides by sqrt(1 - beta2^t); multiplying by its reciprocal is at most an ulp
         * away and spares a division per parameter, which is what bounds this loop. */
        const real weight = (real)(1.0 - o->beta1); /* torch's lerp(m, grad, 1 - beta1) */
        const AdamScalars k = {
            (real)(lr / (1.0 - pow(o->beta1, t))), (real)(1.0 / sqrt(1.0 - pow(o->beta2, t))),
            (real)(1.0 - lr * o->weight_decay), /* AdamW's decoupled decay */
            weight, (real)(1.0 - weight), (real)o->beta2, (real)(1.0 - o->beta2), (real)o->eps, (real)o->weight_decay,
        };
        rows.k = k;
    }
    if (parallel && MODEL.n_params >= STEP_PARALLEL_MIN)
        parallel_pass(optimizer_rows, &rows, MODEL.n_params, 64);
    else
        optimizer_rows(&rows, 0, MODEL.n_params);
}
