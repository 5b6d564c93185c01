/* A micrograd-c training-step module. Generated code is spliced in at the @...@ markers by
 * codegen/emit.py; everything else is this fixed skeleton. Every slot of the graph lives in
 * d[] (values) and g[] (gradients): parameters first, then inputs, then intermediates. Their
 * element type `real` is double or float (codegen.compile's dtype, templates/prelude.c). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

/*@CONSTANTS@*/

/* ---- the graph: prelude, kernels, layout, generated functions ------------------------- */
/*@GRAPH@*/

/* ---- module state --------------------------------------------------------------------- */
typedef struct {
    real *d, *g;
    PyObject *data_buf, *grad_buf; /* bytearrays owning d and g */
    real *opt_m, *opt_v, *opt_step; /* the optimizer's state (templates/optim.c), in opt_buf */
    PyObject *opt_buf;
    PyThread_type_lock lock;       /* held by every function reading or writing d and g */
    unsigned long owner;           /* the thread holding `lock` (0: none), to refuse re-entry */
} State;

static State *state_of(PyObject *module) { return (State *)PyModule_GetState(module); }

/* ---- threads: the module's lock and the GIL ----------------------------------------------------
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
    if (!PyThread_acquire_lock(s->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(s->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
    s->owner = PyThread_get_thread_ident();
    return s;
}

static void unlock_state(State *s)
{
    s->owner = 0;
    PyThread_release_lock(s->lock);
}

/* One forward or backward pass over a graph this big is worth releasing the GIL for. */
#define BIG_GRAPH (N_SLOTS >= 16384)
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

/* Row i of a loop running without the GIL (`save`: its Py_BEGIN_ALLOW_THREADS state): every 64
 * rows, once *next_check has passed, takes the GIL back for a moment to run signal handlers.
 * Returns 1 when one raised (Ctrl-C): the caller stops, keeping the rows done. */
static int interrupted_at(Py_ssize_t i, double *next_check, PyThreadState **save)
{
    if ((i & 63) != 63 || now_ms() < *next_check)
        return 0;
    PyEval_RestoreThread(*save);
    int raised = PyErr_CheckSignals() < 0;
    *save = PyEval_SaveThread();
    *next_check = now_ms() + SIGNAL_CHECK_MS;
    return raised;
}

/* The output's gradient is 1; every other non-parameter gradient restarts from 0, while
 * parameter gradients accumulate until zero_grad(), as in micrograd. */
static void seed_gradients(real *restrict g)
{
    memset(g + N_PARAMS, 0, (size_t)(N_SLOTS - N_PARAMS) * sizeof(real));
    g[LOSS_SLOT] = 1.0;
}

static void backward_all(real *restrict d, real *restrict g)
{
    seed_gradients(g);
    backward_body(d, g);
}

/*@OPTIM@*/

/* ---- argument checking ------------------------------------------------------------------- */
static int check_nargs(const char *fn, Py_ssize_t nargs, Py_ssize_t lo, Py_ssize_t hi)
{
    if (nargs >= lo && nargs <= hi)
        return 0;
    if (lo == hi)
        PyErr_Format(PyExc_TypeError, "%s() takes %zd argument%s (%zd given)", fn, lo,
                     lo == 1 ? "" : "s", nargs);
    else
        PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd arguments (%zd given)", fn, lo, hi, nargs);
    return -1;
}

/* Matches METH_FASTCALL|METH_KEYWORDS arguments to `names`; out[i] is NULL where not given. */
static int parse_args(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *const *names, int n_names, int n_required, PyObject **out)
{
    if (nargs > n_names)
        return check_nargs(fn, nargs, n_required, n_names);
    for (int i = 0; i < n_names; i++)
        out[i] = i < nargs ? args[i] : NULL;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < n_names && PyUnicode_CompareWithASCIIString(key, names[i]) != 0)
            i++;
        if (i == n_names) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fn, key);
            return -1;
        }
        if (out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fn, names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (int i = 0; i < n_required; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fn, names[i]);
            return -1;
        }
    return 0;
}

