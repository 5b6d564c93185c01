"""The table form of a program's single statements: instead of one C statement per node (what an
optimising compiler reads in time that grows with the graph), rows of (op, operand slots, result
slot) that loops in the module runtime run (templates/table.c, compiled once per compiler, flags
and dtype, like the rest of the runtime). A model that is mostly single statements (an irregular
graph: bench/irregular.py) then has almost no C of its own; its rows are data, a base64 string in
its unit that the runtime decodes once when the module loads.

    plan = table.plan(program)      # the program with its constants' slots, the rows, the passes
    plan.passes["backward"]         # groups (compiled as before) and TableCalls, in order

The rows are ordered so that the runtime's loops need no switch per row: each pass's rows between
two compiled groups (a segment) are scheduled into runs of one kind (an op of micrograd_c/ops.py,
the cheap ops together, or a dot of a size), a run a tight loop over its rows. Forward, a row is
scheduled after the rows it reads; among the ready rows, the kind of the one with the longest path
after it runs next, taking every ready row of its kind, and those its own rows make ready.
Backward, every contribution to a gradient is a row, an edge: g[target] += d[coefficient] * g[out],
the coefficient the local derivative's slot (an operand's, the value's, the constant 1's, or one
that the segment's coefficient rows fill first from the forward's values, a run per op), so that
every op and dot shares one kind; an edge comes after every contribution to its own gradient and
after the edge before it adding to the same gradient in the straight-line order, so that each
gradient sums its contributions in the same order as the straight-line C. The table computes the
same formulas (the op table's, rendered as the emitter renders them), the same products and sums
(a dot's parts in the emitter's tree, loops.tree_sum; a contribution as the local derivative
times the gradient), the same bits (tests/test_table.py; an FMA contraction by the compiler, with
native=True, could change one), but for the ops with a row kernel (ROW_KERNELS). Within a run,
rows go by their depth in the graph (_by_depth): a row far from the rows it waits for, so that
the processor overlaps their latencies.

A row's layout (int32 words) by kind:
    op, forward     a, [b], [k], out                  (k: the op's constant, from a slot)
    cheap (forward) which, a, b, out                  (which: the op, CHEAP_OPS' position)
    dot, forward    a_0..a_S-1, b_0..b_S-1, out       (S parts, padded: DOT_SIZES)
    gather          n, index, c_0..c_n-1, out         (both passes; the gradient goes to the one picked)
    maximum         n, c_0..c_n-1, out
    op, backward    a, [b], [k], out, c..             (coefficient rows: the local derivatives that are formulas)
    edge (backward) coefficient, out, target
A segment is [number of runs] then each run [kind, count, rows...].
"""

import base64
import heapq
import struct
from itertools import chain
from dataclasses import dataclass, field, replace

import numpy as np

from micrograd_c import ops

from . import dtypes
from .kernels import call
from .loops import UNROLL_MAX_CONTIGUOUS, tree_sum, unrolled
from .tree import Invoke

# The kinds of row (the labelled loops of templates/table.c): forward, CHEAP, the ops that cost a few
# instructions (CHEAP_OPS, and a maximum of two), one kind whose rows say which op, each row
# computing all of them and keeping its own, so that the many short runs of each become fewer,
# longer ones; a dot of DOT_SIZES[i] parts forward; backward, EDGE; then each op of the op table
# (forward its value, backward its coefficients or, selecting, its gradient), OP_BASE + its
# position (op_kind: the table may grow, as the op tests/test_docs.py adds does)
CHEAP_OPS = ("add", "mul", "max")
CHEAP = 0
# CHEAP rows of ops whose formula is `max`'s with b a constant (relu: where(a < 0, 0, a)) are max
# rows reading the constant's slot, as a maximum of two is (largest_in's pick, the first of the
# largest, is max's formula): a select the compiler makes without a branch (maxsd), where
# relu's own formula took one, mispredicted on a graph too big for the predictor to learn (the
# forward was 1.25x this one's on a random 100,000-Value graph)
CHEAP_AS_MAX = {"relu": 0.0}
# A dot row sums its parts in loops.tree_sum's tree, each part a product (a term t as 1 * t, which
# is t), padded with -0 * 1 (-0, which adds nothing to any sum) up to a power of two: a tree over
# 2**k parts is tree_sum's over the first n, then, so the row needs no branch and no count
DOT_SIZES = (2, 4, 8, 16, 32, 64)
DOT_KINDS = {size: CHEAP + 1 + i for i, size in enumerate(DOT_SIZES)}
# Backward, every contribution to a gradient is a row of its own, an edge: g[target] += d[coefficient] *
# g[out], the coefficient the local derivative's slot (an operand's, the constant 1's, or one that a
# coefficient row of the op's kind fills first from the forward's values), one kind for every op
# and dot, so that a segment's edges run as one loop but for its selects' runs (where an edge
# had a kind per op, the step's backward was 1.4x this one's on a random 20,000-Value graph)
EDGE = CHEAP + 1 + len(DOT_SIZES)
OP_BASE = EDGE + 1
# A loop nest of at most this many nodes becomes rows too (an irregular graph's few alike nodes,
# whose tiny loops would each cut the rows around them into segments of their own)
LOOP_MAX_MEMBERS = 8

