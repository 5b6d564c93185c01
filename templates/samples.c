/* The rows train() and predict() read: checking X and Y once (templates/args.c), then loading
 * one sample into the input slots; and train()'s visiting order.
 * X: (n, n_x) uint8, float64 or float32 rows scaled into the first n_x inputs. Y: (n,) integer
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

/* Index inputs (MODEL.index_inputs, codegen/write/contract.py's Layout: {input position, n} for each input a gather
 * reads as its index) must hold an integer from -n to n - 1, as Python's indexing takes: checked
 * before any forward reads them, so that no gather reads outside the values it picks among. */

/* Whether x (the module's rounding of an input) is an index among n values: an integer from -n
 * to n - 1 (free of branches: index_inputs_good's pass over the rows) */
static inline int good_index(double x, double n)
{
    return (x == floor(x)) & (x >= -n) & (x < n);
}

/* 0 if input k of INDEX_INPUTS holds x (the module's rounding of it) well; else IndexError (row < 0:
 * no row to name) and -1. */
static int check_index(const char *fn, int k, double x, Py_ssize_t row)
{
    long position = MODEL.index_inputs[k][0], n = MODEL.index_inputs[k][1];
    x = (double)(real)x;
    if (good_index(x, (double)n))
        return 0;
    char where[48] = "", value[32];
    if (row >= 0)
        snprintf(where, sizeof where, " at row %zd", row);
    snprintf(value, sizeof value, "%.17g", x);
    PyErr_Format(PyExc_IndexError, "%s(): input %ld%s is an index into %ld values, so it must hold an integer "
                 "from %ld to %ld, not %s", fn, position, where, n, -n, n - 1, value);
    return -1;
}

/* The index inputs of the slots `in` (what set_input or the `inputs` view left there) */
static int check_index_slots(const char *fn, const real *in)
{
    for (int k = 0; k < MODEL.n_index_inputs; k++)
        if (check_index(fn, k, (double)in[MODEL.index_inputs[k][0]], -1) < 0)
            return -1;
    return 0;
}

/* The value input j takes from row `row` of s, as load_sample sets it (before the rounding to
 * real): X's column j scaled, else Y's (a label's one-hot, or a column). j >= n_x needs Y. */
static double row_input(const Samples *s, Py_ssize_t row, Py_ssize_t j)
{
    if (j < s->n_x)
        return (element_type(&s->x) == 'B' ? ((const unsigned char *)s->x.buf)[row * s->n_x + j]
                                          : read_float(&s->x, row * s->n_x + j)) * s->scale;
    if (s->y_is_labels)
        return read_int(&s->y, row) == j - s->n_x;
    return read_float(&s->y, row * s->n_y + j - s->n_x);
}

/* Whether the index inputs in X (in_x) or in Y hold good indices (check_index's test) in every row
 * of s, as row_input reads them: one branch-free pass over the rows (1 where they do; 0 where not,
 * or where Y holds labels: the rows one by one then say which). Before every train() and predict()
 * call: default microgpt's 32 index inputs a document, each read through row_input and
 * check_index, took ~5% of its step at 16 documents a step (Zen 5). */
static int index_inputs_good(const Samples *s, int in_x)
{
    Py_ssize_t at[MODEL.n_index_inputs + 1];
    double bound[MODEL.n_index_inputs + 1];
    int m = 0;
    for (int k = 0; k < MODEL.n_index_inputs; k++) {
        const Py_ssize_t j = MODEL.index_inputs[k][0];
        if ((j < s->n_x) == in_x)
            at[m] = in_x ? j : j - s->n_x, bound[m++] = (double)MODEL.index_inputs[k][1];
    }
    if (m == 0 || (!in_x && !s->have_y)) /* (predict(): the targets are not read) */
        return 1;
    if (!in_x && s->y_is_labels)
        return 0;
    const Py_buffer *view = in_x ? &s->x : &s->y;
    const Py_ssize_t stride = in_x ? s->n_x : s->n_y;
    const double scale = in_x ? s->scale : 1;
    int good = 1;
#define GOOD_ROWS(type)                                                                            \
    for (Py_ssize_t row = 0; row < s->n; row++) {                                                  \
        const type *values = (const type *)view->buf + row * stride;                               \
        for (int c = 0; c < m; c++)                                                                \
            good &= good_index((double)(real)(values[at[c]] * scale), bound[c]);                   \
    }
    switch (element_type(view)) {
    case 'd': GOOD_ROWS(double); break;
    case 'f': GOOD_ROWS(float); break;
    case 'B': GOOD_ROWS(unsigned char); break;
    default: return 0;
    }
#undef GOOD_ROWS
    return good;
}

