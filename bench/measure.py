"""Measuring one training configuration of the MNIST workload, shared by bench.mnist and bench.compare.

A Config names what trains: our compiled module (fused or straight-line scalar C, any compiler and
flags), pure-Python micrograd_c ('interpreted') or a peer (NumPy, PyTorch, the plain-C reference).
measure() builds it, times SGD with batch size 1 over the first n_train images and returns a Row.
Every configuration starts from the same initial weights: micrograd_c's MLP under random.seed(SEED).
Rows render as a markdown table or CSV through the same column definitions.
"""
from __future__ import annotations

import contextlib
import csv
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from codegen import CompilerNotFound, CompileTimeout
from codegen.write import dtypes
from codegen.backend.toolchain import COMPILER_NAMES, FAMILIES, find_compiler
from mnist.model import DEFAULT_LR, PIXEL_SCALE, build_graph, image_loss, make_optimizer, sgd_step
from mnist.options import add_data_dir_argument
from mnist.resources import process_peak_rss

from .peers import NHID, NIN, NOUT, CReference, NumpyMLP, TorchMLP

EPOCH_IMAGES = 60_000
LR = 0.01
SEED = 0
# Pure Python takes about half a second per image: time this many and extrapolate.
INTERPRETED_IMAGES = 20
INTERPRETED_NOTE = (f'interpreted: {INTERPRETED_IMAGES} images timed and extrapolated; no accuracy, since '
                    'evaluating 10,000 test images in pure Python takes over an hour and '
                    f'{INTERPRETED_IMAGES} training images teach the model nothing measurable.')
COMPILER_PEAK_NOTE = ('compiler peak MB: the peak resident memory of the largest compiler process (with its '
                      'children, e.g. cc1); big scalar programs compile as several units, two at a time.')
KINDS = ('compiled', 'interpreted', 'numpy', 'torch', 'c-reference')


@dataclass(frozen=True)
class Config:
    label: str              # unique, no spaces: selectable with --configs
    kind: str               # one of KINDS
    compiler: str | None = None
    opt: int = 2
    native: bool = False
    fuse: bool = True       # compiled only: False is the straight-line scalar code
    dtype: str = dtypes.DEFAULT.name  # compiled only: codegen.compile's dtype
    sparse: bool = False    # compiled: codegen's sparse_inputs; c-reference: its SPARSE_INPUTS variant
    step_api: bool = False  # compiled: trained by set_input, zero_grad, forward, backward, update per image
    optimizer: str = 'sgd'  # compiled: mnist.model's optimizer name; other than sgd, at its DEFAULT_LR
    input_major: bool = False  # c-reference: its INPUT_MAJOR variant (W1 stored pixel by pixel)
    max_images: int | None = None  # time at most this many images (slow configurations)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f'kind must be one of {KINDS}, not {self.kind!r}')

    @property
    def mode(self) -> str:
        if self.kind == 'compiled':
            return 'fused' if self.fuse else 'scalar'
        return self.kind

    @property
    def flags(self) -> str:
        if self.compiler is None:
            return ''
        return f'-O{self.opt}' + (' -march=native' if self.native else '')


def compiled(compiler: str, opt: int = 2, native: bool = False, fuse: bool = True, dtype: str = dtypes.DEFAULT.name,
             sparse: bool = False, step_api: bool = False, optimizer: str = 'sgd') -> Config:
    """Our module; a compiler that does not optimise (tcc) is named without an -O level and built at
    -O0. The rows are dense (sparse_inputs=False) unless `sparse`, so that they compare kernels with
    kernels."""
    family = FAMILIES.get(compiler)
    optimises = family is None or family.optimises
    name = f'{compiler}-O{opt}' + ('-native' if native else '') if optimises else compiler
    row = dtypes.lookup(dtype)
    name += ('' if fuse else '-scalar') + ('' if row == dtypes.DEFAULT else f'-{row.short}') + ('-sparse' if sparse else '')
    name += ('-step' if step_api else '') + ('' if optimizer == 'sgd' else f'-{optimizer}')
    return Config(name, 'compiled', compiler, opt if optimises else 0, native, fuse, dtype=dtype, sparse=sparse,
                  step_api=step_api, optimizer=optimizer)


