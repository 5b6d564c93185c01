/* train() and predict() over whole batches: the batched program's (codegen/lower/batch.py) functions
 * (MODEL's forward_outputs_batch, forward_rest_batch, backward_batch: codegen/write/emit.py's
 * _batched_functions) on the batch buffers, where slot s of a sample b sits at s's batched slot + b
 * (batch innermost) and the parameters at 0..N_PARAMS as in d. The parameters are copied in
 * before a pass and, after training, out again; every other state (the optimizer's, the
 * step-by-step API's) stays the module's. */

/* How many reals a batch buffer starts past a 64-byte boundary: so many that its per-sample
 * rows, after the parameters, start on one, and a product's 64-byte vectors of a row (a batch of
 * 16 float32 or 8 float64 samples) each load one cache line. Loads that straddle two lines cost a
 * product up to a quarter of its speed: Intel Xeon with AVX-512, 784 x 512 by 128 float32,
 * 61 G multiply-adds/s against 82 with the inputs' rows aligned (MNIST's MLP(784, [512, 256, 10])
 * has 535,818 parameters, which left every row 40 bytes past a line). */
static size_t batch_shift(void)
{
    const size_t line = 64 / sizeof(real);
    return (line - (size_t)MODEL.n_params % line) % line;
}

/* A set of batch buffers, zeroed, batch_shift() reals past a 64-byte boundary: values d
 * (BATCH_CAPACITY times the one-sample program's slots, then the inputs' row lists, int32:
 * codegen/write/sides.py's row_scans), the constants written, and gradients g (as many, or fewer
 * where gradients live at different times share: codegen/lower/gradients.py). 0, or -1 (no
 * memory; nothing made). */
static int new_batch_set(real **d_out, real **g_out)
{
    const size_t shift = batch_shift() * sizeof(real);
    const size_t bytes = (size_t)MODEL.n_batch_slots * sizeof(real) + MODEL.batch_list_words * 4;
    const size_t grad_bytes = (size_t)MODEL.n_batch_grad_slots * sizeof(real);
    void *d = NULL, *g = NULL;
    if (posix_memalign(&d, 64, shift + bytes + 64) != 0 || posix_memalign(&g, 64, shift + grad_bytes + 64) != 0) {
        free(d);
        return -1;
    }
    memset(d, 0, shift + bytes);
    memset(g, 0, shift + grad_bytes);
    *d_out = (real *)((char *)d + shift);
    *g_out = (real *)((char *)g + shift);
    MODEL.init_batch_constants(*d_out);
    return 0;
}

/* Frees a buffer of new_batch_set (or nothing: NULL). */
static void free_batch_buffer(real *buffer)
{
    if (buffer)
        free(buffer - batch_shift());
}

