"""The vector level: nodes that compute the same thing become one loop nest.

`group` puts nodes in classes by structure: two nodes are alike when they apply the same op to
operands that are alike (params with params, inputs with inputs, constants with constants, and
computed operands of one class), however the user spelled the model. A layer's neurons, the
samples of a batch written into one graph and a convolution's positions each form one class.
Classes are evaluated in order of height (a class only reads classes below it), members in graph
order.

`vectorize` then looks at where each member's operands live (after `ir.layout` gave every class
consecutive result slots) and describes the class as a loop nest: the extents, and for every
operand slot an affine function `base + sum(stride[d] * i[d])` of the loop indices. Lists of
operands (a dot's factors and terms) need the same offset pattern in every member, e.g. a 3x3
window `(0, 1, 2, 28, 29, 30, 56, 57, 58)`. Constants that differ between members get slots, so
that loops read them. A class that does not fit stays straight-line, one statement per node.
"""

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter

import numpy as np


@dataclass(frozen=True)
class Affine:
    """A slot as a function of the loop indices: base + sum(strides[d] * i[d]). Its gradient
    lives at grad_base + the same (grad_base differs from base only where straight-line code
    shares a gradient slot)."""
    base: int
    strides: tuple = ()
    grad_base: int = None

    def grad_offset(self):
        return self.base if self.grad_base is None else self.grad_base


@dataclass(frozen=True)
class Vector:
    """A list of operand slots: start (Affine) plus a fixed offset per element."""
    start: Affine
    offsets: tuple

    @property
    def contiguous(self):
        return self.offsets == tuple(range(len(self.offsets)))


@dataclass
class Group:
    """Nodes computing the same thing over operands at constant strides: one loop nest (or, with
    one member, one statement). `shape` are the loop extents, outermost first; `members` are in
    loop order."""
    members: list
    shape: tuple = ()

    @property
    def first(self):
        return self.members[0]


@dataclass
class Operands:
    """Where a group's operands live. For an op group, `args` holds per argument an Affine or a
    float (a constant the same in every member). For a dot group, `constants` are its loose terms
    that are literals, `terms` its other loose terms, `a` and `b` its factor lists."""
    out: Affine
    args: tuple = ()
    constants: tuple = ()
    term_positions: tuple = ()  # which of the node's args `terms` lists
    terms: Vector = None
    a: Vector = None
    b: Vector = None


def group(compute):
    """Classes of alike nodes (Groups), in an order that evaluates every operand first. Sets
    each computed node's `cls` to ("c", its class); a leaf's is its kind."""
    keys, height = {}, []
    members = []
    for node in compute:
        key = _key(node)
        c = keys.get(key)
        if c is None:
            c = keys[key] = len(height)
            height.append(1 + max((height[x.cls[1]] for x in node.reads() if x.kind in ("op", "dot")), default=0))
            members.append([])
        node.cls = ("c", c)
        members[c].append(node)
    order = sorted(range(len(members)), key=lambda c: height[c])  # stable: first appearance breaks ties
    return [Group(members[c]) for c in order]


_cls, _slot = attrgetter("cls"), attrgetter("slot")


def _key(node):
    """Operands by class (computed ones come first in `compute`, so theirs is set): a tuple per
    operand list, built at C speed (a dot reads hundreds)."""
    if node.kind == "op":
        return ("op", node.op.name, node.k, node.for_outputs, tuple(map(_cls, node.args)))
    return ("dot", node.for_outputs, tuple(map(_cls, node.args)), tuple(map(_cls, node.a)), tuple(map(_cls, node.b)))


def batch_innermost(groups, moved):
    """Reorders the members of loop nests whose outermost loop runs over a batch (the samples of
    micrograd's demo: every parameter operand the same along it) so that this loop becomes the
    innermost, and with it the results' layout: the samples of a value then sit side by side,
    and a loop over them (a layer applied to the whole batch) is one the C compiler vectorises.
    Each group moves once (`moved`: their ids). Returns whether any group
    changed; `layout` and `vectorize` must then run again."""
    changed = False
    for g in groups:
        if len(g.shape) < 2 or g.shape[0] < 4 or id(g) in moved or not _params_constant_along_outer(g):
            continue
        order = np.arange(len(g.members)).reshape(g.shape)
        order = order.transpose(list(range(1, len(g.shape))) + [0]).ravel()
        g.members = [g.members[i] for i in order]
        moved.add(id(g))
        changed = True
    return changed


