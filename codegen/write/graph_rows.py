"""The first tier's program (codegen/tiers.py): the user's graph as read (codegen/lower/graph.py)
run as rows of the table form (laid out as codegen/write/table.py says, run by templates/table.c), a row
per computed Value: no lowering, no grouping, no list scheduling. On a random graph of 100,000
Values the lowering and the table plan take seconds of Python; these rows are made by array
operations over the graph (a Python step per engine.Dot and per gather, and three walks over the
nodes, in the C walker where it builds), so that compile(tiered=...) hands back a module that
trains at once while the optimised build lowers the graph and compiles it in the background.

    program, plan = graph_rows.plan(graph, input_grads=False, walker=walker.module())
    sources = emit.emit(program, "nn", table=plan)          # what codegen.first_tier returns

A row computes a Value as the straight-line C does (the op table's formulas, rendered by the
table's `case`s); an engine.Dot's parts are summed by dot rows of at most table.DOT_SIZES[-1]
parts, a longer one's rows each adding the one before as a term: the lowered program's sums
(find_sums' dots, the kernels' lanes) add the same parts in another order, so the two tiers
agree within the fused bound (docs/compiler.md, Equivalence). Forward, the rows go by their
Value's depth (one more than its deepest operand's), then by kind: a depth's rows read none of
each other, so that its rows of a kind are one run and the processor overlaps their latencies.
Backward, the coefficient rows of the ops whose local derivatives are formulas, then an edge per
contribution (g[target] += d[coefficient] * g[out]) and the selects' rows, deepest Values first
(every contribution to a gradient comes from a deeper Value); only Values on a path to the loss
from a parameter (or an input, with input_grads) have rows there.

Slots: the parameters, the inputs (as in every program: the state a switch of tiers moves), each
computed Value in the graph's order, the constant leaves, the constants the rows read (1, -0 for
a dot's padding, each op's k), then the coefficient slots, the partial sums of long dots and one
scratch slot (a local derivative nothing reads).
"""

import numpy as np

from micrograd_c import ops
from micrograd_c.engine import Dot

from ..lower import ir
from ..lower.types import LEAF_KINDS, OP, Program, Role
from . import table as tables

_MAX = tables.CHEAP_OPS.index("max")
_PARTS = tables.DOT_SIZES[-1]


class _At:
    """A root's place (what contract.Layout reads of a program's loss and outputs)."""

    def __init__(self, slot):
        self.slot = slot


