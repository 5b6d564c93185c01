"""Fuzzing with hypothesis: every exported function of compiled modules, and codegen.compile,
called with random arguments (types, shapes, dtypes, NaN/inf, huge and negative ints, keyword
arguments). The rule: never crash; a call either works or raises TypeError or ValueError
(MemoryError for a result too big to allocate), and a call that raises leaves the state as it was.

The default run makes a few thousand calls; `make fuzz` sets MICROGRAD_C_FUZZ_CALLS (calls per
compiler, e.g. 100000) and prints the counts.
"""
import array
import math
import os
import random
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import codegen
from codegen.backend.toolchain import COMPILER_NAMES
from conftest import requires
from micrograd_c import MLP, Value, cross_entropy

CALLS_PER_COMPILER = int(os.environ.get("MICROGRAD_C_FUZZ_CALLS", "700"))
COMPILE_EXAMPLES = int(os.environ.get("MICROGRAD_C_FUZZ_COMPILES", "25"))
ALLOWED = (TypeError, ValueError, MemoryError)
FUZZ_SETTINGS = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
COUNTS = {}  # (what, compiler) -> [calls, calls that raised an allowed error]


def tiny_models(compiler):
    """Models with the shapes that matter: fused with outputs, scalar with input gradients and a
    constant output, and one with no inputs and no outputs."""
    random.seed(1)
    mlp = MLP(3, [4, 2])
    xs, ys = [Value(0.0) for _ in range(3)], [Value(0.0) for _ in range(2)]
    logits = mlp(xs)
    classifier = codegen.compile(cross_entropy(logits, ys), xs + ys, mlp.parameters(), outputs=logits,
                                 compiler=compiler)
    a, b, p, q = Value(0.5), Value(-1.5), Value(2.0), Value(0.25)
    loss = ((a * p).tanh() + (b * q).exp() + (p * p).log() + (a - b).relu() / (q + 3.0)) ** 2
    scalar = codegen.compile(loss, [a, b], [p, q], outputs=[a * p, Value(7.0)], compiler=compiler, fuse=False,
                             input_grads=True)
    w = Value(1.5)
    empty = codegen.compile(w * w, [], [w], compiler=compiler)
    return [classifier, scalar, empty]


@pytest.fixture(scope="module", params=COMPILER_NAMES)
def models(request):
    compiler = requires(request.param)
    return compiler, tiny_models(compiler)


@pytest.fixture(scope="module", autouse=True)
def report_counts():
    yield
    for (what, compiler), (calls, errors) in sorted(COUNTS.items()):
        print(f"\nfuzz: {calls:,} calls of {what} with {compiler}, {errors:,} raised TypeError/ValueError/"
              f"MemoryError, 0 crashes")


@pytest.fixture(autouse=True)
def nothing_printed_behind_our_back(monkeypatch):
    """Errors CPython only prints (e.g. "deallocated bytearray object has exported buffers", a
    buffer freed while still exported) fail the test too."""
    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda *error: printed.append(error))
    monkeypatch.setattr(sys, "unraisablehook", lambda error: printed.append(error))
    yield
    assert not printed


# ---- strategies -------------------------------------------------------------------------------------
HUGE_INTS = [2**31, 2**63 - 1, 2**63, -2**63, -2**63 - 1, 2**64, 10**30, -10**30, 10**400]
numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10), st.integers(),
    st.sampled_from(HUGE_INTS + [True, False, -0.0, 1e308, -1e308, 5e-324]))
DTYPES = ["<f8", ">f8", "<f4", "<f2", "u1", "i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", ">i8", "?", "<c16"]
dtypes = st.sampled_from(DTYPES).map(np.dtype)


def layouts(array_strategy):
    """C-contiguous or not, writable or not."""
    def transform(pair):
        arr, how = pair
        if how == "step" and arr.ndim and arr.shape[0] > 1:
            arr = arr[::2]
        elif how == "transpose" and arr.ndim > 1:
            arr = arr.T
        elif how == "readonly":
            arr.flags.writeable = False
        return arr
    return st.tuples(array_strategy, st.sampled_from(["plain"] * 4 + ["step", "transpose", "readonly"])).map(transform)


