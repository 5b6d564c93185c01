"""codegen.jit: compiled value and gradient of scalar functions, one call or many rows, held to
the interpreter (Value and backward()) with every compiler and libtcc."""
import math

import numpy as np
import pytest

from codegen.lower import ir
from codegen.jit import INLINE_STATEMENTS, jit, jit_source
from codegen.backend.toolchain import BACKEND_NAMES
from conftest import requires
from micrograd_c import Value


@pytest.fixture(params=BACKEND_NAMES)
def jit_compiler(request):
    """Each backend: the compilers and libtcc."""
    return requires(request.param)


FUNCTIONS = {
    "seed": lambda a, b, c: -a + b * (c - a / b),
    "ops": lambda a, b, c: (a * b).tanh() + (b - c).exp() / (c * c + 1.0) + (a * a + 0.5).log() * 2.0,
    "kinks": lambda a, b, c: (a - b).relu() * c + a.max(c) - (b * 0.5).sigmoid(),
    "powers": lambda a, b, c: a ** 3 + b ** -2 + (c * c + 1.0) ** 0.5 + a ** 2 * b ** -1,
    "dot": lambda a, b, c: sum((x * y for x, y in [(a, b), (b, c), (c, a), (a, a), (b, b)]), c).tanh(),
}
ROWS = [(0.3, -1.2, 0.7), (1.5, 0.8, -0.4), (-0.9, 2.0, 1.1), (0.05, -0.6, -2.3)]


def interpret(fn, row):
    args = [Value(x) for x in row]
    out = fn(*args)
    out.backward()
    return out.data, tuple(a.grad for a in args)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_value_and_grad_equal_the_interpreter(name, jit_compiler):
    fn = FUNCTIONS[name]
    f = jit(compiler=jit_compiler)(fn)
    for row in ROWS:
        value, grads = interpret(fn, row)
        assert f(*row) == pytest.approx(value, rel=1e-12, abs=1e-14)
        got_value, got_grads = f(*row, grad=True)
        assert got_value == pytest.approx(value, rel=1e-12, abs=1e-14)
        np.testing.assert_allclose(got_grads, grads, rtol=1e-12, atol=1e-14)
    # all rows at once: a 2-D array, or one array per argument
    X = np.array(ROWS)
    values, grads = f(X, grad=True)
    expected = [interpret(fn, row) for row in ROWS]
    np.testing.assert_allclose(values, [e[0] for e in expected], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(grads, [e[1] for e in expected], rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(f(X[:, 0], X[:, 1], X[:, 2]), values)
    np.testing.assert_array_equal(f(*X.T, grad=True)[1], grads)


def test_the_issue_example_and_how_calls_mix():
    @jit
    def f(a, b, c):
        return -a + b * (c - a / b)

    assert f(1.0, 2.0, 3.0) == -1.0 + 2.0 * (3.0 - 0.5)
    assert f(1.0, 2.0, 3.0, grad=True) == (4.0, (-2.0, 3.0, 2.0))
    assert f(1, 2, 3) == 4.0 and f(np.float32(1), np.int64(2), 3.0) == 4.0  # other numbers
    assert f.__name__ == "f" and len(f.modules) == 1
    values = f(np.array([1.0, 2.0]), 2.0, np.array([3.0, 5.0]))  # scalars broadcast
    np.testing.assert_array_equal(values, [4.0, f(2.0, 2.0, 5.0)])
    X = np.arange(12.0).reshape(4, 3) + 1
    values, grads = np.empty(4), np.empty((4, 3))
    result = f(X, grad=True, out=(values, grads))
    assert result[0] is values and result[1] is grads
    np.testing.assert_array_equal(values, f(X))
    assert f(np.empty((0, 3))).shape == (0,)
    assert len(f.modules) == 1 and set(f.timings[3]) == {"trace", "codegen", "compile"}


def test_compiled_once_per_argument_count():
    @jit(compiler="libtcc")
    def total(*xs):
        return sum(xs[1:], xs[0] * 2.0)

    assert total(1.0, 2.0) == 4.0
    assert total(1.0, 2.0, 3.0, grad=True) == (7.0, (2.0, 1.0, 1.0))
    assert total(5.0, 1.0) == 11.0
    assert sorted(total.modules) == [2, 3]


def test_tracing_survives_the_first_arguments_and_constants():
    f = jit(compiler="libtcc")(lambda a, b: a / b)
    assert f(1.0, 0.0) == math.inf  # the trace with these values divides by zero: traced again
    assert f(3.0, 2.0, grad=True) == (1.5, (0.5, -0.75))
    constant = jit(compiler="libtcc")(lambda a, b: 2.5)
    assert constant(1.0, 7.0, grad=True) == (2.5, (0.0, 0.0))
    unused = jit(compiler="libtcc")(lambda a, b: a * 3.0)
    assert unused(2.0, 5.0, grad=True) == (6.0, (3.0, 0.0))


def test_big_functions_run_from_the_heap_without_inlining():
    def chain(a, b):
        y = a
        for i in range(3000):
            y = (y * 0.999 + b * 0.001).tanh() if i % 2 else y * b + 0.001
        return y

    f = jit(compiler="libtcc")(chain)
    row = (0.3, 0.9)
    value, grads = f(*row, grad=True)
    expected_value, expected_grads = interpret(chain, row)
    assert value == pytest.approx(expected_value, rel=1e-12)
    np.testing.assert_allclose(grads, expected_grads, rtol=1e-10)
    xs = [Value(0.3), Value(0.9)]
    program = ir.lower(chain(*xs), xs, (), input_grads=True)
    assert program.n_slots > 4096 and len(program.forward) + len(program.backward) > INLINE_STATEMENTS
    assert "#define INLINE_GRAPH 0" in jit_source(program)
    np.testing.assert_allclose(f(np.array([row, row]), grad=True)[1], [grads, grads], rtol=1e-15)


def test_bad_calls_say_what_is_wrong():
    f = jit(compiler="libtcc")(lambda a, b: a * b)
    f(1.0, 2.0)
    with pytest.raises(TypeError, match="argument 1 must be a number or a 1-D array"):
        f(1.0, "x")
    with pytest.raises(TypeError, match="of 2 dimensions"):
        f(np.ones((2, 2)), 1.0)
    with pytest.raises(ValueError, match="different lengths"):
        f(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match=r"out: grads must be a writable C-contiguous float64 array of shape \(2, 2\)"):
        f(np.ones((2, 2)), grad=True, out=(np.empty(2), np.empty((2, 3))))
    with pytest.raises(TypeError, match="needs at least one argument"):
        f()
    with pytest.raises(TypeError, match="must return a Value"):
        jit(compiler="libtcc")(lambda a: "text")(1.0)
    with pytest.raises(TypeError, match="jit needs a function"):
        jit(3)


def test_readme_jit_example_runs():
    from pathlib import Path
    import re
    readme = (Path(__file__).resolve().parent.parent / "docs" / "jit.md").read_text()
    code = re.search(r"# `codegen.jit`.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace = {}
    exec(code.replace("1_000_000", "1_000"), namespace)  # fewer rows: a quick test
    assert namespace["grads"].shape == (1000, 3) and namespace["values"].shape == (1000,)
