/* The step-by-step API's gradients (included by templates/module.c after optim.c): zero_grad(),
 * backward() and update() without sweeping every parameter, micrograd's semantics unchanged.
 *
 * With plain SGD, the parameter rows that backward's dots write (and the biases beside them:
 * codegen/emit.py's step_rows lists them, "tracked rows") carry a stamp read against the
 * generation s->gen: == gen, the row holds its gradient; == gen + 1, it had one contribution so
 * far, 0 + rank1[row] * (a snapshot of the dot's other operand), not written out; anything
 * else, stale values that stand for zeros (nothing since zero_grad(): a ReLU that stayed off).
 * zero_grad() moves to a new generation (gen += 2) and zeroes only the other parameters (the
 * swept runs); backward() writes a rank-one row out before a second contribution and lists the
 * rows it stamps (live); update() steps the listed rows only, from their gradient or their
 * rank-one form, with the rounding of stepping a written-out gradient.
 *
 * Whoever looks at the gradients sees them exact: `grad` is a new memoryview at every look
 * (module __getattr__), whose buffer writes out every row of the generation and zeroes the
 * stale ones when it is taken; while any such buffer is alive (a view, a numpy array over it),
 * zero_grad() zeroes every row, so that the buffer never shows stale values and what is written
 * through it is what update() reads. Other optimizers step every parameter every time: their
 * gradients are always written out (the stamps stay current). */
#define LAZY_ROWS (PLAIN_SGD && N_TRACKED_ROWS > 0)

/* Every tracked row of this generation is listed for update() */
static void list_all_rows(State *s)
{
    for (long i = 0; i < N_TRACKED_ROWS; i++)
        s->live[i + 1] = (uint32_t)i;
    s->live[0] = N_TRACKED_ROWS;
}

/* Every tracked row holds its gradient (after zeroing them all): stamped current. */
static void stamp_all_rows(State *s)
{
    for (long i = 0; i < N_TRACKED_ROWS; i++)
        s->stamp[i] = s->gen;
    list_all_rows(s);
}

/* Every parameter's gradient 0, written out: the eager zero_grad(), and train()'s start */
static void zero_all_gradients(State *s)
{
    memset(s->g, 0, N_PARAMS * sizeof(real));
    stamp_all_rows(s);
}

static void write_out_rows(State *s, int zero_stale)
{
    write_rows(s->g, s->stamp, s->rank1, s->snap, s->gen, zero_stale);
    if (zero_stale) /* every row is now of this generation */
        list_all_rows(s);
}

static void zero_gradients(State *s)
{
    if (LAZY_ROWS && s->grad_exports == 0) {
        s->gen += 2;
        s->live[0] = 0;
        for (long r = 0; r < N_SWEPT_RUNS; r++)
            for (long i = SWEPT_RUNS[r][0]; i < SWEPT_RUNS[r][0] + SWEPT_RUNS[r][1]; i++)
                s->g[i] = 0;
    } else {
        zero_all_gradients(s);
    }
}

static void backward_step(State *s)
{
    /* the snapshots are about to be retaken: rank-one rows of an earlier backward() are written out */
    if (s->backward_gen == s->gen)
        write_out_rows(s, 0);
    s->backward_gen = s->gen;
    seed_gradients(s->g);
    backward_tracked_body(s->d, s->g, s->stamp, s->rank1, s->snap, s->live, s->gen);
}

static void update_step(State *s, double lr)
{
    if (!LAZY_ROWS) {
        optimizer_step(s->d, s->g, s->opt_m, s->opt_v, s->opt_step, lr, 0);
        return;
    }
    /* optimizer_step's plain SGD (p + -rate * grad), over the rows of this generation */
    const real rate = (real)lr;
    real *restrict d = s->d, *restrict g = s->g;
    sgd_live_rows(d, g, s->stamp, s->rank1, s->snap, s->live, s->gen, rate);
    for (long r = 0; r < N_SWEPT_RUNS; r++)
        for (long i = SWEPT_RUNS[r][0]; i < SWEPT_RUNS[r][0] + SWEPT_RUNS[r][1]; i++)
            d[i] = d[i] + -rate * g[i];
}

