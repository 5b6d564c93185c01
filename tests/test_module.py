"""The compiled module as a user meets it: its functions' semantics, bad input, state access,
the build cache."""

import math
import random
from array import array

import numpy as np
import pytest

import codegen
from codegen.backend.toolchain import find_compiler
from conftest import seeded_cache
from micrograd_c import MLP, Value, cross_entropy

N_IN, N_CLASSES = 6, 3


def small_classifier(seed=0, hidden=8, row=None):
    """An MLP classifier as a compiled graph: inputs are N_IN features then a one-hot target (their
    values: row's, else 0)."""
    random.seed(seed)
    model = MLP(N_IN, [hidden, N_CLASSES])
    row = np.zeros(N_IN + N_CLASSES) if row is None else row
    xs = [Value(float(x)) for x in row[:N_IN]]
    ys = [Value(float(y)) for y in row[N_IN:]]
    logits = model(xs)
    return model, xs, ys, logits, cross_entropy(logits, ys)


def compile_classifier(seed=0, compiler=None, **options):
    model, xs, ys, logits, loss = small_classifier(seed)
    return codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler, **options), model


@pytest.fixture(scope="module")
def net():
    return compile_classifier()[0]


def data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, N_IN), dtype=np.uint8), rng.integers(0, N_CLASSES, size=n)


def input_row(x, label, scale=1 / 255):
    """A sample as the module's inputs: the features times scale, then the one-hot target."""
    row = np.zeros(N_IN + N_CLASSES)
    row[:N_IN], row[N_IN + label] = x * scale, 1.0
    return row


def manual_epoch(net, X, labels, lr, scale, batch_size):
    """train() spelled out with the single-step functions."""
    losses = []
    net.zero_grad()
    for start in range(0, len(X), batch_size):
        rows = range(start, min(start + batch_size, len(X)))
        for i in rows:
            net.set_input(input_row(X[i], labels[i], scale))
            losses.append(net.forward())
            net.backward()
        net.update(lr / len(rows))
        net.zero_grad()
    return float(np.mean(losses))


@pytest.mark.parametrize("batch_size", [1, 4, 7])
@pytest.mark.parametrize("fuse", [True, False])
def test_train_equals_the_single_step_functions(compiler, batch_size, fuse):
    X, labels = data()
    a, model = compile_classifier(compiler=compiler, fuse=fuse)
    b, _ = compile_classifier(compiler=compiler, fuse=fuse)
    expected = manual_epoch(a, X, labels, 0.05, 1 / 255, batch_size)
    got = b.train(X, labels, 0.05, scale=1 / 255, batch_size=batch_size)
    assert got == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(np.asarray(b.params), np.asarray(a.params), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("batch_size", [1, 4])
def test_backward_leaves_the_gradients_it_wrote_zero(compiler, batch_size):
    """A fused module's backward sets each gradient back to 0 once read (codegen/write/emit.py's
    clears), so train() clears none before the next row; with the inputs' gradients, which no
    group reads, the runtime clears them all before each backward as before: after train(),
    they are the last row's (the next train() call's too)."""
    X, labels = data(n=9)
    model, xs, ys, logits, loss = small_classifier()
    assert "#define BACKWARD_CLEARS 1" in codegen.generate(loss, xs + ys, model.parameters(), logits)[0]
    assert "#define BACKWARD_CLEARS 1" not in codegen.generate(loss, xs + ys, model.parameters(), input_grads=True)[0]
    net = codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler)
    net.train(X, labels, 0.05, scale=1 / 255, batch_size=batch_size)
    assert np.count_nonzero(np.asarray(net.grad)[net.n_params:]) == 0
    with_inputs = codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler, input_grads=True)
    stepped = codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler, input_grads=True)
    with_inputs.train(X[:-1], labels[:-1], 0.05, scale=1 / 255, batch_size=batch_size)
    stepped.set_params(with_inputs.params)
    with_inputs.train(X[-1:], labels[-1:], 0.05, scale=1 / 255)
    stepped.set_input(input_row(X[-1], labels[-1]))
    stepped.forward()
    stepped.backward()
    inputs = slice(with_inputs.n_params, with_inputs.n_params + N_IN)
    assert np.count_nonzero(np.asarray(stepped.grad)[inputs]) > 0
    np.testing.assert_array_equal(np.asarray(with_inputs.grad)[inputs], np.asarray(stepped.grad)[inputs])