def plan(graph, input_grads=False, walker=None):
    """(Program, table.Plan) of the graph read with codegen.lower.graph.read: a program with no
    compiled group, whose passes are one table call each over the rows. walker: codegen/walker.py's
    module (its walks at C speed), or None (Python's)."""
    n, codes = graph.n, graph.codes.astype(np.int64)
    starts, kids = graph.starts, graph.kids
    n_params, n_inputs = len(graph.params), len(graph.inputs)
    leaf = codes == 0
    computed = np.flatnonzero(~leaf)
    constant_leaves = np.flatnonzero(leaf & (graph.role == Role.CONST))
    slot = np.full(n, -1, dtype=np.int64)
    for positions, base in ((graph.params, 0), (graph.inputs, n_params)):
        reached = np.flatnonzero(positions >= 0)
        slot[positions[reached]] = base + reached
    slot[computed] = n_params + n_inputs + np.arange(len(computed))
    slot[constant_leaves] = n_params + n_inputs + len(computed) + np.arange(len(constant_leaves))
    slots = _Slots(n_params + n_inputs + len(computed),
                   list(zip(slot[constant_leaves].tolist(), graph.values[constant_leaves].tolist())))

    facts = tables.OpFacts.table()
    op_of = [None] + list(graph.op_table)
    k_of = np.zeros(n)
    k_of[graph.k_positions] = [float(k) for k in graph.k_values]
    # every constant a row reads, before the coefficient slots are numbered after them
    slots.constant(1.0), slots.constant(-0.0)
    of_code = codes[computed]
    nodes_of = {code: computed[of_code == code]
                for code in np.flatnonzero(np.bincount(of_code, minlength=len(op_of))).tolist()}
    for code, nodes in nodes_of.items():
        op = op_of[code]
        if op is Dot:
            continue
        fact = facts[op.name]
        if fact.as_max:
            slots.constant(tables.CHEAP_AS_MAX[op.name])
        if fact.has_k:
            for k in sorted(set(k_of[nodes].tolist())):
                slots.constant(k)
    slots.close_constants()

    needs = _needs_gradient(graph, computed, input_grads, walker)
    on_path = needs & _reaches(graph, computed, graph.roots[-1], walker)
    forward = _Rows()
    backward = _Rows()
    coefficients = {}  # kind -> list of row arrays (one run each)
    index_reads = []
    for code, nodes in nodes_of.items():
        op = op_of[code]
        if op is Dot:
            _dots(graph, nodes, slot, slots, needs, on_path, forward, backward)
            continue
        fact = facts[op.name]
        if op.selects:
            for i in nodes.tolist():
                args = slot[kids[starts[i]:starts[i + 1]]].tolist()
                if op.selects == "index":
                    index = int(kids[starts[i]])
                    index_reads.append((LEAF_KINDS[graph.role[index]] if leaf[index] else OP,
                                        args[0] - n_params, len(args) - 1))
                row = [len(args) - op.first_choice, *args, int(slot[i])]
                if op.selects == "largest" and len(args) == 2:  # a maximum of two: max's row forward
                    forward.add(i, tables.CHEAP, [_MAX, args[0], args[1], int(slot[i])])
                else:
                    forward.add(i, fact.kind, row)
                if on_path[i] and needs[kids[starts[i] + op.first_choice:starts[i + 1]]].any():
                    backward.add(-i, fact.kind, row)
            continue
        args = [slot[kids[starts[nodes] + j]] for j in range(op.arity)]
        out = slot[nodes]
        k = [slots.constants_of(k_of[nodes])] if fact.has_k else []
        if fact.cheap is not None:
            which = np.full(len(nodes), _MAX if fact.as_max else fact.cheap)
            b = (np.full(len(nodes), slots.constant(tables.CHEAP_AS_MAX[op.name])) if fact.as_max
                 else args[1] if op.arity == 2 else args[0])
            forward.add_many(nodes, tables.CHEAP, np.stack([which, args[0], b, out], axis=1))
        else:
            forward.add_many(nodes, fact.kind, np.stack([*args, *k, out], axis=1))
        # backward: the coefficient rows, then an edge per argument that needs a gradient
        stepped = on_path[nodes]
        nodes, args, out, k = nodes[stepped], [a[stepped] for a in args], out[stepped], [x[stepped] for x in k]
        needed = [needs[kids[starts[nodes] + j]] for j in range(op.arity)]
        filled = {}
        for i in fact.computed:
            filled[i] = np.where(needed[i], slots.coefficients(len(nodes)), slots.scratch)
        if fact.computed and len(nodes):
            coefficients.setdefault(fact.kind, []).append(
                np.stack([*args, *k, out, *(filled[i] for i in fact.computed)], axis=1))
        for j in range(op.arity):
            where = fact.coefficient[j]
            coefficient = (np.full(len(nodes), slots.constant(1.0)) if where == "1"
                           else k[0] if where == "k" else filled[j] if where is None
                           else out if where == "out" else args[0] if where == "a" else args[-1])
            chosen = needed[j]
            backward.add_many(-nodes[chosen], tables.EDGE,
                              np.stack([coefficient[chosen], out[chosen], args[j][chosen]], axis=1), order=j)

    n_outputs = graph.n_output_values
    depth = _depths(graph, computed, walker)
    segments = [("forward_outputs", False, forward.encode(lambda keys: keys < n_outputs, depth)),
                ("forward_rest", False, forward.encode(lambda keys: keys >= n_outputs, depth)),
                ("backward", True, backward.encode(lambda keys: keys < 0, depth,
                                                   first=sorted(coefficients.items())))]
    words, passes = [], {}
    for name, is_backward, segment in segments:
        passes[name] = [tables.TableCall(is_backward, sum(map(len, words)))] if segment is not None else []
        words += [segment] if segment is not None else []
    program = Program(n_params=n_params, n_inputs=n_inputs, n_slots=slots.n_slots,
                      loss=_At(int(slot[graph.roots[-1]])), outputs=[_At(int(s)) for s in slot[graph.roots[:-1]]],
                      forward=[], n_output_groups=0, constants=slots.constants, fused=True,
                      index_inputs=ir.fewest_indices(index_reads))
    encoded = np.concatenate(words or [np.zeros(0, dtype=np.int64)]).astype(np.int32)
    coefficient_rows = sum(len(rows) for parts in coefficients.values() for rows in parts)
    return program, tables.Plan(program, passes, encoded, rows=forward.count + backward.count + coefficient_rows,
                                runs=sum(int(segment[0]) for segment in words))


