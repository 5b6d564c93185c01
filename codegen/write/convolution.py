"""A convolution over a batch: a dot group whose loops are filters, positions and the batch, as
the three kernels of templates/kernels/conv.c instead of a loop nest per filter and position
(whose weights' gradients were three dot_rows calls per filter and position).

A dot group of the batched program is one when its loop nest is (filters, rows, columns, samples)
with the filters' loop or the rows' left out: one factor list, the weights, moves with the
filters only, at a constant step along the list; the other, the inputs' window (any offsets),
moves with the positions and the samples (stride 1), not with the filters; the results move with
all and with the samples at stride 1; at most one loose term, the bias, which moves with the
filters only. The window's offsets go in an offset table; its weights' order is the list's.

    forward             conv_set   the results from the bias (written, not added)
    weights' gradients  conv_nt    summed over positions and samples, and the bias's
    inputs' gradients   conv_acc   (only when the inputs need them: not a model's pixels)
"""

import dataclasses
from dataclasses import dataclass

from ..lower.types import DOT, BatchExtent
from ..lower.vector import progression
import numpy as np

from .kernels import call
from .loops import LAYER_MIN_SAMPLES, _activation, _positions, loop_start

# the loops outside the batch's: a filters' loop and two of positions at most
MAX_OUTER = 3


@dataclass(frozen=True)
class Convolution:
    """Where a convolution group's operands live, by role."""
    weights: object     # Vector: a filter's weights
    inputs: object      # Vector: the window at position (0, 0)
    out: object         # Affine: the results
    bias: object        # Affine of the bias, or None (a dot's only loose term: node.args is [it])
    filters: int        # the filters' loop (a dimension of shape), or None
    positions: tuple    # the positions' loops (one or two dimensions of shape)
    shape: tuple
    swapped: bool       # the weights are the node's `b` list (else its `a`)

    def _along(self, affine, dim):
        return 0 if dim is None else affine.strides[dim]

    def _sizes(self):
        """F, P, Q and the strides along filters, rows, columns of an Affine."""
        rows, columns = (None, *self.positions) if len(self.positions) == 1 else self.positions
        size = lambda dim: 1 if dim is None else self.shape[dim]
        return (size(self.filters), size(rows), size(columns),
                lambda a: (self._along(a, self.filters), self._along(a, rows), self._along(a, columns)))

    def _start(self, affine, offset=0, grad=False):
        return loop_start(affine, len(self.shape), offset, grad=grad)

    def forward(self, offsets, epilogue=None):
        """conv_set's call (offsets: the program's offset tables); epilogue: (the C function, the
        Affine over the convolution's loops of its results, never in place) of an activation of
        the results that the kernel applies as it finishes each position (fused_activation)."""
        F, P, Q, along = self._sizes()
        if epilogue:
            function, y, _ = epilogue  # (never in place)
            y_f, y_p, y_q = along(y)
            applied = dict(epilogue=function, y=self._start(y), y_f=y_f, y_p=y_p, y_q=y_q)
        else:
            applied = dict(epilogue="NULL", y="NULL", y_f=0, y_p=0, y_q=0)
        out_f, out_p, out_q = along(self.out)
        _, x_p, x_q = along(self.inputs.start)
        w_f = along(self.weights.start)[0]
        bias = (dict(bias=self._start(self.bias), bias_f=along(self.bias)[0]) if self.bias
                else dict(bias="NULL", bias_f=0))
        return call("conv_set", out=self._start(self.out), out_f=out_f, out_p=out_p, out_q=out_q, **bias,
                    w=self._start(self.weights.start, self.weights.offsets[0]), w_f=w_f,
                    w_k=progression(self.weights.offsets), x=self._start(self.inputs.start), x_p=x_p, x_q=x_q,
                    offsets=offsets(self.inputs.offsets), F=F, P=P, Q=Q, S=self.shape[-1],
                    K=len(self.inputs.offsets), **applied)

    def fused_activation(self, h):
        """Where group h (later in the same forward pass) writes, as an Affine over the
        convolution's loops, when h is an activation of exactly its results in their order (a
        loop over the batch inside loops over them, laid out however), its own results along the
        batch at stride 1: conv_set can apply it as its epilogue (as loops.fused_activation for a
        layer); else None."""
        if not _activation(h) or not isinstance(h.shape[-1], BatchExtent) or h.shape[-1] != self.shape[-1]:
            return None
        arg, out = h.operands.args[0], h.operands.out
        if arg.strides[-1] != 1 or out.strides[-1] != 1:
            return None
        outer = lambda affine, shape: _positions(type(affine)(affine.base, affine.strides[:-1]), shape[:-1])
        if not np.array_equal(outer(arg, h.shape), outer(self.out, self.shape)):
            return None
        ys = outer(out, h.shape)
        grid = ys.reshape(self.shape[:-1])
        strides = tuple(int(np.take(grid, 1, axis=d).flat[0] - grid.flat[0]) if n > 1 else 0
                        for d, n in enumerate(self.shape[:-1]))
        y = type(out)(int(grid.flat[0]), strides + (1,))
        return y if np.array_equal(outer(y, self.shape), ys) else None

    def backward(self, node, offsets):
        """The kernel calls that add the group's gradients into its operands': the weights' and
        the bias's (conv_nt), the inputs' (conv_acc), each where its nodes need them."""
        F, P, Q, along = self._sizes()
        go_f, go_p, go_q = along(self.out)
        weight_nodes, input_nodes = (node.b, node.a) if self.swapped else (node.a, node.b)
        table = offsets(self.inputs.offsets)
        common = dict(go=self._start(self.out, grad=True), go_f=go_f, go_p=go_p, go_q=go_q, F=F, P=P, Q=Q,
                      S=self.shape[-1], K=len(self.inputs.offsets))
        statements = []
        bias_needs = self.bias is not None and any(x.needs_grad and not x.shares_grad for x in node.args)
        if any(x.needs_grad for x in weight_nodes) or bias_needs:
            bias = (dict(bias=self._start(self.bias, grad=True), bias_f=along(self.bias)[0]) if bias_needs
                    else dict(bias="NULL", bias_f=0))
            weights = (dict(out=self._start(self.weights.start, self.weights.offsets[0], grad=True),
                            out_f=along(self.weights.start)[0], out_k=progression(self.weights.offsets), K=common["K"])
                       if any(x.needs_grad for x in weight_nodes) else dict(out="NULL", out_f=0, out_k=0, K=0))
            _, x_p, x_q = along(self.inputs.start)
            statements.append(call("conv_nt", **weights, **bias, x=self._start(self.inputs.start), x_p=x_p, x_q=x_q,
                                   offsets=table, **{k: v for k, v in common.items() if k != "K"}))
        if any(x.needs_grad for x in input_nodes):
            _, out_p, out_q = along(self.inputs.start)
            statements.append(call("conv_acc", out=self._start(self.inputs.start, grad=True), out_p=out_p, out_q=out_q,
                                   offsets=table, w=self._start(self.weights.start, self.weights.offsets[0]),
                                   w_f=along(self.weights.start)[0], w_k=progression(self.weights.offsets), **common))
        return statements


