/* The module's lock and the GIL (included by templates/runtime.c after its State).
 * Every function touching d and g holds the module's lock, so two threads using one module take
 * turns (no torn state), while different modules run in parallel: train(), predict() and the
 * passes over big graphs release the GIL. Deadlock rule: never wait for the lock while holding the
 * GIL (the holder may need the GIL to check for signals); try it, and release the GIL to wait.
 * The data/grad/params/inputs memoryviews bypass the lock: writing them while another thread
 * runs the module is the caller's race. */
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
    return s;
}

static void unlock_state(State *s)
{
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
static int interrupted_now(double *next_check, PyThreadState **save)
{
    if (now_ms() < *next_check)
        return 0;
    PyEval_RestoreThread(*save);
    int raised = PyErr_CheckSignals() < 0;
    *save = PyEval_SaveThread();
    *next_check = now_ms() + SIGNAL_CHECK_MS;
    return raised;
}

/* interrupted_now at row i of a loop over rows, every 64 rows (reading the clock costs). */
static int interrupted_at(Py_ssize_t i, double *next_check, PyThreadState **save)
{
    return (i & 63) == 63 && interrupted_now(next_check, save);
}
