/* The machine's roofline, measured: L1 and L2 read and write bandwidth, L2 reads of scattered
 * chunks (the sparse first layer's), and multiply-add
 * throughput (float64 and float32, independent chains: the peak; one chain: the latency bound
 * of a dot product summed in one vector register). `make roofline` builds it with
 * $(CC) -O3 -march=native and runs it (then bench/blas.py, NumPy's GEMM on the same machine, the
 * check of the peak); docs/speed.md's "The roofline of one training step" uses it.
 *
 * "one chain": a dot product over L1-resident vectors summed in one vector register, the
 * accumulator each multiply-add waits for, as the dot kernels of templates/prelude.c sum.
 * Each figure is the best of REPEATS timed passes, timed by the CPU time of the thread that runs
 * it (CLOCK_THREAD_CPUTIME_ID): on a machine shared with other work the rate of the cycles it
 * got, which wall time under a load of 9 on 2 cores put at a fifth of the peak. Vectors are GCC/Clang vector types of the CPU's own width (-march=native: 64 bytes
 * with AVX-512, 32 with AVX, else 16), so that every accumulator is one register: a vector of
 * twice the width is two registers, and 12 chains of them on AVX2's 16 measured spills (4 G/s).
 */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__)
#define VECTOR_BYTES 64
#define VECTOR_NAME "AVX-512"
#elif defined(__AVX__)
#define VECTOR_BYTES 32
#define VECTOR_NAME "AVX"
#else
#define VECTOR_BYTES 16
#define VECTOR_NAME "SSE"
#endif
typedef double vd __attribute__((vector_size(VECTOR_BYTES)));
typedef float vf __attribute__((vector_size(VECTOR_BYTES)));
#define DOUBLES (VECTOR_BYTES / 8)
#define FLOATS (VECTOR_BYTES / 4)
/* independent multiply-add chains: enough to cover the latency (4 cycles) on two pipes (8), and
 * with the multiplier and addend within the registers (12 + 2 of 16) */
#define CHAINS 12
typedef double v8d __attribute__((vector_size(64))); /* a cache line (the chunks' reads) */
#define REPEATS 7
#define KEEP(p) __asm__ volatile("" : : "r"(p) : "memory") /* the compiler must do the stores */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* Bytes a second reading `bytes` of a buffer `passes` times: eight vector accumulators. */
static double read_bandwidth(const vd *x, size_t bytes, long passes, double *sink)
{
    size_t n = bytes / sizeof(vd);
    double best = 0;
    for (int r = 0; r < REPEATS; r++) {
        vd s[8] = {{0}};
        double t = now();
        for (long p = 0; p < passes; p++) {
            for (size_t i = 0; i < n; i += 8)
                for (int k = 0; k < 8; k++)
                    s[k] += x[i + k];
            KEEP(x);
        }
        t = now() - t;
        for (int k = 0; k < 8; k++)
            *sink += s[k][0];
        if ((double)bytes * passes / t > best)
            best = (double)bytes * passes / t;
    }
    return best;
}

static double write_bandwidth(vd *x, size_t bytes, long passes)
{
    size_t n = bytes / sizeof(vd);
    double best = 0;
    for (int r = 0; r < REPEATS; r++) {
        vd value = {0};
        value[0] = r;
        double t = now();
        for (long p = 0; p < passes; p++) {
            for (size_t i = 0; i < n; i++)
                x[i] = value;
            KEEP(x);
        }
        t = now() - t;
        if ((double)bytes * passes / t > best)
            best = (double)bytes * passes / t;
    }
    return best;
}

/* Bytes a second reading, as the sparse first layer does (templates/kernels/sparse.c's matvec), 64-byte
 * chunks of ROWS rows of ROW_LEN doubles (MNIST's W1: 50 rows of 784 weights and a bias, so the
 * rows are not aligned to cache lines), four rows at a time, at the chunk offsets of a list that
 * holds CHUNK_SHARE of the 98 chunks (MNIST: 40%), a pseudo-random draw; 314 KB in all, in L2. */