def convolution(g):
    """Group g as a Convolution over a batch, or None (see the module's docstring)."""
    ops, shape = g.operands, g.shape
    if (g.first.kind != DOT or not shape or g.family or g.masked is not None or not isinstance(shape[-1], BatchExtent)
            or shape[-1] < LAYER_MIN_SAMPLES or not ops.a or ops.constants or not 2 <= len(shape) <= MAX_OUTER + 1
            or ops.out.strides[-1] != 1 or (ops.terms and len(ops.terms.offsets) != 1)):
        return None
    for swapped, (weights, inputs) in enumerate(((ops.a, ops.b), (ops.b, ops.a))):
        w, x = weights.start.strides, inputs.start.strides
        if w[-1] != 0 or x[-1] != 1 or progression(weights.offsets) is None:
            continue
        filters = [d for d in range(len(shape) - 1) if x[d] == 0 and w[d] != 0]
        positions = [d for d in range(len(shape) - 1) if w[d] == 0 and x[d] != 0]
        if (len(filters) > 1 or not 1 <= len(positions) <= 2 or len(filters) + len(positions) != len(shape) - 1
                or filters and filters[0] != 0):
            continue
        bias = None
        if ops.terms:
            bias = ops.terms.start
            if bias.strides[-1] != 0 or any(bias.strides[d] for d in positions):
                continue
            bias = dataclasses.replace(bias, base=bias.base + ops.terms.offsets[0], grad_base=None if bias.grad_base is None
                                       else bias.grad_base + ops.terms.offsets[0])
        return Convolution(weights, inputs, ops.out, bias, filters[0] if filters else None, tuple(positions), shape,
                           bool(swapped))
    return None
