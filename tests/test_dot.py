"""engine.Dot: the chain of + over * that micrograd's Neuron builds, held as its operands. The
interpreter sees micrograd's graph (the chain's Values are made when `_prev` is first read, with
the values they had); the compiler reads one node and compiles the same C as for the chain."""
import random

import pytest

import codegen
from micrograd_c import MLP, Neuron, Value, dot
from micrograd_c.engine import _PREV, Dot, topological_order, value_count
from test_compile import check_cases


def operands(n, seed=0):
    rng = random.Random(seed)
    return [Value(rng.uniform(-1, 1)) for _ in range(n)], [Value(rng.uniform(-1, 1)) for _ in range(n)], \
        Value(rng.uniform(-1, 1))


def chain_of(a, b, start):
    """micrograd's Neuron: sum((wi * xi for ...), b)."""
    return sum((x * y for x, y in zip(a, b)), start)


def shape(root):
    """The graph of root as micrograd walks it: per Value its op, data and, for a leaf, its identity."""
    return [(v._op, v.data, id(v) if not v._prev else None) for v in topological_order(root)]


@pytest.mark.parametrize("n", [1, 2, 7])
def test_a_dot_is_micrograds_chain(n):
    a, b, start = operands(n)
    d, c = dot(a, b, start), chain_of(a, b, start)
    assert type(d) is Dot and d._op == "+" and repr(d) == repr(c) and d.data == c.data
    assert _PREV.__get__(d) is None  # not made until read
    assert shape(d) == shape(c) and len(d._prev) == 2 and value_count(d) == len(topological_order(c))
    (d * d).backward()
    grads = [v.grad for v in a + b + [start]]
    for v in a + b + [start]:
        v.grad = 0
    (c * c).backward()
    assert grads == [v.grad for v in a + b + [start]]


def test_the_chain_has_the_values_it_had_when_the_dot_was_built():
    a, b, start = operands(4)
    d, c = dot(a, b, start), chain_of(a, b, start)
    for v in a:  # an SGD step before the chain is read
        v.data += 0.25
    assert shape(d) == shape(c)


def test_integer_data_keep_their_type():
    a, b, start = [Value(2), Value(3)], [Value(4), Value(5)], Value(1)
    d, c = dot(a, b, start), chain_of(a, b, start)
    assert d.data == c.data == 24 and type(d.data) is int and shape(d) == shape(c)


def test_a_neuron_builds_a_dot_where_micrograd_builds_the_same_chain():
    random.seed(1)
    neuron = Neuron(3)
    xs = [Value(0.5), Value(-1.0), Value(2.0)]
    assert type(neuron(xs)._prev[0]) is Dot and type(neuron(tuple(xs))._prev[0]) is Dot  # (below its ReLU)
    expected = chain_of(neuron.w, xs, neuron.b).relu()
    assert shape(neuron(xs)) == shape(expected)
    assert type(neuron(xs[:2])._prev[0]) is not Dot  # zip's truncation, as micrograd: a chain
    assert neuron([0.5, -1.0, 2.0]).data == expected.data  # numbers: micrograd makes a Value per product
    assert Neuron(0)([]) is not None  # sum([], b) is b
    with pytest.raises(ValueError, match="dot of 2 values with 3 values"):
        dot(xs[:2], xs)


def test_compile_reads_a_dot_without_making_its_chain():
    random.seed(2)
    model = MLP(4, [5, 3])
    xs = [Value(0.0) for _ in range(4)]
    out = model(xs)
    codegen.compile(sum(o * o for o in out), xs, model.parameters(), outputs=out)
    assert all(type(o) is Dot and _PREV.__get__(o) is None for o in out)


def layers(params, inputs, use_dot, sizes=(3, 4, 2)):
    """An MLP written out: neurons as Dots or as chains over the same params."""
    it = iter(params)
    x = inputs
    for i, (nin, nout) in enumerate(zip(sizes, sizes[1:])):
        out = []
        for _ in range(nout):
            w, bias = [next(it) for _ in range(nin)], next(it)
            s = dot(w, x, bias) if use_dot else chain_of(w, x, bias)
            out.append(s.relu() if i < len(sizes) - 2 else s)
        x = out
    return sum(((o - t) * (o - t) for o, t in zip(x, inputs[-2:])), Value(0.0))


N_PARAMS = 3 * 4 + 4 + 4 * 2 + 2
INIT = [random.Random(3).uniform(-1, 1) for _ in range(N_PARAMS)]
ROWS = [[0.5, -0.3, 0.8], [-0.2, 0.9, 0.1], [1.0, 0.4, -0.6]]


def with_dots(params, inputs):
    return layers(params, inputs, True)


def with_chains(params, inputs):
    return layers(params, inputs, False)