/* The batch buffers st->bd, st->bg, made on first use. 0, or -1 with MemoryError set. */
static int batch_buffers(State *st)
{
    if (st->bd)
        return 0;
    if (new_batch_set(&st->bd, &st->bg) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void free_batch_buffers(State *st)
{
    for (int k = 0; k < POOL_MAX; k++) {
        free_batch_buffer(k ? st->piece_d[k] : st->bd);
        free_batch_buffer(k ? st->piece_g[k] : st->bg);
        st->piece_d[k] = st->piece_g[k] = NULL;
    }
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
        real *restrict to = a->in + k * MODEL.batch_capacity;                                      \
        for (long b = 0; b < a->nb; b++)                                                           \
            to[b] = (real)(x[a->rows[b] * s->n_x] * s->scale);                                     \
    }
static void load_byte_columns(const LoadArgs *a, long first, long last)
{
    const Samples *s = a->s;
    LOAD_COLUMNS(unsigned char)
}

#if defined(__SSE2__) && defined(__GNUC__) && !defined(__TINYC__)
#include <emmintrin.h>
typedef int LoadInts __attribute__((vector_size(16)));
typedef double LoadDoubles __attribute__((vector_size(4 * sizeof(double))));
typedef real LoadReals __attribute__((vector_size(4 * sizeof(real))));
/* uint8 X (MNIST's images), 16 samples by 16 columns at a time: each sample's 16 bytes loaded as
 * one vector, the 16 x 16 bytes transposed (interleaving rows i and i + 8, four times over), and each
 * column's 16 values widened to ints and converted as the loop above converts them (to double,
 * times the scale, to real: the same bits, tests/test_batch.py), four at a time (GCC 12 took a
 * vector of 16 bytes to doubles a byte at a time). The loop above takes a byte at a time across
 * the samples: it was 12% of predict()'s time for MNIST's MLP(784, [512, 256, 10]) float32 on 2
 * threads, Intel Xeon with AVX-512, and this 6.6%: predict() 0.92x the time, train(batch_size=128)
 * 0.97x (one process alternating the builds, 11 rounds). `tile`: 16 samples. The columns
 * [first, k) done, k returned. */
static long load_byte_tiles(const LoadArgs *tile, long first, long last)
{
    const Samples *s = tile->s;
    const unsigned char *xs = (const unsigned char *)s->x.buf;
    long k = first;
    for (; k + 16 <= last; k += 16) {
        __m128i r[16], x[16];
        for (int b = 0; b < 16; b++)
            r[b] = _mm_loadu_si128((const __m128i *)(xs + tile->rows[b] * s->n_x + k));
        for (int step = 0; step < 4; step++) {
            for (int i = 0; i < 8; i++) {
                x[2 * i] = _mm_unpacklo_epi8(r[i], r[i + 8]);
                x[2 * i + 1] = _mm_unpackhi_epi8(r[i], r[i + 8]);
            }
            memcpy(r, x, sizeof r);
        }
        const __m128i zero = _mm_setzero_si128();
        for (int c = 0; c < 16; c++) { /* r[c]: column k + c of the 16 samples, widened to 4 x 4 ints */
            const __m128i low = _mm_unpacklo_epi8(r[c], zero), high = _mm_unpackhi_epi8(r[c], zero);
            const __m128i ints[4] = {_mm_unpacklo_epi16(low, zero), _mm_unpackhi_epi16(low, zero),
                                     _mm_unpacklo_epi16(high, zero), _mm_unpackhi_epi16(high, zero)};
            real *to = tile->in + (k + c) * MODEL.batch_capacity;
            for (int q = 0; q < 4; q++) {
                LoadInts four;
                memcpy(&four, &ints[q], sizeof four);
                const LoadReals values = __builtin_convertvector(__builtin_convertvector(four, LoadDoubles) * s->scale,
                                                                 LoadReals);
                memcpy(to + 4 * q, &values, sizeof values);
            }
        }
    }
    return k;
}
#endif

static void load_columns(void *args, long first, long last)
{
    const LoadArgs *a = (const LoadArgs *)args;
    const Samples *s = a->s;
    if (element_type(&s->x) == 'B') {
        long b0 = 0;
#if defined(__SSE2__) && defined(__GNUC__) && !defined(__TINYC__)
        for (; b0 + 16 <= a->nb; b0 += 16) {
            const LoadArgs tile = {s, a->rows + b0, 16, a->in + b0};
            load_byte_columns(&tile, load_byte_tiles(&tile, first, last), last); /* (the columns after the tiles) */
        }
#endif
        const LoadArgs rest = {s, a->rows + b0, a->nb - b0, a->in + b0}; /* (the samples after them) */
        load_byte_columns(&rest, first, last);
    } else if (s->x.itemsize == 4)
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
    real *in = bd + MODEL.batch_input_base;
    LoadArgs args = {s, rows, nb, in};
    if (s->n_x * nb < BATCH_PARALLEL_MIN)
        load_columns(&args, 0, s->n_x);
    else
        parallel_pass(load_columns, &args, s->n_x, 16);
    for (Py_ssize_t k = s->n_x; k < MODEL.n_inputs; k++) {
        real *restrict to = in + k * MODEL.batch_capacity;
        for (long b = 0; b < nb; b++)
            to[b] = s->have_y && !s->y_is_labels ? (real)read_float(&s->y, rows[b] * s->n_y + (k - s->n_x))
                  : s->have_y ? 0 : inputs[k];
    }
    if (s->have_y && s->y_is_labels)
        for (long b = 0; b < nb; b++)
            in[(s->n_x + read_int(&s->y, rows[b])) * MODEL.batch_capacity + b] = 1;
}

/* The per-sample gradients (all but the parameters') of the first nb samples back to 0, on the
 * module's threads: a slot's BATCH_CAPACITY values at a time (a row), the rows of
 * BATCH_CLEAR_RUNS (backward_batch writes the others rather than adding to them: a layer's
 * inputs' gradients and its activation's, which only its product adds to; the zoo's CNN at
 * B = 32, float64, had 1.4 MB of them to clear a batch); a sequence's on the caller's alone,
 * whose statement loops read them next (from the other core's cache, had it cleared them: microgpt
 * at 16 documents ran 1.06x slower on 2 threads than on 1, Zen 3). first, last: the rows to
 * clear counted along the runs, the runs' first row first. */
typedef struct {
    real *g;
    long nb;
} ClearArgs;

static void clear_slots(void *args, long first, long last)
{
    const ClearArgs *a = (const ClearArgs *)args;
    long at = 0; /* (the rows of the runs before run r) */
    for (long r = 0; r < MODEL.n_batch_clear_runs && at < last; r++) {
        const long run = MODEL.batch_clear_runs[r][0], count = MODEL.batch_clear_runs[r][1];
        const long from = first > at ? first - at : 0, to = last - at < count ? last - at : count;
        real *rows = a->g + MODEL.n_params + run * MODEL.batch_capacity;
        if (a->nb == MODEL.batch_capacity && from < to)
            memset(rows + from * MODEL.batch_capacity, 0, (size_t)(to - from) * MODEL.batch_capacity * sizeof(real));
        else
            for (long row = from; row < to; row++)
                memset(rows + row * MODEL.batch_capacity, 0, (size_t)a->nb * sizeof(real));
        at += count;
    }
}

static void clear_batch_gradients(real *g, long nb)
{
    long slots = 0; /* (the rows to clear) */
    for (long r = 0; r < MODEL.n_batch_clear_runs; r++)
        slots += MODEL.batch_clear_runs[r][1];
    ClearArgs args = {g, nb};
    if (slots * nb < BATCH_PARALLEL_MIN || MODEL.batch_active_base >= 0)
        clear_slots(&args, 0, slots);
    else
        parallel_pass(clear_slots, &args, slots, 16);
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
    int lo = 0, hi = MODEL.n_batch_stepped_runs;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (MODEL.batch_stepped_runs[mid][0] + MODEL.batch_stepped_runs[mid][1] <= first)
            lo = mid + 1;
        else
            hi = mid;
    }
    long at = first;
    for (int r = lo; r <= MODEL.n_batch_stepped_runs && at < last; r++) {
        const long run = MODEL.batch_stepped_runs[r][0], end = run + MODEL.batch_stepped_runs[r][1];
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

/* Whether backward_batch steps every parameter when it steps (BATCH_STEPPED_RUNS cover them). */
static int all_stepped_in_backward(void)
{
    long count = 0;
    for (int r = 0; r < MODEL.n_batch_stepped_runs; r++)
        count += MODEL.batch_stepped_runs[r][1];
    return count == MODEL.n_params;
}

static void step_after_batch(State *st, real *d, real *g, double lr, long long n, int stepped)
{
    if (!MODEL.optimizer.plain_sgd) {
        batch_step(st, d, g, lr, n, 1);
        return;
    }
    if (stepped && all_stepped_in_backward()) /* (no pass over the threads for nothing) */
        return;
    SgdArgs args = {d, g, sgd_rate(lr, n), stepped};
    if (MODEL.n_params < 65536)
        sgd_rows(&args, 0, MODEL.n_params);
    else
        parallel_pass(sgd_rows, &args, MODEL.n_params, 4096);
}

/* The samples a piece of a batch of `count` holds (add_batch_gradients): BATCH_CAPACITY, but a
 * sequence's batch of more than 8 that would be one piece runs as two pieces side by side (halves
 * rounded up to 8), so that its statement loops (attention, softmax, norms), which a piece runs
 * on one thread, take two cores: microgpt's default at 16 documents a step on a pass of 16,
 * 0.75-0.81x the time of one piece (float64), 0.97x (float32), on 2 cores of Zen 3; on one
 * thread 1.21x, 1.35x (a pass's lanes half full: a module's own batch size runs as full pieces,
 * codegen/lower/batch.py's pass_capacity). It depends on the count alone, so that a batch's
 * pieces, and its sums, are the same for any number of threads. */
static long piece_samples(long long count)
{
    if (MODEL.batch_active_base < 0 || count <= 8 || count > MODEL.batch_capacity)
        return MODEL.batch_capacity;
    return (long)((count + 1) / 2 + 7) / 8 * 8;
}

/* Whether backward_batch can take train()'s SGD steps on the weights of BATCH_STEPPED_RUNS (see
 * matmul_nt): plain SGD, and batches of one piece (train() starts from zero gradients); a batch of
 * one piece is followed only by shorter ones, also of one piece. */
static int backward_steps(long long batch)
{
    return MODEL.optimizer.plain_sgd && MODEL.n_batch_stepped_runs > 0 && batch <= piece_samples(batch);
}

/* A training pass's nb samples in rows[] (loaded into d) reordered longest document first
 * (stably; a document's length is one past its last loss weight that is not 0, as in
 * bound_positions) into sorted[], and how many of them reach each position p into
 * d[batch_active_base + p]: the batched program's loops of position p run over those first
 * samples only (codegen/lower/batch.py's _active_samples). Returns the rows to load: rows itself
 * when already in that order. */
static const Py_ssize_t *longest_first(real *restrict d, const Py_ssize_t *rows, long nb, Py_ssize_t *sorted)
{
    long length[MODEL.batch_capacity], order[MODEL.batch_capacity];
    int moved = 0;
    for (long b = 0; b < nb; b++) {
        length[b] = 0;
        for (long t = 0; t < MODEL.n_positions; t++)
            if (d[MODEL.batch_position_weights[t] + b] != 0)
                length[b] = t + 1;
        long at = b; /* insertion: after every longer or equal one */
        while (at > 0 && length[order[at - 1]] < length[b]) {
            order[at] = order[at - 1];
            at--;
            moved = 1;
        }
        order[at] = b;
    }
    for (long p = 0; p < MODEL.n_positions; p++) {
        long count = 0;
        while (count < nb && length[order[count]] > p)
            count++;
        d[MODEL.batch_active_base + p] = (real)count;
    }
    for (long b = 0; b < nb; b++)
        sorted[b] = rows[order[b]];
    return moved ? sorted : rows;
}

/* A sequence program's sample's length (one past its last loss weight that is not 0, as
 * longest_first counts it), read from its row; a weight that is not in the rows counts as 0. */
static long sample_length(const Samples *s, Py_ssize_t row)
{
    long length = 0;
    for (long t = 0; t < MODEL.n_positions; t++) {
        const Py_ssize_t j = MODEL.position_weights[t] - MODEL.input_base;
        if ((j < s->n_x || s->have_y) && (real)row_input(s, row, j) != 0)
            length = t + 1;
    }
    return length;
}

/* The `count` rows of order[] sorted longest first (stably: counting by length) when they run in
 * several pieces of `piece` samples and the program is a sequence's: each piece then holds
 * documents of like lengths, whose loops stop sooner (longest_first). A new array (the caller
 * frees it), or NULL: the rows as given (one piece, no sequence, or no memory for it). */
static Py_ssize_t *longest_first_pieces(const Samples *s, const Py_ssize_t *order, Py_ssize_t count, long piece)
{
    if (MODEL.batch_active_base < 0 || count <= piece)
        return NULL;
    Py_ssize_t *sorted = malloc((size_t)count * sizeof *sorted), *at = calloc(MODEL.n_positions + 1, sizeof *at);
    long *length = malloc((size_t)count * sizeof *length);
    if (!sorted || !at || !length) {
        free(sorted), free(at), free(length);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        at[length[i] = sample_length(s, order[i])]++;
    Py_ssize_t first = 0; /* where each length's rows start, the longest's first */
    for (long n = MODEL.n_positions; n >= 0; n--) {
        const Py_ssize_t rows = at[n];
        at[n] = first;
        first += rows;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        sorted[at[length[i]]++] = order[i];
    free(at), free(length);
    return sorted;
}

/* Every sample reaches every position: any pass but training's. */
static void all_active(real *restrict d, long nb)
{
    if (MODEL.batch_active_base >= 0)
        for (long p = 0; p < MODEL.n_positions; p++)
            d[MODEL.batch_active_base + p] = (real)nb;
}

/* One piece: the nb samples rows[] (at most BATCH_CAPACITY) forward and backward on the batch
 * buffers d, g (the parameters in them), their parameter gradients added to g[0..N_PARAMS), each
 * one's loss into losses[0..nb). rate: 0, or the SGD step's, which backward_batch takes on the
 * weights of BATCH_STEPPED_RUNS. Touches nothing of the module's but its input slots, read. */
static void run_piece(const Samples *s, const Py_ssize_t *rows, long nb, const real *inputs, real *d, real *g,
                      real *losses, real rate)
{
    Py_ssize_t sorted[MODEL.batch_capacity];
    load_batch(s, rows, nb, inputs, d);
    if (MODEL.batch_active_base >= 0) {
        const Py_ssize_t *longest = longest_first(d, rows, nb, sorted);
        if (longest != rows)
            load_batch(s, longest, nb, inputs, d);
    }
    bound_positions(d, MODEL.batch_positions_slot, MODEL.batch_position_weights, nb);
    MODEL.scan_batch_rows(d, nb);
    MODEL.forward_outputs_batch(d, nb);
    MODEL.forward_rest_batch(d, nb);
    for (long b = 0; b < nb; b++)
        losses[b] = d[MODEL.batch_loss_slot + b];
    /* every sample's loss has gradient 1; the other per-sample gradients restart from 0 (as
     * the last backward_batch left them, when it sets back what it reads: they start 0) */
    if (!MODEL.batch_backward_clears)
        clear_batch_gradients(g, nb);
    for (long b = 0; b < nb; b++)
        g[MODEL.batch_loss_grad_slot + b] = 1;
    MODEL.backward_batch(d, g, nb, rate);
}

/* The sets of batch buffers of work run side by side on the module's threads (run_pieces,
 * predict_passes): one a thread, the caller's st->bd, st->bg (set 0) or one of st->piece_d,
 * piece_g, the parameters copied in from st->bd once a call. */
typedef struct {
    pthread_mutex_t lock;                /* guards the fields below */
    int busy[POOL_MAX], fresh[POOL_MAX]; /* a set in use; its parameters copied in for this call */
} SideSets;

/* A set no thread uses, now this one's, its parameters copied in. */
static int take_set(State *st, SideSets *sets)
{
    pthread_mutex_lock(&sets->lock);
    int set = 0;
    while (sets->busy[set]) /* (as many sets as threads run this) */
        set++;
    sets->busy[set] = 1;
    pthread_mutex_unlock(&sets->lock);
    if (!sets->fresh[set]) {
        memcpy(set ? st->piece_d[set] : st->bd, st->bd, MODEL.n_params * sizeof(real));
        sets->fresh[set] = 1;
    }
    return set;
}

static void give_back_set(SideSets *sets, int set)
{
    pthread_mutex_lock(&sets->lock);
    sets->busy[set] = 0;
    pthread_mutex_unlock(&sets->lock);
}

/* Whether `count` pieces of work run side by side: more than one thread takes them, and each has
 * a set of batch buffers (made here if need be; short of memory, they run on one thread). */
static int side_by_side(State *st, long count)
{
    const int threads = pool_parts() < count ? pool_parts() : (int)count;
    int sets = 1;
    while (sets < threads && (st->piece_d[sets] || new_batch_set(&st->piece_d[sets], &st->piece_g[sets]) == 0))
        sets++;
    return threads > 1 && sets == threads;
}

/* pieces run side by side at most (a round, whose gradients are then added up): the memory of
 * their gradients, and no bound on the threads that matters on the machines measured */
#define PIECES_AT_ONCE 16

/* A sequence's pieces side by side: each runs whole on one of the module's threads, on a set of
 * batch buffers of its own (the caller's st->bd, st->bg or one of st->piece_d, piece_g), from
 * zero parameter gradients, which it leaves in grads[piece] (a call's last piece, where no later
 * call of the round can need its set, in the set itself: `keep`); the caller adds them up in the
 * pieces' order. Its statement loops (attention, softmax, norms: most of a step at n_embd 64)
 * then run on every core, which a piece's own products alone did not, and every sum is the same
 * bits for any thread count: a document's in its piece, the pieces' in a fixed order. */
typedef struct {
    State *st;
    const Samples *s;
    const Py_ssize_t *order; /* this round's rows */
    Py_ssize_t count;
    long piece;   /* samples a piece (piece_samples) */
    real *grads;  /* a round's pieces x N_PARAMS */
    const real *grads_of[PIECES_AT_ONCE]; /* each piece's gradients: in grads, or in its set's buffer */
    int keep;     /* kept sets stay busy until their gradients are added */
    real *losses; /* count */
    SideSets sets;
} PiecesArgs;

/* A round's pieces' gradients added to the sum so far, each parameter's in the pieces' order (the
 * same bits on any thread), on the module's threads: the bigger GPT's 103,936 parameters from 2
 * pieces took 1.3% of its step on the caller alone. With `to`, the sum also copied there. A block
 * of parameters at a time, every piece's, then the next: the sum read and written once, not once a
 * piece and again for the copy (1.3% of the bigger GPT's samples on Zen 5 in passes over all). */
typedef struct {
    real *sum, *to;
    const real *const *grads_of;
    long pieces;
} PieceSums;

#define PIECE_SUMS_BLOCK 1024 /* parameters summed at a time: 4-8 KB, kept in the L1 over the pieces */
static void add_piece_gradients(void *args, long first, long last)
{
    const PieceSums *a = (const PieceSums *)args;
    real *restrict sum = a->sum;
    for (long j0 = first; j0 < last; j0 += PIECE_SUMS_BLOCK) {
        const long j1 = last - j0 < PIECE_SUMS_BLOCK ? last : j0 + PIECE_SUMS_BLOCK;
        for (long piece = 0; piece < a->pieces; piece++) {
            const real *restrict add = a->grads_of[piece];
            for (long j = j0; j < j1; j++)
                sum[j] += add[j];
        }
        if (a->to)
            memcpy(a->to + j0, sum + j0, (size_t)(j1 - j0) * sizeof(real));
    }
}

static void run_pieces(void *args, long first, long last)
{
    PiecesArgs *a = (PiecesArgs *)args;
    State *st = a->st;
    const int set = take_set(st, &a->sets);
    real *d = set ? st->piece_d[set] : st->bd, *g = set ? st->piece_g[set] : st->bg;
    const long pieces = (long)((a->count + a->piece - 1) / a->piece);
    for (long chunk = first; chunk < last; chunk++) {
        /* chunks 0, 1, 2, 3, ... are pieces 0, n - 1, 1, n - 2, ...: the pieces run longest first
         * (longest_first_pieces), and the pool's shares are runs of chunks, each then a mix */
        const long piece = chunk % 2 ? pieces - 1 - chunk / 2 : chunk / 2;
        const Py_ssize_t at = piece * a->piece;
        const long nb = a->count - at < a->piece ? (long)(a->count - at) : a->piece;
        memset(g, 0, MODEL.n_params * sizeof(real));
        run_piece(a->s, a->order + at, nb, st->d + MODEL.input_base, d, g, a->losses + at, 0);
        if (a->keep && chunk == last - 1) {
            a->grads_of[piece] = g; /* (read in place: the bigger GPT copied 1.4% of its step) */
            return;
        }
        memcpy(a->grads + piece * MODEL.n_params, g, MODEL.n_params * sizeof(real));
        a->grads_of[piece] = a->grads + piece * MODEL.n_params;
    }
    give_back_set(&a->sets, set);
}

/* The pieces of `piece` samples of order[0..count) side by side (run_pieces), PIECES_AT_ONCE at a
 * time, their parameter gradients added to st->bg's in the pieces' order, their losses to
 * *loss_sum in the samples' order; 0, or -1 (no memory for the pieces' gradients: nothing done). */
static int add_pieces_side_by_side(State *st, const Samples *s, const Py_ssize_t *order, Py_ssize_t count,
                                   long piece, double *loss_sum)
{
    const long all = (long)((count + piece - 1) / piece);
    const long at_once = all < PIECES_AT_ONCE ? all : PIECES_AT_ONCE;
    const Py_ssize_t round = (Py_ssize_t)at_once * piece;
    PiecesArgs a = {.st = st, .s = s, .order = order, .piece = piece,
                    .grads = malloc((size_t)(at_once + 1) * MODEL.n_params * sizeof(real)),
                    .losses = malloc((size_t)round * sizeof(real)), .sets = {PTHREAD_MUTEX_INITIALIZER}};
    if (!a.grads || !a.losses) {
        free(a.grads), free(a.losses);
        return -1;
    }
    a.sets.fresh[0] = 1;
    real *sum = a.grads + at_once * MODEL.n_params; /* the gradients so far, each piece's added */
    memcpy(sum, st->bg, MODEL.n_params * sizeof(real));
    for (Py_ssize_t done = 0; done < count; done += round) {
        a.order = order + done;
        a.count = count - done < round ? count - done : round;
        const long pieces = (long)((a.count + piece - 1) / piece);
        /* (as a product: while train() holds the workers, they poll for the next batch's pieces
         * rather than sleep, since waking a sleeping worker (a futex, and on a VM the host waking
         * its halted vCPU) cost default microgpt at 16 documents a step 10% of it: 0.90x the
         * time, 64 documents 0.94x, the bigger GPT 0.99x; Zen 5 under KVM, 2 vCPUs) */
        /* a call's last piece keeps its gradients in its set where no later call of the round can
         * need that set: no more pieces than sets (a call runs one piece at least) */
        const int side = side_by_side(st, pieces);
        a.keep = pieces <= (side ? pool_parts() : 1);
        if (side)
            parallel_rows(run_pieces, &a, pieces, 1);
        else
            run_pieces(&a, 0, pieces);
        PieceSums sums = {sum, done + round >= count ? st->bg : NULL, a.grads_of, pieces};
        if (MODEL.n_params * pieces < BATCH_PARALLEL_MIN)
            add_piece_gradients(&sums, 0, MODEL.n_params);
        else
            parallel_pass(add_piece_gradients, &sums, MODEL.n_params, 64);
        if (a.keep)
            memset(a.sets.busy, 0, sizeof a.sets.busy); /* (the kept sets, given back) */
        for (Py_ssize_t b = 0; b < a.count; b++)
            *loss_sum += a.losses[b];
    }
    free(a.grads), free(a.losses);
    return 0;
}

/* The rows order[0..count) (a sequence's longest first, when they are several pieces:
 * longest_first_pieces) forward and backward in pieces of at most piece_samples(count) samples on
 * the batch buffers d, g (the parameters copied in), their parameter gradients added to
 * g[0..N_PARAMS), their losses to *loss_sum: a batch of train(), or gradients()'s rows. A
 * sequence's pieces run side by side (add_pieces_side_by_side), others one after another, each
 * piece's products on every thread. rate: 0, or (one piece) the SGD step's, which backward_batch
 * takes on the weights of BATCH_STEPPED_RUNS. */
static void add_batch_gradients(State *st, const Samples *s, const Py_ssize_t *order, Py_ssize_t count,
                                double *loss_sum, real rate)
{
    real losses[MODEL.batch_capacity];
    const long piece = piece_samples(count);
    Py_ssize_t *pieces = longest_first_pieces(s, order, count, piece);
    if (pieces)
        order = pieces;
    if (!pieces || add_pieces_side_by_side(st, s, order, count, piece, loss_sum) < 0)
        for (Py_ssize_t first = 0; first < count; first += piece) {
            const long nb = count - first < piece ? (long)(count - first) : piece;
            run_piece(s, order + first, nb, st->d + MODEL.input_base, st->bd, st->bg, losses, rate);
            for (long b = 0; b < nb; b++)
                *loss_sum += losses[b];
        }
    free(pieces);
}

/* The samples rows[0..n)' X into the cache (the next batch's, while this one runs): they are rows
 * of X in the shuffled order, whose cache lines load_batch otherwise waits for from memory.
 * MNIST's MLP(784, [512, 256, 10]) float32 at B = 32, AMD Zen 5 (2 vCPUs), our processes' windows
 * in turn: train() 0.971-0.984x the time on 2 threads (30 rounds: 0.980x), 0.956-1.006x on 1. */
static void prefetch_samples(const Samples *s, const Py_ssize_t *rows, Py_ssize_t n)
{
#if defined(__GNUC__) && !defined(__TINYC__) /* (TCC has no prefetch) */
    const size_t row_bytes = (size_t)s->n_x * (size_t)s->x.itemsize;
    for (Py_ssize_t r = 0; r < n && row_bytes; r++) {
        const char *x = (const char *)s->x.buf + (size_t)rows[r] * row_bytes;
        for (size_t at = 0; at < row_bytes; at += 64)
            __builtin_prefetch(x + at, 0, 2);
        __builtin_prefetch(x + row_bytes - 1, 0, 2); /* (a row that does not start on a line) */
    }
#else
    (void)s, (void)rows, (void)n;
#endif
}

/* train_rows (templates/driver.c) over batches of `batch` rows, each run in pieces of at most
 * BATCH_CAPACITY samples whose parameter gradients add up before the batch's step. */
static int train_batches(State *st, const Samples *s, const Py_ssize_t *order, const Schedule *q, long long batch,
                         double *loss_sum, PyThreadState **save)
{
    real *d = st->bd, *g = st->bg;
    double next_check = now_ms() + SIGNAL_CHECK_MS;
    int interrupted = 0;
    memcpy(d, st->d, MODEL.n_params * sizeof(real));
    memcpy(g, st->g, MODEL.n_params * sizeof(real));
    const int stepping = backward_steps(batch), threads = pool_threads; /* (the call's: use_threads) */
    pool_hold(1);
    for (Py_ssize_t i = 0; i < s->n && !interrupted;) {
        const Py_ssize_t end = s->n - i < batch ? s->n : i + (Py_ssize_t)batch, step = i / (Py_ssize_t)batch;
        const double lr = rate_at(q, step), started = now_ms();
        const real rate = stepping ? sgd_rate(lr, end - i) : 0; /* (0 when lr is) */
        double step_sum = 0.0;
        pool_threads = threads_for_batch(&st->choice, threads);
        prefetch_samples(s, order + end, s->n - end < batch ? s->n - end : (Py_ssize_t)batch);
        add_batch_gradients(st, s, order + i, end - i, &step_sum, rate);
        *loss_sum += step_sum;
        record_loss(q, step, step_sum, end - i);
        step_after_batch(st, d, g, lr, end - i, rate != 0);
        record_batch(&st->choice, threads, (now_ms() - started) / (double)(end - i));
        interrupted = interrupted_now(st, &next_check, save);
        i = end;
    }
    pool_threads = threads;
    pool_hold(0);
    memcpy(st->d, d, MODEL.n_params * sizeof(real));
    memcpy(st->g, g, MODEL.n_params * sizeof(real));
    return interrupted;
}

/* gradients()'s pass: every row of s (in order) forward and backward, their parameter gradients
 * added to the module's g[0..N_PARAMS), no step. The parameters and those gradients go into the
 * batch buffers and the gradients come back (a copy of 3 N_PARAMS reals per call: the batched
 * program addresses the parameters inside its own buffers). */
static void gradient_batches(State *st, const Samples *s, double *loss_sum)
{
    Py_ssize_t rows[MODEL.batch_capacity];
    memcpy(st->bd, st->d, MODEL.n_params * sizeof(real));
    memcpy(st->bg, st->g, MODEL.n_params * sizeof(real));
    pool_hold(1);
    for (Py_ssize_t first = 0; first < s->n; first += MODEL.batch_capacity) {
        const Py_ssize_t count = s->n - first < MODEL.batch_capacity ? s->n - first : MODEL.batch_capacity;
        for (Py_ssize_t b = 0; b < count; b++)
            rows[b] = first + b;
        add_batch_gradients(st, s, rows, count, loss_sum, 0);
    }
    pool_hold(0);
    memcpy(st->g, st->bg, MODEL.n_params * sizeof(real));
}

/* predict_rows's passes side by side: each of the module's threads runs whole passes of
 * BATCH_CAPACITY rows (every product of a pass on that thread) on a set of batch buffers of its
 * own, instead of every pass's products split between the threads by their rows. A layer's
 * results are the next one's inputs: split by rows, each thread read the half the other core
 * had written (a cache line between the cores takes ~120 ns on an Intel Xeon VM), and the
 * second layer of MNIST's MLP(784, [512, 256, 10]) ran 1.68x faster on 2 threads than on 1.
 * The weights, read only, are in both cores' caches. The passes are the same rows whichever
 * thread runs them, so the outputs are the same bits with any count. */
typedef struct {
    State *st;
    const Samples *s;
    real *out;
    Py_ssize_t first, count; /* this round's rows */
    SideSets sets;
} PredictArgs;

/* Passes [first, last) of a round, on a set of batch buffers of this thread's. */
static void predict_passes(void *args, long first, long last)
{
    PredictArgs *a = (PredictArgs *)args;
    State *st = a->st;
    const int set = take_set(st, &a->sets);
    real *d = set ? st->piece_d[set] : st->bd;
    Py_ssize_t rows[MODEL.batch_capacity];
    for (long pass = first; pass < last; pass++) {
        const Py_ssize_t at = a->first + pass * MODEL.batch_capacity;
        const long nb = a->first + a->count - at < MODEL.batch_capacity ? (long)(a->first + a->count - at)
                                                                         : MODEL.batch_capacity;
        for (long b = 0; b < nb; b++)
            rows[b] = at + b;
        load_batch(a->s, rows, nb, st->d + MODEL.input_base, d);
        all_positions(d, MODEL.batch_positions_slot);
        all_active(d, nb);
        MODEL.scan_batch_rows(d, nb);
        MODEL.forward_outputs_batch(d, nb);
        for (long b = 0; b < nb; b++)
            for (int j = 0; j < MODEL.n_outputs; j++)
                a->out[(at + b) * MODEL.n_outputs + j] = d[MODEL.batch_output_slots[j] + b];
    }
    give_back_set(&a->sets, set);
}

/* passes a round of predict_batches takes a thread (between two checks for a signal) */
#define PREDICT_ROUND_PASSES 8

/* predict_rows over passes of BATCH_CAPACITY rows, side by side on the module's threads
 * (predict_passes; one after another, each pass's products on every thread, when there is one
 * pass, one thread, or no memory for the threads' buffers). */
static int predict_batches(State *st, const Samples *s, real *restrict out, PyThreadState **save)
{
    double next_check = now_ms() + SIGNAL_CHECK_MS;
    int interrupted = 0;
    memcpy(st->bd, st->d, MODEL.n_params * sizeof(real));
    const long passes = (long)((s->n + MODEL.batch_capacity - 1) / MODEL.batch_capacity);
    const int together = side_by_side(st, passes);
    const Py_ssize_t round = (Py_ssize_t)MODEL.batch_capacity * (together ? PREDICT_ROUND_PASSES * pool_parts() : 1);
    PredictArgs a = {st, s, out, 0, 0, {PTHREAD_MUTEX_INITIALIZER}};
    a.sets.fresh[0] = 1;
    pool_hold(1);
    for (Py_ssize_t first = 0; first < s->n && !interrupted; first += round) {
        a.first = first;
        a.count = s->n - first < round ? s->n - first : round;
        const long count = (long)((a.count + MODEL.batch_capacity - 1) / MODEL.batch_capacity);
        if (together)
            parallel_pass(predict_passes, &a, count, 1);
        else
            predict_passes(&a, 0, count);
        interrupted = interrupted_now(st, &next_check, save);
    }
    pool_hold(0);
    return interrupted;
}