#define ROWS 48
#define ROW_LEN 785
#define CHUNK_SHARE 0.4
typedef double v8d_unaligned __attribute__((vector_size(64), aligned(8)));
static double chunk_read_bandwidth(long passes, double *sink)
{
    static double w[ROWS * ROW_LEN];
    int list[98], n = 0;
    unsigned seed = 12345;
    for (int c = 0; c < 98; c++) {
        seed = seed * 1103515245u + 12345u;
        if ((seed >> 16) % 1000 < CHUNK_SHARE * 1000)
            list[n++] = c;
    }
    for (int i = 0; i < ROWS * ROW_LEN; i++)
        w[i] = 1e-3 * (i % 97);
    double best = 0;
    for (int r = 0; r < REPEATS; r++) {
        v8d s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        double t = now();
        for (long p = 0; p < passes; p++) {
            for (int j = 0; j < ROWS; j += 4) {
                const double *w0 = w + j * ROW_LEN;
                for (int k = 0; k < n; k++) {
                    long o = 8L * list[k];
                    s0 += *(const v8d_unaligned *)(w0 + o);
                    s1 += *(const v8d_unaligned *)(w0 + ROW_LEN + o);
                    s2 += *(const v8d_unaligned *)(w0 + 2 * ROW_LEN + o);
                    s3 += *(const v8d_unaligned *)(w0 + 3 * ROW_LEN + o);
                }
            }
            KEEP(w);
        }
        t = now() - t;
        *sink += s0[0] + s1[0] + s2[0] + s3[0];
        if (64.0 * ROWS * n * passes / t > best)
            best = 64.0 * ROWS * n * passes / t;
    }
    return best;
}

/* Multiply-adds: CHAINS independent vector accumulators (a = a * m + c), `steps` times; and a
 * second of them, the best of REPEATS passes. */
#define FMA_LOOP(type, lanes, chains)                                                       \
    static void fma_steps_##type(long steps, double *sink)                                  \
    {                                                                                       \
        type a[chains], m, c;                                                               \
        for (int l = 0; l < lanes; l++) {                                                   \
            m[l] = 0.999999f;                                                               \
            c[l] = 1e-7f;                                                                   \
        }                                                                                   \
        for (int k = 0; k < chains; k++)                                                    \
            a[k] = m * (float)k;                                                            \
        for (long s = 0; s < steps; s++) {                                                  \
            for (int k = 0; k < chains; k++) /* no -ffast-math: nothing to fold */          \
                a[k] = a[k] * m + c;                                                        \
        }                                                                                   \
        for (int k = 0; k < chains; k++)                                                    \
            *sink += a[k][0];                                                               \
    }                                                                                       \
    static double fma_rate_##type(long steps, double *sink)                                 \
    {                                                                                       \
        double best = 0;                                                                    \
        for (int r = 0; r < REPEATS; r++) {                                                 \
            double t = now();                                                               \
            fma_steps_##type(steps, sink);                                                  \
            t = now() - t;                                                                  \
            if ((double)steps * chains * lanes / t > best)                                  \
                best = (double)steps * chains * lanes / t;                                  \
        }                                                                                   \
        return best;                                                                        \
    }
FMA_LOOP(vd, DOUBLES, CHAINS)
FMA_LOOP(vf, FLOATS, CHAINS)

/* Multiply-adds a second of s += x[i] * y[i] over 98 vectors (in L1), one accumulator: the
 * dependency chain of a dot product. */
#define DOT_CHAIN(type, lanes)                                                              \
    static double dot_chain_##type(long passes, double *sink)                               \
    {                                                                                       \
        static type x[98], y[98];                                                           \
        for (int i = 0; i < 98; i++)                                                        \
            for (int l = 0; l < lanes; l++) {                                               \
                x[i][l] = 1e-3f * (float)(i + l);                                           \
                y[i][l] = 1e-3f;                                                            \
            }                                                                               \
        double best = 0;                                                                    \
        for (int r = 0; r < REPEATS; r++) {                                                 \
            type s = {0};                                                                   \
            double t = now();                                                               \
            for (long p = 0; p < passes; p++) {                                             \
                for (int i = 0; i < 98; i++)                                                \
                    s += x[i] * y[i];                                                       \
                KEEP(x);                                                                    \
            }                                                                               \
            t = now() - t;                                                                  \
            *sink += s[0];                                                                  \
            if ((double)passes * 98 * lanes / t > best)                                     \
                best = (double)passes * 98 * lanes / t;                                     \
        }                                                                                   \
        return best;                                                                        \
    }
