"""Loop nests and kernel calls: how one group's statements become C. The index of a slot in
the loop indices i0, i1, ... (slot_index, data_at, grad_at), a nest of `for` loops around a body
(loop_nest) that sums accumulations which stay put over the innermost loop in a register or as
a dot product after it, and the groups that are one kernel call: a layer over a batch (its
forward matmul_set, its inputs' gradients matmul_acc, its weights' gradients matmul_nt:
templates/kernels/gemm.c), and which of those a layer's forward is (layer). codegen/write/forward.py
and codegen/write/backward.py write the statements, codegen/write/emit.py cuts them into functions
and files.
"""

import contextlib
import contextvars
import dataclasses
import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..lower.types import DOT, OP, ActiveBatch, BatchExtent, Bounded, Extent, is_family
from ..lower.vector import progression
from .dtypes import c_literal
from .kernels import call
from .tree import Assign, Block, ClearGradient, Declare, If, Loop, ReadGradient, Seq, nest

# Lists up to this long are written out element by element, constant offsets the compiler sees
# (a convolution's window); longer ones call the loop kernels of templates/kernels/, which for
# contiguous lists pay off sooner.
UNROLL_MAX, UNROLL_MAX_CONTIGUOUS = 32, 16
# dot_rows serves runs of four rows and more (sharing loads); shorter runs only over rows this
# long, where screening the gradient row for zero chunks pays for its pass (a convolution's
# 3-wide windows over rows of 26 run faster as single dots, measured).
DOT_ROWS_SCREEN = 64
# A layer's kernels (layer): over a batch (matmul_set, and its gradients' matmul_acc and
# matmul_nt) from rows of this many samples; on one sample's sparse inputs (matvec) from this
# many neurons, which it runs four at a time.
LAYER_MIN_SAMPLES, MATVEC_MIN_ROWS = UNROLL_MAX_CONTIGUOUS // 2, 4


