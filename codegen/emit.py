"""Emitter: a lowered Program to the C source of an extension module.

Per-op C comes from the op table (micrograd_c/ops.py); the module skeleton is templates/module.c.
Straight-line code is cut into functions of at most `chunk` statements, because optimising
compilers slow down superlinearly on huge basic blocks, and big programs into several C files
that the toolchain compiles in parallel.
"""

import dataclasses
import itertools
import math
from dataclasses import dataclass
import templates

from . import dtypes, ir, optim
from .dtypes import c_literal

# Statements per generated function: gcc/clang -O1 take superlinear time in a function's size.
CHUNK_STATEMENTS = 200
# Statements per C file: big programs become several files, compiled in parallel, each in
# bounded compiler memory.
UNIT_STATEMENTS = 20_000
# From this many generated statements (a loop nest counts one), the generated functions go into a
# file of their own even when they fit one, compiled in parallel with the module's skeleton and
# kernels, which take about half of a fused module's compile time: gcc -O3 -march=native on 2
# cores, 0.66 -> 0.49 s (the zoo's demo), 0.85 -> 0.66 s (MLP(784, [128, 64, 10])), the same
# training speed (MNIST epoch 0.99x gcc, 1.00x clang, paired).
PARALLEL_MIN_STATEMENTS = 16


# Lists up to this long are written out element by element, constant offsets the compiler sees
# (a convolution's window); longer ones call the loop kernels of templates/kernels/, which for
# contiguous lists pay off sooner.
UNROLL_MAX, UNROLL_MAX_CONTIGUOUS = 32, 16
# dot_rows serves runs of four rows and more (sharing loads); shorter runs only over rows this
# long, where screening the gradient row for zero chunks pays for its pass (a convolution's
# 3-wide windows over rows of 26 run faster as single dots, measured).
DOT_ROWS_SCREEN = 64


def _tree_sum(parts):
    """parts summed pairwise, ((p0 + p1) + (p2 + p3)) + ...: a chain of n additions would wait on
    each one in turn; the tree is log2(n) deep (fused mode reorders sums anyway)."""
    while len(parts) > 1:
        pairs = [f"({parts[i]} + {parts[i + 1]})" for i in range(0, len(parts) - 1, 2)]
        parts = pairs + ([parts[-1]] if len(parts) % 2 else [])
    return parts[0]


def _unrolled(*vectors):
    n = len(vectors[0].offsets)
    return n <= (UNROLL_MAX_CONTIGUOUS if all(v.contiguous for v in vectors) else UNROLL_MAX)


def _index(affine, offset=0, grad=False):
    """The C index of an Affine slot (plus offset) in the loop indices i0, i1, ..."""
    parts = [str((affine.grad_offset() if grad else affine.base) + offset)]
    parts += [f"i{d}" if s == 1 else f"{s} * i{d}" for d, s in enumerate(affine.strides) if s]
    return " + ".join(parts).replace("+ -", "- ")


def _d(affine, offset=0):
    return f"d[{_index(affine, offset)}]"


def _g(affine, offset=0):
    return f"g[{_index(affine, offset, grad=True)}]"


def _operand(arg, dtype):
    """An op argument in C: a slot, or a constant's literal."""
    return _d(arg) if hasattr(arg, "base") else c_literal(arg, dtype)


class _OffsetTables:
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
class _Accumulate:
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

    def render(self, value=None):
        return f"{_g(self.target, self.offset)} += {value or self.term};"


def _at_start(affine):
    """The Affine with the innermost loop index at 0."""
    return type(affine)(affine.base, affine.strides[:-1] + (0,), affine.grad_base)


def _zero_last(affine, n):
    """The Affine with its last n loop indices at 0."""
    return type(affine)(affine.base, affine.strides[:-n] + (0,) * n, affine.grad_base)


def _loop_start(affine, last, offset=0, grad=False):
    """C for the address of an Affine slot (plus offset) in d (or g) with its last `last` loop
    indices at 0: where a kernel that runs those loops itself starts."""
    return f"{'g' if grad else 'd'} + {_index(_zero_last(affine, last), offset, grad=grad)}"


def _bias_argument(terms, last, step_of):
    """A layer kernel's bias arguments: the loose term's start and its step along the neurons
    (step_of its Affine), or NULL, 0 without one."""
    return f"{_loop_start(terms.start, last, terms.offsets[0])}, {step_of(terms.start)}" if terms else "NULL, 0"


def _loop_headers(shape):
    """`for` headers of a loop nest over shape, index i0 outermost."""
    return [f"for (long i{d} = 0; i{d} < {n}; i{d}++)" for d, n in enumerate(shape)]


def _progression(offsets):
    """The common step of offsets, or None if they are not an arithmetic progression."""
    step = offsets[1] - offsets[0] if len(offsets) > 1 else 0
    return step if all(b - a == step for a, b in zip(offsets, offsets[1:])) else None


