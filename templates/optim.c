/* ---- optimizer steps ----------------------------------------------------------------------- */
/* One optimizer step over the parameter block, PyTorch's formulas in PyTorch's order of
 * operations (torch.optim.SGD with dampening 0, Adam, AdamW). codegen/write/optim.py chose the rule:
 * OPTIMIZER (0 SGD, 1 SGD with momentum, 2 Adam/AdamW) and its hyperparameters are #defines, so
 * the compiler folds away every branch that does not apply. `m` and `v` are the optimizer's
 * per-parameter state (momentum buffer; exp_avg and exp_avg_sq), `step` Adam's step count. */
/* Adam's update of one parameter (p, its gradient g, moments m and v): written once, used on
 * reals and on vectors of reals. The scalars are cast to real, so that float32 modules compute
 * in float (and vector arithmetic takes them). */
#define ADAM_ELEMENT(SQRT, p, g, m, v)                                       \
    do {                                                                     \
        if (DECOUPLED_DECAY)                                                 \
            p = p * decay;                                                   \
        if (weight < 0.5)                                                    \
            m = m + weight * (ADAM_GRAD(p, g) - m);                          \
        else                                                                 \
            m = ADAM_GRAD(p, g) - (ADAM_GRAD(p, g) - m) * (real)(1.0 - weight); \
        v = v * (real)BETA2 + ((real)(1.0 - BETA2) * ADAM_GRAD(p, g)) * ADAM_GRAD(p, g); \
        p = p + (-step_size * m) / (SQRT(v) * inv_correction2_sqrt + (real)EPS); \
    } while (0)
/* Adam's L2 weight decay adds to the gradient (AdamW's decays p instead) */
#define ADAM_GRAD(p, g) (DECOUPLED_DECAY || WEIGHT_DECAY == 0.0 ? (g) : (g) + (real)WEIGHT_DECAY * (p))

/* Adam's pass over the parameters in vectors of `vec_t` (its square root SQRT, one per lane:
 * the C library's sqrt would set errno and serialise the loop); returns how many parameters it
 * stepped, whole vectors from the first (the rest are done one by one). A function per vector width, chosen when the
 * step runs (adam_vectors below), so that a build without -march=native still gets the widest
 * vectors the CPU has: this AMD EPYC's divider, which bounds the pass, does a 512-bit vector in
 * about the time of a 256-bit one (the pass over MNIST's 39,760 parameters: 31 us -> 16 us). */
typedef struct {
    real step_size, inv_correction2_sqrt, decay, weight;
} AdamScalars;
#if OPTIMIZER == 2 && defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__) /* GCC, Clang */
#define ADAM_VECTOR_PASSES 1
#include <immintrin.h>
#define ADAM_PASS(name, attributes, vec_t, SQRT)                                                   \
    static attributes long name(real *restrict p, real *restrict g, real *restrict m,              \
                                real *restrict v, AdamScalars k, int clear)                        \
    {                                                                                              \
        const real step_size = k.step_size, inv_correction2_sqrt = k.inv_correction2_sqrt,         \
                   decay = k.decay, weight = k.weight;                                             \
        const long lanes = (long)(sizeof(vec_t) / sizeof(real));                                   \
        long i = 0;                                                                                \
        for (; i + lanes <= N_PARAMS; i += lanes) {                                                \
            vec_t P, G, M, V;                                                                      \
            memcpy(&P, p + i, sizeof P);                                                           \
            memcpy(&G, g + i, sizeof G);                                                           \
            memcpy(&M, m + i, sizeof M);                                                           \
            memcpy(&V, v + i, sizeof V);                                                           \
            ADAM_ELEMENT(SQRT, P, G, M, V);                                                        \
            memcpy(p + i, &P, sizeof P);                                                           \
            memcpy(m + i, &M, sizeof M);                                                           \
            memcpy(v + i, &V, sizeof V);                                                           \
            if (clear)                                                                             \
                memset(g + i, 0, sizeof G);                                                        \
        }                                                                                          \
        (void)decay;                                                                               \
        return i;                                                                                  \
    }
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
ADAM_PASS(adam_pass_sse2, , vec16, SQRT16)
ADAM_PASS(adam_pass_avx, __attribute__((target("avx"))), vec32, SQRT32)
ADAM_PASS(adam_pass_avx512, __attribute__((target("avx512f"))), vec64, SQRT64)
#endif

static long adam_vectors(real *p, real *g, real *m, real *v, AdamScalars k, int clear)
{
#ifdef ADAM_VECTOR_PASSES
#ifndef ADAM_VECTOR_BYTES /* the widest the CPU has (tests/test_optim.py sets it, to hold each pass) */
#define ADAM_VECTOR_BYTES (__builtin_cpu_supports("avx512f") ? 64 : __builtin_cpu_supports("avx") ? 32 : 16)
#endif
    switch (ADAM_VECTOR_BYTES) {
    case 64: return adam_pass_avx512(p, g, m, v, k, clear);
    case 32: return adam_pass_avx(p, g, m, v, k, clear);
    default: return adam_pass_sse2(p, g, m, v, k, clear);
    }
#else /* TCC, other CPUs (or no Adam): the parameters one by one */
    (void)p, (void)g, (void)m, (void)v, (void)k, (void)clear;
    return 0;
#endif
}