def any_array():
    return layouts(hnp.arrays(dtypes, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)))


def float_array(n):
    """float64 vectors of about n values, now and then NaN or infinite."""
    return layouts(hnp.arrays("<f8", st.sampled_from([n, n, n, n, max(0, n - 1), n + 1]),
                              elements=st.floats(allow_nan=True, allow_infinity=True, width=64)))


def buffers_of(arr_strategy):
    """The same data as numpy, array.array, memoryview, bytes, list."""
    def convert(pair):
        arr, how = pair
        flat = np.ascontiguousarray(arr).ravel()
        if how == "array" and flat.dtype == np.float64:
            return array.array("d", flat.tolist())
        if how == "memoryview":
            return memoryview(np.ascontiguousarray(arr))
        if how == "bytes":
            return np.ascontiguousarray(arr).tobytes()
        if how == "list":
            return arr.tolist()
        return arr
    return st.tuples(arr_strategy, st.sampled_from(["numpy"] * 5 + ["array", "memoryview", "bytes", "list"])).map(convert)


anything = st.one_of(
    st.none(), numbers, st.text(max_size=4), st.binary(max_size=8), buffers_of(any_array()),
    st.builds(object), st.just(np.empty((2**55, 0))), st.just(memoryview(b"")),
    st.lists(st.floats(), max_size=4))


def sample_arrays(draw, n_inputs, n_outputs, with_y):
    """X, and Y when training: the right shapes often, wrong ones sometimes."""
    rows = draw(st.integers(0, 6))
    n_x = draw(st.sampled_from([n_inputs, n_inputs, max(0, n_inputs - 2), max(0, n_inputs - 1), n_inputs + 1]))
    x_dtype = draw(st.sampled_from(["u1", "<f8", "u1", "<f8", "<f4", "i1"]))
    elements = st.floats(allow_nan=True, allow_infinity=True, width=64) if x_dtype == "<f8" else None
    X = draw(layouts(hnp.arrays(x_dtype, (rows, n_x), elements=elements)))
    if draw(st.integers(0, 30)) == 15 and (with_y or n_outputs):  # a zero-width giant: MemoryError, no crash
        X = np.empty((2**55, 0), np.uint8)
    if not with_y:
        return X, None
    n_y = max(0, n_inputs - n_x)
    y_rows = draw(st.sampled_from([rows, rows, rows, rows + 1, max(0, rows - 1)]))
    if draw(st.booleans()):
        labels = draw(hnp.arrays("<i8", (y_rows,), elements=st.integers(-2, max(n_y, 1) + 1)))
        Y = labels.astype(draw(st.sampled_from(["<i8", "<i4", "u1", "<u8", "i1", "<i2", "<f8"])))  # -1: 2**64-1
    else:
        Y = draw(layouts(hnp.arrays("<f8", (y_rows, draw(st.sampled_from([n_y, n_y, n_y + 1]))),
                                    elements=st.floats(allow_nan=True, allow_infinity=True, width=64))))
    return X, Y


@st.composite
def calls(draw, net):
    """One call: (function name, positional args, keyword args), plausible or not."""
    name = draw(st.sampled_from(["set_input", "set_params", "forward", "backward", "zero_grad", "update",
                                 "outputs", "train", "predict"]))
    n_in, n_params, n_out = net.n_inputs, net.n_params, net.n_outputs
    if draw(st.integers(0, 4)) == 2:  # anything at all (not 0: hypothesis favours the bounds)
        args = draw(st.lists(anything, max_size=7))
        kwargs = draw(st.dictionaries(st.sampled_from(["X", "Y", "lr", "scale", "batch_size", "seed", "x", "rate"]),
                                      anything, max_size=3))
        return name, args, kwargs
    if name in ("set_input", "set_params"):
        return name, [draw(buffers_of(float_array(n_in if name == "set_input" else n_params)))], {}
    if name == "update":
        return name, [draw(numbers)], {}
    if name in ("forward", "backward", "zero_grad", "outputs"):
        return name, draw(st.sampled_from([[], [], [], [None]])), {}
    X, Y = sample_arrays(draw, n_in, n_out, with_y=name == "train")
    args = [X, Y] if name == "train" else [X]
    options = ({"lr": numbers, "scale": numbers, "batch_size": st.one_of(st.integers(-2, 9), numbers),
                "seed": st.one_of(st.integers(-3, 100), numbers)} if name == "train" else {"scale": numbers})
    kwargs = {key: draw(value) for key, value in options.items() if draw(st.booleans())}
    if name == "train" and draw(st.integers(0, 5)):
        kwargs.setdefault("lr", draw(st.floats(-1, 1)))
    for key in list(kwargs):  # some as positional arguments
        if key == ("lr" if name == "train" else "scale") and draw(st.booleans()):
            args.append(kwargs.pop(key))
    return name, args, kwargs


