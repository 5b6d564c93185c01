/* What every generated C file starts with: the op table's primitives and the kernels that
 * fused dot products call. Spliced into templates/model.c, templates/runtime.c and each extra unit. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* A sequence's program (codegen/write/contract.py's Prelude: VECTORISE_LOOPS) runs most of its
 * step in loops over positions, keys and heads whose counts are read at run time, which GCC's -O2
 * leaves scalar (its "very cheap" cost model vectorises no loop that needs a remainder); its
 * "cheap" model vectorises them, the same bits: microgpt's step 0.94x, the compile of its units
 * 1.4x the CPU (Zen 3). Clang vectorises them already (INDEPENDENT, below); other programs' C,
 * whose loops over layers are kernels, is left to -O2. Their backward sets each gradient back to
 * 0 in the loop that reads it (codegen/write/backward.py's Plain): GCC would split those stores
 * into loops of their own, or `rep stos` calls, which cost more than they save at a few
 * positions (microgpt's step 1.15x with them, Zen 3); so no loop distribution. */
#if defined(VECTORISE_LOOPS) && defined(__GNUC__) && !defined(__clang__) && !defined(__TINYC__)
#pragma GCC optimize("vect-cost-model=cheap", "no-tree-loop-distribute-patterns", "no-tree-loop-distribution")
#endif

/* The element type of every slot, kernel and optimizer state: codegen/write/contract.py's Prelude
 * sets REAL_IS_FLOAT before this file (dtype="float32": float, else double). The op table's
 * primitives go through real_exp, real_log, real_tanh and real_pow in float mode (the emitter
 * renames them), so that float code calls expf & co. instead of widening to double. What the
 * generated C must define before this file is checked here: `#if` would read a missing one as 0. */
#ifndef REAL_IS_FLOAT
#error "REAL_IS_FLOAT must be defined before templates/prelude.c (codegen/write/contract.py's Prelude)"
#endif
#ifndef HAVE_THREAD_POOL
#error "HAVE_THREAD_POOL must be defined before templates/prelude.c (codegen/write/contract.py's Prelude)"
#endif
#ifndef RUNTIME_PRODUCTS /* where the matrix products are defined (templates/kernels/gemm.c): 0 here, static */
#define RUNTIME_PRODUCTS 0
#endif
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
#define SHARED_KERNEL __attribute__((noinline, aligned(64), visibility("hidden"))) /* (a module's runtime's) */
#define EPILOGUE __attribute__((unused)) static /* (defined in every unit, called in some) */
#else
#define SHARED
#define CHUNK
#define KERNEL static
#define SHARED_KERNEL
#define EPILOGUE static
#endif

/* Before a generated loop whose iterations are independent (a group's forward): vectorise it
 * without run-time overlap checks, which compilers give up on when a loop reads many arrays.
 * Clang: and do not unroll the vector loop as well; the batched program's many short loops over
 * the batch, each unrolled, doubled its compile time (the zoo's CNN: 2.0 -> 1.0 s, -O3 native). */
#if defined(__clang__)
/* where vectorising does not pay (a short loop, a call inside), Clang would warn that it did not */
#pragma clang diagnostic ignored "-Wpass-failed"
#define INDEPENDENT _Pragma("clang loop vectorize(assume_safety) unroll(disable)")
#elif defined(__GNUC__) && !defined(__TINYC__)
#define INDEPENDENT _Pragma("GCC ivdep")
#else
#define INDEPENDENT
#endif

/* The op table's `powk(a, k)` primitive, a ** k for a number k (micrograd_c/ops.py's _powk, term
 * for term): the exponents micrograd's idioms use written out (`/` is `* y ** -1`), pow() for the
 * others; with k a literal the compiler keeps one branch. (In float mode too: it calls real_pow.) */
static inline real powk(real a, real k)
{
    return k == 2 ? a * a : k == -1 ? 1 / a : k == -2 ? 1 / (a * a) : k == -0.5 ? 1 / real_sqrt(a)
         : k == -1.5 ? 1 / (a * real_sqrt(a)) : real_pow(a, k);
}

