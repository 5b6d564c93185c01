"""The interpreter: micrograd's API and numbers, each op against finite differences, losses."""

import math
import random

import pytest

import micrograd.engine
import micrograd.nn
from conftest import requires
from micrograd_c import MLP, Layer, Neuron, Value, cross_entropy, log_softmax, mse
from micrograd_c import ops
from micrograd_c.engine import topological_order


def micrograd_readme_example(Value):
    a = Value(-4.0)
    b = Value(2.0)
    c = a + b
    d = a * b + b**3
    c += c + 1
    c += 1 + c + (-a)
    d += d * 2 + (b + a).relu()
    d += 3 * d + (b - a).relu()
    e = c - d
    f = e**2
    g = f / 2.0
    g += 10.0 / f
    g.backward()
    return a, b, g


def test_micrograd_readme_example():
    a, b, g = micrograd_readme_example(Value)
    assert f"{g.data:.4f}" == "24.7041"
    assert f"{a.grad:.4f}" == "138.8338"
    assert f"{b.grad:.4f}" == "645.5773"


def test_same_numbers_as_micrograd():
    ours = micrograd_readme_example(Value)
    theirs = micrograd_readme_example(micrograd.engine.Value)
    for x, y in zip(ours, theirs):
        assert x.data == y.data
        assert x.grad == pytest.approx(y.grad, rel=1e-15)  # micrograd's set order may sum differently


def test_ops_strings_prev_and_repr_match_micrograd():
    x, y = Value(3.0), Value(2.0)
    mx, my = micrograd.engine.Value(3.0), micrograd.engine.Value(2.0)
    for ours, theirs in [(x + y, mx + my), (x * y, mx * my), (x**2, mx**2), (x.relu(), mx.relu()),
                         (x - y, mx - my), (x / y, mx / my), (-x, -mx), (2 - x, 2 - mx), (2 / x, 2 / mx)]:
        assert ours._op == theirs._op
        assert ours.data == theirs.data
        assert repr(ours) == repr(theirs)
    square = x * x
    assert square._prev == (x, x)  # both edges kept, in order
    square.backward()
    assert x.grad == 6.0


@pytest.mark.parametrize("nouts", [[3], [4, 4, 1], [5, 2]])
def test_mlp_same_init_structure_and_gradients_as_micrograd(nouts):
    random.seed(42)
    ours = MLP(3, nouts)
    random.seed(42)
    theirs = micrograd.nn.MLP(3, nouts)
    assert repr(ours) == repr(theirs)
    assert [p.data for p in ours.parameters()] == [p.data for p in theirs.parameters()]
    x = [0.5, -1.5, 2.0]
    out_ours, out_theirs = ours(x), theirs(x)
    out_ours = out_ours if isinstance(out_ours, list) else [out_ours]
    out_theirs = out_theirs if isinstance(out_theirs, list) else [out_theirs]
    assert [o.data for o in out_ours] == [o.data for o in out_theirs]
    sum(o * o for o in out_ours).backward()
    sum(o * o for o in out_theirs).backward()
    for p, q in zip(ours.parameters(), theirs.parameters()):
        assert p.grad == pytest.approx(q.grad, rel=1e-14, abs=1e-300)
    ours.zero_grad()
    assert all(p.grad == 0 for p in ours.parameters())


def test_mnist_mlp_has_39760_parameters():
    assert len(MLP(784, [50, 10]).parameters()) == 39760


def test_neuron_and_layer_reprs_and_activations():
    assert repr(Neuron(3)) == "ReLUNeuron(3)"
    assert repr(Neuron(3, nonlin=False)) == "LinearNeuron(3)"
    assert repr(Layer(2, 2, activation="tanh")) == "Layer of [TanhNeuron(2), TanhNeuron(2)]"
    assert Neuron(2, activation="tanh")([1.0, 2.0])._op == "tanh"
    with pytest.raises(ValueError, match="activation"):
        Neuron(2, activation="gelu")


# Each op: value and derivative, at points away from kinks and domain edges.
UNARY = {
    "relu": (lambda v: v.relu(), lambda x: max(x, 0.0), lambda x: float(x > 0)),
    "tanh": (lambda v: v.tanh(), math.tanh, lambda x: 1 - math.tanh(x) ** 2),
    "sigmoid": (lambda v: v.sigmoid(), lambda x: 1 / (1 + math.exp(-x)),
                lambda x: math.exp(-x) / (1 + math.exp(-x)) ** 2),
    "exp": (lambda v: v.exp(), math.exp, math.exp),
    "log": (lambda v: v.log(), math.log, lambda x: 1 / x),
    "pow3": (lambda v: v**3, lambda x: x**3, lambda x: 3 * x**2),
    "pow-0.5": (lambda v: v**-0.5, lambda x: x**-0.5, lambda x: -0.5 * x**-1.5),
    "neg": (lambda v: -v, lambda x: -x, lambda x: -1.0),
}


