"""Positions: a sequence model's loops stop at the sample's own length, read at run time.

A graph written for sequences of up to T positions, whose loss is `sum(w[t] * loss[t])` with the
weights w[t] inputs (microgpt's port: 1/n for a document's n positions, 0 after them), computes
every position whatever the sample's length. Where w[t] is 0 for every t >= n, nothing that
reaches the loss only through the terms t >= n changes the loss or any gradient: this pass finds
that work and lets the C skip it.

Each computed node gets a position: the first term t its value reaches (the least t over its
consumers; -1 for what reaches the loss otherwise, T for what does not reach it: outputs only).
A node of position p is needed exactly when p < n, and it reads only nodes of positions <= p, so
the needed nodes read only needed ones. In a causal model the position is the sequence's own:
the attention of position t reads the keys of positions <= t. Every group must then run its
members of positions < n and skip the others, each group in one of three ways:

- all its members one position p: it runs while `n > p` (Group.guard: (slot, p));
- positions that rise along one loop and stay along the others: that loop's extent is cut at
  run time (a Bounded extent), to n - p where pass i is position p + i (`upto(d[slot], p, N)`),
  else to a table's count of the passes below n (a causal triangle's rows); a one-loop group
  whose positions repeat in rows (a triangle's values laid flat, head after head) is read as a
  loop nest over the rows first;
- every member -1: it always runs.

If any group fits none of these, nothing is bounded (a group that ran every position would read
the skipped nodes' stale values); `bound_positions` says why. The loss's own sum leaves out the
terms t >= n (Group.masked), whose factors are then stale.

n lives in one slot (a constant slot, so that a batch shares it), which the runtime writes before
a training pass (templates/driver.c, templates/batch.c: one past the last nonzero weight; a
batch's largest); every other path (predict(), forward(), exported C) leaves the constant's value,
T + 1, which runs every group. The results are those of the unbounded program (a skipped term's
contributions are exact zeros), which tests/test_positions.py checks against the full run.
"""

import dataclasses
from itertools import chain, compress
from operator import attrgetter

import numpy as np

from .types import COMPUTED, DOT, INPUT, OP, Affine, Extent, Sequence, cut, is_family


def bound_positions(program, input_grads=False):
    """Bounds the loops of `program` (an ir.Program, changed in place: group shapes, guards, the
    slot, program.sequence) by the positions the sample has. Returns why not, for a loss that
    weighs terms by inputs but whose loops cannot be cut (a loss of another form is no sequence:
    None, as when they are cut)."""
    loss = program.loss
    if loss.kind != DOT or not loss.a:
        return None
    pairs = []
    for x, y in zip(loss.a, loss.b):
        weight, term = (x, y) if x.kind == INPUT else (y, x)
        if weight.kind != INPUT or not term.kind in COMPUTED:
            return None
        pairs.append((weight, term))
    if len(pairs) < 2 or len({id(w) for w, _ in pairs}) != len(pairs):
        return None
    if input_grads:
        return "the inputs' gradients are asked for (the loss's weights would get the skipped terms')"
    T = len(pairs)
    # each computed node's position, by its slot (a computed node's own), at C speed group by group
    position = np.full(program.n_slots, T, dtype=np.int64)
    for t, (_, term) in enumerate(pairs):
        position[term.slot] = min(position[term.slot], t)
    for x in loss.args:
        if x.kind in COMPUTED:
            position[x.slot] = -1
    groups = program.forward
    computed_of = {}  # id of a dot's list -> its computed operands' slots
    for g in reversed(groups):  # (consumers before what they read)
        members = [node for node in g.members if node is not loss]
        if members:
            _pass_on(members, position, computed_of)
    sequence = Sequence(program.n_slots, tuple(w.slot for w, _ in pairs))
    bounds = {}
    for g in groups:
        if any(node is loss for node in g.members):
            continue
        bound = _bound(g, position[np.fromiter(map(_slot, g.members), dtype=np.int64, count=len(g.members))],
                       sequence.slot, T)
        if bound is False:
            what = g.first.op.name if g.first.kind == OP else "sum"
            return f"a loop nest's positions do not rise along one of its loops (a {what} of {len(g.members)} nodes)"
        if bound is not None:
            bounds[id(g)] = bound
    if not bounds:
        return "no loop depends on the positions"
    for g in groups:
        bound = bounds.get(id(g))
        if isinstance(bound, int):
            g.guard = (sequence.slot, bound)
        elif bound is not None:
            g.shape, g.operands = bound
        elif any(node is loss for node in g.members):
            g.masked = sequence.slot
    program.n_slots += 1
    program.constants.append((sequence.slot, float(sequence.every)))
    program.sequence = sequence
    return None