/* The op table's `where(cond, x, y)` primitive. */
#define where(c, x, y) ((c) ? (x) : (y))
/* and `positive(x)`, 1 where x > 0 else 0, as a real: (x > 0) would be an int, which Clang turned
 * into a real lane by lane through integer conversions in ReLU's gradient */
#define positive(x) ((x) > 0 ? (real)1 : (real)0)

/* A loop over a sequence's positions first, first + 1, ... (first + n at most) cut where the sample
 * ends: `bound` is the sample's count of positions (codegen/lower/positions.py). */
static inline long upto(real bound, long first, long n)
{
    long m = (long)bound - first;
    return m < 0 ? 0 : m < n ? m : n;
}

/* How many of a pass's first n positions all `capacity` samples reach (`active`: each position's
 * count, templates/batch.c's longest_first): a product's calls for those positions are one call
 * over their samples side by side (codegen/write/loops.py's per_pass). */
static inline long full_positions(const real *active, long n, long capacity)
{
    long p = 0;
    while (p < n && (long)active[p] == capacity)
        p++;
    return p;
}

/* A gather's index (an input holding an integer, checked against -n..n-1 before any forward by
 * templates/samples.c's check_index) as the position it picks among n, as Python's
 * indexing does. */
static inline long gather_index(double x, long n) { return (long)x < 0 ? (long)x + n : (long)x; }

/* A maximum's position (the op table's MAXIMUM, a chain of `max` in one): of n values at x[k * step]
 * (largest_at) or x[offsets[k]] (largest_in), the first of the largest, as the chain's
 * where(best < x, x, best) keeps it; the same bits as the chain, and its gradient's place. */
static inline long largest_at(const real *x, long step, long n)
{
    long k = 0;
    real best = x[0]; /* x[k * step], in a register: a chain of compares, not of loads */
    for (long i = 1; i < n; i++)
        if (best < x[i * step])
            best = x[i * step], k = i;
    return k;
}

static inline long largest_in(const real *x, const int32_t *offsets, long n)
{
    long k = 0;
    real best = x[offsets[0]];
    for (long i = 1; i < n; i++)
        if (best < x[offsets[i]])
            best = x[offsets[i]], k = i;
    return k;
}

/* A family's short lists that grow with its outer loop (codegen/lower/vector.py's _families, a
 * causal attention's t + 1 keys): a loop the C compiler sees through, in the list's order, where
 * a call of dot() and the like would cost more than the few terms it sums (microgpt's step, 13%). */
static inline real dot_short(const real *a, const real *b, long n)
{
    real s = 0;
    for (long k = 0; k < n; k++)
        s += a[k] * b[k];
    return s;
}

static inline real sum_short(const real *x, long n)
{
    real s = 0;
    for (long k = 0; k < n; k++)
        s += x[k];
    return s;
}

static inline void axpy_short(real *restrict y, real alpha, const real *restrict x, long n)
{
    for (long k = 0; k < n; k++)
        y[k] += alpha * x[k];
}

static inline void add_short(real *y, real alpha, long n)
{
    for (long k = 0; k < n; k++)
        y[k] += alpha;
}

/*@INCLUDE kernels/dot.c@*/

/*@INCLUDE kernels/rows.c@*/

/* A product's rows run on the module's threads (templates/pool.c, defined in the module's own
 * unit); exported C (codegen.export: no Python, perhaps no libc) runs them in the caller. */
typedef void (*RowTask)(void *args, long first, long last);
/* rows [first, last) of a product's part `part` of `parts` (parallel_pipeline) */
typedef void (*PartTask)(void *args, long first, long last, int part, int parts);
#if HAVE_THREAD_POOL
SHARED void parallel_rows(RowTask task, void *args, long rows, long align);
SHARED void parallel_shares(RowTask task, void *args, long rows, long align);
SHARED void parallel_pipeline(PartTask task, PartTask then, void *args, long rows, long align, long terms,
                              long terms_align);
