"""bench.measure (shared by bench.mnist and bench.compare) and bench.compare, on small random data."""
import contextlib
import csv
import importlib.util
import shutil

import numpy as np
import pytest

from bench import compare
from codegen import CompilerNotFound
from bench import measure as measure_module
from conftest import requires, seeded_cache
from bench.measure import (NUMPY, Config, Row, columns, compiled, markdown_table, measure, peer_params,
                           ratio_column, speedup_column, write_csv)
from mnist.model import PIXEL_SCALE, build_graph
from bench.peers import NumpyMLP

N_TRAIN = 200


@pytest.fixture(scope='module', autouse=True)
def runtimes_in_the_fresh_caches(tmp_path_factory):
    """measure() builds into a fresh cache, so that its compile time is a cold build's; here the
    fresh caches start with the run's gcc -O0 and -O2 module runtimes, which its builds link (the
    tests check the rows, not how long a cold runtime takes: 4-8 s of gcc each)."""
    seed = tmp_path_factory.mktemp('measure-runtimes')
    for opt in (0, 2):
        try:
            seeded_cache(seed, 'gcc', opt)
        except CompilerNotFound:  # (the tests that need gcc skip)
            break
    fresh = measure_module._fresh_build_cache

    @contextlib.contextmanager
    def seeded():
        with fresh() as directory:
            # (not the runtime's C: a row counts the C its own build wrote)
            shutil.copytree(seed, directory, ignore=shutil.ignore_patterns('*.c'), dirs_exist_ok=True)
            yield directory
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_module, '_fresh_build_cache', seeded)
        yield


@pytest.fixture(scope='module')
def data():
    """Random images and labels shaped like MNIST's: (train_X, train_Y, test_X, test_Y)."""
    rng = np.random.default_rng(0)
    return (rng.integers(0, 256, (N_TRAIN, 784), dtype=np.uint8), rng.integers(0, 10, N_TRAIN, dtype=np.uint8),
            rng.integers(0, 256, (50, 784), dtype=np.uint8), rng.integers(0, 10, 50, dtype=np.uint8))


def row(label, compile_s, s_per_epoch, status='ok'):
    return Row(Config(label, 'compiled', 'gcc'), status, compile_s=compile_s, s_per_epoch=s_per_epoch)


def test_pareto_front():
    rows = [row('slow-build-fast-run', 10.0, 1.0), row('fast-build-slow-run', 0.1, 5.0),
            row('beaten', 1.0, 6.0),                  # compiles slower and trains slower than fast-build
            row('tie-a', 2.0, 2.0), row('tie-b', 2.0, 2.0),  # equal: neither beats the other
            row('same-speed-slower-build', 20.0, 1.0),
            row('failed-but-fastest', 0.01, 0.01, status='> limit'),
            Row(NUMPY, s_per_epoch=0.5)]             # no compile step: not on the plot
    assert [r.config.label for r in compare.pareto_front(rows)] == [
        'fast-build-slow-run', 'tie-a', 'tie-b', 'slow-build-fast-run']
    assert compare.pareto_front([]) == []


def test_peer_params_give_the_compiled_modules_logits(data):
    graph = build_graph(seed=1)
    net = graph.compile(compiler=None, opt=0)
    images = data[0][:5]
    peer = NumpyMLP(peer_params(graph.model))
    _, logits = peer.forward(images * PIXEL_SCALE)
    np.testing.assert_allclose(logits, np.asarray(net.predict(images, scale=PIXEL_SCALE)), rtol=1e-12, atol=1e-12)
    assert {name: p.shape for name, p in peer.params.items()} == {
        'W1': (50, 784), 'b1': (50,), 'W2': (10, 50), 'b2': (10,)}


@pytest.fixture(scope='module')
def gcc_and_numpy_rows(data):
    requires('gcc')
    return measure(compiled('gcc', 2), data, N_TRAIN, repeats=2), measure(NUMPY, data, N_TRAIN, repeats=2)


