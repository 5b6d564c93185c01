"""Lowering: a Value graph to a flat program of groups over slots, as a list of named passes:

    read_graph (codegen/lower/graph.py: the Values read once, into arrays)
    -> build_nodes (find_sums) -> mark_gradients -> vector.group -> layout -> vector.vectorize
    [-> vector.batch_innermost -> layout -> vector.vectorize] -> sgd_in_backward
    (scalar mode: ... layout -> share_gradients -> vector.vectorize -> ...)

Every node gets a slot in flat ``data[]``/``grad[]`` arrays: parameters first (in ``params``
order), then inputs (in ``inputs`` order), then intermediates, then constants that a loop reads
(one value per iteration). Other constants are inlined as literals.

With ``fuse=True`` (the default), sums become dot nodes (``find_sums``), and nodes that compute
the same thing from operands of the same kinds, wherever they sit in the graph, form one group
(``vector.group``: a layer's neurons, the samples of a batch built into one graph, a
convolution's positions). Each group's results get consecutive slots (``layout``), and a group
whose operands then sit at constant strides becomes one loop nest (``vector.vectorize``); a group
that does not stays straight-line, one statement per node. With ``fuse=False`` every node is its
own group: the reference post's straight-line scalar program, in which a term of a sum reads the
sum's gradient in place (``share_gradients``).
"""

from collections import Counter
from itertools import chain, compress, repeat
from operator import attrgetter, itemgetter, not_

import math

import numpy as np

from micrograd_c import ops
from micrograd_c.engine import Dot, Value, no_gc

from . import graph as graph_arrays
from . import positions, vector
from .types import LEAF_KINDS as LEAF_KIND_BY_ROLE, COMPUTED, CONST, DOT, INPUT, OP, PARAM, Computed, Group, Node, Program, Role

# Sums with fewer terms than this stay chains of `+`: a loop does not pay for itself; but a sum of
# computed values (no parameter or input among its terms) is one from 3 terms on, so that a
# softmax's normalizer over 3 values (microgpt's third position) is alike the longer ones, a
# family's part: microgpt 87 -> 64 loop nests and statements, its C 30% shorter. (From 2 terms a
# residual `x + f(x)` would be a sum too, and embeddings' `wte[t] + wpe[p]` mix parameters with
# inputs, which leaves no batched form.)
MIN_SUM_TERMS, MIN_COMPUTED_SUM_TERMS = 4, 3
# Rounds of vector.batch_innermost: each moves the batch loop inside one more link of a chain.
MAX_BATCH_ROUNDS = 4


def lower(loss, inputs, params, outputs=(), fuse=True, input_grads=False, graph=None):
    """Lowers the graph of `loss` (and `outputs`, extra values to read after forward) to a Program.
    `graph`: what read_graph returned for these arguments, when the caller has it already."""
    outputs, inputs, params = as_list(outputs), as_sequence(inputs), as_sequence(params)
    with no_gc():
        if graph is None:
            graph = read_graph(loss, inputs, params, outputs, fuse=fuse)
        return _lower(graph, inputs, params, fuse, input_grads)


def as_sequence(values):
    """inputs or params as a list or tuple, not copied if they are one (a model's million params:
    a copy touches every Value once more)."""
    return values if type(values) in (list, tuple) else list(values)


def as_list(outputs):
    """compile()'s outputs, one Value, None or several, as a list."""
    return [outputs] if isinstance(outputs, Value) else [] if outputs is None else list(outputs)


