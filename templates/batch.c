/* train() and predict() over whole batches: the batched program's (codegen/lower/batch.py) functions
 * (codegen/write/emit.py's _batched_functions: forward_outputs_batch, forward_rest_batch,
 * backward_batch) on the batch buffers, where slot s of a sample b sits at s's batched slot + b
 * (batch innermost) and the parameters at 0..N_PARAMS as in d. The parameters are copied in
 * before a pass and, after training, out again; every other state (the optimizer's, the
 * step-by-step API's) stays the module's. */
#ifndef HAVE_BATCH
#error "HAVE_BATCH must be defined (codegen/write/emit.py's _batch_layout)"
#endif
#if HAVE_BATCH

/* The batch buffers, made on first use (their size is BATCH_CAPACITY times the one-sample
 * program's), zeroed, 64-byte aligned, the constants written. 0, or -1 with MemoryError set. */
static int batch_buffers(State *st)
{
    if (st->bd)
        return 0;
    /* after d's slots, the inputs' row lists (int32, codegen/write/statements.py's scan_batch_rows) */
    const size_t bytes = (size_t)N_BATCH_SLOTS * sizeof(real) + BATCH_LIST_WORDS * 4;
    void *d = NULL, *g = NULL;
    if (posix_memalign(&d, 64, bytes ? bytes : 64) != 0 || posix_memalign(&g, 64, bytes ? bytes : 64) != 0) {
        free(d);
        PyErr_NoMemory();
        return -1;
    }
    memset(d, 0, bytes);
    memset(g, 0, bytes);
    init_batch_constants((real *)d);
    st->bd = (real *)d;
    st->bg = (real *)g;
    return 0;
}

static void free_batch_buffers(State *st)
{
    free(st->bd);
    free(st->bg);
    st->bd = st->bg = NULL;
}

/* The nb samples rows[0..nb) into the batch's input slots, converted as load_sample does: X's
 * (and Y's) columns from the rows, column by column (each input's slots written in order, the
 * rows' cache lines read across consecutive columns), the other inputs (predict() without them)
 * from the module's input slots. X's columns are shared between the module's threads. */
typedef struct {
    const Samples *s;
    const Py_ssize_t *rows;
    long nb;
    real *in;
} LoadArgs;

#define LOAD_COLUMNS(type)                                                                         \
    for (long k = first; k < last; k++) {                                                          \
        const type *x = (const type *)s->x.buf + k;                                                \
        real *restrict to = a->in + k * BATCH_CAPACITY;                                            \
        for (long b = 0; b < a->nb; b++)                                                           \
            to[b] = (real)(x[a->rows[b] * s->n_x] * s->scale);                                     \
    }
static void load_columns(void *args, long first, long last)
{
    const LoadArgs *a = (const LoadArgs *)args;
    const Samples *s = a->s;
    if (element_type(&s->x) == 'B')
        LOAD_COLUMNS(unsigned char)
    else if (s->x.itemsize == 4)
        LOAD_COLUMNS(float)
    else
        LOAD_COLUMNS(double)
}
#undef LOAD_COLUMNS

/* work (reals read or written) below which a pass stays on the caller's thread */
#define BATCH_PARALLEL_MIN 16384

static void load_batch(const Samples *s, const Py_ssize_t *rows, long nb, const real *restrict inputs,
                       real *restrict bd)
{
    real *in = bd + BATCH_INPUT_BASE;
    LoadArgs args = {s, rows, nb, in};
    if (s->n_x * nb < BATCH_PARALLEL_MIN)
        load_columns(&args, 0, s->n_x);
    else
        parallel_rows(load_columns, &args, s->n_x, 16);
    for (Py_ssize_t k = s->n_x; k < N_INPUTS; k++) {
        real *restrict to = in + k * BATCH_CAPACITY;
        for (long b = 0; b < nb; b++)
            to[b] = s->have_y && !s->y_is_labels ? (real)read_float(&s->y, rows[b] * s->n_y + (k - s->n_x))
                  : s->have_y ? 0 : inputs[k];
    }
    if (s->have_y && s->y_is_labels)
        for (long b = 0; b < nb; b++)
            in[(s->n_x + read_int(&s->y, rows[b])) * BATCH_CAPACITY + b] = 1;
}

/* The per-sample gradients (all but the parameters') of the first nb samples back to 0, on the
 * module's threads: a slot's BATCH_CAPACITY values at a time. */
typedef struct {
    real *g;
    long nb;
} ClearArgs;

