"""What every test module shares: requires(tool), the one way a test asks for an optional tool (a
compiler, dot, wasm-ld, wasmtime, qemu-user's emulators, mpiexec, torch), and the build cache of the run.

A tool the machine lacks skips the test with the reason "needs <tool>, not found: <how to get it>";
with MICROGRAD_C_REQUIRE_COMPILERS=1 (CI, .ci/run) it fails it instead, except for the tools CI
does not install (torch). The run ends with one line counting what was skipped for lack of what."""
import collections
import importlib
import os
import pathlib
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Callable

import pytest

from codegen.backend.targets import EMULATOR_ADVICE, TARGETS, WASI_RUNNER
from codegen.backend.toolchain import BACKEND_NAMES, COMPILER_NAMES, FAMILIES, CompilerNotFound, find_compiler

REQUIRED = os.environ.get('MICROGRAD_C_REQUIRE_COMPILERS') == '1'


class ToolMissing(Exception):
    pass


def _compiler(name):
    def find():
        try:
            find_compiler(name)
        except CompilerNotFound as error:
            raise ToolMissing(str(error)) from None
        return name
    return find


def _program(name):
    def find():
        path = shutil.which(name)
        if path is None:
            raise ToolMissing(f'{name} is not on PATH')
        return path
    return find


def _package(name):
    def find():
        try:
            return importlib.import_module(name)
        except ImportError as error:
            raise ToolMissing(str(error)) from None
    return find


def _mpi():
    """mpiexec beside this Python (the mpich wheel puts it in the virtualenv's bin), else on PATH,
    and mpi4py importable: what tests/test_mpi.py runs."""
    _package('mpi4py')()
    beside = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    path = beside if os.access(beside, os.X_OK) else shutil.which('mpiexec')
    if path is None:
        raise ToolMissing('mpiexec is neither beside this Python nor on PATH')
    return path


@dataclass(frozen=True)
class Tool:
    find: Callable[[], object]   # what requires() returns; raises ToolMissing
    how_to_get: str
    in_ci: bool = True           # installed by .ci/run: missing there fails the test


TOOLS = {
    **{name: Tool(_compiler(name), FAMILIES[name].install_advice) for name in BACKEND_NAMES},
    'dot': Tool(_program('dot'), 'graphviz draws graphs: `apt-get install graphviz`'),
    'wasm-ld': Tool(_program('wasm-ld'), 'links WebAssembly for clang: `apt-get install lld`'),
    'wasmtime': Tool(_package('wasmtime'), 'runs WebAssembly: `pip install wasmtime` (the test extra)'),
    # qemu-user's emulators, which run the programs codegen.export builds for other machines
    **{t.emulator: Tool(_program(t.emulator), f'runs {t.arch} programs here: {EMULATOR_ADVICE}')
       for t in TARGETS.values() if t.emulator != WASI_RUNNER},
    'mpiexec': Tool(_mpi, 'MPI for data-parallel training: `pip install micrograd-c[mpi]` (mpi4py, mpich)'),
    'torch': Tool(_package('torch'), 'PyTorch, a peer in the comparisons: `make torch`', in_ci=False),
}
SKIP_REASON = re.compile(r'needs ([\w.-]+), not found')


def requires(tool: str):
    """The tool (a compiler's name, a program's path or a package's module); a missing one skips
    the test, or fails it in CI."""
    entry = TOOLS[tool]
    try:
        return entry.find()
    except ToolMissing as error:
        message = f'needs {tool}, not found: {entry.how_to_get} ({error})'
        if REQUIRED and entry.in_ci:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def have(tool: str) -> bool:
    """Whether the machine has the tool (no skip, no failure)."""
    try:
        TOOLS[tool].find()
    except ToolMissing:
        return False
    return True


def pytest_configure(config):
    config.addinivalue_line('markers', 'requires(*tools): the test needs these tools (see conftest.requires)')
    config.addinivalue_line('markers', 'first_tier: the test checks that compile() tiers by default (see '
                                       '_the_compiler_asked_for_builds)')


def pytest_runtest_setup(item):
    for marker in item.iter_markers('requires'):
        for tool in marker.args:
            requires(tool)


