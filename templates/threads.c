/* The module's lock and the GIL (included by templates/runtime.c after its State).
 * Every function touching d and g holds the module's lock, so two threads using one module take
 * turns (no torn state), while different modules run in parallel: train(), predict() and the
 * passes over big graphs release the GIL. Deadlock rule: never wait for the lock while holding the
 * GIL (the holder may need the GIL to check for signals); try it, and release the GIL to wait.
 * The data/grad/params/inputs memoryviews bypass the lock: writing them while another thread
 * runs the module is the caller's race. */
/* While it holds the lock, the module computes with subnormal numbers flushed to zero (FTZ and DAZ,
 * templates/pool.c's fp_mode; x86-64), the caller's mode restored by unlock_state and around the
 * signal handlers run meanwhile (interrupted_now). x86 CPUs take a microcode assist on every
 * operation that reads or makes a subnormal: Adam's moments of a weight whose gradient stays 0
 * decay into them (0.9 a step: after ~6,700 steps in float64, ~750 in float32; Adam's update over
 * MNIST's 39,760 parameters went from 31 us to 55-240 us), and so do the attention's gradients of
 * a GPT in float32 as it learns (the bigger GPT's step went from 140 to 270 us a document over
 * 40 s of training, Intel Xeon; flushed, it stayed at 135-150). What flushing changes is below the
 * smallest normal number (2.2e-308; float32 1.2e-38), which reads and is written as 0. */
static State *lock_state(PyObject *module, const char *fn)
{
    State *s = state_of(module);
    if (s->owner == PyThread_get_thread_ident()) { /* e.g. a signal handler run during train() */
        PyErr_Format(PyExc_RuntimeError, "%s() called while this thread is already running this "
                     "module (from a signal handler or finalizer)", fn);
        return NULL;
    }
    /* a pthread mutex: untaken, trying it costs two atomic operations, where CPython 3.11's
     * PyThread lock also reads the clock (the step-by-step API takes it five times per image) */
    if (pthread_mutex_trylock(s->lock) != 0) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(s->lock);
        Py_END_ALLOW_THREADS
    }
    s->owner = PyThread_get_thread_ident();
    s->calls++;
    s->caller_fp_mode = fp_mode();
    set_fp_mode(FLUSHING_SUBNORMALS(s->caller_fp_mode));
    return s;
}

static void unlock_state(State *s)
{
    set_fp_mode(s->caller_fp_mode);
    s->owner = 0;
    pthread_mutex_unlock(s->lock);
}

/* One forward or backward pass over a graph this big is worth releasing the GIL for. */
#define BIG_GRAPH (MODEL.n_slots >= 16384)
#define WITHOUT_GIL_IF(condition, statement)                                                     \
    do {                                                                                         \
        if (condition) {                                                                         \
            Py_BEGIN_ALLOW_THREADS statement; Py_END_ALLOW_THREADS                               \
        } else {                                                                                 \
            statement;                                                                           \
        }                                                                                        \
    } while (0)

/* train() and predict() run without the GIL and take it back every SIGNAL_CHECK_MS (checking the
 * clock every 64 rows) to check for signals, so that Ctrl-C stops them within a fraction of a second. */
#define SIGNAL_CHECK_MS 50.0
static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* In a loop running without the GIL (`save`: its Py_BEGIN_ALLOW_THREADS state), once *next_check
 * has passed, takes the GIL back for a moment to run signal handlers. Returns 1 when one raised
 * (Ctrl-C): the caller stops, keeping the work done. */
static int interrupted_now(const State *st, double *next_check, PyThreadState **save)
{
    if (now_ms() < *next_check)
        return 0;
    set_fp_mode(st->caller_fp_mode);
    PyEval_RestoreThread(*save);
    int raised = PyErr_CheckSignals() < 0;
    *save = PyEval_SaveThread();
    set_fp_mode(FLUSHING_SUBNORMALS(st->caller_fp_mode));
    *next_check = now_ms() + SIGNAL_CHECK_MS;
    return raised;
}

/* interrupted_now at row i of a loop over rows, every 64 rows (reading the clock costs). */
static int interrupted_at(const State *st, Py_ssize_t i, double *next_check, PyThreadState **save)
{
    return (i & 63) == 63 && interrupted_now(st, next_check, save);
}