def test_step_backward_leaves_every_gradient_where_train_clears_them(compiler):
    """Where backward_body clears what it read, the step API's backward() is one that does not
    (STEP_OWN_BACKWARD, when no row is tracked: here Adam's): afterwards `grad` holds every node's
    gradient, as micrograd's Values do; train() after it still clears."""
    model, xs, ys, logits, loss = small_classifier()
    options = dict(outputs=logits, optimizer=codegen.Adam())
    unit = codegen.generate(loss, xs + ys, model.parameters(), **options)[0]
    assert "#define BACKWARD_CLEARS 1" in unit and "#define STEP_OWN_BACKWARD 1" in unit
    net = codegen.compile(loss, xs + ys, model.parameters(), compiler=compiler, **options)
    program = codegen.explain(loss, xs + ys, model.parameters(), outputs=logits).program
    X, labels = data(n=3)
    row = input_row(X[0], labels[0])
    *_, interpreted, interpreted_loss = small_classifier(row=row)  # (the interpreter's, at the row)
    interpreted_loss.backward()
    net.set_input(row)
    net.forward()
    net.zero_grad()
    net.backward()
    grads = np.asarray(net.grad)
    for node, value in zip(program.outputs, interpreted):
        assert value.grad != 0 and grads[node.grad_slot] == pytest.approx(value.grad, rel=1e-12)
    del grads
    net.train(X, labels, 0.05, scale=1 / 255)
    assert np.count_nonzero(np.asarray(net.grad)[net.n_params:]) == 0


def test_train_with_float_targets_and_shuffle(net):
    X, labels = data()
    Y = np.eye(N_CLASSES)[labels]
    a, _ = compile_classifier()
    b, _ = compile_classifier()
    assert a.train(X.astype(np.float64), Y, 0.05, scale=1 / 255) == pytest.approx(
        b.train(X, labels, 0.05, scale=1 / 255), rel=1e-15)
    shuffled = [compile_classifier()[0] for _ in range(3)]
    losses = [m.train(X, labels, 0.05, scale=1 / 255, seed=s) for m, s in zip(shuffled, [5, 5, 6])]
    assert losses[0] == losses[1] != losses[2]
    assert not np.array_equal(np.asarray(shuffled[0].params), np.asarray(a.params))


def test_predict_equals_forward_outputs(net):
    """predict() runs the rows as one batch (codegen/lower/batch.py: a layer is a matrix product, its
    sums in another order), so it equals forward() to the fused bound; a module without the
    batched program (batch=1) runs row by row, exactly as forward()."""
    X, labels = data(5)
    row_by_row, _ = compile_classifier(batch=1)
    for module, rtol in ((net, 1e-12), (row_by_row, 0)):
        got = np.asarray(module.predict(X, scale=0.5))
        assert got.shape == (5, N_CLASSES)
        for i in range(5):
            row = np.zeros(N_IN + N_CLASSES)
            row[:N_IN] = X[i] * 0.5
            module.set_input(row)
            module.forward()
            np.testing.assert_allclose(got[i], module.outputs(), rtol=rtol, atol=0)


def test_values_round_trip_and_state_views(compiler):
    net, model = compile_classifier(compiler=compiler)
    params = model.parameters()
    np.testing.assert_array_equal(np.asarray(net.params), [p.data for p in params])
    X, labels = data()
    net.train(X, labels, 0.1, scale=1 / 255)
    codegen.copy_to_values(net, params)
    assert [p.data for p in params] == list(net.params)
    fresh, _ = compile_classifier(seed=1, compiler=compiler)
    codegen.copy_from_values(fresh, params)
    assert list(fresh.params) == list(net.params)
    view = np.asarray(net.data)  # zero-copy and writable
    view[0] = 42.0
    assert net.params[0] == 42.0
    assert np.asarray(net.grad).shape == (net.n_slots,)
    with pytest.raises(ValueError, match="parameters"):
        codegen.copy_to_values(net, params[:-1])