# An op with a kernel over a row (the op table's row_kernel: exp, tanh, sigmoid) runs a run of its
# rows through the kernel's gathered twin (`gathered`), as a loop of the fused mode runs the
# kernel: four rows' operands a vector (a random 20,000-Value graph's 1,596 tanh rows: libm's
# tanh took 12-15 ns a value, on an Intel Xeon). Their results are then the kernel's (within its
# bound of the C library's function), not the straight-line statement's bits; False runs the op
# table's formula instead (tests/test_table.py compares everything else bit for bit).
ROW_KERNELS = True
# base64 characters per line of the table's text in the C: long lines, so that the rows do not
# count as the many lines of C that tiers.TIERED_MIN_LINES takes for a long optimising build
TEXT_LINE = 2_000


class TableCall:
    """A pass's call of the runtime's table loop over one segment (a marker among a pass's
    statements: the drivers of codegen/write/emit.py call it between the compiled groups' functions)."""

    def __init__(self, backward, offset):
        self.backward, self.offset = backward, offset

    def statement(self):
        """The call, a codegen/write/tree.py statement."""
        return (Invoke("table_backward", (f"table + {self.offset}", "d", "g")) if self.backward
                else Invoke("table_forward", (f"table + {self.offset}", "d")))


@dataclass
class Plan:
    """A program's table form: the program (with slots for the constants rows read and for the
    backward's coefficients; one backward, no batch-1 SGD inside it), per pass ("forward_outputs",
    "forward_rest", "backward") its groups compiled as C and its TableCalls in order, the rows'
    words, and counts for codegen.explain."""
    program: object
    passes: dict
    words: np.ndarray
    rows: int = 0
    runs: int = 0
    compiled: list = field(default_factory=list)  # the groups that stay C (loop nests, long dots)

    def text(self):
        """The words as base64 (little-endian int32), in lines of TEXT_LINE characters."""
        encoded = base64.b64encode(self.words.astype("<i4").tobytes()).decode("ascii")
        return [encoded[i:i + TEXT_LINE] for i in range(0, len(encoded), TEXT_LINE)] or [""]


def single_statements(program):
    """How many groups of the program no loop nest covers."""
    return sum(1 for g in program.forward if not g.shape)


# By default (table=None) a fused program takes the table form when its compiler optimises (gcc,
# clang, zig at -O1 or more) and it is mostly single statements, at least this many: gcc -O2 builds
# such a program's straight-line C in 7-10 s at 7,900 single statements (a random 20,000-Value
# graph) and 40-80 s at 40,000 (100,000 Values), the table form in 0.2-0.4 s, its step
# 1.1-1.3x the straight-line C's there; at 2,000 (5,000 Values) 1.15-1.55x, for a build of
# 3-10 s (docs/speed.md#irregular-graphs-the-table-form)
TABLE_MIN_STATEMENTS = 6_000
MOSTLY = 0.9  # of the forward's groups single statements


def check(table):
    if table not in (None, True, False):
        raise TypeError(f"table must be True, False or None (by the program and compiler), not {table!r}")
    return table


def for_compiler(table, optimises):
    """compile()'s table argument for a compiler that optimises or not (tcc: the table form's step
    is 2.6x tcc's straight-line C's, which tcc builds in 0.1 s): None stays None (the program
    decides, chosen) where it optimises, else becomes False."""
    return False if table is None and not optimises else check(table)


def chosen(program, table):
    """Whether the program takes the table form: True (which needs a fused program) and False as
    asked; None (the default, for an optimising compiler: compile() passes False for the others,
    for_compiler) when the program pays for it (by_default)."""
    if table is None:
        return by_default(program)
    return check_fused(table, program.fused)


def check_fused(table, fused):
    """table, checked, for a fused program or not (compile()'s fuse): table=True needs one."""
    if check(table) and not fused:
        raise ValueError("table=True needs fuse=True: fuse=False is the straight-line scalar C itself")
    return table


