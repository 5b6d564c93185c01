"""The model zoo (bench.models) and its benchmark (bench.zoo): each plain-C reference and the NumPy peer
train the same numbers as micrograd_c's interpreter, and the quick table runs."""
import numpy as np
import pytest

from bench import cli, measure, models, zoo
from conftest import requires
from bench.zoo_peers import CReference, Module, Numpy

STEPS = 2
BUILDERS = {'demo': models.demo, 'cnn': models.cnn, 'mlp-50': lambda: models.mlp((50,)),
            'mlp-16-8': lambda: models.mlp((16, 8))}  # two hidden layers, small: the C loops over layers


@pytest.fixture(scope='module', params=list(BUILDERS))
def model_and_expected(request):
    model = BUILDERS[request.param]()
    losses, params = models.interpret(model, STEPS)
    assert np.abs(params - model.init).max() > 1e-6, 'the steps must move the parameters'
    np.testing.assert_array_equal([p.data for p in model.params], model.init)  # interpret() put them back
    return model, losses, params


@pytest.mark.parametrize('peer', ['c-gcc', 'numpy'])
def test_peer_trains_as_the_interpreter(model_and_expected, peer):
    model, losses, params = model_and_expected
    trainer = CReference(model, requires('gcc'), opt=3, native=True) if peer == 'c-gcc' else Numpy(model)
    for _ in range(2):  # reset() really starts again
        trainer.reset()
        assert trainer.run(STEPS) == pytest.approx(np.mean(losses), rel=1e-9)
        np.testing.assert_allclose(trainer.params, params, rtol=1e-9, atol=1e-12)


def test_module_trains_as_the_interpreter(model_and_expected):
    model, losses, params = model_and_expected
    trainer = Module(model, 'tcc')
    trainer.reset()
    assert trainer.run(STEPS) == pytest.approx(np.mean(losses), rel=1e-9)
    np.testing.assert_allclose(trainer.params, params, rtol=1e-9, atol=1e-12)


def test_make_moons_is_two_noisy_half_moons():
    X, y = models.make_moons(100, noise=0.0, seed=0)
    assert X.shape == (100, 2) and sorted(set(y)) == [0, 1] and (y == 0).sum() == 50
    np.testing.assert_allclose(np.hypot(*X[y == 0].T), 1.0)            # the outer moon: the unit circle
    np.testing.assert_allclose(np.hypot(X[y == 1, 0] - 1, X[y == 1, 1] - 0.5), 1.0)  # the inner: centred at (1, 0.5)
    noisy, _ = models.make_moons(100, noise=0.1, seed=0)
    assert 0.05 < np.std(noisy - X) < 0.15
    np.testing.assert_array_equal(noisy, models.make_moons(100, noise=0.1, seed=0)[0])


def test_steps_beyond_the_data_are_refused():
    model = models.mlp((4,))
    with pytest.raises(ValueError, match='steps must be in 1..2000'):
        Numpy(model).run(models.N_ROWS + 1)


@pytest.mark.requires('gcc')  # --quick's configurations include c-ref-gcc-O2
def test_quick_table(capsys):
    assert cli.main(['--only', 'zoo', '--quick']) == 0
    out = capsys.readouterr().out
    rows = [line.strip('| ').split(' | ') for line in out.splitlines() if line.startswith('| ')][1:]
    assert [(r[0], r[1]) for r in rows] == [(name, label) for name in ('demo MLP(2, [16, 16, 1])', 'MLP(784, [50, 10])')
                                            for label in zoo.QUICK['configs']]
    assert all(r[2] == 'ok' for r in rows), rows
    header = next(line for line in out.splitlines() if line.startswith('| model'))
    columns = header.strip('| ').split(' | ')
    step, paired = columns.index('µs/step'), columns.index('time / C ref, same flags (pairs)')
    assert all(float(r[step].replace(',', '')) > 0 for r in rows)  # (1,000 and more: with a comma)
    tcc = [r for r in rows if r[1] == 'tcc']
    assert all(r[paired].endswith('x') for r in tcc)  # the paired ratio to c-ref-tcc
    # TCC builds the module runtime with every model (no row of its own); no row of the quick table
    # is another compiler's, whose runtime the cache keeps
    assert all(r[columns.index('runtime s (once)')] == '-' for r in tcc)
    assert 'TCC compile <= 0.2 s' in out and '- sanity: ' in out and '-> met' in out.split('- sanity: ')[1]


def test_targets_report_failures_and_missing_measurements():
    def row(model, label, **values):
        config = next(c for c in zoo.CONFIGS if c.label == label)
        return zoo.ZooRow(model, config, **values)

    rows = [row('demo', 'gcc-O3-native', codegen_s=0.5, compile_s=0.4, paired_ratio=0.6, loss_difference=0.0),
            row('demo', 'clang-O3-native', codegen_s=0.5, compile_s=2.0, paired_ratio=0.8, loss_difference=1e-3),
            row('cnn', 'gcc-O3-native', status='> limit')]
    lines = zoo.target_lines(rows, {'status': 'ok', 'build_s': 3.0, 'generate_s': 4.0, 'peak_bytes': 2.5e9,
                                    'params': 535_818, 'c_lines': 1000})
    assert lines[0].endswith('demo gcc-O3-native 0.60x; demo clang-O3-native 0.80x -> met')
    assert lines[1].endswith('-> NOT MET')  # clang's 0.80x > 0.7x
    assert 'demo clang-O3-native 2.50 s' in lines[2] and lines[2].endswith('NOT MET')
    assert lines[3].endswith('not measured')  # no tcc row
    assert '7.0 s' in lines[4] and 'peak 2.50 GB -> NOT MET' in lines[4]
    assert lines[5].endswith('NOT MET')  # a loss differing by 1e-3


def test_big_graph_probe_runs_in_a_subprocess():
    result = zoo.big_graph(timeout=120, hidden=(8,))
    assert result['status'] == 'ok'
    assert result['params'] == 8 * 785 + 10 * 9
    assert result['build_s'] > 0 and result['generate_s'] > 0 and result['c_lines'] > 100
    assert 10e6 < result['peak_bytes'] < 2e9


@pytest.mark.requires('gcc')
def test_a_compiled_row_times_the_module_runtime_apart():
    config = next(c for c in zoo.CONFIGS if c.label == 'gcc-O2')
    row = zoo.ZooRow('demo', config)
    with measure._fresh_build_cache() as cache:
        trainer = zoo._build(config, models.demo(), row, timeout=None)
        assert row.runtime_s > 0 and len(list(cache.glob('runtime_*.o'))) == 2  # its two units, before the model
        assert row.c_lines == sum(p.read_text().count('\n') for p in trainer.net.build.c_files)
        assert not any('runtime' in p.name for p in trainer.net.build.c_files)