def test_two_loads_of_one_cached_module_have_their_own_state():
    a, _ = compile_classifier()
    b, _ = compile_classifier()
    assert a.build.path == b.build.path and b.build.cached
    a.params[0] = 7.0
    assert b.params[0] != 7.0


def test_cache_hit_miss_and_two_models_side_by_side(tmp_path):
    tmp_path = seeded_cache(tmp_path, None)  # (the runtime's object in it: the models are what is built)
    first, _ = compile_classifier(seed=0, cache=tmp_path)
    again, _ = compile_classifier(seed=0, cache=tmp_path)
    assert not first.build.cached and again.build.cached and again.build.path == first.build.path
    model, xs, ys, logits, loss = small_classifier()
    other = codegen.compile(loss * 2.0, xs + ys, model.parameters(), outputs=logits, cache=tmp_path)
    assert not other.build.cached and other.build.path != first.build.path
    row = np.linspace(0, 1, N_IN + N_CLASSES)
    first.set_input(row)
    other.set_input(row)
    assert other.forward() == pytest.approx(2 * first.forward(), rel=1e-15)


def test_emitted_c_is_deterministic():
    graphs = [small_classifier(seed=3) for _ in range(2)]
    texts = {tuple(codegen.generate(g[4], g[1] + g[2], g[0].parameters(), g[3])) for g in graphs}
    assert len(texts) == 1


def test_templates_fill_every_placeholder():
    """templates.fill is the one way generated C gets into a template: a placeholder left without a
    value is an error, not C that fails to compile."""
    import templates
    with pytest.raises(KeyError, match="model.c: no value for @GRAPH@"):
        templates.fill("model.c", CONSTANTS="")
    header = templates.fill("export/frozen.h", NAME="m", UPPER="M", GUARD="M_H", N_INPUTS=1, N_OUTPUTS=2, N_SLOTS=3,
                            UNUSED="values a template does not use are left out")
    assert "@" not in header and "int m_predict(const double *in, double *out);" in header


def test_generated_sources_are_self_contained():
    """Every template a module or jit source includes is spliced in once: the cache keys a build by
    its text and keeps that text beside it, so an edited template is a new build."""
    import templates
    from codegen import jit

    g = small_classifier(seed=3)
    sources = codegen.generate(g[4], g[1] + g[2], g[0].parameters(), g[3])
    runtime, products = sources[-2:]  # the module runtime's two units, the same for every model
    assert all(isinstance(s, templates.SharedSource) for s in (runtime, products))
    assert not any(isinstance(s, templates.SharedSource) for s in sources[:-2])
    jitted = jit.jit_source(codegen.lower.ir.lower(g[4], g[1] + g[2], g[0].parameters(), g[3]))
    for source, included in ((runtime, ["threads.c", "optim.c", "args.c", "samples.c", "driver.c", "step.c"]),
                             (products, ["kernels/gemm.c", "kernels/conv.c"]),
                             (sources[0], ["model.h"]), (jitted, ["args.c"])):
        assert "@INCLUDE" not in source
        for name in included:
            first_function = next(line for line in templates.read(name).splitlines() if line.startswith(("static", "SHARED")))
            assert source.count(first_function) == 1, (name, first_function)


def test_constants_are_printed_exactly(compiler):
    x = Value(0.0)
    tiny, third, big = 5e-324, 1 / 3, 1.7976931348623157e308
    out = (x + tiny) * third + (x * 1e-300 + big) * 0.5 - 0.1
    net = codegen.compile(out, [x], [], compiler=compiler, opt=2)
    assert net.forward() == out.data


def test_infinite_and_nan_constants_in_the_constants_table(compiler):
    """Constants a loop reads sit in a static table; -inf there once stopped TCC ("initializer
    element is not constant"; found by tests/test_fuzz.py)."""
    x = Value(0.5)
    outs = [x * c + x * 2.0 + x * 3.0 + x * 4.0 for c in (float("-inf"), float("inf"), float("nan"))]
    net = codegen.compile(outs[0], [x], [], outputs=outs, compiler=compiler, opt=2)  # one module, all three
    assert net.forward() == outs[0].data
    assert net.outputs()[:2] == (outs[0].data, outs[1].data) == (-math.inf, math.inf)
    assert math.isnan(outs[2].data) and math.isnan(net.outputs()[2])