def by_default(program):
    """Whether a fused program is mostly single statements (MOSTLY of its forward's groups), at
    least TABLE_MIN_STATEMENTS of them: the table form by default."""
    singles = single_statements(program)
    return program.fused and singles >= TABLE_MIN_STATEMENTS and singles >= MOSTLY * len(program.forward)


def reason(program, table):
    """Why the program takes the form it does (for codegen.explain)."""
    singles = single_statements(program)
    if table is True:
        return "asked for (table=True)"
    if table is False:
        return "table=False: the straight-line C"
    if by_default(program):
        return (f"by default: {singles:,} single statements, at least {TABLE_MIN_STATEMENTS:,} and "
                f"{MOSTLY:.0%} of the program's groups, which an optimising compiler would take seconds to "
                "build as C; table=False for the straight-line C")
    return (f"{singles:,} single statements: the table form by default from {TABLE_MIN_STATEMENTS:,} "
            f"({MOSTLY:.0%} of the program's groups) with an optimising compiler")


def key(table):
    """The table argument as the build cache's structural key records it: None as the rule that
    decides (so that a change of the rule is a new key), and whether the rows run the row kernels."""
    rule = ("by default", TABLE_MIN_STATEMENTS, MOSTLY) if table is None else table
    return rule if table is False else (rule, "row kernels" if ROW_KERNELS else "formulas")


def rowable(g):
    """Whether a group's nodes become rows: a single statement, or a loop nest of at most
    LOOP_MAX_MEMBERS nodes (plain extents); a dot only with lists the straight-line C writes out (longer ones
    call the kernels, which sum in lanes) and at most DOT_SIZES[-1] parts; not a group that a
    sequence's length guards, cuts or masks (codegen/lower/positions.py): the C skips its work."""
    shape, node = g.shape, g.members[0]
    if g.guard is not None or g.masked is not None:
        return False
    if not shape and node.kind != "dot":  # (the common case, at once)
        return True
    if shape and (len(g.members) > LOOP_MAX_MEMBERS or any(type(n) is not int for n in shape)):
        return False  # (a family's, a growing or a cut extent: its own loops)
    if node.kind != "dot":
        return True
    if len(node.args) + len(node.a) > DOT_SIZES[-1]:
        return False
    if not shape:
        ops_ = g.operands
        return (ops_.terms is None or unrolled(ops_.terms)) and (ops_.a is None or unrolled(ops_.a, ops_.b))
    return len(node.args) <= UNROLL_MAX_CONTIGUOUS and len(node.a) <= UNROLL_MAX_CONTIGUOUS


def plan(program):
    """The table form of a fused program (see the module's docstring)."""
    slots = _Slots(program)
    facts = OpFacts.table()
    words, rows, runs = [], 0, 0
    passes, compiled = {}, []
    forward = program.forward
    as_rows = {id(g) for g in forward if rowable(g)}  # (backward's groups are forward's)
    for name, groups, backward in (("forward_outputs", forward[:program.n_output_groups], False),
                                   ("forward_rest", forward[program.n_output_groups:], False),
                                   ("backward", program.backward, True)):
        items, segment = [], []

        def close():
            nonlocal rows, runs
            if segment:
                encoded, n_runs = (_backward_segment if backward else _forward_segment)(segment, slots, facts)
                items.append(TableCall(backward, len(words)))
                words.extend(encoded)
                rows += len(segment)
                runs += n_runs
                segment.clear()
        for g in groups:
            if id(g) in as_rows:
                # (a loop nest's members in its order, backward too: its iterations' order)
                segment.extend(g.members)
                continue
            close()
            items.append(g)
            if not backward:
                compiled.append(g)
        close()
        passes[name] = items
    words = slots.placed(words)
    lowered = replace(program, n_slots=slots.n_slots, constants=program.constants + slots.constants,
                      sgd_in_backward=False, sgd_after_backward=[])
    return Plan(lowered, passes, words, rows, runs, compiled)


class ConstantSlots:
    """Slots for the constants rows read: one per distinct value (its bits), numbered from n_slots
    on; `constants` lists (slot, value), which init_constants writes as one block."""

    def __init__(self, n_slots, constants=()):
        self.n_slots, self.constants = n_slots, list(constants)
        self._by_bits = {}

    def constant(self, value):
        bits = _bits(value)
        slot = self._by_bits.get(bits)
        if slot is None:
            slot = self._by_bits[bits] = self.n_slots
            self.constants.append((slot, value))
            self.n_slots += 1
        return slot


