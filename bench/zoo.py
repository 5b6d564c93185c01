"""The model zoo benchmark: each model of bench.models trained by our module (TCC; GCC and Clang at -O2
and -O3 -march=native), by its plain-C reference built with the same compiler and flags, and by
NumPy; and whether the compiler's targets for them are met.

    python -m bench --only zoo [--models NAME ...] [--configs LABEL ...] [--repeats 3] [--timeout 300] [--quick]

µs/step is the median of --repeats timed runs (each from the initial parameters) over the model's
steps; ours' ratio to its C reference is the median over back-to-back pairs of runs (ours, then the
reference), which see the same moment of a shared machine.
"""
from __future__ import annotations

import json
import math
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import codegen
from codegen import CompilerNotFound, CompileTimeout
from mnist.resources import process_peak_rss

from . import models
from .measure import (NUMPY, Column, Config, _fresh_build_cache, _number, build_module_runtime, compiled,
                      machine_description, markdown_table)
from .zoo_peers import CReference, Module, Numpy

OURS = [compiled('tcc'), compiled('gcc', 2), compiled('clang', 2), compiled('gcc', 3, native=True),
        compiled('clang', 3, native=True)]


def reference_of(config: Config) -> Config:
    """The C reference built with our row's compiler and flags."""
    return Config('c-ref-' + config.label, 'c-reference', config.compiler, config.opt, config.native)


REFERENCES = {c.label: reference_of(c) for c in OURS}
BEST_REFERENCE = REFERENCES['gcc-O3-native'].label  # the column every row is also divided by
CONFIGS = [*OURS, *REFERENCES.values(), NUMPY]
PAIRS = 5
LOSS_TOLERANCE = 1e-6  # relative: the mean loss of a run, ours or NumPy, against the C reference's
QUICK = {'models': ['demo', 'mlp-50'], 'configs': ['tcc', 'c-ref-tcc', 'c-ref-gcc-O2', 'numpy'],
         'repeats': 1, 'steps_divisor': 10, 'pairs': 1, 'sample_seconds': 0.01}
SAMPLE_SECONDS = 0.2
PROBE_MEMORY_LIMIT = 6 << 30  # bytes of address space for the big-graph subprocess: fail rather than swap


@dataclass
class ZooRow:
    model: str
    config: Config
    status: str = 'ok'
    codegen_s: float | None = None
    compile_s: float | None = None
    runtime_s: float | None = None  # the module runtime's build (once a machine, compiler and flags)
    c_lines: int | None = None
    steps: int | None = None
    us_per_step: float | None = None
    loss: float | None = None           # the mean loss of a timed run
    paired_ratio: float | None = None   # ours over its C reference, median of back-to-back pairs
    ratio_best: float | None = None     # us_per_step over c-ref-gcc-O3-native's (separate medians)
    loss_difference: float | None = None  # relative, against the C reference (its own: c-ref-gcc-O3-native)


def _build(config: Config, model, row: ZooRow, timeout):
    if config.kind == 'compiled':
        # the runtime first (its own column), so that the model's compile s is its own units'
        row.runtime_s = build_module_runtime(config.compiler, config.opt, config.native, timeout)
        trainer = Module(model, config.compiler, config.opt, config.native, timeout)
        row.c_lines = sum(path.read_text().count('\n') for path in trainer.net.build.c_files)  # the model's own
        row.codegen_s = trainer.net.timings['codegen']
        row.compile_s = trainer.net.build.seconds
    elif config.kind == 'c-reference':
        trainer = CReference(model, config.compiler, config.opt, config.native, timeout)
        row.compile_s = trainer.build.seconds
    else:
        trainer = Numpy(model)
    return trainer


def _rounds(trainer, steps, sample_seconds) -> int:
    """How many runs one timing sample strings together to last about sample_seconds (the demo's 100
    steps take milliseconds: too short to time alone on a shared machine); this first run also warms up."""
    seconds, _ = _timed(trainer, steps, 1)
    return max(1, math.ceil(sample_seconds / max(seconds * steps, 1e-9)))


def _timed(trainer, steps, rounds) -> tuple[float, float]:
    """(seconds per step, mean loss) of `rounds` runs of `steps` steps, each from the initial parameters."""
    started = time.perf_counter()
    for _ in range(rounds):
        trainer.reset()
        loss = trainer.run(steps)
    return (time.perf_counter() - started) / (rounds * steps), loss