def _needs_gradient(graph, computed, input_grads, walker):
    """Per node: whether it is a parameter (an input, with input_grads) or reads one, at any depth."""
    flags = np.zeros(graph.n, dtype=np.uint8)
    flags[graph.params[graph.params >= 0]] = 1
    if input_grads:
        flags[graph.inputs[graph.inputs >= 0]] = 1
    return _spread(graph, computed, flags, False, walker)


def _reaches(graph, computed, root, walker):
    """Per node: whether the root reads it, at any depth (the root itself too)."""
    flags = np.zeros(graph.n, dtype=np.uint8)
    flags[root] = 1
    return _spread(graph, computed, flags, True, walker)


def _depths(graph, computed, walker):
    """Per node: 0 for a leaf, else one more than its deepest child's."""
    depth = np.zeros(graph.n, dtype=np.int64)
    if walker is not None:
        walker.depths(graph.starts, graph.kids, computed, depth)
        return depth
    of, starts, kids = depth.tolist(), graph.starts.tolist(), graph.kids.tolist()
    get = of.__getitem__
    for i in computed.tolist():
        of[i] = 1 + max(map(get, kids[starts[i]:starts[i + 1]]), default=-1)
    return np.array(of, dtype=np.int64)


def _spread(graph, computed, flags, down, walker):
    """The marks spread along the edges over the computed nodes (the walker's reach, or Python's
    loops): up (down false), a node reading a marked one is marked; down, what a marked node reads."""
    if walker is not None:
        walker.reach(graph.starts, graph.kids, computed, flags, down)
        return flags.view(bool)
    marks, starts, kids = flags.tolist(), graph.starts.tolist(), graph.kids.tolist()
    if down:
        for i in reversed(computed.tolist()):
            if marks[i]:
                for c in kids[starts[i]:starts[i + 1]]:
                    marks[c] = 1
    else:
        get = marks.__getitem__
        for i in computed.tolist():  # (children first)
            if any(map(get, kids[starts[i]:starts[i + 1]])):
                marks[i] = 1
    return np.array(marks, dtype=bool)