def pytest_terminal_summary(terminalreporter):
    """One line: how many tests each missing tool skipped."""
    lacking = collections.Counter()
    for report in terminalreporter.stats.get('skipped', []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        match = SKIP_REASON.search(reason)
        if match:
            lacking[match.group(1)] += 1
    if lacking:
        terminalreporter.write_line('skipped for lack of a tool: ' + ', '.join(
            f'{tool} ({count} test{"s" * (count != 1)}; {TOOLS[tool].how_to_get})' for tool, count in sorted(lacking.items())))


@pytest.fixture(params=COMPILER_NAMES)
def compiler(request) -> str:
    """Name of each C compiler (toolchain.COMPILER_NAMES), as requires() finds it."""
    return requires(request.param)


@pytest.fixture(autouse=True)
def _the_compiler_asked_for_builds(request):
    """A module that compile() tiered of its own accord (tiered not given: a big graph) fails the
    test unless it is marked first_tier: it would train the first tier's TCC build while the
    compiler the test names builds in the background (the tests of GCC, Clang and zig ran TCC's so).
    Ask for tiered=False, or tiered=True to test tiering. (Patched by hand, not with the monkeypatch
    fixture: an autouse fixture that took it would set it up before a test's own fixtures, and so
    undo its patches after theirs ran their teardowns.)"""
    if request.node.get_closest_marker('first_tier'):
        yield
        return
    import codegen
    compile_ = codegen.compile

    def compile(*args, **kwargs):
        net = compile_(*args, **kwargs)
        if kwargs.get('tiered') is None and getattr(net, 'tier', None) == 'first':
            raise AssertionError(f"compile() tiered this graph (compiler {kwargs.get('compiler')!r}): the test would "
                                 "run the first tier's build; pass tiered=False (or True, or mark the test first_tier)")
        return net
    codegen.compile = compile
    try:
        yield
    finally:
        codegen.compile = compile_


def compiler_diagonal(values, ids=str, compilers=COMPILER_NAMES):
    """Parameters (compiler, value) (for the `compiler` fixture: indirect) of a grid of compilers
    by values, cut for the default suite: every value on TCC (its builds take a fraction of a
    second), each on one optimising compiler, in turn (value n on the (n mod 3)-th of GCC, Clang
    and zig), and each of them one at least (list the values that matter most first); the rest of
    the grid in the slow set (make test-all)."""
    optimising = [name for name in compilers if name != 'tcc']
    for name in compilers:
        k = optimising.index(name) if name in optimising else None
        for n, value in enumerate(values):
            default = k is None or n % len(optimising) == k or n == k % len(values)
            yield pytest.param(name, value, id=f'{name}-{ids(value)}', marks=[pytest.mark.slow] * (not default))


# Modules run a batch's products on one thread unless a test asks for more (test_batch.py does):
# make test already runs a worker per core, and more threads than cores would only wait for each
# other (templates/pool.c).
os.environ.setdefault('MICROGRAD_C_THREADS', '1')


@pytest.fixture(autouse=True, scope='session')
def _private_build_cache(tmp_path_factory, request):
    """Tests build into the run's own cache, not the user's: one for all the run's workers
    (pytest-xdist's basetemp/popen-gwN share basetemp), so that a module that tests in two workers
    compile is compiled once (the cache's build lock makes the second wait for the first). (A
    worker is told by its config, not by the environment, which a pytest it starts inherits.)"""
    previous = os.environ.get('MICROGRAD_C_CACHE')
    run = tmp_path_factory.getbasetemp()
    directory = (run.parent if hasattr(request.config, 'workerinput') else run) / 'build-cache'
    directory.mkdir(exist_ok=True)
    os.environ['MICROGRAD_C_CACHE'] = str(directory)
    yield
    if previous is None:
        del os.environ['MICROGRAD_C_CACHE']
    else:
        os.environ['MICROGRAD_C_CACHE'] = previous


def seeded_cache(path, compiler, opt=2, dtypes=('float64',)):
    """A new build cache at `path` holding the module runtime objects of (compiler, opt, each of
    dtypes) from the run's cache (built there first if missing): a test that needs a cache of its
    own (a build that must not be a hit) builds its model's C, not again the runtime every model
    shares (4-8 s of an optimising compiler)."""
    import codegen
    from micrograd_c import Value
    run_cache = os.environ['MICROGRAD_C_CACHE']
    x = Value(0.5)
    for dtype in dtypes:
        codegen.compile(x * x, [x], compiler=compiler, opt=opt, cache=run_cache, tiered=False, name='seed',
                        dtype=dtype)
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for record in pathlib.Path(run_cache).glob('runtime_*.build.json'):  # complete entries (written last)
        for part in record.parent.glob(record.name.removesuffix('.build.json') + '.*'):
            shutil.copy2(part, path / part.name)
    return path


def bits(a):
    """An array's bits (so that -0 and 0 differ), as unsigned integers of its width: the same-bits
    comparisons' form."""
    import numpy as np
    return np.ascontiguousarray(a).view(f'u{a.dtype.itemsize}')


def same_bits(a, b):
    """Whether two arrays (or sequences of floats) hold the same numbers bit for bit, but for a
    NaN's sign and payload (which operand's NaN an operation keeps: the compiler's choice)."""
    import numpy as np
    a, b = np.asarray(a), np.asarray(b)
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(bits(a[~nan]), bits(b[~nan])))
