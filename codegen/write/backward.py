"""A group's backward statements: what each operand's gradient gets (Contribution: the group's
gradient times the other factor or the local derivative), placed by the backward's mode:

    Plain          every contribution added into its gradient (backward_body, backward_batch)
    SgdInBackward  batch-1 SGD's: a parameter's only contribution taken as its step at once,
                   `param -= lr * contribution` (ir.sgd_in_backward; backward_sgd_body)
    Tracked        the step-by-step API's: a kernel's contribution to a row of such parameters
                   through the row's stamp (backward_tracked_body; templates/step.c)

A layer's inputs' gradients over a batch may finish the activation before it (its gradient, as
the product's epilogue): that group is then skipped (Backward.pass_).
"""

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..lower import ir
from ..lower.types import OP, PARAM, BatchExtent, Bounded
from ..lower.vector import progression
from .convolution import convolution
from .kernels import Call, call
from .loops import (UNROLL_MAX_CONTIGUOUS, Accumulate, Matmul, WeightGradient, along_lanes, cleared, data_at,
                    fused_gradient, grad_at, guarded, lanes_apart, loop_nest, neurons, placed, short, slot_index, unrolled)
from .rows import AddLanes, AxpyLanes, axpy_calls_as_rows, axpy_calls_repeated
from .sides import TrackedRow
from .statements import Statements
from .tree import Assign, Block, ClearGradient, Copy, If, ReadGradient, nest
from .triangle import held_sums


@dataclass(frozen=True)
class Contribution:
    """What one operand (or list of them) gets from a group's gradient: `accumulate` (a typed
    statement adding it to the gradient), `update` (batch-1 SGD's step taking it at once, for a
    parameter marked sgd_fused: `to_fused_param`), and `track`, a TrackedRow whose gradient the
    step-by-step API may write through its stamp (Tracked), or None."""
    to_fused_param: bool
    accumulate: object
    update: object = None
    track: TrackedRow = None
    lanes: AxpyLanes = None  # in a batch's loop, `accumulate` for all its samples (a call over their lanes), or None


@dataclass
class Body:
    """A group's backward statements as the mode places them: gradients, then updates (which
    come after every statement that still reads a parameter's old value), and the snapshots
    taken before the loop nest."""
    grads: list = dataclasses.field(default_factory=list)
    updates: list = dataclasses.field(default_factory=list)
    snapshots: list = dataclasses.field(default_factory=list)


class Plain:
    """Every contribution added into its gradient; with `clears`, each group's gradient is set
    back to 0 once its statements have read it, so that the pass leaves every gradient it wrote 0
    (Backward.pass_): the runtime then need not clear them before the next (templates/driver.c;
    microgpt's 90 KB of gradients were 8% of its step, Zen 3; emit.py says which programs)."""

    def __init__(self, clears=False):
        self.clears = clears

    def place(self, c, shape, body):
        body.grads.append(c.accumulate)


class SgdInBackward:
    """A contribution to a parameter marked sgd_fused (ir.sgd_in_backward) applies
    `param -= lr * contribution` instead; `clears` as Plain's."""

    def __init__(self, clears=False):
        self.clears = clears

    def place(self, c, shape, body):
        if c.to_fused_param:
            body.updates.append(c.update)
        else:
            body.grads.append(c.accumulate)


