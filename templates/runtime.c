/* The module runtime: the fixed part of every micrograd-c training-step module (state, the
 * exported functions, the training driver, the optimizers, the threads, the lifecycle), which
 * knows a model only through its descriptor MODEL (templates/model.h). The same C for every
 * model: codegen/write/emit.py's runtime_sources puts the element type, then templates/prelude.c,
 * at its PRELUDE placeholder, and the toolchain compiles it once per compiler and flags into a
 * cached object that each model's build links (codegen/backend/toolchain.py), as it does the
 * runtime's other unit, its matrix products (templates/products.c), which this one declares. Every slot of the graph
 * lives in d[] (values) and g[] (gradients): parameters first, then inputs, then intermediates.
 * Its INCLUDE markers are replaced by those templates (templates/__init__.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

@PRELUDE@

/*@INCLUDE model.h@*/

/*@INCLUDE pool.c@*/

/*@INCLUDE table.c@*/

/* ---- module state --------------------------------------------------------------------- */
typedef struct {
    real *d, *g;
    PyObject *data_buf, *grad_buf; /* bytearrays owning d and g */
    real *opt_m, *opt_v, *opt_step; /* the optimizer's state (templates/optim.c), in opt_buf */
    PyObject *opt_buf;
    pthread_mutex_t *lock;         /* held by every function reading or writing d and g */
    unsigned long owner;           /* the thread holding `lock` (0: none), to refuse re-entry */
    /* the step-by-step API's gradient rows (templates/step.c): their stamps, the current
     * generation and that of the last backward(), rank-one factors and the dots' snapshots,
     * the rows stamped in this generation, and how many buffers of the `grad` view are alive */
    uint64_t *stamp, gen, backward_gen;
    real *rank1, *snap;
    uint32_t *live;
    Py_ssize_t grad_exports;
    /* lock_state's count of calls, and the call after which train() left every parameter's
     * gradient 0 (0: none): the next train(), if it is the next call, need not zero them */
    uint64_t calls, zeroed_after;
    /* whether every gradient but the parameters' is 0 (templates/driver.c's backward_all), valid
     * during a train() or gradients() call, and the call that left it so */
    int grads_clean;
    uint64_t clean_after;
    real *bd, *bg;                 /* the batch buffers (templates/batch.c), made on first use */
    real *piece_d[POOL_MAX], *piece_g[POOL_MAX]; /* [1..): more, for a sequence's pieces side by side */
    int threads;                   /* threads a batch's products run on (templates/pool.c) */
    ThreadChoice choice;           /* and how many train()'s batches run on (pool.c's threads_for_batch) */
    unsigned int caller_fp_mode;   /* the lock holder's floating-point mode (templates/threads.c) */
} State;

static State *state_of(PyObject *module) { return (State *)PyModule_GetState(module); }

/*@INCLUDE threads.c@*/

/*@INCLUDE optim.c@*/

/* ---- argument checking ------------------------------------------------------------------- */
/*@INCLUDE args.c@*/

/* ---- samples for train() and predict() ---------------------------------------------------- */
/*@INCLUDE samples.c@*/

/* ---- the training driver ------------------------------------------------------------------ */
/*@INCLUDE driver.c@*/
/*@INCLUDE batch.c@*/

/* ---- the step-by-step API: zero_grad(), backward(), update(), `grad` -------------------------- */
/*@INCLUDE step.c@*/

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
    for (int k = 0; offset == MODEL.input_base && k < MODEL.n_index_inputs; k++)
        if (check_index(fn, k, read_float(&view, MODEL.index_inputs[k][0]), -1) < 0) {
            PyBuffer_Release(&view);
            return NULL;
        }
    int same_type = view.itemsize == (Py_ssize_t)sizeof(real); /* copied as it is */
    State *s = lock_state(module, fn);
    if (!s) {
        PyBuffer_Release(&view);
        return NULL;
    }
    real *d = s->d + offset;
#if defined(__GNUC__)
    /* set_input in a loop over the rows of an array gets the next row next: ask for it now, so
     * that it arrives during this step (measured: 5% of the MNIST step loop; a prefetch of an
     * address that is not the next row, or not mapped, costs nothing more than the instruction) */
    for (Py_ssize_t k = 0; offset == MODEL.input_base && k < view.len && k < 16384; k += 64)
        __builtin_prefetch((const char *)view.buf + view.len + k);