def test_measure_compiled_and_numpy(gcc_and_numpy_rows):
    ours, numpy_row = gcc_and_numpy_rows
    for r in (ours, numpy_row):
        assert r.status == 'ok'
        assert r.images_timed == N_TRAIN
        assert 0 < r.s_per_epoch < 1000
        assert 0 < r.process_peak_mb < 10_000
    assert ours.codegen_s > 0 and ours.compile_s > 0 and ours.compiler_peak_mb > 0
    assert ours.c_lines > 100 and ours.c_bytes > 20 * ours.c_lines
    assert numpy_row.compile_s is None and numpy_row.c_lines is None
    # The same initial weights and the same images: the same trained model, so the same test score.
    assert 0 <= ours.accuracy <= 1
    assert ours.accuracy == numpy_row.accuracy


@pytest.mark.requires('gcc')
def test_measure_reports_a_timeout_and_goes_on(data):
    timed_out = measure(compiled('gcc', 2), data, N_TRAIN, repeats=1, timeout=1e-3)
    assert timed_out.status == '> limit'
    assert timed_out.compile_s is None and timed_out.s_per_epoch is None
    assert timed_out.c_lines > 100  # the C was written before the compiler was stopped
    assert measure(compiled('tcc'), data, N_TRAIN, repeats=1, timeout=60).status == 'ok'


def test_measure_reports_a_missing_compiler(data):
    row_ = measure(compiled('no-such-cc', 2), data, N_TRAIN, repeats=1)
    assert row_.status == 'not installed'
    assert row_.s_per_epoch is None


def test_markdown_and_csv_hold_the_values(gcc_and_numpy_rows, tmp_path):
    rows = [*gcc_and_numpy_rows, row('broken', None, None, status='failed: boom')]
    table_columns = [*columns('config', 'status', 'compile s', 'C lines', 's/epoch', 'test accuracy'),
                     speedup_column(rows, 'numpy'), ratio_column(rows, 'numpy')]
    path = tmp_path / 'rows.csv'
    write_csv(rows, table_columns, path)
    with open(path, newline='') as file:
        read = list(csv.DictReader(file))
    ours, numpy_row = gcc_and_numpy_rows
    assert [r['config'] for r in read] == ['gcc-O2', 'numpy', 'broken']
    assert float(read[0]['compile s']) == ours.compile_s  # full precision
    assert int(read[0]['C lines']) == ours.c_lines
    assert float(read[0]['s/epoch']) == ours.s_per_epoch
    assert float(read[0]['test accuracy']) == ours.accuracy
    assert float(read[0]['time / numpy']) == ours.s_per_epoch / numpy_row.s_per_epoch
    assert float(read[1]['time / numpy']) == 1.0
    assert read[1]['compile s'] == '' and read[2]['s/epoch'] == ''
    assert read[2]['status'] == 'failed: boom'

    lines = markdown_table(rows, table_columns).splitlines()
    assert lines[0] == ('| config | status | compile s | C lines | s/epoch | test accuracy | speedup vs numpy '
                        '| time / numpy |')
    assert len(lines) == 2 + len(rows)
    cells = [line.strip('| ').split(' | ') for line in lines[2:]]
    assert cells[0][3] == f'{ours.c_lines:,}'
    assert cells[0][5] == f'{ours.accuracy:.2%}'
    assert cells[1][6:] == ['1.00x', '1.00x']
    assert cells[2] == ['broken', 'failed: boom', '-', '-', '-', '-', '-', '-']


@pytest.mark.requires('gcc')  # --quick's configurations are gcc's
def test_compare_quick_writes_its_outputs(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compare, 'load_mnist', lambda data_dir: data)
    assert compare.main(['--quick', '--out', str(tmp_path)]) == 0
    with open(tmp_path / 'compare.csv', newline='') as file:
        read = list(csv.DictReader(file))
    assert [r['config'] for r in read] == ['gcc-O0', 'gcc-O2', 'numpy']
    assert all(r['status'] == 'ok' and float(r['s/epoch']) > 0 for r in read)
    assert '| gcc-O2 | fused | gcc | -O2 | ok |' in capsys.readouterr().out
    assert '| gcc-O2 | fused | gcc | -O2 | ok |' in (tmp_path / 'compare.md').read_text()
    if importlib.util.find_spec('matplotlib') is None:
        pytest.skip('matplotlib is not installed: no compare.png to check')
    assert (tmp_path / 'compare.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