def read_graph(loss, inputs, params, outputs, walker=None, fuse=True):
    """The user's graph, checked and read into arrays (codegen.lower.graph.read; `walker`: the C walk,
    codegen/walker.py's module, which codegen's entry points load: lowering builds nothing).
    With `fuse`, an engine.Dot is read as one node (find_sums takes it as the dot it is) unless
    one of its products has two constant factors (find_sums leaves such a product out of a dot);
    scalar mode reads its chain of Values."""
    roots = [loss] + outputs
    _check_roots(roots)  # (before any walk: scalar mode's Python walk runs before the C walker's checks)
    if walker is None and not _leaves_are_values(inputs, params, roots):  # (the walker checks what is a Value)
        _check_leaves(inputs, params, roots)
    try:
        graph = graph_arrays.read(loss, inputs, params, outputs, walker, compact=fuse)
        if fuse and graph.has_constant_products():
            graph = graph_arrays.read(loss, inputs, params, outputs, walker, compact=False)
    except TypeError:
        _check_leaves(inputs, params, roots)  # the message that names the input or param, if it is one
        raise
    if not graph.leaves_listed_once(inputs, params):
        _check_leaves(inputs, params, roots)
    return graph


def _lower(graph, inputs, params, fuse, input_grads):
    leaves, compute, roots = build_nodes(graph, fuse)
    mark_gradients(leaves, compute, input_grads)
    groups = _outputs_first(vector.group(compute) if fuse else [Group([n]) for n in compute])
    if fuse:
        placed = _place(groups, leaves)
        orders = [list(g.members) for g in groups]
        loops = _loop_count(placed[0])
        moved = set()
        # A group whose batch moves inside shows the next one its batch: a few rounds, and the
        # result is kept only if no loop was lost on the way (else the first placement is made again).
        for _ in range(MAX_BATCH_ROUNDS):
            if not vector.batch_innermost(placed[0], moved):
                break
            placed = _place(groups, leaves)
        if moved and _loop_count(placed[0]) < loops:
            placed = _place_in(groups, orders, leaves)
        groups, constants, n_slots = placed
    else:
        n_slots = layout(groups, leaves)
        share_gradients(reversed(groups), compute, roots)  # straight-line code saves the copies
        groups, constants, n_slots = vector.vectorize(groups, n_slots)
    backward = [g for g in reversed(groups) if g.members[0].needs_grad]
    program = Program(
        n_params=len(params), n_inputs=len(inputs), n_slots=n_slots, loss=roots[-1], outputs=roots[:-1],
        forward=groups, n_output_groups=sum(g.first.for_outputs for g in groups), backward=backward,
        constants=constants, fused=fuse, input_grads=input_grads)
    program.index_inputs = index_inputs(compute, len(params))
    if fuse:
        program.unbounded = positions.bound_positions(program, input_grads)
    program.sgd_in_backward = fuse and not straight_line_heavy(program) and sgd_in_backward(program)
    if program.sgd_in_backward:
        program.sgd_after_backward = unfused_params(program, leaves[:len(params)])
    return program


def _place(groups, leaves):
    """layout, then vectorize: (groups, constants, slot count)."""
    return vector.vectorize(groups, layout(groups, leaves))


def _place_in(groups, orders, leaves):
    """_place with the groups' members in the given orders."""
    for g, members in zip(groups, orders):
        g.members = members
    return _place(groups, leaves)


def _loop_count(groups):
    return sum(1 for g in groups if g.shape)


# ---- passes ------------------------------------------------------------------------------------

