"""The lowered program's types, in one place (the passes that make them: codegen/lower/ir.py,
vector.py, batch.py, positions.py; the writers that read them: codegen/write/):

    kinds    Kind: a Node's (a leaf's, CONST, PARAM, INPUT, or a computed node's, OP, DOT);
             Role: a leaf's kind as the int8 the arrays of graph.py hold (LEAF_KINDS: its Kind).
             A Kind is its name's text as well (Kind.OP == "op", and hashes alike), which the
             table form and the tests may still compare with.
    extents  a loop's: an int, Extent (grows with i0), Parts (a family's count of parts),
             BatchExtent (the batch's, `nb`), Bounded (cut at run time by a sequence's length)
    slots    Affine (a slot as a function of the loop indices), Vector (a list of them)
    program  Node, Group (nodes computing the same thing: one loop nest), Operands (where a
             group's operands live), Program (one sample's), BatchedProgram (over a batch),
             Sequence (what the runtime needs to bound a pass)
"""

import dataclasses
import enum
from dataclasses import dataclass, field


# ---- kinds --------------------------------------------------------------------------------------

class Role(enum.IntEnum):
    CONST = 0
    PARAM = 1
    INPUT = 2


class Kind(str, enum.Enum):
    CONST = "const"
    PARAM = "param"
    INPUT = "input"
    OP = "op"
    DOT = "dot"

    __str__ = str.__str__
    __format__ = str.__format__


# The kinds by name, as the lowering's hot loops read them (an Enum's attribute, Kind.OP, is a
# slower lookup); COMPUTED: an op's or a dot's (not a leaf's); LEAF_KINDS: a leaf's Kind by Role.
CONST, PARAM, INPUT, OP, DOT = Kind
COMPUTED = frozenset((OP, DOT))
LEAF_KINDS = (CONST, PARAM, INPUT)


# ---- extents ------------------------------------------------------------------------------------

class Extent(int):
    """The extent of a loop that grows with the outermost loop's index i0, `first + step * i0`
    (a causal attention's keys: position t reads t + 1 of them), in a loop nest of `count`
    passes of i0. As a number it is its largest value, which the emitter's choices of kernel
    hold for (they hold for any shorter extent: BatchExtent is the same idea)."""

    def __new__(cls, first, step, count):
        extent = super().__new__(cls, first + step * (count - 1))
        extent.first, extent.step, extent.count = first, step, count
        return extent

    def __str__(self):
        index = "i0" if self.step == 1 else f"{self.step} * i0"
        return f"{self.first} + {index}" if self.first else index

    __repr__ = __str__

    # equal to no plain number: `stride == 1` and the like ask about every pass, not the largest
    def __eq__(self, other):
        return isinstance(other, Extent) and (self.first, self.step, self.count) == (other.first, other.step, other.count)

    def __ne__(self, other):
        return not self == other

    def __hash__(self):
        return hash((Extent, self.first, self.step, self.count))

    def scaled(self, factor):
        return Extent(self.first * factor, self.step * factor, self.count)

    def __format__(self, spec):
        return str(self) if not spec else int.__format__(self, spec)


class Parts(int):
    """A family's outermost extent, its count of parts (see _families): its loop also keeps
    `tri0` = i0 * (i0 - 1) / 2, where Affine.tri's term is read (no division in the loop)."""


def is_family(shape):
    """Whether a loop nest over `shape` is a family's (its outermost extent a Parts)."""
    return bool(shape) and isinstance(shape[0], Parts)


class BatchExtent(int):
    """The batch loop's extent: the capacity as a number (for the emitter's choices of kernel,
    which hold for any shorter batch), written `nb` in C, the number of samples this time."""

    def __new__(cls, capacity):
        return super().__new__(cls, capacity)

    def __str__(self):
        return "nb"

    __repr__ = __str__

    def __format__(self, spec):
        return "nb" if not spec else int.__format__(self, spec)


class ActiveBatch(BatchExtent):
    """The batch loop's extent in a group of one position p of a sequence (the batched program):
    the samples whose document reaches p, `d[active + p]`, which the runtime writes before a
    training pass with the batch's samples sorted longest first (templates/batch.c), nb at every
    position before any other. p is `first + i<loop>` in a loop over the positions cut at run
    time (Bounded), else a fixed position (a guarded group's)."""

    def __new__(cls, capacity, active, first, loop=None):
        extent = super().__new__(cls, capacity)
        extent.active, extent.first, extent.loop = active, first, loop
        return extent

    def __str__(self):
        if self.loop is None:
            return f"(long)d[{self.active + self.first}]"
        return f"(long)d[{self.active + self.first} + i{self.loop}]"

    __repr__ = __str__

    def __format__(self, spec):
        return str(self) if not spec else int.__format__(self, spec)


