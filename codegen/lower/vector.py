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

import dataclasses
from itertools import chain, compress, count
from operator import attrgetter

import numpy as np

from .types import COMPUTED, CONST, DOT, OP, PARAM, Affine, Extent, Group, Operands, Parts, Vector


def progression(offsets):
    """The common step of offsets, or None if they are not an arithmetic progression."""
    step = offsets[1] - offsets[0] if len(offsets) > 1 else 0
    return step if all(b - a == step for a, b in zip(offsets, offsets[1:])) else None


def group(compute):
    """Classes of alike nodes (Groups), in an order that evaluates every operand first. Sets
    each computed node's `cls` to ("c", its class); a leaf's is its kind. Dots over the same
    parameters whose classes differ only in where their other operands come from become one
    class, and so does everything alike after them (_shared_rows)."""
    merged, spelled = {}, _Spelled()
    while True:
        members, height, reads = _classes_of(compute, merged, spelled)
        more = _shared_rows(members, height, reads, merged)
        if not more:
            break
        merged.update(more)
    order = sorted(range(len(members)), key=height.__getitem__)  # stable: first appearance breaks ties
    return [Group(members[c]) for c in order]


def _classes_of(compute, merged, spelled):
    """(each class's members, its height, the set of classes it reads), node.cls set: the
    classes by key, a node in `merged` (id -> token) keyed by its token. What a node reads is
    in its key (_key: its operands' classes), so a key's classes and height are found once.
    spelled: the factor lists' classes as numbers (_Spelled), kept from call to call."""
    keys, height = {}, []
    members, reads = [], []
    known = {}  # key -> (the classes its operands are, 1 + the highest of their heights), with merges
    lists = dict(spelled.of_leaves)  # this call's memo: a list's operands have their classes when it is first read
    for node in compute:
        key = _key(node, lists, spelled)
        token = (merged.get(id(node)) or key) if merged else key
        c = keys.setdefault(token, len(height))  # (a key hashed once)
        if c < len(height) and token is key:  # (the key's reads and height are the class's already)
            node.cls = ("c", c)
            members[c].append(node)
            continue
        found = known.get(key) if merged else None
        if found is None:
            read = _key_reads(key, spelled.classes)
            found = (read, 1 + max(map(height.__getitem__, read)) if read else 1)
            if merged:
                known[key] = found
        if c == len(height):
            height.append(found[1])
            members.append([node])
            reads.append(set(found[0]))
        else:
            members[c].append(node)
            if found[1] > height[c]:
                height[c] = found[1]
            reads[c] |= found[0]
        node.cls = ("c", c)
    if merged:  # a merged class's height may rise after a class that reads it took its own: settle them
        changed = True
        while changed:
            changed = False
            for c in range(len(members)):
                h = 1 + max((height[r] for r in reads[c]), default=0)
                if h > height[c]:
                    height[c], changed = h, True
    return members, height, reads


def _key_reads(key, spelled):
    """The computed classes a key's operand classes name (see _classes; a dot's factor lists'
    by their numbers in `spelled`)."""
    read = []
    for xs in key[4:] if key[0] == OP else (key[2], spelled[key[3]], spelled[key[4]]):
        for x in xs:
            if type(x) is tuple:  # (a leaf's class is its Kind)
                if x[0] == "every":
                    x = x[1]
                    if type(x) is not tuple:
                        continue
                read.append(x[1])
    return frozenset(read)