def with_dtype(configs: list[Config], dtype: str) -> list[Config]:
    """--dtype: our rows in the default element type (float64) in another (labels gain its short
    name, -f32), the rest unchanged."""
    if dtype == dtypes.DEFAULT.name:
        return list(configs)
    return [compiled(c.compiler, c.opt, c.native, c.fuse, dtype, c.sparse, c.step_api, c.optimizer)
            if c.kind == 'compiled' and c.dtype == dtypes.DEFAULT.name else c for c in configs]


def c_reference(compiler: str, opt: int = 3, native: bool = True, sparse: bool = False,
                input_major: bool = False) -> Config:
    label = (f'c-ref-{compiler}-O{opt}' + ('-native' if native else '') + ('-sparse' if sparse else '')
             + ('-input-major' if input_major else ''))
    return Config(label, 'c-reference', compiler, opt, native, sparse=sparse, input_major=input_major)


INTERPRETED = Config('interpreted', 'interpreted', max_images=INTERPRETED_IMAGES)
NUMPY = Config('numpy', 'numpy')
TORCH = Config('torch', 'torch')


@dataclass
class Row:
    config: Config
    status: str = 'ok'          # 'ok', 'not installed...', '> limit' or 'failed: <why>'
    codegen_s: float | None = None
    c_lines: int | None = None
    c_bytes: int | None = None
    compile_s: float | None = None
    compiler_peak_mb: float | None = None
    images_timed: int | None = None
    s_per_epoch: float | None = None   # median over the repeats, extrapolated to EPOCH_IMAGES
    accuracy: float | None = None      # on the test set, after the timed training
    process_peak_mb: float | None = None  # this process's peak RSS so far (ru_maxrss only grows)


def peer_params(model) -> dict:
    """micrograd_c MLP(784, [50, 10]) parameters as the peers' W1 (50, 784), b1, W2 (10, 50), b2.

    model.parameters() lists neuron by neuron, layer by layer: a neuron's weights, then its bias.
    """
    flat = np.array([p.data for p in model.parameters()], dtype=np.float64)
    layer1 = flat[:NHID * (NIN + 1)].reshape(NHID, NIN + 1)
    layer2 = flat[NHID * (NIN + 1):].reshape(NOUT, NHID + 1)
    return {'W1': layer1[:, :NIN].copy(), 'b1': layer1[:, NIN].copy(),
            'W2': layer2[:, :NHID].copy(), 'b2': layer2[:, NHID].copy()}


def measure(config: Config, data, n_train: int, repeats: int = 3, timeout: float | None = None,
            lr: float = LR) -> Row:
    """Builds and times one configuration. data: (train_X, train_Y, test_X, test_Y) as load_mnist gives.

    Never raises for a configuration that cannot run: the reason goes into row.status.
    """
    row = Row(config)
    n_images = min(n_train, config.max_images or n_train)
    try:
        with _fresh_build_cache() as cache:
            try:
                _train_and_score(config, row, data, n_images, repeats, timeout, lr)
            finally:  # a build that timed out has written its C too
                _record_c_size(row, cache)
    except CompilerNotFound:
        row.status = 'not installed'
    except CompileTimeout:
        row.status = '> limit'
    except ImportError as error:
        row.status = 'not installed: make torch' if config.kind == 'torch' else f'not installed: {error}'
    except Exception as error:  # one broken configuration must not lose the rest of the table
        lines = str(error).strip().splitlines() or [type(error).__name__]
        row.status = f'failed: {lines[0]}'
    row.process_peak_mb = process_peak_rss() / 1e6
    return row


def _timed_run(trainer, X, Y, lr) -> float:
    """Seconds for one pass of SGD over X from the initial weights."""
    trainer.reset()
    if hasattr(trainer, 'prepare'):
        trainer.prepare(X, Y)
    started = time.perf_counter()
    trainer.train(X, Y, lr)
    return time.perf_counter() - started


def _train_and_score(config, row, data, n_images, repeats, timeout, lr):
    train_X, train_Y, test_X, test_Y = data
    X, Y = train_X[:n_images], train_Y[:n_images]
    trainer = _trainer(config)(config, row, timeout)
    seconds = [_timed_run(trainer, X, Y, lr) for _ in range(repeats)]
    row.images_timed = n_images
    row.s_per_epoch = statistics.median(seconds) * EPOCH_IMAGES / n_images
    if trainer.accuracy:
        row.accuracy = trainer.accuracy(test_X, test_Y)