def measure_model(model, configs, repeats, pairs, timeout, sample_seconds=0.2, log=print) -> list[ZooRow]:
    """Builds and times every configuration on one model; a configuration that cannot run gets its
    reason in row.status. Each timing sample lasts about sample_seconds (see _rounds)."""
    rows, trainers, rounds = {}, {}, {}
    for config in configs:
        row = rows[config.label] = ZooRow(model.name, config, steps=model.steps)
        try:
            with _fresh_build_cache():  # every build runs (and times) the compiler
                trainer = _build(config, model, row, timeout)
            rounds[config.label] = _rounds(trainer, model.steps, sample_seconds)
            runs = [_timed(trainer, model.steps, rounds[config.label]) for _ in range(repeats)]
            row.us_per_step = statistics.median(s for s, _ in runs) * 1e6
            row.loss = runs[0][1]
            trainers[config.label] = trainer
        except CompilerNotFound:
            row.status = 'not installed'
        except CompileTimeout:
            row.status = '> limit'
        except Exception as error:  # one broken configuration must not lose the rest of the table
            lines = str(error).strip().splitlines() or [type(error).__name__]
            row.status = f'failed: {lines[0]}'
        log(f'  {model.name} {config.label}: ' + (f'{_number(row.us_per_step)} µs/step' if row.status == 'ok'
                                                   else row.status))
    for label, reference in REFERENCES.items():
        if label in trainers and reference.label in trainers:
            ratios = []
            for _ in range(pairs):
                ours, _ = _timed(trainers[label], model.steps, rounds[label])
                theirs, _ = _timed(trainers[reference.label], model.steps, rounds[reference.label])
                ratios.append(ours / theirs)
            rows[label].paired_ratio = statistics.median(ratios)
    measured = [r for r in rows.values() if r.status == 'ok']
    best = rows.get(BEST_REFERENCE)
    # NumPy's and the references' losses are checked against c-ref-gcc-O3-native, else any reference
    fallback = next((r for r in [best, *measured] if r and r.status == 'ok' and r.config.kind == 'c-reference'),
                    None)
    for row in measured:
        own = rows.get(REFERENCES[row.config.label].label) if row.config.label in REFERENCES else fallback
        if own is not None and own.loss is not None:
            row.loss_difference = abs(row.loss - own.loss) / abs(own.loss)
        if best is not None and best.status == 'ok':
            row.ratio_best = row.us_per_step / best.us_per_step
    return list(rows.values())


def _times(x) -> str:
    return f'{x:.2f}x'


TABLE = [
    Column('model', lambda r: r.model),
    Column('config', lambda r: r.config.label),
    Column('status', lambda r: r.status),
    Column('codegen s', lambda r: r.codegen_s, _number),
    Column('compile s', lambda r: r.compile_s, _number),
    Column('runtime s (once)', lambda r: r.runtime_s, _number),
    Column('C lines', lambda r: r.c_lines, '{:,}'.format),
    Column('µs/step', lambda r: r.us_per_step, _number),
    Column('time / C ref, same flags (pairs)', lambda r: r.paired_ratio, _times),
    Column(f'time / {BEST_REFERENCE}', lambda r: r.ratio_best, _times),
    Column('mean loss', lambda r: r.loss, '{:.6g}'.format),
    Column('loss vs C ref', lambda r: r.loss_difference, '{:.0e}'.format),
]


# ---- the graph-size target: MLP(784, [512, 256, 10]) -------------------------------------------------

def probe_big_graph(hidden=models.BIG_HIDDEN) -> dict:
    """Builds MLP(784, [*hidden, 10])'s training graph and generates its C (codegen.generate), in this
    process: seconds of each and the process's peak RSS. Run it in a fresh process (big_graph)."""
    started = time.perf_counter()
    model = models.mlp(hidden)
    built = time.perf_counter()
    sources = codegen.generate(model.loss, model.inputs, model.params, model.outputs)
    generated = time.perf_counter()
    return {'build_s': built - started, 'generate_s': generated - built, 'peak_bytes': process_peak_rss(),
            'params': len(model.params), 'c_lines': sum(s.count('\n') for s in sources)}


def big_graph(timeout: float, hidden=models.BIG_HIDDEN) -> dict:
    """probe_big_graph in a subprocess, so that the peak memory is its own; {'status': ...} on failure."""
    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (PROBE_MEMORY_LIMIT, PROBE_MEMORY_LIMIT))

    code = f'import json; from bench.zoo import probe_big_graph; print(json.dumps(probe_big_graph({tuple(hidden)})))'
    try:
        done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=timeout,
                              preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        return {'status': f'> {timeout:g} s'}
    if done.returncode != 0:
        why = 'MemoryError' in done.stderr and f'> {PROBE_MEMORY_LIMIT >> 30} GB address space'
        return {'status': 'failed: ' + (why or (done.stderr.strip().splitlines() or ['?'])[-1])}
    return {'status': 'ok', **json.loads(done.stdout.splitlines()[-1])}


# ---- targets ------------------------------------------------------------------------------------

