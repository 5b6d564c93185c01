"""A batch's loop of lanes kernels' calls along a plain loop (the one inside the lanes') as one
call a row loop, where the calls' operands move by fixed steps along it:

    for i0 (queries) for i1 (heads) for i2 (a head's dimensions):
        dot_offsets_lanes over the lanes: out + 16 * i2 = the sum of a at oa by b + 512 * i2 at ob

is an attention's weighted sums (the weights a, the values b over the keys); its backward is two
axpy_offsets_lanes calls a dimension, one into the weights' gradients (the same target in every
row) and one into the values' (the same x in every row). As calls of the *_rows kernels
(templates/kernels/axpy.c) the loop's rows share their reads: the weights once a row pair, a
weight's gradient read and written once for all the rows instead of once a row. Each row's sums
are its call's, in the same order: the same bits. Where the rows' cells could meet (a target that
two rows or terms reach, unless every row adds into it in order; a target that is a read) the
calls stay as they were: dot_calls_as_rows() and axpy_calls_as_rows() return None.
"""

from dataclasses import dataclass

import numpy as np

from ..lower.types import BatchExtent, Bounded, Extent
from .cells import apart, clear, grid, slots_at
from .kernels import call
from .loops import at_start, loop_start, slot_index
from .tree import nest


@dataclass(frozen=True)
class AxpyLanes:
    """The axpy_offsets_lanes of (y at oy, alpha, x at ox) over a batch's lanes: y the gradient of the
    Vector `y`, alpha the gradient at Affine `alpha`, x the values of the Vector `x`; names: the
    offset tables' C names (oy, ox)."""
    y: object
    alpha: object
    x: object
    names: tuple

    def call(self, shape):
        """The call over the lanes of shape's innermost loop, at the loops outside it."""
        oy, ox = self.names
        return call("axpy_offsets_lanes", y=f"g + {slot_index(at_start(self.y.start), grad=True)}", oy=oy,
                    alpha=f"g + {slot_index(at_start(self.alpha), grad=True)}",
                    x=f"d + {slot_index(at_start(self.x.start))}", ox=ox, n=self.x.n, lanes=str(shape[-1]))


@dataclass(frozen=True)
class AddLanes:
    """The add_offsets_lanes of (y at oy, alpha) over a batch's lanes: y the gradient of the Vector
    `y` (a sum's terms), alpha the gradient at Affine `alpha` (the sum's); name: oy's C name."""
    y: object
    alpha: object
    name: str

    def call(self, shape):
        """The call over the lanes of shape's innermost loop, at the loops outside it."""
        return call("add_offsets_lanes", y=f"g + {slot_index(at_start(self.y.start), grad=True)}", oy=self.name,
                    alpha=f"g + {slot_index(at_start(self.alpha), grad=True)}", n=self.y.n, lanes=str(shape[-1]))


def dot_calls_as_rows(shape, out, a, b, names):
    """The dot_offsets_lanes of (out, a at oa, b at ob) over shape's lanes, a call at each point of the
    loops outside them, as a dot_offsets_lanes_rows call at each point of the loops outside the
    rows' loop (shape[-2]); None where that is not the same."""
    if not _rows(shape, out, a.start, b.start):
        return None
    points, capacity, rows = grid(shape[:-2]), int(shape[-1]), int(shape[-2])
    written = _cells(out, points, (0,), rows, grad=False)
    read = np.concatenate([_cells(a.start, points, a.offsets, 1, grad=False),
                           _cells(b.start, points, b.offsets, rows, grad=False)], axis=1)
    if not (apart(written, capacity) and clear(written, read, capacity)):
        return None
    oa, ob = names
    return [nest(shape[:-2], [call("dot_offsets_lanes_rows", out=_start(out), out_step=out.strides[-2],
                                   a=_start(a.start), oa=oa, b=_start(b.start), b_step=b.start.strides[-2], ob=ob,
                                   n=a.n, lanes=str(shape[-1]), rows=rows)], braced=False)]