def state_of(net):
    return bytes(net.data), bytes(net.grad)


def check_call(net, name, args, kwargs):
    """The rule for one call; True if it raised an allowed error."""
    before = state_of(net)
    try:
        result = getattr(net, name)(*args, **kwargs)
    except ALLOWED:
        assert state_of(net) == before, f"{name} raised but changed the state"
        return True
    if name in ("forward", "train"):
        assert isinstance(result, float)
    elif name == "outputs":
        assert isinstance(result, tuple) and len(result) == net.n_outputs
    elif name == "predict":
        assert len(result.shape) == 2 and result.shape[1] == net.n_outputs
    else:
        assert result is None
    return False


def run_until(count_key, target, test):
    """Runs a hypothesis test (fresh random seeds each run) until `target` calls were made."""
    COUNTS.setdefault(count_key, [0, 0])
    while COUNTS[count_key][0] < target:
        test()


def test_exported_functions(models):
    compiler, nets = models
    key = ("the exported functions", compiler)
    calls_per_example = 8

    @settings(max_examples=max(1, min(CALLS_PER_COMPILER // calls_per_example, 2000)), **FUZZ_SETTINGS)
    @given(st.data())
    def fuzz(data):
        net = data.draw(st.sampled_from(nets))
        for name, args, kwargs in data.draw(st.lists(calls(net), min_size=1, max_size=2 * calls_per_example)):
            raised = check_call(net, name, args, kwargs)
            COUNTS[key][0] += 1
            COUNTS[key][1] += raised
        net.set_params(np.zeros(net.n_params))  # trained to NaN or inf by a wild lr: start afresh
        net.zero_grad()

    run_until(key, CALLS_PER_COMPILER, fuzz)


def test_found_by_fuzzing_predict_of_no_rows_and_of_no_outputs(models):
    """predict() of 0 rows failed in memoryview.cast (and freed the result's bytes while
    exported); a model without outputs has nothing to predict."""
    classifier, _, no_outputs = models[1]
    for dtype in ("<f8", "u1"):
        result = classifier.predict(np.zeros((0, 5), dtype))
        assert result.shape == (0, classifier.n_outputs) and np.asarray(result).shape == (0, 2)
    with pytest.raises(ValueError, match="no outputs"):
        no_outputs.predict(np.zeros((3, 0)))
    # 2**55 rows of nothing: a result too big for any address space is a MemoryError (CPython 3.11
    # printed an error freeing the half-built bytearray, caught by nothing_printed_behind_our_back)
    with pytest.raises(MemoryError):
        classifier.predict(np.empty((2**55, 0), np.uint8))


# ---- codegen.compile's arguments ------------------------------------------------------------------------
finite_or_not = st.one_of(st.floats(-3, 3), st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1e300]))


@st.composite
def graphs(draw):
    """Leaves and a random small graph over them: (loss, leaves, inner nodes)."""
    leaves = [Value(draw(finite_or_not)) for _ in range(draw(st.integers(1, 5)))]
    nodes = list(leaves)
    for _ in range(draw(st.integers(0, 12))):
        op = draw(st.sampled_from(["+", "*", "-", "/", "**", "relu", "tanh", "exp", "log", "sigmoid", "max", "const"]))
        a, b = draw(st.sampled_from(nodes)), draw(st.sampled_from(nodes))
        try:  # Python's float arithmetic raises where C gives inf or nan: 0 ** -1, (-8) ** 0.5
            node = {"+": lambda: a + b, "*": lambda: a * b, "-": lambda: a - b, "/": lambda: a / b,
                    "**": lambda: a ** draw(st.sampled_from([2, 3, -1, 0.5])), "relu": a.relu, "tanh": a.tanh,
                    "exp": a.exp, "log": a.log, "sigmoid": a.sigmoid, "max": lambda: a.max(b),
                    "const": lambda: a * Value(draw(finite_or_not))}[op]()
        except (ArithmeticError, ValueError):
            continue
        if isinstance(node.data, complex):  # Python's (-8) ** 0.5; C's pow gives NaN
            continue
        nodes.append(node)
    return nodes[-1], leaves, nodes[len(leaves):]


def value_lists(draw, leaves, inner):
    """A list of leaves, now and then with non-leaves, duplicates, numbers or None in it."""
    chosen = draw(st.lists(st.sampled_from(leaves), max_size=len(leaves), unique_by=id))
    if draw(st.integers(0, 5)) == 3:
        chosen.append(draw(st.sampled_from(leaves + inner if inner else leaves)))
    if draw(st.integers(0, 8)) == 4:
        chosen.append(draw(st.one_of(numbers, st.none(), st.text(max_size=2))))
    return chosen


@st.composite
def compile_arguments(draw):
    loss, leaves, inner = draw(graphs())
    inputs = value_lists(draw, leaves, inner)
    params = value_lists(draw, [v for v in leaves if v not in inputs] or leaves, inner)
    outputs = draw(st.lists(st.sampled_from(leaves + inner), max_size=3))
    kwargs = dict(inputs=inputs, params=params, outputs=outputs, compiler="tcc")
    if draw(st.integers(0, 3)) == 2:
        kwargs[draw(st.sampled_from(["opt", "native", "fuse", "input_grads", "timeout", "inputs", "params",
                                     "outputs", "compiler"]))] = draw(anything)
    if draw(st.integers(0, 5)) == 3:  # strings only: a name of another type is an AttributeError in emit.py
        kwargs["name"] = draw(st.one_of(st.text(max_size=6), st.sampled_from(["nn", "model_2", "_x", "2x", "a-b"])))
    kwargs["opt"] = kwargs.get("opt", draw(st.sampled_from([0, 2])))
    if draw(st.integers(0, 6)) == 3:
        loss = draw(st.one_of(anything, st.sampled_from([inputs, leaves])))
    return loss, kwargs


def interpreted(loss):
    return loss.data


def test_compile_arguments():
    key = ("codegen.compile", "tcc")

    @settings(max_examples=COMPILE_EXAMPLES, **FUZZ_SETTINGS)
    @given(compile_arguments())
    def fuzz(arguments):
        loss, kwargs = arguments
        COUNTS[key][0] += 1
        own_errors = ()  # an argument that fails when iterated (a memoryview of '>d') raises its own error
        for name in ("inputs", "params", "outputs"):
            try:
                list(kwargs[name])
            except Exception as error:
                own_errors += (type(error),)
        documented = (codegen.CompileTimeout,) if "timeout" in kwargs else ()  # e.g. timeout=1e-280
        if not (isinstance(kwargs["compiler"], str) and kwargs["compiler"] == "tcc"):  # a drawn one ('0'):
            documented += (codegen.CompilerNotFound,)  # a name no compiler answers to: the clear error
        try:
            net = codegen.compile(loss, **kwargs)
        except ALLOWED + own_errors + documented:
            COUNTS[key][1] += 1
            return
        value = net.forward()
        assert value == pytest.approx(interpreted(loss), rel=1e-9, abs=1e-12, nan_ok=True) or (
            math.isinf(value) or math.isinf(interpreted(loss)))  # a different order of inf arithmetic

    run_until(key, COMPILE_EXAMPLES, fuzz)