@dataclass(frozen=True)
class _Matmul:
    """A layer's inputs' gradients over a batch, `g[wrt + i] += go * d[weights + j]` for the pairs
    (i, j) of the two lists, where the inputs' gradients move with the innermost loop (the batch)
    and stay put over the one outside it (the neurons), and the weights do not move with the
    batch: one matmul_acc call per pass of the outer loops, instead of the neurons' loop reading
    and writing every input's gradients once per neuron."""
    wrt: object      # Vector: the inputs' gradients
    weights: object  # Vector
    out: object      # Affine: the group's gradients (go)

    def render(self, shape):
        batched = len(shape) >= 2
        neurons, samples = (shape[-2] if batched else 1), shape[-1]
        last = 2 if batched else 1
        wrt, weights = self.wrt, self.weights
        call = (f"matmul_acc({_loop_start(wrt.start, last, wrt.offsets[0], grad=True)}, "
                f"{_progression(wrt.offsets)}, {_loop_start(weights.start, last, weights.offsets[0])}, "
                f"{weights.start.strides[-2] if batched else 0}, {_progression(weights.offsets)}, "
                f"{_loop_start(self.out, last, grad=True)}, {self.out.strides[-2] if batched else 0}, "
                f"{neurons}, {samples}, {len(wrt.offsets)});")
        outer = _loop_headers(shape[:-last])
        return "\n    ".join(outer + [call])

    @staticmethod
    def fits(shape, wrt, other, out):
        """Whether `g[wrt] += go * d[other]` in a loop nest over shape is such a product."""
        return (len(shape) >= 1 and shape[-1] >= UNROLL_MAX_CONTIGUOUS // 2 and out.strides[-1] == 1
                and wrt.start.strides[-1] == 1 and (len(shape) < 2 or wrt.start.strides[-2] == 0)
                and other.start.strides[-1] == 0
                and _progression(wrt.offsets) is not None and _progression(other.offsets) is not None)


@dataclass(frozen=True)
class _WeightGradient:
    """A layer's weights' gradients over a batch, `g[weights + i] += go * d[inputs + j]` for the
    pairs (i, j) of the two lists, where the weights' gradients (one row, contiguous) stay put
    over the innermost loop (the batch) and the inputs move with it and stay put over the one
    outside it (the neurons): one matmul_nt call (dY X^T) per pass of the outer loops, instead
    of an axpy per neuron and sample."""
    wrt: object     # Vector: the weights' gradients
    inputs: object  # Vector
    out: object     # Affine: the group's gradients (go)
    rows: str = "NULL"  # C: the list of the inputs' rows that hold a nonzero (sparse inputs), or NULL

    def render(self, shape):
        batched = len(shape) >= 2
        last = 2 if batched else 1
        wrt, x = self.wrt, self.inputs
        call = (f"matmul_nt({_loop_start(wrt.start, last, wrt.offsets[0], grad=True)}, "
                f"{wrt.start.strides[-2] if batched else 0}, {_loop_start(self.out, last, grad=True)}, "
                f"{self.out.strides[-2] if batched else 0}, {_loop_start(x.start, last, x.offsets[0])}, "
                f"{_progression(x.offsets)}, {shape[-2] if batched else 1}, {len(wrt.offsets)}, {shape[-1]}, "
                f"{self.rows});")
        return "\n    ".join(_loop_headers(shape[:-last]) + [call])

    @staticmethod
    def fits(shape, wrt, other, out):
        """Whether `g[wrt] += go * d[other]` in a loop nest over shape is such a product."""
        return (len(shape) >= 1 and shape[-1] >= UNROLL_MAX_CONTIGUOUS // 2 and out.strides[-1] == 1
                and wrt.contiguous and wrt.start.strides[-1] == 0 and other.start.strides[-1] == 1
                and (len(shape) < 2 or other.start.strides[-2] == 0) and _progression(other.offsets) is not None)


def _layer_over_batch(g, row_list=lambda rows: "NULL"):
    """A dot group that is a layer over a batch, as one matmul_set call per pass of the loops
    outside the neurons' and samples': the results move with the batch (innermost) and with the
    neurons; one factor list (the weights) stays put over the batch, the other (the inputs'
    rows) moves with it and stays put over the neurons, each at a constant step along the list;
    at most one loose term (the bias), which stays put over the batch. Else None."""
    ops, shape = g.operands, g.shape
    if (g.first.kind != "dot" or not shape or shape[-1] < UNROLL_MAX_CONTIGUOUS // 2 or not ops.a
            or ops.constants or ops.out.strides[-1] != 1
            or (ops.terms and (len(ops.terms.offsets) != 1 or ops.terms.start.strides[-1] != 0))):
        return None
    batched = len(shape) >= 2
    for weights, rows in ((ops.a, ops.b), (ops.b, ops.a)):
        if (weights.start.strides[-1] == 0 and rows.start.strides[-1] == 1
                and (not batched or rows.start.strides[-2] == 0)
                and _progression(weights.offsets) is not None and _progression(rows.offsets) is not None):
            break
    else:
        return None
    last = 2 if batched else 1

    def along_neurons(affine):
        return affine.strides[-2] if batched else 0
    bias = _bias_argument(ops.terms, last, along_neurons)
    call = (f"matmul_set({_loop_start(ops.out, last)}, {along_neurons(ops.out)}, {bias}, "
            f"{_loop_start(weights.start, last, weights.offsets[0])}, {along_neurons(weights.start)}, "
            f"{_progression(weights.offsets)}, {_loop_start(rows.start, last, rows.offsets[0])}, "
            f"{_progression(rows.offsets)}, {shape[-2] if batched else 1}, {shape[-1]}, {len(weights.offsets)}, "
            f"{row_list(rows)});")
    return "\n    ".join(_loop_headers(shape[:-last]) + [call])


