/* A codegen.jit function: the value and the gradient of a scalar function of N_INPUTS
 * arguments, one call at a time or over the rows of an array in one C loop. The generated
 * graph is spliced in at the @...@ markers by codegen/jit.py; everything else is this skeleton. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <sched.h>

@CONSTANTS@

/* The generated code marks its functions noinline, so that huge graphs compile in reasonable
 * time. A small jit function (INLINE_GRAPH, set by codegen/jit.py) is inlined instead into
 * the row loops below, where its slots become registers. Python.h above has brought every system
 * header the graph includes, so only the graph sees this. */
#ifndef INLINE_GRAPH
#error "INLINE_GRAPH must be defined (codegen/jit.py)"
#endif
#if INLINE_GRAPH
#define noinline always_inline
#endif
/* `x ** k` and its derivative call pow() with a constant k, which costs ~20 ns a call; integer k
 * are multiplications here, reduced by the compiler, seeing the constant, to one branch. k = 2,
 * 1, 0, -1 give pow's own result; -2 and 3 are within an ulp or two of it. -2 (the derivative of
 * a division) squares 1 / x, which the compiler shares with the division itself. */
static inline double jit_pow(double x, double k)
{
    if (k == 2.0)
        return x * x;
    if (k == 1.0)
        return x;
    if (k == 0.0)
        return 1.0;
    if (k == -1.0)
        return 1.0 / x;
    if (k == -2.0)
        return (1.0 / x) * (1.0 / x);
    if (k == 3.0)
        return x * x * x;
    return pow(x, k);
}
#define pow(x, k) jit_pow(x, k)
@GRAPH@
#undef pow
#undef noinline

/*@INCLUDE pool.c@*/

/* value and, with grads, the gradient wrt each argument, for the n rows of X (N_INPUTS each).
 * Small graphs keep their slots in arrays local to one row: once the graph is inlined, the
 * compiler keeps them in registers. Big ones use d and g (N_SLOTS each, from the heap). */
#define ON_STACK (N_SLOTS <= 4096)

static inline void eval_rows(const double *restrict X, Py_ssize_t n, double *restrict values,
                             double *restrict grads, double *restrict heap_d, double *restrict heap_g)
{
    for (Py_ssize_t r = 0; r < n; r++) {
#if ON_STACK
        double d[N_SLOTS], g[N_SLOTS];
        (void)heap_d, (void)heap_g;
#else
        double *restrict d = heap_d, *restrict g = heap_g;
#endif
#ifdef N_CONSTANTS /* constants the graph's loops read from slots */
        init_constants(d);
#endif
        for (int i = 0; i < N_INPUTS; i++)
            d[INPUT_BASE + i] = X[r * N_INPUTS + i];
        forward_outputs(d);
        forward_rest(d);
        values[r] = d[LOSS_SLOT];
        if (grads) {
            for (int i = 0; i < N_SLOTS; i++)
                g[i] = 0.0;
            g[LOSS_SLOT] = 1.0;
            backward_body(d, g);
            for (int i = 0; i < N_INPUTS; i++)
                grads[r * N_INPUTS + i] = g[INPUT_BASE + i];
        }
    }
}

/* The loop twice, with and without gradients, each specialised by the compiler */
static void values_only(const double *X, Py_ssize_t n, double *values, double *d, double *g)
{
    eval_rows(X, n, values, NULL, d, g);
}

static void values_and_grads(const double *X, Py_ssize_t n, double *values, double *grads, double *d, double *g)
{
    eval_rows(X, n, values, grads, d, g);
}

/* Rows [first, last) of one of the loops, with heap slots when they are too big for the stack
 * (malloc: no GIL needed). */
typedef struct {
    const double *X;
    double *values, *grads;
    volatile int failed;
} Rows;

static void eval_some_rows(void *args, long first, long last)
{
    Rows *r = (Rows *)args;
    double *d = NULL, *g = NULL;
#if !ON_STACK
    if (!(d = malloc(2 * N_SLOTS * sizeof(double)))) {
        r->failed = 1;
        return;
    }
    g = d + N_SLOTS;
#endif
    if (r->grads)
        values_and_grads(r->X + first * N_INPUTS, last - first, r->values + first, r->grads + first * N_INPUTS, d, g);
    else
        values_only(r->X + first * N_INPUTS, last - first, r->values + first, d, g);
    free(d);
}

/* Runs the rows: a long run without the GIL (the buffers stay ours meanwhile), its rows shared
 * between the cores (templates/pool.c; each row's numbers are its own, whoever computes them). */