def central_difference(f, x, h=1e-6):
    return (f(x + h) - f(x - h)) / (2 * h)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("x", [0.3, 1.7, -0.8])
def test_unary_op_value_and_gradient(name, x):
    build, value, derivative = UNARY[name]
    if name in ("log", "pow-0.5") and x <= 0:
        x = -x
    v = Value(x)
    out = build(v)
    out.backward()
    assert out.data == pytest.approx(value(x), rel=1e-15)
    assert v.grad == pytest.approx(derivative(x), rel=1e-14, abs=1e-300)
    assert v.grad == pytest.approx(central_difference(lambda t: build(Value(t)).data, x), rel=1e-6, abs=1e-8)


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: (1.0, 1.0)),
    "mul": (lambda a, b: a * b, lambda a, b: (b, a)),
    "sub": (lambda a, b: a - b, lambda a, b: (1.0, -1.0)),
    "div": (lambda a, b: a / b, lambda a, b: (1 / b, -a / b**2)),
    "max": (lambda a, b: a.max(b) if isinstance(a, Value) else max(a, b),
            lambda a, b: (float(a >= b), float(a < b))),
}


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("x, y", [(0.7, -1.3), (-2.0, 0.5), (1.5, 2.5)])
def test_binary_op_value_and_gradient(name, x, y):
    build, derivatives = BINARY[name]
    a, b = Value(x), Value(y)
    out = build(a, b)
    out.backward()
    assert out.data == pytest.approx(build(x, y), rel=1e-15)
    assert (a.grad, b.grad) == pytest.approx(derivatives(x, y), rel=1e-14)
    assert a.grad == pytest.approx(central_difference(lambda t: build(Value(t), Value(y)).data, x), rel=1e-6, abs=1e-8)
    assert b.grad == pytest.approx(central_difference(lambda t: build(Value(x), Value(t)).data, y), rel=1e-6, abs=1e-8)


# Value ** Value (and number ** Value): bases > 0, where the derivative in the exponent, a^b log a, exists
POWERS = [(0.7, 1.3), (2.0, -0.5), (1.5, 2.5), (0.4, 3.0)]


@pytest.mark.parametrize("x, y", POWERS)
def test_value_power_value(x, y):
    a, b = Value(x), Value(y)
    out = a ** b
    out.backward()
    assert out._op == "**" and out._prev == (a, b)
    assert out.data == pytest.approx(x ** y, rel=1e-15)
    assert (a.grad, b.grad) == pytest.approx((y * x ** (y - 1), x ** y * math.log(x)), rel=1e-14)
    assert a.grad == pytest.approx(central_difference(lambda t: (Value(t) ** Value(y)).data, x), rel=1e-6)
    assert b.grad == pytest.approx(central_difference(lambda t: (Value(x) ** Value(t)).data, y), rel=1e-6)


@pytest.mark.parametrize("x, y", POWERS)
def test_number_power_value(x, y):
    b = Value(y)
    out = x ** b
    out.backward()
    assert out.data == pytest.approx(x ** y, rel=1e-15)
    assert b.grad == pytest.approx(central_difference(lambda t: (x ** Value(t)).data, y), rel=1e-6)
    assert (Value(x) ** 2)._op == "**2"  # a number exponent keeps micrograd's op


def test_power_values_follow_c_where_python_raises():
    assert (Value(0.0) ** Value(-1.0)).data == math.inf
    assert math.isnan((Value(-8.0) ** Value(1 / 3)).data)
    assert (Value(-2.0) ** Value(3.0)).data == -8.0
    with pytest.raises(TypeError):
        Value(2.0) ** "3"


@pytest.mark.parametrize("x, y", POWERS)
def test_power_against_pytorch(x, y):
    """A hold-out: PyTorch's own pow and autograd (optional: `make torch`)."""
    torch = requires("torch")
    ta, tb = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, y))
    (ta ** tb + 3.0 ** tb).backward()
    a, b = Value(x), Value(y)
    (a ** b + 3.0 ** b).backward()
    assert (a.grad, b.grad) == pytest.approx((ta.grad.item(), tb.grad.item()), rel=1e-14)


def test_every_op_in_the_table_is_tested():
    tested = {"relu", "tanh", "sigmoid", "exp", "log", "pow", "vpow", "add", "mul", "max", "gather", "maximum"}  # (gather: test_gather.py; maximum: test_gpt.py)
    assert tested == set(ops.OPS)


