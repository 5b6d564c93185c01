"""A group's forward statements: a value per member, from the op table's formula or a sum of
constants, loose terms and products (a fused dot), or one layer kernel's call (loops.layer
decides) or a convolution's (convolution.py); an activation of a layer's results folded into the layer's product as its epilogue.
"""

from ..lower.types import OP, Affine, Extent
from .dtypes import c_literal
from .convolution import convolution
from .kernels import call
from .loops import (along_lanes, at_start, data_at, fused_activation, guarded, layer, loop_nest, short, slot_index,
                    takes_epilogue, tree_sum, unrolled)
from .rows import dot_calls_as_rows
from .statements import Statements
from .tree import Assign, nest


class Forward(Statements):
    def pass_(self, groups):
        """The statements of a forward pass over `groups`; an activation of a layer's results
        (loops.fused_activation) becomes the epilogue of the layer's product instead of a pass of
        its own over them."""
        statements, folded = [], set()
        for i, g in enumerate(groups):
            if id(g) in folded:
                continue
            epilogue, conv = None, convolution(g)
            if conv or takes_epilogue(g):
                for h in groups[i + 1:]:
                    y = ((conv.fused_activation(h) if conv else fused_activation(g, h)) if h.guard == g.guard
                         else None)
                    if y is not None:
                        folded.add(id(h))
                        in_place = not conv and self._in_place(g, h)
                        if in_place and h.first.op.in_products:  # (the product applies it as it stores them)
                            epilogue = (h.first.op.in_products, y, True)
                        else:
                            epilogue = (self._epilogue(h.first, in_place=in_place), y, in_place)
                        break
            statements += guarded(g, self.group(g, epilogue))
        return statements

    def _in_place(self, g, h):
        """Whether layer g's product may write its sums where activation h's results go, h then
        applied there (its epilogue in place): when h alone reads g's results (each once), none
        is read after the forward (an output, the loss), and h's derivative reads its results,
        not its argument. g's results are then never stored: a store and a load less per value,
        and their slots hold nothing (`data` shows them 0)."""
        kept = {id(n) for n in self.program.read_after}
        return ("{a}" not in h.first.op.grads[0]
                and self._read_only_by(g.members, 1) and not any(id(n) in kept for n in g.members))

    def group(self, g, epilogue=None):
        """The statements computing group g's values (epilogue: see loops.layer, and a
        convolution's: convolution.Convolution.forward)."""
        ops = g.operands
        node = g.first
        kernel = layer(g, self.tables, epilogue)
        if kernel:
            return [kernel]
        conv = convolution(g)
        if conv:
            return [conv.forward(self.tables.offsets, epilogue)]
        if node.kind == OP:
            row = _row_kernel(g, node.op.row_kernel, ops)
            if row:
                return [row]
            lanes = self._largest_lanes(g)
            if lanes:
                return [nest(g.shape[:-1], [call("largest_lanes", out=lanes["out"], x=lanes["x"], step=lanes["step"],
                                                 n=lanes["n"], lanes=lanes["lanes"])], braced=False)]
            names = self._op_names(node, ops)
            value = self._op_c(node, node.op.value, names)
        else:
            lanes = self._dot_lanes(g) or self._sum_lanes(g)
            if lanes:
                return lanes
            parts = [c_literal(c, self.dtype) for c in ops.constants]
            if ops.terms:
                parts += self._sum(ops.terms)
            if ops.a:
                parts += self._dot(ops.a, ops.b) if g.masked is None else self._masked_dot(ops.a, ops.b, g.masked)
            value = tree_sum(parts)
        return loop_nest(g.shape, [Assign(data_at(ops.out), value)], independent=True)

    def _sum(self, v):
        """C for the sum of a Vector's values (a list of parts, summed left to right)."""
        n = v.n
        if unrolled(v):
            return [data_at(v.start, o) for o in v.offsets]
        if v.contiguous:
            return [str(call("sum_short" if short(v) else "sum_range", x=f"d + {slot_index(v.start)}", n=n))]
        return [str(call("sum_offsets", x=f"d + {slot_index(v.start)}", ox=self.tables.offsets(v.offsets), n=n))]

    def _dot(self, a, b):
        n = a.n
        if unrolled(a, b):
            return [f"{data_at(a.start, i)} * {data_at(b.start, j)}" for i, j in zip(a.offsets, b.offsets)]
        if a.contiguous and b.contiguous:
            for other, inputs in ((a, b), (b, a)):
                nonzeros = self.tables.nonzeros(inputs)
                if nonzeros:
                    return [str(call("dot_nz", a=f"d + {slot_index(other.start)}", x=f"d + {slot_index(inputs.start)}",
                                     n=n, nz=nonzeros))]
            return [str(call("dot_short" if short(a, b) else "dot", a=f"d + {slot_index(a.start)}",
                             b=f"d + {slot_index(b.start)}", n=n))]
        return [str(call("dot_offsets", a=f"d + {slot_index(a.start)}", oa=self.tables.offsets(a.offsets),
                         b=f"d + {slot_index(b.start)}", ob=self.tables.offsets(b.offsets), n=n))]

    def _dot_lanes(self, g):
        """A batch's loop of dot_offsets calls, one a sample, as one call over its lanes (the dot
        alone, its lists at offsets, both moving with the sample: an attention's weighted sums,
        RMSNorm's sums of squares); None otherwise."""
        ops = g.operands
        a, b = ops.a, ops.b
        if (ops.constants or ops.terms or not a or g.masked is not None or unrolled(a, b)
                or (a.contiguous and b.contiguous) or not along_lanes(g.shape, ops.out, a.start, b.start)):
            return None
        names = self.tables.offsets(a.offsets), self.tables.offsets(b.offsets)
        rows = dot_calls_as_rows(g.shape, ops.out, a, b, names)
        if rows:
            return rows
        return [nest(g.shape[:-1], [call("dot_offsets_lanes", out=f"d + {slot_index(at_start(ops.out))}",
                                         a=f"d + {slot_index(at_start(a.start))}", oa=names[0],
                                         b=f"d + {slot_index(at_start(b.start))}", ob=names[1],
                                         n=a.n, lanes=str(g.shape[-1]))], braced=False)]

    def _sum_lanes(self, g):
        """Likewise a batch's loop of sum_offsets calls (a softmax's denominators over a causal
        attention's keys) as one call over its lanes, then the sum's constants added (`sum`'s
        start) as the statement adds them to the call's result; None otherwise."""
        ops = g.operands
        terms = ops.terms
        if (not terms or ops.a or g.masked is not None or unrolled(terms) or terms.contiguous
                or not along_lanes(g.shape, ops.out, terms.start)):
            return None
        calls = [nest(g.shape[:-1], [call("sum_offsets_lanes", out=f"d + {slot_index(at_start(ops.out))}",
                                          x=f"d + {slot_index(at_start(terms.start))}",
                                          ox=self.tables.offsets(terms.offsets), n=terms.n,
                                          lanes=str(g.shape[-1]))], braced=False)]
        if not ops.constants:
            return calls
        value = tree_sum([c_literal(c, self.dtype) for c in ops.constants] + [data_at(ops.out)])
        return calls + loop_nest(g.shape, [Assign(data_at(ops.out), value)], independent=True)

    @staticmethod
    def _masked_dot(a, b, slot):
        """The loss's products, the t-th left out (0) unless the sample has more than t positions
        (Group.masked, lower/positions.py): its factor is then a skipped position's stale value."""
        return [f"where(d[{slot}] > {t}, {data_at(a.start, i)} * {data_at(b.start, j)}, 0)"
                for t, (i, j) in enumerate(zip(a.offsets, b.offsets))]


def _row_kernel(g, kernel, ops):
    """An op with a kernel over a row (the op table's row_kernel: exp_range) whose innermost loop
    runs along its values and its argument, both side by side: the kernel's call on that row, in
    the loops around it (None otherwise)."""
    if not kernel or not g.shape or len(ops.args) != 1:
        return None
    along = [a for a in (ops.out, *ops.args) if isinstance(a, Affine) and a.strides[-1] == 1
             and not isinstance(a.strides[-1], Extent) and not (len(g.shape) == 1 and a.tri)]
    if len(along) != 2:
        return None
    out, arg = (f"d + {slot_index(at_start(a))}" for a in along)
    return nest(g.shape[:-1], [call(kernel, y=out, x=arg, n=str(g.shape[-1]))], braced=False)
