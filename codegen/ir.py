"""Lowering: a Value graph to a flat program of groups over slots, as a list of named passes.

    build_nodes -> fuse_sums -> mark_gradients -> group -> layout -> vectorize -> share_gradients
                -> decide_sgd_in_backward

Every node gets a slot in flat ``data[]``/``grad[]`` arrays: parameters first (in ``params``
order), then inputs (in ``inputs`` order), then constants that a loop reads (one value per
iteration), then intermediates. Other constants are inlined as literals.

With ``fuse=True`` (the default), sums of products become dot nodes (``fuse_sums``), and nodes
that compute the same thing from operands of the same kinds, wherever they sit in the graph, form
one group (``group``: a layer's neurons, the samples of a batch built into one graph, a
convolution's positions). Each group's results get consecutive slots (``layout``), and a group
whose operands then sit at constant strides becomes one loop nest (``vectorize``); a group that
does not stays straight-line, one statement per node. With ``fuse=False`` every node is its own
group: the reference post's straight-line scalar program.
"""

from dataclasses import dataclass, field

from micrograd_c.engine import Value, topological_order

from . import vector

# Sums with fewer terms than this stay chains of `+`: a loop does not pay for itself.
MIN_SUM_TERMS = 4


class Node:
    """One node of the lowered graph. kind: 'param', 'input', 'const', 'op' or 'dot'.
    A dot's value is sum(args) + sum(a[i] * b[i])."""

    __slots__ = ("kind", "op", "args", "k", "value", "slot", "needs_grad", "a", "b", "grad_slot",
                 "shares_grad", "for_outputs")

    def __init__(self, kind, op=None, args=(), k=None, value=None):
        self.kind, self.op, self.args, self.k, self.value = kind, op, args, k, value
        self.slot = None
        self.needs_grad = False
        self.grad_slot = None     # where its gradient lives: its own slot, or its consumer's
        self.shares_grad = False  # its gradient is its only consumer's, which passes it on unchanged
        self.for_outputs = False  # the outputs need it: predict() computes it
        self.a = self.b = ()

    def reads(self):
        return self.args + self.a + self.b


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
class Program:
    n_params: int
    n_inputs: int
    n_slots: int
    loss: Node
    outputs: list
    forward: list            # groups in evaluation order
    n_output_groups: int     # forward[:n_output_groups] computes everything the outputs need
    backward: list = field(default_factory=list)  # groups whose grads flow back, reverse order
    constants: list = field(default_factory=list)  # (slot, value) of constants that live in slots
    fused: bool = False
    sgd_in_backward: bool = False  # a batch-1 SGD step can run inside backward (see the pass)

    @property
    def input_base(self):
        return self.n_params

    @property
    def nodes(self):
        return [n for g in self.forward for n in g.members]


def lower(loss, inputs, params, outputs=(), fuse=True, input_grads=False):
    """Lowers the graph of `loss` (and `outputs`, extra values to read after forward) to a Program."""
    inputs, params, outputs = list(inputs), list(params), list(outputs)
    _check_leaves(inputs, params, [loss] + outputs)
    leaves, compute, roots = build_nodes(loss, inputs, params, outputs)
    if fuse:
        compute = fuse_sums(compute, roots)
    mark_gradients(leaves, compute, input_grads)
    groups = _outputs_first(vector.group(compute) if fuse else [Group([n]) for n in compute])
    n_slots = layout(groups, leaves)
    for node in leaves + compute:
        node.grad_slot = node.slot
    if not fuse:  # in loops every node keeps its own gradient; straight-line code saves the copies
        share_gradients(reversed(groups), compute, roots)
    groups, constants, n_slots = vector.vectorize(groups, n_slots)
    backward = [g for g in reversed(groups) if g.first.needs_grad]
    program = Program(
        n_params=len(params), n_inputs=len(inputs), n_slots=n_slots, loss=roots[-1], outputs=roots[:-1],
        forward=groups, n_output_groups=sum(g.first.for_outputs for g in groups), backward=backward,
        constants=constants, fused=fuse)
    program.sgd_in_backward = fuse and sgd_in_backward(program)
    return program


# ---- passes ------------------------------------------------------------------------------------