@pytest.mark.parametrize("mode", ["scalar", "fused", "float32"])
def test_dots_compile_to_the_c_of_their_chains(compiler, mode):
    """An MLP of Dots, a Dot with a product of constants and a Dot read once by a sum, side by side
    in one module, compiled equal the interpreter; the MLP's C is its chains'."""
    rows = tuple(map(tuple, ROWS))
    check_cases(tuple((case.__name__, case, tuple(INIT[:n]), rows) for case, n in (
        (with_dots, N_PARAMS), (constant_products, 3), (read_by_a_sum, 5))), mode, compiler=compiler, opt=2)
    sources = []
    for build in (with_dots, with_chains):
        params, inputs = [Value(v) for v in INIT], [Value(x) for x in ROWS[0]]
        sources.append(codegen.generate(build(params, inputs), inputs, params, fuse=mode != "scalar",
                                        dtype="float32" if mode == "float32" else "float64"))
    assert sources[0] == sources[1]


def constant_products(params, inputs):
    """A Dot with a product of two constants (neither params nor inputs): read as its chain, whose
    product of constants stays out of the dot."""
    constants = [Value(1.5), Value(-0.5)]
    return dot([params[0], constants[0], inputs[0]], [inputs[1], constants[1], params[1]], params[2]) ** 2


def test_a_dot_of_constants_compiles_as_its_chain():
    params, inputs = [Value(v) for v in INIT[:3]], [Value(x) for x in ROWS[0]]
    loss = constant_products(params, inputs)
    d = loss._prev[0]
    chain = chain_of([params[0], d._terms[3], inputs[0]], [inputs[1], d._terms[4], params[1]], params[2]) ** 2
    assert codegen.generate(loss, inputs, params) == codegen.generate(chain, inputs, params)


def test_structural_keys_of_dots():
    def key(order=None):
        params, inputs = [Value(v) for v in INIT], [Value(x) for x in ROWS[0]]
        used = [params[i] for i in order] if order else params
        return codegen.structural_key(with_dots(used, inputs), inputs, params)
    assert key() == key()
    assert key([0, 2, 1] + list(range(3, N_PARAMS))) != key()  # two weights of a Dot swapped


def read_by_a_sum(params, inputs, make=dot):
    """A Dot read once by a `+` (a regression's `out - target`): an inner `+` of that sum, as its
    chain is (ir.find_sums): one dot."""
    out = make(params[:3], inputs, params[3])
    return (out - inputs[0] * params[4]) ** 2


def test_a_dot_read_once_by_a_sum_joins_it_as_its_chain_does():
    """The C of a Dot read once by a `+` is its chain's (it was a term of the sum, the chain's
    terms joining it), and so is that of microgpt's residual `x + linear(x)` over Dots."""
    def generated(make):
        params, inputs = [Value(v) for v in INIT[:5]], [Value(x) for x in ROWS[0]]
        return codegen.generate(read_by_a_sum(params, inputs, make), inputs, params)
    assert generated(dot) == generated(chain_of)
    random.seed(5)
    w = [[Value(random.gauss(0, 1)) for _ in range(4)] for _ in range(3)]
    x = [Value(random.gauss(0, 1)) for _ in range(4)]
    def residual(make):
        out = [a + b for a, b in zip([make(row, x) for row in w], x)]
        return codegen.generate(sum(v * v for v in out), x, [p for row in w for p in row])
    assert residual(dot) == residual(lambda a, b: sum(ai * bi for ai, bi in zip(a, b)))


def test_parameters_in_one_pass_and_a_subclass_own():
    random.seed(4)
    model = MLP(3, [4, 2])
    assert model.parameters() == [p for layer in model.layers for n in layer.neurons for p in n.w + [n.b]]

    class Frozen(Neuron):
        def parameters(self):  # a subclass that trains its weights only
            return list(self.w)
    model.layers[0].neurons[1].__class__ = Frozen
    frozen = model.layers[0].neurons[1]
    assert frozen.b not in model.parameters() and all(any(w is p for p in model.parameters()) for w in frozen.w)
    assert len(model.parameters()) == 3 * 4 + 4 + 4 * 2 + 2 - 1


def test_a_dot_given_other_children_is_read_by_them():
    """Setting a Dot's _prev (as one may any Value's) makes it a Value like any: the compiler reads
    what the interpreter does."""
    a, b, start = operands(3)
    d = dot(a, b, start)
    x, y = Value(0.5), Value(-2.0)
    d._prev = (x, y)  # now d = x + y for backward() (its data is left as it was, as for any Value)
    assert topological_order(d)[:-1] == [x, y] and value_count(d) == 3
    loss = d * d
    net = codegen.compile(loss, [x], [y])
    assert net.forward() == (x.data + y.data) ** 2
    assert codegen.structural_key(loss, [x], [y]) != codegen.structural_key(dot(a, b, start) * 1.0, [x], [y])