class _Slots(ConstantSlots):
    """Operand slots of rows: a node's slot, or for a constant that has none (the straight-line
    C's literals) one more slot after the program's (constant); and the coefficient slots that
    backward's coefficient rows fill, after the constants: numbered from COEFFICIENTS while
    planning, then moved (placed)."""

    COEFFICIENTS = 1 << 30

    def __init__(self, program):
        super().__init__(program.n_slots)  # (the constants appended to the program's)
        self.n_coefficients = 0
        # where a coefficient row writes the local derivatives nothing reads (an operand that
        # needs no gradient): a slot of its own, never read
        self.scratch = self.coefficient()

    def of(self, node):
        if node.slot is not None:
            return node.slot
        return self.constant(float(node.value))

    def coefficient(self):
        """A new coefficient slot (numbered from COEFFICIENTS until placed)."""
        self.n_coefficients += 1
        return self.COEFFICIENTS + self.n_coefficients - 1

    def placed(self, words):
        """The words with the coefficient slots after the constants; n_slots counting them."""
        words = np.fromiter(words, dtype=np.int64, count=len(words))
        words = np.where(words >= self.COEFFICIENTS, words - self.COEFFICIENTS + self.n_slots, words)
        self.n_slots += self.n_coefficients
        self.n_coefficients = 0
        return words.astype(np.int32)


_bits = struct.Struct("<d").pack


@dataclass(frozen=True)
class OpFacts:
    """What an op's rows are, found once a plan (OpFacts.table(): the op table may grow between
    plans, as a test's op does): its kind (OP_BASE + its position in the table); `cheap`, its
    CHEAP_OPS position when all its rows are CHEAP's, and whether they are max rows reading the
    constant CHEAP_AS_MAX gives it; whether its rows read k; per argument where backward's edge
    finds the local derivative ("1", "k", an operand's or the value's slot "a", "b", "out", or
    None: a coefficient row computes it); the arguments whose coefficients are computed."""
    kind: int
    cheap: int = None
    as_max: bool = False
    has_k: bool = False
    coefficient: tuple = ()
    computed: tuple = ()
    kernel: str = ""  # the row kernel its forward rows go through (ROW_KERNELS)

    @staticmethod
    def table():
        """{op name: OpFacts} of the op table as it is now."""
        facts = {}
        for position, op in enumerate(ops.OPS.values()):
            cheap = (CHEAP_OPS.index("max") if op.name in CHEAP_AS_MAX
                     else CHEAP_OPS.index(op.name) if op.name in CHEAP_OPS else None)
            coefficient = tuple("1" if op.grad_is_one(i) else "k" if op.grads[i].strip() == "{k}"
                                else op.grads[i].strip()[1:-1] if not _computed(op, i) else None
                                for i in range(op.arity))
            facts[op.name] = OpFacts(OP_BASE + position, cheap, op.name in CHEAP_AS_MAX, _has_k(op), coefficient,
                                      tuple(i for i in range(op.arity) if _computed(op, i)), _kernel(op))
        return facts


def _kernel(op):
    """The row kernel an op's forward rows go through, or ""."""
    return op.row_kernel if ROW_KERNELS and op.arity == 1 and not op.selects and not _has_k(op) else ""


def op_kind(op):
    """An op's kind: OP_BASE + its position in the op table."""
    return OP_BASE + list(ops.OPS).index(op.name)


def _dot_size(node):
    return DOT_SIZE_OF[len(node.args) + len(node.a)]


DOT_SIZE_OF = [next(size for size in DOT_SIZES if size >= n) for n in range(DOT_SIZES[-1] + 1)]
_MAX = CHEAP_OPS.index("max")


def _targets(node):
    """The nodes whose gradients a backward row adds to, in the straight-line C's order (an op
    that selects: every candidate, the one picked being known only when the module runs)."""
    if node.kind == "op" and node.op.selects:
        return node.args[node.op.first_choice:]
    if node.kind == "op":
        return tuple(x for x in node.args if x.needs_grad)
    return tuple(x for x in node.args if x.needs_grad) + tuple(x for x in node.b + node.a if x.needs_grad)


def _selects_without_gradient(node):
    """An op that selects among candidates none of which needs a gradient: the straight-line C
    writes no backward statement for it."""
    return node.kind == "op" and node.op.selects and not any(x.needs_grad for x in node.args[node.op.first_choice:])


