"""A family's backward over a causal triangle of a batch's documents, its sums held over one of
the triangle's two loops (Backward.group's, before loops.loop_nest):

    for i0 (queries) ... for i<k> < first + step * i0 (keys) for the lanes (documents):
        go = G[i0, ..., i<k>];  A[i0, ...] += go * x;  B[..., i<k>] += go * y

is the attention's query-key dots' backward: the queries' gradients A stay put over the keys, the
keys' gradients B over the queries. In that nest both are read and written back at every
(query, key) pair, a cache line a lane vector (the bigger GPT's 16 documents of float32): two
heads' operands and gradients are more than the L1 holds, and that nest took 5% of its step. Here
it is two nests, one a kind of target: the queries' gradients held in `held` over the keys, and
the keys' over the queries (the loops swapped: for a key, the queries that reach it), the heads'
loops outside both. Every target is one cell of `held` a lane, and gets its terms in the order it
got them in the one nest (the keys', or the queries', ascending): the same bits. Where that is
not so (a target that more than one query and head, or key and head, reach; targets that overlap
each other or the gradient read), held_sums() declines and the nest stays as it was.

Where the targets are rows a fixed step apart, their terms' values too, each nest's loops over
the terms and the lanes are one held_sums_lanes call (templates/kernels/axpy.c): `held` in an
array over the lanes cost a load and a store of every row's sum at each term; the kernel keeps
eight rows' sums of a block of lanes in registers over the terms, the same bits.
"""

import dataclasses

import numpy as np

from ..lower.types import ActiveBatch, BatchExtent, Bounded, Extent, is_family
from .cells import apart, clear, grid, slots_at
from .kernels import call
from .loops import Accumulate, grad_at, slot_index
from .tree import Assign, ClearGradient, Count, Held, Loop, ReadGradient, nest


def held_sums(shape, body, offsets):
    """The statements of `body` (a ReadGradient, then Accumulates of the gradient times a value,
    then ClearGradients) over `shape` (the family's queries, plain loops, its keys, the lanes of
    the queries' documents) as the two nests above, or None where they do not fit. offsets: a
    static table's name for a list of offsets (loops.OffsetTables)."""
    if not _triangle(shape):
        return None
    reads = [s for s in body if isinstance(s, ReadGradient)]
    sums = [s for s in body if isinstance(s, Accumulate)]
    clears = [s for s in body if isinstance(s, ClearGradient)]
    if (len(reads) != 1 or body[0] is not reads[0] or not sums or len(reads) + len(sums) + len(clears) != len(body)
            or any(s.product is None or s.product[1] is None or s.product[0] != sums[0].product[0] for s in sums)):
        return None
    keys, lanes = len(shape) - 2, len(shape) - 1
    by_keys = [s for s in sums if s.target.strides[keys] == 0]
    by_queries = [s for s in sums if s.target.strides[keys] != 0 and s.target.strides[0] == 0 and not s.target.tri]
    if (len(by_keys) + len(by_queries) != len(sums) or sums[0].product[0].strides[lanes] != 1
            or any(s.target.strides[lanes] != 1 for s in sums) or not _apart(shape, by_keys, by_queries)):
        return None
    read, = reads
    return (_over_keys(shape, read, by_keys, [] if by_queries else clears, offsets)
            + _over_queries(shape, read, by_queries, clears, offsets))


def _triangle(shape):
    """Whether `shape` is a family's queries, plain loops, keys that grow with the queries, and
    the lanes of the documents that reach the query."""
    return (is_family(shape) and len(shape) >= 3 and isinstance(shape[-1], ActiveBatch) and shape[-1].loop == 0
            and isinstance(shape[-2], Extent) and shape[-2].step >= 1
            and not any(isinstance(e, (Extent, BatchExtent, Bounded)) for e in shape[1:-2]))


def _over_keys(shape, read, sums, clears, offsets):
    """for the plain loops, for i0: held = A; for the keys, for the lanes: held += term; A = held."""
    if not sums:
        return []
    keys, active = len(shape) - 2, shape[-1]
    kernel = _held_call(shape, read, sums, clears, offsets, keys, range(int(shape[-2])), 0, shape[-2], active, 0)
    if kernel is None:
        load, terms, store = _held(shape, read, sums, clears, active)
        pairs = Loop(keys, shape[-2], (terms,), braced=False)
    queries = Loop(0, shape[0], (kernel,) if kernel else (Held("held", len(sums), int(active)), load, pairs, store))
    return [nest(shape[1:-2], [queries], braced=False, first=1)]