def _pass_on(members, position, computed_of):
    """Gives every computed operand of `members` the least of its position and its readers'. A
    dot's lists are met list by list (ir.build_nodes makes the lists alike one tuple, read by
    many dots: a position's activations), their computed operands found once (`computed_of`)."""
    readers = position[np.fromiter(map(_slot, members), dtype=np.int64, count=len(members))]
    args = list(map(_args, members))
    computed, arg_slots = _computed_slots(list(chain.from_iterable(args)))
    slots = [arg_slots]
    least = [np.repeat(readers, np.fromiter(map(len, args), dtype=np.int64, count=len(args)))[computed]]
    for lists in (list(map(_a, members)), list(map(_b, members))):
        if not any(lists):
            continue
        ids = np.fromiter(map(id, lists), dtype=np.int64, count=len(lists))
        _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
        least_of = np.full(len(first), np.iinfo(np.int64).max)
        np.minimum.at(least_of, inverse, readers)
        for k, p in zip(first.tolist(), least_of.tolist()):
            xs = lists[k]
            found = computed_of.get(id(xs))
            if found is None:
                found = computed_of[id(xs)] = _computed_slots(xs)[1]
            slots.append(found)
            least.append(np.full(len(found), p))
    np.minimum.at(position, np.concatenate(slots), np.concatenate(least))


def _computed_slots(xs):
    """(which of the nodes xs are computed, as a boolean array; the slots of those)."""
    computed = np.fromiter(map(COMPUTED.__contains__, map(_kind, xs)), dtype=bool, count=len(xs))
    return computed, np.fromiter(map(_slot, compress(xs, computed)), dtype=np.int64)


_args, _a, _b, _kind, _slot = (attrgetter(name) for name in ("args", "a", "b", "kind", "slot"))


def _indices(shape, count):
    """The loop indices of a loop nest's members, in member order (a family's inner extents
    grow with i0), as an array (members x loops); None if they are not `count`."""
    if not shape:
        return np.zeros((count, 0), dtype=np.int64) if count == 1 else None
    if not is_family(shape):
        if int(np.prod([int(n) for n in shape])) != count:
            return None
        return np.indices([int(n) for n in shape]).reshape(len(shape), -1).T
    rows = []
    for i0 in range(int(shape[0])):
        inner = [n.first + n.step * i0 if isinstance(n, Extent) else int(n) for n in shape[1:]]
        index = np.indices(inner).reshape(len(inner), -1).T
        rows.append(np.column_stack([np.full(len(index), i0), index]))
    index = np.concatenate(rows)
    return index if len(index) == count else None


def _bound(g, positions, slot, T):
    """How group g skips its members of positions >= n: None (it always runs), p (it runs while
    n > p), (its shape with one extent Bounded (_cut_along), its operands over that shape), or
    False (it cannot)."""
    first = int(positions[0])
    if (positions == first).all():
        return None if first < 0 else first
    if positions.min() < 0:
        return False
    index = _indices(g.shape, len(positions))
    if index is not None:
        shape = _cut_along(g.shape, index, positions, slot, T)
        if shape is not None:
            return shape, g.operands
    if len(g.shape) == 1 and _plain(g.operands):  # one loop: as rows of a loop nest, each alike
        n = int(g.shape[0])
        for length in range(2, n // 2 + 1):
            if n % length == 0 and (positions.reshape(-1, length) == positions[:length]).all():
                shape = (n // length, length)
                index = np.indices(shape).reshape(2, -1).T
                cut_shape = _cut_along(shape, index, positions, slot, T)
                if cut_shape is not None:
                    return cut_shape, _as_rows(g.operands, length)
    return False


def _cut_along(shape, index, positions, slot, T):
    """`shape` with the extent of the loop along which the positions rise (and along no other)
    cut at run time; None if there is no such loop."""
    for k in range(index.shape[1]):
        if isinstance(shape[k], Extent):
            continue
        along = np.full(int(shape[k]), -1)
        along[index[:, k]] = positions
        if (along[index[:, k]] != positions).any() or (np.diff(along) < 0).any():
            continue
        if (along == along[0] + np.arange(len(along))).all():
            return shape[:k] + (cut(shape[k], slot, int(along[0])),) + shape[k + 1:]
        counts = tuple(int(c) for c in np.searchsorted(along, np.arange(T + 2)))
        return shape[:k] + (cut(shape[k], slot, None, counts),) + shape[k + 1:]
    return None


def _plain(operands):
    """Whether a one-loop group's operands are plain slots along it (no family's growth)."""
    affines = [operands.out] + [a for a in operands.args if isinstance(a, Affine)]
    affines += [v.start for v in (operands.terms, operands.a, operands.b) if v is not None]
    return (operands.choices is None and all(len(a.strides) == 1 and not a.tri for a in affines)
            and all(v.length is None for v in (operands.terms, operands.a, operands.b) if v is not None))


def _as_rows(operands, length):
    """A one-loop group's operands over two loops, rows of `length` passes."""
    def rows(a):
        return dataclasses.replace(a, strides=(a.strides[0] * length, a.strides[0]))

    def vector(v):
        return None if v is None else dataclasses.replace(v, start=rows(v.start))
    return dataclasses.replace(operands, out=rows(operands.out),
                               args=tuple(rows(a) if isinstance(a, Affine) else a for a in operands.args),
                               terms=vector(operands.terms), a=vector(operands.a), b=vector(operands.b))
