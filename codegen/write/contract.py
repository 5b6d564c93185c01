"""What a model's generated C hands the C around it, rendered in one place: the #defines and
tables that templates/model.c puts into the model's descriptor MODEL (templates/model.h, the
contract's C side), which the module runtime (templates/runtime.c, the same C for every model,
compiled once per compiler and flags) reads, and which codegen.export's templates read too
(templates/export/), jit's (templates/jit.c) and the prelude every file starts with
(templates/prelude.c). The functions the descriptor points at (forward_outputs, backward_body,
the sparse inputs' scans...) are the emitter's (codegen/write/emit.py); the steps over the tables
are templates/model.c's. A template that reads one of these through #if checks first that it is
defined (#ifndef X / #error), so that a missing one is a clear error, not a silent 0.

    Prelude     what every file's prelude reads: the element type, the thread pool, the products
    Module      the module's name, optimizer and embedded parameters (modules only)
    Layout      one sample's slots: sizes, the loss, the outputs, the index inputs
    Words       how many int32 words the inputs' lists take (NONZERO_WORDS, BATCH_LIST_WORDS)
    BatchLayout the batched program's slots (templates/batch.c), or none
    TableForm   the table form's rows (codegen/write/table.py), when the program has one
    StepTables  what the module's steps read (templates/model.c's sgd_after_backward, write_rows,
                sgd_live_rows): the runs of parameters stepped after backward, the tracked rows
    module_names, inline_graph, optimizer_defines: MODULE_NAME_STR and MODULE_INIT, jit's
                INLINE_GRAPH, the optimizer's #defines (a codegen/write/optim.py description)
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..lower import ir
from .dtypes import c_literal
from .kernels import product_declarations
from .optim import STATE_LINE


def _table(name, rows):
    """A static const long table of numbers, or of pairs (a, b)."""
    pairs = bool(rows) and isinstance(rows[0], tuple)
    cells = ", ".join(f"{{{a}, {b}}}" for a, b in rows) if pairs else ", ".join(map(str, rows))
    return f"static const long {name}[]{'[2]' if pairs else ''} = {{{cells}}};"


def _sequence(prefix, sequence):
    """<prefix>POSITIONS_SLOT and <prefix>POSITION_WEIGHTS_LIST (and N_POSITIONS, and the batched
    program's BATCH_ACTIVE_BASE) of a Sequence,
    or none (a list, not a table: exported C, which runs every position, has no use for it)."""
    if sequence is None:
        return []
    return ([f"#define {prefix}POSITIONS_SLOT {sequence.slot}"]
            + ([] if prefix else [f"#define N_POSITIONS {len(sequence.weights)}"])
            + [f"#define {prefix}POSITION_WEIGHTS_LIST {', '.join(map(str, sequence.weights))}"]
            + ([f"#define {prefix}ACTIVE_BASE {sequence.active}"] if sequence.active is not None else []))


# templates/kernels/gemm.c's RUNTIME_PRODUCTS: the matrix products defined in each file (exported
# and jit C), in the module runtime's unit of products (templates/products.c), or declared (in the
# runtime's other unit and a module's model units) and defined there
STATIC_PRODUCTS, RUNTIME_DEFINES_PRODUCTS, RUNTIME_HAS_PRODUCTS = 0, 2, 1


@dataclass(frozen=True)
class Prelude:
    """What templates/prelude.c reads before anything: the element type (a codegen/write/dtypes.py
    row: REAL_IS_FLOAT), whether a thread pool runs the products (HAVE_THREAD_POOL,
    templates/pool.c), where the products are defined (RUNTIME_PRODUCTS, and their declarations
    PRODUCT_DECLARATIONS from the kernel table; both left out when static),
    whether GCC vectorises the loops whose counts are read at run time (VECTORISE_LOOPS: a
    sequence's program; left out when not)."""

    dtype: object
    thread_pool: bool
    products: int = STATIC_PRODUCTS
    vectorise_loops: bool = False

    def render(self):
        return (f"#define REAL_IS_FLOAT {int(self.dtype.real_is_float)}\n#define HAVE_THREAD_POOL {int(self.thread_pool)}\n"
                + (f"#define RUNTIME_PRODUCTS {self.products}\n#define PRODUCT_DECLARATIONS {product_declarations()}\n"
                   if self.products != STATIC_PRODUCTS else "")
                + ("#define VECTORISE_LOOPS 1\n" if self.vectorise_loops else ""))


def module_names(name):
    """MODULE_NAME_STR and MODULE_INIT (PyInit_<name>) of a module called `name`."""
    return [f'#define MODULE_NAME_STR "{name}"', f"#define MODULE_INIT PyInit_{name}"]


def inline_graph(inline):
    """INLINE_GRAPH: whether a jit function's graph is inlined into its row loops (templates/jit.c)."""
    return f"#define INLINE_GRAPH {int(inline)}"


def optimizer_defines(optimizer):
    """The #defines of a codegen/write/optim.py description that templates/model.c puts in the
    model's descriptor (MODEL.optimizer, templates/model.h) and templates/optim.c's step reads."""
    names = optimizer.state_names
    arrays = [name for name in names if name != "step"]
    starts = (["0"] if "step" in names else []) + [f"{STATE_LINE} + {i} * N_PARAMS" for i in range(len(arrays))]
    values = {"MOMENTUM": 0.0, "NESTEROV": 0, "WEIGHT_DECAY": 0.0, "BETA1": 0.0, "BETA2": 0.0, "EPS": 0.0,
              "DECOUPLED_DECAY": 0, **optimizer.constants()}
    lines = [f"#define OPTIMIZER {optimizer.kind}",
             f"#define PLAIN_SGD {int(optimizer.plain_sgd)}",
             f'#define OPTIMIZER_REPR "{optimizer!r}"',
             f"#define OPTIMIZER_STATE_ARRAYS {len(arrays)}",
             f"#define OPTIMIZER_STATE_VIEWS {len(names)}",
             "#define OPTIMIZER_STATE_NAMES " + (", ".join(f'"{n}"' for n in names) or '""'),
             f"#define OPTIMIZER_STATE_STARTS {', '.join(starts) or '-1'}"]
    lines += [f"#define {name} {value if isinstance(value, int) else c_literal(value)}" for name, value in values.items()]
    return "\n".join(lines)


@dataclass(frozen=True)
class Module:
    """A module's identity: `name` (PyInit_<name>, a C identifier), its optimizer (a
    codegen/write/optim.py description, checked) and the parameters' values every load starts
    from (None: zeros)."""

    name: str
    optimizer: object
    initial_params: tuple | None = None

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"module name must be a str, got {type(self.name).__name__}")
        if not self.name.isidentifier() or not self.name.isascii():
            raise ValueError(f"module name must be a C identifier, got {self.name!r}")

    def render(self):
        """MODULE_NAME_STR, MODULE_INIT, the optimizer's #defines, INITIAL_PARAMS if any."""
        lines = [*module_names(self.name), optimizer_defines(self.optimizer)]
        if self.initial_params is not None:
            values = ", ".join(map(c_literal, self.initial_params))
            lines += ["#define HAVE_INITIAL_PARAMS 1", f"static const double INITIAL_PARAMS[] = {{{values}}};"]
        return "\n".join(lines)


@dataclass(frozen=True)
class Layout:
    """One sample's program's slots (codegen/lower/types.py's Program): parameters first, then
    inputs, then intermediates; the loss's slot, the outputs', whether backward takes plain SGD
    steps itself, the constants' count, and the inputs gathers read as an index, (position, n)."""

    n_slots: int
    n_params: int
    n_inputs: int
    input_base: int
    loss_slot: int
    output_slots: tuple
    sgd_in_backward: bool
    n_constants: int
    index_inputs: tuple
    sequence: object = None  # codegen/lower/types.py's Sequence, or None
    backward_clears: bool = False  # backward_body leaves every gradient but the parameters' 0

    @classmethod
    def of(cls, program, backward_clears=False):
        return cls(program.n_slots, program.n_params, program.n_inputs, program.input_base, program.loss.slot,
                   tuple(n.slot for n in program.outputs), bool(program.sgd_in_backward), len(program.constants),
                   tuple(program.index_inputs or ()), program.sequence, backward_clears)

    def render(self):
        """N_SLOTS, N_PARAMS, N_INPUTS, INPUT_BASE, LOSS_SLOT, N_OUTPUTS, SGD_IN_BACKWARD,
        N_CONSTANTS, OUTPUT_SLOTS (a 0 when none); N_INDEX_INPUTS and INDEX_INPUTS when there are
        index inputs; POSITIONS_SLOT, N_POSITIONS and POSITION_WEIGHTS_LIST when the loops stop at a
        sequence's length (templates/model.c: none otherwise); BACKWARD_CLEARS 1 when
        backward_body sets the gradients it reads back to 0 (codegen/write/backward.py's Plain)."""
        lines = [f"#define N_SLOTS {self.n_slots}",
                 f"#define N_PARAMS {self.n_params}",
                 f"#define N_INPUTS {self.n_inputs}",
                 f"#define INPUT_BASE {self.input_base}",
                 f"#define LOSS_SLOT {self.loss_slot}",
                 f"#define N_OUTPUTS {len(self.output_slots)}",
                 f"#define SGD_IN_BACKWARD {int(self.sgd_in_backward)}",
                 f"#define N_CONSTANTS {self.n_constants}",
                 _table("OUTPUT_SLOTS", list(self.output_slots) or [0])]
        lines += _sequence("", self.sequence)
        lines += ["#define BACKWARD_CLEARS 1"] if self.backward_clears else []
        if self.index_inputs:
            lines += [f"#define N_INDEX_INPUTS {len(self.index_inputs)}",
                      _table("INDEX_INPUTS", [tuple(pair) for pair in self.index_inputs])]
        return "\n".join(lines)


def constant_values(name, literals):
    """The constants' table that init_constants copies into their slots (`literals`: C numbers)."""
    return f"static const real {name}[{len(literals)}] = {{{', '.join(literals)}}};"


@dataclass(frozen=True)
class Words:
    """How many int32 words a model's input lists take after its slots: `name` NONZERO_WORDS (the
    sparse inputs' nonzero lists, after d's N_SLOTS values) or BATCH_LIST_WORDS (the batch's row
    lists, after its N_BATCH_SLOTS values; codegen/write/sides.py)."""

    name: str
    words: int

    def render(self):
        return f"#define {self.name} {self.words}"


@dataclass(frozen=True)
class BatchLayout:
    """The batched program's slots (codegen/lower/batch.py): how many samples a pass holds, its
    slots' count, inputs, loss and constants, the outputs, and the runs of weights (first slot,
    count) that its backward steps itself (plain SGD)."""

    capacity: int
    n_slots: int
    input_base: int
    loss_slot: int
    constants_base: int
    output_slots: tuple
    stepped_runs: tuple
    sequence: object = None
    backward_clears: bool = False  # backward_batch leaves every per-sample gradient 0
    clear_runs: tuple = ()  # runs (first row, count) of the per-sample rows the runtime clears
    grad_slots: int = 0  # g's slots (codegen/lower/gradients.py) and the loss's gradient's index in g
    loss_grad_slot: int = 0

    @classmethod
    def of(cls, batched, stepped, overwritten=()):
        """overwritten: (first row, count) of the per-sample rows (BATCH_CAPACITY slots each, from
        N_PARAMS) that backward_batch writes rather than adds to (sides.SideTables' overwritten):
        the runtime clears the others before each batch, unless backward_batch leaves them 0."""
        rows = np.full((batched.constants_base - batched.n_params) // batched.capacity, not batched.backward_clears)
        for first, count in overwritten:
            rows[first:first + count] = False
        edges = np.flatnonzero(np.diff(np.concatenate([[0], rows.view(np.int8), [0]])))
        runs = tuple((int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2]))
        merged = []  # (the stepped runs, those that touch joined: a layer's weights' rows and biases)
        for first, count in sorted(stepped):
            if merged and merged[-1][0] + merged[-1][1] == first:
                merged[-1] = (merged[-1][0], merged[-1][1] + count)
            else:
                merged.append((first, count))
        gradients = batched.gradients
        return cls(batched.capacity, batched.n_slots, batched.input_base, batched.loss_slot, batched.constants_base,
                   tuple(batched.output_slots), tuple(merged), batched.sequence, batched.backward_clears, runs,
                   gradients.n_slots if gradients else batched.n_slots,
                   gradients.at(batched.loss_slot) if gradients else batched.loss_slot)

    @staticmethod
    def render_none():
        return "#define HAVE_BATCH 0"

    def render(self):
        """HAVE_BATCH 1, BATCH_CAPACITY, N_BATCH_SLOTS (d's), N_BATCH_GRAD_SLOTS (g's),
        BATCH_INPUT_BASE, BATCH_LOSS_SLOT, BATCH_LOSS_GRAD_SLOT (its gradient's in g),
        BATCH_CONSTANTS_BASE, BATCH_OUTPUT_SLOTS, N_BATCH_STEPPED_RUNS and BATCH_STEPPED_RUNS
        (ascending, then (N_PARAMS, 0)), N_BATCH_CLEAR_RUNS and BATCH_CLEAR_RUNS (then (0, 0));
        BATCH_BACKWARD_CLEARS 1 as Layout's BACKWARD_CLEARS."""
        runs = [*self.stepped_runs, ("N_PARAMS", 0)]
        return "\n".join([
            "#define HAVE_BATCH 1",
            f"#define BATCH_CAPACITY {self.capacity}",
            f"#define N_BATCH_SLOTS {self.n_slots}",
            f"#define N_BATCH_GRAD_SLOTS {self.grad_slots}",
            f"#define BATCH_INPUT_BASE {self.input_base}",
            f"#define BATCH_LOSS_SLOT {self.loss_slot}",
            f"#define BATCH_LOSS_GRAD_SLOT {self.loss_grad_slot}",
            f"#define BATCH_CONSTANTS_BASE {self.constants_base}",
            _table("BATCH_OUTPUT_SLOTS", list(self.output_slots) or [0]),
            f"#define N_BATCH_STEPPED_RUNS {len(runs) - 1}",
            _table("BATCH_STEPPED_RUNS", runs),
            f"#define N_BATCH_CLEAR_RUNS {len(self.clear_runs)}",
            _table("BATCH_CLEAR_RUNS", [*self.clear_runs, (0, 0)]),
            *_sequence("BATCH_", self.sequence),
            *(["#define BATCH_BACKWARD_CLEARS 1"] if self.backward_clears else []),
        ])


@dataclass(frozen=True)
class TableForm:
    """The table form's rows (codegen/write/table.py's Plan): how many words, and the words as
    base64 lines (Plan.text)."""

    words: int
    text: tuple

    @classmethod
    def of(cls, plan):
        return cls(len(plan.words), tuple(plan.text()))

    def render(self):
        """TABLE_WORDS, TABLE_TEXT (the words), and `table`, where the runtime puts them decoded
        (templates/model.c hands both to it through MODEL)."""
        lines = "\n".join(f'    "{line}"' for line in self.text)
        return (f"#define TABLE_WORDS {self.words}\nstatic const char TABLE_TEXT[] =\n{lines};\n"
                "static const int32_t *table; /* TABLE_TEXT decoded, by the runtime when the module loads */")


@dataclass(frozen=True)
class StepTables:
    """What a module's SGD steps read besides the layout: the runs (first slot, count) of the
    parameters that backward does not step itself (sgd_after_backward steps them), and the
    step-by-step API's tracked rows (sides.TrackedRow, in stamp order: one row per pass of each
    one's loop nest), the runs of the other parameters (zeroed and stepped every time: swept);
    whether the step API's backward is a function of its own without tracked rows (own_backward:
    where backward_body clears the gradients it read)."""

    sgd_after_runs: tuple
    row_starts: tuple
    row_lengths: tuple
    row_snapshots: tuple
    n_snapshot: int
    swept_runs: tuple
    own_backward: bool = False

    @classmethod
    def of(cls, program, tracked_rows, own_backward=False):
        tracked = np.zeros(program.n_params, dtype=bool)
        starts, lengths, snapshots = [], [], []
        snapshot = 0
        for row in tracked_rows:
            for index in itertools.product(*map(range, row.shape)):  # in loop order, as the stamps
                at = row.start.base + sum(s * i for s, i in zip(row.start.strides, index))
                tracked[at:at + row.n] = True
                starts.append(at)
            lengths += [row.n] * math.prod(row.shape)
            snapshots += [snapshot] * math.prod(row.shape)
            snapshot += row.n if row.other is not None else 0
        return cls(tuple(program.sgd_after_backward), tuple(starts), tuple(lengths), tuple(snapshots), snapshot,
                   tuple(ir.slot_runs(np.flatnonzero(~tracked)) or [(0, 0)]), own_backward)

    def render(self):
        """N_SGD_AFTER_RUNS, SGD_AFTER_RUNS; N_TRACKED_ROWS, STEP_OWN_BACKWARD (0 or 1), N_SNAPSHOT
        (reals), N_SWEPT_RUNS, SWEPT_RUNS, and by row: ROW_START, ROW_LENGTH, ROW_SNAPSHOT (its
        snapshot's first real)."""
        return "\n".join([
            f"#define N_SGD_AFTER_RUNS {len(self.sgd_after_runs)}",
            _table("SGD_AFTER_RUNS", list(self.sgd_after_runs) or [(0, 0)]),
            f"#define N_TRACKED_ROWS {len(self.row_starts)}",
            f"#define STEP_OWN_BACKWARD {int(self.own_backward)}",
            f"#define N_SNAPSHOT {self.n_snapshot}",
            f"#define N_SWEPT_RUNS {len(self.swept_runs)}",
            _table("SWEPT_RUNS", list(self.swept_runs)),
            _table("ROW_START", list(self.row_starts) or [0]),
            _table("ROW_LENGTH", list(self.row_lengths) or [0]),
            _table("ROW_SNAPSHOT", list(self.row_snapshots) or [0]),
        ])