def paired_ratio(config: Config, baseline: Config, data, n_train: int, repeats: int, lr: float = LR) -> float:
    """The median over `repeats` back-to-back pairs of runs of config's training time over the
    baseline's: both see the same moment of a shared, noisy machine, which separate medians
    taken minutes apart do not."""
    X, Y = data[0][:n_train], data[1][:n_train]
    trainers = [_trainer(c)(c, Row(c), None) for c in (config, baseline)]
    ratios = []
    for _ in range(repeats):
        ours, theirs = (_timed_run(t, X, Y, lr) for t in trainers)
        ratios.append(ours / theirs)
    return statistics.median(ratios)


def build_module_runtime(compiler, opt=2, native=False, timeout=None) -> float | None:
    """Seconds to build the module runtime every model links (templates/runtime.c, products.c),
    which a machine compiles once for a compiler and its flags and keeps in the build cache: built
    by a one-weight model, so that a model built next times its own units only. None for a compiler
    that compiles the runtime with every model (TCC: no object kept)."""
    import codegen
    from micrograd_c import Value
    family = FAMILIES[find_compiler(compiler).family]
    if not (family.parallel_units and family.makes_files):
        return None
    x, w = Value(1.0), Value(2.0)
    started = time.perf_counter()
    codegen.compile((x * w).relu(), [x], [w], compiler=compiler, opt=opt, native=native, timeout=timeout,
                    tiered=False)
    return time.perf_counter() - started


@contextlib.contextmanager
def _fresh_build_cache():
    """An empty build cache, so every build runs (and times) the compiler. Through the environment
    because CReference takes no cache argument; the loaded .so files outlive the directory."""
    previous = os.environ.get('MICROGRAD_C_CACHE')
    with tempfile.TemporaryDirectory(prefix='micrograd_c_measure_') as directory:
        os.environ['MICROGRAD_C_CACHE'] = directory
        try:
            yield Path(directory)
        finally:
            if previous is None:
                del os.environ['MICROGRAD_C_CACHE']
            else:
                os.environ['MICROGRAD_C_CACHE'] = previous


def _record_c_size(row: Row, cache: Path) -> None:
    """The size of all the C a build wrote into the (fresh) cache: big programs are split into units."""
    sources = [path.read_bytes() for path in cache.glob('*.c')]
    if sources:
        row.c_lines, row.c_bytes = sum(s.count(b'\n') for s in sources), sum(map(len, sources))


def _record_build(row: Row, build) -> None:
    row.compile_s = build.seconds
    row.compiler_peak_mb = None if build.peak_rss is None else build.peak_rss / 1e6


# Trainers: __init__ builds (filling the row's build columns), reset() goes back to the initial
# weights, train() is the timed pass of SGD, accuracy() scores the test set.

class _CompiledTrainer:
    def __init__(self, config, row, timeout):
        graph = build_graph(SEED)
        self.net = graph.compile(compiler=config.compiler, opt=config.opt, native=config.native, fuse=config.fuse,
                                 tiered=False,  # (the optimised build is what it times)
                                 timeout=timeout, dtype=config.dtype, sparse_inputs=config.sparse,
                                 optimizer=None if config.optimizer == 'sgd' else make_optimizer(config.optimizer),
                                 measure_memory=True)
        self.lr = None if config.optimizer == 'sgd' else DEFAULT_LR[config.optimizer]  # SGD: the bench's --lr
        row.codegen_s = self.net.timings['codegen']
        _record_build(row, self.net.build)
        self.init = np.array([p.data for p in graph.model.parameters()], dtype=np.float64)

    def reset(self):
        self.net.set_params(self.init)

    def train(self, X, Y, lr):
        self.net.train(X, Y, self.lr or lr, scale=PIXEL_SCALE)

    def accuracy(self, X, Y):
        logits = np.asarray(self.net.predict(X, scale=PIXEL_SCALE))
        return float(np.mean(logits.argmax(axis=1) == Y))