/* Subnormal numbers: a parameter whose gradient stays 0 has its momentum buffer or Adam moments
 * decay geometrically into subnormals (m at 0.9 a step: after ~6,700 steps in float64, ~750 in
 * float32), and x86 CPUs take microcode assists on them: Adam's update over MNIST's 39,760
 * parameters went from 31 us to 55-240 us once they appeared. So the steps that keep state run
 * with subnormals flushed to zero (MXCSR's FTZ and DAZ bits, the caller's mode restored after).
 * What that changes: a moment below the smallest normal number (2.2e-308; float32 1.2e-38) reads
 * as 0, and a parameter moves by step_size * m / (sqrt(v) + eps) <= lr * 1.2e-38 / 1e-8 less,
 * which rounds away unless the parameter is within 1e-26 of 0 (tests/test_optim.py: the steps
 * still follow PyTorch's formulas, to 1e-12 in float64). Elsewhere than x86-64, a no-op.
 * stmxcsr (%rax) and ldmxcsr (%rax) are spelled as bytes, which TCC's assembler takes too. */
static unsigned int flush_subnormals(void)
{
    unsigned int mode = 0;
#if defined(__x86_64__)
    unsigned int flushing;
    __asm__ volatile("movq %0, %%rax\n\t.byte 0x0f, 0xae, 0x18" : : "r"(&mode) : "rax", "memory");
    flushing = mode | 0x8040; /* FTZ (bit 15) and DAZ (bit 6) */
    __asm__ volatile("movq %0, %%rax\n\t.byte 0x0f, 0xae, 0x10" : : "r"(&flushing) : "rax", "memory");
#endif
    return mode;
}

static void restore_fp_mode(unsigned int mode)
{
#if defined(__x86_64__)
    __asm__ volatile("movq %0, %%rax\n\t.byte 0x0f, 0xae, 0x10" : : "r"(&mode) : "rax", "memory");
#else
    (void)mode;
#endif
}

/* With `clear` the step also zeroes the gradients, in the same pass (train(): the next batch
 * starts from zero). It is a constant at each call, so the step is compiled once each way. */
#if defined(__GNUC__) && !defined(__TINYC__)
#define SPECIALISED __attribute__((always_inline)) inline
#else
#define SPECIALISED inline
#endif
static SPECIALISED void optimizer_step(real *restrict p, real *restrict g, real *restrict m,
                                       real *restrict v, real *step, double lr, int clear)
{
    const real rate = (real)lr;
    const unsigned int fp_mode = OPTIMIZER != 0 ? flush_subnormals() : 0;
    if (OPTIMIZER == 0) {
        for (long i = 0; i < N_PARAMS; i++) {
            real grad = WEIGHT_DECAY != 0.0 ? g[i] + (real)WEIGHT_DECAY * p[i] : g[i];
            p[i] = p[i] + -rate * grad;
            if (clear)
                g[i] = 0;
        }
    } else if (OPTIMIZER == 1) {
        /* PyTorch starts the buffer as a copy of the first gradient: momentum * 0 + grad is that. */
        for (long i = 0; i < N_PARAMS; i++) {
            real grad = WEIGHT_DECAY != 0.0 ? g[i] + (real)WEIGHT_DECAY * p[i] : g[i];
            m[i] = m[i] * (real)MOMENTUM + grad;
            grad = NESTEROV ? grad + (real)MOMENTUM * m[i] : m[i];
            p[i] = p[i] + -rate * grad;
            if (clear)
                g[i] = 0;
        }
    } else {
        double t = *step += 1;
        const real step_size = (real)(lr / (1.0 - pow(BETA1, t)));
        /* PyTorch divides by sqrt(1 - beta2^t); multiplying by its reciprocal is at most an ulp
         * away and spares a division per parameter, which is what bounds this loop. */
        const real inv_correction2_sqrt = (real)(1.0 / sqrt(1.0 - pow(BETA2, t)));
        const real decay = (real)(1.0 - lr * WEIGHT_DECAY); /* AdamW's decoupled decay */
        const real weight = (real)(1.0 - BETA1);            /* torch's lerp(m, grad, 1 - beta1) */
        const AdamScalars k = {step_size, inv_correction2_sqrt, decay, weight};
        long i = adam_vectors(p, g, m, v, k, clear);
        for (; i < N_PARAMS; i++) {
            ADAM_ELEMENT(real_sqrt, p[i], g[i], m[i], v[i]);
            if (clear)
                g[i] = 0;
        }
    }
    if (OPTIMIZER != 0)
        restore_fp_mode(fp_mode);
}