#endif
    if (same_type)
        memcpy(d, view.buf, (size_t)count * sizeof(real));
    else
        for (Py_ssize_t i = 0; i < count; i++)
            d[i] = (real)read_float(&view, i);
    unlock_state(s);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *fn_set_input(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return copy_into_slots(module, "set_input", "the input", args, nargs, MODEL.input_base, MODEL.n_inputs);
}

static PyObject *fn_set_params(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return copy_into_slots(module, "set_params", "the parameters", args, nargs, 0, MODEL.n_params);
}

static PyObject *fn_forward(PyObject *module, PyObject *unused)
{
    State *s = lock_state(module, "forward");
    if (!s)
        return NULL;
    real *d = s->d;
    if (check_index_slots("forward", d + MODEL.input_base) < 0) { /* (the `inputs` view may have written them) */
        unlock_state(s);
        return NULL;
    }
    MODEL.scan_nonzeros(d); /* the inputs may have been written through the `inputs` or `data` views */
    all_positions(d, MODEL.positions_slot); /* (the outputs of every position) */
    WITHOUT_GIL_IF(BIG_GRAPH, MODEL.forward_outputs(d); MODEL.forward_rest(d));
    double loss = d[MODEL.loss_slot];
    unlock_state(s);
    return PyFloat_FromDouble(loss);
}

static PyObject *fn_backward(PyObject *module, PyObject *unused)
{
    State *s = lock_state(module, "backward");
    if (!s)
        return NULL;
    if (check_index_slots("backward", s->d + MODEL.input_base) < 0) {
        unlock_state(s);
        return NULL;
    }
    MODEL.scan_nonzeros(s->d);
    WITHOUT_GIL_IF(BIG_GRAPH, backward_step(s));
    unlock_state(s);
    Py_RETURN_NONE;
}

static PyObject *fn_zero_grad(PyObject *module, PyObject *unused)
{
    State *s = lock_state(module, "zero_grad");
    if (!s)
        return NULL;
    /* Only the parameters' gradients persist: backward() restarts every other one from 0. */
    zero_gradients(s);
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
    update_step(s, lr);
    unlock_state(s);
    Py_RETURN_NONE;
}

