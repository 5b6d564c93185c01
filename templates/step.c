/* The step-by-step API's gradients (included by templates/runtime.c after optim.c): zero_grad(),
 * backward() and update() without sweeping every parameter, micrograd's semantics unchanged.
 *
 * With plain SGD, the parameter rows that backward's dots write (and the biases beside them:
 * codegen/write/contract.py's StepTables lists them, "tracked rows") carry a stamp read against the
 * generation s->gen: == gen, the row holds its gradient; == gen + 1, it had one contribution so
 * far, 0 + rank1[row] * (a snapshot of the dot's other operand), not written out; anything
 * else, stale values that stand for zeros (nothing since zero_grad(): a ReLU that stayed off).
 * zero_grad() moves to a new generation (gen += 2) and zeroes only the other parameters (the
 * swept runs); backward() writes a rank-one row out before a second contribution and lists the
 * rows it stamps (live); update() steps the listed rows only, from their gradient or their
 * rank-one form, with the rounding of stepping a written-out gradient.
 *
 * Whoever looks at the gradients sees them exact: `grad` is an object whose buffer writes out
 * every row of the generation and zeroes the stale ones whenever it is taken (numpy.asarray,
 * memoryview, an index: below); while any such buffer is alive (a view, a numpy array over it),
 * zero_grad() zeroes every row, so that the buffer never shows stale values and what is written
 * through it is what update() reads. Other optimizers step every parameter every time: their
 * gradients are always written out (the stamps stay current). */
#define LAZY_ROWS (MODEL.optimizer.plain_sgd && MODEL.n_tracked_rows > 0)

/* Every tracked row of this generation is listed for update() */
static void list_all_rows(State *s)
{
    for (long i = 0; i < MODEL.n_tracked_rows; i++)
        s->live[i + 1] = (uint32_t)i;
    s->live[0] = MODEL.n_tracked_rows;
}

/* Every tracked row holds its gradient (after zeroing them all): stamped current. */
static void stamp_all_rows(State *s)
{
    for (long i = 0; i < MODEL.n_tracked_rows; i++)
        s->stamp[i] = s->gen;
    list_all_rows(s);
}

/* Every parameter's gradient 0, written out: the eager zero_grad(), and train()'s start */
static void zero_all_gradients(State *s)
{
    memset(s->g, 0, MODEL.n_params * sizeof(real));
    stamp_all_rows(s);
}

static void write_out_rows(State *s, int zero_stale)
{
    MODEL.write_rows(s->g, s->stamp, s->rank1, s->snap, s->gen, zero_stale);
    if (zero_stale) /* every row is now of this generation */
        list_all_rows(s);
}

static void zero_gradients(State *s)
{
    if (LAZY_ROWS && s->grad_exports == 0) {
        s->gen += 2;
        s->live[0] = 0;
        for (long r = 0; r < MODEL.n_swept_runs; r++)
            for (long i = MODEL.swept_runs[r][0]; i < MODEL.swept_runs[r][0] + MODEL.swept_runs[r][1]; i++)
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
    MODEL.backward_tracked_body(s->d, s->g, s->stamp, s->rank1, s->snap, s->live, s->gen);
}

static void update_step(State *s, double lr)
{
    if (!LAZY_ROWS) {
        optimizer_step(s->d, s->g, s->opt_m, s->opt_v, s->opt_step, lr, 1.0, 0, 0);
        return;
    }
    /* optimizer_step's plain SGD (p + -rate * grad), over the rows of this generation */
    const real rate = (real)lr;
    real *restrict d = s->d, *restrict g = s->g;
    MODEL.sgd_live_rows(d, g, s->stamp, s->rank1, s->snap, s->live, s->gen, rate);
    for (long r = 0; r < MODEL.n_swept_runs; r++)
        for (long i = MODEL.swept_runs[r][0]; i < MODEL.swept_runs[r][0] + MODEL.swept_runs[r][1]; i++)
            d[i] = d[i] + -rate * g[i];
}

/* The stamps, the rank-one factors and the snapshots, zeroed: every row holds its gradient, 0,
 * and is listed. */
static int alloc_tracked_rows(State *s)
{
    s->stamp = PyMem_Calloc(MODEL.n_tracked_rows + 1, sizeof(uint64_t));
    s->live = PyMem_Calloc(MODEL.n_tracked_rows + 1, sizeof(uint32_t));
    s->rank1 = PyMem_Calloc(MODEL.n_tracked_rows + MODEL.n_snapshot + 1, sizeof(real));
    s->snap = s->rank1 ? s->rank1 + MODEL.n_tracked_rows : NULL;
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
/* module.grad is one such object, in the module's dict: a plain attribute, so that CPython
 * specialises the loads of the module's functions (a module __getattr__ turns that off: 25 ns
 * per `net.forward` lookup, ~5% of the step-by-step loop). Taking its buffer (numpy.asarray,
 * memoryview) writes every row out; indexing, len(), iteration and memoryview's methods go
 * through such a buffer, taken for that use and let go after it. */
typedef struct {
    PyObject_HEAD
    PyObject *module; /* NULL once the garbage collector has broken the module <-> grad cycle */
} GradBuffer;

static int grad_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    static Py_ssize_t shape[1], strides[1] = {sizeof(real)};
    PyObject *module = ((GradBuffer *)self)->module;
    if (!module) {
        PyErr_SetString(PyExc_ValueError, "grad: the module is gone");
        return -1;
    }
    State *s = lock_state(module, "grad");
    if (!s)
        return -1;
    write_out_rows(s, 1);
    s->grad_exports++;
    unlock_state(s);
    Py_INCREF(self);
    view->obj = self;
    view->buf = s->g;
    view->len = MODEL.n_slots * (Py_ssize_t)sizeof(real);
    view->readonly = 0;
    view->itemsize = sizeof(real);
    view->format = flags & PyBUF_FORMAT ? REAL_FORMAT : NULL;
    view->ndim = 1;
    shape[0] = MODEL.n_slots;
    view->shape = shape;
    view->strides = strides;
    view->suboffsets = NULL;
    view->internal = NULL;
    return 0;
}

static void grad_releasebuffer(PyObject *self, Py_buffer *view)
{
    (void)view;
    if (((GradBuffer *)self)->module)
        state_of(((GradBuffer *)self)->module)->grad_exports--;
}

static int grad_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self)); /* a heap type's instances hold it */
    Py_VISIT(((GradBuffer *)self)->module);
    return 0;
}

