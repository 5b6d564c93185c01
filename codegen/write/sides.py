"""The side tables a program's statements read besides d and g, filled in while the forward and
backward builders (codegen/write/forward.py, codegen/write/backward.py) write the statements,
then rendered with the rest of what the templates are handed (codegen/write/contract.py):

    Shared      what the one-sample and the batched program share, defined once: the offset
                tables of operand lists that are not contiguous, the layer kernels' epilogues
    SideTables  one program's: the sparse inputs' nonzero lists, the batch's row lists, the
                step-by-step API's tracked rows, the weights the batched backward steps
"""

import math
from dataclasses import dataclass, field

from ..lower.vector import progression
from .kernels import call
from .loops import OffsetTables


def nonzero_words(n):
    """int32 words of the nonzero lists of n input values: two counts and a word per chunk of
    eight values (templates/kernels/sparse.c)"""
    return 2 + n // 8


@dataclass
class Shared:
    """The offset tables (loops.OffsetTables) and the epilogues (the statement over element n
    of each: its function's name), which the batched program's statements share with the
    one-sample program's."""
    offsets: OffsetTables = field(default_factory=OffsetTables)
    epilogues: dict = field(default_factory=dict)

    def epilogue(self, statement):
        """The name of the epilogue function (templates/epilogue.c) running `statement` over a row."""
        return self.epilogues.setdefault(statement, f"epilogue_{len(self.epilogues)}")


@dataclass
class TrackedRow:
    """A parameter row (`n` slots from Affine `start`, one per pass of a loop nest over `shape`)
    whose gradient a dot writes through its stamp (backward.Tracked), the other factor's slots
    `other` (an Affine, or None for a single parameter: a bias) snapshotted before the loop."""
    start: object
    n: int
    shape: tuple
    other: object


@dataclass
class SideTables:
    """One program's side tables. sparse_inputs: dots over an input range use its nonzero list;
    row_lists: the batched program's products skip the inputs' rows that are all zeros."""
    program: object
    shared: Shared
    sparse_inputs: bool = False
    row_lists: dict | None = None     # (first input, count): the list's offset in words
    nonzero_lists: dict = field(default_factory=dict)  # (first slot, length): the list's offset in words
    tracked_rows: list = field(default_factory=list)   # TrackedRow, in stamp order
    stepped: list | None = None       # the batched program's: runs (first slot, count) its backward steps
    overwritten: list = field(default_factory=list)  # the batched program's: (first row, count) its backward writes

    @classmethod
    def batched(cls, program, shared, row_lists):
        """The batched program's (matmul_nt steps weights with `rate`: parameters with one gradient
        contribution, ir.sgd_in_backward)."""
        return cls(program, shared, row_lists={} if row_lists else None, stepped=[])

    @property
    def offsets(self):
        return self.shared.offsets

    def nonzeros(self, v):
        """For a factor list that is one input range, the same in every iteration (a first
        layer's pixels), the C pointer to its nonzero list (templates/kernels/sparse.c's dot_nz),
        which lives in the words after the N_SLOTS values of d; else None."""
        p, n = self.program, len(v.offsets)
        if not (self.sparse_inputs and v.length is None and v.contiguous and not any(v.start.strides)
                and p.input_base <= v.start.base and v.start.base + n <= p.input_base + p.n_inputs):
            return None
        key = (v.start.base, n)
        if key not in self.nonzero_lists:
            self.nonzero_lists[key] = self.nonzero_words()
        return f"(const int32_t *)(d + {p.n_slots}) + {self.nonzero_lists[key]}"

    def nonzero_words(self):
        """The words the nonzero lists take after d's N_SLOTS values (NONZERO_WORDS)."""
        return sum(nonzero_words(n) for _, n in self.nonzero_lists)

    def row_list(self, v):
        """For the batched program of a model with sparse inputs: when the rows a layer's product
        reads (Vector v) are a range of inputs, the same for the whole loop nest, the C pointer to
        the list of those that hold a nonzero in this batch (scan_batch_rows); else NULL."""
        p = self.program
        if self.row_lists is None or v.length is not None or len(v.offsets) < 2 or any(v.start.strides[:-1]) or v.start.strides[-1] != 1:
            return "NULL"
        first, step = v.start.base + v.offsets[0] - p.input_base, progression(v.offsets)
        if step != p.capacity or first < 0 or first % step or first // step + len(v.offsets) > p.n_inputs:
            return "NULL"
        key = (first // step, len(v.offsets))
        if key not in self.row_lists:
            self.row_lists[key] = self.row_list_words()
        return f"(const int32_t *)(d + {p.n_slots}) + {self.row_lists[key]}"

    def row_list_words(self):
        """The words the row lists take after the batch's N_BATCH_SLOTS values (BATCH_LIST_WORDS)."""
        return sum(1 + n for _, n in (self.row_lists or {}))

    def nonzero_scans(self):
        """scan_nonzeros(d)'s kernel calls: every nonzero list from its input range's current values."""
        return [call("scan_range", x=f"d + {base}", n=n, nz=f"(int32_t *)(d + N_SLOTS) + {offset}")
                for (base, n), offset in self.nonzero_lists.items()]

    def row_scans(self):
        """scan_batch_rows(d, nb)'s kernel calls: the list of every input range a product reads, of
        its rows that hold a nonzero among the batch's nb samples."""
        p = self.program
        return [call("scan_rows", x=f"d + {p.input_base + first * p.capacity}", stride=p.capacity, nb="nb", n=n,
                     list=f"(int32_t *)(d + {p.n_slots}) + {offset}") for (first, n), offset in (self.row_lists or {}).items()]

    def track(self, row):
        """Adds a TrackedRow: (the stamp of its first pass, its snapshot's first real)."""
        first = sum(math.prod(r.shape) for r in self.tracked_rows)
        snapshot = sum(r.n for r in self.tracked_rows if r.other is not None)
        self.tracked_rows.append(row)
        return first, snapshot
