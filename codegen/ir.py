"""Lowering: a Value graph to a flat program over slots.

One topological order; every node gets a slot in flat ``data[]``/``grad[]`` arrays: parameters
first (in ``params`` order), then inputs (in ``inputs`` order), then intermediates. Leaves that are
neither are constants, inlined as literals. With ``fuse=True`` a pass replaces sums of products
(what ``sum(w*x for ...)`` builds: a chain of ``+`` over ``*``) by one ``Dot`` node, and lays out
slots so each dot reads contiguous ranges (a neuron's weights already are; the vectors it reads,
e.g. a layer's outputs, are placed contiguously).
"""

from dataclasses import dataclass, field

from micrograd_c.engine import Value, topological_order

# Sums with fewer products than this stay straight-line: a loop call does not pay for itself.
MIN_DOT_TERMS = 4


class Node:
    """One node of the lowered graph. kind: 'param', 'input', 'const', 'op' or 'dot'."""

    __slots__ = ("kind", "op", "args", "k", "value", "slot", "needs_grad", "a", "b", "grad_slot", "shares_grad")

    def __init__(self, kind, op=None, args=(), k=None, value=None):
        self.kind, self.op, self.args, self.k, self.value = kind, op, args, k, value
        self.slot = None
        self.needs_grad = False
        self.grad_slot = None     # where its gradient lives: its own slot, or its consumer's
        self.shares_grad = False  # its gradient is its only consumer's, which passes it on unchanged
        self.a = self.b = ()  # a dot's factor lists: value = sum(args) + sum(a[i] * b[i])


@dataclass
class Program:
    n_params: int
    n_inputs: int
    n_slots: int
    loss: Node
    outputs: list
    forward: list            # op/dot nodes in evaluation order
    n_output_nodes: int      # forward[:n_output_nodes] computes everything the outputs need
    backward: list = field(default_factory=list)  # op/dot nodes whose grads flow back, reverse order
    fused: bool = False

    @property
    def input_base(self):
        return self.n_params


def lower(loss, inputs, params, outputs=(), fuse=True, input_grads=False):
    """Lowers the graph of `loss` (and `outputs`, extra values to read after forward) to a Program."""
    inputs, params, outputs = list(inputs), list(params), list(outputs)
    _check_leaves(inputs, params, [loss] + outputs)
    leaf_kind = {id(p): "param" for p in params}
    leaf_kind.update({id(x): "input" for x in inputs})

    # Outputs first: their ancestors then lead the order, so predict() can stop early.
    n_output_values = len(topological_order(*outputs))
    order = topological_order(*outputs, loss)
    nodes = {}
    for v in order:
        if v._kind is not None:
            node = Node("op", v._kind, tuple(nodes[id(c)] for c in v._prev), v._k)
        else:
            node = Node(leaf_kind.get(id(v), "const"), value=v.data)
        nodes[id(v)] = node
    # Params or inputs that the output does not reach still get their slot.
    for v in params + inputs:
        if id(v) not in nodes:
            nodes[id(v)] = Node(leaf_kind[id(v)], value=v.data)

    roots = [nodes[id(v)] for v in outputs + [loss]]
    compute = [nodes[id(v)] for v in order if nodes[id(v)].kind == "op"]
    # A constant root needs a slot to be read from: compute it as a one-term dot.
    for i, root in enumerate(roots):
        if root.kind == "const":
            roots[i] = Node("dot", args=(root,))
            compute.append(roots[i])
    output_nodes = set(map(id, compute[:_count_ops(order[:n_output_values])] + roots[:-1]))
    if fuse:
        compute = _fuse_dots(compute, roots)
    for v in params:
        nodes[id(v)].needs_grad = True
    for v in inputs:
        nodes[id(v)].needs_grad = input_grads
    for node in compute:  # forward order: args before users
        node.needs_grad = any(x.needs_grad for x in _reads(node))

    for i, v in enumerate(params):
        nodes[id(v)].slot = i
    for i, v in enumerate(inputs):
        nodes[id(v)].slot = len(params) + i
    n_slots = _assign_slots(compute, len(params) + len(inputs))
    for node in [*nodes.values(), *compute]:
        node.grad_slot = node.slot
    backward = [n for n in reversed(compute) if n.needs_grad]
    _share_gradients(backward, compute, roots)

    forward_outputs = [n for n in compute if id(n) in output_nodes]
    forward_rest = [n for n in compute if id(n) not in output_nodes]
    return Program(
        n_params=len(params), n_inputs=len(inputs), n_slots=n_slots,
        loss=roots[-1], outputs=roots[:-1],
        forward=forward_outputs + forward_rest, n_output_nodes=len(forward_outputs),
        backward=backward, fused=fuse)


def _count_ops(values):
    return sum(1 for v in values if v._kind is not None)


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


def _reads(node):
    return node.args + node.a + node.b


def _fuse_dots(compute, roots):
    """Replaces each maximal sum of products by one dot node; returns the new compute order."""
    users = {}
    for node in compute:
        for x in node.args:
            users[id(x)] = users.get(id(x), 0) + 1
    kept = set(map(id, roots))  # values someone reads after forward must stay

    def private(x, op):  # x feeds only one sum, so it may dissolve into it
        return x.kind == "op" and x.op.name == op and users[id(x)] == 1 and id(x) not in kept

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
        products = [t for t in terms if private(t, "mul") and all(f.kind != "const" for f in t.args)]
        if len(products) < MIN_DOT_TERMS:
            continue
        is_product = set(map(id, products))
        node.kind, node.op = "dot", None
        node.args = tuple(t for t in terms if id(t) not in is_product)
        node.a = tuple(p.args[0] for p in products)
        node.b = tuple(p.args[1] for p in products)
        absorbed.update(map(id, inner[1:]))
        absorbed.update(is_product)
    return [n for n in compute if id(n) not in absorbed]


def _share_gradients(backward, compute, roots):
    """A node whose only use is as a term of a sum has exactly its sum's gradient (the local
    derivative is 1): it reads that gradient in place instead of a copy. A sum's partial sums and
    its products then cost no backward statement at all."""
    uses = {}
    for node in compute:
        for x in _reads(node):
            uses[id(x)] = uses.get(id(x), 0) + 1
    kept = set(map(id, roots))
    for node in backward:  # consumers before their terms, so grad_slot is final when passed on
        terms = node.args if node.kind == "dot" or node.op.name == "add" else ()
        for t in terms:
            if t.kind in ("op", "dot") and uses[id(t)] == 1 and id(t) not in kept:
                t.grad_slot, t.shares_grad = node.grad_slot, True


def _assign_slots(compute, first):
    """Slots for computed nodes, from `first` on; returns the slot count. Each dot's factor lists
    that are all still unplaced computed values get consecutive slots, so the dot is a loop."""
    slot = first
    for node in compute:
        if node.kind != "dot":
            continue
        for factors in (node.a, node.b):
            if all(f.slot is None and f.kind in ("op", "dot") for f in factors) and \
                    len(set(map(id, factors))) == len(factors):
                for f in factors:
                    f.slot = slot
                    slot += 1
    for node in compute:
        if node.slot is None:
            node.slot = slot
            slot += 1
    return slot