class Bounded:
    """A loop extent cut at run time: `N` as a number (the emitter's choices hold for any
    shorter loop, as for BatchExtent); in C the count of the loop's passes whose members
    are of positions < n, n the sample's count in d[slot]: `upto(d[slot], first, N)` where the
    loop's pass i is position first + i (n - first clamped to 0..N), else `counts[n]` from a
    table (a loop whose members' positions rise by steps of other sizes). `cut` makes one: an
    int, or a family's Parts."""
    __slots__ = ()

    def __str__(self):
        if self.counts is None:
            return f"upto(d[{self.slot}], {self.first}, {int(self)})"
        return f"((const long[]){{{', '.join(map(str, self.counts))}}})[(long)d[{self.slot}]]"

    __repr__ = __str__

    def __format__(self, spec):
        return str(self) if not spec else int.__format__(self, spec)

    def at(self, slot):
        """The same extent with its bound read from another slot (the batched layout's)."""
        return cut(self, slot, self.first, self.counts)


class _BoundedExtent(Bounded, int):
    pass


class _BoundedParts(Bounded, Parts):
    pass


def cut(extent, slot, first, counts=None):
    """`extent` (a number, or a family's Parts) cut at run time (Bounded)."""
    bounded = (_BoundedParts if isinstance(extent, Parts) else _BoundedExtent)(int(extent))
    bounded.slot, bounded.first, bounded.counts = slot, first, counts
    return bounded


