/* ---- the module's threads ------------------------------------------------------------------
 * parallel_rows(task, args, M, align) runs task(args, first, last) over rows [0, M) cut into
 * `pool_threads` ranges of whole blocks of `align` rows, one per thread, the caller's thread
 * taking the first: the matrix products of a batch (templates/kernels/gemm.c) run on every core. The
 * cut depends on the thread count, but no row's result does (each row is computed whole by one
 * thread), so the numbers are the same with any count. The workers are started on first use and
 * wait on a condition variable between products, spinning a little first, and only spin while
 * train() or predict() holds them (pool_hold): a batch's products follow each other within
 * microseconds, and waking a sleeping thread takes tens of them. One pool serves every load of
 * this code: a caller that finds it busy (another module of the same build on another thread)
 * runs its rows alone. */
#define POOL_MAX 64
#define POOL_SPIN 256 /* pauses (~10 us) before a waiting thread yields or sleeps */
#define POOL_HOLD_YIELDS 2000 /* then, while held, sched_yield()s (~2 ms) before it sleeps */

typedef struct {
    pthread_mutex_t user;  /* held by the caller of parallel_rows that has the workers */
    pthread_mutex_t lock;  /* guards the fields below */
    pthread_cond_t wake, done;
    pthread_t threads[POOL_MAX];
    int started, stopping, parts;
    volatile int pending;  /* workers still on the current generation */
    volatile int holding;  /* pool_hold: spin between products instead of sleeping */
    pid_t pid;             /* the process that started the workers (a fork has none) */
    volatile unsigned long generation;
    unsigned long birth;   /* the generation before the one a new worker is started for */
    RowTask task;
    void *args;
    long rows, align;
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

/* While held (train() and predict() over batches), the workers spin between products. */
static void pool_hold(int on)
{
    pool.holding = on;
}

static void pool_part(int part, int parts, RowTask task, void *args, long rows, long align)
{
    const long blocks = (rows + align - 1) / align;
    const long first = blocks * part / parts * align, last = blocks * (part + 1) / parts * align;
    if (first < rows)
        task(args, first, last < rows ? last : rows);
}

static void *pool_worker(void *arg)
{
    const int part = (int)(intptr_t)arg;
    pthread_mutex_lock(&pool.lock);
    unsigned long seen = pool.birth;
    for (;;) {
        while (pool.generation == seen && !pool.stopping) {
            pthread_mutex_unlock(&pool.lock);
            for (long spin = 0; (spin < POOL_SPIN || (pool.holding && spin < POOL_SPIN + POOL_HOLD_YIELDS))
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
        void *args = pool.args;
        const long rows = pool.rows, align = pool.align;
        pthread_mutex_unlock(&pool.lock);
        if (part < parts)
            pool_part(part, parts, task, args, rows, align);
        pthread_mutex_lock(&pool.lock);
        if (--pool.pending == 0)
            pthread_cond_signal(&pool.done);
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

SHARED void parallel_rows(RowTask task, void *args, long rows, long align)
{
    int threads = pool_threads < 1 ? 1 : pool_threads > POOL_MAX ? POOL_MAX : pool_threads;
    if (threads > (rows + align - 1) / align)
        threads = (int)((rows + align - 1) / align);
    if (threads <= 1 || pthread_mutex_trylock(&pool.user) != 0) {
        task(args, 0, rows);
        return;
    }
    pthread_mutex_lock(&pool.lock);
    const int parts = pool_start(threads) < threads ? pool.started : threads;
    pool.task = task, pool.args = args, pool.rows = rows, pool.align = align, pool.parts = parts;
    pool.pending = pool.started - 1;
    pool.generation++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    pool_part(0, parts, task, args, rows, align);
    for (long spin = 0; pool.pending > 0; spin++) /* the workers finish within microseconds of each other */
        if (spin < POOL_SPIN)
            cpu_relax();
        else
            sched_yield();
    pthread_mutex_lock(&pool.lock);
    while (pool.pending > 0)
        pthread_cond_wait(&pool.done, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.user);
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
