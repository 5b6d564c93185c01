/* CPython argument checking for the generated modules (templates/runtime.c, templates/jit.c):
 * counts, keywords, numbers and buffers, each failure a TypeError or ValueError naming the
 * function and the argument. On failure a buffer already obtained is released. */
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
                     strchr(kinds, 'i')   ? "integers"
                     : strchr(kinds, 'B') ? "float64 ('d'), float32 ('f') or uint8 ('B')"
                     : strchr(kinds, 'f') ? "float64 ('d') or float32 ('f')"
                                          : "float64 ('d')");
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

/* Whether n floats or doubles hold a NaN: one branch-free pass, which vectorises (set_input runs
 * at every step of a training loop); the index of the first NaN is looked for only then. */
#define ANY_NAN(type)                                   \
    do {                                                \
        const type *x = (const type *)view->buf;        \
        for (Py_ssize_t i = 0; i < n; i++)              \
            nan |= x[i] != x[i];                        \
    } while (0)

static int check_no_nan(const char *fn, const char *what, Py_ssize_t n, Py_buffer *view)
{
    int nan = 0;
    if (view->itemsize == 4)
        ANY_NAN(float);
    else
        ANY_NAN(double);
    if (!nan)
        return 0;
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