def _forward_segment(nodes, slots, facts):
    """One forward segment's words (see the module's docstring) and its number of runs. nodes: in
    the straight-line C's order."""
    get = {id(n): i for i, n in enumerate(nodes)}.get
    preds = [[i for i in map(get, map(id, n.args + n.a + n.b)) if i is not None] for n in nodes]
    kinds, rows = [], []
    for n in nodes:
        kind, row = _row(n, slots, facts)
        kinds.append(kind)
        rows.append(row)
    kernel_kinds = {f.kind for f in facts.values() if f.kernel}
    return _encode(_schedule(preds, kinds, kernel_kinds), kinds, rows, [])


def _encode(order, kinds, rows, first):
    """The segment's words and its number of runs: the runs `first` ((kind, rows) each), then the
    rows in `order` (an array), a run per stretch of one kind (kinds: per row, a list or an array)."""
    out = [0]
    for kind, run in first:
        out += [kind, len(run)]
        out.extend(chain.from_iterable(run))
    of_order = np.asarray(kinds, dtype=np.int64)[order]
    starts = np.flatnonzero(np.diff(of_order, prepend=-1)).tolist()
    at = rows.__getitem__
    order, of_order = order.tolist(), of_order.tolist()
    for begin, end in zip(starts, starts[1:] + [len(order)]):
        out += [of_order[begin], end - begin]
        out.extend(chain.from_iterable(map(at, order[begin:end])))
    out[0] = n_runs = len(first) + len(starts)
    return out, n_runs


def _backward_segment(nodes, slots, facts):
    """Backward: first the coefficient rows (a run per op whose local derivatives are formulas,
    reading only the forward's values), then the edges and the rows of ops that select, in phases:
    a row's phase is the most selects on a path to it (a select waits for the rows before it, an
    edge only for them), and phase p is its edges, in the straight-line C's order, then its
    selects (independent of each other), so that the edges run in as few runs as the selects
    allow; then each run's rows by depth (_by_depth)."""
    coefficients = {}  # kind -> rows
    rows, depths = [], []
    after = []  # per row, the phase of the rows that wait for it: its own, one more for a select
    selects = {}  # row -> its kind (every other row is an EDGE)
    last = {}  # gradient slot -> the last row adding to it so far
    get = last.get
    for n in nodes:
        if n.kind == "op" and n.op.selects and not _max_of_two(n):
            if _selects_without_gradient(n):
                continue
            own = get(n.grad_slot)  # the row completing its own gradient
            i, waits = len(rows), [] if own is None else [own]
            for x in _targets(n):
                target = slots.of(x) if x.grad_slot is None else x.grad_slot  # (a constant candidate's: its slot's)
                before = get(target)
                if before is not None and before != i:
                    waits.append(before)
                last[target] = i
            after.append(1 + max([after[u] for u in waits], default=0))
            depths.append(max([depths[u] + 1 for u in waits], default=0))
            selects[i] = facts[n.op.name].kind
            rows.append(_select_row(n, slots))
            continue
        own = get(n.grad_slot)
        phase = depth = 0
        if own is not None:
            phase, depth = after[own], depths[own] + 1
        out = n.slot
        for coefficient, x in _edges(n, slots, coefficients, facts):
            target = x.grad_slot
            before = get(target)
            last[target] = len(rows)
            if before is None:
                after.append(phase)
                depths.append(depth)
            else:
                before_phase, before_depth = after[before], depths[before] + 1
                after.append(phase if phase >= before_phase else before_phase)
                depths.append(depth if depth >= before_depth else before_depth)
            rows.append((coefficient, out, target))
    kind = np.full(len(rows), EDGE, dtype=np.int64)
    kind[list(selects)] = list(selects.values())
    is_edge = kind == EDGE
    order = np.lexsort((kind, ~is_edge, np.asarray(after, dtype=np.int64) - ~is_edge))
    return _encode(_by_depth(order, depths, kind), kind, rows, list(coefficients.items()))


def _edges(node, slots, coefficients, facts):
    """(coefficient slot, operand) of each contribution of a backward row to an operand's gradient,
    in the straight-line C's order; the rows that fill the coefficients go into `coefficients`."""
    args = node.args
    if node.kind == "dot":
        one = slots.constant(1.0)
        of = slots.of
        return ([(one, x) for x in args if x.needs_grad]
                + [(of(a), b) for a, b in zip(node.a, node.b) if b.needs_grad]
                + [(of(b), a) for a, b in zip(node.a, node.b) if a.needs_grad])
    needs = [x.needs_grad for x in args]
    if True not in needs:
        return []
    fact = facts["max" if _max_of_two(node) else node.op.name]
    if fact.computed:
        filled = {i: slots.coefficient() if needs[i] else slots.scratch for i in fact.computed}
        k = [slots.constant(float(node.k))] if fact.has_k else []
        coefficients.setdefault(fact.kind, []).append(
            [*map(slots.of, args), *k, node.slot, *(filled[i] for i in fact.computed)])
    edges = []
    for i, x in enumerate(args):
        if not needs[i]:
            continue
        where = fact.coefficient[i]
        if where == "1":
            coefficient = slots.constant(1.0)
        elif where == "k":
            coefficient = slots.constant(float(node.k))
        elif where is None:
            coefficient = filled[i]
        else:
            coefficient = slots.of(node if where == "out" else args[0] if where == "a" else args[-1])
        edges.append((coefficient, x))
    return edges