static PyObject *fn_outputs(PyObject *module, PyObject *unused)
{
    /* copied under the lock, boxed after it: allocating may run finalizers that use the module */
    double *values = PyMem_Malloc((MODEL.n_outputs ? MODEL.n_outputs : 1) * sizeof(double));
    if (!values)
        return PyErr_NoMemory();
    State *s = lock_state(module, "outputs");
    if (!s) {
        PyMem_Free(values);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < MODEL.n_outputs; i++)
        values[i] = (double)s->d[MODEL.output_slots[i]];
    unlock_state(s);
    PyObject *out = PyTuple_New(MODEL.n_outputs);
    for (Py_ssize_t i = 0; out && i < MODEL.n_outputs; i++) {
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

/* A call's threads= (None or absent: 0, the module's own count); -1 with an exception set. */
static int get_threads(const char *fn, PyObject *obj, long long *threads)
{
    return obj && obj != Py_None ? get_int(fn, "threads", obj, 1, threads) : 0;
}

/* The threads this call's products run on: threads= if given, else the module's (set_threads). */
static void use_threads(State *st, long long threads)
{
    pool_threads = threads ? (int)(threads < POOL_MAX ? threads : POOL_MAX) : st->threads;
}

/* A finite rate: a float or an int, or another number (NumPy's float32 and integer scalars) as
 * a float; `what` names it in the error. */
static int get_rate(const char *what, PyObject *obj, double *out)
{
    PyObject *number = PyFloat_Check(obj) || PyLong_Check(obj) || PyUnicode_Check(obj) || !PyNumber_Check(obj)
                           ? NULL : PyNumber_Float(obj);
    PyErr_Clear(); /* (not a number after all: get_finite says what it is) */
    const int bad = get_finite("train", what, number ? number : obj, out) < 0;
    Py_XDECREF(number);
    return bad ? -1 : 0;
}

/* train()'s lr (a number, or one rate a step: a sequence or a 1-D buffer of n_steps finite
 * numbers, copied into q->rates) and losses (None, or a writable 1-D float64 buffer of n_steps,
 * held in *view while q->losses is set) into q; -1 with an exception set and nothing held. */
static int get_schedule(PyObject *lr, PyObject *losses, Py_ssize_t n_steps, Schedule *q, Py_buffer *view)
{
    memset(q, 0, sizeof *q);
    if (PyFloat_Check(lr) || PyLong_Check(lr) || (!PySequence_Check(lr) && PyNumber_Check(lr))) {
        if (get_rate("lr", lr, &q->lr) < 0)
            return -1;
    } else {
        PyObject *rates = PyUnicode_Check(lr) || PyBytes_Check(lr) ? NULL : PySequence_Fast(lr, "");
        if (!rates) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "train(): lr must be a number or a sequence of one rate a step, not %.100s",
                         Py_TYPE(lr)->tp_name);
            return -1;
        }
        if (PySequence_Fast_GET_SIZE(rates) != n_steps) {
            PyErr_Format(PyExc_ValueError, "train(): lr holds %zd rates; this call takes %zd steps (a step "
                         "a batch of batch_size rows)", PySequence_Fast_GET_SIZE(rates), n_steps);
            Py_DECREF(rates);
            return -1;
        }
        double *values = PyMem_Malloc((size_t)(n_steps ? n_steps : 1) * sizeof(double));
        char what[48];
        for (Py_ssize_t k = 0; values && k < n_steps; k++) {
            snprintf(what, sizeof what, "lr[%zd]", k);
            if (get_rate(what, PySequence_Fast_GET_ITEM(rates, k), &values[k]) < 0) {
                PyMem_Free(values);
                Py_DECREF(rates);
                return -1;
            }
        }
        Py_DECREF(rates);
        if (!values) {
            PyErr_NoMemory();
            return -1;
        }
        q->rates = values;
    }
    if (losses && losses != Py_None) {
        if (get_buffer("train", "losses", losses, view, 1, "d", 1) < 0 ||
            check_length("train", "losses", view, n_steps) < 0) {
            PyMem_Free((void *)q->rates);
            q->rates = NULL;
            return -1;
        }
        q->losses = (double *)view->buf;
    }
    return 0;
}

static void release_schedule(Schedule *q, Py_buffer *view)
{
    PyMem_Free((void *)q->rates);
    if (q->losses)
        PyBuffer_Release(view);
}

static PyObject *fn_train(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"X", "Y", "lr", "scale", "batch_size", "seed", "threads", "losses"};
    PyObject *a[8];
    double scale = 1.0;
    long long batch = 1, seed = -1, threads = 0;
    if (parse_args("train", args, nargs, kwnames, names, 8, 3, a) < 0 ||
        (a[3] && get_finite("train", "scale", a[3], &scale) < 0) ||
        (a[4] && get_int("train", "batch_size", a[4], 1, &batch) < 0) ||
        (a[5] && get_int("train", "seed", a[5], -1, &seed) < 0) ||
        get_threads("train", a[6], &threads) < 0)
        return NULL;
    Samples s;
    if (get_samples("train", a[0], a[1], scale, &s) < 0)
        return NULL;
    Schedule q;
    Py_buffer losses_view;
    if (get_schedule(a[2], a[7], (s.n + (Py_ssize_t)batch - 1) / (Py_ssize_t)batch, &q, &losses_view) < 0) {
        release_samples(&s);
        return NULL;
    }
    Py_ssize_t *order = visiting_order(s.n, seed);
    if (!order) {
        release_schedule(&q, &losses_view);
        release_samples(&s);
        return NULL;
    }
    State *st = lock_state(module, "train");
    if (!st) {
        PyMem_Free(order);
        release_schedule(&q, &losses_view);
        release_samples(&s);
        return NULL;
    }
    double loss_sum = 0.0;
    int interrupted;
    /* a batch of several samples runs as one (templates/batch.c), when the program has a batched form */
    const int batched = MODEL.have_batch && batch > 1 && s.n > 1;
    if (batched && batch_buffers(st) < 0) {
        unlock_state(st);
        PyMem_Free(order);
        release_schedule(&q, &losses_view);
        release_samples(&s);
        return NULL;
    }
    /* train() starts from zero gradients, every row holding its own: as the last call left them
     * if it was a train() that zeroed them as it stepped (a document a call: 33 KB of microgpt's
     * not written again), and no `grad` buffer is alive to have written them since */
    if (st->zeroed_after && st->zeroed_after == st->calls - 1 && st->grad_exports == 0)
        stamp_all_rows(st);
    else
        zero_all_gradients(st);
    use_threads(st, threads);
    start_clean(st);
    Py_BEGIN_ALLOW_THREADS /* the buffers stay held (release_samples below), the state locked */
    interrupted = batched ? train_batches(st, &s, order, &q, batch, &loss_sum, &_save)
                          : train_rows(st, &s, order, &q, batch, &loss_sum, &_save);
    Py_END_ALLOW_THREADS
    end_clean(st);
    st->zeroed_after = !interrupted && !batched && steps_zero_gradients(batch) ? st->calls : 0;
    unlock_state(st);
    PyMem_Free(order);
    release_schedule(&q, &losses_view);
    release_samples(&s);
    if (interrupted)
        return NULL;
    return PyFloat_FromDouble(s.n ? loss_sum / (double)s.n : 0.0);
}