def _params_constant_along_outer(g):
    first, ops = g.first, g.operands
    if first.kind == "op":
        slots = [a for a, x in zip(ops.args, first.args) if x.kind == "param"]
    else:
        terms = [first.args[i] for i in ops.term_positions]
        slots = [v.start for v, xs in ((ops.terms, terms), (ops.a, first.a), (ops.b, first.b))
                 if v is not None and any(x.kind == "param" for x in xs)]
    return all(a.strides[0] == 0 for a in slots)


def vectorize(groups, n_slots):
    """Describes every group's operands (group.operands, group.shape); a group whose operands are
    not at constant strides is split into single nodes. Constants that a loop reads get slots
    from n_slots on. Returns (groups, constants as (slot, value), slot count)."""
    constants = []
    result = []
    for g in groups:
        if g.first.kind == "dot":
            n_slots = _slot_factor_constants(g, constants, n_slots)
        elif g.first.op.selects:
            n_slots = _slot_gathered_constants(g, constants, n_slots)
        if len(g.members) > 1:
            literals, n_slots = _slot_varying_constants(g, constants, n_slots)
            if _describe_loop(g, literals):
                result.append(g)
                continue
            if g.first.kind == "dot":  # a shared constant in a list whose other elements move
                n_slots, retry = _slot_factor_constants(g, constants, n_slots, columns=True)
                if retry and _describe_loop(g, literals):
                    result.append(g)
                    continue
        for m in g.members:  # straight-line, one statement per node
            part = type(g)([m])
            _describe_single(part)
            result.append(part)
    return result, constants, n_slots


def _slot_varying_constants(g, constants, n_slots):
    """A constant operand that differs between members is read from a slot; one that is the same
    everywhere stays a literal. Returns (the positions in args of literals, slot count)."""
    literals = set()
    selects = g.first.kind == "op" and g.first.op.selects
    for position, x in enumerate(g.first.args):
        if x.kind != "const" or (selects and position > 0):  # (a gather's have slots already)
            continue
        if len({repr(float(m.args[position].value)) for m in g.members}) == 1:
            literals.add(position)
            continue
        for m in g.members:
            c = m.args[position]
            if c.slot is None:
                c.slot = n_slots
                constants.append((n_slots, float(c.value)))
                n_slots += 1
    return literals, n_slots


def _slot_gathered_constants(g, constants, n_slots):
    """A gather reads the operand its index picks at an offset from the first operand's slot
    (statements.Emitter's _picked): its constant operands get slots too, side by side."""
    for m in g.members:
        for c in m.args[1:]:
            if c.kind == "const" and c.slot is None:
                c.slot = n_slots
                constants.append((n_slots, float(c.value)))
                n_slots += 1
    return n_slots


def _slot_factor_constants(g, constants, n_slots, columns=False):
    """Constants in a dot's factor lists (data times weights) are read from slots, as lists
    are. Per list position: one slot for all members if they hold the same value there (a
    shared scale), else a slot per distinct constant, position by position, so that one
    position's values (a data column) sit side by side. With `columns` (when the loop did not
    fit: a shared scale in a list whose other elements move from member to member), the shared
    values get a slot per member too, so that they move alike; returns (slot count, whether
    any did), else the slot count."""
    moved = False
    for which in ("a", "b"):
        for position, x in enumerate(getattr(g.first, which)):
            if x.kind != "const":
                continue
            column = [getattr(m, which)[position] for m in g.members]
            same = len({repr(float(c.value)) for c in column}) == 1
            if columns:
                if same and len({id(c) for c in column}) == len(column):
                    for c in column:
                        c.slot = n_slots
                        constants.append((n_slots, float(c.value)))
                        n_slots += 1
                    moved = True
                continue
            if all(c.slot is None for c in column) and same:
                for c in column:
                    c.slot = n_slots
                constants.append((n_slots, float(x.value)))
                n_slots += 1
                continue
            for c in column:
                if c.slot is None:
                    c.slot = n_slots
                    constants.append((n_slots, float(c.value)))
                    n_slots += 1
    return (n_slots, moved) if columns else n_slots


