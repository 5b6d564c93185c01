/* A micrograd-c model's own C: the generated graph (codegen/write/emit.py: the prelude, the
 * layout, the tables and the generated functions), then its descriptor MODEL, the contract
 * (templates/model.h) through which the module runtime (templates/runtime.c, compiled once per
 * compiler and flags, linked beside this unit) runs it, and the module's PyInit_<name>. The
 * layout's names are codegen/write/contract.py's; each is checked here, so that a missing one
 * is a clear error rather than a silent 0 in an #if. */
@CONSTANTS@

/* ---- the graph: prelude, kernels, layout, generated functions ------------------------- */
@GRAPH@

/*@INCLUDE model.h@*/

/* ---- the descriptor ------------------------------------------------------------------------ */
#if !defined(N_SLOTS) || !defined(N_PARAMS) || !defined(N_INPUTS) || !defined(INPUT_BASE) || !defined(LOSS_SLOT)
#error "the layout (N_SLOTS, N_PARAMS, N_INPUTS, INPUT_BASE, LOSS_SLOT) must be defined: codegen/write/contract.py"
#endif
#if !defined(N_OUTPUTS) || !defined(SGD_IN_BACKWARD) || !defined(N_CONSTANTS) || !defined(NONZERO_WORDS)
#error "N_OUTPUTS, SGD_IN_BACKWARD, N_CONSTANTS and NONZERO_WORDS must be defined: codegen/write/contract.py"
#endif
#if !defined(N_TRACKED_ROWS) || !defined(N_SNAPSHOT) || !defined(N_SWEPT_RUNS) || !defined(N_SGD_AFTER_RUNS) \
    || !defined(STEP_OWN_BACKWARD)
#error "N_TRACKED_ROWS, STEP_OWN_BACKWARD, N_SNAPSHOT, N_SWEPT_RUNS and N_SGD_AFTER_RUNS must be defined: codegen/write/contract.py's StepTables"
#endif
#if !defined(HAVE_BATCH) || !defined(MODULE_NAME_STR) || !defined(MODULE_INIT)
#error "HAVE_BATCH, MODULE_NAME_STR and MODULE_INIT must be defined: codegen/write/contract.py"
#endif
#if !defined(OPTIMIZER) || !defined(PLAIN_SGD) || !defined(OPTIMIZER_STATE_ARRAYS) || !defined(OPTIMIZER_REPR)
#error "the optimizer (OPTIMIZER, PLAIN_SGD, OPTIMIZER_STATE_ARRAYS, ...) must be defined: codegen/write/optim.py"
#endif

/* ---- the steps over the tables (codegen/write/contract.py's StepTables) -------------------- */
/* The SGD step of the parameters that backward does not step itself */
static void sgd_after_backward(real *restrict d, real *restrict g, real lr)
{
    for (long r = 0; r < N_SGD_AFTER_RUNS; r++)
        for (long i = SGD_AFTER_RUNS[r][0]; i < SGD_AFTER_RUNS[r][0] + SGD_AFTER_RUNS[r][1]; i++) {
            d[i] -= lr * g[i];
            g[i] = 0;
        }
}

/* The step-by-step API's tracked rows (templates/step.c). Row r's stamp against the generation
 * gen (which zero_grad() advances by 2) says what it holds: == gen, its gradient; == gen + 1,
 * 0 + rank1[r] * its snapshot (one contribution so far, not written out); otherwise stale values
 * standing for zeros. backward_tracked_body lists the rows it stamps in live[1..live[0]]. */

/* `param -= lr * grad` over the listed rows */
static void sgd_live_rows(real *restrict d, const real *restrict g, const uint64_t *restrict stamp,
                          const real *restrict rank1, const real *restrict snap, const uint32_t *restrict live,
                          uint64_t gen, real lr)
{
    for (uint32_t j = 1; j <= live[0]; j++) {
        const uint32_t r = live[j];
        if (stamp[r] == gen + 1)
            sgd_rank1_row(d + ROW_START[r], lr, rank1[r], snap + ROW_SNAPSHOT[r], ROW_LENGTH[r]);
        else
            sgd_row(d + ROW_START[r], lr, g + ROW_START[r], ROW_LENGTH[r]);
    }
}