/* The stamps, the rank-one factors and the snapshots, zeroed: every row holds its gradient, 0,
 * and is listed. */
static int alloc_tracked_rows(State *s)
{
    s->stamp = PyMem_Calloc(N_TRACKED_ROWS + 1, sizeof(uint64_t));
    s->live = PyMem_Calloc(N_TRACKED_ROWS + 1, sizeof(uint32_t));
    s->rank1 = PyMem_Calloc(N_TRACKED_ROWS + N_SNAPSHOT + 1, sizeof(real));
    s->snap = s->rank1 ? s->rank1 + N_TRACKED_ROWS : NULL;
    s->gen = 0;
    s->backward_gen = (uint64_t)-1;
    if (s->stamp && s->rank1 && s->live) {
        list_all_rows(s);
        return 0;
    }
    PyErr_NoMemory();
    return -1;
}

static void free_tracked_rows(State *s)
{
    PyMem_Free(s->stamp);
    PyMem_Free(s->rank1);
    PyMem_Free(s->live);
    s->stamp = NULL;
    s->live = NULL;
    s->rank1 = s->snap = NULL;
}

/* ---- `grad`: the gradients' buffer, exact whenever it is taken -------------------------------- */
typedef struct {
    PyObject_HEAD
    PyObject *module;
} GradBuffer;

static int grad_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    static Py_ssize_t shape[1] = {N_SLOTS}, strides[1] = {sizeof(real)};
    State *s = lock_state(((GradBuffer *)self)->module, "grad");
    if (!s)
        return -1;
    write_out_rows(s, 1);
    s->grad_exports++;
    unlock_state(s);
    Py_INCREF(self);
    view->obj = self;
    view->buf = s->g;
    view->len = N_SLOTS * (Py_ssize_t)sizeof(real);
    view->readonly = 0;
    view->itemsize = sizeof(real);
    view->format = flags & PyBUF_FORMAT ? REAL_FORMAT : NULL;
    view->ndim = 1;
    view->shape = shape;
    view->strides = strides;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static void grad_releasebuffer(PyObject *self, Py_buffer *view)
{
    (void)view;
    state_of(((GradBuffer *)self)->module)->grad_exports--;
}

static void grad_dealloc(PyObject *self)
{
    Py_DECREF(((GradBuffer *)self)->module);
    PyObject_Free(self);
}

static PyBufferProcs grad_buffer_procs = {grad_getbuffer, grad_releasebuffer};
static PyTypeObject GradBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = MODULE_NAME_STR ".GradBuffer",
    .tp_basicsize = sizeof(GradBuffer),
    .tp_dealloc = grad_dealloc,
    .tp_as_buffer = &grad_buffer_procs,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "the gradients' buffer: taking it writes out every gradient row (templates/step.c)",
};

/* module.grad (PEP 562's module __getattr__): a new memoryview over a new GradBuffer */
static PyObject *fn_getattr(PyObject *module, PyObject *name)
{
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "grad") == 0) {
        GradBuffer *buffer = PyObject_New(GradBuffer, &GradBufferType);
        if (!buffer)
            return NULL;
        Py_INCREF(module);
        buffer->module = module;
        PyObject *view = PyMemoryView_FromObject((PyObject *)buffer);
        Py_DECREF(buffer);
        return view;
    }
    PyErr_Format(PyExc_AttributeError, "module '%s' has no attribute '%U'", MODULE_NAME_STR, name);
    return NULL;
}

/* dir(module) lists `grad` with the module's own names */
static PyObject *fn_dir(PyObject *module, PyObject *unused)
{
    PyObject *names = PyDict_Keys(PyModule_GetDict(module));
    PyObject *grad = names ? PyUnicode_FromString("grad") : NULL;
    if (!grad || PyList_Append(names, grad) < 0 || PyList_Sort(names) < 0) {
        Py_XDECREF(grad);
        Py_XDECREF(names);
        return NULL;
    }
    Py_DECREF(grad);
    return names;
}
