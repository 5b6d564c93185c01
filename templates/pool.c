/* ---- the module's threads ------------------------------------------------------------------
 * parallel_rows(task, args, M, align) runs task(args, first, last) over rows [0, M) cut into
 * chunks of whole blocks of `align` rows (POOL_CHUNKS per thread), which the caller's thread and
 * the workers take in turn until none is left: the matrix products of a batch
 * (templates/kernels/gemm.c) run on every core, and a thread that is slower (a core busy with
 * another process, data in the other core's cache, a late wake-up) takes fewer chunks instead of
 * holding the others up; parallel_shares(task, args, M, align) calls task once a thread, over
 * the chunks that thread takes first (its share: the rows it had in the products before);
 * parallel_pipeline(task, args, M, align, J, j_align) runs a product whose sum's terms are
 * another product's rows (a layer's inputs' gradients sum over its neurons, whose weights' rows
 * the layer's other two products share out) in parts: part t sums the terms of thread t's share
 * of those J rows (gemm.c's gemm_pipeline_share), on every chunk of the M rows in turn, after
 * part t - 1 did that chunk, so that each core reads only the weights' rows it owns and a
 * chunk's partial sums are what moves between the cores (see gemm.c's gemm); with `then`,
 * then(args, 0, 0, t, parts) once part t is done on every chunk (the layer's weights' gradients
 * on thread t's share of their rows, which the parts after t no longer read: matmul_acc_nt).
 * Which thread takes a chunk varies, but no row's result does (each row is computed whole, in
 * one chunk, or its sum continued part after part in the terms' order), so the numbers are the
 * same with any count. The workers are started on first use and wait on a condition variable
 * between products, spinning a little first, and only spin while train() or predict() holds them
 * (pool_hold) and a product has run on them since (parallel_rows, a sequence's pieces side by side
 * among them; not the batch's memory passes, parallel_pass): a batch's products follow each other
 * within microseconds, and waking a sleeping thread takes tens of them, but a program whose
 * products are all too small to share and runs in one piece (microgpt at 8 documents a step)
 * would keep a core spinning for nothing from one step's clearing of its gradients to the next.
 * One pool serves every load of this code: a
 * caller that finds it busy (another module of the same build on another thread) runs its rows
 * alone. */
#define POOL_MAX 64
#define POOL_SPIN 256 /* pauses (~10 us) before a waiting thread yields or sleeps */
#define POOL_HOLD_YIELDS 2000 /* then, while held, sched_yield()s (~2 ms) before it sleeps */
/* chunks per thread: each taken under the lock, whose cache line moves between the cores (~120 ns
 * on an Intel Xeon VM); 4 rather than 8: MNIST's MLP(784, [512, 256, 10]) float32 on 2 threads,
 * train() at B = 32 0.965-0.978x the time, B = 128 0.99-1.00x, predict 0.99x, the zoo's CNN
 * 0.98-0.99x, the bigger GPT 0.99x (one process alternating the builds) */
#define POOL_CHUNKS 4
/* a pipeline's chunks per thread (parallel_pipeline): the part after the first starts once the
 * first part is done on the first chunk, and each part chases the one before it chunk by chunk,
 * so smaller chunks shorten the wait. MLP(784, [512, 256, 10]) float32 at B = 32 on 2 threads, AMD
 * Zen 5 (2 vCPUs): 8 with GEMM_PIPELINE_FIRST 530 (gemm.c) 0.965-0.972x the time of 4 with 560
 * (the worker's wait for the first chunk 9.1 -> 5.6 K cycles; our processes' windows taken in
 * turn, 20 rounds); 12: 0.974x */
#define POOL_PIPELINE_CHUNKS 8