DOT_CHAIN(vd, DOUBLES)
DOT_CHAIN(vf, FLOATS)

/* The machine's multiply-add peak: fma_rate on every core at once (a thread each), summed: what
 * a batch's matrix products on the module's threads (templates/pool.c) can reach at most. */
typedef struct {
    int float32;
    long steps;
    double rate, sink;
} FmaThread;

static void *fma_thread(void *arg)
{
    FmaThread *t = (FmaThread *)arg;
    t->rate = t->float32 ? fma_rate_vf(t->steps, &t->sink) : fma_rate_vd(t->steps, &t->sink);
    return NULL;
}

/* body (fma_thread, fma_steps_thread) on `threads` threads at once: the sum of their rates */
static double on_threads(void *(*body)(void *), int float32, long steps, int threads, double *sink)
{
    pthread_t ids[64];
    FmaThread work[64];
    double total = 0;
    for (int i = 0; i < threads; i++) {
        work[i] = (FmaThread){float32, steps, 0, 0};
        pthread_create(&ids[i], NULL, body, &work[i]);
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(ids[i], NULL);
        total += work[i].rate;
        *sink += work[i].sink;
    }
    return total;
}

static double fma_rate_all_cores(int float32, long steps, int threads, double *sink)
{
    return on_threads(fma_thread, float32, steps, threads, sink);
}

/* Served (bench/peak.py, bench/windows.py's protocol): "ready", then for each line read one
 * window of multiply-adds on `threads` threads, each `seconds` long on a free core (the steps
 * calibrated once on one thread), and its rate in wall time (G/s): the machine's peak in the
 * same seconds as the windows of the runs it is set beside. */
static double wall(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void *fma_steps_thread(void *arg)
{
    FmaThread *t = (FmaThread *)arg;
    if (t->float32)
        fma_steps_vf(t->steps, &t->sink);
    else
        fma_steps_vd(t->steps, &t->sink);
    return NULL;
}

static int serve(int threads, int float32, double seconds)
{
    double sink = 0;
    const long probe = 1000000;
    double t = wall();
    FmaThread calibrate = {float32, probe, 0, 0};
    fma_steps_thread(&calibrate);
    t = wall() - t;
    const long steps = (long)(probe * seconds / t) + 1;
    const double per_step = (double)CHAINS * (float32 ? FLOATS : DOUBLES);
    printf("ready\n");
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        t = wall();
        on_threads(fma_steps_thread, float32, steps, threads, &sink);
        t = wall() - t;
        printf("%.3f\n", threads * steps * per_step / t / 1e9);
        fflush(stdout);
    }
    return sink == 12345.678 + calibrate.sink;
}

/* A cache line's round trip between two threads (the first two cores, wherever the OS puts
 * them): one writes it, the other waits for that and writes it back. A product shared between
 * the module's threads reads what the other core wrote at this cost a line (templates/kernels/
 * gemm.c's matmul_nt shares rows for it). ns a round trip: the median of PING_BATCHES batches of
 * PING_BATCH trips (the host stops a vCPU for milliseconds at a time, which a mean of all the trips
 * counts), the best of `passes` passes. This VM's host moves its vCPUs: on the AMD Zen 5 of
 * 2026-11-29 the median read 80-135 ns or 350-440 ns, switching several times within the hour, and
 * 2 threads' gain on MNIST's MLP at B = 32 with it (1.6x one thread's, 1.04x). */
static long ping_flag __attribute__((aligned(64)));
enum { PING_BATCH = 100, PING_BATCHES = 1000, PING_TRIPS = PING_BATCH * PING_BATCHES };
static void *ping_other(void *arg)
{
    const long base = *(const long *)arg;
    for (long i = 0; i < PING_TRIPS; i++) {
        while (__atomic_load_n(&ping_flag, __ATOMIC_ACQUIRE) != base + 2 * i + 1)
            ;
        __atomic_store_n(&ping_flag, base + 2 * i + 2, __ATOMIC_RELEASE);
    }
    return NULL;
}

