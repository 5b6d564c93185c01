"""Where a loop nest's statements land, as numbers: the slots of an Affine at the points of a
nest (its loops' indices, one row a point) and whether a point's cells stay apart. The rewrites
that reorder a nest's sums (triangle.py, rows.py) check with these that the order they change
is one no cell sees."""

import numpy as np

from ..lower.types import Extent


def grid(extents):
    """Every point of loops over `extents` at their largest counts, one a row (one empty row for
    no loops)."""
    if not extents:
        return np.zeros((1, 0), dtype=np.int64)
    axes = np.meshgrid(*[np.arange(int(e)) for e in extents], indexing="ij")
    return np.stack(axes, -1).reshape(-1, len(extents)).astype(np.int64)


def slots_at(affine, points, offset=0, grad=True):
    """The slot (lane 0) of `affine` + offset, its gradient's or (grad False) its value's, at
    each row of points (i0, i1, ...: the first indices, the rest at 0)."""
    slots = np.full(len(points), (affine.grad_offset() if grad else affine.base) + offset, dtype=np.int64)
    queries = points[:, 0]
    for d, stride in enumerate(affine.strides[:points.shape[1]]):
        step = stride.first + stride.step * queries if isinstance(stride, Extent) else int(stride)
        slots += step * points[:, d]
    return slots + affine.tri * (queries * (queries - 1) // 2)


def apart(cells, capacity):
    """Whether each of a point's cells (a row of them) is `capacity` lanes from every other."""
    return bool(np.all(np.diff(np.sort(cells, axis=1), axis=1) >= capacity))


def clear(written, read, capacity):
    """Whether each of a point's written cells is `capacity` lanes from each of its read ones
    (rows of cells a point, or one row of read cells for every point)."""
    read = np.sort(read, axis=1)
    for k, w in enumerate(written):
        r = read[min(k, len(read) - 1)]
        at = np.searchsorted(r, w)
        for nearest in (r[np.clip(at - 1, 0, None)], r[np.clip(at, None, len(r) - 1)]):
            if np.any(np.abs(nearest - w) < capacity):
                return False
    return True