def _shared_rows(members, height, reads, merged):
    """Tokens (node id -> token) that make one class of dot classes whose members read the same
    parameters (a projection's rows) and differ only in their other operands' classes, where
    neither reads the other: microgpt's output projection of the first positions, whose
    attention is its own code (a softmax of one value has no max), and of the later ones; the
    classes after them (the residual stream, the MLP, the head, the next layer) are then alike
    at every position. Empty when there are none (or all are merged already)."""
    by_rows = {}  # (a member's parameters, the dot's shape) -> the classes with such a member
    for c, nodes in enumerate(members):
        first = nodes[0]
        if first.kind != DOT or id(first) in merged:
            continue
        shape = (first.for_outputs, len(first.args), len(first.a), len(first.b),
                 tuple(x.kind == PARAM for x in first.reads()))
        if not any(shape[-1]):
            continue
        mask, lengths = shape[-1], shape[1:4]
        weights = mask == (False,) * len(first.args) + (True,) * len(first.a) + (False,) * len(first.b)
        for node in nodes:
            # a member with the first's list lengths has its kinds (a key's classes) where the first
            # does: its parameters are its own `a` where the first's are (a layer's weights)
            if (len(node.args), len(node.a), len(node.b)) != lengths:
                params = tuple(x for x in node.reads() if x.kind == PARAM)
            else:
                params = node.a if weights else tuple(compress(node.reads(), mask))
            classes = by_rows.setdefault((params, shape), [])
            if not classes or classes[-1] != c:
                classes.append(c)
    joined = {}  # union-find over the classes that share a member's parameters
    def root(c):
        while joined.get(c, c) != c:
            c = joined[c]
        return c
    for classes in by_rows.values():
        for c in classes[1:]:
            a, b = root(classes[0]), root(c)
            if a != b:
                joined[max(a, b)] = min(a, b)
    sets = {}
    for c in sorted(joined):
        sets.setdefault(root(c), [root(c)]).append(c)
    if not sets:
        return {}
    below, bit = _reads_among(reads, height, [c for cs in sets.values() for c in cs])
    more = {}
    for cs in sets.values():
        apart = []  # the first of them, and each after it that neither reads nor is read by those taken
        for c in sorted(cs):
            if not any(below[c] & bit[o] or below[o] & bit[c] for o in apart):
                apart.append(c)
        if len(apart) > 1:
            token = ("rows", id(members[apart[0]][0]))
            for c in apart:
                for node in members[c]:
                    more[id(node)] = token
    return more


def _reads_among(reads, height, wanted):
    """Which of the classes `wanted` each of them reads, directly (`reads`) or not: (per wanted
    class a mask, {class: its bit}). The bits are carried up from the classes below (what a class
    reads is lower), only up to the highest wanted class: memory grows with the classes times the
    wanted ones, not with the classes squared (full read sets ran a random graph of 100,000
    Values out of memory)."""
    bit = {c: 1 << k for k, c in enumerate(wanted)}
    top = max(height[c] for c in wanted)
    reach = {}
    for c in sorted((c for c in range(len(reads)) if height[c] <= top), key=height.__getitem__):
        mask = 0
        for r in reads[c]:
            mask |= reach.get(r, 0) | bit.get(r, 0)
        if mask:
            reach[c] = mask
    return {c: reach.get(c, 0) for c in wanted}, bit


_cls, _slot, _args, _a, _b = (attrgetter(name) for name in ("cls", "slot", "args", "a", "b"))


def _key(node, lists, spelled):
    """Operands by class (computed ones come first in `compute`, so theirs is set): per operand
    list its classes (_classes), built at C speed (a dot reads hundreds); a dot's factor lists'
    as numbers (`spelled.number`), so that a key hashes at once."""
    if node.kind == OP:
        return (OP, node.op.name, node.k, node.for_outputs, _classes(node.args))
    return (DOT, node.for_outputs, _classes(node.args), spelled.number(node.a, lists), spelled.number(node.b, lists))


class _Spelled:
    """The classes (_classes) of dots' factor lists, each as a number, the same for the same
    classes. A dot's lists alike are one tuple (ir.build_nodes: a weight row, a position's
    activations, read by many dots): a _classes_of call finds each list's once (`lists`, its
    memo: id -> number), and the lists of leaves only, whose classes never change, once for all
    calls (`of_leaves`)."""

    def __init__(self):
        self.numbers, self.classes, self.of_leaves = {}, [], {}

    def number(self, operands, lists):
        found = lists.get(id(operands))
        if found is None:
            classes = _classes(operands)
            found = lists[id(operands)] = self.numbers.setdefault(classes, len(self.classes))
            if found == len(self.classes):
                self.classes.append(classes)
            if tuple not in set(map(type, classes)):  # (a computed operand's class is a tuple)
                self.of_leaves[id(operands)] = found
        return found