static int run(const double *X, Py_ssize_t n, double *values, double *grads)
{
    Rows rows = {X, values, grads, 0};
    if (n < 1024) {
        eval_some_rows(&rows, 0, n);
    } else {
        Py_BEGIN_ALLOW_THREADS
        parallel_rows(eval_some_rows, &rows, n, 256);
        Py_END_ALLOW_THREADS
    }
    if (rows.failed) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* ---- argument checking ------------------------------------------------------------------- */
/*@INCLUDE args.c@*/

/* ---- one call: f(a, b, c) and f(a, b, c, grad=True) -------------------------------------- */
static int get_arguments(const char *fn, PyObject *const *args, Py_ssize_t nargs, double *x)
{
    if (check_nargs(fn, nargs, N_INPUTS, N_INPUTS) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (!PyFloat_Check(args[i]) && !PyLong_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "%s(): argument %zd must be a float or an int, not %.100s", fn, i,
                         Py_TYPE(args[i])->tp_name);
            return -1;
        }
        x[i] = PyFloat_AsDouble(args[i]);
        if (x[i] == -1.0 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static PyObject *fn_value(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    double x[N_INPUTS + 1], value;
    if (get_arguments("value", args, nargs, x) < 0 || run(x, 1, &value, NULL) < 0)
        return NULL;
    return PyFloat_FromDouble(value);
}

static PyObject *fn_value_and_grad(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    double x[N_INPUTS + 1], grads[N_INPUTS + 1], value;
    if (get_arguments("value_and_grad", args, nargs, x) < 0 || run(x, 1, &value, grads) < 0)
        return NULL;
    PyObject *grad = PyTuple_New(N_INPUTS);
    for (Py_ssize_t i = 0; grad && i < N_INPUTS; i++) {
        PyObject *v = PyFloat_FromDouble(grads[i]);
        if (!v) {
            Py_CLEAR(grad);
            break;
        }
        PyTuple_SET_ITEM(grad, i, v);
    }
    return grad ? Py_BuildValue("(dN)", value, grad) : NULL;
}

/* ---- all rows: batch(X, values, grads or None) --------------------------------------------- */
/* A C-contiguous float64 buffer of exactly `count` values (codegen/jit.py prepares them). */
static int get_doubles(PyObject *obj, Py_buffer *view, Py_ssize_t count, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (element_type(view) != 'd' || view->len != count * (Py_ssize_t)sizeof(double)) {
        PyErr_Format(PyExc_ValueError, "batch(): %s must hold %zd float64 values", what, count);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *fn_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer x, values, grads;
    Py_ssize_t n;
    if (check_nargs("batch", nargs, 3, 3) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &values, PyBUF_ND) < 0)
        return NULL;
    n = values.len / (Py_ssize_t)sizeof(double);
    PyBuffer_Release(&values);
    if (get_doubles(args[0], &x, n * N_INPUTS, 0, "X") < 0)
        return NULL;
    if (get_doubles(args[1], &values, n, 1, "values") < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    int with_grads = args[2] != Py_None;
    if (with_grads && get_doubles(args[2], &grads, n * N_INPUTS, 1, "grads") < 0) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&values);
        return NULL;
    }
    int status = run(x.buf, n, values.buf, with_grads ? grads.buf : NULL);
    PyBuffer_Release(&x);
    PyBuffer_Release(&values);
    if (with_grads)
        PyBuffer_Release(&grads);
    if (status < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"value", (PyCFunction)(void (*)(void))fn_value, METH_FASTCALL, "value(*args) -> f(*args)"},
    {"value_and_grad", (PyCFunction)(void (*)(void))fn_value_and_grad, METH_FASTCALL,
     "value_and_grad(*args) -> (f(*args), (df/darg0, ...))"},
    {"batch", (PyCFunction)(void (*)(void))fn_batch, METH_FASTCALL,
     "batch(X, values, grads): X (n, n_inputs) float64 rows in; values (n,) and grads (n, n_inputs)\n"
     "(or None) written"},
    {NULL, NULL, 0, NULL},
};

static int module_exec(PyObject *module)
{
    pool_threads = available_cores();
    return PyModule_AddIntConstant(module, "n_inputs", N_INPUTS);
}

static void module_free(void *module)
{
    (void)module;
    pool_stop(); /* the workers run this module's code, which may go next (libtcc frees it) */
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, (void *)module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, MODULE_NAME_STR, "A codegen.jit function.", 0, methods, slots, NULL, NULL, module_free,
};

PyMODINIT_FUNC MODULE_INIT(void) { return PyModuleDef_Init(&module_def); }