/* Writes out the rank-one rows and, with all, zeroes the stale ones, stamping them current */
static void write_rows(real *restrict g, uint64_t *restrict stamp, const real *restrict rank1,
                       const real *restrict snap, uint64_t gen, int all)
{
    for (long r = 0; r < N_TRACKED_ROWS; r++) {
        real *restrict q = g + ROW_START[r];
        if (stamp[r] == gen + 1) {
            const real a = rank1[r];
            for (long k = 0; k < ROW_LENGTH[r]; k++)
                q[k] = (real)0 + a * snap[ROW_SNAPSHOT[r] + k];
        } else if (all && stamp[r] != gen) {
            memset(q, 0, ROW_LENGTH[r] * sizeof(real));
        } else {
            continue;
        }
        stamp[r] = gen;
    }
}

#if N_TRACKED_ROWS == 0 && !STEP_OWN_BACKWARD /* the step's backward is the ordinary one */
#define backward_tracked_body(d, g, stamp, rank1, snap, live, gen)                                  \
    ((void)(stamp), (void)(rank1), (void)(snap), (void)(live), (void)(gen), backward_body(d, g))
#endif

/* backward_tracked_body is a function, or a macro (no tracked rows): the descriptor takes this */
static void tracked_backward(real *restrict d, real *restrict g, uint64_t *restrict stamp, real *restrict rank1,
                             real *restrict snap, uint32_t *restrict live, uint64_t gen)
{
    backward_tracked_body(d, g, stamp, rank1, snap, live, gen);
}

#ifdef POSITIONS_SLOT /* loops bounded by a sequence's length (codegen/lower/positions.py) */
static const long POSITION_WEIGHTS[] = {POSITION_WEIGHTS_LIST};
#else
#define POSITIONS_SLOT (-1)
#define N_POSITIONS 0
static const long POSITION_WEIGHTS[1] = {0};
#endif
#ifdef BATCH_POSITIONS_SLOT
static const long BATCH_POSITION_WEIGHTS[] = {BATCH_POSITION_WEIGHTS_LIST};
#else
#define BATCH_POSITIONS_SLOT (-1)
static const long BATCH_POSITION_WEIGHTS[1] = {0};
#endif
#ifndef BATCH_ACTIVE_BASE
#define BATCH_ACTIVE_BASE (-1)
#endif
#ifndef BACKWARD_CLEARS /* the runtime clears the gradients before each backward */
#define BACKWARD_CLEARS 0
#endif
#ifndef BATCH_BACKWARD_CLEARS
#define BATCH_BACKWARD_CLEARS 0
#endif
#ifndef TABLE_WORDS /* no table form: every statement compiled (codegen/write/table.py) */
#define TABLE_WORDS 0
static const char TABLE_TEXT[] = "";
static const int32_t *table;
#endif
#ifndef N_INDEX_INPUTS /* no gathers */
#define N_INDEX_INPUTS 0
static const long INDEX_INPUTS[1][2] = {{0, 0}};
#endif
static const char *const OPTIMIZER_NAMES[] = {OPTIMIZER_STATE_NAMES};
static const long OPTIMIZER_STARTS[] = {OPTIMIZER_STATE_STARTS};

