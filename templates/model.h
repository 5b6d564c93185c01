/* The contract between a model's generated C and the module runtime (templates/runtime.c): all
 * that the fixed code knows of a model is the descriptor MODEL, which the model's unit defines
 * (templates/model.c fills it from the layout codegen/write/contract.py renders) and the runtime
 * reads. The runtime is compiled once per compiler, flags and element type and kept in the build
 * cache as an object (codegen/backend/toolchain.py); a model's build compiles its own C and links
 * the two. Included by both, after templates/prelude.c (`real`). */

/* The optimizer update(lr) and train() take (codegen/write/optim.py): PyTorch's rules, their
 * hyperparameters, the state arrays. */
typedef struct {
    int kind;                         /* 0 SGD, 1 SGD with momentum, 2 Adam/AdamW */
    int plain_sgd;                    /* param -= lr * grad and nothing else */
    int nesterov, decoupled_decay;    /* SGD's Nesterov momentum; AdamW's decay of the parameters */
    double momentum, weight_decay, beta1, beta2, eps;
    const char *repr;                 /* the module's `optimizer` */
    int state_arrays;                 /* arrays of n_params reals: momentum buffer; exp_avg, exp_avg_sq */
    int n_state_views;                /* the `optimizer_state` views: names, starts in the block */
    const char *const *state_names;
    const long *state_starts;
} ModelOptimizer;

typedef void (*SlotsFunction)(real *restrict d);
typedef void (*BatchFunction)(real *restrict d, long nb);

typedef struct {
    int real_size;                    /* sizeof(real) of the model's unit: the runtime's must match */
    const char *name;                 /* the module's name (PyInit_<name>) */
    const char *grad_type_name;       /* "<name>.GradBuffer": `grad`'s type */
    /* the slots: parameters first, then inputs, then intermediates (codegen/lower/ir.py) */
    long n_slots, n_params, n_inputs, input_base, loss_slot;
    long n_outputs;
    const long *output_slots;         /* n_outputs (one 0 when none) */
    int sgd_in_backward;              /* backward_sgd_body steps plain SGD inside backward */
    long n_constants;
    const double *initial_params;     /* every load's parameters (embed_params), or NULL: zeros */
    /* a sequence's loops cut at its length (codegen/lower/positions.py; slot -1: none): before a
     * training pass d[positions_slot] is one past the last of the n_positions weights that is not 0,
     * before any other the constant it starts with, n_positions + 1 (every position) */
    long positions_slot, n_positions;
    const long *position_weights;
    /* backward_body sets every gradient it reads back to 0, leaving all but the parameters' 0
     * (codegen/write/backward.py's Plain): no clearing before the next (driver.c's seed_gradients) */
    int backward_clears;
    /* the inputs a gather reads as an index: {position, n} (templates/samples.c's check_index) */
    long n_index_inputs;
    const long (*index_inputs)[2];
    long nonzero_words;               /* int32 words after d's slots: the sparse inputs' lists */
    /* the step-by-step API's gradient rows (templates/step.c) */
    long n_tracked_rows, n_snapshot, n_swept_runs;
    const long (*swept_runs)[2];
    /* the table form's rows (codegen/write/table.py, templates/table.c): TABLE_TEXT's words, decoded
     * by the runtime into *table when the model's first module loads; table_words 0: none */
    long table_words;
    const char *table_text;
    const int32_t **table;
    /* the generated functions (codegen/write/emit.py) */
    SlotsFunction init_constants, scan_nonzeros, forward_outputs, forward_rest;
    void (*backward_body)(real *restrict d, real *restrict g);
    void (*backward_sgd_body)(real *restrict d, real *restrict g, real lr);
    void (*sgd_after_backward)(real *restrict d, real *restrict g, real lr);
    void (*backward_tracked_body)(real *restrict d, real *restrict g, uint64_t *restrict stamp,
                                  real *restrict rank1, real *restrict snap, uint32_t *restrict live, uint64_t gen);
    void (*sgd_live_rows)(real *restrict d, const real *restrict g, const uint64_t *restrict stamp,
                          const real *restrict rank1, const real *restrict snap, const uint32_t *restrict live,
                          uint64_t gen, real lr);
    void (*write_rows)(real *restrict g, uint64_t *restrict stamp, const real *restrict rank1,
                       const real *restrict snap, uint64_t gen, int all);
    /* the batched program (templates/batch.c; have_batch 0: none, the rest unused) */
    int have_batch;
    long batch_capacity, n_batch_slots, batch_input_base, batch_loss_slot, batch_constants_base;
    long n_batch_grad_slots, batch_loss_grad_slot; /* g's slots, the loss's gradient in g (codegen/lower/gradients.py) */
    long batch_list_words;            /* int32 words after the batch buffer's slots: the row lists */
    const long *batch_output_slots;
    long batch_positions_slot;        /* the same in the batch buffers (sample b's weights at + b) */
    const long *batch_position_weights;
    long batch_active_base;           /* d[it + p]: how many of the pass's samples reach position p (-1: none) */
    int batch_backward_clears;        /* backward_batch leaves the per-sample gradients 0, as backward_clears */
    long n_batch_stepped_runs;        /* the runs backward_batch steps, then (n_params, 0) */
    const long (*batch_stepped_runs)[2];
    long n_batch_clear_runs;          /* the runs of per-sample rows cleared before a batch (the others */
    const long (*batch_clear_runs)[2]; /* backward_batch writes): (first row, count), then (0, 0) */
    SlotsFunction init_batch_constants;
    BatchFunction scan_batch_rows, forward_outputs_batch, forward_rest_batch;
    void (*backward_batch)(real *restrict d, real *restrict g, long nb, real rate);
    ModelOptimizer optimizer;
} Model;

/* Defined by the model's unit, read by the runtime (one shared object holds both). */
SHARED extern const Model MODEL;

/* The runtime's module init, which the model's PyInit_<name> returns. */
SHARED struct _object *runtime_module_init(void);