/* A finite float from a Python number; `what` names it in the error. */
static int get_finite(const char *fn, const char *what, PyObject *obj, double *out)
{
    if (!PyFloat_Check(obj) && !PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be a number, not %.100s", fn, what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = PyFloat_AsDouble(obj);
    if (*out == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) { /* an int beyond float range */
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s(): %s must be finite, got an int too large for a float",
                         fn, what);
        }
        return -1;
    }
    if (!isfinite(*out)) {
        PyErr_Format(PyExc_ValueError, "%s(): %s must be finite, got %R", fn, what, obj);
        return -1;
    }
    return 0;
}

static int get_int(const char *fn, const char *what, PyObject *obj, long long lo, long long *out)
{
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s(): %s must be an int, not %.100s", fn, what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = PyLong_AsLongLong(obj);
    if (*out == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s(): %s must be between %lld and %lld", fn, what, lo,
                         (long long)LLONG_MAX);
        }
        return -1;
    }
    if (*out < lo) {
        PyErr_Format(PyExc_ValueError, "%s(): %s must be >= %lld, got %lld", fn, what, lo, *out);
        return -1;
    }
    return 0;
}

/* The element type of a buffer: its struct format without a byte-order prefix ('@', '=', '<'). */
static char element_type(const Py_buffer *view)
{
    const char *f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    return f[0] && !f[1] ? f[0] : '?';
}

/* Gets a C-contiguous buffer with ndim dimensions; kinds lists the element types allowed
 * ('d' float64, 'f' float32, 'B' uint8, 'i' any integer). */
static int get_buffer(const char *fn, const char *what, PyObject *obj, Py_buffer *view, int ndim,
                      const char *kinds, int writable)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        int is_buffer = PyObject_CheckBuffer(obj);
        PyErr_Format(is_buffer ? PyExc_ValueError : PyExc_TypeError,
                     "%s(): %s must be a %sC-contiguous buffer (numpy array, array.array, memoryview), "
                     "got %.100s: %S", fn, what, writable ? "writable " : "", Py_TYPE(obj)->tp_name,
                     value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    char t = element_type(view);
    int ok = (strchr(kinds, 'd') && t == 'd' && view->itemsize == 8) ||
             (strchr(kinds, 'f') && t == 'f' && view->itemsize == 4) ||
             (strchr(kinds, 'B') && t == 'B') ||
             (strchr(kinds, 'i') && t != '?' && strchr("bBhHiIlLqQ", t));
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s(): %s has element format '%s'; expected %s", fn, what,
                     view->format ? view->format : "B",
                     strchr(kinds, 'i') ? "integers" : strchr(kinds, 'B') ? "float64 ('d'), float32 ('f') or uint8 ('B')"
                                                                          : "float64 ('d') or float32 ('f')");
        PyBuffer_Release(view);
        return -1;
    }
    if (view->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s(): %s must have %d dimension%s, got %d", fn, what, ndim,
                     ndim == 1 ? "" : "s", view->ndim);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static int check_length(const char *fn, const char *what, Py_buffer *view, Py_ssize_t expected)
{
    Py_ssize_t n = view->len / view->itemsize;
    if (n == expected)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s(): %s must hold %zd values, got %zd", fn, what,
                 expected, n);
    PyBuffer_Release(view);
    return -1;
}

/* The i-th value of a float64 or float32 buffer */
static double read_float(const Py_buffer *view, Py_ssize_t i)
{
    return view->itemsize == 4 ? (double)((const float *)view->buf)[i] : ((const double *)view->buf)[i];
}

static int check_no_nan(const char *fn, const char *what, Py_ssize_t n, Py_buffer *view)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (isnan(read_float(view, i))) {
            PyErr_Format(PyExc_ValueError, "%s(): %s holds NaN at index %zd", fn, what, i);
            PyBuffer_Release(view);
            return -1;
        }
    return 0;
}

static long long read_int(const Py_buffer *view, Py_ssize_t i)
{
    const char *p = (const char *)view->buf + i * view->itemsize;
    switch (element_type(view)) {
    case 'b': return *(const signed char *)p;
    case 'B': return *(const unsigned char *)p;
    case 'h': return *(const short *)p;
    case 'H': return *(const unsigned short *)p;
    case 'i': return *(const int *)p;
    case 'I': return *(const unsigned int *)p;
    case 'l': return *(const long *)p;
    case 'L': return (long long)*(const unsigned long *)p;
    case 'q': return *(const long long *)p;
    default: return (long long)*(const unsigned long long *)p;
    }
}