def target_lines(rows: list[ZooRow], big: dict | None) -> list[str]:
    ok = {(r.model, r.config.label): r for r in rows if r.status == 'ok'}
    model_names = list(dict.fromkeys(r.model for r in rows))

    def verdict(goal, pieces, met):
        if not pieces:
            return f'- {goal}: not measured'
        return f'- {goal}: {"; ".join(pieces)} -> {"met" if met else "NOT MET"}'

    def ratios(labels, limit, names=model_names):
        pieces, met = [], True
        for name in names:
            for label in labels:
                row = ok.get((name, label))
                if row is None or row.paired_ratio is None:
                    continue
                pieces.append(f'{name} {label} {row.paired_ratio:.2f}x')
                met &= row.paired_ratio <= limit
        return pieces, met

    lines = [verdict('every model, gcc and clang -O3 -march=native <= 1.3x its C reference (same flags, pairs)',
                     *ratios(['gcc-O3-native', 'clang-O3-native'], 1.3))]
    demo = [name for name in model_names if name.startswith('demo')]
    lines.append(verdict('the demo <= 0.7x its C reference (gcc and clang -O3 -march=native)',
                         *ratios(['gcc-O3-native', 'clang-O3-native'], 0.7, demo)))
    build = [r for r in ok.values() if r.config.label in ('gcc-O3-native', 'clang-O2', 'clang-O3-native')]
    lines.append(verdict('every model, codegen + compile <= 2 s with gcc -O3 -march=native and with clang (the module '
                         'runtime built before, as once a machine: its time in "runtime s (once)")',
                         [f'{r.model} {r.config.label} {r.codegen_s + r.compile_s:.2f} s' for r in build],
                         all(r.codegen_s + r.compile_s <= 2 for r in build)))
    tcc = [r for r in ok.values() if r.config.label == 'tcc']
    lines.append(verdict('TCC compile <= 0.2 s and TCC <= 4x the C reference (built by tcc, pairs)',
                         [f'{r.model} compile {r.compile_s:.3f} s, '
                          + (f'{r.paired_ratio:.2f}x' if r.paired_ratio else 'ratio not measured') for r in tcc],
                         all(r.compile_s <= 0.2 and r.paired_ratio is not None and r.paired_ratio <= 4
                             for r in tcc)))
    goal = (f'MLP(784, {[*models.BIG_HIDDEN, 10]}) builds its graph and generates C in <= 10 s, '
            'process peak <= 2 GB (a subprocess)')
    if big is None:
        lines.append(f'- {goal}: not measured')
    elif big['status'] != 'ok':
        lines.append(f'- {goal}: {big["status"]} -> NOT MET')
    else:
        seconds, peak = big['build_s'] + big['generate_s'], big['peak_bytes'] / 1e9
        lines.append(f'- {goal}: {seconds:.1f} s (graph {big["build_s"]:.1f} s, generate {big["generate_s"]:.1f} s, '
                     f'{big["params"]:,} parameters, {big["c_lines"]:,} C lines), peak {peak:.2f} GB -> '
                     + ('met' if seconds <= 10 and peak <= 2 else 'NOT MET'))
    checked = [r for r in ok.values() if r.loss_difference is not None]
    lines.append(verdict(f'sanity: every row\'s mean loss equals its C reference\'s to {LOSS_TOLERANCE:g} '
                         '(the same initial weights and data trained the same numbers)',
                         [f'largest difference {max((r.loss_difference for r in checked), default=0):.0e}'],
                         all(r.loss_difference <= LOSS_TOLERANCE for r in checked)) if checked
                 else '- sanity: not measured')
    return lines


def run(args) -> int:
    """The zoo part of `make bench` (bench/cli.py parses args): prints the table, its notes and the targets; 0, or 1 when a row's
    loss disagrees with its C reference (the comparison would not be honest)."""
    if args.quick:
        vars(args).update({k: v for k, v in QUICK.items() if k in ('models', 'configs', 'repeats')})
    configs = [c for c in CONFIGS if not args.configs or c.label in args.configs]
    if not configs:
        print('model zoo: none of --configs is a zoo configuration; skipped')
        return 0
    divisor, pairs, sample_seconds = ((QUICK['steps_divisor'], QUICK['pairs'], QUICK['sample_seconds'])
                                      if args.quick else (1, PAIRS, SAMPLE_SECONDS))

    def log(message):
        print(message, file=sys.stderr, flush=True)

    rows = []
    for name in args.models or list(models.MODELS):
        log(f'[zoo] {name}: building the graph ...')
        model = models.MODELS[name]()
        model.steps = max(1, model.steps // divisor)
        rows += measure_model(model, configs, args.repeats, pairs, args.timeout, sample_seconds, log)
        del model
    big = None
    if not args.quick:
        log('[zoo] MLP(784, [512, 256, 10]): graph and C in a subprocess ...')
        big = big_graph(args.timeout)

    print(markdown_table(rows, TABLE))
    print(f'\nµs/step: the median of {args.repeats} timing samples, each of as many runs of the model\'s steps '
          f'as last about {sample_seconds:g} s, every run from the same initial parameters (demo: its 100 '
          'full-batch steps at rate 1.0 - 0.9k/100, ours in one train() call on empty rows with the rate of each '
          'step; batch-1 models: rows of fixed random uint8 images through train(), lr 0.01). '
          'time / C ref, same flags: ours over the C reference built with the same compiler and flags, the '
          f'median of {pairs} back-to-back pairs of samples. time / {BEST_REFERENCE}: '
          'separate medians. loss vs C ref: the relative difference of the runs\' mean losses (against '
          f'{BEST_REFERENCE} for the references and NumPy).')
    print('\nTargets:')
    targets = target_lines(rows, big)
    print('\n'.join(targets))
    print('\n' + '\n'.join(machine_description()))
    checked = [r.loss_difference for r in rows if r.loss_difference is not None]
    return 1 if any(d > LOSS_TOLERANCE for d in checked) else 0