static int grad_clear(PyObject *self)
{
    Py_CLEAR(((GradBuffer *)self)->module);
    return 0;
}

static void grad_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    grad_clear(self);
    type->tp_free(self);
    Py_DECREF(type);
}

/* The uses of `grad` as a sequence: each on a memoryview of its buffer, taken for the use (a
 * slice or a method of it keeps the buffer until it goes, as a memoryview's would). */
static PyObject *grad_subscript(PyObject *self, PyObject *key)
{
    PyObject *view = PyMemoryView_FromObject(self);
    PyObject *item = view ? PyObject_GetItem(view, key) : NULL;
    Py_XDECREF(view);
    return item;
}

static int grad_ass_subscript(PyObject *self, PyObject *key, PyObject *value)
{
    PyObject *view = PyMemoryView_FromObject(self);
    int status = !view ? -1 : value ? PyObject_SetItem(view, key, value) : PyObject_DelItem(view, key);
    Py_XDECREF(view);
    return status;
}

static Py_ssize_t grad_length(PyObject *self)
{
    (void)self;
    return MODEL.n_slots;
}

static PyObject *grad_iter(PyObject *self)
{
    PyObject *view = PyMemoryView_FromObject(self);
    PyObject *it = view ? PyObject_GetIter(view) : NULL;
    Py_XDECREF(view);
    return it;
}

static PyObject *grad_richcompare(PyObject *self, PyObject *other, int op)
{
    PyObject *view = PyMemoryView_FromObject(self);
    PyObject *result = view ? PyObject_RichCompare(view, other, op) : NULL;
    Py_XDECREF(view);
    return result;
}

/* memoryview's public attributes (tolist, cast, format, shape, ...), of a memoryview of the buffer */
static PyObject *grad_getattro(PyObject *self, PyObject *name)
{
    PyObject *found = PyObject_GenericGetAttr(self, name);
    if (found || !PyErr_ExceptionMatches(PyExc_AttributeError) || !PyUnicode_Check(name) ||
        PyUnicode_GetLength(name) == 0 || PyUnicode_READ_CHAR(name, 0) == '_')
        return found;
    PyErr_Clear();
    PyObject *view = PyMemoryView_FromObject(self);
    found = view ? PyObject_GetAttr(view, name) : NULL;
    Py_XDECREF(view);
    if (!found && view && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%U'", Py_TYPE(self)->tp_name, name);
    }
    return found;
}

static PyObject *grad_repr(PyObject *self)
{
    (void)self;
    return PyUnicode_FromFormat("<grad of %s: %d %s gradients, one per slot; numpy.asarray(grad) "
                                "to see them>", MODEL.name, (int)MODEL.n_slots, REAL_FORMAT[0] == 'f' ? "float32" : "float64");
}

/* A heap type, made per module (and holding it), not a static one: a static type readied from
 * code that libtcc compiled in memory stays registered with `object` after that memory is freed
 * (codegen/backend/libtcc.py deletes a gone module's code), which crashed the garbage collector. */
static PyType_Slot grad_slots[] = {
    {Py_tp_dealloc, grad_dealloc},
    {Py_tp_repr, grad_repr},
    {Py_tp_getattro, grad_getattro},
    {Py_tp_traverse, grad_traverse},
    {Py_tp_clear, grad_clear},
    {Py_tp_richcompare, grad_richcompare},
    {Py_tp_iter, grad_iter},
    {Py_mp_length, grad_length},
    {Py_mp_subscript, grad_subscript},
    {Py_mp_ass_subscript, grad_ass_subscript},
    {Py_sq_length, grad_length},
    {Py_bf_getbuffer, grad_getbuffer},
    {Py_bf_releasebuffer, grad_releasebuffer},
    {Py_tp_doc, "the gradients: a buffer (numpy.asarray, memoryview) that writes out every gradient "
                "row when taken, and a sequence (templates/step.c)"},
    {0, NULL},
};
#ifndef Py_TPFLAGS_DISALLOW_INSTANTIATION /* Python < 3.10 */
#define Py_TPFLAGS_DISALLOW_INSTANTIATION 0
#endif
static PyType_Spec grad_spec = {NULL /* MODEL.grad_type_name, set by add_grad */, sizeof(GradBuffer), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
                                grad_slots};

/* module.grad */
static int add_grad(PyObject *module)
{
    grad_spec.name = MODEL.grad_type_name;
    PyTypeObject *type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &grad_spec, NULL);
    GradBuffer *grad = type ? PyObject_GC_New(GradBuffer, type) : NULL; /* holds its type */
    Py_XDECREF(type);
    if (!grad)
        return -1;
    Py_INCREF(module);
    grad->module = module;
    PyObject_GC_Track(grad);
    if (PyModule_AddObject(module, "grad", (PyObject *)grad) == 0) /* steals grad on success */
        return 0;
    Py_DECREF(grad);
    return -1;
}
