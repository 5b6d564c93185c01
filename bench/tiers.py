"""The compilers on random irregular graphs (bench/irregular.py): each compiler's build time, its
peak memory and the step time of what it built, and with tiers (compile(..., tiered=True)) how
soon the first tier trains and when the optimised build is in.

    python -m bench --only tiers [--quick] [--sizes 5000 20000 100000] [--tier-configs tcc gcc-O2 clang-O2]

Every build goes into an empty cache. The step is train() over 200 random rows at batch 1 (a
forward, a backward and an SGD step per row), the fastest of 7 passes, the two forms' modules
timed in turn. Reported beside issue 34's targets
(the first tier training within 0.5 s of compile(), gcc -O2 within 3 s at 20k Values and 15 s at
100k, compiler memory <= 1 GB, the step within 1.2x of the unbounded form's): the bounded form
and the unbounded one (up to --before-max Values) are built in the same run, and their ratios
printed, since the machine may be shared and noisy.
"""
from __future__ import annotations

import contextlib
import sys
import tempfile
import time

import numpy as np

import codegen
from codegen.lower import ir

from . import irregular

SIZES = (5_000, 20_000, 100_000)
QUICK_SIZES = (5_000,)
CONFIGS = {'tcc': ('tcc', 2), 'libtcc': ('libtcc', 2), 'gcc-O2': ('gcc', 2), 'clang-O2': ('clang', 2)}
ROWS = 200


def rows(graph, n=ROWS, seed=0):
    """(X, Y): random rows for the graph's inputs, Y the last input's column (float targets)."""
    rng = np.random.default_rng(seed)
    data = rng.uniform(-1, 1, (n, len(graph.inputs)))
    return np.ascontiguousarray(data[:, :-1]), np.ascontiguousarray(data[:, -1:])


def step_seconds(nets, graph, repeats=7):
    """Seconds of one training step (train() over ROWS rows at batch 1, per row) of each module,
    the modules timed in turn, each its fastest pass: a neighbour's load slows a pass, never
    speeds it, and both modules see the same minute of it."""
    X, Y = rows(graph)
    best = [float('inf')] * len(nets)
    for _ in range(repeats):
        for i, net in enumerate(nets):
            started = time.perf_counter()
            net.train(X, Y, 1e-3)
            best[i] = min(best[i], (time.perf_counter() - started) / len(X))
    return best


def measure(graph, compiler, opt, **options):
    """{'compile': seconds, 'codegen': seconds, 'peak_mb': compiler MB (None for libtcc), 'net': the module}."""
    with tempfile.TemporaryDirectory() as cache:
        net = codegen.compile(graph.loss, graph.inputs, graph.params, compiler=compiler, opt=opt, batch=1,
                              cache=cache, measure_memory=compiler != 'libtcc', tiered=False, **options)
        return {'compile': net.build.seconds, 'codegen': net.timings['codegen'],
                'peak_mb': net.build.peak_rss and net.build.peak_rss / 2**20, 'net': net}


@contextlib.contextmanager
def unbounded():
    """The form every program had before bounded straight-line code: three backwards where they
    apply, functions of 200 statements (for same-run comparisons)."""
    saved = ir.ONE_BACKWARD_MIN_STATEMENTS
    ir.ONE_BACKWARD_MIN_STATEMENTS = float('inf')
    try:
        yield
    finally:
        ir.ONE_BACKWARD_MIN_STATEMENTS = saved


def tiered(graph, compiler, opt):
    """compile(tiered=True) into an empty cache: seconds until compile() returns (the first tier
    trains), seconds until the optimised tier runs while training goes on, steps trained meanwhile."""
    X, Y = rows(graph)
    with tempfile.TemporaryDirectory() as cache:
        started = time.perf_counter()
        net = codegen.compile(graph.loss, graph.inputs, graph.params, compiler=compiler, opt=opt, batch=1,
                              cache=cache, tiered=True)
        returned = time.perf_counter() - started
        steps = 0
        while net.building:
            net.train(X, Y, 1e-3)
            steps += len(X)
        net.wait()
        return {'returned': returned, 'optimised': time.perf_counter() - started, 'steps': steps, 'tier': net.tier}


def run(args) -> int:
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    configs = [c for c in (args.tier_configs or CONFIGS)]
    print('random irregular graphs (bench/irregular.py), batch=1, each build into an empty cache; "before": the')
    print('unbounded form (three backwards, functions of 200 statements), same run\n')
    print('| Values | compiler | form | codegen s | compile s | compiler peak MB | step us |')
    print('|---:|---|---|---:|---:|---:|---:|')
    status = 0
    for size in sizes:
        graph = irregular.graph(size)
        for label in configs:
            compiler, opt = CONFIGS[label]
            forms = [('bounded', contextlib.nullcontext)]
            if size <= args.before_max and compiler in ('gcc', 'clang'):
                forms.append(('before', unbounded))
            figures = {}
            for form, context in forms:
                try:
                    with context():
                        figures[form] = measure(graph, compiler, opt)
                except codegen.ToolchainError as error:
                    print(f'| {size:,} | {label} | {form} | failed: {str(error).splitlines()[0]} | | | |', flush=True)
                    status = 1
            steps = step_seconds([m['net'] for m in figures.values()], graph)
            for (form, m), step in zip(figures.items(), steps):
                m['step_us'] = step * 1e6
                peak = f"{m['peak_mb']:.0f}" if m['peak_mb'] else '-'
                print(f"| {size:,} | {label} | {form} | {m['codegen']:.2f} | {m['compile']:.2f} | {peak} | "
                      f"{m['step_us']:.1f} |", flush=True)
            if len(figures) == 2:
                b, a = figures['bounded'], figures['before']
                print(f"|  |  | bounded/before | | {b['compile'] / a['compile']:.2f}x | | {b['step_us'] / a['step_us']:.2f}x |",
                      flush=True)
    print('\ntiered (compile(..., tiered=True)): when compile() returns and the first tier trains; when the optimised')
    print('tier runs, training all along\n')
    print('| Values | optimised by | compile() returned s | optimised tier from s | rows trained before |')
    print('|---:|---|---:|---:|---:|')
    for size in sizes:
        graph = irregular.graph(size)
        for label in configs:
            compiler, opt = CONFIGS[label]
            if compiler not in ('gcc', 'clang'):
                continue
            t = tiered(graph, compiler, opt)
            late = '' if t['tier'] == 'optimised' else ' (optimised build failed)'
            print(f"| {size:,} | {label} | {t['returned']:.2f} | {t['optimised']:.2f}{late} | {t['steps']:,} |", flush=True)
    return status


def add_arguments(parser):
    parser.add_argument('--sizes', nargs='+', type=int, help='graph sizes in Values (default 5000 20000 100000)')
    parser.add_argument('--tier-configs', nargs='+', choices=list(CONFIGS), help='compilers (default: all)')
    parser.add_argument('--before-max', type=int, default=20_000,
                        help='build the unbounded form too up to this size (default 20000: at 100k it takes minutes)')


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog='python -m bench.tiers', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='the 5k graph only')
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
