"""Subnormal numbers: a module computes with them flushed to zero (x86-64's FTZ and DAZ, set while
it holds its lock: templates/threads.c's lock_state), hands the caller's mode back when it
returns, and every thread that runs a share of its work computes in the same mode, so that the
numbers are the same with any count of threads (templates/pool.c)."""
import ctypes
import ctypes.util
import platform
import random

import numpy as np
import pytest

import codegen
from micrograd_c import MLP, Value

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                                reason="the flush is x86-64's MXCSR; elsewhere the mode is the caller's")

TINY = 1e-160  # a product of two is 1e-320, a float64 subnormal (float32's: 1e-20 * 1e-20)


def callers_subnormals_kept():
    """Whether this thread's arithmetic still makes subnormals (the caller's mode, not the module's)."""
    return np.float64(TINY) * np.float64(TINY) != 0.0 and TINY * TINY != 0.0


def test_a_modules_forward_flushes_a_subnormal_product_and_hands_the_mode_back(compiler):
    x, w = Value(TINY), Value(TINY)
    out = x * w
    assert out.data != 0.0  # (the interpreter: Python's floats keep it)
    net = codegen.compile(out, [x], [w], compiler=compiler)
    assert net.forward() == 0.0
    assert callers_subnormals_kept()
    net.backward()  # d(out)/dw = x: a normal number, as before
    assert np.asarray(net.grad)[0] == TINY
    assert callers_subnormals_kept()


@pytest.mark.parametrize("compiler", ["tcc", "gcc"], indirect=True)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_threads_of_a_batch_flush_as_the_caller_does(compiler, dtype):
    """A layer's products over a batch, shared by the caller and the workers (and predict()'s
    passes side by side): every product of two tiny numbers flushed on whichever thread ran it."""
    tiny = TINY if dtype == "float64" else 1e-20
    random.seed(0)
    model = MLP(64, [256, 4])
    xs = [Value(0.0) for _ in range(64)]
    hidden = model.layers[0](xs)
    for layer in model.layers:
        for neuron in layer.neurons:
            for w in neuron.w:
                w.data = tiny
            neuron.b.data = 0.0
    net = codegen.compile(sum(model.layers[1](hidden)), xs, model.parameters(), outputs=hidden,
                          batch=128, dtype=dtype, compiler=compiler)
    X = np.full((1024, 64), tiny)
    outputs = {threads: net.predict(X, threads=threads) for threads in (1, 2)}
    assert not np.any(outputs[1]) and not np.any(outputs[2])  # (kept, they would be 64 * tiny**2)
    assert callers_subnormals_kept()


@pytest.mark.parametrize("compiler", ["tcc", "gcc"], indirect=True)
def test_the_workers_compute_in_the_callers_mode(compiler):
    """Workers started under one mode (they inherit their creator's) take the caller's at every
    product: under upward rounding, 2 threads give the bits of 1."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    random.seed(1)
    model = MLP(64, [256, 4])
    xs = [Value(0.0) for _ in range(64)]
    hidden = model.layers[0](xs)
    net = codegen.compile(sum(model.layers[1](hidden)), xs, model.parameters(), outputs=hidden,
                          batch=128, compiler=compiler)
    X = np.random.default_rng(0).random((1024, 64))
    nearest = np.asarray(net.predict(X, threads=2))  # (the workers start here)
    FE_UPWARD = 0x800  # (x86's <fenv.h>)
    assert libm.fesetround(FE_UPWARD) == 0
    try:
        upward = {threads: np.asarray(net.predict(X, threads=threads)) for threads in (1, 2)}
    finally:
        libm.fesetround(0)
    assert not np.array_equal(upward[1], nearest)
    assert np.array_equal(upward[2], upward[1])