def build_nodes(graph, fuse):
    """One node per Value of the graph (graph.read: one topological order that puts the outputs'
    ancestors first, so predict() can stop early); with `fuse`, sums become dot nodes first (see
    find_sums) and the Values they absorb get no node. Returns (leaf nodes: params, inputs,
    constants in that order; computed nodes; roots: outputs then loss)."""
    codes, op_table, values = graph.codes, graph.op_table, graph.values
    role = graph.role
    sums, absorbed = find_sums(graph) if fuse else ({}, np.zeros(graph.n, dtype=bool))
    maxima = find_maxima(graph, absorbed) if fuse else {}
    n_output_values = graph.n_output_values
    kept = np.flatnonzero(~absorbed)  # in a model, its params and a few nodes per neuron
    is_leaf = codes[kept] == 0
    leaf_at, computed_at = kept[is_leaf], kept[~is_leaf]
    # The leaves (most of a model's nodes: its params) made by C-speed maps, not a loop per param,
    # and put in place by position in an array of objects (its gathers run at C speed too)
    leaf_roles = role[leaf_at]
    nodes = np.empty(graph.n, dtype=object)
    nodes[leaf_at] = np.fromiter(map(Node, LEAF_KINDS[leaf_roles].tolist()), dtype=object, count=len(leaf_at))
    constant_at = leaf_at[leaf_roles == Role.CONST]
    constants = nodes[constant_at].tolist()
    for node, value in zip(constants, values[constant_at].tolist()):  # (a param's value is loaded, not compiled)
        node.value = value
    k_of = dict(zip(graph.k_positions.tolist(), graph.k_values)).get
    compute = []
    listed = {}  # a dot's list by its positions: one tuple for the lists alike (a weight row read at every position)
    at = nodes.tolist()  # (a list: a node's operands found by position at Python speed, not by a gather each)
    of = at.__getitem__

    def operands(positions):
        key = positions.tobytes()
        found = listed.get(key)
        if found is None:
            found = listed[key] = tuple(map(of, positions.tolist()))
        return found
    kids, starts = graph.kids, graph.starts.tolist()
    for i, code in zip(computed_at.tolist(), codes[computed_at].tolist()):
        if i in sums:
            terms, a, b = map(operands, sums[i])
            if a:  # sum()'s start (0 + x == x but for a zero's sign): a sum of products alone is a layer's (matmul kernels)
                terms = tuple(x for x in terms if not _plus_zero(x))
            node = Computed(DOT, args=terms)
            node.a, node.b = a, b
        elif i in maxima:
            node = Computed(OP, ops.MAXIMUM, tuple(map(of, maxima[i].tolist())))
        else:
            node = Computed(OP, op_table[code - 1], tuple(map(of, kids[starts[i]:starts[i + 1]].tolist())), k_of(i))
        if i < n_output_values:
            node.for_outputs = True
        compute.append(node)
        at[i] = node
    roots = list(map(of, graph.roots.tolist()))
    # A constant root needs a slot to be read from: compute it as a one-term dot.
    for i, root in enumerate(roots):
        if root.kind == CONST:
            roots[i] = Computed(DOT, args=(root,))
            roots[i].for_outputs = i < len(roots) - 1
            compute.append(roots[i])

    def listed(kind, positions):  # params or inputs the output does not reach still get their slot
        if (positions >= 0).all():
            return nodes[positions].tolist()
        return [nodes[i] if i >= 0 else Node(kind) for i in positions.tolist()]
    leaves = listed(PARAM, graph.params) + listed(INPUT, graph.inputs)
    return leaves + constants, compute, roots


def _plus_zero(node):
    """Whether a node is the constant +0.0 (what `sum(...)` starts from)."""
    return node.kind == CONST and node.value == 0 and math.copysign(1.0, node.value) > 0


# A leaf node's Kind by its graph.role
LEAF_KINDS = np.array(LEAF_KIND_BY_ROLE, dtype=object)  # (an array: indexed by an array of roles)