SHARED void parallel_share(long rows, long align, int part, int parts, long *first, long *last);
SHARED int pool_parts(void); /* the threads a product runs on */
#else
static int pool_parts(void)
{
    return 1;
}

static void parallel_rows(RowTask task, void *args, long rows, long align)
{
    (void)align;
    task(args, 0, rows);
}
#define parallel_shares parallel_rows

static void parallel_pipeline(PartTask task, PartTask then, void *args, long rows, long align, long terms,
                              long terms_align)
{
    (void)align, (void)terms, (void)terms_align;
    task(args, 0, rows, 0, 1);
    if (then)
        then(args, 0, 0, 0, 1);
}

static void parallel_share(long rows, long align, int part, int parts, long *first, long *last)
{
    (void)align, (void)part, (void)parts;
    *first = 0, *last = rows;
}
#endif

/* The vector instructions this CPU runs, asked once (CPUID, and XGETBV for the OS saving the
 * registers: AVX's and AVX-512's need both): CPU_AVX, CPU_AVX2_FMA (AVX2 with FMA), CPU_AVX512F.
 * The products (kernels/gemm.c) and Adam's passes (optim.c) take the widest when they are built
 * without -march=native. Read directly: zig's compiler-rt answers __builtin_cpu_supports with 0,
 * which left its builds on the plain loops. */
enum { CPU_AVX = 1, CPU_AVX2_FMA = 2, CPU_AVX512F = 4 };
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__TINYC__) /* GCC, Clang, zig */
#include <cpuid.h>
static inline int cpu_features(void)
{
    static int features = -1; /* every thread that asks gets the same */
    if (features < 0) {
        unsigned a, b, c, d, found = 0;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_OSXSAVE)) {
            const unsigned leaf1 = c;
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0)); /* XCR0: the state the OS saves */
            const int ymm = (lo & 0x6) == 0x6, zmm = ymm && (lo & 0xe0) == 0xe0; /* SSE+AVX; opmask, zmm */
            unsigned leaf7 = 0; /* EBX of leaf 7: AVX2, AVX-512F */
            if (__get_cpuid_max(0, 0) >= 7) {
                __cpuid_count(7, 0, a, b, c, d);
                leaf7 = b;
            }
            if (ymm && (leaf1 & bit_AVX))
                found |= CPU_AVX;
            if (ymm && (leaf1 & bit_FMA) && (leaf7 & bit_AVX2))
                found |= CPU_AVX2_FMA;
            if (zmm && (leaf7 & bit_AVX512F))
                found |= CPU_AVX512F;
        }
        features = (int)found;
    }
    return features;
}
#else
static inline int cpu_features(void)
{
    return 0;
}
#endif

/* A function (UNFUSED_FUNCTION) whose body starts with UNFUSED rounds each multiply and add on
 * its own, even where it is built for a CPU that fuses them (-march=native, or a target
 * attribute: AVX-512's implies FMA): the same bits as the plain build's. */
#if defined(__clang__)
#define UNFUSED _Pragma("clang fp contract(off)")
#define UNFUSED_FUNCTION
#elif defined(__GNUC__) && !defined(__TINYC__)
#define UNFUSED
#define UNFUSED_FUNCTION __attribute__((optimize("fp-contract=off")))
#else
#define UNFUSED
#define UNFUSED_FUNCTION
#endif

/*@INCLUDE kernels/gemm.c@*/

/*@INCLUDE kernels/exp.c@*/

/*@INCLUDE kernels/conv.c@*/

/*@INCLUDE kernels/axpy.c@*/

/*@INCLUDE kernels/sparse.c@*/

/* The table form's loops over a segment of a model's rows (codegen/write/table.py): defined by the
 * module runtime (templates/table.c), called by the passes of a model in that form. */
SHARED void table_forward(const int32_t *restrict w, real *restrict d);
SHARED void table_backward(const int32_t *restrict w, real *restrict d, real *restrict g);