/* gradients(X, Y, scale=1.0, threads=None) -> the rows' summed loss. The rows' parameter gradients
 * added to the accumulated ones (the `grad` view's memory), summed over the rows, no step: one
 * process's share of a batch that several processes train on (codegen/distributed.py), which
 * step() then takes. Runs the batched program when there is one, as train() does. */
static PyObject *fn_gradients(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"X", "Y", "scale", "threads"};
    PyObject *a[4];
    double scale = 1.0;
    long long threads = 0;
    if (parse_args("gradients", args, nargs, kwnames, names, 4, 2, a) < 0 ||
        (a[2] && get_finite("gradients", "scale", a[2], &scale) < 0) ||
        get_threads("gradients", a[3], &threads) < 0)
        return NULL;
    Samples s;
    if (get_samples("gradients", a[0], a[1], scale, &s) < 0)
        return NULL;
    State *st = lock_state(module, "gradients");
    const int batched = MODEL.have_batch && s.n > 1;
    if (!st || (batched && batch_buffers(st) < 0)) {
        if (st)
            unlock_state(st);
        release_samples(&s);
        return NULL;
    }
    double loss_sum = 0.0;
    write_out_rows(st, 1); /* every gradient row exact in g, to be added to */
    use_threads(st, threads);
    start_clean(st);
    Py_BEGIN_ALLOW_THREADS
    if (batched)
        gradient_batches(st, &s, &loss_sum);
    else
        gradient_rows(st, &s, &loss_sum);
    Py_END_ALLOW_THREADS
    end_clean(st);
    stamp_all_rows(st); /* g holds every row's gradient */
    unlock_state(st);
    release_samples(&s);
    return PyFloat_FromDouble(loss_sum);
}

/* step(lr, n): train()'s step after a batch of n rows, on the accumulated gradients: one optimizer
 * step on their mean (the sum divided by n), then the gradients zeroed. */
static PyObject *fn_step(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    double lr;
    long long n;
    if (check_nargs("step", nargs, 2, 2) < 0 || get_finite("step", "lr", args[0], &lr) < 0 ||
        get_int("step", "n", args[1], 1, &n) < 0)
        return NULL;
    State *s = lock_state(module, "step");
    if (!s)
        return NULL;
    write_out_rows(s, 1);
    batch_step(s, s->d, s->g, lr, n, 0); /* zeroes the gradients as it steps */
    stamp_all_rows(s);
    unlock_state(s);
    Py_RETURN_NONE;
}