class Tracked:
    """The step-by-step API's backward: an axpy kernel's contribution to a row of parameters
    marked sgd_fused goes through the row's stamp (its tables: sides.SideTables's tracked rows)."""
    clears = False

    def __init__(self, tables):
        self.tables = tables

    def place(self, c, shape, body):
        if c.to_fused_param and c.track is not None:
            statement, snapshot = self._track(c.track, shape, placed(c.accumulate))
            if statement:
                body.grads.append(statement)
                body.snapshots.extend([snapshot] if snapshot else [])
                return
        body.grads.append(c.accumulate)

    def _track(self, row, shape, accumulate):
        """The stamped form of `accumulate` (adding go * other into the parameter row, in a loop
        nest over `shape`), and the statement before the loop that snapshots `other`; (None,
        None) where it does not apply. Each iteration writes its own row (the parameters get one
        contribution each) and has a stamp, numbered in loop order (templates/model.c's
        write_rows tells what the stamps say). The first contribution in a generation does not
        write the row: it records go, the row standing for `0 + go * snapshot` (rank one) until
        update() or someone looking at the gradients needs it."""
        wrt, other = row.start, row.other
        if (other is not None and any(other.strides)) or wrt.grad_offset() != wrt.base:  # one `other` for every row
            return None, None
        first, snapshot = self.tables.track(dataclasses.replace(row, shape=shape))
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        stamp = " + ".join([str(first)] + [f"i{d}" if s == 1 else f"{s} * i{d}" for d, s in enumerate(strides)])
        listed = Assign("live[++live[0]]", f"(uint32_t)({stamp})")  # update() visits the rows of the list
        if other is None:  # a single parameter (a bias): its gradient is written at once
            first_time = (Assign(f"stamp[{stamp}]", "gen"), Assign(grad_at(wrt), "(real)0 + go"), listed)
            return If(f"stamp[{stamp}] == gen", accumulate, If("go != 0", Block(first_time, inline=True))), None
        first_time = (Assign(f"stamp[{stamp}]", "gen + 1"), Assign(f"rank1[{stamp}]", "go"), listed)
        return (If(f"stamp[{stamp}] == gen", accumulate, If("go != 0", Block(first_time, inline=True))),
                Copy(f"snap + {snapshot}", f"d + {slot_index(other)}", row.n))


