"""What the forward and backward builders of a group's statements (codegen/write/forward.py,
codegen/write/backward.py) share: a program, its element type and side tables
(codegen/write/sides.py), and the C of the op table's formulas over a group's operands: a
formula's placeholders, the operand an op that selects picks, a derivative times a gradient, the
epilogues a layer kernel applies to its rows.
"""

import collections

from . import dtypes
from .dtypes import c_literal
from .kernels import call
from .loops import along_lanes, at_start, operand, slot_index
from .tree import Assign


class Statements:
    _reads = None  # {id(node): times the program's forward reads it}, counted once (_read_only_by)

    def __init__(self, program, tables, dtype=dtypes.DEFAULT):
        """program: a types.Program or BatchedProgram; tables: its sides.SideTables; dtype: a
        dtypes.Dtype."""
        self.program = program
        self.tables = tables
        self.dtype = dtype

    def _read_only_by(self, nodes, readers):
        """Whether each of the nodes is read `readers` times in the program (its forward's groups),
        its gradient its own (their contributions are then the reading group's, when every
        member of that group, `readers` of them, reads each once)."""
        if self._reads is None:
            self._reads = collections.Counter(id(x) for g in self.program.forward for n in g.members for x in n.reads())
        return all(self._reads[id(x)] == readers and not x.shares_grad for x in nodes)

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
        first, n, at, grads, step = self._candidates(op, ops)
        offsets = grads if grad else at
        table = None if step is not None else self.tables.offsets(at)
        if op.selects == "index":
            i = call("gather_index", x=operand(ops.args[0], self.dtype), n=n)
        elif table is None:
            i = call("largest_at", x=f"d + {slot_index(first)}", step=step, n=n)
        else:
            i = call("largest_in", x=f"d + {slot_index(first)}", offsets=table, n=n)
        if offsets != at:
            table = self.tables.offsets(offsets)
        offset = f"{table}[{i}]" if table else f"{step} * {i}" if step != 1 else i
        return f"{'g' if grad else 'd'}[{slot_index(first, grad=grad)} + {offset}]"

    @staticmethod
    def _candidates(op, ops):
        """An op that selects: its first candidate (an Affine), their count (see _picked), each
        one's slot from the first's, of its value and of its gradient, and the values' spacing
        where they are evenly spaced (else None)."""
        choices = ops.args[op.first_choice:]
        first, n = choices[0], ops.choices or len(choices)
        at = [a.base - first.base for a in choices]
        step = at[1] if n > 1 else 0
        return (first, n, at, [a.grad_offset() - first.grad_offset() for a in choices],
                step if at == [step * k for k in range(n)] else None)

    def _largest_lanes(self, g):
        """Where group g is a maximum a sample in a batch's loop (a softmax's largest logit over an
        attention's keys), its candidates evenly spaced (values and gradients alike) and moving
        with the sample, as its value is: the arguments its lanes kernels share (largest_lanes,
        add_to_largest_lanes: the same bits as largest_at a lane), with `y`, its first candidate's
        gradient, `out` and `go`, its values and their gradient; else None."""
        ops, op = g.operands, g.first.op
        if op.selects != "largest" or op.value != "{a}" or not op.grad_is_one(0):
            return None
        first, n, at, grads, step = self._candidates(op, ops)
        if step is None or grads != at or not along_lanes(g.shape, ops.out, first):
            return None
        return {"x": f"d + {slot_index(at_start(first))}", "y": f"g + {slot_index(at_start(first), grad=True)}",
                "out": f"d + {slot_index(at_start(ops.out))}", "go": f"g + {slot_index(at_start(ops.out), grad=True)}",
                "step": step, "n": n, "lanes": str(g.shape[-1])}

    def _epilogue(self, node, gradient=False, overwrite=False, in_place=False):
        """The name of a C function (templates/epilogue.c, a templates/kernels/gemm.c Epilogue)
        applying node's op (one argument) to a row of values x: its value (its row kernel's call
        where the op table names one); or, with gradient, its
        gradient x times its derivative, added to its argument's gradient (with overwrite, added
        to 0 and written: the same bits as adding it to a cleared gradient, which nothing else
        adds to; with in_place, the row is y's own: its value, or its gradient times the
        derivative, written there)."""
        names = {"a": "a[n]", "out": "o[n]", **({"k": c_literal(node.k, self.dtype)} if node.k is not None else {})}
        if gradient and (overwrite or in_place):
            statement = Assign("y[n]", f"(real)0 + {self._times_local(node, 0, names, 'y[n]' if in_place else 'x[n]')}")
        elif gradient:
            statement = Assign("y[n]", self._times_local(node, 0, names, "x[n]"), "+=")
        elif node.op.row_kernel:  # (its kernel over the row: exp_range, tanh_range, sigmoid_range)
            statement = call(node.op.row_kernel, y="y", x="y" if in_place else "x", n="count")
        else:
            statement = Assign("y[n]", self._op_c(node, node.op.value, dict(names, a="y[n]" if in_place else "x[n]")))
        return self.tables.shared.epilogue(statement)