/* ---- samples for train() and predict() ---------------------------------------------------- */
/* X: (n, n_x) uint8, float64 or float32 rows scaled into the first n_x inputs. Y: (n,) integer
 * class labels, one-hot into the remaining inputs, or (n, n_y) float64 or float32 rows copied
 * into them (converted to the module's dtype). */
typedef struct {
    Py_buffer x, y;
    int have_y, y_is_labels;
    Py_ssize_t n, n_x, n_y;
    double scale;
} Samples;

static void release_samples(Samples *s)
{
    PyBuffer_Release(&s->x);
    if (s->have_y)
        PyBuffer_Release(&s->y);
}

static int get_samples(const char *fn, PyObject *xobj, PyObject *yobj, double scale, Samples *s)
{
    memset(s, 0, sizeof *s);
    s->scale = scale;
    if (get_buffer(fn, "X", xobj, &s->x, 2, "dfB", 0) < 0)
        return -1;
    s->n = s->x.shape[0];
    s->n_x = s->x.shape[1];
    if (s->n_x > N_INPUTS) {
        PyErr_Format(PyExc_ValueError, "%s(): X has %zd columns but the model has only %d inputs", fn,
                     s->n_x, N_INPUTS);
        PyBuffer_Release(&s->x);
        return -1;
    }
    if (element_type(&s->x) != 'B' && check_no_nan(fn, "X", s->n * s->n_x, &s->x) < 0)
        return -1;
    if (!yobj)
        return 0;
    s->n_y = N_INPUTS - s->n_x;
    Py_buffer probe;
    if (PyObject_GetBuffer(yobj, &probe, PyBUF_ND) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s(): Y must be a buffer of integer labels or of float64 or float32 rows, "
                     "got %.100s", fn, Py_TYPE(yobj)->tp_name);
        goto fail;
    }
    s->y_is_labels = probe.ndim == 1;
    PyBuffer_Release(&probe);
    if (get_buffer(fn, "Y", yobj, &s->y, s->y_is_labels ? 1 : 2, s->y_is_labels ? "i" : "df", 0) < 0)
        goto fail;
    s->have_y = 1;
    if (s->y.shape[0] != s->n) {
        PyErr_Format(PyExc_ValueError, "%s(): X has %zd rows but Y has %zd", fn, s->n, s->y.shape[0]);
        goto fail_y;
    }
    if (s->y_is_labels) {
        for (Py_ssize_t i = 0; i < s->n; i++) {
            long long label = read_int(&s->y, i);
            if (label < 0 || label >= s->n_y) {
                PyErr_Format(PyExc_ValueError, "%s(): label %lld at row %zd is outside 0..%zd (the %zd "
                             "inputs after X's %zd columns are the one-hot target)", fn, label, i,
                             s->n_y - 1, s->n_y, s->n_x);
                goto fail_y;
            }
        }
    } else {
        if (s->y.shape[1] != s->n_y) {
            PyErr_Format(PyExc_ValueError, "%s(): Y has %zd columns; with X's %zd columns it must have "
                         "%zd to fill the model's %d inputs", fn, s->y.shape[1], s->n_x, s->n_y, N_INPUTS);
            goto fail_y;
        }
        if (check_no_nan(fn, "Y", s->n * s->n_y, &s->y) < 0) {
            s->have_y = 0;
            goto fail;
        }
    }
    return 0;
fail_y:
    PyBuffer_Release(&s->y);
    s->have_y = 0;
fail:
    PyBuffer_Release(&s->x);
    return -1;
}

