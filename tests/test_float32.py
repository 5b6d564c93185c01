"""dtype="float32": the module computes in float end to end and converts what it is given.
The equivalence with the float64 interpreter is in test_compile.py (its float32 column); here,
the module's interface: views, conversions, train/predict, optimizers, the C it prints."""

import re

import numpy as np
import pytest

import codegen
import templates
from codegen.write import dtypes
from conftest import compiler_diagonal
from test_module import N_CLASSES, N_IN, data, small_classifier

RTOL = 1e-4  # see test_compile.py: float32 against float64, small models


def compile_pair(compiler, **options):
    """The same classifier, from the same weights, as a float64 and a float32 module."""
    model, xs, ys, logits, loss = small_classifier(0)
    return [codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler, dtype=dtype,
                            **options) for dtype in ("float64", "float32")]


def test_views_are_float32_and_buffers_are_converted(compiler):
    wide, narrow = compile_pair(compiler)
    for view in (narrow.data, narrow.grad, narrow.params, narrow.inputs):
        assert view.format == "f" and view.itemsize == 4
    assert wide.data.format == "d"
    np.testing.assert_array_equal(np.asarray(narrow.params), np.asarray(wide.params).astype(np.float32))
    row = np.linspace(-1, 1, N_IN + N_CLASSES)
    narrow.set_input(row)                       # float64: rounded to nearest
    from_64 = narrow.forward()
    assert list(narrow.inputs) == list(row.astype(np.float32))
    narrow.set_input(row.astype(np.float32))    # float32: copied
    assert narrow.forward() == from_64
    wide.set_input(row)
    assert from_64 == pytest.approx(wide.forward(), rel=RTOL)
    narrow.set_params(np.asarray(wide.params))  # float64 parameters, rounded
    np.testing.assert_array_equal(np.asarray(narrow.params), np.asarray(wide.params).astype(np.float32))
    with pytest.raises(ValueError, match=r"set_input\(\): the input holds NaN at index 2"):
        narrow.set_input(np.array([0, 0, np.nan] + [0] * 6, np.float32))
    with pytest.raises(ValueError, match=r"must hold 9 values, got 8"):
        narrow.set_input(np.zeros(8, np.float32))


def test_train_and_predict_follow_float64(compiler):
    """train() on uint8, float64 and float32 rows (labels, float64 and float32 targets) agrees
    with the float64 module; predict() returns float32 rows equal to forward()'s outputs (to
    float32's rounding: predict() runs the rows as a batch)."""
    X, labels = data()
    Y = np.eye(N_CLASSES)[labels]
    wide, _ = compile_pair(compiler)
    expected = wide.train(X, labels, 0.05, scale=1 / 255)
    for rows, targets in [(X, labels), (X.astype(np.float64), Y), (X.astype(np.float32), Y.astype(np.float32))]:
        _, narrow = compile_pair(compiler)
        assert narrow.train(rows, targets, 0.05, scale=1 / 255) == pytest.approx(expected, rel=RTOL)
        np.testing.assert_allclose(np.asarray(narrow.params), np.asarray(wide.params), rtol=RTOL, atol=RTOL)
    out = narrow.predict(X[:3], scale=1 / 255)
    assert out.format == "f" and out.shape == (3, N_CLASSES)
    row = np.zeros(N_IN + N_CLASSES, np.float32)
    row[:N_IN] = X[2] * (1 / 255)
    narrow.set_input(row)
    narrow.forward()
    # predict() ran the rows as one batch (a matrix product: its sums in another order)
    np.testing.assert_allclose(narrow.outputs(), np.asarray(out)[2], rtol=1e-5)
    with pytest.raises(ValueError, match="X holds NaN"):
        narrow.train(np.full((2, N_IN), np.nan, np.float32), labels[:2], 0.1)


OPTIMIZERS = [codegen.SGD(momentum=0.9, nesterov=True, weight_decay=0.01), codegen.Adam(weight_decay=0.01),
              codegen.AdamW()]


# every optimizer on TCC, each on one optimising compiler; the rest in the slow set
@pytest.mark.parametrize("compiler, optimizer", list(compiler_diagonal(OPTIMIZERS, repr)), indirect=["compiler"])
def test_optimizers_in_float32(optimizer, compiler):
    """Every optimizer's step in float (Adam's vector square roots too: the module runtime's
    passes for each vector width, chosen when the step runs), its state float32, the parameters
    close to float64's after 200 steps."""
    options = dict(optimizer=optimizer, opt=2)
    wide, narrow = compile_pair(compiler, **options)
    X, labels = data(100)
    for net in (wide, narrow):
        net.train(X, labels, 0.01, scale=1 / 255, batch_size=1)
        net.train(X, labels, 0.01, scale=1 / 255, batch_size=5, seed=1)
    for key, view in narrow.optimizer_state.items():
        assert view.format == "f"
        np.testing.assert_allclose(np.asarray(view), np.asarray(wide.optimizer_state[key]), rtol=1e-3, atol=1e-3,
                                   err_msg=key)
    np.testing.assert_allclose(np.asarray(narrow.params), np.asarray(wide.params), rtol=1e-3, atol=1e-3)


def test_float32_source():
    """float literals, float primitives, one element type; dtype checked."""
    model, xs, ys, logits, loss = small_classifier(0)
    top = (loss * 0.1).tanh() + (loss * 0.05).exp()  # (single statements: the layers' loops call row kernels)
    source = "\n".join(codegen.generate(top, xs + ys, model.parameters(), dtype="float32"))
    assert "#define REAL_IS_FLOAT 1" in source and "0.1f" in source
    assert "real_tanh(" in source and "real_exp(" in source and "real_log(" in source
    assert " tanh(" not in source and "double *restrict d" not in source
    wide = "\n".join(codegen.generate(top, xs + ys, model.parameters()))
    assert "#define REAL_IS_FLOAT 0" in wide and "0.1f" not in wide
    with pytest.raises(ValueError, match="dtype must be one of 'float64', 'float32', got 'float16'"):
        codegen.generate(loss, xs + ys, model.parameters(), dtype="float16")


@pytest.mark.parametrize("row", dtypes.DTYPES.values(), ids=dtypes.NAMES)
def test_each_dtype_row_is_what_the_preludes_switch_says(row):
    """codegen/write/dtypes.py's row and templates/prelude.c's `#if REAL_IS_FLOAT` branch it selects agree:
    the C type, the views' format and the math functions real_exp & co. stand for."""
    prelude = templates.read("prelude.c")
    switch = re.search(r"^#if REAL_IS_FLOAT\n(.*?)^#else\n(.*?)^#endif", prelude, re.S | re.M)
    branch = switch.group(1) if row.real_is_float else switch.group(2)
    assert f"typedef {row.c_type} real;" in branch
    assert f'#define REAL_FORMAT "{row.buffer_format}"' in branch
    for name in dtypes.PRIMITIVES:
        assert f"#define real_{name} {name}{row.math_suffix}\n" in branch
    assert row.numpy.char == row.buffer_format and row.numpy.name == row.name