def find_sums(graph):
    """Each maximal tree of `+` (what `sum(...)` and a Neuron build) with at least MIN_SUM_TERMS
    terms becomes one dot: its products whose factors are both non-constant become the dot's
    factor lists, its other terms the dot's loose terms. Inner `+` (used once, by a `+`, and not
    a root) and products used nowhere else dissolve into it. Returns ({position of the sum:
    (terms, a, b) as arrays of positions}, a boolean array: the positions of dissolved Values).

    On arrays: a tree is its root and the inner `+` below it (found by pointer jumping to the
    root), its terms their other children. A tree whose inner `+` are all left children (a chain,
    as sum() builds it) lists its terms in order at once: the bottom's left child, then the right
    children bottom up (children precede parents in the order). Other trees are walked in order,
    one by one. Trees are disjoint, so neither way depends on the other.

    An engine.Dot read as one node (`dot()`, a Neuron's or a `linear`'s sum) that a `+` reads
    once is an inner `+` as its chain would be: its start and products join that tree's terms
    at its place (a residual `x + W x` over a Dot is one dot, as `x + sum(w * x ...)` is). Its
    products, which are no nodes, are numbered after the graph's (`_DotProducts`)."""
    n = graph.n
    index = np.int32 if n < 2**30 else np.int64  # positions: half the bytes of the peak's arrays
    add, mul = ops.OPS["add"], ops.OPS["mul"]
    is_add, is_mul = graph.is_op(add), graph.is_op(mul)
    uses = graph.uses()
    uses[graph.roots] += 2  # values someone reads after forward must stay: never "used once"
    starts, kids = graph.starts, graph.kids
    binary = np.flatnonzero(is_add | is_mul).astype(index)
    left = np.full(n, -1, dtype=index)
    right = np.full(n, -1, dtype=index)
    first = starts[binary]  # (one temporary array of the size of the graph's edges, reused)
    left[binary] = kids[first]
    first += 1
    right[binary] = kids[first]
    del first
    # The consumer of each Value used once (by the `+` or `*` that reads it)
    parent = np.full(n, -1, dtype=index)
    for side in (left, right):
        once = binary[uses[side[binary]] == 1]
        parent[side[once]] = once
    is_dot = graph.is_op(Dot)
    inner = (is_add | is_dot) & (uses == 1) & (parent >= 0)
    inner[inner] = is_add[parent[inner]]
    adds = np.flatnonzero(is_add).astype(index)
    inner_dots = np.flatnonzero(inner & is_dot)
    root = np.arange(n, dtype=index)
    root[inner] = parent[inner]
    jumping = np.flatnonzero(is_add | inner).astype(index)
    while True:  # pointer jumping: each round halves the distance to the tree's root
        jumped = root[root[jumping]]
        if (jumped == root[jumping]).all():
            break
        root[jumping] = jumped
    constant = (graph.role == Role.CONST) & graph.is_op(None)
    # chains: no inner `+` is a right child, and no Dot is inner
    walked = np.zeros(n, dtype=bool)
    walked[root[right[adds][inner[right[adds]]]]] = True
    walked[root[inner_dots]] = True
    tree_nodes = adds[~walked[root[adds]]]  # of chain trees, sorted by position
    tree_nodes = tree_nodes[np.argsort(root[tree_nodes], kind="stable")]  # by tree, bottom up
    bottoms = tree_nodes[~inner[left[tree_nodes]]]
    # terms: (tree, the position of the term's slot in the tree's order, term)
    term_tree = np.concatenate([root[bottoms], root[tree_nodes]])
    term_at = np.concatenate([bottoms * 2, tree_nodes * 2 + 1])  # the bottom's left comes first
    term = np.concatenate([left[bottoms], right[tree_nodes]])
    by_tree = np.lexsort((term_at, term_tree))
    term_tree, term = term_tree[by_tree], term[by_tree]
    leaf = graph.is_op(None) & ~constant
    products = _DotProducts(graph, inner_dots, is_mul, uses, left, right, constant, leaf)
    # the Dots read as such are dots already
    sums, absorbed = graph.dots(), np.zeros(n + products.n_products, dtype=bool)
    _dissolve(term_tree, term, is_mul, uses, left, right, constant, sums, absorbed, leaf)
    is_sum = np.zeros(n, dtype=bool)
    is_sum[list(sums)] = True
    absorbed[tree_nodes] |= inner[tree_nodes] & is_sum[root[tree_nodes]]
    # the other trees, walked one by one, then dissolved together
    trees, terms, belows = [], [], []
    for v in np.flatnonzero(walked).tolist():
        below, stack = [], [v]  # below: the tree's inner `+` and Dots
        while stack:  # in-order walk of the + tree: terms in source order
            x = stack.pop()
            if x != v and is_dot[x] and inner[x]:
                below.append(x)
                terms += products.terms(x)
            elif x == v or inner[x]:
                if x != v:
                    below.append(x)
                stack += (right[x], left[x])
            else:
                terms.append(x)
        trees += [v] * (len(terms) - len(trees))
        belows.append((v, below))
    if trees:
        is_mul, uses, left, right, constant, leaf = products.arrays
        _dissolve(np.array(trees, dtype=np.int64), np.array(terms, dtype=np.int64), is_mul, uses, left, right, constant,
                  sums, absorbed, leaf)
    for v, below in belows:
        if v in sums:
            absorbed[below] = True
            for x in below:
                sums.pop(x, None)  # (a Dot's own entry: its terms are the tree's now)
    return sums, absorbed[:n]