typedef struct {
    pthread_mutex_t user;  /* held by the caller of parallel_rows that has the workers */
    pthread_mutex_t lock;  /* guards the fields below */
    pthread_cond_t wake, done;
    pthread_t threads[POOL_MAX];
    int started, stopping, parts; /* parts: the threads that take chunks of this product */
    volatile int holding;  /* pool_hold: spin between products instead of sleeping, */
    volatile int products; /* once a product has run on the workers since */
    pid_t pid;             /* the process that started the workers (a fork has none) */
    volatile unsigned long generation;
    unsigned long birth;   /* the generation before the one a new worker is started for */
    RowTask task;
    PartTask part_task, part_then; /* parallel_pipeline's (task 0) */
    void *args;
    unsigned int fp_mode;  /* the caller's floating-point mode, which the workers take for its product */
    long rows, align, chunks, cut; /* the chunks taken, and the pieces they are cut from (pool_run_chunks) */
    long first[POOL_MAX], end[POOL_MAX]; /* the chunks [first, end) of each thread's share not yet taken */
    volatile long finished; /* and its chunks done (a pipeline's chunks' parts) */
    volatile long stage[POOL_MAX * POOL_PIPELINE_CHUNKS]; /* a pipeline's chunks' parts done */
    long part_done[POOL_MAX];                     /* and each part's chunks done */
} Pool;

static Pool pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                    PTHREAD_COND_INITIALIZER};
SHARED int pool_threads = 1; /* threads a product runs on: set_threads() / threads= */

/* A spinning thread's pause (x86's `pause`, spelled as bytes for TCC's assembler). */
static void cpu_relax(void)
{
#if defined(__x86_64__)
    __asm__ volatile(".byte 0xf3, 0x90" ::: "memory");
#else
    __asm__ volatile("" ::: "memory");
#endif
}

/* The floating-point mode (x86-64's MXCSR; elsewhere none: 0, and setting it a no-op), read and
 * set, and the mode that flushes subnormal numbers to zero (FTZ, bit 15, and DAZ, bit 6).
 * stmxcsr (%rax) and ldmxcsr (%rax) are spelled as bytes, which TCC's assembler takes too. A
 * module computes with subnormals flushed (templates/threads.c's lock_state), and every thread
 * that runs a share of its work takes its caller's mode (pool_worker), so that the numbers are
 * the same with any count of threads. */
#define FLUSHING_SUBNORMALS(mode) ((mode) | 0x8040u)
static unsigned int fp_mode(void)
{
    unsigned int mode = 0;
#if defined(__x86_64__)
    __asm__ volatile("movq %0, %%rax\n\t.byte 0x0f, 0xae, 0x18" : : "r"(&mode) : "rax", "memory");
#endif
    return mode;
}

static void set_fp_mode(unsigned int mode)
{
#if defined(__x86_64__)
    __asm__ volatile("movq %0, %%rax\n\t.byte 0x0f, 0xae, 0x10" : : "r"(&mode) : "rax", "memory");
#else
    (void)mode;
#endif
}

/* While held (train() and predict() over batches), the workers spin between products. */
static void pool_hold(int on)
{
    pool.holding = on;
    pool.products = 0;
}

/* The next chunk of product `generation` for thread `part`: the first of its own share, else
 * the last of the largest share left (a thread that is slower, or woke late, is helped from the
 * end of its share); -1 when none is left, or the product is over (a worker that wakes late finds
 * the next product's shares, and leaves them alone). Called with the lock held. */
static long pool_next_chunk(unsigned long generation, int part)
{
    if (pool.generation != generation)
        return -1;
    if (pool.first[part] < pool.end[part])
        return pool.first[part]++;
    int most = 0;
    for (int q = 1; q < pool.parts; q++)
        if (pool.end[q] - pool.first[q] > pool.end[most] - pool.first[most])
            most = q;
    return pool.first[most] < pool.end[most] ? --pool.end[most] : -1;
}

/* The pieces rows are cut into among `parts` threads: whole blocks of `align` rows, `per_thread`
 * a thread (fewer if there are fewer blocks). */
static long pool_cut(long rows, long align, int parts, int per_thread)
{
    const long blocks = (rows + align - 1) / align;
    return blocks < (long)parts * per_thread ? blocks : (long)parts * per_thread;
}

