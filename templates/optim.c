/* ---- optimizer steps ----------------------------------------------------------------------- */
/* One optimizer step over the parameter block, PyTorch's formulas in PyTorch's order of
 * operations (torch.optim.SGD with dampening 0, Adam, AdamW). codegen/optim.py chose the rule:
 * OPTIMIZER (0 SGD, 1 SGD with momentum, 2 Adam/AdamW) and its hyperparameters are #defines, so
 * the compiler folds away every branch that does not apply. `m` and `v` are the optimizer's
 * per-parameter state (momentum buffer; exp_avg and exp_avg_sq), `step` Adam's step count. */
/* Adam's update of one parameter (p, its gradient g, moments m and v): written once, used on
 * doubles and on vectors of doubles. */
#define ADAM_ELEMENT(SQRT, p, g, m, v)                                       \
    do {                                                                     \
        if (DECOUPLED_DECAY)                                                 \
            p = p * decay;                                                   \
        if (weight < 0.5)                                                    \
            m = m + weight * (ADAM_GRAD(p, g) - m);                          \
        else                                                                 \
            m = ADAM_GRAD(p, g) - (ADAM_GRAD(p, g) - m) * (1.0 - weight);    \
        v = v * BETA2 + ((1.0 - BETA2) * ADAM_GRAD(p, g)) * ADAM_GRAD(p, g); \
        p = p + (-step_size * m) / (SQRT(v) * inv_correction2_sqrt + EPS);   \
    } while (0)
/* Adam's L2 weight decay adds to the gradient (AdamW's decays p instead) */
#define ADAM_GRAD(p, g) (DECOUPLED_DECAY || WEIGHT_DECAY == 0.0 ? (g) : (g) + WEIGHT_DECAY * (p))

/* The square root of every lane keeps the C library's errno from serialising the Adam loop:
 * with GCC and Clang it runs on SSE2 (AVX with -march=native) vectors. */
#if !defined(__TINYC__) && (defined(__AVX__) || defined(__SSE2__))
#include <immintrin.h>
#if defined(__AVX__)
typedef double vec __attribute__((vector_size(32)));
#define VSQRT(x) ((vec)_mm256_sqrt_pd((__m256d)(x)))
#else
typedef double vec __attribute__((vector_size(16)));
#define VSQRT(x) ((vec)_mm_sqrt_pd((__m128d)(x)))
#endif
#define VLANES (long)(sizeof(vec) / sizeof(double))
#endif

/* With `clear` the step also zeroes the gradients, in the same pass (train(): the next batch
 * starts from zero). It is a constant at each call, so the step is compiled once each way. */
#if defined(__GNUC__) && !defined(__TINYC__)
#define SPECIALISED __attribute__((always_inline)) inline
#else
#define SPECIALISED inline
#endif
static SPECIALISED void optimizer_step(double *restrict p, double *restrict g, double *restrict m,
                                       double *restrict v, double *step, double lr, int clear)
{
    if (OPTIMIZER == 0) {
        for (long i = 0; i < N_PARAMS; i++) {
            double grad = WEIGHT_DECAY != 0.0 ? g[i] + WEIGHT_DECAY * p[i] : g[i];
            p[i] = p[i] + -lr * grad;
            if (clear)
                g[i] = 0.0;
        }
    } else if (OPTIMIZER == 1) {
        /* PyTorch starts the buffer as a copy of the first gradient: momentum * 0 + grad is that. */
        for (long i = 0; i < N_PARAMS; i++) {
            double grad = WEIGHT_DECAY != 0.0 ? g[i] + WEIGHT_DECAY * p[i] : g[i];
            m[i] = m[i] * MOMENTUM + grad;
            grad = NESTEROV ? grad + MOMENTUM * m[i] : m[i];
            p[i] = p[i] + -lr * grad;
            if (clear)
                g[i] = 0.0;
        }
    } else {
        double t = *step += 1.0;
        double step_size = lr / (1.0 - pow(BETA1, t));
        /* PyTorch divides by sqrt(1 - beta2^t); multiplying by its reciprocal is at most an ulp
         * away and spares a division per parameter, which is what bounds this loop. */
        double inv_correction2_sqrt = 1.0 / sqrt(1.0 - pow(BETA2, t));
        double decay = 1.0 - lr * WEIGHT_DECAY; /* AdamW's decoupled decay */
        const double weight = 1.0 - BETA1;      /* torch's lerp(m, grad, 1 - beta1) */
        long i = 0;
#ifdef VLANES
        for (; i + VLANES <= N_PARAMS; i += VLANES) {
            vec P, G, M, V;
            memcpy(&P, p + i, sizeof P);
            memcpy(&G, g + i, sizeof G);
            memcpy(&M, m + i, sizeof M);
            memcpy(&V, v + i, sizeof V);
            ADAM_ELEMENT(VSQRT, P, G, M, V);
            memcpy(p + i, &P, sizeof P);
            memcpy(m + i, &M, sizeof M);
            memcpy(v + i, &V, sizeof V);
            if (clear)
                memset(g + i, 0, sizeof G);
        }
#endif
        for (; i < N_PARAMS; i++) {
            ADAM_ELEMENT(sqrt, p[i], g[i], m[i], v[i]);
            if (clear)
                g[i] = 0.0;
        }
    }
}
