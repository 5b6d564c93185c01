"""Sparse inputs: dots over an input range visit only its chunks of eight values that hold a
nonzero, when under three quarters do (templates/kernels/sparse.c's dot_nz, axpy_nz, sgd_axpy_nz).
Held to the interpreter within the fused mode's tolerance, on sparse, dense and all-zero rows,
and to the dense kernels exactly; the nonzero lists follow every way the inputs change."""

import random
import re

import numpy as np
import pytest

import codegen
import templates
from conftest import compiler_diagonal
from micrograd_c import MLP, Value
from micrograd_c.losses import cross_entropy
from test_compile import assert_equivalent, mlp_case
from test_module import N_CLASSES, N_IN, small_classifier

N_PIXELS = 40


def rows(n=6, seed=0):
    """Rows of N_PIXELS inputs and a target: sparse (10% nonzero), dense, all zero, one-hot-like."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.uniform(-1, 1, N_PIXELS)
        if i % 3 == 0:
            x *= rng.random(N_PIXELS) < 0.1
        elif i % 3 == 2:
            x[:] = 0.0
            x[i] = 1.0
        out.append(list(x) + [float(rng.uniform(-1, 1))])
    out[1] = [0.0] * N_PIXELS + [0.5]
    return out


@pytest.mark.parametrize("compiler, mode", list(compiler_diagonal(["fused", "float32"])), indirect=["compiler"])
def test_sparse_rows_equal_the_interpreter(compiler, mode):
    build, init = mlp_case(N_PIXELS, (8, 1))
    assert_equivalent(build, init, rows(), mode, compiler=compiler, opt=2, sparse_inputs=True)


def test_the_first_layer_uses_the_nonzero_lists():
    build, init = mlp_case(N_PIXELS, (8, 1))
    from micrograd_c import Value
    params, inputs = [Value(v) for v in init], [Value(0.0) for _ in range(N_PIXELS + 1)]
    sources = codegen.generate(build(params, inputs), inputs, params, sparse_inputs=True)
    source = "\n".join(sources)
    layers = re.findall(r"matvec\(d [^;]*, (NULL|\(const int32_t \*\)\(d \+ \d+\) \+ 0)\);", source)
    assert len(layers) == 1 and layers[0] != "NULL"  # the first layer, with the pixels' list
    assert "sgd_axpy_nz(" in source and "axpy_nz(g" in source
    assert "scan_range(d + " in source  # one range: the pixels
    dense = "\n".join(codegen.generate(build(params, inputs), inputs, params))  # off by default
    assert "dot_nz(d" not in dense and "#define NONZERO_WORDS 0" in dense


def chunk_patterns(n_in, n=48, seed=1):
    """uint8 rows of n_in pixels: about 30% nonzero, dense, all zero, and rows whose nonzeros lie
    in one chunk of eight (even or odd) or only after the last whole chunk."""
    rng = np.random.default_rng(seed)
    X = (rng.integers(0, 256, (n, n_in)) * (rng.random((n, n_in)) < 0.3)).astype(np.uint8)
    X[::6] = rng.integers(1, 256, (len(X[::6]), n_in))
    X[1::6] = 0
    for row, first in zip(X[2::6], range(0, n_in, 8)):
        row[:] = 0
        row[first:first + 8] = rng.integers(1, 256, len(row[first:first + 8]))
    X[3::6, :n_in // 8 * 8] = 0
    return X


# every (inputs, dtype) on TCC, two on each optimising compiler (one width, both dtypes); the rest
# in the slow set
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("compiler, case", list(compiler_diagonal(
    [(19, "float64"), (45, "float32"), (64, "float64"), (19, "float32"), (45, "float64"), (64, "float32")],
    lambda case: "%d-%s" % case)), indirect=["compiler"])
def test_train_equals_the_dense_kernels(compiler, case, batch_size):
    """train() and predict() on mixed sparse and dense rows give the dense kernels' numbers
    exactly: the chunks left out add exact zeros and the rest are summed in dot()'s lanes."""
    n_in, dtype = case
    random.seed(n_in)
    model = MLP(n_in, [8, N_CLASSES])
    xs, ys = [Value(0.0) for _ in range(n_in)], [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(xs)
    nets = [codegen.compile(cross_entropy(logits, ys), xs + ys, model.parameters(), outputs=logits,
                            compiler=compiler, sparse_inputs=sparse, dtype=dtype) for sparse in (True, False)]
    sources = ["".join(f.read_text() for f in net.build.c_files) for net in nets]
    assert "sgd_axpy_nz(d" in sources[0] and "_nz(d" not in sources[1]
    X = chunk_patterns(n_in)
    labels = np.random.default_rng(2).integers(0, N_CLASSES, len(X))
    for rows, scale in ((X, 1 / 255), (X / 255.0, 1.0), (X, 1 / 255)):  # uint8 and float64 rows
        losses = [net.train(rows, labels, 0.05, scale=scale, batch_size=batch_size) for net in nets]
        assert losses[0] == losses[1]
    np.testing.assert_array_equal(np.asarray(nets[0].params), np.asarray(nets[1].params))
    for rows, scale in ((X, 1 / 255), (X.astype(np.float32), 1 / 255)):
        np.testing.assert_array_equal(*(np.asarray(net.predict(rows, scale=scale)) for net in nets))


def test_writes_through_the_views_are_seen(compiler):
    """The nonzero lists follow inputs written through `inputs` and `data`, between calls and
    between forward() and backward()."""
    model, xs, ys, logits, loss = small_classifier(0)
    net, dense = (codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler,
                                  sparse_inputs=sparse) for sparse in (True, False))
    sparse_row = np.zeros(N_IN + N_CLASSES)
    sparse_row[[1, N_IN + 2]] = [0.7, 1.0]
    dense_row = np.linspace(0.1, 0.9, N_IN + N_CLASSES)
    net.set_input(sparse_row)
    net.forward()
    np.asarray(net.inputs)[:] = dense_row            # a dense row written into the view
    dense.set_input(dense_row)
    assert net.forward() == pytest.approx(dense.forward(), rel=1e-12)
    np.asarray(net.data)[net.n_params:net.n_params + N_IN] = 0.0   # then mostly zeros, via `data`
    np.asarray(net.data)[net.n_params + 3] = -0.4
    row = dense_row.copy()
    row[:N_IN] = 0.0
    row[3] = -0.4
    dense.set_input(row)
    assert net.forward() == pytest.approx(dense.forward(), rel=1e-12)
    for m in (net, dense):                         # dense again, between forward and backward:
        np.asarray(m.inputs)[:N_IN] = 0.25         # backward reads the pixels as they are now
        m.zero_grad()
        m.backward()
    np.testing.assert_allclose(np.asarray(net.grad)[:net.n_params], np.asarray(dense.grad)[:net.n_params],
                               rtol=1e-12, atol=1e-15)