def _loop(shape, body, dots=True, independent=False):
    """The statements `body` inside one loop nest over `shape` (none for a single node). With
    `dots`, accumulations of products may become dot products after the innermost loop (only
    where the loop updates no value they read). `independent`: no iteration reads what another
    writes (a forward loop writes only its group's results, which it never reads), which the
    C compiler is told, so that it vectorises without checking at run time."""
    if not shape:
        return [s.render() if isinstance(s, _Accumulate) else s for s in body]
    matmuls = [s.render(shape) for s in body if isinstance(s, (_Matmul, _WeightGradient))]
    if matmuls:
        body = [s for s in body if not isinstance(s, (_Matmul, _WeightGradient))]
        rest = _loop(shape, body, dots) if any(not (isinstance(s, str) and s.startswith(_GO)) for s in body) else []
        return rest + matmuls
    held = [s for s in body if isinstance(s, _Accumulate) and s.target.strides[-1] == 0]
    dotted = [s for s in held if dots and s.product and shape[-1] >= UNROLL_MAX_CONTIGUOUS // 2
              and all(a.strides[-1] == 1 for a in s.product[:2] if a is not None)]
    summed = [s for s in held if s not in dotted]
    names = {id(s): f"sum{k}" for k, s in enumerate(summed)}
    inner = [f"{names[id(s)]} += {s.term};" if id(s) in names else s.render() if isinstance(s, _Accumulate)
             else s for s in body if s not in dotted]
    *outer, last = _loop_headers(shape)
    if all(s.startswith(_GO) for s in inner):  # everything moved after it: no innermost loop
        block = "{\n    " + "\n    ".join(_after_innermost(summed, dotted, names, shape)) + "\n    }"
        return ["\n    ".join(outer + [block])]
    if independent or _independent_writes([s for s in body if s not in held], shape[-1]):
        last = "INDEPENDENT " + last
    innermost = f"{last} {{\n        " + "\n        ".join(inner) + "\n    }"
    if not held:
        return ["\n    ".join(outer + [innermost])]
    before = ["real " + ", ".join(f"{names[id(s)]} = 0" for s in summed) + ";"] if summed else []
    block = "{\n    " + "\n    ".join([*before, innermost, *_after_innermost(summed, dotted, names, shape)]) + "\n    }"
    return ["\n    ".join(outer + [block])]


def _after_innermost(summed, dotted, names, shape):
    """The held accumulations, after the innermost loop: register sums, dot products."""
    n = shape[-1]
    after = [s.render(names[id(s)]) for s in summed]
    after += [s.render(f"sum_range(g + {_index(_at_start(s.product[0]), grad=True)}, {n})")
              for s in dotted if s.product[1] is None]
    for run in _dot_runs([s for s in dotted if s.product[1] is not None]):
        s = run[0]
        a, b = f"g + {_index(_at_start(s.product[0]), grad=True)}", f"d + {_index(_at_start(s.product[1]), s.product[2])}"
        if len(run) < 4 and n < DOT_ROWS_SCREEN:
            after += [t.render(f"dot(g + {_index(_at_start(t.product[0]), grad=True)}, "
                               f"d + {_index(_at_start(t.product[1]), t.product[2])}, {n})") for t in run]
        else:
            b_step, out_step = ((run[1].product[2] - s.product[2], run[1].offset - s.offset) if len(run) > 1
                                else (0, 0))
            after.append(f"dot_rows({a}, {b}, {b_step}, {n}, {len(run)}, "
                         f"g + {_index(s.target, s.offset, grad=True)}, {out_step});")
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


_GO = "const real go = "  # backward's first statement: the group's gradient


def _independent_writes(body, n):
    """Whether the innermost loop of a backward body is free of dependences between its n
    iterations: only gradient accumulations (besides reading the group's own gradient), all
    moving with one stride along it, none reaching a slot that another iteration reaches."""
    writes = [s for s in body if isinstance(s, _Accumulate)]
    if not writes or any(not isinstance(s, _Accumulate) and not s.startswith(_GO) for s in body):
        return False
    strides = {s.target.strides[-1] for s in writes}
    if len(strides) != 1 or 0 in strides:
        return False
    step = abs(strides.pop())
    bases = sorted({s.target.grad_offset() + s.offset for s in writes})
    return all(b - a >= step * n or (b - a) % step for a, b in zip(bases, bases[1:]))


def _nonzero_words(n):
    """int32 words of the nonzero lists of n input values: two counts and a word per chunk of
    eight values (templates/kernels/sparse.c)"""
    return 2 + n // 8


