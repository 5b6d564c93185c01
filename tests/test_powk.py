"""The op table's powk (`x ** k` for a number k): the exponents micrograd's idioms use written out
(micrograd_c/ops.py's _powk, templates/prelude.c's powk), the interpreter's and the compiled
code's the same term for term: the same bits on every compiler, special values included, and
pow's value or a rounding away."""

import math

import numpy as np
import pytest

import codegen
from micrograd_c import Value, ops

EXPONENTS = (2, -1, -2, -0.5, -1.5, 3, 0.5)
POINTS = (0.7, 3.0, 1e-3, 123.25, 0.0, -0.0, -2.0, math.inf)


@pytest.mark.parametrize("k", EXPONENTS)
def test_written_out_exponents_are_pow_or_a_rounding_away(k):
    for x in (0.7, 3.0, 1e-3, 123.25, 2.0 ** -30):
        assert math.isclose(ops._powk(x, k), x ** k, rel_tol=3e-16)


def test_special_values_as_c_gives_them():
    assert ops._powk(0.0, -1) == math.inf and ops._powk(-0.0, -1) == -math.inf
    assert ops._powk(0.0, -0.5) == math.inf and math.isnan(ops._powk(-2.0, -0.5))
    assert ops._powk(math.inf, -1.5) == 0.0 and ops._powk(-0.0, -2) == math.inf


def test_compiled_powk_is_the_interpreters_bit_for_bit(compiler):
    xs = [Value(0.0) for _ in POINTS]
    outputs = [x ** k for x in xs for k in EXPONENTS]
    loss = sum(o * 0.0 for o in outputs)  # (the outputs are what is compared)
    net = codegen.compile(loss, xs, outputs=outputs, compiler=compiler, fuse=False)
    for x, value in zip(xs, POINTS):
        x.data = value
    net.set_input(np.array(POINTS))
    net.forward()
    expected = [ops._powk(x, k) for x in POINTS for k in EXPONENTS]
    got = list(net.outputs())
    assert [repr(v) for v in got] == [repr(v) for v in expected]