def _dots(graph, nodes, slot, slots, needs, on_path, forward, backward):
    """The engine.Dots' rows (see _dot): those longer than a row one by one, the others by arrays,
    a block per count of parts (microgpt's 2,736 Dots took 0.3 s one by one)."""
    starts, kids = graph.starts, graph.kids
    counts = starts[nodes + 1] - starts[nodes]  # 1 + 2 * products
    first = kids[starts[nodes]]
    dropped = ((counts > 1) & (graph.codes[first] == 0) & (graph.role[first] == Role.CONST)
               & (graph.values[first] == 0) & ~np.signbit(graph.values[first]))
    parts = (counts - 1) // 2 + ~dropped
    long = parts > _PARTS
    for i, drop in zip(nodes[long].tolist(), dropped[long].tolist()):
        _dot(graph, i, drop, slot, slots, needs, on_path[i], forward, backward)
    one, zero = slots.constant(1.0), slots.constant(-0.0)
    short = ~long
    for count, drop in sorted(set(zip(counts[short].tolist(), dropped[short].tolist()))):
        group = nodes[short & (counts == count) & (dropped == drop)]
        terms = kids[starts[group][:, None] + np.arange(count)]
        start, a, b = terms[:, :1 - drop], terms[:, 1::2], terms[:, 2::2]
        xs = np.concatenate([np.full(start.shape, one), slot[a]], axis=1)
        ys = np.concatenate([slot[start], slot[b]], axis=1)
        size = tables.DOT_SIZE_OF[xs.shape[1]]
        pad = (len(group), size - xs.shape[1])
        forward.add_many(group, tables.DOT_KINDS[size],
                         np.concatenate([xs, np.full(pad, zero), ys, np.full(pad, one), slot[group][:, None]], axis=1))
        stepped = on_path[group]
        _dot_edges(group[stepped], start[stepped], a[stepped], b[stepped], slot, needs, one, backward)


def _dot_edges(group, start, a, b, slot, needs, one, backward):
    """The backward edges of Dots (their terms: rows of start, a, b), from each Dot's gradient: an
    edge per part whose factor needs a gradient, in the straight-line C's order (the start's, each
    b's, each a's)."""
    needed = np.concatenate([needs[start], needs[b], needs[a]], axis=1)
    coefficient = np.concatenate([np.full(start.shape, one), slot[a], slot[b]], axis=1)[needed]
    target = np.concatenate([slot[start], slot[b], slot[a]], axis=1)[needed]
    per_node = needed.sum(axis=1)
    backward.add_many(-np.repeat(group, per_node), tables.EDGE,
                      np.stack([coefficient, np.repeat(slot[group], per_node), target], axis=1))


def _dot(graph, i, drop, slot, slots, needs, stepped, forward, backward):
    """An engine.Dot's rows: its start (a term, 1 * start; not when `drop`: a +0.0 start before
    products, which the lowering drops as sum()'s) and its products, DOT_SIZES[-1] parts a row,
    each row after the first adding the one before (a slot of its own) as a term; backward, its
    edges (_dot_edges), all from the Dot's gradient."""
    terms = graph.kids[graph.starts[i]:graph.starts[i + 1]]
    start, a, b = terms[:1 - drop], terms[1::2], terms[2::2]
    one, out = slots.constant(1.0), int(slot[i])
    xs = np.concatenate([np.full(len(start), one), slot[a]])
    ys = np.concatenate([slot[start], slot[b]])
    before, at, chunk = None, 0, 0
    while True:
        room = _PARTS - (before is not None)
        x, y = xs[at:at + room], ys[at:at + room]
        if before is not None:
            x, y = np.append(one, x), np.append(before, y)
        at += room
        to = out if at >= len(xs) else slots.partial_sum()
        size = tables.DOT_SIZE_OF[len(x)]
        pad = size - len(x)
        forward.add(i, tables.DOT_KINDS[size], [*x.tolist(), *[slots.constant(-0.0)] * pad,
                                                 *y.tolist(), *[one] * pad, to], order=chunk)
        if to == out:
            break
        before, chunk = to, chunk + 1
    if stepped:
        _dot_edges(np.array([i]), start[None], a[None], b[None], slot, needs, one, backward)