def _classes(operands):
    """An operand list's classes, a tuple; its last values of one computed class, however many,
    as that class once: a causal attention's softmax over the t + 1 keys of position t
    is then alike at every position, and so is everything after it (vectorize cuts such a
    class into parts of one length)."""
    classes = tuple(map(_cls, operands))
    if not classes or classes[-1][0] != "c":
        return classes
    last = classes[-1]
    # (a sum's start, a constant, comes before its terms)
    start = len(classes) - 1
    while start and classes[start - 1] == last:
        start -= 1
    return classes[:start] + (("every", last),)


def batch_innermost(groups, moved):
    """Reorders the members of loop nests whose outermost loop runs over a batch (the samples of
    micrograd's demo: every parameter operand the same along it) so that this loop becomes the
    innermost, and with it the results' layout: the samples of a value then sit side by side,
    and a loop over them (a layer applied to the whole batch) is one the C compiler vectorises.
    Not a nest that a dot reads as one factor list at a constant stride that the move would
    scatter (microgpt's first position: its heads' outputs, one list of the output projection,
    which then reads them at a constant stride, as a product, not through a table of offsets).
    Each group moves once (`moved`: their ids). Returns whether any group changed; `layout` and
    `vectorize` must then run again."""
    movable = [g for g in groups if len(g.shape) >= 2 and g.shape[0] >= 4 and not g.family and id(g) not in moved
               and _params_constant_along_outer(g)]
    orders = {id(g): np.arange(len(g.members)).reshape(g.shape).transpose([*range(1, len(g.shape)), 0]).ravel()
              for g in movable}
    scattered = _lists_scattered(groups, movable, orders)
    for g in movable:
        if id(g) not in scattered:
            g.members = [g.members[i] for i in orders[id(g)]]
            moved.add(id(g))
    return len(scattered) < len(movable)


def _lists_scattered(groups, movable, orders):
    """The ids of the movable groups that some dot reads as one factor list whose members sit at
    a constant stride now and would not after the move (`orders`: each one's new member order)."""
    where = {id(n): (id(g), i) for g in movable for i, n in enumerate(g.members)}
    moved_to = {gid: np.argsort(order) for gid, order in orders.items()}
    scattered = set()
    for g in groups:
        if g.first.kind != DOT:
            continue
        for factors in (g.first.a, g.first.b):
            found = [where.get(id(x)) for x in factors]
            if len(found) < 2 or None in found or len({gid for gid, _ in found}) > 1:
                continue
            gid = found[0][0]
            now = [i for _, i in found]
            if progression(now) is not None and progression(moved_to[gid][now].tolist()) is None:
                scattered.add(gid)
    return scattered


def _params_constant_along_outer(g):
    first, ops = g.first, g.operands
    if first.kind == OP:
        slots = [a for a, x in zip(ops.args, first.args) if x.kind == PARAM]
    else:
        terms = [first.args[i] for i in ops.term_positions]
        slots = [v.start for v, xs in ((ops.terms, terms), (ops.a, first.a), (ops.b, first.b))
                 if v is not None and any(x.kind == PARAM for x in xs)]
    return all(a.strides[0] == 0 for a in slots)