class _DotProducts:
    """The products of the Dots that are inner terms of a `+` tree (find_sums), numbered from the
    graph's node count on: `arrays` are find_sums' per-node arrays (is_mul, uses, left, right,
    constant, leaf) with an entry for each such product (a product used once, its factors the
    Dot's a[k] and b[k]); `terms(dot)` lists the Dot's terms as its chain has them."""

    def __init__(self, graph, dots, is_mul, uses, left, right, constant, leaf):
        n = graph.n
        counts = (graph.starts[dots + 1] - graph.starts[dots] - 1) // 2
        self.first = dict(zip(dots.tolist(), (n + np.cumsum(counts) - counts).tolist()))
        self.count = dict(zip(dots.tolist(), counts.tolist()))
        self.start = dict(zip(dots.tolist(), graph.kids[graph.starts[dots]].tolist()))
        self.n_products = m = int(counts.sum())
        if not m:
            self.arrays = (is_mul, uses, left, right, constant, leaf)
            return
        # each product's a[k] and b[k]: the Dot's children after its start, in pairs
        at = np.repeat(graph.starts[dots] + 1 - 2 * (np.cumsum(counts) - counts), counts) + 2 * np.arange(m)
        self.arrays = (np.concatenate([is_mul, np.ones(m, dtype=bool)]), np.concatenate([uses, np.ones(m, dtype=uses.dtype)]),
                       np.concatenate([left, graph.kids[at].astype(left.dtype)]),
                       np.concatenate([right, graph.kids[at + 1].astype(right.dtype)]),
                       np.concatenate([constant, np.zeros(m, dtype=bool)]), np.concatenate([leaf, np.zeros(m, dtype=bool)]))

    def terms(self, dot):
        first = self.first[dot]
        return [self.start[dot], *range(first, first + self.count[dot])]


# A `max` of two is a maximum too: a softmax over two values is then alike the longer ones.
MIN_MAXIMUM_OPERANDS = 2


def find_maxima(graph, absorbed):
    """Chains of `max` as one maximum each (ops.MAXIMUM: the first of the largest, the chain's
    value and its gradient's place), as find_sums makes chains of `+` one sum: a softmax's
    `reduce(Value.max, logits)` is then one node over its list, whatever its length, instead of
    a chain as long as the list. A chain is left-deep, max(max(max(x0, x1), x2), ...), each
    inner `max` read by the next only. Returns {position of the chain's top: its operands'
    positions}; marks the inner ones in `absorbed`."""
    is_max = graph.is_op(ops.OPS["max"])
    tops = np.flatnonzero(is_max)
    if not len(tops):
        return {}
    uses = graph.uses()
    uses[graph.roots] += 2  # (read after forward: kept)
    left, right = graph.kids[graph.starts[tops]], graph.kids[graph.starts[tops] + 1]
    inner = np.zeros(graph.n, dtype=bool)
    inner[left[is_max[left] & (uses[left] == 1)]] = True
    left_of, right_of = dict(zip(tops.tolist(), left.tolist())), dict(zip(tops.tolist(), right.tolist()))
    maxima = {}
    for top in tops[~inner[tops]].tolist():
        operands, below, x = [right_of[top]], [], left_of[top]
        while inner[x]:
            below.append(x)
            operands.append(right_of[x])
            x = left_of[x]
        operands.append(x)
        if len(operands) >= MIN_MAXIMUM_OPERANDS:
            maxima[top] = np.array(operands[::-1], dtype=np.int64)
            absorbed[below] = True
    return maxima


