"""Random irregular graphs: every node a random op on random earlier nodes, so that no two parts
of the graph share a structure and the compiler finds (almost) no loop nest to fold them into.
The straight-line remainder is then the whole program: what makes an optimising compiler slow.

    graph = irregular.graph(20_000, seed=0)   # about 20,000 Values
    net = codegen.compile(graph.loss, graph.inputs, graph.params, compiler="gcc")

Values stay in about [-1, 1] (every op is bounded or squashed), so a random graph trains without
overflow; the same (ops, seed) gives the same graph. bench/tiers.py times the compilers on them;
the tests use small ones.
"""
import random
from dataclasses import dataclass

from micrograd_c import Value

# Nodes read operands from this many most recent nodes (or, one time in eight, from anywhere):
# deep chains with cross links, as an irregular model has.
WINDOW = 64


@dataclass
class Graph:
    loss: Value
    inputs: list
    params: list
    outputs: list


def _ops(rng):
    """(name, operand count, Values each makes, build(operands)) of the ops drawn from."""
    c = round(rng.uniform(-1, 1), 3)
    return [
        ("mul", 2, 1, lambda a, b: a * b),
        ("add-tanh", 2, 2, lambda a, b: (a + b).tanh()),
        ("sub-half", 2, 2, lambda a, b: (a - b) * 0.5),  # a - b is a + (-1 * b): 3 Values, roughly
        ("scale", 1, 1, lambda a: a * c),
        ("relu", 1, 1, lambda a: a.relu()),
        ("sigmoid", 1, 1, lambda a: a.sigmoid()),
        ("max", 2, 1, lambda a, b: a.max(b)),
    ]


def graph(ops, seed=0, n_inputs=8, n_params=None):
    """A random graph of about `ops` Values (ops >= 50): `n_inputs` inputs, `n_params` params
    (default ops // 20) read at random, sums of 2-8 products squashed by tanh among the ops, and
    a loss the mean square of the last eight nodes. Deterministic in (ops, seed, n_inputs, n_params)."""
    if ops < 50:
        raise ValueError(f"ops must be at least 50, not {ops!r}")
    rng = random.Random(seed)
    n_params = max(1, ops // 20) if n_params is None else n_params
    params = [Value(rng.uniform(-0.5, 0.5)) for _ in range(n_params)]
    inputs = [Value(rng.uniform(-1, 1)) for _ in range(n_inputs)]
    nodes = inputs + params[:WINDOW]
    made = 0

    def pick():
        if rng.random() < 0.125:
            return rng.choice(nodes)
        return nodes[-1 - int(rng.random() * min(WINDOW, len(nodes)))]

    while made < ops - 20:
        if rng.random() < 0.15:  # a random neuron: tanh(sum of k param * node products)
            k = rng.randint(2, 8)
            node = sum((rng.choice(params) * pick() for _ in range(k)), rng.choice(params)).tanh()
            made += 2 * k + 1
        else:
            _, arity, count, build = rng.choice(_ops(rng))
            node = build(*(pick() for _ in range(arity)))
            made += count
        nodes.append(node)
    outputs = nodes[-8:]
    loss = sum((o * o for o in outputs), Value(0.0)) * (1 / len(outputs))
    return Graph(loss, inputs, params, outputs)
