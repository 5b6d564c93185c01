/* The training and prediction loops over the generated functions (forward_outputs, forward_rest,
 * backward_body, backward_sgd_body) and the optimizer (templates/optim.c): plain C on the module's
 * State, run without the GIL by train() and predict() (templates/runtime.c), which check the
 * arguments and hold the buffers and the lock. */
/* The output's gradient is 1; every other non-parameter gradient restarts from 0, while
 * parameter gradients accumulate until zero_grad(), as in micrograd. */
static void seed_gradients(real *restrict g)
{
    memset(g + MODEL.n_params, 0, (size_t)(MODEL.n_slots - MODEL.n_params) * sizeof(real));
    g[MODEL.loss_slot] = 1.0;
}

/* The seed before a backward: the loss's alone where the other gradients are known to be 0
 * (st->grads_clean: the last backward set back what it wrote, MODEL.backward_clears) */
static void seed_before_backward(State *st)
{
    if (st->grads_clean)
        st->g[MODEL.loss_slot] = 1.0;
    else
        seed_gradients(st->g);
}

static void backward_all(State *st)
{
    seed_before_backward(st);
    MODEL.backward_body(st->d, st->g);
    st->grads_clean = MODEL.backward_clears;
}

/* train() and gradients() start with st->grads_clean as the call before left it, when it was
 * the call right before and no `grad` buffer alive could have written the gradients since
 * (lock_state counts the calls); else 0. They end recording it. */
static void start_clean(State *st)
{
    st->grads_clean = st->grads_clean && st->clean_after == st->calls - 1 && st->grad_exports == 0;
}

static void end_clean(State *st)
{
    st->clean_after = st->calls;
}

/* train()'s step after a batch of n samples, on the parameters and gradients d, g (the module's,
 * or the batch buffers' of templates/batch.c): plain SGD (sgd_step, templates/kernels/axpy.c); any
 * other optimizer takes one step on the batch's mean gradient, on the module's threads with
 * `parallel` (train()'s batched passes, whose workers are awake: templates/batch.c). Parameter
 * gradients are zeroed for the next batch. */
static void batch_step(State *s, real *restrict d, real *restrict g, double lr, long long n, int parallel)
{
    if (MODEL.optimizer.plain_sgd) {
        sgd_step(d, g, lr / (double)n, MODEL.n_params);
        return;
    }
    optimizer_step(d, g, s->opt_m, s->opt_v, s->opt_step, lr, n > 1 ? (double)n : 1.0, 1, parallel);
}

/* How many of a sequence's positions the loops run (codegen/lower/positions.py): a training pass,
 * one past the last loss weight that is not 0 (of the batch's nb samples, the largest), so that
 * nothing past the sample's end is computed; any other pass, every position. */
static void bound_positions(real *restrict d, long slot, const long *weights, long nb)
{
    if (slot < 0)
        return;
    long n = 0;
    for (long t = 0; t < MODEL.n_positions; t++)
        for (long b = 0; b < nb; b++)
            if (d[weights[t] + b] != 0)
                n = t + 1;
    d[slot] = (real)n;
}

static void all_positions(real *restrict d, long slot)
{
    if (slot >= 0)
        d[slot] = (real)(MODEL.n_positions + 1);
}

/* The sample `row` of s into the input slots of d, forward (a training pass: bound_positions);
 * returns its loss. */
static double forward_sample(const Samples *s, Py_ssize_t row, real *restrict d)
{
    load_sample(s, row, d + MODEL.input_base);
    bound_positions(d, MODEL.positions_slot, MODEL.position_weights, 1);
    MODEL.scan_nonzeros(d);
    MODEL.forward_outputs(d);
    MODEL.forward_rest(d);
    return d[MODEL.loss_slot];
}

/* Whether train_rows leaves every parameter's gradient 0 when it is done: each batch's step
 * zeroes them (batch_step), unless plain SGD steps inside the backward pass */