/* The index inputs of every row of train()'s or predict()'s samples, as load_sample will set them:
 * in one pass (index_inputs_good), and where one is bad, row by row for the first one's error */
static int check_index_samples(const char *fn, const Samples *s)
{
    if (index_inputs_good(s, 1) && index_inputs_good(s, 0))
        return 0;
    for (Py_ssize_t row = 0; row < s->n; row++)
        for (int k = 0; k < MODEL.n_index_inputs; k++) {
            Py_ssize_t j = MODEL.index_inputs[k][0];
            if (j >= s->n_x && !s->have_y)
                continue; /* (predict(): the targets are not read) */
            if (check_index(fn, k, row_input(s, row, j), row) < 0)
                return -1;
        }
    return 0;
}

/* get_samples' end: 0, or -1 with the buffers released when an index input is out of range */
static int checked_samples(const char *fn, Samples *s)
{
    if (check_index_samples(fn, s) == 0)
        return 0;
    release_samples(s);
    return -1;
}

static int get_samples(const char *fn, PyObject *xobj, PyObject *yobj, double scale, Samples *s)
{
    memset(s, 0, sizeof *s);
    s->scale = scale;
    if (get_buffer(fn, "X", xobj, &s->x, 2, "dfB", 0) < 0)
        return -1;
    s->n = s->x.shape[0];
    s->n_x = s->x.shape[1];
    if (s->n_x > MODEL.n_inputs) {
        PyErr_Format(PyExc_ValueError, "%s(): X has %zd columns but the model has only %d inputs", fn,
                     s->n_x, MODEL.n_inputs);
        PyBuffer_Release(&s->x);
        return -1;
    }
    if (element_type(&s->x) != 'B' && check_no_nan(fn, "X", s->n * s->n_x, &s->x) < 0)
        return -1;
    if (!yobj)
        return checked_samples(fn, s);
    s->n_y = MODEL.n_inputs - s->n_x;
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
                         "%zd to fill the model's %d inputs", fn, s->y.shape[1], s->n_x, s->n_y, MODEL.n_inputs);
            goto fail_y;
        }
        if (check_no_nan(fn, "Y", s->n * s->n_y, &s->y) < 0) {
            s->have_y = 0;
            goto fail;
        }
    }
    return checked_samples(fn, s);
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

/* train()'s visiting order of n rows: 0..n-1, shuffled by Fisher-Yates when seed >= 0. NULL
 * when out of memory (an exception set). */
static Py_ssize_t *visiting_order(Py_ssize_t n, long long seed)
{
    Py_ssize_t *order = (size_t)n > PY_SSIZE_T_MAX / sizeof(Py_ssize_t) ? NULL
        : PyMem_Malloc((size_t)(n ? n : 1) * sizeof(Py_ssize_t));
    if (!order)
        return (Py_ssize_t *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        order[i] = i;
    if (seed >= 0) {
        uint64_t x = (uint64_t)seed;
        for (Py_ssize_t i = n - 1; i > 0; i--) {
            Py_ssize_t j = (Py_ssize_t)(next_random(&x) % (uint64_t)(i + 1));
            Py_ssize_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    return order;
}