class _Emitter:
    def __init__(self, program, dtype=dtypes.DEFAULT, sparse_inputs=False, offsets=None, row_lists=False):
        self.program = program
        self.row_lists = {} if row_lists else None  # the batched program's (first input, count): offset in words
        self.dtype = dtype  # a dtypes.Dtype
        self.offsets = offsets or _OffsetTables()  # shared by the batched program's emitter
        self.sparse_inputs = sparse_inputs
        self.nonzero_lists = {}  # (first slot, length) of an input range: its list's offset in words
        self.tracked_rows = []  # backward(tracked=True)'s parameter rows: (start, length, loop shape, other's start)

    def _nonzeros(self, v):
        """For a factor list that is one input range, the same in every iteration (a first
        layer's pixels), the C pointer to its nonzero list (templates/kernels/sparse.c's dot_nz), which
        lives in the words after the N_SLOTS values of d; else None."""
        p, n = self.program, len(v.offsets)
        if not (self.sparse_inputs and v.contiguous and not any(v.start.strides)
                and p.input_base <= v.start.base and v.start.base + n <= p.input_base + p.n_inputs):
            return None
        key = (v.start.base, n)
        if key not in self.nonzero_lists:
            self.nonzero_lists[key] = sum(_nonzero_words(m) for _, m in self.nonzero_lists)
        return f"(const int32_t *)(d + {p.n_slots}) + {self.nonzero_lists[key]}"

    def _row_list(self, v):
        """For the batched program of a model with sparse inputs: when the rows a layer's product
        reads (Vector v) are a range of inputs, the same for the whole loop nest, the C pointer to
        the list of those that hold a nonzero in this batch (scan_batch_rows); else NULL."""
        p = self.program
        if self.row_lists is None or len(v.offsets) < 2 or any(v.start.strides[:-1]) or v.start.strides[-1] != 1:
            return "NULL"
        first, step = v.start.base + v.offsets[0] - p.input_base, _progression(v.offsets)
        if step != p.capacity or first < 0 or first % step or first // step + len(v.offsets) > p.n_inputs:
            return "NULL"
        key = (first // step, len(v.offsets))
        if key not in self.row_lists:
            self.row_lists[key] = sum(1 + n for _, n in self.row_lists)
        return f"(const int32_t *)(d + {p.n_slots}) + {self.row_lists[key]}"

    def scan_batch_rows(self):
        """scan_batch_rows(d, nb): the list of every input range a product reads, of its rows
        that hold a nonzero among the batch's nb samples; BATCH_LIST_WORDS, the int32 words the
        lists take after the batch's N_BATCH_SLOTS values."""
        p, lines = self.program, []
        for (first, n), offset in (self.row_lists or {}).items():
            lines.append(f"    scan_rows(d + {p.input_base + first * p.capacity}, {p.capacity}, nb, {n}, "
                         f"(int32_t *)(d + {p.n_slots}) + {offset});")
        words = sum(1 + n for _, n in (self.row_lists or {}))
        return (f"#define BATCH_LIST_WORDS {words}\nstatic void scan_batch_rows(real *restrict d, long nb)\n{{\n"
                + "\n".join(lines) + "\n    (void)d; (void)nb;\n}")

    def scan_nonzeros(self):
        """scan_nonzeros(d): every nonzero list from its input range's current values, and
        NONZERO_WORDS, the words they take after d's N_SLOTS values."""
        lines = [f"    scan_range(d + {base}, {n}, (int32_t *)(d + N_SLOTS) + {offset});"
                 for (base, n), offset in self.nonzero_lists.items()]
        words = sum(_nonzero_words(n) for _, n in self.nonzero_lists)
        return (f"#define NONZERO_WORDS {words}\nstatic void scan_nonzeros(real *restrict d)\n{{\n"
                + "\n".join(lines) + "\n    (void)d;\n}")

    def _op_c(self, node, formula, names):
        """An op-table formula with its placeholders replaced by C expressions."""
        return node.op.render(dtypes.formula(self.dtype, formula), **names)

    def _sum(self, v):
        """C for the sum of a Vector's values (a list of parts, summed left to right)."""
        n = len(v.offsets)
        if _unrolled(v):
            return [_d(v.start, o) for o in v.offsets]
        if v.contiguous:
            return [f"sum_range(d + {_index(v.start)}, {n})"]
        return [f"sum_offsets(d + {_index(v.start)}, {self.offsets(v.offsets)}, {n})"]

    def _dot(self, a, b):
        n = len(a.offsets)
        if _unrolled(a, b):
            return [f"{_d(a.start, i)} * {_d(b.start, j)}" for i, j in zip(a.offsets, b.offsets)]
        if a.contiguous and b.contiguous:
            for other, inputs in ((a, b), (b, a)):
                nonzeros = self._nonzeros(inputs)
                if nonzeros:
                    return [f"dot_nz(d + {_index(other.start)}, d + {_index(inputs.start)}, {n}, {nonzeros})"]
            return [f"dot(d + {_index(a.start)}, d + {_index(b.start)}, {n})"]
        return [f"dot_offsets(d + {_index(a.start)}, {self.offsets(a.offsets)}, "
                f"d + {_index(b.start)}, {self.offsets(b.offsets)}, {n})"]

    def forward(self, g):
        ops = g.operands
        node = g.first
        layer = _layer_over_batch(g, self._row_list) or self._layer_on_one_sample(g)
        if layer:
            return [layer]
        if node.kind == "op":
            names = {n: _operand(a, self.dtype) for n, a in zip("ab", ops.args)}
            if node.k is not None:
                names["k"] = c_literal(node.k, self.dtype)
            value = self._op_c(node, node.op.value, names)
        else:
            parts = [c_literal(c, self.dtype) for c in ops.constants]
            if ops.terms:
                parts += self._sum(ops.terms)
            if ops.a:
                parts += self._dot(ops.a, ops.b)
            value = _tree_sum(parts)
        return _loop(g.shape, [f"{_d(ops.out)} = {value};"], independent=True)

    def _layer_on_one_sample(self, g):
        """A dot group over sparse inputs whose innermost loop moves the results and one factor
        list (the weights' rows) and not the other (an input range with a nonzero list): one
        matvec call per pass of the loops outside it, four rows at a time sharing the walk
        through the list (templates/kernels/sparse.c); at most one loose term (the bias), no constants.
        Else None: over dense inputs a row at a time streams faster (microbenchmark of MNIST's
        first layer, gcc -O3 native: dot() per row 0.85x matvec's time)."""
        ops, shape = g.operands, g.shape
        if (g.first.kind != "dot" or not shape or shape[-1] < 4 or not ops.a or ops.constants
                or (ops.terms and len(ops.terms.offsets) != 1) or not (ops.a.contiguous and ops.b.contiguous)
                or _unrolled(ops.a, ops.b)):
            return None
        for weights, inputs in ((ops.a, ops.b), (ops.b, ops.a)):
            nonzeros = self._nonzeros(inputs)
            if nonzeros and weights.start.strides[-1]:
                break
        else:
            return None
        bias = _bias_argument(ops.terms, 1, lambda affine: affine.strides[-1])
        call = (f"matvec({_loop_start(ops.out, 1)}, {ops.out.strides[-1]}, {bias}, "
                f"{_loop_start(weights.start, 1)}, {weights.start.strides[-1]}, "
                f"{_loop_start(inputs.start, 1)}, {len(inputs.offsets)}, {shape[-1]}, {nonzeros});")
        return "\n    ".join(_loop_headers(shape[:-1]) + [call])

    def backward(self, g, sgd=False, tracked=False):
        """Statements adding the group's gradients into its operands' gradients. With sgd (see
        ir.sgd_in_backward) a contribution to a parameter marked sgd_fused instead applies
        `param -= lr * contribution`, placed after the statements that still read the parameter's
        old value. With tracked (the step-by-step API's backward), a dot's contribution to a row
        of such parameters by a kernel goes through the row's stamp (see _track)."""
        ops, node = g.operands, g.first
        grads, updates, snapshots = [], [], []
        out_grad = _g(ops.out)

        def contribute(to_fused_param, accumulate, update, track=None):
            if tracked and to_fused_param and track:
                statement, snapshot = track(g.shape)
                if statement:
                    grads.append(statement)
                    snapshots.extend([snapshot] if snapshot else [])
                    return
            fused = sgd and to_fused_param
            (updates if fused else grads).append(update if fused else accumulate)

        if node.kind == "op":
            names = {n: _operand(a, self.dtype) for n, a in zip("ab", ops.args)}
            names["out"] = _d(ops.out)
            if node.k is not None:
                names["k"] = c_literal(node.k, self.dtype)
            for arg, where, formula in zip(node.args, ops.args, node.op.grads):
                if arg.needs_grad and not arg.shares_grad:
                    local = self._op_c(node, formula, names)
                    term = out_grad if local == "1" else f"({local}) * {out_grad}"
                    contribute(arg.sgd_fused, _Accumulate(where, 0, term), f"{_d(where)} -= lr * ({term});")
            return _loop(g.shape, grads + updates)
        go = "go"
        if ops.terms:
            self._add_terms(ops.terms, [node.args[i] for i in ops.term_positions], go, contribute, ops.out)
        if ops.a:
            for wrt, other, factors in ((ops.b, ops.a, node.b), (ops.a, ops.b, node.a)):
                self._add_products(wrt, other, factors, go, contribute, ops.out, g.shape)
        if not grads and not updates:
            return []
        # Every contribution is go times something: none when go is 0 (a ReLU that is off), which
        # saves the kernels' passes; written-out statements stay branch-free, to be vectorised.
        if any(isinstance(s, str) and s.split("(")[0].isidentifier() for s in grads + updates):  # a kernel
            body = [f"{_GO}{out_grad};", "if (go != 0) {", *grads, *updates, "}"]
        else:
            body = [f"{_GO}{out_grad};", *grads, *updates]
        return snapshots + (_loop(g.shape, body, dots=not updates) if g.shape
                            else ["{ " + " ".join(_loop((), body)) + " }"])

    def _track(self, wrt, other, n, shape, accumulate):
        """The step-by-step API's form of `accumulate` (an axpy kernel adding go * other into the
        parameter row wrt, in a loop nest over `shape`), and the statement before the loop that
        snapshots `other`; (None, None) where it does not apply. Each iteration writes its own
        row (the parameters get one contribution each) and has a stamp, numbered in loop order
        (step_rows tells what the stamps say). The first contribution in a generation does not
        write the row: it records go, the row standing for `0 + go * snapshot` (rank one) until
        update() or someone looking at the gradients needs it."""
        if (other is not None and any(other.strides)) or wrt.grad_offset() != wrt.base:  # one `other` for every row
            return None, None
        first = sum(math.prod(r[2]) for r in self.tracked_rows)
        snapshot = sum(r[1] for r in self.tracked_rows if r[3] is not None)
        self.tracked_rows.append((wrt, n, shape, other))
        stamp = self._stamp_index(first, shape)
        listed = f"live[++live[0]] = (uint32_t)({stamp});"  # update() visits the rows of the list
        if other is None:  # a single parameter (a bias): its gradient is written at once
            return (f"if (stamp[{stamp}] == gen) {accumulate} else if (go != 0) {{ stamp[{stamp}] = gen; "
                    f"{_g(wrt)} = (real)0 + go; {listed} }}", None)
        return (f"if (stamp[{stamp}] == gen) {accumulate} else if (go != 0) {{ stamp[{stamp}] = gen + 1; "
                f"rank1[{stamp}] = go; {listed} }}",
                f"memcpy(snap + {snapshot}, d + {_index(other)}, {n} * sizeof(real));")

    @staticmethod
    def _stamp_index(first, shape):
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        return " + ".join([str(first)] + [f"i{d}" if s == 1 else f"{s} * i{d}" for d, s in enumerate(strides)])

    def step_rows(self, n_params):
        """What the step-by-step API needs to leave the rows of backward(tracked=True) alone until
        they are used. A row's stamp against the generation `gen` (which zero_grad() advances by
        2) says what it holds: == gen, its gradient; == gen + 1, 0 + rank1[row] * its snapshot
        (one contribution so far, not written out); otherwise stale values standing for zeros.
        The rows stamped in this generation are listed in live[1..live[0]]. N_TRACKED_ROWS,
        N_SNAPSHOT (reals); SWEPT_RUNS, N_SWEPT_RUNS: the other parameters, (first slot, count),
        zeroed and stepped every time; sgd_live_rows(d, g, stamp, rank1, snap, live, gen, lr):
        `param -= lr * grad` over the listed rows; write_rows(g, stamp, rank1, snap, gen, all):
        writes out the rank-one rows and, with all, zeroes the stale ones, stamping them current."""
        tracked = [False] * n_params
        write, starts, lengths, snapshots = [], [], [], []
        first = snapshot = 0
        for start, n, shape, other in self.tracked_rows:
            loops = "".join(header + " " for header in _loop_headers(shape))
            stamp = self._stamp_index(first, shape)
            row = _index(start)
            for index in itertools.product(*map(range, shape)):  # in loop order, as the stamps
                at = start.base + sum(s * i for s, i in zip(start.strides, index))
                tracked[at:at + n] = [True] * n
                starts.append(at)
            first += math.prod(shape)
            lengths += [n] * math.prod(shape)
            snapshots += [snapshot] * math.prod(shape)
            if other is None:
                write.append(f"    {loops}if (all && stamp[{stamp}] != gen) {{ g[{row}] = 0; stamp[{stamp}] = gen; }}")
                continue
            write.append(f"    {loops}{{\n        real *restrict q = g + {row};\n"
                         f"        if (stamp[{stamp}] == gen + 1) {{ const real a = rank1[{stamp}];"
                         f" for (long k = 0; k < {n}; k++) q[k] = (real)0 + a * snap[{snapshot} + k]; }}\n"
                         f"        else if (all && stamp[{stamp}] != gen) memset(q, 0, {n} * sizeof(real));\n"
                         f"        else continue;\n        stamp[{stamp}] = gen;\n    }}")
            snapshot += n
        runs = ir.slot_runs(slot for slot, done in enumerate(tracked) if not done) or [(0, 0)]
        # without tracked rows the step's backward is the ordinary one
        untracked = [] if self.tracked_rows else [
            "#define backward_tracked_body(d, g, stamp, rank1, snap, live, gen) "
            "((void)(stamp), (void)(rank1), (void)(snap), (void)(live), (void)(gen), backward_body(d, g))"]
        arrays = "const uint64_t *restrict stamp, const real *restrict rank1, const real *restrict snap, uint64_t gen"
        table = lambda name, values: f"static const long {name}[] = {{{', '.join(map(str, values or [0]))}}};"
        return "\n".join([*untracked,
            f"#define N_TRACKED_ROWS {first}",
            f"#define N_SNAPSHOT {snapshot}",
            f"#define N_SWEPT_RUNS {len(runs)}",
            "static const long SWEPT_RUNS[][2] = {" + ", ".join(f"{{{a}, {b}}}" for a, b in runs) + "};",
            table("ROW_START", starts), table("ROW_LENGTH", lengths), table("ROW_SNAPSHOT", snapshots),
            "static void sgd_live_rows(real *restrict d, const real *restrict g, const uint64_t *restrict stamp,\n"
            "                          const real *restrict rank1, const real *restrict snap, const uint32_t *restrict live,\n"
            "                          uint64_t gen, real lr)\n{\n"
            "    for (uint32_t j = 1; j <= live[0]; j++) {\n"
            "        const uint32_t r = live[j];\n"
            "        if (stamp[r] == gen + 1)\n"
            "            sgd_rank1_row(d + ROW_START[r], lr, rank1[r], snap + ROW_SNAPSHOT[r], ROW_LENGTH[r]);\n"
            "        else\n"
            "            sgd_row(d + ROW_START[r], lr, g + ROW_START[r], ROW_LENGTH[r]);\n"
            "    }\n}",
            f"static void write_rows(real *restrict g, {arrays.replace('const uint64_t', 'uint64_t')}, int all)\n{{\n"
            + "\n".join(write) + "\n    (void)g; (void)stamp; (void)rank1; (void)snap; (void)gen; (void)all;\n}",
        ])

    def _add_terms(self, v, nodes, go, contribute, out):
        """Loose terms of a sum: each gets the sum's gradient."""
        needs = [x.needs_grad and not x.shares_grad for x in nodes]
        if not any(needs):
            return
        n = len(nodes)
        if _unrolled(v) or not all(needs):
            for x, o, need in zip(nodes, v.offsets, needs):
                if need:
                    contribute(x.sgd_fused, _Accumulate(v.start, o, go, (out, None, 0)), f"{_d(v.start, o)} -= lr * {go};",
                               lambda shape, o=o: self._track(dataclasses.replace(v.start, base=v.start.base + o), None, 1,
                                                              shape, f"{_g(v.start, o)} += {go};"))
            return
        to_param = nodes[0].sgd_fused
        if v.contiguous:
            contribute(to_param, f"add_range(g + {_index(v.start, grad=True)}, {go}, {n});",
                       f"add_range(d + {_index(v.start)}, -(lr * {go}), {n});")
        else:
            table = self.offsets(v.offsets)
            contribute(to_param, f"add_offsets(g + {_index(v.start, grad=True)}, {table}, {go}, {n});",
                       f"add_offsets(d + {_index(v.start)}, {table}, -(lr * {go}), {n});")

    def _add_products(self, wrt, other, factors, go, contribute, out, shape=()):
        """Factor list `wrt` of a dot gets go times the other list's values."""
        needs = [f.needs_grad for f in factors]
        if not any(needs):
            return
        n = len(factors)
        if all(needs) and not any(f.sgd_fused for f in factors) and _Matmul.fits(shape, wrt, other, out):
            contribute(False, _Matmul(wrt, other, out), None)
            return
        # (a loop whose weights stay put over its innermost loop gives them several contributions:
        # batch-1 SGD never updates them in backward, and the batched program never does)
        if all(needs) and not _unrolled(wrt, other) and _WeightGradient.fits(shape, wrt, other, out):
            contribute(False, _WeightGradient(wrt, other, out, self._row_list(other)), None)
            return
        if _unrolled(wrt, other) or not all(needs):
            for f, i, j, need in zip(factors, wrt.offsets, other.offsets, needs):
                if need:
                    term = f"{go} * {_d(other.start, j)}"
                    contribute(f.sgd_fused, _Accumulate(wrt.start, i, term, (out, other.start, j)),
                               f"{_d(wrt.start, i)} -= lr * ({term});")
            return
        to_param = factors[0].sgd_fused
        nonzeros = self._nonzeros(other) if wrt.contiguous and other.contiguous else None
        if nonzeros:
            contribute(to_param, f"axpy_nz(g + {_index(wrt.start, grad=True)}, {go}, d + {_index(other.start)}, {n}, {nonzeros});",
                       f"sgd_axpy_nz(d + {_index(wrt.start)}, lr, {go}, d + {_index(other.start)}, {n}, {nonzeros});",
                       lambda shape: self._track(wrt.start, other.start, n, shape, f"axpy_nz(g + {_index(wrt.start, grad=True)}, "
                                                 f"{go}, d + {_index(other.start)}, {n}, {nonzeros});"))
        elif wrt.contiguous and other.contiguous:
            contribute(to_param, f"axpy(g + {_index(wrt.start, grad=True)}, {go}, d + {_index(other.start)}, {n});",
                       f"sgd_axpy(d + {_index(wrt.start)}, lr, {go}, d + {_index(other.start)}, {n});",
                       lambda shape: self._track(wrt.start, other.start, n, shape, f"axpy(g + {_index(wrt.start, grad=True)}, "
                                                 f"{go}, d + {_index(other.start)}, {n});"))
        else:
            tw, to = self.offsets(wrt.offsets), self.offsets(other.offsets)
            contribute(to_param,
                       f"axpy_offsets(g + {_index(wrt.start, grad=True)}, {tw}, {go}, d + {_index(other.start)}, {to}, {n});",
                       f"sgd_axpy_offsets(d + {_index(wrt.start)}, {tw}, lr, {go}, d + {_index(other.start)}, {to}, {n});")


def _functions(name, params, statements, chunk):
    """C functions of at most `chunk` statements each, as (definition, declaration, statement
    count) triples, and the driver `name` that calls them in order."""
    args = ", ".join(p.split()[-1].lstrip("*") for p in params)
    signature = ", ".join(params)
    pieces, calls = [], []
    for i in range(0, len(statements), chunk):
        head = f"CHUNK void {name}_{i // chunk}({signature})"
        body = "\n    ".join(statements[i:i + chunk])
        pieces.append((f"{head}\n{{\n    {body}\n}}\n", f"{head};", len(statements[i:i + chunk])))
        calls.append(f"    {name}_{i // chunk}({args});")
    driver = f"static void {name}({signature})\n{{\n" + "\n".join(calls) + "\n}\n"
    return pieces, driver


def _units(pieces, unit):
    """The chunk functions packed in order into groups of about `unit` statements."""
    units, size = [[]], 0
    for piece in pieces:
        if size >= unit:
            units.append([])
            size = 0
        units[-1].append(piece)
        size += piece[2]
    return units


def emit(program, module_name, chunk=CHUNK_STATEMENTS, unit=UNIT_STATEMENTS, optimizer=None,
         initial_params=None, dtype=dtypes.DEFAULT.name, sparse_inputs=False, batched=None):
    """The C sources of the extension module `module_name` computing `program`: the module
    itself, then (for big programs) extra units of generated functions compiled alongside.
    optimizer: a codegen.optim description (None: SGD); initial_params: values every load of
    the module starts its parameters from (None: zeros); dtype: a name of codegen/dtypes.py, the
    element type of the whole state, the kernels and the module's views; sparse_inputs: dots
    that read an input range skip its chunks of zeros when most of them are (dense inputs keep
    the dense kernels); batched: the program's codegen.batch.BatchedProgram (train() and
    predict() run whole batches through it), or None."""
    if not isinstance(module_name, str):
        raise TypeError(f"module name must be a str, got {type(module_name).__name__}")
    if not module_name.isidentifier() or not module_name.isascii():
        raise ValueError(f"module name must be a C identifier, got {module_name!r}")
    graph, extra = _render(program, chunk, unit, dtype, sparse_inputs, batched)
    constants = "\n".join([
        f'#define MODULE_NAME_STR "{module_name}"',
        f"#define MODULE_INIT PyInit_{module_name}",
        optim.check(optimizer).c_defines(),
    ])
    if initial_params is not None:
        if len(initial_params) != program.n_params:
            raise ValueError(f"{len(initial_params)} initial parameter values for {program.n_params} parameters")
        constants += ("\n#define HAVE_INITIAL_PARAMS 1\nstatic const double INITIAL_PARAMS[] = {"
                      + ", ".join(map(c_literal, initial_params)) + "};")
    module = templates.fill("module.c", CONSTANTS=constants, GRAPH=graph)
    return [module] + extra


def standalone(program, chunk=CHUNK_STATEMENTS, thread_pool=False):
    """The graph as one C source with no Python in it: the prelude and kernels, the layout
    #defines (N_SLOTS, N_PARAMS, N_INPUTS, INPUT_BASE, LOSS_SLOT, N_OUTPUTS, OUTPUT_SLOTS,
    SGD_IN_BACKWARD) and the functions forward_outputs(d), forward_rest(d), backward_body(d, g)
    and backward_sgd_body(d, g, lr) (static). For exporting a model out of Python; with
    thread_pool, for a module that includes templates/pool.c (codegen.jit)."""
    graph, _ = _render(program, chunk, unit=None, thread_pool=thread_pool)
    return graph


def _render(program, chunk, unit, dtype=dtypes.DEFAULT.name, sparse_inputs=None, batched=None, thread_pool=None):
    """(the graph's C: prelude, layout #defines, tables, functions, drivers; the extra units).
    sparse_inputs (modules: True or False; None for standalone code, which has no lists): dots
    over an input range use its nonzero list (scan_nonzeros and the words after d's slots)."""
    dtype = dtypes.lookup(dtype)
    e = _Emitter(program, dtype, bool(sparse_inputs))
    # the batched program's emitter: the same offset tables; the inputs' row lists with sparse inputs
    eb = _Emitter(batched, dtype, offsets=e.offsets, row_lists=bool(sparse_inputs)) if batched else None
    forward_outputs = [s for g in program.forward[:program.n_output_groups] for s in e.forward(g)]
    forward_rest = [s for g in program.forward[program.n_output_groups:] for s in e.forward(g)]
    backward = [s for g in program.backward for s in e.backward(g)]
    backward_sgd = [s for g in program.backward for s in e.backward(g, sgd=True)] if program.sgd_in_backward else []
    # The step-by-step API's backward (modules only; the same as backward_body when no row is tracked)
    backward_tracked = [s for g in program.backward for s in e.backward(g, tracked=True)] \
        if sparse_inputs is not None and program.sgd_in_backward else []
    d, dg = ["real *restrict d"], ["real *restrict d", "real *restrict g"]
    tracking = ["uint64_t *restrict stamp", "real *restrict rank1", "real *restrict snap", "uint32_t *restrict live",
                "uint64_t gen"]
    pieces, drivers = [], []
    for name, params, statements in [("forward_outputs", d, forward_outputs),
                                     ("forward_rest", d, forward_rest),
                                     ("backward_body", dg, backward),
                                     ("backward_sgd_body", dg + ["real lr"], backward_sgd),
                                     *([("backward_tracked_body", dg + tracking, backward_tracked)]
                                       if e.tracked_rows else []),
                                     *_batched_functions(eb)]:
        functions, driver = _functions(name, params, statements, chunk)
        pieces += functions
        drivers.append(driver)
    units = _units(pieces, unit) if unit else [pieces]
    # modules (sparse_inputs not None) run products on their threads (templates/pool.c)
    thread_pool = sparse_inputs is not None if thread_pool is None else thread_pool
    prelude = (dtype.define + f"\n#define HAVE_THREAD_POOL {int(thread_pool)}\n"
               + templates.read("prelude.c"))
    output_slots = [n.slot for n in program.outputs] or [0]
    layout = "\n".join([
        f"#define N_SLOTS {program.n_slots}",
        f"#define N_PARAMS {program.n_params}",
        f"#define N_INPUTS {program.n_inputs}",
        f"#define INPUT_BASE {program.input_base}",
        f"#define LOSS_SLOT {program.loss.slot}",
        f"#define N_OUTPUTS {len(program.outputs)}",
        f"#define SGD_IN_BACKWARD {int(program.sgd_in_backward)}",
        f"#define N_CONSTANTS {len(program.constants)}",
        f"static const long OUTPUT_SLOTS[] = {{{', '.join(map(str, output_slots))}}};",
        _constants(program.constants, dtype),
        _sgd_after_backward(program.sgd_after_backward),
        *([e.scan_nonzeros(), e.step_rows(program.n_params)] if sparse_inputs is not None else []),
        *([_batch_layout(eb, dtype)] if sparse_inputs is not None else []),
    ])
    if not unit or (len(units) == 1 and sum(p[2] for p in pieces) < PARALLEL_MIN_STATEMENTS):
        graph = [prelude, layout, e.offsets.render(), *(p[0] for p in pieces), *drivers]
        return "\n".join(graph), []
    graph = [prelude, layout, e.offsets.render(), *(p[1] for p in pieces), *drivers]
    extra = [prelude + "\n" + e.offsets.render(declare=True) + "\n" + "\n".join(p[0] for p in group)
             for group in units]
    return "\n".join(graph), extra


def _constants(constants, dtype, name="init_constants", table="CONSTANT_VALUES"):
    """init_constants(d): writes the constants that loops read into their slots (consecutive)."""
    if not constants:
        return f"static void {name}(real *d) {{ (void)d; }}"
    values = ", ".join(c_literal(v, dtype) for _, v in constants)
    return (f"static const real {table}[{len(constants)}] = {{{values}}};\n"
            f"static void {name}(real *d) {{ memcpy(d + {constants[0][0]}, {table}, "
            f"sizeof {table}); }}")


def _batched_functions(eb):
    """(name, parameters, statements) of the batched program's functions (codegen/batch.py):
    forward_outputs_batch(d, nb), forward_rest_batch(d, nb), backward_batch(d, g, nb); eb: its
    emitter, or None."""
    if eb is None:
        return []
    batched = eb.program
    outputs, rest = batched.forward[:batched.n_output_groups], batched.forward[batched.n_output_groups:]
    d, dg = ["real *restrict d", "long nb"], ["real *restrict d", "real *restrict g", "long nb"]
    return [("forward_outputs_batch", d, [s for g in outputs for s in eb.forward(g)]),
            ("forward_rest_batch", d, [s for g in rest for s in eb.forward(g)]),
            ("backward_batch", dg, [s for g in batched.backward for s in eb.backward(g)])]


def _batch_layout(eb, dtype):
    """The batched program's layout and row lists (templates/batch.c; eb: its emitter, which
    emitted its functions), HAVE_BATCH 0 without one."""
    if eb is None:
        return "#define HAVE_BATCH 0"
    batched = eb.program
    output_slots = batched.output_slots or [0]
    return "\n".join([
        "#define HAVE_BATCH 1",
        f"#define BATCH_CAPACITY {batched.capacity}",
        f"#define N_BATCH_SLOTS {batched.n_slots}",
        f"#define BATCH_INPUT_BASE {batched.input_base}",
        f"#define BATCH_LOSS_SLOT {batched.loss_slot}",
        f"#define BATCH_CONSTANTS_BASE {batched.constants_base}",
        f"static const long BATCH_OUTPUT_SLOTS[] = {{{', '.join(map(str, output_slots))}}};",
        _constants(batched.constants, dtype, "init_batch_constants", "BATCH_CONSTANT_VALUES"),
        eb.scan_batch_rows(),
    ])


def _sgd_after_backward(runs):
    """sgd_after_backward(d, g, lr): the SGD step of the parameters not updated in backward."""
    body = "".join(f"\n    for (long i = {start}; i < {start + n}; i++) {{ d[i] -= lr * g[i]; g[i] = 0; }}"
                   for start, n in runs)
    return f"static void sgd_after_backward(real *restrict d, real *restrict g, real lr)\n{{{body}\n    (void)d; (void)g; (void)lr;\n}}"