static int steps_zero_gradients(long long batch)
{
    return !(MODEL.sgd_in_backward && MODEL.optimizer.plain_sgd && batch == 1);
}

/* train()'s steps (a step: a batch of `batch` rows, the last one maybe fewer): one learning rate
 * for all of them (rates 0: lr) or one each, and where each step's mean loss goes (losses, or 0:
 * nowhere), so that a schedule runs in one call instead of a call a step. */
typedef struct {
    double lr;
    const double *rates;
    double *losses;
} Schedule;

static double rate_at(const Schedule *q, Py_ssize_t step)
{
    return q->rates ? q->rates[step] : q->lr;
}

static void record_loss(const Schedule *q, Py_ssize_t step, double sum, Py_ssize_t rows)
{
    if (q->losses)
        q->losses[step] = sum / (double)rows;
}

/* One pass of train() over the rows in `order` (the samples s, loaded one at a time), without the
 * GIL (`save`: the caller's Py_BEGIN_ALLOW_THREADS state), from zero parameter gradients (the
 * caller zeroes them: templates/step.c's zero_all_gradients). Adds each row's loss to *loss_sum;
 * returns 1 when a signal handler raised (the rows done keep their steps), else 0. */
static int train_rows(State *st, const Samples *s, const Py_ssize_t *order, const Schedule *q, long long batch,
                      double *loss_sum, PyThreadState **save)
{
    real *d = st->d, *g = st->g;
    double next_check = now_ms() + SIGNAL_CHECK_MS, step_sum = 0.0;
    Py_ssize_t in_batch = 0;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        const Py_ssize_t step = i / (Py_ssize_t)batch;
        const double lr = rate_at(q, step), loss = forward_sample(s, order[i], d);
        *loss_sum += loss;
        step_sum += loss;
        if (!steps_zero_gradients(batch)) { /* (batch 1) */
            seed_before_backward(st);
            MODEL.backward_sgd_body(d, g, lr);
            MODEL.sgd_after_backward(d, g, lr);
            st->grads_clean = MODEL.backward_clears;
            record_loss(q, step, step_sum, 1);
            step_sum = 0.0;
        } else {
            backward_all(st);
            if (++in_batch == batch) { /* the mean gradient of the minibatch */
                batch_step(st, d, g, lr, batch, 0);
                record_loss(q, step, step_sum, in_batch);
                in_batch = 0;
                step_sum = 0.0;
            }
        }
        if (interrupted_at(st, i, &next_check, save))
            return 1;
    }
    if (in_batch) {
        const Py_ssize_t step = (s->n - 1) / (Py_ssize_t)batch;
        batch_step(st, d, g, rate_at(q, step), in_batch, 0);
        record_loss(q, step, step_sum, in_batch);
    }
    return 0;
}

/* gradients()'s pass sample by sample: every row of s forward and backward, the parameter
 * gradients accumulating in the module's g as backward() does, no step. */
static void gradient_rows(State *st, const Samples *s, double *loss_sum)
{
    for (Py_ssize_t i = 0; i < s->n; i++) {
        *loss_sum += forward_sample(s, i, st->d);
        backward_all(st);
    }
}

/* predict()'s pass: the outputs of every row of s into out (rows x N_OUTPUTS), without the GIL
 * as train_rows; returns 1 when interrupted. */
static int predict_rows(State *st, const Samples *s, real *restrict out, PyThreadState **save)
{
    real *d = st->d;
    double next_check = now_ms() + SIGNAL_CHECK_MS;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        load_sample(s, i, d + MODEL.input_base);
        all_positions(d, MODEL.positions_slot);
        MODEL.scan_nonzeros(d);
        MODEL.forward_outputs(d);
        for (int j = 0; j < MODEL.n_outputs; j++)
            out[i * MODEL.n_outputs + j] = d[MODEL.output_slots[j]];
        if (interrupted_at(st, i, &next_check, save))
            return 1;
    }
    return 0;
}