SHARED const Model MODEL = {
    .real_size = (int)sizeof(real),
    .name = MODULE_NAME_STR,
    .grad_type_name = MODULE_NAME_STR ".GradBuffer",
    .n_slots = N_SLOTS,
    .n_params = N_PARAMS,
    .n_inputs = N_INPUTS,
    .input_base = INPUT_BASE,
    .loss_slot = LOSS_SLOT,
    .n_outputs = N_OUTPUTS,
    .output_slots = OUTPUT_SLOTS,
    .sgd_in_backward = SGD_IN_BACKWARD,
    .n_constants = N_CONSTANTS,
#ifdef HAVE_INITIAL_PARAMS
    .initial_params = INITIAL_PARAMS,
#endif
    .positions_slot = POSITIONS_SLOT,
    .n_positions = N_POSITIONS,
    .position_weights = POSITION_WEIGHTS,
    .backward_clears = BACKWARD_CLEARS,
    .n_index_inputs = N_INDEX_INPUTS,
    .index_inputs = INDEX_INPUTS,
    .nonzero_words = NONZERO_WORDS,
    .n_tracked_rows = N_TRACKED_ROWS,
    .n_snapshot = N_SNAPSHOT,
    .n_swept_runs = N_SWEPT_RUNS,
    .swept_runs = SWEPT_RUNS,
    .table_words = TABLE_WORDS,
    .table_text = TABLE_TEXT,
    .table = &table,
    .init_constants = init_constants,
    .scan_nonzeros = scan_nonzeros,
    .forward_outputs = forward_outputs,
    .forward_rest = forward_rest,
    .backward_body = backward_body,
    .backward_sgd_body = backward_sgd_body,
    .sgd_after_backward = sgd_after_backward,
    .backward_tracked_body = tracked_backward,
    .sgd_live_rows = sgd_live_rows,
    .write_rows = write_rows,
    .have_batch = HAVE_BATCH,
    .batch_positions_slot = BATCH_POSITIONS_SLOT,
    .batch_position_weights = BATCH_POSITION_WEIGHTS,
    .batch_active_base = BATCH_ACTIVE_BASE,
    .batch_backward_clears = BATCH_BACKWARD_CLEARS,
#if HAVE_BATCH
    .batch_capacity = BATCH_CAPACITY,
    .n_batch_slots = N_BATCH_SLOTS,
    .batch_input_base = BATCH_INPUT_BASE,
    .batch_loss_slot = BATCH_LOSS_SLOT,
    .n_batch_grad_slots = N_BATCH_GRAD_SLOTS,
    .batch_loss_grad_slot = BATCH_LOSS_GRAD_SLOT,
    .batch_constants_base = BATCH_CONSTANTS_BASE,
    .batch_list_words = BATCH_LIST_WORDS,
    .batch_output_slots = BATCH_OUTPUT_SLOTS,
    .n_batch_stepped_runs = N_BATCH_STEPPED_RUNS,
    .batch_stepped_runs = BATCH_STEPPED_RUNS,
    .n_batch_clear_runs = N_BATCH_CLEAR_RUNS,
    .batch_clear_runs = BATCH_CLEAR_RUNS,
    .init_batch_constants = init_batch_constants,
    .scan_batch_rows = scan_batch_rows,
    .forward_outputs_batch = forward_outputs_batch,
    .forward_rest_batch = forward_rest_batch,
    .backward_batch = backward_batch,
#endif
    .optimizer = {
        .kind = OPTIMIZER,
        .plain_sgd = PLAIN_SGD,
        .nesterov = NESTEROV,
        .decoupled_decay = DECOUPLED_DECAY,
        .momentum = MOMENTUM,
        .weight_decay = WEIGHT_DECAY,
        .beta1 = BETA1,
        .beta2 = BETA2,
        .eps = EPS,
        .repr = OPTIMIZER_REPR,
        .state_arrays = OPTIMIZER_STATE_ARRAYS,
        .n_state_views = OPTIMIZER_STATE_VIEWS,
        .state_names = OPTIMIZER_NAMES,
        .state_starts = OPTIMIZER_STARTS,
    },
};

/* The module's init: the runtime's (its multi-phase init gives each load its own state). */
struct _object *MODULE_INIT(void)
{
    return runtime_module_init();
}