def _dissolve(term_tree, term, is_mul, uses, left, right, constant, sums, absorbed, leaf):
    """The dots of the trees whose terms are given (grouped by tree, in order): a term that is
    a product used once, of factors not both constants, goes to the factor lists. A tree with
    fewer than MIN_SUM_TERMS terms stays `+` unless it absorbs a product (b + w0*x0 + w1*x1,
    1 - y*score: one pass instead of a product's and a sum's, and no slots for the product) or
    has MIN_COMPUTED_SUM_TERMS terms none of which is a leaf (`leaf`: params and inputs)."""
    if not len(term):
        return
    product = is_mul[term] & (uses[term] == 1) & ~(constant[left[term]] & constant[right[term]])
    bounds = np.flatnonzero(np.diff(term_tree)) + 1
    first = np.concatenate([[0], bounds])
    counts = np.diff(np.concatenate([first, [len(term)]]))
    products = np.add.reduceat(product.astype(np.int64), first)
    leaves = np.add.reduceat(leaf[term].astype(np.int64), first)
    taken = (counts >= MIN_SUM_TERMS) | (products > 0) | ((counts >= MIN_COMPUTED_SUM_TERMS) & (leaves == 0))
    for tree, begin, count, ok in zip(term_tree[first].tolist(), first.tolist(), counts.tolist(), taken.tolist()):
        if not ok:
            continue
        ts, ps = term[begin:begin + count], product[begin:begin + count]
        products_here = ts[ps]
        sums[tree] = (ts[~ps], left[products_here], right[products_here])  # arrays: 8 bytes a position
        absorbed[products_here] = True


def mark_gradients(leaves, compute, input_grads):
    """needs_grad: the params, the inputs if asked, and everything computed from them."""
    for node in leaves:
        node.needs_grad = node.kind == PARAM or (node.kind == INPUT and input_grads)
    for node in compute:  # forward order: args before users
        node.needs_grad = any(map(_needs_grad, node.reads()))


_needs_grad = attrgetter("needs_grad")


def layout(groups, leaves):
    """Slots: params, then inputs, in the user's order (they lead `leaves`); then each group's
    results, consecutive in loop order; constants none (vectorize gives one to those a loop
    reads). Every gradient in its node's slot (grad_slot; share_gradients moves some). Returns
    the slot count."""
    slot = 0
    for node in leaves:
        if node.kind == CONST:
            node.slot = node.grad_slot = None
        else:
            node.slot = node.grad_slot = slot
            slot += 1
    for g in groups:
        for node in g.members:
            node.slot = node.grad_slot = slot
            slot += 1
    return slot


def share_gradients(groups, compute, roots):
    """A node whose only use is as a term of a sum has exactly its sum's gradient (the local
    derivative is 1): it reads that gradient in place instead of a copy. A sum's partial sums and
    its products then cost no backward statement at all."""
    uses = use_counts(compute)
    kept = set(map(id, roots))
    for g in groups:  # consumers before their terms (reverse order), so grad_slot is final when passed on
        for node in g.members:
            terms = node.args if node.kind == DOT or node.op.name == "add" else ()
            for t in terms:
                if t.kind in COMPUTED and uses[id(t)] == 1 and id(t) not in kept:
                    t.grad_slot, t.shares_grad = node.grad_slot, True