def test_a_leaf_output_and_a_constant_output(compiler):
    p, x = Value(2.0), Value(3.0)
    net = codegen.compile(p * x, [x], [p], outputs=[p, Value(1.5)], compiler=compiler)
    assert net.forward() == 6.0
    assert net.outputs() == (2.0, 1.5)


@pytest.mark.parametrize("outputs_of, expected", [(lambda p: None, ()), (lambda p: (), ()), (lambda p: p, (2.0,)),
                                                   (lambda p: [p], (2.0,))], ids=["none", "empty", "one", "list"])
def test_outputs_may_be_none_or_one_value(outputs_of, expected):
    p, x = Value(2.0), Value(3.0)
    net = codegen.compile(p * x, [x], [p], outputs=outputs_of(p), compiler="tcc")
    assert net.forward() == 6.0
    assert net.outputs() == expected


# ---- bad input: a clear exception naming the function, and the state left as it was ----------

def test_bad_arguments_raise_clear_errors(net):
    before = bytes(net.data)
    good = np.zeros(N_IN + N_CLASSES)
    X, labels = data(4)
    cases = [
        (lambda: net.set_input(), TypeError, r"set_input\(\) takes 1 argument \(0 given\)"),
        (lambda: net.set_input(good, good), TypeError, r"set_input\(\) takes 1 argument \(2 given\)"),
        (lambda: net.set_input([0.0] * 9), TypeError, r"set_input\(\): the input must be a C-contiguous buffer"),
        (lambda: net.set_input(np.zeros(8)), ValueError, r"set_input\(\): the input must hold 9 values, got 8"),
        (lambda: net.set_input(np.zeros(9, np.int32)), TypeError, r"set_input\(\).*format 'i'; expected float64 \('d'\) or float32"),
        (lambda: net.set_input(np.zeros(18)[::2]), ValueError, r"set_input\(\).*C-contiguous"),
        (lambda: net.set_input(np.zeros((3, 3))), ValueError, r"must have 1 dimension"),
        (lambda: net.set_input(np.full(9, np.nan)), ValueError, r"set_input\(\): the input holds NaN at index 0"),
        (lambda: net.set_params(np.zeros(3)), ValueError, r"set_params\(\): the parameters must hold 83"),
        (lambda: net.update(), TypeError, r"update\(\) takes 1 argument"),
        (lambda: net.update("0.1"), TypeError, r"update\(\): lr must be a number, not str"),
        (lambda: net.update(float("nan")), ValueError, r"update\(\): lr must be finite"),
        (lambda: net.forward(1), TypeError, r"forward\(\) takes no arguments"),
        (lambda: net.backward(1), TypeError, r"backward\(\) takes no arguments"),
        (lambda: net.zero_grad(1), TypeError, r"zero_grad\(\) takes no arguments"),
        (lambda: net.outputs(1), TypeError, r"outputs\(\) takes no arguments"),
        (lambda: net.train(X, labels), TypeError, r"train\(\) missing required argument 'lr'"),
        (lambda: net.train(X, labels, 0.1, rate=2), TypeError, r"unexpected keyword argument 'rate'"),
        (lambda: net.train(X, labels, 0.1, lr=2), TypeError, r"multiple values for argument 'lr'"),
        (lambda: net.train(X, labels, 0.1, 1, 1, 1, 1, None, 1), TypeError, r"train\(\) takes 3 to 8 arguments \(9 given\)"),
        (lambda: net.train(X, labels, 0.1, batch_size=0), ValueError, r"batch_size must be >= 1, got 0"),
        (lambda: net.train(X, labels, 0.1, batch_size=1.5), TypeError, r"batch_size must be an int"),
        (lambda: net.train(X, labels, float("inf")), ValueError, r"lr must be finite"),
        (lambda: net.train(X[0], labels, 0.1), ValueError, r"train\(\): X must have 2 dimensions, got 1"),
        (lambda: net.train(X.astype(np.int16), labels, 0.1), TypeError, r"X has element format 'h'"),
        (lambda: net.train(X, labels[:3], 0.1), ValueError, r"X has 4 rows but Y has 3"),
        (lambda: net.train(X, labels + 3, 0.1), ValueError, r"label 3 at row 0 is outside 0..2"),
        (lambda: net.train(X, labels.astype(float), 0.1), TypeError, r"Y has element format 'd'; expected integers"),
        (lambda: net.train(X, np.zeros((4, 2)), 0.1), ValueError, r"Y has 2 columns; .* must have 3"),
        (lambda: net.train(X, "abc", 0.1), TypeError, r"Y must be a buffer"),
        (lambda: net.train(np.zeros((4, 10), np.uint8), labels, 0.1), ValueError, r"X has 10 columns but the model has only 9 inputs"),
        (lambda: net.train(np.full((4, N_IN), np.nan), labels, 0.1), ValueError, r"X holds NaN"),
        (lambda: net.predict(), TypeError, r"predict\(\) missing required argument 'X'"),
        (lambda: net.predict(X, scale="x"), TypeError, r"scale must be a number"),
        (lambda: net.predict(np.zeros(3)), ValueError, r"predict\(\): X must have 2 dimensions"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    assert bytes(net.data) == before  # nothing was half-done


def test_read_only_and_other_buffers_are_accepted_for_reading(net):
    row = np.linspace(0, 1, N_IN + N_CLASSES)
    row.flags.writeable = False
    net.set_input(row)
    assert list(net.inputs) == list(row)
    net.set_input(array("d", row))
    net.set_input(memoryview(array("d", row)))
    X, labels = data(3)
    X.flags.writeable = False
    net.predict(X)
    for dtype in (np.int8, np.int32, np.int64, np.uint16):
        net.train(X, labels.astype(dtype), 0.0)


def test_a_failed_compile_shows_the_compiler_output(tmp_path, monkeypatch):
    x = Value(1.0)
    monkeypatch.setattr(codegen.write.loops, "c_literal", lambda value, dtype="float64": "syntax error here")  # the constant operand
    with pytest.raises(codegen.CompileError) as error:
        codegen.compile(x * 2.0, [x], [], cache=seeded_cache(tmp_path, None))
    assert "error" in error.value.stderr and find_compiler().argv[0] in str(error.value)


def test_missing_compiler_says_what_to_install():
    x = Value(1.0)
    with pytest.raises(codegen.CompilerNotFound, match="install"):
        codegen.compile(x * 2.0, [x], [], compiler="no-such-compiler-cc")


def test_bad_graphs_are_rejected():
    x, p = Value(1.0), Value(2.0)
    with pytest.raises(ValueError, match="inputs and params must be leaves"):
        codegen.compile(x * p, [x * p], [p])
    with pytest.raises(ValueError, match="listed twice"):
        codegen.compile(x * p, [x], [p, x])
    with pytest.raises(TypeError, match="Value"):
        codegen.compile(3.0, [x], [p])
    for fuse in (True, False):  # (scalar mode's walk as well: the fuzzer's compile(None, fuse=0) crashed it)
        with pytest.raises(TypeError, match="needs Values to compute, got NoneType"):
            codegen.compile(None, [], [], compiler="tcc", fuse=fuse)
        with pytest.raises(TypeError, match="needs Values to compute, got str"):
            codegen.compile(x * p, [x], [p], outputs=[x * p, "y"], compiler="tcc", fuse=fuse)
    with pytest.raises(ValueError, match="C identifier"):
        codegen.compile(x * p, [x], [p], name="not a name")


@pytest.mark.parametrize("cache", [False, 1, ["dir"]])
def test_a_cache_that_is_no_directory_is_a_clear_error(cache):
    x = Value(1.0)
    with pytest.raises(TypeError, match=r"cache must be a directory \(a str or a path\) or None"):
        codegen.compile(x * x, [x], compiler="tcc", cache=cache)