def test_value_has_micrograds_methods_from_the_op_table():
    """The methods the table's rows name are Value's, as micrograd has them (relu) plus this
    package's own; each reads like a written method (name, signature, docstring)."""
    import inspect
    from micrograd_c import engine
    public = {name for name in dir(Value) if not name.startswith("_")}
    assert public == {"data", "grad", "backward", "relu", "tanh", "sigmoid", "exp", "log", "max"}
    assert {op.method for op in ops.OPS.values() if op.method} == public - {"data", "grad", "backward"}
    assert str(inspect.signature(Value.max)) == "(self, other)" and str(inspect.signature(Value.relu)) == "(self)"
    assert Value.max.__qualname__ == "Value.max" and Value.max.__doc__.startswith("The larger of self and other")
    assert "where(self < 0, 0, self)" in Value.relu.__doc__
    with pytest.raises(ValueError, match="3 arguments"):
        engine.op_method(ops.Op("clamp", "clamp", 3, "{a}", ("1", "0", "0"), method="clamp"))


def test_a_row_cannot_take_the_name_of_a_value_method(monkeypatch):
    from micrograd_c import engine
    monkeypatch.setattr(ops, "OPS", {"clash": ops.Op("clash", "clash", 1, "{a}", ("1",), method="backward")})
    with pytest.raises(ValueError, match="op 'clash': Value already has 'backward'"):
        engine._add_op_methods()


def test_unknown_op_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown op 'gelu'"):
        ops.get("gelu")


def test_primitives_follow_ieee_where_math_raises():
    assert Value(1000.0).exp().data == math.inf
    assert Value(0.0).log().data == -math.inf
    assert math.isnan(Value(-1.0).log().data)
    assert Value(-1000.0).sigmoid().data == 0.0


def test_node_used_by_two_parents_accumulates():
    x = Value(3.0)
    y = x * 2
    z = y + y.relu() + x
    z.backward()
    assert y.grad == 2.0
    assert x.grad == 5.0


def test_deep_chain_backward_is_iterative():
    x = Value(1.0)
    y = x
    for _ in range(20_000):  # 20 times Python's default recursion limit
        y = y + 1e-6
    y.backward()
    assert x.grad == 1.0
    assert len(topological_order(y)) == 40_001  # 20,000 sums and their constants, plus x


def test_cross_entropy_is_stable_for_extreme_logits():
    logits = [Value(1000.0), Value(-1000.0), Value(999.0)]
    loss = cross_entropy(logits, 2)
    loss.backward()
    softmax = [1 / (1 + math.exp(-1)), 0.0, math.exp(-1) / (1 + math.exp(-1))]
    assert loss.data == pytest.approx(math.log(1 + math.exp(-1)) + 1, rel=1e-12)
    assert [z.grad for z in logits] == pytest.approx([softmax[0], 0.0, softmax[2] - 1], abs=1e-12)
    assert all(math.isfinite(z.grad) for z in logits)


def test_cross_entropy_one_hot_values_equal_class_index():
    logits = [0.3, -1.2, 2.2, 0.0]
    by_index = cross_entropy([Value(z) for z in logits], 1)
    by_one_hot = cross_entropy([Value(z) for z in logits], [Value(0.0), Value(1.0), Value(0.0), Value(0.0)])
    assert by_one_hot.data == pytest.approx(by_index.data, rel=1e-15)
    lse = math.log(sum(math.exp(z) for z in logits))
    assert by_index.data == pytest.approx(lse - logits[1], rel=1e-14)
    assert sum(math.exp(p.data) for p in log_softmax([Value(z) for z in logits])) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="out of range"):
        cross_entropy([Value(1.0)], 3)


def test_mse_value_and_gradient():
    p = [Value(1.0), Value(3.0)]
    loss = mse(p, [0.0, 1.0])
    loss.backward()
    assert loss.data == pytest.approx((1 + 4) / 2)
    assert [v.grad for v in p] == pytest.approx([1.0, 2.0])
    with pytest.raises(ValueError):
        mse(p, [1.0])


def test_building_a_layer_leaves_earlier_garbage_to_the_collector():
    """Layers build with the collector paused and move what they built to the oldest generation
    (engine.no_gc); cyclic garbage made before is collected first, not moved along."""
    import weakref

    class Cyclic:
        pass
    garbage = Cyclic()
    garbage.me = garbage
    gone = weakref.ref(garbage)
    del garbage
    Layer(3, 2)([Value(1.0)] * 3)
    assert gone() is None


def test_the_collector_resumes_when_the_last_paused_block_ends_in_any_thread():
    """A tiered compile's background lowering starts inside compile()'s no_gc block and ends after
    it: the collector stays paused until it ends, then runs again."""
    import gc
    import threading
    from micrograd_c.engine import no_gc
    assert gc.isenabled()
    entered, leave = threading.Event(), threading.Event()

    def background():
        with no_gc():
            entered.set()
            leave.wait(10)
    thread = threading.Thread(target=background)
    with no_gc():
        thread.start()
        entered.wait(10)
    assert not gc.isenabled()  # the other block still runs
    leave.set()
    thread.join(10)
    assert gc.isenabled()