def index_inputs(compute, n_params):
    """The inputs that gathers read as their index: (position among the inputs, the fewest values
    one of them picks among), sorted; the module checks them (-n..n-1, an integer) before any
    forward, so that no gather reads outside its values (fewest_indices)."""
    return fewest_indices((index.kind, index.slot - n_params if index.kind == INPUT else None, len(node.args) - 1)
                          for node in compute if node.kind == OP and node.op.selects == "index"
                          for index in node.args[:1])


def fewest_indices(reads):
    """index_inputs of gathers' reads (their index's Kind, its position among the inputs, the
    values it picks among), checked: an index that is a constant was checked when the graph was
    built; one that is a parameter or a computed value is an error."""
    fewest = {}
    for kind, position, n in reads:
        if kind == INPUT:
            fewest[position] = min(n, fewest.get(position, n))
        elif kind != CONST:
            raise ValueError(f"a gather's index must be one of the inputs (set per sample) or a constant, "
                             f"not a {'parameter' if kind == PARAM else 'computed value'}")
    return sorted(fewest.items())


# From this many single statements (groups no loop nest covers) in backward, a program's backward
# is written once: batch-1 SGD then steps after it, as with fuse=False, instead of the two more
# copies of backward (SGD inside it, the step API's tracked rows) that pay for loops only and
# would triple what the optimising compiler reads (docs/compiler.md, Tiers and irregular graphs).
ONE_BACKWARD_MIN_STATEMENTS = 1000


def straight_line_heavy(program):
    """Whether the program's backward has ONE_BACKWARD_MIN_STATEMENTS single statements or more
    (an irregular graph's: no loop nest covers them)."""
    return sum(not g.shape for g in program.backward) >= ONE_BACKWARD_MIN_STATEMENTS


def sgd_in_backward(program):
    """Which parameters a batch-1 SGD step can update during backward instead of after it
    (node.sgd_fused): those that get one gradient contribution, so `param -= lr * contribution`
    is their whole step, bit for bit; alike for every member of a group and every element of a
    dot's factor list (one loop or kernel updates them all); not a parameter whose old value
    another update's statement still reads (w1 * w2), nor one that is itself read as a result.
    The others accumulate their gradient, and a sweep after backward updates them. Returns
    whether any parameter is updated in backward.

    Decided list by list (per group and operand position: the params there share one fate), at
    C speed per element (contributions counted by slot): a parameter with one contribution is in
    one list only, so no list's fate depends on another's."""
    lists = []  # (operand list, whether its group rules its params out)
    for g in program.backward:
        members, first = g.members, g.first
        # Members are alike (vector.group): a list holds params only if the first's part does.
        kinds = [x.kind for x in first.args]
        many_params = first.kind == OP and kinds.count(PARAM) > 1  # w1 * w2
        for i, kind in enumerate(kinds):
            if kind == PARAM:
                lists.append((list(map(itemgetter(i), map(_args, members))), None, many_params))
        # params in both factor lists: updating one reads the other's old value
        in_factors = [factors for factors in (_a, _b) if PARAM in set(map(_kind, factors(first)))]
        for factors in in_factors:
            # a list alike in many members is one tuple (build_nodes: a weight row read at every
            # position): its elements once, with how many members read them
            tuples = list(map(factors, members))
            times = Counter(map(id, tuples))
            distinct = list(dict(zip(map(id, tuples), tuples)).values())
            reads = np.repeat(np.fromiter(map(times.__getitem__, map(id, distinct)), dtype=np.int64, count=len(distinct)),
                              np.fromiter(map(len, distinct), dtype=np.int64, count=len(distinct)))
            lists.append((list(chain.from_iterable(distinct)), reads, len(in_factors) == 2))
    # Per list with params: its params, their slots (a param's slot is its place in `params`),
    # how many times each is read there, and whether its group lets them be updated together;
    # then every param's count of contributions at C speed.
    with_params = []
    for xs, reads, ruled_out in lists:
        kinds = set(map(_kind, xs))
        if PARAM not in kinds:
            continue
        only_params = kinds == {PARAM}  # a layer's weights: the common case, without a check per element
        if only_params:
            ps = xs
        else:
            is_param = np.fromiter(map(PARAM.__eq__, map(_kind, xs)), dtype=bool, count=len(xs))
            ps = list(compress(xs, is_param))
            reads = None if reads is None else reads[is_param]
        alike = not ruled_out and (only_params or all(x.kind == PARAM for x in xs if x.needs_grad))
        slots = np.fromiter(map(_slot, ps), dtype=np.int64, count=len(ps))
        with_params.append((ps, slots, np.ones(len(ps), dtype=np.int64) if reads is None else reads, alike))
    contributions = np.bincount(np.concatenate([slots for _, slots, _, _ in with_params] or [[]]).astype(np.int64),
                                np.concatenate([reads for _, _, reads, _ in with_params] or [[]]),
                                minlength=program.n_params)
    for r in [program.loss, *program.outputs]:  # read as a result: never updated early
        if r.kind == PARAM:
            contributions[r.slot] += 2
    fused = False
    for ps, slots, _, alike in with_params:
        together = alike and bool((contributions[slots] == 1).all())
        if together:  # (the others keep the False every node starts from)
            for x in ps:
                x.sgd_fused = True
        fused |= together
    return fused