def _over_queries(shape, read, sums, clears, offsets):
    """for the plain loops, for the keys: held = B (every lane); for the queries that reach the key,
    for their lanes: held += term; B = held."""
    if not sums:
        return []
    keys, grows = len(shape) - 2, shape[-2]
    capacity = int(shape[-1])  # (every lane: a lane that no query reaching the key adds to is stored as it was read)
    key = f"i{keys}"
    first_query = (f"{key} < {grows.first} ? 0 : " +
                   (f"{key} - {grows.first - 1}" if grows.step == 1 else f"({key} - {grows.first}) / {grows.step} + 1"))
    # the keys that the last query reaches, first + step * (n0 - 1), n0 read at run time where it is cut
    count = (Count(f"{grows.first - grows.step} + {'' if grows.step == 1 else f'{grows.step} * '}{shape[0]}")
             if isinstance(shape[0], Bounded) else grows.first + grows.step * (int(shape[0]) - 1))
    kernel = _held_call(shape, read, sums, clears, offsets, 0, range(int(shape[0])), first_query, shape[0], capacity, 1)
    if kernel is None:
        load, terms, store = _held(shape, read, sums, clears, capacity)
        queries = Loop(0, shape[0], (terms,), braced=False, start=first_query)
    over_keys = Loop(keys, count, (kernel,) if kernel else (Held("held", len(sums), capacity), load, queries, store))
    return [nest(shape[1:-2], [over_keys], braced=False, first=1)]


def _held_call(shape, read, sums, clears, offsets, over, terms, first, n, lanes, active_step):
    """The held_sums_lanes call for a nest's loops over its terms (loop `over`: the keys, or the
    queries from `first` to `n`) and the lanes (`lanes` of them), or None where its targets are not
    rows a fixed step apart, their values' likewise, a slot moves by other than a fixed number of
    slots a term (a family's quadratic start, tri, only in the gradient read, by a table), or a
    clear is of another slot than the read's."""
    lane = len(shape) - 1
    out, value = sums[0].product[:2]
    y_row, x_row = _step([s.offset for s in sums]), _step([s.product[2] for s in sums])
    if (y_row is None or x_row is None or any(s.target != sums[0].target or s.product[1] != value for s in sums)
            or any(c.at != read.at for c in clears) or value.tri
            or any(isinstance(t, Extent) for a in (out, value, sums[0].target) for t in a.strides)):
        return None
    at_first = lambda a: dataclasses.replace(a, strides=tuple(0 if d in (over, lane) else t for d, t in enumerate(a.strides)),
                                             tri=a.tri if over else 0)
    table = [out.strides[over] * t + (out.tri * t * (t - 1) // 2 if over == 0 else 0) for t in terms]
    active = shape[-1]
    return call("held_sums_lanes", y=f"g + {slot_index(at_first(sums[0].target), sums[0].offset, grad=True)}",
                y_row=y_row, alpha=f"g + {slot_index(at_first(out), grad=True)}", oa=offsets(table),
                clear=int(bool(clears)), x=f"d + {slot_index(at_first(value), sums[0].product[2])}", x_row=x_row,
                x_step=value.strides[over], active=f"d + {active.active + active.first}" + ("" if active_step else " + i0"),
                active_step=active_step, first=first, n=n, lanes=lanes, rows=len(sums))


def _step(offsets):
    """The fixed step between offsets (0 for one), or None."""
    steps = set(np.diff(offsets).tolist())
    return 0 if not steps else steps.pop() if len(steps) == 1 else None


def _held(shape, read, sums, clears, lanes):
    """The loops over the lanes (the first `lanes` of them: a number or the queries' count) that
    load the targets into `held`, add the terms into it (with the gradient's read and clears) and
    store it back: a cell of `held` a target and lane."""
    lane = len(shape) - 1
    cells = [f"held[{k}][i{lane}]" for k in range(len(sums))]
    load = Loop(lane, lanes, tuple(Assign(c, grad_at(s.target, s.offset)) for c, s in zip(cells, sums)), independent=True)
    terms = Loop(lane, shape[-1], (read, *(Assign(c, s.term, "+=") for c, s in zip(cells, sums)), *clears),
                 independent=True)
    store = Loop(lane, lanes, tuple(Assign(grad_at(s.target, s.offset), c) for c, s in zip(cells, sums)), independent=True)
    return load, terms, store


def _apart(shape, by_keys, by_queries):
    """Whether every target is reached by one query and pass of the plain loops (by_keys), or one
    key and pass of them (by_queries), its lanes overlapping no other target's nor the gradient
    read's (at every query, plain pass and key the nest runs at its largest count)."""
    capacity, keys = int(shape[-1]), len(shape) - 2
    points = _points(shape)
    queries, plain_keys = _without(points, keys), _without(points, 0)
    starts = [slots_at(s.target, queries, s.offset) for s in by_keys]
    starts += [slots_at(s.target, plain_keys, s.offset) for s in by_queries]
    targets = np.concatenate(starts)[None, :]
    read = slots_at((by_keys or by_queries)[0].product[0], points)[None, :]
    return apart(targets, capacity) and clear(targets, read, capacity)


def _points(shape):
    """Every (query, plain loops..., key) the nest runs at its largest count, one a row."""
    plain = grid(shape[1:-2])
    grows, rows = shape[-2], []
    for q in range(int(shape[0])):
        n = grows.first + grows.step * q
        rows.append(np.column_stack([np.full(n * len(plain), q), np.repeat(plain, n, axis=0), np.tile(np.arange(n), len(plain))]))
    return np.concatenate(rows).astype(np.int64)


def _without(points, column):
    """The distinct rows of points with one loop's index set to 0 (the loop a target stays put over)."""
    points = points.copy()
    points[:, column] = 0
    return np.unique(points, axis=0)