# ---- slots --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Affine:
    """A slot as a function of the loop indices: base + sum(strides[d] * i[d]) + tri * (i0 *
    (i0 - 1) / 2). Its gradient lives at grad_base + the same (grad_base differs from base only
    where straight-line code shares a gradient slot). `tri` and strides that are Extents are a
    family's (see _families): its parts' blocks grow with the part, so where part k starts is
    quadratic in k, and a block laid out row by row has rows as long as the part's loop."""
    base: int
    strides: tuple = ()
    grad_base: int = None
    tri: int = 0

    def __init__(self, base, strides=(), grad_base=None, tri=0):
        # (the fields stored at once: a frozen dataclass's own __init__ sets each through
        # object.__setattr__, 2-3x the time, and the lowering makes several an operand)
        fields = self.__dict__
        fields["base"], fields["strides"], fields["grad_base"], fields["tri"] = base, strides, grad_base, tri

    def grad_offset(self):
        return self.base if self.grad_base is None else self.grad_base

    def span(self, shape, offsets=(0,)):
        """The lowest and highest slot it reaches (plus offsets) over a loop nest of `shape`."""
        lo = hi = self.base
        for stride, n in zip(self.strides, shape):  # (a growing loop's extent is its largest)
            reach = stride * (n - 1)
            lo, hi = lo + min(0, reach), hi + max(0, reach)
        if self.tri:
            reach = self.tri * ((shape[0] - 1) * (shape[0] - 2) // 2)
            lo, hi = lo + min(0, reach), hi + max(0, reach)
        return lo + min(offsets), hi + max(offsets)


@dataclass(frozen=True)
class Vector:
    """A list of operand slots: start (Affine) plus a fixed offset per element."""
    start: Affine
    offsets: tuple
    length: Extent = None  # a family's list that grows with i0: the first `length` of the offsets

    @property
    def n(self):
        """How many elements (a C expression's Extent for a growing list)."""
        return len(self.offsets) if self.length is None else self.length

    @property
    def contiguous(self):
        return self.offsets == tuple(range(len(self.offsets)))


# ---- program ------------------------------------------------------------------------------------

class Node:
    """One node of the lowered graph. kind: a Kind (a leaf's: CONST, PARAM, INPUT; or OP, DOT: a
    Computed node). A dot's value is sum(args) + sum(a[i] * b[i])."""

    # A leaf (most nodes: a model's params) has the fields in slots and reads a computed node's
    # own (op, args, k, a, b, shares_grad, for_outputs) as the class's defaults: a param's node
    # is made with 7 stores, in 96 bytes.
    __slots__ = ("kind", "value", "slot", "needs_grad", "grad_slot", "sgd_fused", "cls", "__dict__")
    op = None
    args = a = b = ()
    k = None
    shares_grad = False  # its gradient is its only consumer's, which passes it on unchanged
    for_outputs = False  # a computed node the outputs need: predict() computes it

    def __init__(self, kind, value=None):
        self.kind, self.value = kind, value
        self.slot = None
        self.needs_grad = False
        self.grad_slot = None     # where its gradient lives: its own slot, or its consumer's
        self.sgd_fused = False    # a parameter that batch-1 SGD updates inside backward
        self.cls = kind           # a leaf's kind; a computed node's class (vector.group)

    def reads(self):
        return self.args + self.a + self.b


class Computed(Node):
    """A computed node (OP, DOT), its own fields in slots as well: every pass reads them for every
    node, and in a __dict__ each read reached one more object (on a random 100,000-Value graph,
    whose objects outgrow the caches, the lowering's time is mostly such reads)."""
    __slots__ = ("op", "args", "k", "a", "b", "shares_grad", "for_outputs")

    def __init__(self, kind, op=None, args=(), k=None):
        self.kind, self.value = kind, None
        self.slot = None
        self.needs_grad = False
        self.grad_slot = None
        self.sgd_fused = False
        self.cls = kind
        self.op, self.args, self.k = op, args, k
        self.a = self.b = ()
        self.shares_grad = self.for_outputs = False


@dataclass(slots=True)
class Group:
    """Nodes computing the same thing over operands at constant strides: one loop nest (or, with
    one member, one statement). `shape` are the loop extents, outermost first; `members` are in
    loop order; `operands` where they live (vector.vectorize describes them). In slots: the passes
    read a group's fields once per group and pass, tens of thousands of times on an irregular graph."""
    members: list
    shape: tuple = ()
    guard: tuple = None  # (slot, p): every member is position p, run while d[slot] > p (lower/positions.py)
    masked: int = None   # the loss's sum, whose terms t run while d[masked] > t (lower/positions.py)
    operands: "Operands" = field(default=None, init=False, repr=False, compare=False)

    @property
    def first(self):
        return self.members[0]

    @property
    def family(self):
        """Whether it is a family's loop nest (see _families): extents, strides and lists may
        grow with its outermost index, so that nothing may take them for a rectangle's."""
        return is_family(self.shape)


@dataclass
class Operands:
    """Where a group's operands live. For an op group, `args` holds per argument an Affine or a
    float (a constant the same in every member). For a dot group, `constants` are its loose terms
    that are literals, `terms` its other loose terms, `a` and `b` its factor lists."""
    out: Affine
    args: tuple = ()
    constants: tuple = ()
    term_positions: tuple = ()  # which of the node's args `terms` lists
    terms: Vector = None
    a: Vector = None
    b: Vector = None
    choices: Extent = None  # an op that selects, in a family whose candidates grow with i0: how many


@dataclass
class Program:
    n_params: int
    n_inputs: int
    n_slots: int
    loss: Node
    outputs: list
    forward: list            # groups in evaluation order
    n_output_groups: int     # forward[:n_output_groups] computes everything the outputs need
    backward: list = field(default_factory=list)  # groups whose grads flow back, reverse order
    constants: list = field(default_factory=list)  # (slot, value) of constants that live in slots
    fused: bool = False
    sgd_in_backward: bool = False  # a batch-1 SGD step updates parameters in backward (see the pass)
    sgd_after_backward: list = field(default_factory=list)  # (slot, count) runs of the others
    index_inputs: list = field(default_factory=list)  # (input position, n): inputs gathers read (see index_inputs)
    input_grads: bool = False  # the inputs' gradients are computed too
    sequence: object = None  # Sequence: the loops stop at the sample's length (positions.py)
    unbounded: str = None    # why not, when they do not

    @property
    def input_base(self):
        return self.n_params

    @property
    def read_after(self):
        """The nodes whose values are read after the forward: the outputs, the loss."""
        return (*self.outputs, self.loss)

    @property
    def nodes(self):
        return [n for g in self.forward for n in g.members]


@dataclass
class BatchedProgram:
    """The batched form of a Program: its groups with the batch loop innermost, in the
    batched slots. Slot numbers are the batch buffers'; `loss_slot` and `output_slots` are
    where sample 0's values are (sample b's at + b)."""
    capacity: int
    n_params: int
    n_slots: int
    input_base: int
    n_inputs: int
    loss_slot: int
    output_slots: list
    constants_base: int    # the first slot after the per-sample ones
    forward: list
    n_output_groups: int
    backward: list
    constants: list        # (slot, value)
    sequence: object = None  # Sequence in the batched slots (sample b's weights at + b)
    read_after: tuple = ()   # the Program's (the nodes whose values are read after the forward)
    gradients: object = None  # where its per-sample gradients live in g (lower/gradients.py), or None: at their slots

    @property
    def backward_clears(self):
        """Whether its backward sets every gradient it reads back to 0 (codegen/write/backward.py's
        Plain), so that gradients live at different times can share g: a sequence's."""
        return self.sequence is not None


@dataclasses.dataclass(frozen=True)
class Sequence:
    """What the runtime needs to bound a pass: the slot it writes n into, and the slots of the
    loss's weights w[0..T) (n = one past the last that is not 0); in the batched program also
    where it writes how many of the batch's samples reach each position (ActiveBatch)."""
    slot: int
    weights: tuple
    active: int = None  # the batched program's: d[active + p], the batch's samples that reach position p

    @property
    def every(self):
        """The slot's value that runs every group: T + 1 (T is what reaches no loss term)."""
        return len(self.weights) + 1