class _StepTrainer(_CompiledTrainer):
    """Our module trained the way micrograd users write it, one image at a time: set_input(row),
    zero_grad(), forward(), backward(), update(lr). The rows (pixels times PIXEL_SCALE, as train()
    scales them, then the one-hot label) are made before the clock starts."""

    def prepare(self, X, Y):
        n, n_x = X.shape
        self.rows = np.zeros((n, self.net.n_inputs))
        self.rows[:, :n_x] = X * PIXEL_SCALE
        self.rows[np.arange(n), n_x + Y.astype(np.int64)] = 1.0

    def train(self, X, Y, lr):
        net = self.net
        for row in self.rows:
            net.set_input(row)
            net.zero_grad()
            net.forward()
            net.backward()
            net.update(lr)


class _InterpretedTrainer:
    """micrograd as written: a fresh graph per image, Value.backward, then the SGD step."""

    def __init__(self, config, row, timeout):
        self.model = build_graph(SEED).model
        self.params = self.model.parameters()
        self.init = [p.data for p in self.params]

    def reset(self):
        for p, value in zip(self.params, self.init):
            p.data = value

    def train(self, X, Y, lr):
        for pixels, label in zip(X, Y):
            sgd_step(self.model, image_loss(self.model, pixels, label), lr)

    accuracy = None  # see INTERPRETED_NOTE


class _PeerTrainer:
    def __init__(self, config, row, timeout):
        init = peer_params(build_graph(SEED).model)
        if config.kind == 'c-reference':
            self.make = lambda: CReference(init, compiler=config.compiler, opt=config.opt, native=config.native,
                                           measure_memory=True, sparse=config.sparse,
                                           input_major=config.input_major)
            _record_build(row, self.make().build)  # this build compiles; reset()'s come from the cache
        else:
            self.make = lambda: {'numpy': NumpyMLP, 'torch': TorchMLP}[config.kind](init)
            self.make()  # an ImportError (no torch) here, before anything is timed

    def reset(self):
        self.peer = self.make()  # the peers take their initial weights when built

    def train(self, X, Y, lr):
        self.peer.train(X, Y, lr)

    def accuracy(self, X, Y):
        return self.peer.accuracy(X, Y)


def _trainer(config):
    return _StepTrainer if config.step_api else _TRAINERS[config.kind]


_TRAINERS = {'compiled': _CompiledTrainer, 'interpreted': _InterpretedTrainer, 'numpy': _PeerTrainer,
             'torch': _PeerTrainer, 'c-reference': _PeerTrainer}


# ---- running a list of configurations from the command line -------------------------------------

def add_arguments(parser, n_train: int, timeout: float, configs: list[Config]) -> None:
    """The options bench and compare share."""
    parser.add_argument('--n-train', type=int, default=n_train,
                        help=f'training images per timed run, extrapolated to {EPOCH_IMAGES:,} (default {n_train})')
    parser.add_argument('--repeats', type=int, default=3, help='timed runs per configuration; the median counts')
    parser.add_argument('--timeout', type=float, default=timeout,
                        help=f'seconds a compile may take before it is stopped and reported "> limit" '
                             f'(default {timeout:g})')
    parser.add_argument('--lr', type=float, default=LR)
    add_data_dir_argument(parser)
    parser.add_argument('--dtype', choices=dtypes.NAMES, default=dtypes.DEFAULT.name,
                        help=f'the element type of our {dtypes.DEFAULT.name} rows (other types: labels gain its short '
                             f'name, e.g. -f32; default {dtypes.DEFAULT.name})')
    parser.add_argument('--configs', nargs='+', metavar='LABEL', choices=[c.label for c in configs],
                        help='measure only these: ' + ' '.join(c.label for c in configs))