static void clear_slots(void *args, long first, long last)
{
    const ClearArgs *a = (const ClearArgs *)args;
    real *from = a->g + N_PARAMS + first * BATCH_CAPACITY;
    if (a->nb == BATCH_CAPACITY)
        memset(from, 0, (size_t)(last - first) * BATCH_CAPACITY * sizeof(real));
    else
        for (long slot = first; slot < last; slot++)
            memset(from + (slot - first) * BATCH_CAPACITY, 0, (size_t)a->nb * sizeof(real));
}

static void clear_batch_gradients(real *g, long nb)
{
    const long slots = (BATCH_CONSTANTS_BASE - N_PARAMS) / BATCH_CAPACITY;
    ClearArgs args = {g, nb};
    if (slots * nb < BATCH_PARALLEL_MIN)
        clear_slots(&args, 0, slots);
    else
        parallel_rows(clear_slots, &args, slots, 16);
}

/* Plain SGD's step after a batch, on the module's threads (each parameter's update is its own:
 * the same bits for any count); other optimizers take batch_step's. With `stepped`, the weights
 * that backward_batch stepped itself (BATCH_STEPPED_RUNS) are left alone. */
typedef struct {
    real *d, *g;
    real rate;
    int stepped;
} SgdArgs;

static void sgd_rows(void *args, long first, long last)
{
    const SgdArgs *a = (const SgdArgs *)args;
    if (!a->stepped) {
        sgd_step(a->d + first, a->g + first, a->rate, last - first);
        return;
    }
    /* the runs ascend; the last, (N_PARAMS, 0), closes the last gap. The first run that ends
     * after `first`, by bisection: a layer's runs are its neurons (hundreds), and each chunk of
     * the step would walk past those before it. */
    int lo = 0, hi = N_BATCH_STEPPED_RUNS;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (BATCH_STEPPED_RUNS[mid][0] + BATCH_STEPPED_RUNS[mid][1] <= first)
            lo = mid + 1;
        else
            hi = mid;
    }
    long at = first;
    for (int r = lo; r <= N_BATCH_STEPPED_RUNS && at < last; r++) {
        const long run = BATCH_STEPPED_RUNS[r][0], end = run + BATCH_STEPPED_RUNS[r][1];
        const long gap_end = run < last ? run : last;
        if (gap_end > at)
            sgd_step(a->d + at, a->g + at, a->rate, gap_end - at);
        if (end > at)
            at = end;
    }
}

/* The SGD step's rate for a batch of n (backward_batch's `rate` and sgd_rows'). */
static real sgd_rate(double lr, long long n)
{
    return (real)(lr / (double)n);
}

static void step_after_batch(State *st, real *d, real *g, double lr, long long n, int stepped)
{
    if (!PLAIN_SGD) {
        batch_step(st, d, g, lr, n);
        return;
    }
    SgdArgs args = {d, g, sgd_rate(lr, n), stepped};
    if (N_PARAMS < 65536)
        sgd_rows(&args, 0, N_PARAMS);
    else
        parallel_rows(sgd_rows, &args, N_PARAMS, 4096);
}

/* Whether backward_batch can take train()'s SGD steps on the weights of BATCH_STEPPED_RUNS (see
 * matmul_nt): plain SGD, and batches of one piece (train() starts from zero gradients). */
static int backward_steps(long long batch)
{
    return PLAIN_SGD && N_BATCH_STEPPED_RUNS > 0 && batch <= BATCH_CAPACITY;
}

/* The rows order[0..count) forward and backward in pieces of at most BATCH_CAPACITY samples on the
 * batch buffers d, g (the parameters copied in), their parameter gradients added to g[0..N_PARAMS),
 * their losses to *loss_sum: a batch of train(), or gradients()'s rows. rate: 0, or (one piece)
 * the SGD step's, which backward_batch takes on the weights of BATCH_STEPPED_RUNS. */
static void add_batch_gradients(State *st, const Samples *s, const Py_ssize_t *order, Py_ssize_t count,
                                double *loss_sum, real rate)
{
    real *d = st->bd, *g = st->bg;
    for (Py_ssize_t first = 0; first < count; first += BATCH_CAPACITY) {
        const long nb = count - first < BATCH_CAPACITY ? (long)(count - first) : BATCH_CAPACITY;
        load_batch(s, order + first, nb, st->d + INPUT_BASE, d);
        scan_batch_rows(d, nb);
        forward_outputs_batch(d, nb);
        forward_rest_batch(d, nb);
        for (long b = 0; b < nb; b++)
            *loss_sum += d[BATCH_LOSS_SLOT + b];
        /* every sample's loss has gradient 1; the other per-sample gradients restart from 0 */
        clear_batch_gradients(g, nb);
        for (long b = 0; b < nb; b++)
            g[BATCH_LOSS_SLOT + b] = 1;
        backward_batch(d, g, nb, rate);
    }
}