/* The rows [*first, *last) of chunk c of `chunks`: the cut's pieces [cut * c / chunks, cut * (c +
 * 1) / chunks), a piece p of `cut` the blocks from blocks * p / cut. */
static void pool_chunk_rows(long rows, long align, long chunks, long cut, long chunk, long *first, long *last)
{
    const long blocks = (rows + align - 1) / align;
    *first = blocks * (cut * chunk / chunks) / cut * align;
    *last = blocks * (cut * (chunk + 1) / chunks) / cut * align;
    if (*last > rows)
        *last = rows;
}

/* Thread `part` of `parts`' share of rows cut in blocks of align (parallel_shares'): the rows
 * parallel_rows gives it first. */
SHARED void parallel_share(long rows, long align, int part, int parts, long *first, long *last)
{
    pool_chunk_rows(rows, align, parts, pool_cut(rows, align, parts, POOL_CHUNKS), part, first, last);
}

/* Runs chunks of product `generation` until none is left. */
static void pool_run_chunks(unsigned long generation, int part, RowTask task, void *args, long rows, long align,
                            long chunks, long cut)
{
    pthread_mutex_lock(&pool.lock);
    for (long chunk; (chunk = pool_next_chunk(generation, part)) >= 0;) {
        pthread_mutex_unlock(&pool.lock);
        long first, last;
        pool_chunk_rows(rows, align, chunks, cut, chunk, &first, &last);
        task(args, first, last);
        pthread_mutex_lock(&pool.lock);
        if (++pool.finished == chunks)
            pthread_cond_signal(&pool.done);
    }
    pthread_mutex_unlock(&pool.lock);
}

/* A pipeline's (parallel_pipeline): thread `me` runs its part on the chunks in order (chunk c
 * once part - 1 is done on it), then the chunks of a part whose thread has not started (a late
 * wake-up, a busy core), from its end; not those of a part under way: what a part reads (its
 * weights' rows) would move to the other core, and the product after it (which steps them)
 * would wait for them (MLP(784, [512, 256, 10]) at B = 32, Intel Xeon with AVX-512, 2 vCPUs:
 * the second layer's weights' gradients took 1.5x as long when the caller helped the worker's
 * part). The shares of chunks in first[]/end[] are the parts'. */
static void pool_run_parts(unsigned long generation, int me, PartTask task, void *args, long rows, long align,
                           long chunks, long cut)
{
    pthread_mutex_lock(&pool.lock);
    for (;;) {
        if (pool.generation != generation)
            break;
        int part = me;
        if (pool.first[part] >= pool.end[part])
            for (int q = 0; q < pool.parts; q++)
                if (pool.first[q] == 0 && pool.end[q] > pool.end[part] - pool.first[part])
                    part = q;
        if (pool.first[part] >= pool.end[part])
            break;
        const long chunk = part == me ? pool.first[part]++ : --pool.end[part];
        pthread_mutex_unlock(&pool.lock);
        for (long spin = 0; pool.stage[chunk] < part; spin++) /* (its earlier parts end in order) */
            if (spin < POOL_SPIN)
                cpu_relax();
            else
                sched_yield();
        pthread_mutex_lock(&pool.lock); /* (and their sums are seen) */
        pthread_mutex_unlock(&pool.lock);
        long first, last;
        pool_chunk_rows(rows, align, chunks, cut, chunk, &first, &last);
        task(args, first, last, part, pool.parts);
        pthread_mutex_lock(&pool.lock);
        pool.stage[chunk] = part + 1;
        const long total = chunks * pool.parts + (pool.part_then ? pool.parts : 0);
        if (++pool.part_done[part] == chunks && pool.part_then) { /* (its last chunk: the part's then) */
            pthread_mutex_unlock(&pool.lock);
            pool.part_then(args, 0, 0, part, pool.parts);
            pthread_mutex_lock(&pool.lock);
            ++pool.finished;
        }
        if (++pool.finished == total)
            pthread_cond_signal(&pool.done);
    }
    pthread_mutex_unlock(&pool.lock);
}

