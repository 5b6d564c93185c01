"""The compilers on random irregular graphs (bench/irregular.py): each compiler's build time, its
peak memory and the step time of what it built, and with tiers (compile(..., tiered=True)) how
soon the first tier trains and when the optimised build is in.

    python -m bench --only tiers [--quick] [--sizes 5000 20000 100000] [--configs tcc gcc-O2 clang-O2]

Every build goes into an empty cache. The step is train() over 200 random rows at batch 1 (a
forward, a backward and an SGD step per row), the median of 5. The targets (first tier within
0.5 s of compile(), gcc -O2 within 3 s at 20k Values and 15 s at 100k, compiler memory <= 1 GB,
the bounded units' step within 1.2x of the unbounded one's) are checked as same-run ratios and
bounds; the machine may be shared and noisy.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time

import numpy as np

import codegen

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


def step_seconds(net, graph, repeats=5):
    """Median seconds of one training step (train() over ROWS rows at batch 1, per row)."""
    X, Y = rows(graph)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        net.train(X, Y, 1e-3)
        times.append((time.perf_counter() - started) / len(X))
    return statistics.median(times)


def measure(graph, compiler, opt, **options):
    """{'compile': seconds, 'peak_mb': compiler MB (None for libtcc), 'step_us': ..., 'lines': C lines}."""
    with tempfile.TemporaryDirectory() as cache:
        net = codegen.compile(graph.loss, graph.inputs, graph.params, compiler=compiler, opt=opt, batch=1,
                              cache=cache, measure_memory=compiler != 'libtcc', **options)
        return {'compile': net.build.seconds, 'codegen': net.timings['codegen'],
                'peak_mb': net.build.peak_rss and net.build.peak_rss / 2**20,
                'step_us': step_seconds(net, graph) * 1e6}


def run(args) -> int:
    sizes = args.sizes or (QUICK_SIZES if args.quick else SIZES)
    configs = [c for c in (args.tier_configs or CONFIGS)]
    print('random irregular graphs (bench/irregular.py), batch=1, each build into an empty cache\n')
    print('| Values | compiler | codegen s | compile s | compiler peak MB | step us |')
    print('|---:|---|---:|---:|---:|---:|')
    for size in sizes:
        graph = irregular.graph(size)
        for label in configs:
            compiler, opt = CONFIGS[label]
            try:
                m = measure(graph, compiler, opt)
            except codegen.ToolchainError as error:
                print(f'| {size:,} | {label} | failed: {str(error).splitlines()[0]} | | | |', flush=True)
                continue
            peak = f"{m['peak_mb']:.0f}" if m['peak_mb'] else '-'
            print(f"| {size:,} | {label} | {m['codegen']:.2f} | {m['compile']:.2f} | {peak} | {m['step_us']:.1f} |",
                  flush=True)
    return 0


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog='python -m bench.tiers', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--quick', action='store_true', help='the 5k graph only')
    parser.add_argument('--sizes', nargs='+', type=int, help='graph sizes in Values (default 5000 20000 100000)')
    parser.add_argument('--tier-configs', nargs='+', choices=list(CONFIGS), help='compilers (default: all)')
    return run(parser.parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
