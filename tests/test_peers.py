"""The benchmark peers compute the same training run, and NumPy's gradient is right."""
import sys

import numpy as np
import pytest

from codegen.backend.toolchain import FAMILIES, find_compiler
from conftest import requires
from bench.peers import NIN, NOUT, PARAM_NAMES, SCALE, CReference, NumpyMLP, TorchMLP, init_params

LR = 0.01
N_IMAGES = 64


@pytest.fixture(scope='module')
def data():
    rng = np.random.default_rng(1)
    return rng.integers(0, 256, (N_IMAGES, NIN), dtype=np.uint8), rng.integers(0, NOUT, N_IMAGES, dtype=np.uint8)


def default_compiler():
    """CReference's options for the machine's default compiler (-march=native where it takes it)."""
    return {'compiler': None, 'native': FAMILIES[find_compiler().family].native}


def run(peer_class, data, **options):
    """(mean loss, params after one epoch, accuracy after it); checks the given init is not touched."""
    init = init_params()
    model = peer_class(init, **options)
    loss = model.train(*data, LR)
    for name, value in init_params().items():
        np.testing.assert_array_equal(init[name], value, err_msg=f'{peer_class.__name__} modified its init')
    return loss, model.params, model.accuracy(*data)


@pytest.fixture(scope='module')
def expected(data):
    result = run(NumpyMLP, data)
    changed = [name for name in PARAM_NAMES if not np.array_equal(result[1][name], init_params()[name])]
    assert changed == list(PARAM_NAMES), 'training must move every parameter'
    return result


def assert_same_run(result, expected):
    loss, params, accuracy = result
    assert loss == pytest.approx(expected[0], rel=1e-9)
    for name in PARAM_NAMES:
        assert params[name].shape == expected[1][name].shape
        np.testing.assert_allclose(params[name], expected[1][name], rtol=1e-9, atol=1e-12, err_msg=name)
    assert accuracy == expected[2]


def test_init_params_is_micrograds_init():
    params = init_params(seed=3)
    assert {name: p.shape for name, p in params.items()} == {
        'W1': (50, NIN), 'b1': (50,), 'W2': (NOUT, 50), 'b2': (NOUT,)}
    assert all(p.dtype == np.float64 for p in params.values())
    assert np.abs(params['W1']).max() <= 1 and params['W1'].std() > 0.5
    assert not params['b1'].any() and not params['b2'].any()
    np.testing.assert_array_equal(params['W1'], init_params(seed=3)['W1'])


def test_numpy_loss_and_gradient(data):
    model = NumpyMLP(init_params())
    x, label = data[0][0] * SCALE, int(data[1][0])
    loss, grads = model.grads(x, label)

    _, z = model.forward(x)
    assert loss == pytest.approx(-np.log(np.exp(z[label]) / np.exp(z).sum()), rel=1e-12)

    # Central differences on random entries plus the largest gradient entry of each parameter
    # (random W1 entries often sit on an inactive hidden unit, where the gradient is 0).
    rng = np.random.default_rng(2)
    eps = 1e-6
    for name, param in model.params.items():
        grad = grads[name]
        indices = [*rng.integers(0, param.size, 5), int(np.abs(grad).argmax())]
        for index in indices:
            original = param.flat[index]
            param.flat[index] = original + eps
            loss_plus = model.grads(x, label)[0]
            param.flat[index] = original - eps
            loss_minus = model.grads(x, label)[0]
            param.flat[index] = original
            numeric = (loss_plus - loss_minus) / (2 * eps)
            assert numeric == pytest.approx(grad.flat[index], rel=1e-5, abs=1e-7), (name, index)
        assert np.abs(grad).max() > 1e-3, f'{name}: a trivially zero gradient checks nothing'


def test_torch_matches_numpy(data, expected):
    requires('torch')
    assert_same_run(run(TorchMLP, data), expected)


def test_torch_missing_raises_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, 'torch', None)  # makes `import torch` fail
    with pytest.raises(ImportError, match='PyTorch'):
        TorchMLP(init_params())


def test_c_reference_matches_numpy(compiler, data, expected):  # `compiler`: tests/conftest.py
    native = FAMILIES[compiler].native  # tcc has no -march=native
    assert_same_run(run(CReference, data, compiler=compiler, native=native), expected)


@pytest.mark.requires('gcc')  # the sparse variant's C is GNU C (vector extensions): not tcc's
@pytest.mark.parametrize('variant', ['sparse', 'input_major'])
def test_c_reference_variants_match_numpy(data, expected, variant):
    """The SPARSE_INPUTS and INPUT_MAJOR variants compute the same step (in another order)."""
    loss, params, accuracy = run(CReference, data, **{variant: True})
    if variant == 'input_major':  # W1 is held transposed, pixel by pixel
        assert params['W1'].shape == (NIN, 50)
        params = {**params, 'W1': params['W1'].T}
    assert_same_run((loss, params, accuracy), expected)


def test_c_reference_rejects_bad_input(data):
    model = CReference(init_params(), **default_compiler())
    X, labels = data
    with pytest.raises(ValueError, match='labels'):
        model.train(X, np.full(len(X), NOUT), LR)
    with pytest.raises(ValueError, match='labels'):
        model.train(X, np.full(len(X), -1), LR)
    with pytest.raises(ValueError, match='expected images'):
        model.accuracy(X[:, :-1], labels)
