"""Tokens as inputs: gather (values[index] for an index that is an input Value) and Table (a
table of rows indexed by one: an embedding lookup), interpreted as Python's list indexing and
compiled to a read at the index (its backward adds into the picked value only), on every
compiler, scalar, fused and float32, one sample at a time and over a batch; an index out of range
is an error in both and reads nothing.
"""

import functools
from array import array

import numpy as np
import pytest

import codegen
from conftest import compiler_diagonal
from micrograd_c import Table, Value, dot, gather
from test_compile import COLUMNS, MODES, RTOL, assert_results_close, interpret_once, run_compiled

V, E = 6, 3  # vocabulary, embedding width
N_PARAMS = 2 * V * E + 3


def softmax(logits):
    """microgpt's softmax with its max in the graph (Value.max), not read from .data"""
    top = functools.reduce(Value.max, logits)
    exps = [(x - top).exp() for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def next_token_loss(p, x):
    """x = (token, target, other): an embedding row by the token, logits by a head, the target's
    probability picked by a gather; a gather among unevenly spaced params and one among constants
    by the third index."""
    table = Table([p[v * E:(v + 1) * E] for v in range(V)])
    head = [p[V * E + v * E:V * E + (v + 1) * E] for v in range(V)]
    h = [e.tanh() for e in table[x[0]]]
    probs = softmax([dot(w, h) for w in head])
    uneven = gather([p[-1], p[-3], p[-2], p[0]], x[2])
    constant = gather([0.5, -1.5, 2.0, 3.0], x[2])
    return -gather(probs, x[1]).log() + (uneven * constant).tanh()


ROWS = [[2, 5, 0], [0, 1, 3], [-1, 3, -2], [5, 0, 1], [3, 3, 2], [2, 2, -4]]


def columns(rows, n_x):
    """train()'s X (the first n_x inputs) and Y (the others) of whole input rows"""
    return np.ascontiguousarray(rows[:, :n_x]), np.ascontiguousarray(rows[:, n_x:])


def params():
    rng = np.random.default_rng(7)
    return rng.normal(0, 0.5, N_PARAMS).tolist()


def test_interpreter_is_python_indexing():
    values = [Value(float(v)) for v in range(5)]
    for i in range(-5, 5):
        picked = gather(values, Value(i))
        assert picked.data == values[i].data
        picked.backward()
        assert [v.grad for v in values] == [1.0 * (v is values[i]) for v in values]
        for v in values:
            v.grad = 0
    rows = Table([[Value(10.0 * r + c) for c in range(3)] for r in range(4)])
    assert [v.data for v in rows[Value(2)]] == [20.0, 21.0, 22.0]
    assert rows[1] is list.__getitem__(rows, 1) and isinstance(rows[1:], list)  # other indices: the list's own
    assert gather([1.0, 2.0], Value(1.0)).data == 2.0  # an int held as a float; numbers become constants


def test_interpreter_errors():
    values = [Value(1.0), Value(2.0)]
    with pytest.raises(IndexError, match="index 2 out of range for 2 values"):
        gather(values, Value(2))
    with pytest.raises(IndexError):
        gather(values, Value(-3))
    with pytest.raises(TypeError, match="integer"):
        gather(values, Value(0.5))
    with pytest.raises(TypeError, match="must be a Value"):
        gather(values, 1)


def test_gradient_lands_in_the_picked_row_only(compiler):
    table = Table([[Value(float(r + c)) for c in range(4)] for r in range(5)])
    token = Value(3)
    loss = sum(e * e for e in table[token])
    net = codegen.compile(loss, inputs=[token], params=[p for row in table for p in row], compiler=compiler)
    for t in (3, 0, -1):
        net.set_input(array("d", [t]))
        net.forward()
        net.zero_grad()
        net.backward()
        grad = np.asarray(net.grad)[:20].reshape(5, 4)
        expected = np.zeros((5, 4))
        expected[t] = 2 * np.array([t % 5 + c for c in range(4)])
        np.testing.assert_array_equal(grad, expected)


# Every column on TCC, each on one optimising compiler (the -O2 ones first); the rest in the slow set
@pytest.mark.parametrize("compiler, column", list(compiler_diagonal(
    sorted(COLUMNS, key=lambda column: (-column[1], column[0] != "fused")), lambda column: "%s-O%d" % column)),
    indirect=["compiler"])
def test_compiled_equals_interpreted(compiler, column):
    mode, opt = column
    expected = interpret_once(next_token_loss, tuple(params()), ROWS)
    got = run_compiled(next_token_loss, params(), ROWS, compiler=compiler, opt=opt, **MODES[mode])
    assert_results_close(expected, got, mode)


def test_gathers_over_a_batch_equal_one_by_one():
    """train(batch_size=4) through the batched program (gathers over the samples, several picking
    the same row) against the program that runs the samples one at a time."""
    p = [Value(v) for v in params()]
    x = [Value(float(v)) for v in ROWS[0]]
    loss = next_token_loss(p, x)
    X = np.array(ROWS * 4, dtype=np.float64)
    trained = []
    for batch in (1, 8):
        sources = codegen.generate(loss, inputs=x, params=p, batch=batch)
        assert ("#define HAVE_BATCH 1" in sources[0]) == (batch > 1)
        net = codegen.compile(loss, inputs=x, params=p, batch=batch, sources=sources, compiler="tcc")  # (the
        # lowering is what differs; the compilers are compared sample by sample above)
        for _ in range(3):
            net.train(*columns(X, 1), 0.05, batch_size=4)  # (the targets: Y's columns)
        trained.append(np.array(net.params))
    np.testing.assert_allclose(trained[1], trained[0], rtol=RTOL["fused"], atol=RTOL["fused"])
    assert np.abs(trained[0] - np.array(params())).max() > 1e-3  # they trained


@pytest.fixture(scope="module")
def net():
    p = [Value(v) for v in params()]
    x = [Value(float(v)) for v in ROWS[0]]
    loss = next_token_loss(p, x)
    return codegen.compile(loss, inputs=x, params=p, outputs=loss, compiler="tcc")


@pytest.mark.parametrize("bad", [6, -7, 1.5, float("inf")])
def test_an_index_out_of_range_is_an_error(net, bad):
    net.set_input(array("d", ROWS[0]))
    before_params, before_inputs = list(net.params), list(net.inputs)
    with pytest.raises(IndexError, match=r"set_input\(\): input 0 is an index into 6 values"):
        net.set_input(array("d", [bad, 0, 0]))
    assert list(net.inputs) == before_inputs
    rows = np.array(ROWS + [[0, bad, 0]], dtype=np.float64)
    with pytest.raises(IndexError, match="train\\(\\): input 1 at row 6 is an index into 6 values"):
        net.train(*columns(rows, 2), 0.1)
    with pytest.raises(IndexError, match="train\\(\\): input 1 at row 6"):  # in Y's columns
        net.train(*columns(rows, 1), 0.1, batch_size=4)
    assert list(net.params) == before_params  # nothing trained on the rows before it
    with pytest.raises(IndexError, match="at row 6"):
        net.predict(np.array(ROWS + [[bad, 0, 0]], dtype=np.float64))
    net.inputs[2] = bad  # written past set_input's check: forward and backward check again
    with pytest.raises(IndexError, match=r"forward\(\): input 2 is an index into 4 values"):
        net.forward()
    with pytest.raises(IndexError, match=r"backward\(\)"):
        net.backward()
    net.set_input(array("d", ROWS[0]))
    assert np.isfinite(net.forward())


@pytest.mark.parametrize("kind", ["float64", "float32", "uint8"])
def test_train_checks_every_rows_indices_in_any_x(net, kind):
    """train() and predict() check the index inputs of all their rows at once (templates/samples.c's
    index_inputs_good: one pass, as row_input reads them, X scaled), and where one is bad say the
    first bad row, as one by one: in X of float64, float32 and uint8 (its scale making a value no
    integer, or out of range), and in Y's columns."""
    good = np.array([[a % 6, b % 6, c % 4] for a, b, c in ROWS], dtype=np.float64)  # (uint8: no negatives)
    x, y = columns(good, 2)
    before = list(net.params)
    net.train(x.astype(kind), y, 0.0, batch_size=2, scale=1.0)
    net.train((2 * x).astype(kind), y, 0.0, batch_size=2, scale=0.5)  # (scaled back to the indices)
    assert net.predict((2 * good).astype(kind), scale=0.5).shape[0] == len(good)
    for row, column, bad, scale in ((3, 0, 3, 0.5), (5, 1, 12, 0.5), (0, 1, 6, 1.0), (4, 0, 7, 1.0)):
        rows = good.copy()
        rows[:, :2] /= scale  # (X's columns, scaled back when they run)
        rows[row, column] = bad
        with pytest.raises(IndexError, match=rf"train\(\): input {column} at row {row} is an index into 6 values"):
            net.train(*(a.astype(kind) if k == 0 else a for k, a in enumerate(columns(rows, 2))), 0.1, scale=scale)
    bad_y = good.copy()
    bad_y[2, 2] = 4  # (input 2: an index into 4 values)
    with pytest.raises(IndexError, match=r"train\(\): input 2 at row 2"):  # in Y's columns
        net.train(*columns(bad_y, 2), 0.1)
    assert list(net.params) == before


@pytest.mark.parametrize("index", ["param", "computed"])
def test_an_index_must_be_an_input_or_a_constant(index):
    values = [Value(1.0), Value(2.0)]
    p, x = Value(1.0), Value(0.0)
    i = p if index == "param" else x * 1.0
    with pytest.raises(ValueError, match=f"gather's index must be one of the inputs.*{'parameter' if index == 'param' else 'computed'}"):
        codegen.compile(gather(values, i) * values[0], inputs=[x], params=[p] + values, compiler="tcc")
    constant = gather(values, Value(1)) * values[0]  # a constant index is baked in, as any constant
    net = codegen.compile(constant, params=values, compiler="tcc")
    assert net.forward() == 2.0


def test_in_graph_max_is_the_data_max_to_the_last_bit():
    rng = np.random.default_rng(3)
    for _ in range(50):
        logits = [Value(v) for v in rng.normal(0, 10, 27)]
        assert functools.reduce(Value.max, logits).data == max(v.data for v in logits)