def _lists(node, literals):
    """A dot's operand lists: its loose terms that are not literals and its two factor lists."""
    return [[x for i, x in enumerate(node.args) if i not in literals], list(node.a), list(node.b)]


def _describe_single(g):
    """One node: every operand at a fixed slot; constants as literals."""
    node = g.first
    g.shape = ()
    out = Affine(node.slot, (), node.grad_slot)
    if node.kind == "op":
        slotted = node.op.selects  # (a gather's constant operands have slots: see _slot_gathered_constants)
        args = tuple(float(x.value) if x.kind == "const" and not (slotted and x.slot is not None)
                     else Affine(x.slot, (), x.grad_slot) for x in node.args)
        g.operands = Operands(out, args)
        return
    constants = tuple(float(x.value) for x in node.args if x.kind == "const")
    positions = tuple(i for i, x in enumerate(node.args) if x.kind != "const")
    terms = [node.args[i] for i in positions]
    g.operands = Operands(out, (), constants, positions, *(_single_vector(xs) for xs in (terms, node.a, node.b)))


def _single_vector(nodes):
    if not nodes:
        return None
    start = nodes[0]
    return Vector(Affine(start.slot, (), start.grad_slot), tuple(x.slot - start.slot for x in nodes))


def _describe_loop(g, literals):
    """Sets g.shape and g.operands if every operand is affine in the loop indices."""
    first = g.first
    literal = [i in literals for i in range(len(first.args))]
    columns = [[m.slot for m in g.members]]
    if first.kind == "op":
        for i, is_lit in enumerate(literal):
            if not is_lit:
                columns.append([m.args[i].slot for m in g.members])
    else:
        patterns = []
        member_lists = [_lists(m, literals) for m in g.members]
        for which in range(3):
            lists = [ml[which] for ml in member_lists]
            if not lists[0]:
                patterns.append(None)
                continue
            width = len(lists[0])
            if any(len(xs) != width for xs in lists):
                return False
            slots = np.fromiter(map(_slot, chain.from_iterable(lists)), dtype=np.int64,  # member x position
                                count=width * len(lists)).reshape(len(lists), width)
            offsets = slots - slots[:, :1]
            if not (offsets == offsets[0]).all():
                return False
            patterns.append(tuple(offsets[0].tolist()))
            columns.append(slots[:, 0].tolist())
    found = decompose(np.array(columns, dtype=np.int64).T)
    if found is None:
        return False
    shape, strides = found
    affines = [Affine(int(c[0]), tuple(int(s) for s in row)) for c, row in zip(columns, strides)]
    out, rest = affines[0], affines[1:]
    if first.kind == "op" and first.op.selects and len({a.strides for a in rest[-len(first.args) + 1:]}) > 1:
        return False  # a gather's operands must keep their offsets from the first in every member
    g.shape = shape
    if first.kind == "op":
        args, it = [], iter(rest)
        for i, is_lit in enumerate(literal):
            args.append(float(first.args[i].value) if is_lit else next(it))
        g.operands = Operands(out, tuple(args))
    else:
        constants = tuple(float(x.value) for i, x in enumerate(first.args) if literal[i])
        positions = tuple(i for i in range(len(first.args)) if not literal[i])
        it = iter(rest)
        vectors = [Vector(next(it), p) if p is not None else None for p in patterns]
        g.operands = Operands(out, (), constants, positions, *vectors)
    return True


def decompose(rows):
    """Loop extents (outermost first) and per column its strides, such that row number
    flat(i) == rows[0] + sum(strides[:, d] * i[d]); None if there are none. `rows`: an (n, w)
    integer array, one row per member in order."""
    n, width = rows.shape
    if n == 1:
        return (), np.zeros((width, 0), dtype=np.int64)
    diffs = np.diff(rows, axis=0)
    delta = diffs[0]
    same = (diffs == delta).all(axis=1)
    if same.all():
        return (n,), delta[:, None]
    run = int(np.argmin(same)) + 1  # the innermost extent: the first change of step
    if n % run:
        return None
    blocks = rows.reshape(n // run, run, width)
    if not (np.diff(blocks, axis=1) == delta).all():
        return None
    outer = decompose(blocks[:, 0, :])
    if outer is None:
        return None
    shape, strides = outer
    return shape + (run,), np.concatenate([strides, delta[:, None]], axis=1)