class _Slots(tables.ConstantSlots):
    """The slots after the computed Values': the constant leaves (given), the constants the rows
    read (one per value's bits), then (close_constants) coefficients, partial sums, scratch."""

    def __init__(self, n_slots, constants):
        super().__init__(n_slots + len(constants), constants)
        self.scratch = None

    def constant(self, value):
        n_slots = self.n_slots
        slot = super().constant(value)
        if self.n_slots != n_slots and self.scratch is not None:
            raise AssertionError("a constant after the coefficient slots")
        return slot

    def constants_of(self, values):
        """The constants' slots of an array of values (each one seen already)."""
        return np.array([self.constant(v) for v in values.tolist()], dtype=np.int64)

    def close_constants(self):
        self.scratch = self.n_slots
        self.n_slots += 1

    def coefficients(self, count):
        first = self.n_slots
        self.n_slots += count
        return np.arange(first, first + count, dtype=np.int64)

    def partial_sum(self):
        self.n_slots += 1
        return self.n_slots - 1


class _Rows:
    """One pass's rows, each with a key (its node: forward; minus it, backward) and an order
    among its node's rows (a long dot's rows, each reading the one before), by kind: fixed-width
    blocks (add_many) or single rows (add)."""

    def __init__(self):
        self.blocks = []  # (keys, orders, kind, words: rows x width)
        self.count = 0

    def add(self, key, kind, row, order=0):
        self.add_many(np.array([key]), kind, np.array([row], dtype=np.int64), order)

    def add_many(self, keys, kind, rows, order=0):
        if len(keys):
            self.blocks.append((np.asarray(keys, dtype=np.int64), np.full(len(keys), order, dtype=np.int64), kind,
                                np.asarray(rows, dtype=np.int64)))
            self.count += len(keys)

    def encode(self, keep, depth, first=()):
        """The words of the segment of rows whose keys `keep` takes (a mask of an array of keys), or
        None if none: the runs `first` ((kind, [row arrays]) each: one run per kind), then the rows
        by depth (forward, a node's depth, shallow first; backward, minus it: deep first), by order,
        by kind, by node, a run per stretch of one kind (a segment of codegen/write/table.py: [runs], then
        [kind, count, rows...] each). The rows of a depth read nothing the others write: the runs hold
        many rows, and the processor overlaps their latencies."""
        blocks = [(keys[m], orders[m], kind, rows[m]) for keys, orders, kind, rows in self.blocks
                  if (m := keep(keys)).any()]
        head = [len(first)]
        for kind, parts in first:
            rows = np.concatenate(parts)
            head += [kind, len(rows), *rows.ravel().tolist()]
        if not blocks:
            return np.array(head, dtype=np.int64) if first else None
        keys = np.concatenate([b[0] for b in blocks])
        orders = np.concatenate([b[1] for b in blocks])
        block_of = np.repeat(np.arange(len(blocks)), [len(b[0]) for b in blocks])
        kind_of = np.array([b[2] for b in blocks], dtype=np.int64)[block_of]
        rank = np.where(keys >= 0, depth[np.abs(keys)], -depth[np.abs(keys)])
        order = np.lexsort((np.arange(len(keys)), keys, kind_of, orders, rank))
        kinds = kind_of[order]
        widths = np.array([b[3].shape[1] for b in blocks], dtype=np.int64)[block_of[order]]
        run = np.ones(len(order), dtype=bool)
        run[1:] = kinds[1:] != kinds[:-1]
        sizes = widths + 2 * run
        at = len(head) + np.concatenate([[0], np.cumsum(sizes)[:-1]])  # a row's header, or its words
        words = np.empty(len(head) + int(sizes.sum()), dtype=np.int64)
        words[:len(head)] = head
        words[at[run]] = kinds[run]
        words[at[run] + 1] = np.diff(np.append(np.flatnonzero(run), len(order)))
        words[0] += int(run.sum())
        place = np.empty(len(order), dtype=np.int64)
        place[order] = at + 2 * run  # where each row, in the blocks' order, goes
        offset = 0
        for _, _, _, rows in blocks:
            count, width = rows.shape
            words[place[offset:offset + count, None] + np.arange(width)] = rows
            offset += count
        return words