/* train_rows (templates/driver.c) over batches of `batch` rows, each run in pieces of at most
 * BATCH_CAPACITY samples whose parameter gradients add up before the batch's step. */
static int train_batches(State *st, const Samples *s, const Py_ssize_t *order, double lr, long long batch,
                         double *loss_sum, PyThreadState **save)
{
    real *d = st->bd, *g = st->bg;
    double next_check = now_ms() + SIGNAL_CHECK_MS;
    int interrupted = 0;
    memcpy(d, st->d, N_PARAMS * sizeof(real));
    memcpy(g, st->g, N_PARAMS * sizeof(real));
    const int stepping = backward_steps(batch);
    pool_hold(1);
    for (Py_ssize_t i = 0; i < s->n && !interrupted;) {
        const Py_ssize_t end = s->n - i < batch ? s->n : i + (Py_ssize_t)batch;
        const real rate = stepping ? sgd_rate(lr, end - i) : 0; /* (0 when lr is) */
        add_batch_gradients(st, s, order + i, end - i, loss_sum, rate);
        step_after_batch(st, d, g, lr, end - i, rate != 0);
        interrupted = interrupted_now(&next_check, save);
        i = end;
    }
    pool_hold(0);
    memcpy(st->d, d, N_PARAMS * sizeof(real));
    memcpy(st->g, g, N_PARAMS * sizeof(real));
    return interrupted;
}

/* gradients()'s pass: every row of s (in order) forward and backward, their parameter gradients
 * added to the module's g[0..N_PARAMS), no step. The parameters and those gradients go into the
 * batch buffers and the gradients come back (a copy of 3 N_PARAMS reals per call: the batched
 * program addresses the parameters inside its own buffers). */
static void gradient_batches(State *st, const Samples *s, double *loss_sum)
{
    Py_ssize_t rows[BATCH_CAPACITY];
    memcpy(st->bd, st->d, N_PARAMS * sizeof(real));
    memcpy(st->bg, st->g, N_PARAMS * sizeof(real));
    pool_hold(1);
    for (Py_ssize_t first = 0; first < s->n; first += BATCH_CAPACITY) {
        const Py_ssize_t count = s->n - first < BATCH_CAPACITY ? s->n - first : BATCH_CAPACITY;
        for (Py_ssize_t b = 0; b < count; b++)
            rows[b] = first + b;
        add_batch_gradients(st, s, rows, count, loss_sum, 0);
    }
    pool_hold(0);
    memcpy(st->g, st->bg, N_PARAMS * sizeof(real));
}

/* predict_rows over pieces of BATCH_CAPACITY rows. */
static int predict_batches(State *st, const Samples *s, real *restrict out, PyThreadState **save)
{
    real *d = st->bd;
    double next_check = now_ms() + SIGNAL_CHECK_MS;
    Py_ssize_t rows[BATCH_CAPACITY];
    int interrupted = 0;
    memcpy(d, st->d, N_PARAMS * sizeof(real));
    pool_hold(1);
    for (Py_ssize_t first = 0; first < s->n && !interrupted; first += BATCH_CAPACITY) {
        const long nb = s->n - first < BATCH_CAPACITY ? (long)(s->n - first) : BATCH_CAPACITY;
        for (long b = 0; b < nb; b++)
            rows[b] = first + b;
        load_batch(s, rows, nb, st->d + INPUT_BASE, d);
        scan_batch_rows(d, nb);
        forward_outputs_batch(d, nb);
        for (long b = 0; b < nb; b++)
            for (int j = 0; j < N_OUTPUTS; j++)
                out[(first + b) * N_OUTPUTS + j] = d[BATCH_OUTPUT_SLOTS[j] + b];
        interrupted = interrupted_now(&next_check, save);
    }
    pool_hold(0);
    return interrupted;
}

#else /* no batched form: train() and predict() run sample by sample, and never call these */
static void free_batch_buffers(State *st) { (void)st; }
static int batch_buffers(State *st) { (void)st; return 0; }
static int train_batches(State *st, const Samples *s, const Py_ssize_t *order, double lr, long long batch,
                         double *loss_sum, PyThreadState **save)
{
    (void)st, (void)s, (void)order, (void)lr, (void)batch, (void)loss_sum, (void)save;
    return 0;
}
static int predict_batches(State *st, const Samples *s, real *restrict out, PyThreadState **save)
{
    (void)st, (void)s, (void)out, (void)save;
    return 0;
}
static void gradient_batches(State *st, const Samples *s, double *loss_sum)
{
    (void)st, (void)s, (void)loss_sum;
}
#endif
