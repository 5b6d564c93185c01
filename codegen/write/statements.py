"""The statements of one group of a lowered program (ir.Program or batch.BatchedProgram): its
forward (a value per member, from the op table's formulas or a fused dot product) and its
backward (each operand's gradient contributions, or batch-1 SGD's update in place, or the
step-by-step API's tracked rows), the sparse inputs' nonzero lists and a batch's row lists.
"""

import dataclasses
import itertools
import math

import numpy as np

from . import dtypes
from ..lower import ir
from ..lower.batch import BatchExtent
from .dtypes import c_literal
from .kernels import Call, call
from .loops import (UNROLL_MAX_CONTIGUOUS, Accumulate, Matmul, OffsetTables, WeightGradient, bias_arguments, data_at, guarded,
                    fused_activation, fused_gradient, grad_at, layer_over_batch, loop_headers, loop_nest, loop_start,
                    operand, progression, short, slot_index, takes_epilogue, tree_sum, unrolled)
from .tree import Assign, Block, Copy, If, ReadGradient, nest


def nonzero_words(n):
    """int32 words of the nonzero lists of n input values: two counts and a word per chunk of
    eight values (templates/kernels/sparse.c)"""
    return 2 + n // 8


class Emitter:
    def __init__(self, program, dtype=dtypes.DEFAULT, sparse_inputs=False, shared=None, row_lists=False):
        """shared: the one-sample program's Emitter, whose offset tables and epilogues the
        batched program's shares (they are defined once for both); that one's backward steps
        weights (see stepped)."""
        self.program = program
        self.row_lists = {} if row_lists else None  # the batched program's (first input, count): offset in words
        self.dtype = dtype  # a dtypes.Dtype
        self.offsets = shared.offsets if shared else OffsetTables()
        self.sparse_inputs = sparse_inputs
        self.nonzero_lists = {}  # (first slot, length) of an input range: its list's offset in words
        self.tracked_rows = []  # backward(tracked=True)'s parameter rows: (start, length, loop shape, other's start)
        self._folded = None  # the group whose gradient backward()'s product finished (backward_pass)
        # the batched program's: runs (first slot, count) of the weights whose SGD step its backward
        # takes (matmul_nt with `rate`: parameters with one gradient contribution, ir.sgd_in_backward)
        self.stepped = [] if shared else None
        self.epilogues = shared.epilogues if shared else {}  # a layer kernel's epilogue: the C of its value -> its function's name

    def _nonzeros(self, v):
        """For a factor list that is one input range, the same in every iteration (a first
        layer's pixels), the C pointer to its nonzero list (templates/kernels/sparse.c's dot_nz), which
        lives in the words after the N_SLOTS values of d; else None."""
        p, n = self.program, len(v.offsets)
        if not (self.sparse_inputs and v.length is None and v.contiguous and not any(v.start.strides)
                and p.input_base <= v.start.base and v.start.base + n <= p.input_base + p.n_inputs):
            return None
        key = (v.start.base, n)
        if key not in self.nonzero_lists:
            self.nonzero_lists[key] = sum(nonzero_words(m) for _, m in self.nonzero_lists)
        return f"(const int32_t *)(d + {p.n_slots}) + {self.nonzero_lists[key]}"

    def _row_list(self, v):
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
            self.row_lists[key] = sum(1 + n for _, n in self.row_lists)
        return f"(const int32_t *)(d + {p.n_slots}) + {self.row_lists[key]}"

    def scan_batch_rows(self):
        """scan_batch_rows(d, nb): the list of every input range a product reads, of its rows
        that hold a nonzero among the batch's nb samples; BATCH_LIST_WORDS, the int32 words the
        lists take after the batch's N_BATCH_SLOTS values."""
        p, lines = self.program, []
        for (first, n), offset in (self.row_lists or {}).items():
            lines.append("    " + call("scan_rows", x=f"d + {p.input_base + first * p.capacity}", stride=p.capacity,
                                         nb="nb", n=n, list=f"(int32_t *)(d + {p.n_slots}) + {offset}").render())
        words = sum(1 + n for _, n in (self.row_lists or {}))
        return (f"#define BATCH_LIST_WORDS {words}\nstatic void scan_batch_rows(real *restrict d, long nb)\n{{\n"
                + "\n".join(lines) + "\n    (void)d; (void)nb;\n}")

    def scan_nonzeros(self):
        """scan_nonzeros(d): every nonzero list from its input range's current values, and
        NONZERO_WORDS, the words they take after d's N_SLOTS values."""
        lines = ["    " + call("scan_range", x=f"d + {base}", n=n, nz=f"(int32_t *)(d + N_SLOTS) + {offset}").render()
                 for (base, n), offset in self.nonzero_lists.items()]
        words = sum(nonzero_words(n) for _, n in self.nonzero_lists)
        return (f"#define NONZERO_WORDS {words}\nstatic void scan_nonzeros(real *restrict d)\n{{\n"
                + "\n".join(lines) + "\n    (void)d;\n}")

    def _op_c(self, node, formula, names):
        """An op-table formula with its placeholders replaced by C expressions."""
        return node.op.render(dtypes.formula(self.dtype, formula), **names)

    def _times_local(self, node, i, names, gradient):
        """C for `gradient` times node's local derivative in its argument i (names: the formula's
        placeholders' C)."""
        if node.op.grad_is_one(i):
            return gradient
        return f"({self._op_c(node, node.op.grads[i], names)}) * {gradient}"

    def _op_names(self, node, ops):
        """An op group's C for its formula's placeholders: its arguments (for a gather, {a} is
        the operand its index picks), its constant attribute."""
        if node.op.selects:
            names = {"a": self._picked(node.op, ops)}
        else:
            names = {n: operand(a, self.dtype) for n, a in zip("ab", ops.args)}
        if node.k is not None:
            names["k"] = c_literal(node.k, self.dtype)
        return names

    def _picked(self, op, ops, grad=False):
        """d[...] (or g[...]) of the candidate an op that selects picks among its arguments from
        op.first_choice on (Affines with the same strides: vector.vectorize saw to it): the
        first's slot plus the position picked times their spacing, or an offset table's entry
        where they are not evenly spaced. The position: a gather's index (args[0], checked before
        any forward: templates/samples.c's check_index), or the largest candidate's (the first of
        equals), found again in backward from the values forward left. A family's growing list of
        candidates (ops.choices) is its longest's first ops.choices."""
        args = ops.args
        choices = args[op.first_choice:]
        first, n = choices[0], ops.choices or len(choices)
        at = [a.base - first.base for a in choices]
        offsets = [a.grad_offset() - first.grad_offset() for a in choices] if grad else at
        step = at[1] if n > 1 else 0
        table = None if at == [step * k for k in range(n)] else self.offsets(at)
        if op.selects == "index":
            i = call("gather_index", x=operand(args[0], self.dtype), n=n)
        elif table is None:
            i = call("largest_at", x=f"d + {slot_index(first)}", step=step, n=n)
        else:
            i = call("largest_in", x=f"d + {slot_index(first)}", offsets=table, n=n)
        if offsets != at:
            table = self.offsets(offsets)
        offset = f"{table}[{i}]" if table else f"{step} * {i}" if step != 1 else i
        return f"{'g' if grad else 'd'}[{slot_index(first, grad=grad)} + {offset}]"

    def _sum(self, v):
        """C for the sum of a Vector's values (a list of parts, summed left to right)."""
        n = v.n
        if unrolled(v):
            return [data_at(v.start, o) for o in v.offsets]
        if v.contiguous:
            return [str(call("sum_short" if short(v) else "sum_range", x=f"d + {slot_index(v.start)}", n=n))]
        return [str(call("sum_offsets", x=f"d + {slot_index(v.start)}", ox=self.offsets(v.offsets), n=n))]

    def _dot(self, a, b):
        n = a.n
        if unrolled(a, b):
            return [f"{data_at(a.start, i)} * {data_at(b.start, j)}" for i, j in zip(a.offsets, b.offsets)]
        if a.contiguous and b.contiguous:
            for other, inputs in ((a, b), (b, a)):
                nonzeros = self._nonzeros(inputs)
                if nonzeros:
                    return [str(call("dot_nz", a=f"d + {slot_index(other.start)}", x=f"d + {slot_index(inputs.start)}",
                                     n=n, nz=nonzeros))]
            return [str(call("dot_short" if short(a, b) else "dot", a=f"d + {slot_index(a.start)}",
                             b=f"d + {slot_index(b.start)}", n=n))]
        return [str(call("dot_offsets", a=f"d + {slot_index(a.start)}", oa=self.offsets(a.offsets),
                         b=f"d + {slot_index(b.start)}", ob=self.offsets(b.offsets), n=n))]

    @staticmethod
    def _masked_dot(a, b, slot):
        """The loss's products, the t-th left out (0) unless the sample has more than t positions
        (Group.masked, lower/positions.py): its factor is then a skipped position's stale value."""
        return [f"where(d[{slot}] > {t}, {data_at(a.start, i)} * {data_at(b.start, j)}, 0)"
                for t, (i, j) in enumerate(zip(a.offsets, b.offsets))]

    def forward_pass(self, groups):
        """The statements of a forward pass over `groups`; an activation of a layer's results
        (loops.fused_activation) becomes the epilogue of the layer's product instead of a pass of
        its own over them."""
        statements, folded = [], set()
        for i, g in enumerate(groups):
            if id(g) in folded:
                continue
            epilogue = None
            if takes_epilogue(g):
                for h in groups[i + 1:]:
                    y = fused_activation(g, h) if h.guard == g.guard else None
                    if y is not None:
                        folded.add(id(h))
                        epilogue = (self._epilogue(h.first), y)
                        break
            statements += guarded(g, self.forward(g, epilogue))
        return statements

    def _epilogue(self, node, gradient=False):
        """The name of a C function (see templates/kernels/gemm.c's Epilogue) applying node's op
        (one argument) to a row of values x: its value; or, with gradient, its gradient x times
        its derivative, added to its argument's gradient."""
        names = {"a": "a[n]", "out": "o[n]", **({"k": c_literal(node.k, self.dtype)} if node.k is not None else {})}
        if gradient:
            statement = f"y[n] += {self._times_local(node, 0, names, 'x[n]')};"
        else:
            statement = f"y[n] = {self._op_c(node, node.op.value, dict(names, a='x[n]'))};"
        return self.epilogues.setdefault(statement, f"epilogue_{len(self.epilogues)}")

    def epilogue_definitions(self):
        """The epilogues' C (static: each unit that calls one defines it)."""
        return "\n".join("EPILOGUE void {name}(const real *restrict x, real *restrict y, const real *restrict a,\n"
                         "                    const real *restrict o, long count)\n{{\n"
                         "    (void)a;\n    (void)o;\n"
                         "    INDEPENDENT for (long n = 0; n < count; n++)\n        {statement}\n}}".format(name=name, statement=statement)
                         for statement, name in self.epilogues.items())

    def backward_pass(self, groups, **options):
        """The statements of backward(g, **options) for each group of `groups` (in backward
        order); an activation's gradient, when the group just before it finishes the
        activation's gradient with a product (its inputs' gradients, matmul_acc), becomes that
        product's epilogue (loops.fused_gradient): nothing between them adds to it."""
        statements, skip = [], None
        for i, g in enumerate(groups):
            if g is skip:
                continue
            after = groups[i + 1] if i + 1 < len(groups) and groups[i + 1].guard == g.guard else None
            self._folded = None
            statements += guarded(g, self.backward(g, activation=after, **options))
            skip = self._folded
        return statements

    def forward(self, g, epilogue=None):
        ops = g.operands
        node = g.first
        layer = layer_over_batch(g, self._row_list, epilogue) or self._layer_on_one_sample(g)
        if layer:
            return [layer]
        if node.kind == "op":
            names = self._op_names(node, ops)
            value = self._op_c(node, node.op.value, names)
        else:
            parts = [c_literal(c, self.dtype) for c in ops.constants]
            if ops.terms:
                parts += self._sum(ops.terms)
            if ops.a:
                parts += self._dot(ops.a, ops.b) if g.masked is None else self._masked_dot(ops.a, ops.b, g.masked)
            value = tree_sum(parts)
        return loop_nest(g.shape, [Assign(data_at(ops.out), value)], independent=True)

    def _layer_on_one_sample(self, g):
        """A dot group over sparse inputs whose innermost loop moves the results and one factor
        list (the weights' rows) and not the other (an input range with a nonzero list): one
        matvec call per pass of the loops outside it, four rows at a time sharing the walk
        through the list (templates/kernels/sparse.c); at most one loose term (the bias), no constants.
        Else None: over dense inputs a row at a time streams faster (microbenchmark of MNIST's
        first layer, gcc -O3 native: dot() per row 0.85x matvec's time)."""
        ops, shape = g.operands, g.shape
        if (g.first.kind != "dot" or not shape or g.family or shape[-1] < 4 or not ops.a or ops.constants
                or (ops.terms and len(ops.terms.offsets) != 1) or not (ops.a.contiguous and ops.b.contiguous)
                or unrolled(ops.a, ops.b)):
            return None
        for weights, inputs in ((ops.a, ops.b), (ops.b, ops.a)):
            nonzeros = self._nonzeros(inputs)
            if nonzeros and weights.start.strides[-1]:
                break
        else:
            return None
        bias = bias_arguments(ops.terms, 1, lambda affine: affine.strides[-1])
        product = call("matvec", out=loop_start(ops.out, 1), out_j=ops.out.strides[-1], **bias,
                       w=loop_start(weights.start, 1), w_j=weights.start.strides[-1], x=loop_start(inputs.start, 1),
                       n=len(inputs.offsets), J=shape[-1], nz=nonzeros)
        return nest(shape[:-1], [product], braced=False)

    def backward(self, g, sgd=False, tracked=False, activation=None):
        """Statements adding the group's gradients into its operands' gradients. With sgd (see
        ir.sgd_in_backward) a contribution to a parameter marked sgd_fused instead applies
        `param -= lr * contribution`, placed after the statements that still read the parameter's
        old value. With tracked (the step-by-step API's backward), a dot's contribution to a row
        of such parameters by a kernel goes through the row's stamp (see _track). activation: the
        group after g in backward order, whose gradient g's product may finish as its epilogue
        (then self._folded is that group: see backward_pass)."""
        ops, node = g.operands, g.first
        grads, updates, snapshots = [], [], []
        out_grad = grad_at(ops.out)

        def contribute(to_fused_param, accumulate, update, track=None):
            if tracked and to_fused_param and track:
                statement, snapshot = track(g.shape)
                if statement:
                    grads.append(statement)
                    snapshots.extend([snapshot] if snapshot else [])
                    return
            fused = sgd and to_fused_param
            (updates if fused else grads).append(update if fused else accumulate)

        if node.kind == "op" and node.op.selects:  # the gradient goes to the operand picked only
            names = dict(self._op_names(node, ops), out=data_at(ops.out))
            if any(x.needs_grad for x in node.args[node.op.first_choice:]):
                grads.append(Assign(self._picked(node.op, ops, grad=True), self._times_local(node, 0, names, out_grad), "+="))
            return loop_nest(g.shape, grads)
        if node.kind == "op":
            names = dict(self._op_names(node, ops), out=data_at(ops.out))
            for i, (arg, where) in enumerate(zip(node.args, ops.args)):
                if arg.needs_grad and not arg.shares_grad:
                    term = self._times_local(node, i, names, out_grad)
                    contribute(arg.sgd_fused, Accumulate(where, 0, term), Assign(data_at(where), f"lr * ({term})", "-="))
            return loop_nest(g.shape, grads + updates)
        go = "go"
        if ops.terms:
            self._add_terms(ops.terms, [node.args[i] for i in ops.term_positions], go, contribute, ops.out)
        if ops.a:
            for wrt, other, factors in ((ops.b, ops.a, node.b), (ops.a, ops.b, node.a)):
                self._add_products(wrt, other, factors, go, contribute, ops.out, g.shape, activation)
        if not grads and not updates:
            return []
        # Every contribution is go times something: none when go is 0 (a ReLU that is off), which
        # saves the kernels' passes; written-out statements stay branch-free, to be vectorised.
        unless_zero = any(isinstance(s, Call) for s in grads + updates)  # a kernel
        body = loop_nest(g.shape, [ReadGradient(out_grad), *grads, *updates], dots=not updates, unless_zero=unless_zero)
        return snapshots + (body if g.shape else [Block(tuple(body), inline=True)])

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
        listed = Assign("live[++live[0]]", f"(uint32_t)({stamp})")  # update() visits the rows of the list
        if other is None:  # a single parameter (a bias): its gradient is written at once
            first_time = (Assign(f"stamp[{stamp}]", "gen"), Assign(grad_at(wrt), "(real)0 + go"), listed)
            return If(f"stamp[{stamp}] == gen", accumulate, If("go != 0", Block(first_time, inline=True))), None
        first_time = (Assign(f"stamp[{stamp}]", "gen + 1"), Assign(f"rank1[{stamp}]", "go"), listed)
        return (If(f"stamp[{stamp}] == gen", accumulate, If("go != 0", Block(first_time, inline=True))),
                Copy(f"snap + {snapshot}", f"d + {slot_index(other)}", n))

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
        tracked = np.zeros(n_params, dtype=bool)
        write, starts, lengths, snapshots = [], [], [], []
        first = snapshot = 0
        for start, n, shape, other in self.tracked_rows:
            loops = "".join(header + " " for header in loop_headers(shape))
            stamp = self._stamp_index(first, shape)
            row = slot_index(start)
            for index in itertools.product(*map(range, shape)):  # in loop order, as the stamps
                at = start.base + sum(s * i for s, i in zip(start.strides, index))
                tracked[at:at + n] = True
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
        runs = ir.slot_runs(np.flatnonzero(~tracked)) or [(0, 0)]
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
            "            " + call("sgd_rank1_row", w="d + ROW_START[r]", lr="lr", alpha="rank1[r]",
                                  x="snap + ROW_SNAPSHOT[r]", n="ROW_LENGTH[r]").render() + "\n"
            "        else\n"
            "            " + call("sgd_row", w="d + ROW_START[r]", lr="lr", g="g + ROW_START[r]",
                                  n="ROW_LENGTH[r]").render() + "\n"
            "    }\n}",
            f"static void write_rows(real *restrict g, {arrays.replace('const uint64_t', 'uint64_t')}, int all)\n{{\n"
            + "\n".join(write) + "\n    (void)g; (void)stamp; (void)rank1; (void)snap; (void)gen; (void)all;\n}",
        ])

    def _add_terms(self, v, nodes, go, contribute, out):
        """Loose terms of a sum: each gets the sum's gradient."""
        needs = [x.needs_grad and not x.shares_grad for x in nodes]
        if not any(needs):
            return
        n = v.n
        if unrolled(v) or not all(needs):
            for x, o, need in zip(nodes, v.offsets, needs):
                if need:
                    contribute(x.sgd_fused, Accumulate(v.start, o, go, (out, None, 0)), Assign(data_at(v.start, o), f"lr * {go}", "-="),
                               lambda shape, o=o: self._track(dataclasses.replace(v.start, base=v.start.base + o), None, 1,
                                                              shape, Assign(grad_at(v.start, o), go, "+=")))
            return
        to_param = nodes[0].sgd_fused
        if v.contiguous:
            contribute(to_param, call("add_short" if short(v) else "add_range", y=f"g + {slot_index(v.start, grad=True)}",
                                      alpha=go, n=n),
                       call("add_range", y=f"d + {slot_index(v.start)}", alpha=f"-(lr * {go})", n=n))
        else:
            table = self.offsets(v.offsets)
            contribute(to_param, call("add_offsets", y=f"g + {slot_index(v.start, grad=True)}", oy=table, alpha=go, n=n),
                       call("add_offsets", y=f"d + {slot_index(v.start)}", oy=table, alpha=f"-(lr * {go})", n=n))

    def _add_products(self, wrt, other, factors, go, contribute, out, shape=(), activation=None):
        """Factor list `wrt` of a dot gets go times the other list's values."""
        needs = [f.needs_grad for f in factors]
        if not any(needs):
            return
        n = wrt.n
        if all(needs) and not any(f.sgd_fused for f in factors) and Matmul.fits(shape, wrt, other, out):
            laid = fused_gradient(wrt, shape, activation) if activation is not None else None
            epilogue = None
            if laid is not None:
                self._folded = activation
                epilogue = (self._epilogue(activation.first, gradient=True), *laid)
            contribute(False, Matmul(wrt, other, out, epilogue), None)
            return
        # (a loop whose weights stay put over its innermost loop gives them several contributions:
        # batch-1 SGD never updates them in backward; the batched program steps them after the
        # sum over its batch when they have no other, train()'s rate permitting)
        # (lists written out are summed in registers over a loop of a fixed count (the zoo's demo:
        # measured faster); over a run-time batch, rows of 16 and more make a product worth its call)
        if (all(needs) and (not unrolled(wrt, other) or (shape and isinstance(shape[-1], BatchExtent)
                                                         and len(wrt.offsets) >= UNROLL_MAX_CONTIGUOUS))
                and WeightGradient.fits(shape, wrt, other, out)):
            step = self.stepped is not None and all(f.kind == "param" and f.sgd_fused for f in factors)
            product = WeightGradient(wrt, other, out, self._row_list(other), step)
            if step:
                self.stepped += ir.slot_runs(np.sort(product.weights(shape)))
            contribute(False, product, None)
            return
        if unrolled(wrt, other) or not all(needs):
            for f, i, j, need in zip(factors, wrt.offsets, other.offsets, needs):
                if need:
                    term = f"{go} * {data_at(other.start, j)}"
                    contribute(f.sgd_fused, Accumulate(wrt.start, i, term, (out, other.start, j)),
                               Assign(data_at(wrt.start, i), f"lr * ({term})", "-="))
            return
        to_param = factors[0].sgd_fused
        nonzeros = self._nonzeros(other) if wrt.contiguous and other.contiguous else None
        y, w, x = f"g + {slot_index(wrt.start, grad=True)}", f"d + {slot_index(wrt.start)}", f"d + {slot_index(other.start)}"
        if nonzeros:
            accumulate = call("axpy_nz", y=y, alpha=go, x=x, n=n, nz=nonzeros)
            contribute(to_param, accumulate, call("sgd_axpy_nz", w=w, lr="lr", alpha=go, x=x, n=n, nz=nonzeros),
                       lambda shape: self._track(wrt.start, other.start, n, shape, accumulate))
        elif wrt.contiguous and other.contiguous:
            accumulate = call("axpy_short" if short(wrt, other) else "axpy", y=y, alpha=go, x=x, n=n)
            contribute(to_param, accumulate, call("sgd_axpy", w=w, lr="lr", alpha=go, x=x, n=n),
                       lambda shape: self._track(wrt.start, other.start, n, shape, accumulate))
        else:
            tw, to = self.offsets(wrt.offsets), self.offsets(other.offsets)
            contribute(to_param, call("axpy_offsets", y=y, oy=tw, alpha=go, x=x, ox=to, n=n),
                       call("sgd_axpy_offsets", w=w, ow=tw, lr="lr", alpha=go, x=x, ox=to, n=n))