static void *pool_worker(void *arg)
{
    const int part = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    unsigned long seen = pool.birth;
    for (;;) {
        while (pool.generation == seen && !pool.stopping) {
            pthread_mutex_unlock(&pool.lock);
            for (long spin = 0; (spin < POOL_SPIN || (pool.holding && pool.products
                                                      && spin < POOL_SPIN + POOL_HOLD_YIELDS))
                                && pool.generation == seen && !pool.stopping; spin++)
                if (spin < POOL_SPIN)
                    cpu_relax();
                else /* held: still polling, but giving way to any thread that has work (the caller's) */
                    sched_yield();
            pthread_mutex_lock(&pool.lock);
            if (pool.generation == seen && !pool.stopping)
                pthread_cond_wait(&pool.wake, &pool.lock);
        }
        if (pool.stopping)
            break;
        seen = pool.generation;
        const int parts = pool.parts;
        RowTask task = pool.task;
        PartTask part_task = pool.part_task;
        void *args = pool.args;
        const long rows = pool.rows, align = pool.align, chunks = pool.chunks, cut = pool.cut;
        if (fp_mode() != pool.fp_mode)
            set_fp_mode(pool.fp_mode);
        pthread_mutex_unlock(&pool.lock);
        if (part < parts && part_task)
            pool_run_parts(seen, part, part_task, args, rows, align, chunks, cut);
        else if (part < parts)
            pool_run_chunks(seen, part, task, args, rows, align, chunks, cut);
        pthread_mutex_lock(&pool.lock);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

/* Stops and joins the workers (the module's code may go away after: libtcc frees it). */
static void pool_stop(void)
{
    pthread_mutex_lock(&pool.user);
    pthread_mutex_lock(&pool.lock);
    int started = pool.pid == getpid() ? pool.started : 0;
    pool.stopping = 1;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    for (int t = 1; t < started; t++)
        pthread_join(pool.threads[t], NULL);
    pool.started = 0;
    pool.stopping = 0;
    pthread_mutex_unlock(&pool.user);
}

/* Starts workers up to `threads` in all (the caller counting as one); how many there are. */
static int pool_start(int threads)
{
    if (pool.pid != getpid()) /* a forked child: its parent's workers are not here */
        pool.started = 0, pool.pid = getpid();
    if (pool.started == 0)
        pool.started = 1;
    pool.birth = pool.generation;
    while (pool.started < threads) {
        if (pthread_create(&pool.threads[pool.started], NULL, pool_worker, (void *)(intptr_t)pool.started) != 0)
            break;
        pool.started++;
    }
    return pool.started;
}

SHARED int pool_parts(void)
{
    return pool_threads < 1 ? 1 : pool_threads > POOL_MAX ? POOL_MAX : pool_threads;
}

/* parallel_rows, parallel_pass and parallel_pipeline: `product` says which of the first two (see
 * pool_hold); with `shares`, each thread's share as one chunk (parallel_shares); with a
 * part_task, a pipeline over `threads` parts (at most), each part every chunk. */
static void pool_run(RowTask task, PartTask part_task, PartTask part_then, void *args, long rows, long align,
                     int threads, int product, int shares)
{
    if (threads > pool_parts())
        threads = pool_parts();
    if (!part_task && threads > (rows + align - 1) / align)
        threads = (int)((rows + align - 1) / align);
    if (threads <= 1 || pthread_mutex_trylock(&pool.user) != 0) {
        if (part_task)
            part_task(args, 0, rows, 0, 1);
        else
            task(args, 0, rows);
        if (part_then)
            part_then(args, 0, 0, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    const int parts = pool_start(threads) < threads ? pool.started : threads;
    const long cut = pool_cut(rows, align, parts, part_task ? POOL_PIPELINE_CHUNKS : POOL_CHUNKS);
    const long chunks = shares ? parts : cut;
    pool.task = task, pool.part_task = part_task, pool.part_then = part_then, pool.args = args, pool.rows = rows;
    pool.fp_mode = fp_mode();
    pool.align = align;
    pool.chunks = chunks, pool.cut = cut, pool.parts = parts;
    for (int part = 0; part < parts; part++) {
        pool.first[part] = part_task ? 0 : chunks * part / parts;
        pool.end[part] = part_task ? chunks : chunks * (part + 1) / parts;
    }
    for (long chunk = 0; part_task && chunk < chunks; chunk++)
        pool.stage[chunk] = 0;
    for (int part = 0; part < parts; part++)
        pool.part_done[part] = 0;
    pool.finished = 0;
    if (product)
        pool.products = pool.holding;
    const unsigned long generation = ++pool.generation;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    const long total = part_task ? chunks * parts + (part_then ? parts : 0) : chunks;
    if (part_task)
        pool_run_parts(generation, 0, part_task, args, rows, align, chunks, cut);
    else
        pool_run_chunks(generation, 0, task, args, rows, align, chunks, cut);
    /* the chunks the workers took end within microseconds of this thread's last */
    for (long spin = 0; pool.finished < total; spin++)
        if (spin < POOL_SPIN)
            cpu_relax();
        else
            sched_yield();
    pthread_mutex_lock(&pool.lock);
    while (pool.finished < total)
        pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.user);
}

SHARED void parallel_rows(RowTask task, void *args, long rows, long align)
{
    pool_run(task, NULL, NULL, args, rows, align, POOL_MAX, 1, 0);
}

/* parallel_rows for a pass over memory (the batch buffers loaded and cleared, templates/batch.c;
 * an optimizer's step, optim.c's optimizer_step): the workers spin after it only if a product has
 * run on them (pool_hold). */
static inline void parallel_pass(RowTask task, void *args, long rows, long align)
{
    pool_run(task, NULL, NULL, args, rows, align, POOL_MAX, 0, 0);
}

/* parallel_rows with each thread's share of the rows in one call, task(args, first, last) over
 * the rows parallel_rows gives that thread first: a product whose rows go with another's (a
 * layer's weights' gradients with its forward product) finds their data in its core's cache; no
 * chunk is taken by another thread unless a thread is late to its whole share. */
SHARED void parallel_shares(RowTask task, void *args, long rows, long align)
{
    pool_run(task, NULL, NULL, args, rows, align, POOL_MAX, 1, 1);
}

/* rows [0, M) of a product over J terms, in parts (see the top): task(args, first, last, t,
 * parts) adds to rows [first, last) the terms of thread t's share of J rows cut in blocks of
 * j_align (the task's cut: gemm_pipeline_share), in order of t; the same sums as one pass over
 * all terms, when the task continues each from where the part before left it. then (or NULL):
 * then(args, 0, 0, t, parts) once part t is done on every row. */
SHARED void parallel_pipeline(PartTask task, PartTask then, void *args, long rows, long align, long terms,
                              long terms_align)
{
    pool_run(NULL, task, then, args, rows, align, (int)((terms + terms_align - 1) / terms_align), 1, 0);
}

/* The default thread count: $MICROGRAD_C_THREADS if set (as OMP_NUM_THREADS for OpenMP), else
 * the cores this process may use (its CPU affinity). */
static int available_cores(void)
{
    const char *env = getenv("MICROGRAD_C_THREADS");
    if (env && atoi(env) > 0)
        return atoi(env) < POOL_MAX ? atoi(env) : POOL_MAX;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* ---- how many threads a batch runs on -----------------------------------------------------
 * More threads are not always faster: on this VM's 2 vCPUs MNIST's MLP(784, [512, 256, 10]) float32
 * at B = 32 took 0.6x one thread's time on two while the host kept the vCPUs near each other (a
 * cache line's round trip 75-135 ns), 0.95x while it kept them apart (350-440 ns), and the zoo's
 * CNN (float64, B = 32) 1.4-1.5x; a core busy with another process makes it worse. So train() times
 * its batches, with more than one thread asked for: THREAD_PROBE_STEPS batches on one thread, then
 * as many on all, each run's first untimed (it moves the weights the other threads read into this
 * core's cache, or back), and the batches after run on one thread if the median of its timed
 * batches (time a sample) was under THREAD_PROBE_MARGIN of the others'. The first probe starts at
 * the THREAD_PROBE_FIRST-th batch (a module's first batches touch its buffers for the first time),
 * the next THREAD_PROBE_PERIOD batches after one that chose all threads, and after one that chose
 * one thread sooner (THREAD_PROBE_FIRST batches, twice as many each time it chooses one again, up
 * to the period): a probe taken while another process held a core for a moment (in `make bench`,
 * the peers starting beside ours) chose one thread where two ran at 1.9x. The numbers are the same
 * with any count (above), so only the time changes; a probe while two threads are faster costs
 * ~0.3% (5 batches of 1,024 at 1.6x). */
#define THREAD_PROBE_PERIOD 1024
#define THREAD_PROBE_FIRST 64
#define THREAD_PROBE_STEPS 5
#define THREAD_PROBE_MARGIN 0.95

typedef struct {
    long long batches;                          /* batches run with more than one thread asked for */
    long long probe, wait;                      /* the next probe's first batch (0: THREAD_PROBE_FIRST); */
                                                /* and the batches from a probe to the next */
    int one;                                    /* the last probe chose one thread */
    double times[2][THREAD_PROBE_STEPS - 1];    /* its timed batches' ms a sample: [0] one thread, [1] all */
} ThreadChoice;

/* Where batch `batches` falls in the next probe (0: its first batch; negative: before it). */
static inline long long probe_at(const ThreadChoice *c, long long batches)
{
    return batches - (c->probe ? c->probe : THREAD_PROBE_FIRST);
}

/* The threads the next batch runs on, of `threads` asked for. */
static inline int threads_for_batch(const ThreadChoice *c, int threads)
{
    const long long at = probe_at(c, c->batches);
    if (threads <= 1)
        return threads;
    if (at >= 0 && at < 2 * THREAD_PROBE_STEPS)
        return at < THREAD_PROBE_STEPS ? 1 : threads;
    return c->one ? 1 : threads;
}

/* The median of a probe's timed batches. */
static inline double median_of_probe(const double *times)
{
    enum { N = THREAD_PROBE_STEPS - 1 };
    double sorted[N];
    for (int i = 0; i < N; i++) { /* (insertion) */
        int j = i;
        for (; j > 0 && sorted[j - 1] > times[i]; j--)
            sorted[j] = sorted[j - 1];
        sorted[j] = times[i];
    }
    return N % 2 ? sorted[N / 2] : (sorted[N / 2 - 1] + sorted[N / 2]) / 2;
}

/* A batch with `threads` asked for (run on threads_for_batch's) took `ms` a sample. */
static inline void record_batch(ThreadChoice *c, int threads, double ms)
{
    if (threads <= 1)
        return;
    const long long at = probe_at(c, c->batches++);
    if (at < 0 || at >= 2 * THREAD_PROBE_STEPS || at % THREAD_PROBE_STEPS == 0)
        return;
    c->times[at / THREAD_PROBE_STEPS][at % THREAD_PROBE_STEPS - 1] = ms;
    if (at == 2 * THREAD_PROBE_STEPS - 1) {
        const int again = c->one;
        c->one = median_of_probe(c->times[0]) < THREAD_PROBE_MARGIN * median_of_probe(c->times[1]);
        c->wait = !c->one ? THREAD_PROBE_PERIOD
                : !again ? THREAD_PROBE_FIRST
                : c->wait * 2 < THREAD_PROBE_PERIOD ? c->wait * 2 : THREAD_PROBE_PERIOD;
        c->probe = c->batches + c->wait;
    }
}