def _max_of_two(node):
    """A maximum of two operands, whose backward runs as `max`'s coefficient rows ((a >= b), (a <
    b): the one picked, ties to the first, as the maximum picks) and two edges, one adding 1 * go
    and the other 0 * go, which adds nothing while go is finite, instead of a select row, whose
    kind would cut the backward's edges into runs (a random 20,000-Value graph's 670 maxima: 157
    runs of selects among as many of edges)."""
    return node.kind == "op" and node.op.selects == "largest" and len(node.args) == 2


def _computed(op, i):
    """Whether an op's local derivative in argument i is a formula that a coefficient row computes
    (not 1, nor an operand, the value or the constant k as they are)."""
    return not op.grad_is_one(i) and op.grads[i].strip() not in ("{a}", "{b}", "{out}", "{k}")


def _schedule(preds, kinds, gathered=frozenset()):
    """An order of the rows (a topological order of preds; preds[v] < v) in few runs of one kind,
    each run's rows by their depth in the graph (_by_depth); a run of a kind in `gathered` reads
    none of its own rows' results (_runs)."""
    depths = [0] * len(kinds)
    for v, ps in enumerate(preds):
        if ps:
            depths[v] = 1 + max(map(depths.__getitem__, ps))
    return _by_depth(np.array(_runs(preds, kinds, gathered), dtype=np.int64), depths,
                     np.asarray(kinds, dtype=np.int64))


def _by_depth(order, depths, kinds):
    """The order (an array) with each run's rows sorted by their depth (the longest path to them),
    stably: a row and the rows it waits for far apart, so that the processor overlaps many rows'
    latencies, where a row right after the one it reads waits for it (a gradient stored and
    loaded at once). kinds: an array."""
    run = np.cumsum(np.diff(kinds[order], prepend=-1) != 0)
    return order[np.lexsort((np.asarray(depths, dtype=np.int64)[order], run))]