def build_nodes(loss, inputs, params, outputs):
    """One node per Value, in one topological order that puts the outputs' ancestors first (so
    predict() can stop early). Returns (leaf nodes, computed nodes, roots: outputs then loss)."""
    leaf_kind = {id(p): "param" for p in params}
    leaf_kind.update({id(x): "input" for x in inputs})
    n_output_values = len(topological_order(*outputs))
    order = topological_order(*outputs, loss)
    nodes = {}
    for v in order:
        if v._kind is not None:
            nodes[id(v)] = Node("op", v._kind, tuple(nodes[id(c)] for c in v._prev), v._k)
        else:
            nodes[id(v)] = Node(leaf_kind.get(id(v), "const"), value=v.data)
    # Params or inputs that the output does not reach still get their slot.
    for v in params + inputs:
        if id(v) not in nodes:
            nodes[id(v)] = Node(leaf_kind[id(v)], value=v.data)
    roots = [nodes[id(v)] for v in outputs + [loss]]
    compute = [nodes[id(v)] for v in order if nodes[id(v)].kind == "op"]
    for v in order[:n_output_values]:
        nodes[id(v)].for_outputs = True
    # A constant root needs a slot to be read from: compute it as a one-term dot.
    for i, root in enumerate(roots):
        if root.kind == "const":
            roots[i] = Node("dot", args=(root,))
            roots[i].for_outputs = i < len(roots) - 1
            compute.append(roots[i])
    leaves = [nodes[id(v)] for v in params + inputs]
    leaves += [n for n in nodes.values() if n.kind == "const"]
    return leaves, compute, roots


def fuse_sums(compute, roots):
    """Replaces each maximal tree of `+` (what `sum(...)` and a Neuron build) of at least
    MIN_SUM_TERMS terms by one dot node: its products whose factors are both non-constant become
    the dot's factor lists, the other terms its loose terms. Returns the new compute order."""
    uses = use_counts(compute)
    kept = set(map(id, roots))  # values someone reads after forward must stay

    def private(x, op):  # x feeds only one sum, so it may dissolve into it
        return x.kind == "op" and x.op.name == op and uses[id(x)] == 1 and id(x) not in kept

    absorbed = set()
    for node in reversed(compute):  # users before their args: take the largest sums first
        if node.kind != "op" or node.op.name != "add" or id(node) in absorbed:
            continue
        terms, inner, stack = [], [], [node]
        while stack:  # in-order walk of the + tree: terms in source order
            x = stack.pop()
            if x is node or private(x, "add"):
                inner.append(x)
                stack.extend(reversed(x.args))
            else:
                terms.append(x)
        if len(terms) < MIN_SUM_TERMS:
            continue
        products = [t for t in terms if private(t, "mul") and all(f.kind != "const" for f in t.args)]
        is_product = set(map(id, products))
        node.kind, node.op = "dot", None
        node.args = tuple(t for t in terms if id(t) not in is_product)
        node.a = tuple(p.args[0] for p in products)
        node.b = tuple(p.args[1] for p in products)
        absorbed.update(map(id, inner[1:]))
        absorbed.update(is_product)
    return [n for n in compute if id(n) not in absorbed]


def mark_gradients(leaves, compute, input_grads):
    """needs_grad: the params, the inputs if asked, and everything computed from them."""
    for node in leaves:
        node.needs_grad = node.kind == "param" or (node.kind == "input" and input_grads)
    for node in compute:  # forward order: args before users
        node.needs_grad = any(x.needs_grad for x in node.reads())


def layout(groups, leaves):
    """Slots: params, then inputs, in the user's order (they lead `leaves`); then each group's
    results, consecutive in loop order. Returns the slot count."""
    slot = 0
    for node in leaves:
        if node.kind in ("param", "input"):
            node.slot = slot
            slot += 1
    for g in groups:
        for node in g.members:
            node.slot = slot
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
            terms = node.args if node.kind == "dot" or node.op.name == "add" else ()
            for t in terms:
                if t.kind in ("op", "dot") and uses[id(t)] == 1 and id(t) not in kept:
                    t.grad_slot, t.shares_grad = node.grad_slot, True


def sgd_in_backward(program):
    """Whether a batch-1 SGD step can update parameters during backward instead of after it:
    every parameter gets at most one gradient contribution (so `param -= lr * contribution` is
    the whole step, bit for bit), a dot's factor list is all parameters or none, and no
    parameter is itself read as a result."""
    contributions = set()
    for g in program.backward:
        for node in g.members:
            targets = [x for x in node.args if x.needs_grad]
            for factors in (node.a, node.b):
                if any(f.needs_grad for f in factors):
                    if len({f.kind == "param" for f in factors}) > 1:
                        return False
                    targets += factors
            for t in targets:
                if t.kind == "param":
                    if id(t) in contributions:
                        return False
                    contributions.add(id(t))
            # An update must follow every read of the parameter's old value: a node whose backward
            # reads one parameter to update another (w1 * w2) cannot update during backward.
            if sum(x.kind == "param" for x in node.args if node.kind == "op") > 1 or \
                    (node.a and node.a[0].kind == "param" and node.b[0].kind == "param"):
                return False
    return all(r.kind != "param" for r in [program.loss, *program.outputs])


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
    return [g for g in groups if g.first.for_outputs] + [g for g in groups if not g.first.for_outputs]


def _check_leaves(inputs, params, roots):
    for v in roots:
        if not isinstance(v, Value):
            raise TypeError(f"compile() needs Values to compute, got {type(v).__name__}")
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