static PyObject *fn_predict(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    static const char *const names[] = {"X", "scale", "threads"};
    PyObject *a[3];
    double scale = 1.0;
    long long threads = 0;
    if (parse_args("predict", args, nargs, kwnames, names, 3, 1, a) < 0 ||
        (a[1] && get_finite("predict", "scale", a[1], &scale) < 0) ||
        get_threads("predict", a[2], &threads) < 0)
        return NULL;
    if (MODEL.n_outputs == 0) {
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
    if (bytes && (rows > PY_SSIZE_T_MAX / ((MODEL.n_outputs ? MODEL.n_outputs : 1) * (Py_ssize_t)sizeof(real))
                      ? (PyErr_NoMemory(), -1)
                      : PyByteArray_Resize(bytes, rows * MODEL.n_outputs * (Py_ssize_t)sizeof(real))) < 0)
        Py_CLEAR(bytes);
    State *st = bytes ? lock_state(module, "predict") : NULL;
    if (!st) {
        Py_XDECREF(bytes);
        release_samples(&s);
        return NULL;
    }
    real *out = (real *)PyByteArray_AS_STRING(bytes);
    int interrupted;
    const int batched = MODEL.have_batch && s.n > 1;
    if (batched && batch_buffers(st) < 0) {
        unlock_state(st);
        Py_DECREF(bytes);
        release_samples(&s);
        return NULL;
    }
    use_threads(st, threads);
    Py_BEGIN_ALLOW_THREADS
    interrupted = batched ? predict_batches(st, &s, out, &_save) : predict_rows(st, &s, out, &_save);
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
    PyObject *shaped = PyObject_CallMethod(view, "cast", "s(nn)", REAL_FORMAT, rows, (Py_ssize_t)MODEL.n_outputs);
    Py_DECREF(view);
    if (shaped && n == 0) {
        PyObject *empty = PySequence_GetSlice(shaped, 0, 0);
        Py_DECREF(shaped);
        shaped = empty;
    }
    return shaped;
}

/* set_threads(n): the threads a batch's matrix products run on from now on (None: the cores
 * this process may use); returns the number set. */
static PyObject *fn_set_threads(PyObject *module, PyObject *arg)
{
    long long threads = 0;
    if (arg != Py_None && get_int("set_threads", "threads", arg, 1, &threads) < 0)
        return NULL;
    State *s = state_of(module);
    s->threads = arg == Py_None ? available_cores() : (int)(threads < POOL_MAX ? threads : POOL_MAX);
    return PyLong_FromLong(s->threads);
}

static PyObject *fn_threads(PyObject *module, PyObject *unused)
{
    (void)unused;
    return PyLong_FromLong(state_of(module)->threads);
}

/* thread_choice(): what train()'s last probe measured (templates/pool.c's threads_for_batch). */
static PyObject *fn_thread_choice(PyObject *module, PyObject *unused)
{
    (void)unused;
    const State *s = state_of(module);
    const ThreadChoice *c = &s->choice;
    if (!c->probe) /* (no probe done yet) */
        return Py_BuildValue("{s:i,s:L,s:O,s:O}", "threads", s->threads, "batches", c->batches, "one_thread_us",
                             Py_None, "all_threads_us", Py_None);
    return Py_BuildValue("{s:i,s:L,s:d,s:d}", "threads", c->one ? 1 : s->threads, "batches", c->batches,
                         "one_thread_us", median_of_probe(c->times[0]) * 1e3, "all_threads_us",
                         median_of_probe(c->times[1]) * 1e3);
}

/* gemm_kernel() -> the batch's matrix products' micro-kernel on this CPU (gemm.c's gemm_variant,
 * chosen on first use and kept): which variant, its register tile, the L2 its slices fit. */
static PyObject *fn_gemm_kernel(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    const char *name;
    int tile_rows, tile_columns, vector_bytes;
    long l2_bytes;
    gemm_describe(&name, &tile_rows, &tile_columns, &vector_bytes, &l2_bytes);
    return Py_BuildValue("{s:s,s:i,s:i,s:i,s:l}", "variant", name, "tile_rows", tile_rows, "tile_columns",
                         tile_columns, "vector_bytes", vector_bytes, "l2_bytes", l2_bytes);
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
     "train(X, Y, lr, scale=1.0, batch_size=1, seed=-1, threads=None, losses=None) -> mean loss.\n"
     "One pass of minibatch training (an optimizer step per batch, on its mean gradient) over the\n"
     "rows of X (uint8, float64 or float32, times scale, into the first inputs) and Y (integer labels one-hot into the\n"
     "remaining inputs, or float64 or float32 rows). Values are scaled in double, then converted to the module's dtype.\n"
     "lr: a number, or one rate a step (a sequence of ceil(len(X) / batch_size) numbers: a schedule in one call).\n"
     "losses: None, or a writable float64 buffer of one value a step, which gets each step's mean loss.\n"
     "seed >= 0 shuffles the order. Parameter gradients are zeroed first. A batch_size > 1 runs each\n"
     "batch at once (a layer's products over the batch on `threads` threads, default set_threads())\n"
     "where the model has a batched form; its numbers equal sample-by-sample passes to rounding."},
    {"gradients", (PyCFunction)(void (*)(void))fn_gradients, METH_FASTCALL | METH_KEYWORDS,
     "gradients(X, Y, scale=1.0, threads=None) -> the rows' summed loss.\n"
     "Every row of X, Y (as train() takes them) forward and backward, its parameter gradients added to\n"
     "the accumulated ones (`grad`), no step: one process's share of a batch (codegen.distributed)."},
    {"step", (PyCFunction)(void (*)(void))fn_step, METH_FASTCALL,
     "step(lr, n): one step of the compiled optimizer on the mean of the accumulated gradients\n"
     "(their sum divided by n, as train() after a batch of n rows), then the gradients zeroed"},
    {"set_threads", fn_set_threads, METH_O,
     "set_threads(n) -> n: the threads train() and predict() run a batch's matrix products on\n"
     "(None: every core this process may use, the default). The results are the same bits with any number."},
    {"threads", fn_threads, METH_NOARGS, "threads() -> the threads a batch's products run on"},
    {"thread_choice", fn_thread_choice, METH_NOARGS,
     "thread_choice() -> dict: train()'s batches run on one thread when its last probe (5 batches on one\n"
     "thread, then 5 on all, the first of each untimed; from the 64th batch with more than one thread,\n"
     "then every 1,024, or 64-1,024 after it chose one) measured one thread's median under 0.95x the\n"
     "others': threads (what its batches run on now), batches (those counted), one_thread_us and\n"
     "all_threads_us (the probe's medians, us a sample; None before one)"},
    {"gemm_kernel", fn_gemm_kernel, METH_NOARGS,
     "gemm_kernel() -> dict: the micro-kernel a batch's matrix products run on this CPU, chosen when\n"
     "first used and kept (variant, tile_rows x tile_columns of the result in registers, vector_bytes,\n"
     "and l2_bytes, the cache the sums' slices are cut for); the results are the same bits with\n"
     "any variant but 'plain' (no fused multiply-add)"},
    {"predict", (PyCFunction)(void (*)(void))fn_predict, METH_FASTCALL | METH_KEYWORDS,
     "predict(X, scale=1.0, threads=None) -> memoryview of shape (rows, n_outputs) with the outputs' values\n"
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
 * then MODEL.optimizer.state_arrays arrays of n_params; `optimizer_state` maps PyTorch's names
 * for them to views, and `optimizer` is the optimizer's description. */
static int add_optimizer_state(PyObject *module, State *s)
{
    const Py_ssize_t line = 8, m0 = line, v0 = line + MODEL.n_params; /* codegen/write/optim.py's STATE_LINE */
    const ModelOptimizer *o = &MODEL.optimizer;
    Py_ssize_t first;
    real *block = aligned_slots(&s->opt_buf, &first, line + o->state_arrays * MODEL.n_params);
    if (!block)
        return -1;
    s->opt_step = block;
    s->opt_m = o->state_arrays > 0 ? block + m0 : NULL;
    s->opt_v = o->state_arrays > 1 ? block + v0 : NULL;
    PyObject *views = PyDict_New(), *raw = PyMemoryView_FromObject(s->opt_buf);
    PyObject *typed = raw ? PyObject_CallMethod(raw, "cast", "s", REAL_FORMAT) : NULL;
    int status = views && typed ? 0 : -1;
    for (int i = 0; status == 0 && i < o->n_state_views; i++) {
        const Py_ssize_t start = o->state_starts[i];
        Py_ssize_t stop = start ? first + start + MODEL.n_params : first + 1; /* the step count: one value */
        PyObject *view = PySequence_GetSlice(typed, first + start, stop);
        status = view ? PyDict_SetItemString(views, o->state_names[i], view) : -1;
        Py_XDECREF(view);
    }
    Py_XDECREF(raw);
    Py_XDECREF(typed);
    if (status == 0 && PyModule_AddObject(module, "optimizer_state", views) == 0)
        return PyModule_AddStringConstant(module, "optimizer", o->repr);
    Py_XDECREF(views);
    return -1;
}

static int module_exec(PyObject *module)
{
    State *s = state_of(module);
    Py_ssize_t d0, g0; /* g0: the gradients' view is `grad` (templates/step.c), g[0] is aligned all the same */
    if (!(s->lock = PyMem_Malloc(sizeof *s->lock)) || pthread_mutex_init(s->lock, NULL) != 0) {
        PyMem_Free(s->lock);
        s->lock = NULL;
        PyErr_NoMemory();
        return -1;
    }
    /* after d's slots, the sparse inputs' nonzero lists (int32, codegen/write/sides.py's nonzero_scans) */
    const Py_ssize_t nonzero_reals = (MODEL.nonzero_words * 4 + (Py_ssize_t)sizeof(real) - 1) / (Py_ssize_t)sizeof(real);
    if (!(s->d = aligned_slots(&s->data_buf, &d0, MODEL.n_slots + nonzero_reals)) ||
        !(s->g = aligned_slots(&s->grad_buf, &g0, MODEL.n_slots)) || add_optimizer_state(module, s) < 0)
        return -1;
    if (alloc_tracked_rows(s) < 0 || add_grad(module) < 0)
        return -1;
    if (MODEL.table_words && !*MODEL.table && !(*MODEL.table = table_decode(MODEL.table_text, MODEL.table_words))) {
        PyErr_NoMemory();
        return -1;
    }
    MODEL.init_constants(s->d);
    s->threads = available_cores();
    /* the parameters' values when compiled (codegen.compile(embed_params=True)) */
    for (long i = 0; MODEL.initial_params && i < MODEL.n_params; i++)
        s->d[i] = (real)MODEL.initial_params[i];
    if (add_view(module, "data", s->data_buf, d0, d0 + MODEL.n_slots) < 0 ||
        add_view(module, "params", s->data_buf, d0, d0 + MODEL.n_params) < 0 ||
        add_view(module, "inputs", s->data_buf, d0 + MODEL.input_base, d0 + MODEL.input_base + MODEL.n_inputs) < 0 ||
        PyModule_AddIntConstant(module, "n_slots", MODEL.n_slots) < 0 ||
        PyModule_AddIntConstant(module, "n_params", MODEL.n_params) < 0 ||
        PyModule_AddIntConstant(module, "n_inputs", MODEL.n_inputs) < 0 ||
        PyModule_AddIntConstant(module, "n_outputs", MODEL.n_outputs) < 0 ||
        PyModule_AddIntConstant(module, "loss_slot", MODEL.loss_slot) < 0)
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
    if (s) {
        free_tracked_rows(s);
        free_batch_buffers(s);
    }
    pool_stop(); /* the workers run this module's code, which may go next (libtcc frees it) */
    if (s && s->lock) {
        pthread_mutex_destroy(s->lock);
        PyMem_Free(s->lock);
        s->lock = NULL;
    }
}

static PyModuleDef_Slot slots[] = {{Py_mod_exec, (void *)module_exec}, {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, NULL /* MODEL.name, set by runtime_module_init */, "A compiled micrograd-c training step.",
    sizeof(State), methods, slots, module_traverse, module_clear, module_free,
};

/* The multi-phase init gives each load its own State, so one model compiled twice in one
 * process (one cached .so) still trains as two independent copies. */
SHARED PyObject *runtime_module_init(void)
{
    if (MODEL.real_size != (int)sizeof(real)) { /* a runtime of the other dtype: a build error */
        PyErr_Format(PyExc_ImportError, "%s: the model's element type (%d bytes) is not the module runtime's "
                     "(%d bytes); rebuild it", MODEL.name, MODEL.real_size, (int)sizeof(real));
        return NULL;
    }
    module_def.m_name = MODEL.name;
    return PyModuleDef_Init(&module_def);
}