def tree_sum(parts):
    """parts summed pairwise, ((p0 + p1) + (p2 + p3)) + ...: a chain of n additions would wait on
    each one in turn; the tree is log2(n) deep (fused mode reorders sums anyway)."""
    while len(parts) > 1:
        pairs = [f"({parts[i]} + {parts[i + 1]})" for i in range(0, len(parts) - 1, 2)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def unrolled(*vectors):
    """Whether lists are written out element by element (a growing list never is)."""
    if any(v.length is not None for v in vectors):
        return False
    n = len(vectors[0].offsets)
    return n <= (UNROLL_MAX_CONTIGUOUS if all(v.contiguous for v in vectors) else UNROLL_MAX)


def short(*vectors):
    """Whether contiguous lists that grow with the outer loop (a family's) stay short enough for
    the inline loops of templates/prelude.c (dot_short and the like) instead of the kernels."""
    return all(v.length is not None and v.contiguous and v.n <= UNROLL_MAX_CONTIGUOUS for v in vectors)


# The batched program's gradients' layout (codegen/lower/gradients.py) while its functions are
# made and written (emit.py: gradients_placed), else None: every gradient at its value's index.
_GRADIENTS = contextvars.ContextVar("gradients", default=None)


@contextlib.contextmanager
def gradients_placed(layout):
    """slot_index's gradients placed by `layout` (a GradientLayout, or None) within."""
    token = _GRADIENTS.set(layout)
    try:
        yield
    finally:
        _GRADIENTS.reset(token)


def slot_index(affine, offset=0, grad=False):
    """The C index of an Affine slot (plus offset) in the loop indices i0, i1, ...; a gradient's
    where the layout in effect puts it (an access's slots all lie in one of its regions, which
    moves as a whole: its first slot's place is every one's)."""
    base = (affine.grad_offset() if grad else affine.base) + offset
    layout = _GRADIENTS.get() if grad else None
    if layout is not None:
        base = layout.at(base)
    if not affine.tri and not any(affine.strides):  # (a single statement's slot: most of a big irregular graph's)
        return str(base)
    parts = [str(base)]
    parts += [f"i{d}" if s == 1 else f"({s}) * i{d}" if isinstance(s, Extent) else f"{s} * i{d}"
              for d, s in enumerate(affine.strides) if s]
    if affine.tri:  # (tri0: i0 * (i0 - 1) / 2, kept by the family's loop: tree.Loop)
        parts.append(("" if affine.tri == 1 else f"{affine.tri} * ") + "tri0")
    return " + ".join(parts).replace("+ -", "- ")


def data_at(affine, offset=0):
    return f"d[{slot_index(affine, offset)}]"


def grad_at(affine, offset=0):
    return f"g[{slot_index(affine, offset, grad=True)}]"


def operand(arg, dtype):
    """An op argument in C: a slot, or a constant's literal."""
    return data_at(arg) if hasattr(arg, "base") else c_literal(arg, dtype)


class OffsetTables:
    """Static offset arrays for operand lists that are not contiguous; identical ones shared."""

    def __init__(self):
        self.names = {}

    def __call__(self, offsets):
        return self.names.setdefault(tuple(offsets), f"offsets_{len(self.names)}")

    def render(self, declare=False):
        """Definitions, or the declarations another unit needs to use them."""
        if declare:
            return "\n".join(f"extern SHARED const int32_t {name}[];" for name in self.names.values())
        return "\n".join(f"SHARED const int32_t {name}[] = {{{', '.join(map(str, offsets))}}};"
                          for offsets, name in self.names.items())


@dataclass(frozen=True)
class Accumulate:
    """`g[target + offset] += term`, kept apart from other statements so that a loop nest can sum
    it outside the innermost loop when the target stays put over it (the weights a convolution
    shares between positions, a layer's weights over the samples of a batch): in a register, or,
    for `term` = the group's gradient times a value, both contiguous along that loop (`product`:
    their Affines and the value's offset; no value: the gradient alone), as one dot product (or
    sum) over the loop's range."""
    target: object  # Affine
    offset: int
    term: str
    product: tuple = None

    def assign(self, value=None):
        """The C statement: the term, or `value` (its sum over a loop), added to the target."""
        return Assign(grad_at(self.target, self.offset), value or self.term, "+=")


def at_start(affine):
    """The Affine with the innermost loop index at 0."""
    return dataclasses.replace(affine, strides=affine.strides[:-1] + (0,))


def along_lanes(shape, *affines):
    """Whether the innermost loop of `shape` is the batch's (the batched program) and every Affine
    moves along it by one slot: a loop of kernel calls, one a sample, is then one call over the
    batch's lanes (templates/kernels/axpy.c's *_lanes kernels), each lane's sums in the same order."""
    return bool(shape) and isinstance(shape[-1], BatchExtent) and all(a.strides[-1] == 1 for a in affines)


def lanes_apart(shape, *affines):
    """Whether the innermost loop of `shape` is the batch's and a lane's slots are its own in every
    Affine: each moves along it by one slot, and its base and other steps put lane 0 at one place
    in the batch's rows (the same remainder by the capacity in d, and in g): no iteration then reads
    or writes what another does, whatever the loops outside (a family's growing blocks too)."""
    if not along_lanes(shape, *affines):
        return False
    capacity = int(shape[-1])
    rows = lambda s: (s.first % capacity, s.step % capacity) == (0, 0) if isinstance(s, Extent) else s % capacity == 0  # noqa: E731
    return (len({a.base % capacity for a in affines}) == 1 and len({a.grad_offset() % capacity for a in affines}) == 1
            and all(rows(a.tri) and all(rows(s) for s in a.strides[:-1]) for a in affines))


def _zero_last(affine, n):
    """The Affine with its last n loop indices at 0."""
    return dataclasses.replace(affine, strides=affine.strides[:-n] + (0,) * n)


def loop_start(affine, last, offset=0, grad=False):
    """C for the address of an Affine slot (plus offset) in d (or g) with its last `last` loop
    indices at 0: where a kernel that runs those loops itself starts."""
    return f"{'g' if grad else 'd'} + {slot_index(_zero_last(affine, last), offset, grad=grad)}"


def bias_arguments(terms, last, step_of):
    """A layer kernel's bias and bias_j: the loose term's start and its step along the neurons
    (step_of its Affine), or NULL, 0 without one."""
    if not terms:
        return {"bias": "NULL", "bias_j": 0}
    return {"bias": loop_start(terms.start, last, terms.offsets[0]), "bias_j": step_of(terms.start)}


def guarded(g, statements):
    """A group's statements, run only while the sample has more positions than its members'
    (Group.guard, lower/positions.py)."""
    if g.guard is None or not statements:
        return statements
    slot, p = g.guard
    return [If(f"d[{slot}] > {p}", Block(tuple(statements)))]


def kernel_loops(shape):
    """How many of a loop nest's innermost loops a layer kernel runs itself: the neurons' and the
    batch's, or the batch's alone."""
    return 2 if len(shape) >= 2 else 1


def per_pass(shape, kernel_call, joint=None):
    """The kernel call (a kernels.Call) once per pass of the loops outside those it runs itself;
    joint: full_passes(shape, ...)'s, when its first passes run as one (S: samples(shape, joint))."""
    if joint is None:
        return nest(shape[:-kernel_loops(shape)], [kernel_call], braced=False)
    return Loop(0, shape[0], (kernel_call,), braced=False, full=joint)


def full_passes(shape, affines):
    """A batched sequence's product per position, over (positions, neurons, the position's
    samples) (codegen/lower/types.py's ActiveBatch), whose operands' slots for the positions lie
    side by side (each moving with the samples moves by the capacity from one position to the
    next; the others, the weights, stay put over both): the C of how many first positions all
    the pass's samples reach, whose calls are then one call over all their samples at once (a
    wider product; templates/prelude.c's full_positions). Else None."""
    if len(shape) != 3 or kernel_loops(shape) != 2 or not isinstance(shape[-1], ActiveBatch) or shape[-1].loop != 0:
        return None
    positions, capacity = shape[0], int(shape[-1])
    if not isinstance(positions, Bounded) or positions.counts is not None:
        return None
    for affine in affines:
        moves = affine.strides[-1]
        if affine.tri or moves not in (0, 1) or affine.strides[0] != (capacity if moves else 0):
            return None
    return f"full_positions(d + {shape[-1].active + shape[-1].first}, n0, {capacity})"


def samples(shape, joint):
    """A layer kernel's S: the batch loop's extent, or (full_passes) the first passes' samples at once."""
    return shape[-1] if joint is None else f"(i0 < f0 ? f0 * {int(shape[-1])} : {shape[-1]})"


def neurons(shape):
    """How many neurons a layer kernel runs over: the loop outside the batch's, or one."""
    return shape[-2] if kernel_loops(shape) == 2 else 1


def along_neurons(affine, shape):
    """An operand's step from one neuron to the next (0 when the kernel runs one neuron)."""
    return affine.strides[-2] if kernel_loops(shape) == 2 else 0


@dataclass(frozen=True)
class Matmul:
    """A layer's inputs' gradients over a batch, `g[wrt + i] += go * d[weights + j]` for the pairs
    (i, j) of the two lists, where the inputs' gradients move with the innermost loop (the batch)
    and stay put over the one outside it (the neurons), and the weights do not move with the
    batch: one matmul_acc call per pass of the outer loops, instead of the neurons' loop reading
    and writing every input's gradients once per neuron."""
    wrt: object      # Vector: the inputs' gradients
    weights: object  # Vector
    out: object      # Affine: the group's gradients (go)
    epilogue: tuple = None  # (the C function, Affines of its y, a, o over the rows: fused_gradient)
    overwrite: bool = False  # the inputs' gradients are the sum from 0: no other contribution (Backward)
    in_place: bool = False  # the sums go into the epilogue's y, which it finishes there (Backward._products)

    def in_loops(self, shape):
        """Its kernel call in a loop nest over shape."""
        arguments, joint = self.arguments(shape)
        return per_pass(shape, call("matmul_acc", **arguments), joint)

    def arguments(self, shape):
        """matmul_acc's arguments in a loop nest over shape, and full_passes'."""
        last = kernel_loops(shape)
        wrt, weights = self.wrt, self.weights
        laid = ()  # (the epilogue's operands' Affines)
        if self.epilogue:
            function, *laid = self.epilogue
            y, a, o = laid
            # (over the product's rows, fused_gradient's: the kernel runs their last two loops)
            epilogue = dict(epilogue=function, y=loop_start(y, 2, grad=True), y_k=y.strides[-2],
                            a=loop_start(a, 2), a_k=a.strides[-2], o=loop_start(o, 2), o_k=o.strides[-2])
        else:
            epilogue = dict(epilogue="NULL", y="NULL", y_k=0, a="NULL", a_k=0, o="NULL", o_k=0)
        joint = full_passes(shape, (wrt.start, weights.start, self.out, *laid))
        out = (dict(out=epilogue["y"], out_k=epilogue["y_k"]) if self.in_place else
               dict(out=loop_start(wrt.start, last, wrt.offsets[0], grad=True), out_k=progression(wrt.offsets)))
        return dict(**out, w=loop_start(weights.start, last, weights.offsets[0]),
                    w_j=along_neurons(weights.start, shape), w_k=progression(weights.offsets),
                    go=loop_start(self.out, last, grad=True), go_j=along_neurons(self.out, shape),
                    J=neurons(shape), S=samples(shape, joint), K=len(wrt.offsets), **epilogue,
                    overwrite=int(self.overwrite or self.in_place)), joint

    @staticmethod
    def fits(shape, wrt, other, out):
        """Whether `g[wrt] += go * d[other]` in a loop nest over shape is such a product."""
        return (len(shape) >= 1 and not is_family(shape) and shape[-1] >= LAYER_MIN_SAMPLES
                and out.strides[-1] == 1 and wrt.start.strides[-1] == 1 and (len(shape) < 2 or wrt.start.strides[-2] == 0)
                and other.start.strides[-1] == 0
                and progression(wrt.offsets) is not None and progression(other.offsets) is not None)


@dataclass(frozen=True)
class WeightGradient:
    """A layer's weights' gradients over a batch, `g[weights + i] += go * d[inputs + j]` for the
    pairs (i, j) of the two lists, where the weights' gradients (one row, contiguous) stay put
    over the innermost loop (the batch) and the inputs move with it and stay put over the one
    outside it (the neurons): one matmul_nt call (dY X^T) per pass of the outer loops, instead
    of an axpy per neuron and sample."""
    wrt: object     # Vector: the weights' gradients
    inputs: object  # Vector
    out: object     # Affine: the group's gradients (go)
    rows: str = "NULL"  # C: the list of the inputs' rows that hold a nonzero (sparse inputs), or NULL
    step: bool = False  # the batched program's SGD step on these weights, when `rate` is not 0
    bias: object = None  # Accumulate: the layer's biases' gradients, `g[bias] += go` over the batch, or None
    bias_step: bool = False  # and the batched program's SGD step on the biases with the weights'

    def in_loops(self, shape):
        """Its kernel call in a loop nest over shape."""
        arguments, joint = self.arguments(shape)
        return per_pass(shape, call("matmul_nt", **arguments), joint)

    def arguments(self, shape):
        """matmul_nt's arguments in a loop nest over shape, and full_passes'."""
        last = kernel_loops(shape)
        wrt, x = self.wrt, self.inputs
        step = (dict(w=f"rate ? {loop_start(wrt.start, last, wrt.offsets[0])} : NULL", rate="rate") if self.step
                else dict(w="NULL", rate=0))
        bias = dict(bias="NULL", bias_j=0)
        if self.bias:
            at = dict(affine=self.bias.target, last=last, offset=self.bias.offset)
            gradients = loop_start(**at, grad=True)
            bias = dict(bias=f"rate ? {loop_start(**at)} : {gradients}" if self.bias_step else gradients,
                        bias_j=along_neurons(self.bias.target, shape))
        joint = None if self.step or self.rows != "NULL" else full_passes(shape, (wrt.start, x.start, self.out))
        return dict(out=loop_start(wrt.start, last, wrt.offsets[0], grad=True),
                    out_j=along_neurons(wrt.start, shape), go=loop_start(self.out, last, grad=True),
                    go_j=along_neurons(self.out, shape), x=loop_start(x.start, last, x.offsets[0]),
                    x_k=progression(x.offsets), J=neurons(shape), K=len(wrt.offsets), S=samples(shape, joint),
                    rows=self.rows, **step, **bias), joint

    def weights(self, shape):
        """The slots of the weights (all passes of the loops outside the batch's)."""
        start = self.wrt.start
        rows = _positions(type(start)(start.base, start.strides[:-1]), shape[:-1])
        return (rows[:, None] + np.array(self.wrt.offsets)).ravel()

    def biases(self, shape):
        """The slots of the biases (bias's target, all passes of the loops outside the batch's)."""
        start = self.bias.target
        return _positions(type(start)(start.base, start.strides[:-1]), shape[:-1]) + self.bias.offset

    @staticmethod
    def fits(shape, wrt, other, out):
        """Whether `g[wrt] += go * d[other]` in a loop nest over shape is such a product."""
        return (len(shape) >= 1 and not is_family(shape) and shape[-1] >= LAYER_MIN_SAMPLES
                and out.strides[-1] == 1 and wrt.contiguous and wrt.start.strides[-1] == 0 and other.start.strides[-1] == 1
                and (len(shape) < 2 or other.start.strides[-2] == 0) and progression(other.offsets) is not None)


def layer_over_batch(g, row_list=lambda rows: "NULL", epilogue=None):
    """A dot group that is a layer over a batch, as one matmul_set call per pass of the loops
    outside the neurons' and samples': the results move with the batch (innermost) and with the
    neurons; one factor list (the weights) stays put over the batch, the other (the inputs'
    rows) moves with it and stays put over the neurons, each at a constant step along the list;
    at most one loose term: the bias, which stays put over the batch, or one that moves with it
    (a residual: `x + W h`, of 8 products or more: not a subtraction's `a + b * -1`), added
    after the product. Else None. epilogue: (the C function, the Affine of its results, whether
    in place) of an activation the kernel applies to each row as it finishes it (see
    fused_activation; not after a residual, which is added later: takes_epilogue); in place, the
    product's sums go where the activation's results do (Forward._in_place), and the function
    may be matmul_set's own parameter instead (the op table's in_products: the kernel applies it
    as it stores the sums)."""
    ops, shape = g.operands, g.shape
    if (g.first.kind != DOT or not shape or g.family or shape[-1] < LAYER_MIN_SAMPLES or not ops.a
            or ops.constants or ops.out.strides[-1] != 1 or (ops.terms and len(ops.terms.offsets) != 1)
            or (_residual(ops) and (epilogue is not None or len(ops.a.offsets) < UNROLL_MAX_CONTIGUOUS // 2))):
        return None
    last = kernel_loops(shape)
    batched = last == 2
    for weights, rows in ((ops.a, ops.b), (ops.b, ops.a)):
        if (weights.start.strides[-1] == 0 and rows.start.strides[-1] == 1
                and (not batched or rows.start.strides[-2] == 0)
                and progression(weights.offsets) is not None and progression(rows.offsets) is not None):
            break
    else:
        return None
    residual = _residual(ops)
    bias = bias_arguments(None if residual else ops.terms, last, lambda affine: along_neurons(affine, shape))
    listed = row_list(rows)
    joint = None if listed != "NULL" else full_passes(
        shape, (ops.out, weights.start, rows.start, *([] if residual or not ops.terms else [ops.terms.start]),
                *([] if epilogue is None else [epilogue[1]])))
    out = epilogue[1] if epilogue is not None and epilogue[2] else ops.out  # (in place: Forward._in_place)
    product = call("matmul_set", out=loop_start(out, last), out_j=along_neurons(out, shape), **bias,
                   w=loop_start(weights.start, last, weights.offsets[0]), w_j=along_neurons(weights.start, shape),
                   w_k=progression(weights.offsets), x=loop_start(rows.start, last, rows.offsets[0]),
                   x_k=progression(rows.offsets), J=neurons(shape), S=samples(shape, joint), K=len(weights.offsets),
                   rows=listed, **_epilogue_arguments(epilogue, shape))
    if not residual:
        return per_pass(shape, product, joint)
    add = Assign(data_at(ops.out), data_at(ops.terms.start, ops.terms.offsets[0]), "+=")  # (x + W h: the same sum)
    return Seq((per_pass(shape, product, joint), *loop_nest(shape, [add], independent=True)))


def layer(g, tables, epilogue=None):
    """Which layer kernel, if any, computes dot group g's forward, the one place that decides: a
    layer over a batch (layer_over_batch: matmul_set, rows of LAYER_MIN_SAMPLES samples and more;
    epilogue as there), else one over a sample's sparse inputs (layer_on_one_sample: matvec, from
    MATVEC_MIN_ROWS rows). Its statement, or None. tables: the program's sides.SideTables (row
    lists, nonzero lists)."""
    return layer_over_batch(g, tables.row_list, epilogue) or layer_on_one_sample(g, tables.nonzeros)


def layer_on_one_sample(g, nonzero_list):
    """A dot group over sparse inputs whose innermost loop moves the results and one factor
    list (the weights' rows) and not the other (an input range with a nonzero list: nonzero_list(v) gives its C pointer, or None): one
    matvec call per pass of the loops outside it, four rows at a time sharing the walk
    through the list (templates/kernels/sparse.c); at most one loose term (the bias), no constants.
    Else None: over dense inputs a row at a time streams faster (microbenchmark of MNIST's
    first layer, gcc -O3 native: dot() per row 0.85x matvec's time)."""
    ops, shape = g.operands, g.shape
    if (g.first.kind != DOT or not shape or g.family or shape[-1] < MATVEC_MIN_ROWS or not ops.a or ops.constants
            or (ops.terms and len(ops.terms.offsets) != 1) or not (ops.a.contiguous and ops.b.contiguous)
            or unrolled(ops.a, ops.b)):
        return None
    for weights, inputs in ((ops.a, ops.b), (ops.b, ops.a)):
        nonzeros = nonzero_list(inputs)
        if nonzeros and weights.start.strides[-1]:
            break
    else:
        return None
    bias = bias_arguments(ops.terms, 1, lambda affine: affine.strides[-1])
    product = call("matvec", out=loop_start(ops.out, 1), out_j=ops.out.strides[-1], **bias,
                   w=loop_start(weights.start, 1), w_j=weights.start.strides[-1], x=loop_start(inputs.start, 1),
                   n=len(inputs.offsets), J=shape[-1], nz=nonzeros)
    return nest(shape[:-1], [product], braced=False)


def _residual(ops):
    """Whether a layer's loose term moves with the batch (not a bias)."""
    return bool(ops.terms) and ops.terms.start.strides[-1] != 0


def takes_epilogue(g):
    """Whether g is a layer over a batch whose product can finish with an activation."""
    return layer_over_batch(g) is not None and not _residual(g.operands)


def _epilogue_arguments(epilogue, shape):
    none = dict(epilogue="NULL", y="NULL", y_j=0, relu=0)
    if epilogue is None:
        return none
    function, y, in_place = epilogue
    if in_place and function in none:  # (an op's in_products: matmul_set's own parameter)
        return dict(none, **{function: 1})
    return dict(none, epilogue=function, y=loop_start(y, kernel_loops(shape)), y_j=along_neurons(y, shape))


def fused_activation(g, h):
    """Where group h (later in the same forward pass) writes, as an Affine over layer group g's
    loop nest, when h is an activation of g's results that g's product can apply as its epilogue:
    a one-argument op over exactly g's results, in g's order (in g's loop nest, or in one loop
    over the same contiguous slots), its own results contiguous along the batch; else None.
    Computing h early is safe: it reads nothing but g's results, and nothing before it reads
    its own."""
    if not _activation(h) or _laid(h.operands.args[0], h.shape, g.shape) != g.operands.out:
        return None
    return _laid(h.operands.out, h.shape, g.shape)


def fused_gradient(wrt, shape, h):
    """For a layer's inputs' gradients (a Matmul of wrt over a loop nest of `shape`) and the
    group h after it in backward order: when the inputs are h's results, h an activation, as
    (where its argument's gradient, its argument and its results are), Affines over the product's
    rows (inputs by samples, in each pass of the loops outside the product's: a batch's
    positions), what the product's epilogue needs to add h's gradient to its argument's
    (templates/kernels/gemm.c); else None. The product is the last to add to the inputs'
    gradients: h reads them next."""
    if not _activation(h):
        return None
    x, node = h.operands.args[0], h.first.args[0]
    if not node.needs_grad or node.shares_grad or wrt.start.grad_base is not None or x.grad_base is not None:
        return None
    outer = len(shape) - kernel_loops(shape)
    rows = (*shape[:outer], len(wrt.offsets), shape[-1])
    results, argument = _laid(h.operands.out, h.shape, rows), _laid(x, h.shape, rows)
    inputs = type(x)(wrt.start.base + wrt.offsets[0], (*wrt.start.strides[:outer], progression(wrt.offsets), 1))
    if argument is None or results != inputs:
        return None
    return argument, argument, results  # (gradients and values share slot numbers)


def _activation(h):
    """Whether group h applies a one-argument op to slots (not constants)."""
    return (h.first.kind == OP and h.first.op.arity == 1 and len(h.operands.args) == 1
            and hasattr(h.operands.args[0], "base") and not h.family)


def _laid(affine, along, shape):
    """The Affine over a two-loop nest `shape` (or one loop) that reaches the slots `affine`
    reaches over the loop nest `along`, in the same order, contiguous along the last loop; or
    None. Nests of a fixed size compare slot by slot (a group's loops may have been merged into
    one); a batch's (whose extent varies) only as they are."""
    if along == shape:
        return affine if affine.strides and affine.strides[-1] == 1 else None
    order = _same_loops(along, shape)
    if order is not None:  # the same loops in another order (a batch's: positions, neurons, samples)
        strides = tuple(affine.strides[k] for k in order)
        return dataclasses.replace(affine, strides=strides) if strides[-1] == 1 else None
    fixed = all(type(n) is int for n in along + shape)
    if not fixed or not 1 <= len(shape) <= 2 or math.prod(along) != math.prod(shape):
        return None
    positions = _positions(affine, along).reshape((1,) * (2 - len(shape)) + tuple(shape))
    step = int(positions[1, 0] - positions[0, 0]) if positions.shape[0] > 1 else 0
    laid = type(affine)(int(positions[0, 0]), (step, 1)[-len(shape):])
    return laid if np.array_equal(_positions(laid, shape), positions.ravel()) else None


def _same_loops(along, shape):
    """The order of the loops of nest `along` that makes nest `shape` (its loop k is along's
    loop order[k]), when the two have the same loops in another order and one of their extents
    is cut at run time (a batch's: an extent that names the index of the loop it depends on
    names it in the new order); else None. Nests of a fixed size compare slot by slot (_laid)."""
    if len(along) != len(shape) or all(type(n) is int for n in along + shape):
        return None
    for order in itertools.permutations(range(len(along))):
        if list(order) != sorted(order) and all(_same_extent(along[k], shape[i], order) for i, k in enumerate(order)):
            return order
    return None


def _same_extent(a, b, order):
    """Whether loop extent a of one nest is extent b of the same loops in `order` (_same_loops)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, ActiveBatch):
        return (a.active, a.first) == (b.active, b.first) and (
            a.loop == b.loop if a.loop is None or b.loop is None else order.index(a.loop) == b.loop)
    return str(a) == str(b) and int(a) == int(b)


def _positions(affine, shape):
    """The slots an Affine reaches over a loop nest, in loop order."""
    positions = np.full((), affine.base, dtype=np.int64)
    for n, stride in zip(shape, affine.strides):
        positions = positions[..., None] + stride * np.arange(n)
    return positions.ravel()


def _layer_backward(shape, products):
    """A layer's inputs' and weights' gradients (a Matmul, then a WeightGradient over the same
    neurons' gradient rows and weights, one call each) as one matmul_acc_nt call, whose threads
    each start their share of the second as soon as their part of the first is done; else None."""
    if (len(products) != 2 or len(shape) != 2 or not isinstance(products[0], Matmul)
            or not isinstance(products[1], WeightGradient)):
        return None
    inputs, weights = products
    if (inputs.out != weights.out or inputs.weights.start != weights.wrt.start
            or inputs.weights.offsets != weights.wrt.offsets):
        return None
    (acc, acc_joint), (nt, nt_joint) = inputs.arguments(shape), weights.arguments(shape)
    if acc_joint is not None or nt_joint is not None or any(acc[k] != nt[k] for k in ("go", "go_j", "J", "S", "K")):
        return None
    rest = dict(grad=nt["out"], grad_j=nt["out_j"], x=nt["x"], x_k=nt["x_k"], rows=nt["rows"], step=nt["w"],
                rate=nt["rate"], bias=nt["bias"], bias_j=nt["bias_j"])
    return [per_pass(shape, call("matmul_acc_nt", **acc, **rest))]


def loop_nest(shape, body, dots=True, independent=False, unless_zero=False):
    """The typed statements `body` (Accumulate, Matmul, WeightGradient, ReadGradient and the
    statements of codegen/write/tree.py) inside one loop nest over `shape` (none for a single
    node), as tree statements. With `dots`, accumulations of products may become dot products
    after the innermost loop (only where the loop updates no value they read). `independent`: no
    iteration reads what another writes (a forward loop writes only its group's results, which it
    never reads). `unless_zero`: what follows the gradient's read runs only when it is not 0. A
    ClearGradient goes with the read, or in a loop nest of its own after the rest where a kernel or
    a dot product after the innermost loop still reads the gradient."""
    if not shape:
        return _skipping_zero([placed(s) for s in body], unless_zero)
    clears = [s for s in body if isinstance(s, ClearGradient)]
    held = [s for s in body if isinstance(s, Accumulate) and s.target.strides[-1] == 0]
    dotted = [s for s in held if dots and s.product and shape[-1] >= UNROLL_MAX_CONTIGUOUS // 2
              and all(a.strides[-1] == 1 for a in s.product[:2] if a is not None)]
    if clears and (dotted or any(isinstance(s, (Matmul, WeightGradient)) for s in body)):
        rest = [s for s in body if not isinstance(s, ClearGradient)]
        return loop_nest(shape, rest, dots, independent, unless_zero) + cleared(shape, clears)
    # the inputs' gradients first: they read the weights, which a weights' gradient may step
    products = sorted((s for s in body if isinstance(s, (Matmul, WeightGradient))),
                      key=lambda s: isinstance(s, WeightGradient))
    matmuls = _layer_backward(shape, products) or [s.in_loops(shape) for s in products]
    if matmuls:
        body = [s for s in body if not isinstance(s, (Matmul, WeightGradient))]
        rest = (loop_nest(shape, body, dots, unless_zero=unless_zero)
                if any(not isinstance(s, ReadGradient) for s in body) else [])
        return rest + matmuls
    summed = [s for s in held if s not in dotted]
    names = {id(s): f"sum{k}" for k, s in enumerate(summed)}
    inner = _skipping_zero([Assign(names[id(s)], s.term, "+=") if id(s) in names else placed(s)
                            for s in body if s not in dotted], unless_zero)
    if all(isinstance(s, ReadGradient) for s in inner):  # everything moved after it: no innermost loop
        return [nest(shape[:-1], [Block(tuple(_after_innermost(summed, dotted, names, shape)))], braced=False)]
    # not a loop that also adds into register sums: Clang's vectorize pragma would let it reorder
    # those sums, into as many lanes as the target's vectors hold (riscv64, with none, summed them
    # in order, aarch64 and x86-64 in two lanes, and -march=native AVX2 in four), where GCC and
    # every other build sum them in the loop's order
    free = not summed and (independent or _independent_writes([s for s in body if s not in held], shape[-1]))
    innermost = Loop(len(shape) - 1, shape[-1], tuple(inner), independent=free)
    if not held:
        return [nest(shape[:-1], [innermost], braced=False)]
    before = [Declare(tuple(names[id(s)] for s in summed))] if summed else []
    block = Block((*before, innermost, *_after_innermost(summed, dotted, names, shape)))
    return [nest(shape[:-1], [block], braced=False)]


def cleared(shape, clears):
    """ClearGradients in a loop nest of their own over `shape`, after statements that still read
    the gradients: where each one's slot moves by one along the innermost loop, a clear_rows call
    a pass of the loops outside the kernel's two (the first full positions at once: full_passes),
    which sets whole rows with memset instead of a store loop a row and a loop's bookkeeping a
    vector (a batched GPT's layer's gradients: 256 rows of 16 lanes a position); else the nest."""
    calls = [_clear_rows(shape, c.slot) for c in clears]
    if clears and all(calls):
        return calls
    return loop_nest(shape, clears, independent=True)


def _clear_rows(shape, slot):
    """clear_rows over the last two loops of `shape` (per_pass) clearing `slot`, or None where
    the kernel cannot run them: a family's nest, a slot not contiguous along the innermost loop,
    an extent or step that moves with one of the two loops."""
    if slot is None or len(shape) < 2 or is_family(shape) or slot.tri or slot.strides[-1] != 1:
        return None
    outside = len(shape) - 2  # (the loops the kernel's rows and values may read the indices of)
    moving = [e for e in (shape[-2], shape[-1], slot.strides[-2])
              if (isinstance(e, Extent) and outside == 0)
              or (isinstance(e, ActiveBatch) and e.loop is not None and e.loop >= outside)]
    if moving:
        return None
    joint = full_passes(shape, (slot,))
    return per_pass(shape, call("clear_rows", y=loop_start(slot, 2, grad=True), y_j=slot.strides[-2],
                                J=shape[-2], S=samples(shape, joint)), joint)


def placed(statement):
    """A typed statement of a loop body as a tree statement."""
    return statement.assign() if isinstance(statement, Accumulate) else statement


def _skipping_zero(statements, unless_zero):
    """The statements, those after the gradient's read in `if (go != 0)` with unless_zero."""
    if not unless_zero:
        return statements
    reads = [s for s in statements if isinstance(s, (ReadGradient, ClearGradient))]
    rest = tuple(s for s in statements if not isinstance(s, (ReadGradient, ClearGradient)))
    return reads + [If("go != 0", Block(rest))]


def _after_innermost(summed, dotted, names, shape):
    """The held accumulations, after the innermost loop: register sums, dot products."""
    n = shape[-1]
    after = [s.assign(names[id(s)]) for s in summed]
    after += [s.assign(str(call("sum_range", x=f"g + {slot_index(at_start(s.product[0]), grad=True)}", n=n)))
              for s in dotted if s.product[1] is None]
    for run in _dot_runs([s for s in dotted if s.product[1] is not None]):
        s = run[0]
        a, b = f"g + {slot_index(at_start(s.product[0]), grad=True)}", f"d + {slot_index(at_start(s.product[1]), s.product[2])}"
        if len(run) < 4 and n < DOT_ROWS_SCREEN:
            after += [t.assign(str(call("dot", a=f"g + {slot_index(at_start(t.product[0]), grad=True)}",
                                        b=f"d + {slot_index(at_start(t.product[1]), t.product[2])}", n=n)))
                      for t in run]
        else:
            b_step, out_step = ((run[1].product[2] - s.product[2], run[1].offset - s.offset) if len(run) > 1
                                else (0, 0))
            after.append(call("dot_rows", a=a, b=b, b_step=b_step, n=n, m=len(run),
                              out=f"g + {slot_index(s.target, s.offset, grad=True)}", out_step=out_step))
    return after


def _dot_runs(dotted):
    """Consecutive dot products after a loop of one gradient against rows at a constant step,
    into targets at a constant step (a neuron's weights over a batch): runs for dot_rows."""
    runs = []
    for s in dotted:
        if runs:
            run, first = runs[-1], runs[-1][0]
            steps = (s.product[2] - run[-1].product[2], s.offset - run[-1].offset)
            if (s.product[:2] == first.product[:2] and s.target == first.target
                    and (len(run) == 1 or steps == (run[1].product[2] - first.product[2], run[1].offset - first.offset))):
                run.append(s)
                continue
        runs.append([s])
    return runs


def _independent_writes(body, n):
    """Whether the innermost loop of a backward body is free of dependences between its n
    iterations: only gradient accumulations (besides reading and clearing the group's own), all
    moving with one stride along it, none reaching a slot that another iteration reaches."""
    writes = [s for s in body if isinstance(s, Accumulate)]
    if (not writes or any(not isinstance(s, (Accumulate, ReadGradient, ClearGradient)) for s in body)
            or any(isinstance(stride, Extent) for s in writes for stride in s.target.strides)):
        return False
    strides = {s.target.strides[-1] for s in writes}
    if len(strides) != 1 or 0 in strides:
        return False
    step = abs(strides.pop())
    bases = sorted({s.target.grad_offset() + s.offset for s in writes})
    return all(b - a >= step * n or (b - a) % step for a, b in zip(bases, bases[1:]))