def vectorize(groups, n_slots):
    """Describes every group's operands (group.operands, group.shape); a group whose operands are
    not at constant strides is split into single nodes. Constants that a loop reads get slots
    from n_slots on. Returns (groups, constants as (slot, value), slot count)."""
    constants = []
    result = []
    for whole in groups:
        members = whole.members
        if len(members) == 1:  # (an irregular graph's common case, at once: _describe_part's last way)
            node = members[0]
            if node.kind == DOT:
                n_slots = _slot_factor_constants(whole, constants, n_slots)
            elif node.op.selects:
                n_slots = _slot_gathered_constants(whole, constants, n_slots)
            single = Group(members)
            _describe_single(single)
            result.append(single)
            continue
        parts = []
        for g in _uniform_parts(whole):
            n_slots = _describe_part(g, parts, constants, n_slots)
        result += _families(parts)
    return result, constants, n_slots


def _describe_part(g, result, constants, n_slots):
    """vectorize for one group of members with operand lists of one length: its loop nest, its
    rectangular parts, or its single statements, appended to `result`. Returns the slot count."""
    if g.first.kind == DOT:
        n_slots = _slot_factor_constants(g, constants, n_slots)
    elif g.first.op.selects:
        n_slots = _slot_gathered_constants(g, constants, n_slots)
    if len(g.members) > 1:
        literals, n_slots = _slot_varying_constants(g, constants, n_slots)
        if _describe_loop(g, literals):
            result.append(g)
            return n_slots
        if g.first.kind == DOT:  # a shared constant in a list whose other elements move
            n_slots, retry = _slot_factor_constants(g, constants, n_slots, columns=True)
            if retry and _describe_loop(g, literals):
                result.append(g)
                return n_slots
        if _in_operand_order(g) and _describe_loop(g, literals):
            result.append(g)
            return n_slots
        parts = _rectangular_parts(g, literals)
        if parts:
            result += parts
            return n_slots
    for m in g.members:  # straight-line, one statement per node (vectorize takes a group of one at once)
        part = type(g)([m])
        _describe_single(part)
        result.append(part)
    return n_slots


# Parts of one class that are alike but for where they start and how far they run become one loop
# nest from this many on.
MIN_FAMILY = 3


def _families(parts):
    """The loop nests of one class (in order), with runs of MIN_FAMILY or more consecutive
    parts that differ only in where they start (quadratically in the part's number k at most),
    in extents and operand-list lengths (linearly in k) as one loop nest, a family: a causal
    attention's triangle, position t's loop nest over heads and its t + 1 keys, is then one
    nest over positions, heads and keys, the keys' loop growing with the position (Extent),
    instead of a loop nest per position. Its loops run in the parts' order, members too."""
    result, run = [], []

    def close():
        family = _family(run) if len(run) >= MIN_FAMILY else None
        result.extend([family] if family else run)

    whole = _family(parts) if len(parts) >= MIN_FAMILY else None  # (the common case: at once)
    if whole is not None:
        return [whole]
    for part in parts:
        if run and (not part.shape or _family(run + [part]) is None):
            close()
            run = []
        run.append(part)
    close()
    return result