_args, _a, _b, _kind, _slot, _sgd_fused = (attrgetter(name) for name in ("args", "a", "b", "kind", "slot", "sgd_fused"))


def unfused_params(program, params):
    """Runs (first slot, count) of the parameters that SGD updates after backward."""
    return slot_runs(map(_slot, compress(params, map(not_, map(_sgd_fused, params)))))


def slot_runs(slots):
    """Ascending slots (an iterable or an array) as runs of consecutive ones, (first slot, count)."""
    slots = slots if isinstance(slots, np.ndarray) else np.fromiter(slots, dtype=np.int64)
    if not len(slots):
        return []
    firsts = np.flatnonzero(np.diff(slots, prepend=slots[0] - 2) != 1)  # where a run starts
    counts = np.diff(np.append(firsts, len(slots)))
    return list(zip(slots[firsts].tolist(), counts.tolist()))


# ---- helpers -----------------------------------------------------------------------------------

def use_counts(compute):
    """How many times each node is read by the computed nodes (by id)."""
    uses = {}
    for node in compute:
        for x in node.reads():
            uses[id(x)] = uses.get(id(x), 0) + 1
    return uses


def _outputs_first(groups):
    """The groups the outputs need first (stable otherwise): predict() runs only those."""
    for_outputs = [g.members[0].for_outputs for g in groups]
    return list(compress(groups, for_outputs)) + list(compress(groups, map(not_, for_outputs)))


def _leaves_are_values(inputs, params, roots):
    """The common case of _check_leaves' first checks at C speed (a model's million params): every
    root, input and param a Value, inputs and params leaves. (Each listed once: Graph checks.)"""
    leaves = list(chain(inputs, params))
    return (all(map(isinstance, roots, repeat(Value))) and all(map(isinstance, leaves, repeat(Value)))
            and not any(map(attrgetter("_prev"), leaves)))


def _check_roots(roots):
    """Raises for the first root (the loss, an output) that is not a Value."""
    for v in roots:
        if not isinstance(v, Value):
            raise TypeError(f"compile() needs Values to compute, got {type(v).__name__}")


def _check_leaves(inputs, params, roots):
    """Raises for the first root, input or param that is not a Value, input or param that is not
    a leaf, or Value listed twice among them."""
    _check_roots(roots)
    seen = set()
    for role, values in (("input", inputs), ("param", params)):
        for v in values:
            if not isinstance(v, Value):
                raise TypeError(f"every {role} must be a Value, got {type(v).__name__}")
            if v._prev:
                raise ValueError(f"{role} {v!r} is computed by op {v._op!r}; inputs and params must be leaves")
            if id(v) in seen:
                raise ValueError(f"{v!r} is listed twice among inputs and params")
            seen.add(id(v))