static int compare_doubles(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double round_trip_ns(int passes)
{
    static long pass; /* (the flag's values go on from call to call) */
    static double batches[PING_BATCHES];
    double best = 1e30;
    for (int r = 0; r < passes; r++, pass++) {
        long base = 2L * PING_TRIPS * pass + 1;
        __atomic_store_n(&ping_flag, base, __ATOMIC_RELEASE);
        pthread_t other;
        if (pthread_create(&other, NULL, ping_other, &base) != 0)
            return 0;
        for (long k = 0; k < PING_BATCHES; k++) {
            const double t0 = wall();
            for (long i = k * PING_BATCH; i < (k + 1) * PING_BATCH; i++) {
                __atomic_store_n(&ping_flag, base + 2 * i + 1, __ATOMIC_RELEASE);
                while (__atomic_load_n(&ping_flag, __ATOMIC_ACQUIRE) != base + 2 * i + 2)
                    ;
            }
            batches[k] = (wall() - t0) / PING_BATCH * 1e9;
        }
        pthread_join(other, NULL);
        qsort(batches, PING_BATCHES, sizeof batches[0], compare_doubles);
        if (batches[PING_BATCHES / 2] < best)
            best = batches[PING_BATCHES / 2];
    }
    return best;
}

/* --serve-trips: as serve(), a round trip's ns a line (one pass: 10-40 ms) */
static int serve_round_trips(void)
{
    printf("ready\n");
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        printf("%.1f\n", round_trip_ns(1));
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--serve") == 0) { /* --serve THREADS float32|float64 SECONDS */
        const int threads = atoi(argv[2]);
        if (threads < 1 || threads > 64 || atof(argv[4]) <= 0) {
            fprintf(stderr, "usage: bandwidth [--serve THREADS float32|float64 SECONDS | --serve-trips] (1-64 threads)\n");
            return 2;
        }
        return serve(threads, strcmp(argv[3], "float32") == 0, atof(argv[4]));
    }
    if (argc == 2 && strcmp(argv[1], "--serve-trips") == 0)
        return serve_round_trips();
    double sink = 0;
    vd *buf = aligned_alloc(64, 1 << 20);
    memset(buf, 0, 1 << 20);
    struct { const char *name; size_t bytes; long passes; } levels[] = {
        {"L1 (16 KiB)", 16 << 10, 20000}, {"L2 (256 KiB)", 256 << 10, 1200},
    };
    printf("%-14s %14s %14s\n", "working set", "read GB/s", "write GB/s");
    for (int i = 0; i < 2; i++)
        printf("%-14s %14.1f %14.1f\n", levels[i].name,
               read_bandwidth(buf, levels[i].bytes, levels[i].passes, &sink) / 1e9,
               write_bandwidth(buf, levels[i].bytes, levels[i].passes) / 1e9);
    printf("%-14s %14.1f %14s   (64-byte chunks, 40%% of each row of 785 doubles, 4 rows at a time)\n",
           "L2 chunks", chunk_read_bandwidth(20000, &sink) / 1e9, "-");
    long steps = 20000000;
    long passes = 200000;
    printf("multiply-adds: vectors of %d bytes (%s), %d chains\n", VECTOR_BYTES, VECTOR_NAME, CHAINS);
    printf("multiply-adds  float64: %.1f G/s (%d chains), %.2f G/s (a dot in 1 chain of %d lanes)\n",
           fma_rate_vd(steps, &sink) / 1e9, CHAINS, dot_chain_vd(passes, &sink) / 1e9, DOUBLES);
    printf("multiply-adds  float32: %.1f G/s (%d chains), %.2f G/s (a dot in 1 chain of %d lanes)\n",
           fma_rate_vf(steps, &sink) / 1e9, CHAINS, dot_chain_vf(passes, &sink) / 1e9, FLOATS);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores < 1 ? 1 : cores > 64 ? 64 : (int)cores;
    printf("multiply-adds  float64: %.1f G/s on %d threads (%d chains each)\n",
           fma_rate_all_cores(0, steps, threads, &sink) / 1e9, threads, CHAINS);
    printf("multiply-adds  float32: %.1f G/s on %d threads (%d chains each)\n",
           fma_rate_all_cores(1, steps, threads, &sink) / 1e9, threads, CHAINS);
    if (threads > 1)
        printf("a cache line between two threads: %.0f ns a round trip\n", round_trip_ns(REPEATS));
    free(buf);
    return sink == 12345.678; /* keeps every result alive */
}