/* Scaled in double, then rounded to the module's type. */
static void load_sample(const Samples *s, Py_ssize_t row, real *restrict in)
{
    if (element_type(&s->x) == 'B') {
        const unsigned char *x = (const unsigned char *)s->x.buf + row * s->n_x;
        for (Py_ssize_t j = 0; j < s->n_x; j++)
            in[j] = (real)(x[j] * s->scale);
    } else if (s->x.itemsize == 4) {
        const float *x = (const float *)s->x.buf + row * s->n_x;
        for (Py_ssize_t j = 0; j < s->n_x; j++)
            in[j] = (real)(x[j] * s->scale);
    } else {
        const double *x = (const double *)s->x.buf + row * s->n_x;
        for (Py_ssize_t j = 0; j < s->n_x; j++)
            in[j] = (real)(x[j] * s->scale);
    }
    if (!s->have_y)
        return;
    real *target = in + s->n_x;
    if (s->y_is_labels) {
        memset(target, 0, (size_t)s->n_y * sizeof(real));
        target[read_int(&s->y, row)] = 1;
    } else {
        for (Py_ssize_t j = 0; j < s->n_y; j++)
            target[j] = (real)read_float(&s->y, row * s->n_y + j);
    }
}

/* splitmix64: a tiny seeded generator, so a shuffle is the same on every platform */
static uint64_t next_random(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* param -= lr * grad, then grad = 0, over the parameter block */
static void sgd_step(real *restrict d, real *restrict g, real lr)
{
    real *end = d + (N_PARAMS & ~7L);
#define SGD(l) d[l] -= lr * g[l]; g[l] = 0;
    UNROLLED
    for (; d < end; d += 8, g += 8) {
        STEP8(SGD)
    }
#undef SGD
    for (long i = 0; i < (N_PARAMS & 7); i++) {
        d[i] -= lr * g[i];
        g[i] = 0;
    }
}

/* train()'s step after a batch of n samples: plain SGD as sgd_step; any other optimizer takes
 * one step on the batch's mean gradient. Parameter gradients are zeroed for the next batch. */
static void batch_step(State *s, double lr, long long n)
{
    if (PLAIN_SGD) {
        sgd_step(s->d, s->g, lr / (double)n);
        return;
    }
    if (n > 1)
        for (long i = 0; i < N_PARAMS; i++)
            s->g[i] /= (double)n;
    optimizer_step(s->d, s->g, s->opt_m, s->opt_v, s->opt_step, lr, 1);
}

/* ---- exported functions ------------------------------------------------------------------- */
/* set_input and set_params: check one float64 or float32 buffer of `count` values, copy it to
 * d + offset, converted to the module's dtype (rounded to nearest in float32) */
static PyObject *copy_into_slots(PyObject *module, const char *fn, const char *what, PyObject *const *args,
                                 Py_ssize_t nargs, Py_ssize_t offset, Py_ssize_t count)
{
    Py_buffer view;
    if (check_nargs(fn, nargs, 1, 1) < 0 || get_buffer(fn, what, args[0], &view, 1, "df", 0) < 0 ||
        check_length(fn, what, &view, count) < 0 || check_no_nan(fn, what, count, &view) < 0)
        return NULL;
    State *s = lock_state(module, fn);
    if (!s) {
        PyBuffer_Release(&view);
        return NULL;
    }
    real *d = s->d + offset;
    for (Py_ssize_t i = 0; i < count; i++)
        d[i] = (real)read_float(&view, i);
    unlock_state(s);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *fn_set_input(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return copy_into_slots(module, "set_input", "the input", args, nargs, INPUT_BASE, N_INPUTS);
}

static PyObject *fn_set_params(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return copy_into_slots(module, "set_params", "the parameters", args, nargs, 0, N_PARAMS);
}

static PyObject *fn_forward(PyObject *module, PyObject *unused)
{
    State *s = lock_state(module, "forward");
    if (!s)
        return NULL;
    real *d = s->d;
    scan_nonzeros(d); /* the inputs may have been written through the `inputs` or `data` views */
    WITHOUT_GIL_IF(BIG_GRAPH, forward_outputs(d); forward_rest(d));
    double loss = d[LOSS_SLOT];
    unlock_state(s);
    return PyFloat_FromDouble(loss);
}

static PyObject *fn_backward(PyObject *module, PyObject *unused)
{
    State *s = lock_state(module, "backward");
    if (!s)
        return NULL;
    scan_nonzeros(s->d);
    WITHOUT_GIL_IF(BIG_GRAPH, backward_all(s->d, s->g));
    unlock_state(s);
    Py_RETURN_NONE;
}

static PyObject *fn_zero_grad(PyObject *module, PyObject *unused)
{
    State *s = lock_state(module, "zero_grad");
    if (!s)
        return NULL;
    /* Only the parameters' gradients persist: backward() restarts every other one from 0. */
    memset(s->g, 0, N_PARAMS * sizeof(real));
    unlock_state(s);
    Py_RETURN_NONE;
}

static PyObject *fn_update(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    double lr;
    if (check_nargs("update", nargs, 1, 1) < 0 || get_finite("update", "lr", args[0], &lr) < 0)
        return NULL;
    State *s = lock_state(module, "update");
    if (!s)
        return NULL;
    optimizer_step(s->d, s->g, s->opt_m, s->opt_v, s->opt_step, lr, 0);
    unlock_state(s);
    Py_RETURN_NONE;
}

static PyObject *fn_outputs(PyObject *module, PyObject *unused)
{
    /* copied under the lock, boxed after it: allocating may run finalizers that use the module */
    double *values = PyMem_Malloc((N_OUTPUTS ? N_OUTPUTS : 1) * sizeof(double));
    if (!values)
        return PyErr_NoMemory();
    State *s = lock_state(module, "outputs");
    if (!s) {
        PyMem_Free(values);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < N_OUTPUTS; i++)
        values[i] = (double)s->d[OUTPUT_SLOTS[i]];
    unlock_state(s);
    PyObject *out = PyTuple_New(N_OUTPUTS);
    for (Py_ssize_t i = 0; out && i < N_OUTPUTS; i++) {
        PyObject *v = PyFloat_FromDouble(values[i]);
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    PyMem_Free(values);
    return out;
}

static PyObject *fn_train(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"X", "Y", "lr", "scale", "batch_size", "seed"};
    PyObject *a[6];
    double lr, scale = 1.0;
    long long batch = 1, seed = -1;
    if (parse_args("train", args, nargs, kwnames, names, 6, 3, a) < 0 ||
        get_finite("train", "lr", a[2], &lr) < 0 ||
        (a[3] && get_finite("train", "scale", a[3], &scale) < 0) ||
        (a[4] && get_int("train", "batch_size", a[4], 1, &batch) < 0) ||
        (a[5] && get_int("train", "seed", a[5], -1, &seed) < 0))
        return NULL;
    Samples s;
    if (get_samples("train", a[0], a[1], scale, &s) < 0)
        return NULL;
    Py_ssize_t *order = (size_t)s.n > PY_SSIZE_T_MAX / sizeof(Py_ssize_t) ? NULL
        : PyMem_Malloc((size_t)(s.n ? s.n : 1) * sizeof(Py_ssize_t));
    if (!order) {
        release_samples(&s);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < s.n; i++)
        order[i] = i;
    if (seed >= 0) { /* Fisher-Yates */
        uint64_t x = (uint64_t)seed;
        for (Py_ssize_t i = s.n - 1; i > 0; i--) {
            Py_ssize_t j = (Py_ssize_t)(next_random(&x) % (uint64_t)(i + 1));
            Py_ssize_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    State *st = lock_state(module, "train");
    if (!st) {
        PyMem_Free(order);
        release_samples(&s);
        return NULL;
    }
    real *d = st->d, *g = st->g;
    double loss_sum = 0.0;
    int interrupted = 0;
    Py_BEGIN_ALLOW_THREADS /* the buffers stay held (release_samples below), the state locked */
    double next_check = now_ms() + SIGNAL_CHECK_MS;
    memset(g, 0, N_PARAMS * sizeof(real));
    Py_ssize_t in_batch = 0;
    for (Py_ssize_t i = 0; i < s.n; i++) {
        load_sample(&s, order[i], d + INPUT_BASE);
        scan_nonzeros(d);
        forward_outputs(d);
        forward_rest(d);
        loss_sum += d[LOSS_SLOT];
        if (SGD_IN_BACKWARD && PLAIN_SGD && batch == 1) {
            seed_gradients(g);
            backward_sgd_body(d, g, lr);
            sgd_after_backward(d, g, lr);
        } else {
            backward_all(d, g);
            if (++in_batch == batch) { /* the mean gradient of the minibatch */
                batch_step(st, lr, batch);
                in_batch = 0;
            }
        }
        if ((interrupted = interrupted_at(i, &next_check, &_save)))
            break;
    }
    if (in_batch && !interrupted)
        batch_step(st, lr, in_batch);
    Py_END_ALLOW_THREADS
    unlock_state(st);
    PyMem_Free(order);
    release_samples(&s);
    if (interrupted)
        return NULL;
    return PyFloat_FromDouble(s.n ? loss_sum / (double)s.n : 0.0);
}

static PyObject *fn_predict(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"X", "scale"};
    PyObject *a[2];
    double scale = 1.0;
    if (parse_args("predict", args, nargs, kwnames, names, 2, 1, a) < 0 ||
        (a[1] && get_finite("predict", "scale", a[1], &scale) < 0))
        return NULL;
    if (N_OUTPUTS == 0) {
        PyErr_SetString(PyExc_ValueError, "predict(): the model has no outputs to predict; compile it "
                        "with outputs=[...]");
        return NULL;
    }
    Samples s;
    if (get_samples("predict", a[0], NULL, scale, &s) < 0)
        return NULL;
    Py_ssize_t rows = s.n ? s.n : 1; /* 0 rows: a slice of a 1-row view (below) */
    /* Empty, then resized: when PyByteArray_FromStringAndSize cannot allocate, it frees a half-built
     * bytearray (CPython 3.11 then prints "deallocated bytearray object has exported buffers"). */
    PyObject *bytes = PyByteArray_FromStringAndSize(NULL, 0);
    if (bytes && (rows > PY_SSIZE_T_MAX / ((N_OUTPUTS ? N_OUTPUTS : 1) * (Py_ssize_t)sizeof(real))
                      ? (PyErr_NoMemory(), -1)
                      : PyByteArray_Resize(bytes, rows * N_OUTPUTS * (Py_ssize_t)sizeof(real))) < 0)
        Py_CLEAR(bytes);
    State *st = bytes ? lock_state(module, "predict") : NULL;
    if (!st) {
        Py_XDECREF(bytes);
        release_samples(&s);
        return NULL;
    }
    real *out = (real *)PyByteArray_AS_STRING(bytes), *d = st->d;
    int interrupted = 0;
    Py_BEGIN_ALLOW_THREADS
    double next_check = now_ms() + SIGNAL_CHECK_MS;
    for (Py_ssize_t i = 0; i < s.n; i++) {
        load_sample(&s, i, d + INPUT_BASE);
        scan_nonzeros(d);
        forward_outputs(d);
        for (int j = 0; j < N_OUTPUTS; j++)
            out[i * N_OUTPUTS + j] = d[OUTPUT_SLOTS[j]];
        if ((interrupted = interrupted_at(i, &next_check, &_save)))
            break;
    }
    Py_END_ALLOW_THREADS
    unlock_state(st);
    Py_ssize_t n = s.n;
    release_samples(&s);
    if (interrupted) {
        Py_DECREF(bytes);
        return NULL;
    }
    /* memoryview(bytes).cast('d' or 'f', (n, N_OUTPUTS)): numpy.asarray() gives the (n, outputs) array.
     * cast() refuses a 0 in the shape, so 0 rows are the empty slice of one row. */
    PyObject *view = PyMemoryView_FromObject(bytes);
    Py_DECREF(bytes);
    if (!view)
        return NULL;
    PyObject *shaped = PyObject_CallMethod(view, "cast", "s(nn)", REAL_FORMAT, rows, (Py_ssize_t)N_OUTPUTS);
    Py_DECREF(view);
    if (shaped && n == 0) {
        PyObject *empty = PySequence_GetSlice(shaped, 0, 0);
        Py_DECREF(shaped);
        shaped = empty;
    }
    return shaped;
}

static PyMethodDef methods[] = {
    {"set_input", (PyCFunction)(void (*)(void))fn_set_input, METH_FASTCALL,
     "set_input(buffer): copy n_inputs float64 or float32 values into the input slots (converted\n"
     "to the module's dtype: float32 modules round float64 values to nearest)"},
    {"set_params", (PyCFunction)(void (*)(void))fn_set_params, METH_FASTCALL,
     "set_params(buffer): copy n_params float64 or float32 values into the parameter slots\n"
     "(converted to the module's dtype, as set_input)"},
    {"forward", fn_forward, METH_NOARGS, "forward() -> the output's value"},
    {"backward", fn_backward, METH_NOARGS,
     "backward(): gradients of the output; parameter gradients accumulate until zero_grad()"},
    {"zero_grad", fn_zero_grad, METH_NOARGS,
     "zero_grad(): set the parameters' gradients to 0 (backward() restarts every other gradient)"},
    {"update", (PyCFunction)(void (*)(void))fn_update, METH_FASTCALL,
     "update(lr): one step of the compiled optimizer (default SGD: param -= lr * grad) on the\n"
     "accumulated gradients, which it leaves as they are"},
    {"outputs", fn_outputs, METH_NOARGS, "outputs() -> tuple of the extra outputs' values"},
    {"train", (PyCFunction)(void (*)(void))fn_train, METH_FASTCALL | METH_KEYWORDS,
     "train(X, Y, lr, scale=1.0, batch_size=1, seed=-1) -> mean loss.\n"
     "One pass of minibatch training (an optimizer step per batch, on its mean gradient) over the\n"
     "rows of X (uint8, float64 or float32, times scale, into the first inputs) and Y (integer labels one-hot into the\n"
     "remaining inputs, or float64 or float32 rows). Values are scaled in double, then converted to the module's dtype.\n"
     "seed >= 0 shuffles the order. Parameter gradients are zeroed first."},
    {"predict", (PyCFunction)(void (*)(void))fn_predict, METH_FASTCALL | METH_KEYWORDS,
     "predict(X, scale=1.0) -> memoryview of shape (rows, n_outputs) with the outputs' values\n"
     "(format 'd' float64 or 'f' float32: the module's dtype);\n"
     "X's rows (times scale) fill the first inputs, the other inputs keep their values."},
    {NULL, NULL, 0, NULL},
};

/* ---- module lifecycle ------------------------------------------------------------------------ */
static int add_view(PyObject *module, const char *name, PyObject *buf, Py_ssize_t start, Py_ssize_t stop)
{
    PyObject *raw = PyMemoryView_FromObject(buf);
    PyObject *typed = raw ? PyObject_CallMethod(raw, "cast", "s", REAL_FORMAT) : NULL;
    PyObject *slice = typed ? PySequence_GetSlice(typed, start, stop) : NULL;
    Py_XDECREF(raw);
    Py_XDECREF(typed);
    return slice ? PyModule_AddObject(module, name, slice) : -1; /* steals slice on success */
}

/* A zeroed array of `count` reals starting on a 64-byte boundary inside a new bytearray (so
 * that vector loads of contiguous slot ranges do not straddle cache lines from one load of the
 * module to the next); *first is its index in the bytearray's reals. */
static real *aligned_slots(PyObject **owner, Py_ssize_t *first, Py_ssize_t count)
{
    const Py_ssize_t align = 64 / sizeof(real);
    *owner = PyByteArray_FromStringAndSize(NULL, (count + align) * (Py_ssize_t)sizeof(real));
    if (!*owner)
        return NULL;
    real *raw = (real *)PyByteArray_AS_STRING(*owner);
    *first = (Py_ssize_t)((64 - (uintptr_t)raw % 64) % 64 / sizeof(real));
    memset(raw + *first, 0, count * sizeof(real));
    return raw + *first;
}

/* The optimizer's state, zeroed, in one aligned block: its step count (padded to a cache line),
 * then OPTIMIZER_STATE_ARRAYS arrays of N_PARAMS; `optimizer_state` maps PyTorch's names for
 * them to views, and `optimizer` is the optimizer's description. */
static int add_optimizer_state(PyObject *module, State *s)
{
    const Py_ssize_t line = 8, m0 = line, v0 = line + N_PARAMS; /* codegen/optim.py's _STATE_LINE */
    static const char *const names[] = {OPTIMIZER_STATE_NAMES};
    static const Py_ssize_t starts[] = {OPTIMIZER_STATE_STARTS};
    Py_ssize_t first;
    real *block = aligned_slots(&s->opt_buf, &first, line + OPTIMIZER_STATE_ARRAYS * N_PARAMS);
    if (!block)
        return -1;
    s->opt_step = block;
    s->opt_m = OPTIMIZER_STATE_ARRAYS > 0 ? block + m0 : NULL;
    s->opt_v = OPTIMIZER_STATE_ARRAYS > 1 ? block + v0 : NULL;
    PyObject *views = PyDict_New(), *raw = PyMemoryView_FromObject(s->opt_buf);
    PyObject *typed = raw ? PyObject_CallMethod(raw, "cast", "s", REAL_FORMAT) : NULL;
    int status = views && typed ? 0 : -1;
    for (size_t i = 0; status == 0 && i < sizeof starts / sizeof *starts && starts[i] >= 0; i++) {
        Py_ssize_t stop = starts[i] ? first + starts[i] + N_PARAMS : first + 1; /* the step count: one value */
        PyObject *view = PySequence_GetSlice(typed, first + starts[i], stop);
        status = view ? PyDict_SetItemString(views, names[i], view) : -1;
        Py_XDECREF(view);
    }
    Py_XDECREF(raw);
    Py_XDECREF(typed);
    if (status == 0 && PyModule_AddObject(module, "optimizer_state", views) == 0)
        return PyModule_AddStringConstant(module, "optimizer", OPTIMIZER_REPR);
    Py_XDECREF(views);
    return -1;
}

static int module_exec(PyObject *module)
{
    State *s = state_of(module);
    Py_ssize_t d0, g0;
    if (!(s->lock = PyThread_allocate_lock())) {
        PyErr_NoMemory();
        return -1;
    }
    /* after d's slots, the sparse inputs' nonzero lists (int32, codegen/emit.py's scan_nonzeros) */
    const Py_ssize_t nonzero_reals = (NONZERO_WORDS * 4 + (Py_ssize_t)sizeof(real) - 1) / (Py_ssize_t)sizeof(real);
    if (!(s->d = aligned_slots(&s->data_buf, &d0, N_SLOTS + nonzero_reals)) || !(s->g = aligned_slots(&s->grad_buf, &g0, N_SLOTS)) ||
        add_optimizer_state(module, s) < 0)
        return -1;
    init_constants(s->d);
#ifdef HAVE_INITIAL_PARAMS /* the parameters' values when compiled (codegen.compile(embed_params=True)) */
    for (long i = 0; i < N_PARAMS; i++)
        s->d[i] = (real)INITIAL_PARAMS[i];
#endif
    if (add_view(module, "data", s->data_buf, d0, d0 + N_SLOTS) < 0 ||
        add_view(module, "grad", s->grad_buf, g0, g0 + N_SLOTS) < 0 ||
        add_view(module, "params", s->data_buf, d0, d0 + N_PARAMS) < 0 ||
        add_view(module, "inputs", s->data_buf, d0 + INPUT_BASE, d0 + INPUT_BASE + N_INPUTS) < 0 ||
        PyModule_AddIntConstant(module, "n_slots", N_SLOTS) < 0 ||
        PyModule_AddIntConstant(module, "n_params", N_PARAMS) < 0 ||
        PyModule_AddIntConstant(module, "n_inputs", N_INPUTS) < 0 ||
        PyModule_AddIntConstant(module, "n_outputs", N_OUTPUTS) < 0 ||
        PyModule_AddIntConstant(module, "loss_slot", LOSS_SLOT) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    State *s = state_of(module);
    if (s) {
        Py_VISIT(s->data_buf);
        Py_VISIT(s->grad_buf);
        Py_VISIT(s->opt_buf);
    }
    return 0;
}

static int module_clear(PyObject *module)
{
    State *s = state_of(module);
    if (s) {
        Py_CLEAR(s->data_buf);
        Py_CLEAR(s->grad_buf);
        Py_CLEAR(s->opt_buf);
    }
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
    State *s = state_of((PyObject *)module);
    if (s && s->lock) {
        PyThread_free_lock(s->lock);
        s->lock = NULL;
    }
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, (void *)module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, MODULE_NAME_STR, "A compiled micrograd-c training step.",
    sizeof(State), methods, slots, module_traverse, module_clear, module_free,
};

/* The multi-phase init gives each load its own State, so one model compiled twice in one
 * process (one cached .so) still trains as two independent copies. */
PyMODINIT_FUNC MODULE_INIT(void) { return PyModuleDef_Init(&module_def); }