def _runs(preds, kinds, gathered=frozenset()):
    """A topological order of the rows in few runs of one kind: repeatedly, the kind of the ready
    row with the longest path after it, and every row of that kind ready or made ready by the run
    itself; for a kind in `gathered` (a row kernel's: its run reads every operand before it writes)
    only the rows ready before the run."""
    n = len(kinds)
    succs = [[] for _ in range(n)]
    waiting = [0] * n
    for v, ps in enumerate(preds):
        if ps:
            if len(ps) > 1:
                ps = set(ps)
            waiting[v] = len(ps)
            for u in ps:
                succs[u].append(v)
    height = [0] * n
    for v in range(n - 1, -1, -1):
        ss = succs[v]
        height[v] = 1 + max(map(height.__getitem__, ss)) if ss else 1
    # a ready row as one int, -height * n + row: a heap orders them as it would (-height, row)
    ready = {}  # kind -> heap
    for v in range(n):
        if not waiting[v]:
            heapq.heappush(ready.setdefault(kinds[v], []), v - height[v] * n)
    order = []
    push, pop = heapq.heappush, heapq.heappop
    while len(order) < n:
        kind = min((heap[0] // n, k) for k, heap in ready.items() if heap)[1]
        heap = ready[kind]
        later = [] if kind in gathered else None  # (made ready by this run: for the next one)
        while heap:
            v = pop(heap) % n
            order.append(v)
            for s in succs[v]:
                waiting[s] -= 1
                if not waiting[s]:
                    if later is not None and kinds[s] == kind:
                        later.append(s)
                    else:
                        push(ready.setdefault(kinds[s], []), s - height[s] * n)
        for s in later or ():
            push(heap, s - height[s] * n)
    return order


def _row(node, slots, facts):
    """A forward row: (its kind, its words)."""
    of = slots.of
    if node.kind == "dot":
        return DOT_KINDS[_dot_size(node)], _dot_row(node, slots)
    op, args = node.op, node.args
    fact = facts[op.name]
    if fact.cheap is not None:
        if fact.as_max:
            a = of(args[0])
            return CHEAP, (_MAX, a, slots.constant(CHEAP_AS_MAX[op.name]), node.slot)
        if len(args) == 1:  # (a unary op reads its operand twice)
            a = of(args[0])
            return CHEAP, (fact.cheap, a, a, node.slot)
        a = of(args[0])
        return CHEAP, (fact.cheap, a, of(args[1]), node.slot)
    if op.selects:
        if _max_of_two(node):  # max's row
            a = of(args[0])
            return CHEAP, (_MAX, a, of(args[1]), node.slot)
        return fact.kind, _select_row(node, slots)
    k = [slots.constant(float(node.k))] if fact.has_k else []
    return fact.kind, [*map(of, args), *k, node.slot]


def _select_row(node, slots):
    """A gather's or a maximum's row (both passes): [n, (index,) candidates.., out]."""
    choices = node.args[node.op.first_choice:]
    return [len(choices), *map(slots.of, node.args), node.slot]


def _dot_row(node, slots):
    """A dot's forward row of DOT_SIZES' parts: its terms (1 * t), its products, then -0 * 1."""
    size = _dot_size(node)
    one, zero = slots.constant(1.0), slots.constant(-0.0)
    pad = size - len(node.args) - len(node.a)
    a = [one] * len(node.args) + [slots.of(x) for x in node.a] + [zero] * pad
    b = [slots.of(x) for x in node.args] + [slots.of(x) for x in node.b] + [one] * pad
    return a + b + [node.slot]


def _has_k(op):
    return "{k}" in op.value or any("{k}" in g for g in op.grads)


# ---- the runtime's loops (templates/table.c), generated from the op table once per dtype ----------

def runtime_cases(dtype):
    """The C of the placeholders in templates/table.c for the dtype: per pass (TABLE_FORWARD,
    TABLE_BACKWARD) a labelled loop per kind, the op table's formulas rendered as the emitter
    renders them, over a row's slots, and (TABLE_FORWARD_LABELS, TABLE_BACKWARD_LABELS) the
    labels by kind, `unknown` for a kind the pass has no loop for."""
    dtype = dtypes.lookup(dtype)
    cases = {}
    for forward in (True, False):
        out = []
        for op in ops.OPS.values():
            code = op_kind(op)
            if op.selects:
                out.append(_select_case(op, code, dtype, forward))
            elif forward:
                out.append(_kernel_case(op, code) if _kernel(op) else _op_case(op, code, dtype))
            elif any(_computed(op, i) for i in range(op.arity)):
                out.append(_coefficient_case(op, code, dtype))
        out += [_cheap_case(dtype)] + [_dot_case(size) for size in DOT_SIZES] if forward else [_edge_case()]
        name = "TABLE_FORWARD" if forward else "TABLE_BACKWARD"
        cases[name] = "\n".join(code for _, code in out)
        present = {kind for kind, _ in out}
        cases[name + "_LABELS"] = ", ".join(f"&&kind_{k}" if k in present else "&&unknown"
                                            for k in range(OP_BASE + len(ops.OPS)))
    return cases


def _render(op, dtype, formula, **names):
    return op.render(dtypes.formula(dtype, formula), **names)


def _case(code, name, step, body):
    """(kind, its loop): its rows, `step` words each (or the body moves w itself: step None), then
    the next run (NEXT_RUN)."""
    advance = f", w += {step}" if step else ""
    lines = "".join(f"                {line}\n" for line in body)
    return code, (f"    kind_{code}: /* {name} */\n        for (long r = 0; r < count; r++{advance}) {{\n"
            f"{lines}        }}\n        NEXT_RUN;")


def _op_names(op):
    """The op's operands, k and value in its rows [a, (b), (k), out, ...]."""
    width = op.arity + _has_k(op)
    return width, {"a": "d[w[0]]", "b": "d[w[1]]", "k": f"d[w[{op.arity}]]", "out": f"d[w[{width}]]"}


def _op_case(op, code, dtype):
    """An op's rows forward: [a, (b), (k), out]."""
    width, names = _op_names(op)
    return _case(code, op.name, width + 1, [f"d[w[{width}]] = {_render(op, dtype, op.value, **names)};"])


def _kernel_case(op, code):
    """An op's rows forward through its row kernel's gathered form (`gathered`): [a, out], the
    run's rows in one call (none reads another's result: _runs)."""
    kernel = gathered(op.row_kernel)
    return code, (f"    kind_{code}: /* {op.name}: {kernel} */\n"
                  f"        {call(kernel, d='d', rows='w', n='count')};\n"
                  "        w += 2 * count;\n        NEXT_RUN;")


def gathered(kernel):
    """A row kernel's form over the table's rows (exp_range: exp_gather, in templates/kernels/kernels.h)."""
    return kernel.removesuffix("_range") + "_gather"


def _coefficient_case(op, code, dtype):
    """An op's coefficient rows backward: [a, (b), (k), out, c..], c the slots of its local
    derivatives that are formulas (_computed), each written as the straight-line C's statement
    computes it before multiplying the gradient by it."""
    width, names = _op_names(op)
    computed = [i for i in range(op.arity) if _computed(op, i)]
    body = [f"d[w[{width + 1 + j}]] = {_render(op, dtype, op.grads[i], **names)};" for j, i in enumerate(computed)]
    return _case(code, f"{op.name}: local derivatives", width + 1 + len(computed), body)


def _edge_case():
    """The edges backward: [coefficient, out, target], two by two (one loop test for two edges:
    0.92-0.97x the backward's time on random 20,000- and 100,000-Value graphs), in order."""
    edge = "g[w[{2}]] += d[w[{0}]] * g[w[{1}]];"
    return EDGE, (f"    kind_{EDGE}: /* edge */\n"
            "        for (long r = count; r > 1; r -= 2, w += 6) {\n"
            f"            {edge.format(0, 1, 2)}\n            {edge.format(3, 4, 5)}\n"
            "        }\n"
            f"        if (count & 1) {{\n            {edge.format(0, 1, 2)}\n            w += 3;\n        }}\n"
            "        NEXT_RUN;")


def _cheap_case(dtype):
    """CHEAP's rows, forward: [which, a, b, out]; every op's value into a small array, the row's
    op's kept: no branch. (Backward each op has its own kind: computing every op's gradients cost
    more than the runs it saved, 1.3x the backward's time on a 100,000-Value graph.)"""
    largest = ops.OPS["max"]
    if largest.render(largest.value, a="x", b="y") != "where(x < y, y, x)":  # (largest_in's pick)
        raise AssertionError("a maximum of two is no longer max's formula: table.CHEAP_OPS")
    for name, constant in CHEAP_AS_MAX.items():
        if ops.OPS[name].render(ops.OPS[name].value, a="x") != largest.render(largest.value, a="x", b=f"{constant:g}"):
            raise AssertionError(f"{name} is no longer max's formula with b = {constant}: table.CHEAP_AS_MAX")
    values = [_render(ops.OPS[name], dtype, ops.OPS[name].value, a="x", b="y") for name in CHEAP_OPS]
    body = ["const real x = d[w[1]], y = d[w[2]];", f"real v[{len(values)}];"]
    body += [f"v[{i}] = {v};" for i, v in enumerate(values)] + ["d[w[3]] = v[w[0]];"]
    return _case(CHEAP, "cheap: " + ", ".join(CHEAP_OPS) + " (a maximum of two, " + ", ".join(CHEAP_AS_MAX) + ": max)", 4, body)


def _dot_case(size):
    """A dot's rows of `size` parts forward: [a_0.., b_0.., out], the parts summed in
    loops.tree_sum's tree, written out (the emitter's own expression)."""
    sum_ = tree_sum([f"d[a[{k}]] * d[b[{k}]]" for k in range(size)])
    return _case(DOT_KINDS[size], f"dot of {size} parts", 2 * size + 1,
                 [f"const int32_t *a = w, *b = w + {size};", f"d[b[{size}]] = {sum_};"])


def _select_case(op, code, dtype, forward):
    """A gather's or a maximum's rows: [n, (index,) c_0..c_n-1, out]; the candidate picked as the
    emitter picks it (gather_index, largest_in)."""
    first = 2 if op.selects == "index" else 1  # where the candidates start in the row
    pick = (call("gather_index", x="d[w[1]]", n="n") if op.selects == "index"
            else call("largest_in", x="d", offsets=f"w + {first}", n="n"))
    at = f"w[{first} + {pick}]"
    if forward:
        body = f"d[w[{first} + n]] = {_render(op, dtype, op.value, a=f'd[{at}]')};"
    else:
        local = _render(op, dtype, op.grads[0], a=f"d[{at}]", out=f"d[w[{first} + n]]")
        go = f"g[w[{first} + n]]"
        body = f"g[{at}] += {go if op.grad_is_one(0) else f'({local}) * {go}'};"
    return _case(code, op.name, None, ["const long n = w[0];", body, f"w += {first + 1} + n;"])