def _fit(values, quadratic=False):
    """(c0, c1, c2) with values[k] == c0 + c1 * k + c2 * k * (k - 1) / 2 for every k (c2 == 0
    unless quadratic), or None."""
    c0 = values[0]
    c1 = values[1] - c0 if len(values) > 1 else 0
    c2 = values[2] - 2 * values[1] + c0 if quadratic and len(values) > 2 else 0
    if any(v != c0 + c1 * k + c2 * (k * (k - 1) // 2) for k, v in enumerate(values)):
        return None
    return c0, c1, c2


def _family(parts):
    """The family of `parts` (see _families): a Group whose loop nest is one loop over the
    parts (i0) around the parts' loops; None if they are not alike enough. Only loop nests that
    read no parameter (whose gradients the optimizers may place elsewhere) and whose lists are
    prefixes of the longest, each needing gradients throughout or not at all."""
    first, m = parts[0], len(parts)
    if (not first.shape or first.family or any(len(p.shape) != len(first.shape) for p in parts)
            or any(x.kind == PARAM for p in parts for x in p.first.reads())):
        return None
    shape = [Parts(m)]
    for d in range(len(first.shape)):
        c = _fit([p.shape[d] for p in parts])
        if c is None or c[0] < 1 or c[0] + c[1] * (m - 1) < 1:
            return None
        shape.append(c[0] if not c[1] else Extent(c[0], c[1], m))

    def affine(xs):
        if any(len(a.strides) != len(xs[0].strides) or a.grad_base is not None or a.tri for a in xs):
            return None
        strides = []
        for d in range(len(xs[0].strides)):
            c = _fit([a.strides[d] for a in xs])
            if c is None or any(isinstance(a.strides[d], Extent) for a in xs):
                return None
            strides.append(c[0] if not c[1] else Extent(c[0], c[1], m))
        c = _fit([a.base for a in xs], quadratic=True)
        return None if c is None else Affine(c[0], (c[1], *strides), None, c[2])

    def vector(vs):  # (the family's Vector or None, whether it fits)
        if all(v is None for v in vs):
            return None, True
        if any(v is None for v in vs):
            return None, False
        longest = max(vs, key=lambda v: len(v.offsets)).offsets
        start, c = affine([v.start for v in vs]), _fit([len(v.offsets) for v in vs])
        if start is None or c is None or any(v.offsets != longest[:len(v.offsets)] for v in vs):
            return None, False
        return Vector(start, longest, Extent(c[0], c[1], m) if c[1] else None), True

    ops = [p.operands for p in parts]
    out = affine([o.out for o in ops])
    if out is None:
        return None
    node = first.first
    if node.kind == OP:
        if len({len(o.args) for o in ops}) != 1 and not node.op.selects:
            return None
        lead = node.op.first_choice if node.op.selects else len(ops[0].args)
        args = []
        for i in range(lead):
            column = [o.args[i] for o in ops]
            if isinstance(column[0], float):
                if any(c != column[0] for c in column):
                    return None
                args.append(column[0])
            else:
                a = affine(column) if all(isinstance(c, Affine) for c in column) else None
                if a is None:
                    return None
                args.append(a)
        choices = None
        if node.op.selects:  # the candidates: evenly spaced in every part, a growing list
            candidates = [Vector(o.args[lead], tuple(a.base - o.args[lead].base for a in o.args[lead:]))
                          if all(isinstance(a, Affine) and a.strides == o.args[lead].strides for a in o.args[lead:])
                          else None for o in ops]
            if any(v is None for v in candidates):
                return None
            listed, fits = vector(candidates)
            if (not fits or len(listed.offsets) < 2
                    or listed.offsets != tuple(listed.offsets[1] * k for k in range(len(listed.offsets)))):
                return None
            args += [dataclasses.replace(listed.start, base=listed.start.base + o) for o in listed.offsets]
            choices = listed.length
        if not _same_needs([(p.first.args[:lead], p.first.args[lead:]) for p in parts], [False, True]):
            return None
        family = Group([m for p in parts for m in p.members], tuple(shape))
        family.operands = Operands(out, tuple(args), choices=choices)
        return family
    if len({o.constants for o in ops}) != 1:
        return None
    vectors = []
    for which in ("terms", "a", "b"):
        v, fits = vector([getattr(o, which) for o in ops])
        if not fits:
            v = _same_constants(parts, which, len(shape))
            if v is None:
                return None
        vectors.append(v)
    if not _same_needs([(_terms(p.first, p.operands), p.first.a, p.first.b) for p in parts],
                       [v is not None and v.length is not None for v in vectors]):
        return None
    family = Group([m for p in parts for m in p.members], tuple(shape))
    family.operands = Operands(out, (), ops[0].constants, ops[0].term_positions, *vectors)
    return family


def _same_constants(parts, which, depth):
    """A factor list of constants, the same values in every member (a subtraction's -1 that
    vectorize gave a slot per member, see _slot_factor_constants' columns), read from the first
    member's slots in every pass: a Vector over a loop nest `depth` deep, or None."""
    lists = [getattr(m, which) for p in parts for m in p.members]
    first = lists[0]
    if (which == "terms" or not first or any(x.kind != CONST or x.slot is None for x in first)
            or any(len(xs) != len(first) or any(y.kind != CONST or y.value != x.value for x, y in zip(first, xs))
                   for xs in lists)):
        return None
    return Vector(Affine(first[0].slot, (0,) * depth), tuple(x.slot - first[0].slot for x in first))


def _same_needs(lists, growing):
    """Whether every part's operands need gradients where the first's do (backward writes them
    all as the first's), a growing list's throughout or nowhere. lists: per part, its operand
    lists; growing: per list, whether it grows."""
    keys = {tuple(frozenset(flags) if grows else flags for flags, grows in
                  zip((tuple(x.needs_grad for x in xs) for xs in part_lists), growing)) for part_lists in lists}
    return len(keys) == 1 and all(len(k) <= 1 for k in keys.pop() if isinstance(k, frozenset))


def _terms(node, operands):
    return [node.args[i] for i in operands.term_positions]




def _in_operand_order(g):
    """Reorders a group's members by where their operands live (the first of each list), and
    their results' slots with them (the group's own block, which the groups above have not read
    yet): members met in an order of their own (a depth-first walk meets a transformer's query
    and key projections interleaved, position by position) may then sit at constant strides.
    Returns whether the order changed."""
    ordered = sorted(g.members, key=_operand_key)  # (stable: ties keep their order)
    if ordered == g.members:
        return False
    slots = sorted(m.slot for m in g.members)
    for m, slot in zip(ordered, slots):
        m.slot = m.grad_slot = slot
    g.members = ordered
    return True


def _uniform_parts(g):
    """The group, or its parts whose members' operand lists have one length each (a class of
    lists of any length, see _classes), in order of their first member."""
    def lengths(m):
        return (len(m.args), len(m.a), len(m.b))
    first = lengths(g.first)
    if all(lengths(m) == first for m in g.members):
        return [g]
    parts = {}
    for m in g.members:
        parts.setdefault(lengths(m), []).append(m)
    return [type(g)(members) for members in parts.values()]


def _operand_key(m):
    """Where a member's operands live: the slot of each argument (-1 for a literal), of a dot
    the first of each list."""
    firsts = (m.args[:1], m.a[:1], m.b[:1]) if m.kind == DOT else (m.args,)
    return tuple(-1 if x.slot is None else x.slot for xs in firsts for x in xs)


# A group splits into rectangular parts only if they are this many times fewer than its members.
MIN_MEMBERS_PER_PART = 4


def _rectangular_parts(g, literals):
    """A group whose members form no rectangle (a causal attention's triangle of query-key dots:
    position t reads t + 1 keys) as rectangular parts, each one loop nest: the members in runs
    along which every operand moves by one step, the runs of one length together (position t's
    dots over every head). None when some part does not fit, or the parts are too many."""
    rows = np.array([(m.slot,) + _operand_key(m) for m in g.members], dtype=np.int64)
    steps = np.diff(rows, axis=0)
    distinct, counts = np.unique(steps, axis=0, return_counts=True)
    inner = distinct[np.argmax(counts)]  # the step along a run: the most common one
    ends = np.flatnonzero((steps != inner).any(axis=1)) + 1  # where a run ends
    runs = list(zip([0, *ends.tolist()], [*ends.tolist(), len(rows)]))
    by_length = {}
    for lo, hi in runs:
        by_length.setdefault(hi - lo, []).extend(g.members[lo:hi])
    if len(by_length) * MIN_MEMBERS_PER_PART > len(g.members):
        return None
    parts = []
    for members in by_length.values():
        part = type(g)(members)
        if not _describe_loop(part, literals):
            return None
        parts.append(part)
    return parts


def _slot_varying_constants(g, constants, n_slots):
    """A constant operand that differs between members is read from a slot; one that is the same
    everywhere stays a literal. Returns (the positions in args of literals, slot count)."""
    literals = set()
    slotted = g.first.op.first_choice if g.first.kind == OP and g.first.op.selects else len(g.first.args)
    for position, x in enumerate(g.first.args):
        if x.kind != CONST or position >= slotted:  # (candidates have slots already)
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
    """An op that selects (a gather, a maximum) reads the operand it picks at an offset from the
    first candidate's slot (codegen/write/statements.py's _picked): its constant candidates get slots
    too, side by side."""
    first = g.first.op.first_choice
    for m in g.members:
        for c in m.args[first:]:
            if c.kind == CONST and c.slot is None:
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
            if x.kind != CONST:
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


def _describe_single(g):
    """One node: every operand at a fixed slot; constants as literals."""
    node = g.members[0]
    g.shape = ()
    out = Affine(node.slot, (), node.grad_slot)
    if node.kind == OP:
        slotted = node.op.first_choice if node.op.selects else len(node.args)  # (see _slot_gathered_constants)
        g.operands = Operands(out, tuple([float(x.value) if x.kind == CONST and i < slotted else Affine(x.slot, (), x.grad_slot)
                                          for i, x in enumerate(node.args)]))
        return
    constants = tuple([float(x.value) for x in node.args if x.kind == CONST])
    positions = tuple([i for i, x in enumerate(node.args) if x.kind != CONST])
    terms = [node.args[i] for i in positions]
    g.operands = Operands(out, (), constants, positions, *(_single_vector(xs) for xs in (terms, node.a, node.b)))


def _single_vector(nodes):
    if not nodes:
        return None
    start = nodes[0].slot
    return Vector(Affine(start, (), nodes[0].grad_slot), tuple([x.slot - start for x in nodes]))


def _describe_loop(g, literals):
    """Sets g.shape and g.operands if every operand is affine in the loop indices."""
    first = g.first
    literal = [i in literals for i in range(len(first.args))]
    columns = [[m.slot for m in g.members]]
    if first.kind == OP:
        for i, is_lit in enumerate(literal):
            if not is_lit:
                columns.append([m.args[i].slot for m in g.members])
    else:
        patterns = []
        terms = (list(map(_args, g.members)) if not literals else
                 [[x for i, x in enumerate(m.args) if i not in literals] for m in g.members])
        for lists in (terms, list(map(_a, g.members)), list(map(_b, g.members))):  # (the lists of _lists)
            if not lists[0]:
                patterns.append(None)
                continue
            width = len(lists[0])
            if set(map(len, lists)) != {width}:
                return False
            # each distinct list once (ir.build_nodes makes the lists alike one tuple: a weight row,
            # a position's activations, read by many dots), then a row per member
            distinct = {}
            which = np.fromiter(map(distinct.setdefault, map(id, lists), count()), dtype=np.int64, count=len(lists))
            unique = [lists[i] for i in distinct.values()]
            slots = np.fromiter(map(_slot, chain.from_iterable(unique)), dtype=np.int64,  # list x position
                                count=width * len(unique)).reshape(len(unique), width)
            offsets = slots - slots[:, :1]
            if not (offsets == offsets[0]).all():
                return False
            patterns.append(tuple(offsets[0].tolist()))
            columns.append(slots[np.searchsorted(list(distinct.values()), which), 0].tolist())
    found = decompose(np.array(columns, dtype=np.int64).T)
    if found is None:
        return False
    shape, strides = found
    affines = [Affine(int(c[0]), tuple(int(s) for s in row)) for c, row in zip(columns, strides)]
    out, rest = affines[0], affines[1:]
    if first.kind == OP and first.op.selects and \
            len({a.strides for a in rest[len(rest) - len(first.args) + first.op.first_choice:]}) > 1:
        return False  # the candidates must keep their offsets from the first in every member
    g.shape = shape
    if first.kind == OP:
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