class Backward(Statements):
    def pass_(self, groups, mode):
        """The statements of each group of `groups` (in backward order) in `mode` (Plain,
        SgdInBackward, Tracked); an activation's gradient, when the group just before it finishes
        the activation's gradient with a product (its inputs' gradients, matmul_acc), becomes
        that product's epilogue (loops.fused_gradient): nothing between them adds to it. With
        mode.clears, each group's gradient (and a folded activation's) is set to 0 once read
        (ClearGradient): every gradient a contribution adds to is some later group's, none is read
        after its group, and a group that does not run (positions) was added to by none."""
        statements, skip = [], None
        for i, g in enumerate(groups):
            if g is skip:
                continue
            after = groups[i + 1] if i + 1 < len(groups) and groups[i + 1].guard == g.guard else None
            group, folded = self.group(g, mode, after)
            if folded is not None and not folded.in_place:  # (in place, its gradient is never written)
                group = group + self._cleared(after, mode)
            statements += guarded(g, group)
            skip = after if folded is not None else None
        return statements

    @staticmethod
    def _clear(g, mode):
        """In a mode that clears, group g's ClearGradient (for its loop nest's body), else none."""
        return [ClearGradient(grad_at(g.operands.out), g.operands.out)] if mode.clears else []

    def _cleared(self, g, mode):
        """_clear as a loop nest of its own, after statements that read g's gradient otherwise."""
        clear = self._clear(g, mode)
        return cleared(g.shape, clear) if clear else []

    def group(self, g, mode, activation=None):
        """(the statements adding group g's gradients into its operands', the Matmul finishing
        `activation`'s gradient as its epilogue, or None: the group after g in backward order)."""
        ops, node = g.operands, g.first
        out_grad = grad_at(ops.out)
        if node.kind == OP and node.op.selects:  # the gradient goes to the operand picked only
            if not any(x.needs_grad for x in node.args[node.op.first_choice:]):
                return loop_nest(g.shape, self._clear(g, mode)), None
            lanes = self._largest_lanes(g)
            if lanes:
                picked = call("add_to_largest_lanes", g=lanes["y"], x=lanes["x"], step=lanes["step"], n=lanes["n"],
                              go=lanes["go"], lanes=lanes["lanes"])
                return [nest(g.shape[:-1], [picked], braced=False)] + self._cleared(g, mode), None
            names = dict(self._op_names(node, ops), out=data_at(ops.out))
            grad = Assign(self._picked(node.op, ops, grad=True), self._times_local(node, 0, names, out_grad), "+=")
            return loop_nest(g.shape, [grad] + self._clear(g, mode)), None
        body = Body()
        if node.kind == OP:
            names = dict(self._op_names(node, ops), out=data_at(ops.out))
            for i, (arg, where) in enumerate(zip(node.args, ops.args)):
                if arg.needs_grad and not arg.shares_grad:
                    term = self._times_local(node, i, names, out_grad)
                    mode.place(Contribution(arg.sgd_fused, Accumulate(where, 0, term),
                                            Assign(data_at(where), f"lr * ({term})", "-=")), g.shape, body)
            apart = lanes_apart(g.shape, ops.out, *(a for a in ops.args if hasattr(a, "base")))
            return loop_nest(g.shape, body.grads + body.updates + self._clear(g, mode), independent=apart), None
        conv = convolution(g) if isinstance(mode, Plain) else None
        if conv:
            return conv.backward(node, self.tables.offsets) + self._cleared(g, mode), None
        go, terms, products = "go", [], []
        if ops.terms:
            terms = self._terms(ops.terms, [node.args[i] for i in ops.term_positions], go, ops.out, g.shape)
        if ops.a:
            for wrt, other, factors in ((ops.b, ops.a, node.b), (ops.a, ops.b, node.a)):
                products += self._products(wrt, other, factors, go, ops.out, g.shape, activation,
                                           self._overwrites(mode, g), mode.clears)
        contributions = self._bias_in_product(terms, products, g.shape, mode)
        if isinstance(mode, Plain) and contributions and all(c.lanes for c in contributions):
            lanes = [c.lanes for c in contributions]  # (no innermost loop: no `go` read in it)
            each = [s.call(g.shape) for s in lanes]
            calls = ((all(isinstance(s, AxpyLanes) for s in lanes)
                      and (axpy_calls_as_rows(g.shape, lanes) or axpy_calls_repeated(g.shape, lanes)))
                     or ([nest(g.shape[:-1], each, braced=len(each) > 1)] if len(g.shape) > 1 else each))
            return calls + self._cleared(g, mode), None
        for c in contributions:
            mode.place(c, g.shape, body)
        folded = next((c.accumulate for c in contributions
                       if isinstance(c.accumulate, Matmul) and c.accumulate.epilogue is not None), None)
        grads, updates = body.grads, body.updates
        if not grads and not updates:
            return self._cleared(g, mode), folded
        # Every contribution is go times something: none when go is 0 (a ReLU that is off), which
        # saves the kernels' passes; written-out statements stay branch-free, to be vectorised.
        unless_zero = any(isinstance(s, Call) for s in grads + updates)  # a kernel
        statements = [ReadGradient(out_grad), *grads, *updates, *self._clear(g, mode)]
        statements = ((not updates and not unless_zero and held_sums(g.shape, statements, self.tables.offsets))
                      or loop_nest(g.shape, statements, dots=not updates, unless_zero=unless_zero))
        return body.snapshots + (statements if g.shape else [Block(tuple(statements), inline=True)]), folded

    def _bias_in_product(self, terms, products, shape, mode):
        """The contributions of a group's loose terms and products, a layer's bias's (one term a
        neuron, its gradient summed over the batch) given to the layer's weights' gradients'
        product (matmul_nt's bias): summed there by the thread that reads those gradient rows,
        instead of in a loop on the caller's (the same sum_range, the same bits); and stepped
        there with the weights when they are (biases with no other gradient), which leaves
        MNIST's MLPs no parameter for the step after the batch, a pass over the threads."""
        weights = [c for c in products if isinstance(c.accumulate, WeightGradient)]
        if not (isinstance(mode, Plain) and len(shape) == 2 and len(terms) == 1 and len(weights) == 1):
            return terms + products
        term, product = terms[0].accumulate, weights[0].accumulate
        if not (isinstance(term, Accumulate) and term.product == (product.out, None, 0)
                and term.target.strides[-1] == 0):
            return terms + products
        step = product.step and terms[0].to_fused_param
        folded = Contribution(False, dataclasses.replace(product, bias=term, bias_step=step))
        if step:
            self.tables.stepped += ir.slot_runs(np.sort(folded.accumulate.biases(shape)))
        return [folded if c is weights[0] else c for c in products]

    def _terms(self, v, nodes, go, out, shape):
        """Loose terms of a sum: each gets the sum's gradient (over a batch's lanes, where they and
        the sum move along them: AddLanes)."""
        needs = [x.needs_grad and not x.shares_grad for x in nodes]
        if not any(needs):
            return []
        n = v.n
        if unrolled(v) or not all(needs):
            return [Contribution(x.sgd_fused, Accumulate(v.start, o, go, (out, None, 0)),
                                 Assign(data_at(v.start, o), f"lr * {go}", "-="),
                                 TrackedRow(dataclasses.replace(v.start, base=v.start.base + o), 1, (), None))
                    for x, o, need in zip(nodes, v.offsets, needs) if need]
        to_param = nodes[0].sgd_fused
        if v.contiguous:
            return [Contribution(to_param, call("add_short" if short(v) else "add_range",
                                                y=f"g + {slot_index(v.start, grad=True)}", alpha=go, n=n),
                                 call("add_range", y=f"d + {slot_index(v.start)}", alpha=f"-(lr * {go})", n=n))]
        table = self.tables.offsets(v.offsets)
        lanes = AddLanes(v, out, table) if along_lanes(shape, out, v.start) else None
        return [Contribution(to_param, call("add_offsets", y=f"g + {slot_index(v.start, grad=True)}", oy=table, alpha=go, n=n),
                             call("add_offsets", y=f"d + {slot_index(v.start)}", oy=table, alpha=f"-(lr * {go})", n=n),
                             lanes=lanes)]

    def _overwrites(self, mode, g):
        """Whether group g's products may write the gradients that only they add to, instead of
        adding to them (Matmul's overwrite): the batched program's plain backward, whose gradients
        the runtime clears before each batch but for the rows written so (sides' overwritten), of
        a product in one call (neurons by the batch: no loops outside the kernel's)."""
        return (isinstance(mode, Plain) and not mode.clears and self.tables.stepped is not None
                and len(g.shape) == 2)

    def _overwritten(self, rows, count):
        """Whether the `count` rows that a product or its epilogue writes (`rows`: an Affine over
        them, by the batch) lie a batch buffer's row apart, the runtime's unit of clearing: then
        recorded in the side tables (the runtime does not clear them)."""
        capacity = self.program.capacity
        if rows.strides[-2] != capacity or (rows.base - self.program.n_params) % capacity:
            return False
        self.tables.overwritten.append(((rows.base - self.program.n_params) // capacity, count))
        return True

    def _products(self, wrt, other, factors, go, out, shape=(), activation=None, overwrites=False, clears=False):
        """Factor list `wrt` of a dot gets go times the other list's values (a product in one call
        writes the gradients only it adds to, where `overwrites`: _overwrites; or, in a backward
        that `clears`, the activation's argument's gradient at once: in_place below)."""
        needs = [f.needs_grad for f in factors]
        if not any(needs):
            return []
        n = wrt.n
        if all(needs) and not any(f.sgd_fused for f in factors) and Matmul.fits(shape, wrt, other, out):
            laid = fused_gradient(wrt, shape, activation) if activation is not None else None
            # (only the epilogue adds to the activation's argument's gradient: it reads nothing else)
            alone = laid is not None and self._read_only_by([x for m in activation.members for x in m.args], 1)
            overwrite = written = False  # (the product's rows, the epilogue's)
            if overwrites:  # (shape: the neurons, every one reading each input once, by the batch)
                rows = type(wrt.start)(wrt.start.base + wrt.offsets[0], (progression(wrt.offsets), 1))
                overwrite = (wrt.start.grad_base is None and self._read_only_by(factors, shape[0])
                             and self._overwritten(rows, len(wrt.offsets)))
                written = alone and self._overwritten(laid[0], len(wrt.offsets))
            # In a backward that clears (every gradient 0 before it), where only the product adds
            # to the inputs' gradients (the activation's results', each read by the layer's
            # neurons alone) and only the epilogue to its argument's, the sums go into the
            # argument's gradient and the epilogue multiplies them there by the derivative: the
            # same bits, without a store and a clear of the inputs' gradients and a load of the
            # argument's.
            in_place = clears and alone and self._read_only_by(factors, neurons(shape))
            epilogue = None if laid is None else (self._epilogue(activation.first, gradient=True, overwrite=written,
                                                                 in_place=in_place), *laid)
            return [Contribution(False, Matmul(wrt, other, out, epilogue, overwrite, in_place))]
        # (a loop whose weights stay put over its innermost loop gives them several contributions:
        # batch-1 SGD never updates them in backward; the batched program steps them after the
        # sum over its batch when they have no other, train()'s rate permitting)
        # (lists written out are summed in registers over a loop of a fixed count (the zoo's demo:
        # measured faster); over a run-time batch, rows of 16 and more make a product worth its call)
        if (all(needs) and (not unrolled(wrt, other) or (shape and isinstance(shape[-1], (BatchExtent, Bounded))
                                                         and len(wrt.offsets) >= UNROLL_MAX_CONTIGUOUS))
                and WeightGradient.fits(shape, wrt, other, out)):
            stepped = self.tables.stepped
            step = stepped is not None and all(f.kind == PARAM and f.sgd_fused for f in factors)
            product = WeightGradient(wrt, other, out, self.tables.row_list(other), step)
            if step:
                stepped += ir.slot_runs(np.sort(product.weights(shape)))
            return [Contribution(False, product)]
        if unrolled(wrt, other) or not all(needs):
            return [Contribution(f.sgd_fused, Accumulate(wrt.start, i, f"{go} * {data_at(other.start, j)}", (out, other.start, j)),
                                 Assign(data_at(wrt.start, i), f"lr * ({go} * {data_at(other.start, j)})", "-="))
                    for f, i, j, need in zip(factors, wrt.offsets, other.offsets, needs) if need]
        to_param = factors[0].sgd_fused
        nonzeros = self.tables.nonzeros(other) if wrt.contiguous and other.contiguous else None
        y, w, x = f"g + {slot_index(wrt.start, grad=True)}", f"d + {slot_index(wrt.start)}", f"d + {slot_index(other.start)}"
        row = TrackedRow(wrt.start, n, (), other.start)
        if nonzeros:
            return [Contribution(to_param, call("axpy_nz", y=y, alpha=go, x=x, n=n, nz=nonzeros),
                                 call("sgd_axpy_nz", w=w, lr="lr", alpha=go, x=x, n=n, nz=nonzeros), row)]
        if wrt.contiguous and other.contiguous:
            return [Contribution(to_param, call("axpy_short" if short(wrt, other) else "axpy", y=y, alpha=go, x=x, n=n),
                                 call("sgd_axpy", w=w, lr="lr", alpha=go, x=x, n=n), row)]
        tw, to = self.tables.offsets(wrt.offsets), self.tables.offsets(other.offsets)
        lanes = AxpyLanes(wrt, out, other, (tw, to)) if along_lanes(shape, out, wrt.start, other.start) else None
        return [Contribution(to_param, call("axpy_offsets", y=y, oy=tw, alpha=go, x=x, ox=to, n=n),
                             call("sgd_axpy_offsets", w=w, ow=tw, lr="lr", alpha=go, x=x, ox=to, n=n), lanes=lanes)]