def measure_all(configs: list[Config], data, args) -> list[Row]:
    """measure() each configuration (those in args.configs if given), reporting progress on stderr."""
    chosen = [c for c in configs if not args.configs or c.label in args.configs]
    rows = []
    for i, config in enumerate(chosen, 1):
        print(f'[{i}/{len(chosen)}] {config.label} ...', end=' ', file=sys.stderr, flush=True)
        row = measure(config, data, args.n_train, args.repeats, args.timeout, args.lr)
        done = f'{_number(row.s_per_epoch)} s/epoch' if row.status == 'ok' else row.status
        print(done, file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def table_notes(args) -> list[str]:
    """How to read the numbers of a measure_all(..., args) table."""
    return [f's/epoch: the median of {args.repeats} timed runs of up to {args.n_train:,} training images, '
            f'each from the same initial weights, extrapolated to {EPOCH_IMAGES:,} images; '
            f'lr {args.lr}. "> limit": the compile exceeded the {args.timeout:g} s timeout.',
            INTERPRETED_NOTE, COMPILER_PEAK_NOTE]


def machine_description() -> list[str]:
    """CPU model, OS, Python and the C compilers' versions: what the timings depend on."""
    cpu = next((line.partition(':')[2].strip() for line in _read_lines('/proc/cpuinfo')
                if line.startswith('model name')), platform.processor() or platform.machine())
    lines = [f'CPU: {cpu} ({os.cpu_count()} logical cores)', f'OS: {platform.platform()}',
             f'Python: {platform.python_version()}, NumPy {np.__version__}']
    for name in COMPILER_NAMES:
        try:
            lines.append(f'{name}: {find_compiler(name).version}')
        except CompilerNotFound:
            lines.append(f'{name}: not installed')
    return lines


def _read_lines(path) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


# ---- tables ------------------------------------------------------------------------------------

def _number(x) -> str:
    return f'{x:,.0f}' if abs(x) >= 100 else f'{x:.3g}'


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[Row], object]     # the raw value, as CSV holds it; None when not measured
    text: Callable[[object], str] = str  # how markdown shows a value that is not None


COLUMNS = {column.header: column for column in [
    Column('config', lambda r: r.config.label),
    Column('mode', lambda r: r.config.mode),
    Column('compiler', lambda r: r.config.compiler),
    Column('flags', lambda r: r.config.flags or None),
    Column('status', lambda r: r.status),
    Column('codegen s', lambda r: r.codegen_s, _number),
    Column('C lines', lambda r: r.c_lines, '{:,}'.format),
    Column('C bytes', lambda r: r.c_bytes, '{:,}'.format),
    Column('compile s', lambda r: r.compile_s, _number),
    Column('compiler peak MB', lambda r: r.compiler_peak_mb, '{:,.0f}'.format),
    Column('images timed', lambda r: r.images_timed, '{:,}'.format),
    Column('s/epoch', lambda r: r.s_per_epoch, _number),
    Column('test accuracy', lambda r: r.accuracy, '{:.2%}'.format),
    Column('process peak MB', lambda r: r.process_peak_mb, '{:,.0f}'.format),
]}


def columns(*headers: str) -> list[Column]:
    return [COLUMNS[header] for header in headers]


def _s_per_epoch(rows, label):
    return next((r.s_per_epoch for r in rows if r.config.label == label), None)


def _ratio(numerator, denominator):
    return numerator / denominator if numerator and denominator else None


def _times(x) -> str:
    return f'{x:,.0f}x' if x >= 100 else f'{x:.2f}x'


def speedup_column(rows: list[Row], label: str) -> Column:
    """How many times faster each row trains than the row `label`."""
    base = _s_per_epoch(rows, label)
    return Column(f'speedup vs {label}', lambda r: _ratio(base, r.s_per_epoch), _times)


def ratio_column(rows: list[Row], label: str) -> Column:
    """Each row's training time over the row `label`'s: below 1x is faster."""
    base = _s_per_epoch(rows, label)
    return Column(f'time / {label}', lambda r: _ratio(r.s_per_epoch, base), _times)


def markdown_table(rows: list[Row], table_columns: list[Column]) -> str:
    def cell(column, row):
        value = column.value(row)
        return '-' if value is None else column.text(value)

    lines = ['| ' + ' | '.join(c.header for c in table_columns) + ' |',
             '|' + '|'.join('---' for _ in table_columns) + '|']
    lines += ['| ' + ' | '.join(cell(c, row) for c in table_columns) + ' |' for row in rows]
    return '\n'.join(lines)


def write_csv(rows: list[Row], table_columns: list[Column], path) -> None:
    """Raw values at full precision (floats round-trip); empty cells where nothing was measured."""
    with open(path, 'w', newline='') as file:
        writer = csv.writer(file)
        writer.writerow(c.header for c in table_columns)
        for row in rows:
            writer.writerow('' if (v := c.value(row)) is None else v for c in table_columns)
