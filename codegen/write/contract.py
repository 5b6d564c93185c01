"""What a model's generated C hands the C around it, rendered in one place: the #defines and
tables that templates/model.c puts into the model's descriptor MODEL (templates/model.h, the
contract's C side), which the module runtime (templates/runtime.c, the same C for every model,
compiled once per compiler and flags) reads, and which codegen.export's templates read too
(templates/export/). The functions the descriptor points at (forward_outputs, backward_body,
the sparse inputs' scans, the tracked rows...) are the emitter's (codegen/write/emit.py).

    Module      the module's name, optimizer and embedded parameters (modules only)
    Layout      one sample's slots: sizes, the loss, the outputs, the index inputs
    BatchLayout the batched program's slots (templates/batch.c), or none
    StepTables  what the module's steps read (templates/model.c's sgd_after_backward, write_rows,
                sgd_live_rows): the runs of parameters stepped after backward, the tracked rows
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..lower import ir

from .dtypes import c_literal


def _table(name, rows):
    """A static const long table of numbers, or of pairs (a, b)."""
    pairs = bool(rows) and isinstance(rows[0], tuple)
    cells = ", ".join(f"{{{a}, {b}}}" for a, b in rows) if pairs else ", ".join(map(str, rows))
    return f"static const long {name}[]{'[2]' if pairs else ''} = {{{cells}}};"


def _sequence(prefix, sequence):
    """<prefix>POSITIONS_SLOT and <prefix>POSITION_WEIGHTS_LIST (and N_POSITIONS) of a Sequence,
    or none (a list, not a table: exported C, which runs every position, has no use for it)."""
    if sequence is None:
        return []
    return ([f"#define {prefix}POSITIONS_SLOT {sequence.slot}"]
            + ([] if prefix else [f"#define N_POSITIONS {len(sequence.weights)}"])
            + [f"#define {prefix}POSITION_WEIGHTS_LIST {', '.join(map(str, sequence.weights))}"])


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
        lines = [f'#define MODULE_NAME_STR "{self.name}"', f"#define MODULE_INIT PyInit_{self.name}",
                 self.optimizer.c_defines()]
        if self.initial_params is not None:
            values = ", ".join(map(c_literal, self.initial_params))
            lines += ["#define HAVE_INITIAL_PARAMS 1", f"static const double INITIAL_PARAMS[] = {{{values}}};"]
        return "\n".join(lines)


@dataclass(frozen=True)
class Layout:
    """One sample's program's slots (codegen/lower/ir.py's Program): parameters first, then
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
    sequence: object = None  # codegen/lower/positions.py's Sequence, or None

    @classmethod
    def of(cls, program):
        return cls(program.n_slots, program.n_params, program.n_inputs, program.input_base, program.loss.slot,
                   tuple(n.slot for n in program.outputs), bool(program.sgd_in_backward), len(program.constants),
                   tuple(program.index_inputs or ()), program.sequence)

    def render(self):
        """N_SLOTS, N_PARAMS, N_INPUTS, INPUT_BASE, LOSS_SLOT, N_OUTPUTS, SGD_IN_BACKWARD,
        N_CONSTANTS, OUTPUT_SLOTS (a 0 when none); N_INDEX_INPUTS and INDEX_INPUTS when there are
        index inputs; POSITIONS_SLOT, N_POSITIONS and POSITION_WEIGHTS_LIST when the loops stop at a
        sequence's length (templates/model.c: none otherwise)."""
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
        if self.index_inputs:
            lines += [f"#define N_INDEX_INPUTS {len(self.index_inputs)}",
                      _table("INDEX_INPUTS", [tuple(pair) for pair in self.index_inputs])]
        return "\n".join(lines)


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

    @classmethod
    def of(cls, batched, stepped):
        return cls(batched.capacity, batched.n_slots, batched.input_base, batched.loss_slot, batched.constants_base,
                   tuple(batched.output_slots), tuple(sorted(stepped)), batched.sequence)

    @staticmethod
    def render_none():
        return "#define HAVE_BATCH 0"

    def render(self):
        """HAVE_BATCH 1, BATCH_CAPACITY, N_BATCH_SLOTS, BATCH_INPUT_BASE, BATCH_LOSS_SLOT,
        BATCH_CONSTANTS_BASE, BATCH_OUTPUT_SLOTS, N_BATCH_STEPPED_RUNS and BATCH_STEPPED_RUNS
        (ascending, then (N_PARAMS, 0))."""
        runs = [*self.stepped_runs, ("N_PARAMS", 0)]
        return "\n".join([
            "#define HAVE_BATCH 1",
            f"#define BATCH_CAPACITY {self.capacity}",
            f"#define N_BATCH_SLOTS {self.n_slots}",
            f"#define BATCH_INPUT_BASE {self.input_base}",
            f"#define BATCH_LOSS_SLOT {self.loss_slot}",
            f"#define BATCH_CONSTANTS_BASE {self.constants_base}",
            _table("BATCH_OUTPUT_SLOTS", list(self.output_slots) or [0]),
            f"#define N_BATCH_STEPPED_RUNS {len(runs) - 1}",
            _table("BATCH_STEPPED_RUNS", runs),
            *_sequence("BATCH_", self.sequence),
        ])


@dataclass(frozen=True)
class StepTables:
    """What a module's SGD steps read besides the layout: the runs (first slot, count) of the
    parameters that backward does not step itself (sgd_after_backward steps them), and the
    step-by-step API's tracked rows (sides.TrackedRow, in stamp order: one row per pass of each
    one's loop nest), the runs of the other parameters (zeroed and stepped every time: swept)."""

    sgd_after_runs: tuple
    row_starts: tuple
    row_lengths: tuple
    row_snapshots: tuple
    n_snapshot: int
    swept_runs: tuple

    @classmethod
    def of(cls, program, tracked_rows):
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
                   tuple(ir.slot_runs(np.flatnonzero(~tracked)) or [(0, 0)]))

    def render(self):
        """N_SGD_AFTER_RUNS, SGD_AFTER_RUNS; N_TRACKED_ROWS, N_SNAPSHOT (reals), N_SWEPT_RUNS,
        SWEPT_RUNS, and by row: ROW_START, ROW_LENGTH, ROW_SNAPSHOT (its snapshot's first real)."""
        return "\n".join([
            f"#define N_SGD_AFTER_RUNS {len(self.sgd_after_runs)}",
            _table("SGD_AFTER_RUNS", list(self.sgd_after_runs) or [(0, 0)]),
            f"#define N_TRACKED_ROWS {len(self.row_starts)}",
            f"#define N_SNAPSHOT {self.n_snapshot}",
            f"#define N_SWEPT_RUNS {len(self.swept_runs)}",
            _table("SWEPT_RUNS", list(self.swept_runs)),
            _table("ROW_START", list(self.row_starts) or [0]),
            _table("ROW_LENGTH", list(self.row_lengths) or [0]),
            _table("ROW_SNAPSHOT", list(self.row_snapshots) or [0]),
        ])