def axpy_calls_as_rows(shape, sums):
    """The AxpyLanes `sums`, a call each at each point of shape's loops outside the lanes, as an
    axpy_offsets_lanes_rows call each at each point of the loops outside the rows' (all of the
    first's rows, then the next's); None where that is not the same."""
    if not all(_rows(shape, s.y.start, s.alpha, s.x.start) for s in sums):
        return None
    points, capacity, rows = grid(shape[:-2]), int(shape[-1]), int(shape[-2])
    targets = [_cells(s.y.start, points, s.y.offsets, 1 if s.y.start.strides[-2] == 0 else rows) for s in sums]
    alphas = np.concatenate([_cells(s.alpha, points, (0,), rows) for s in sums], axis=1)
    targets = np.concatenate(targets, axis=1)  # (a target a row and term, or a term for every row; no other's)
    if not (apart(targets, capacity) and clear(targets, alphas, capacity)):
        return None
    calls = []
    for s in sums:
        oy, ox = s.names
        calls.append(call("axpy_offsets_lanes_rows", y=_start(s.y.start, grad=True), oy=oy, y_step=s.y.start.strides[-2],
                          alpha=_start(s.alpha, grad=True), alpha_step=s.alpha.strides[-2], x=_start(s.x.start), ox=ox,
                          x_step=s.x.start.strides[-2], n=s.x.n, lanes=str(shape[-1]), rows=rows))
    return [nest(shape[:-2], calls, braced=len(calls) > 1)]


def axpy_calls_repeated(shape, sums):
    """The AxpyLanes `sums` where they are one call repeated (a square's gradient, go * x into x's
    gradient once for each of its two factors: RMSNorm's sum of squares), a call each at each
    point of shape's loops outside the lanes, as one axpy_offsets_lanes_rows call of that many
    rows, every step 0: each target's terms added in a register, in the calls' order, where the
    calls read and wrote every target once each; None where that is not the same (a target two
    terms of a call reach, whose terms would interleave; a target that is the alpha)."""
    if len(sums) < 2 or any(s != sums[0] for s in sums) or not shape or not isinstance(shape[-1], BatchExtent):
        return None
    s, capacity = sums[0], int(shape[-1])
    if s.y.start.strides[-1] != 1 or s.alpha.strides[-1] != 1 or s.x.start.strides[-1] != 1:
        return None
    outside = grid(shape[:-1])
    points = np.column_stack([outside, np.zeros((len(outside), 1), dtype=np.int64)])  # (lane 0)
    targets = slots_at(s.y.start, points)[:, None] + np.asarray(s.y.offsets, dtype=np.int64)[None, :]
    if not (apart(targets, capacity) and clear(targets, slots_at(s.alpha, points)[:, None], capacity)):
        return None
    oy, ox = s.names
    at = lambda affine, grad=False: loop_start(affine, 1, grad=grad)  # noqa: E731 (the lanes' index at 0)
    return [nest(shape[:-1], [call("axpy_offsets_lanes_rows", y=at(s.y.start, True), oy=oy, y_step=0,
                                   alpha=at(s.alpha, True), alpha_step=0, x=at(s.x.start), ox=ox, x_step=0,
                                   n=s.x.n, lanes=str(shape[-1]), rows=len(sums))], braced=False)]


def _rows(shape, *affines):
    """Whether shape's loop inside the lanes' is a plain one (a count known here) that the lanes'
    count, the loops outside it and the affines' steps along it do not depend on."""
    if len(shape) < 3 or not isinstance(shape[-1], BatchExtent) or getattr(shape[-1], "loop", None) == len(shape) - 2:
        return False
    plain = lambda e: not isinstance(e, (Extent, BatchExtent, Bounded))
    return (plain(shape[-2]) and int(shape[-2]) > 1 and all(plain(e) for e in shape[1:-2])
            and all(type(a.strides[-2]) is int and a.strides[-1] == 1 for a in affines))


def _cells(affine, points, offsets, rows, grad=True):
    """The slot (lane 0) of affine + offset at each row r < rows of each point: a row of cells a
    point, r-major."""
    start = slots_at(affine, np.column_stack([points, np.zeros((len(points), 2), dtype=np.int64)]), grad=grad)
    step = affine.strides[-2]
    cells = start[:, None, None] + step * np.arange(rows)[None, :, None] + np.asarray(offsets, dtype=np.int64)[None, None, :]
    return cells.reshape(len(points), -1)


def _start(affine, grad=False):
    """C for where a rows kernel starts: the affine with the rows' and the lanes' indices at 0."""
    return loop_start(affine, 2, grad=grad)
