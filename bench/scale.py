"""The scale table: how lowering's time and memory grow with the model. MLP(784, [..., 10]) from 40k to
1.9M parameters, each as a new user builds it (`mnist.model.build_graph(hidden=...)` then
`.compile(compiler="gcc", opt=3, native=True, dtype="float32")`), in its own processes: one that
builds the module into an empty cache (graph, codegen, C compile, peak RSS), then one that builds
the graph again and finds the module in that cache (the cache hit: seconds beyond the graph).
Writes a log-log plot of codegen time and peak RSS against parameter count, with the fitted slopes.
Then the front end against karpathy's micrograd: MLP(784, [512, 256, 10]) and its forward pass built
by each (CPU seconds, Values, bytes per Value).

    python -m bench --only scale [--hidden 512,256 1024,1024 ...] [--plot build/scale.png] [--quick]
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

# hidden layers: 40k, 109k, 235k, 536k, 1.06M, 1.86M parameters
HIDDEN = [(50,), (128, 64), (256, 128), (512, 256), (1024, 256), (1024, 1024)]
QUICK = [(50,), (128, 64)]
# The targets (seconds, bytes): per hidden layers, what each column must not exceed
TARGETS = {(50,): {'codegen': 0.3}, (512, 256): {'codegen': 1.0},
           (1024, 1024): {'codegen': 3.0, 'hit': 0.3, 'graph': 4.0, 'peak_rss': 1.2e9}}
OPTIONS = dict(compiler='gcc', opt=3, native=True, dtype='float32')


def measure(hidden, cache) -> dict:
    """One process's figures: build the graph, compile it (from `cache`)."""
    import codegen  # (imported before the clock starts, as a user's script has it)
    from mnist import model
    codegen.walker.module()  # the graph's C walker, built once per machine (on a fresh one, by the first model)
    started = time.perf_counter()
    graph = model.build_graph(hidden=hidden)
    built, cpu = time.perf_counter(), time.process_time()
    net = graph.compile(cache=cache, **OPTIONS)
    # this process's CPU seconds in compile(): codegen (the compiler runs in a child) and loading;
    # on a shared machine, the figure its neighbours do not inflate
    cpu = time.process_time() - cpu
    loaded = time.perf_counter()
    return {'hidden': list(hidden), 'params': net.n_params, 'graph': built - started,
            'codegen': net.timings['codegen'], 'compile': net.timings['compile'], 'cached': net.build.cached,
            'beyond_graph': loaded - built, 'cpu': cpu,
            'peak_rss': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def in_process(hidden, cache) -> dict:
    """measure() in a fresh interpreter, so that its peak RSS is its own."""
    done = subprocess.run([sys.executable, '-m', 'bench.scale', '--child', ','.join(map(str, hidden)),
                           '--cache', str(cache)], capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f'MLP {hidden} failed:\n{done.stderr}')
    return json.loads(done.stdout.splitlines()[-1])


def run_model(hidden) -> dict:
    with tempfile.TemporaryDirectory(prefix='scale-cache-') as cache:
        miss = in_process(hidden, cache)
        hit = in_process(hidden, cache)
    if miss['cached'] or not hit['cached']:
        raise RuntimeError(f'MLP {hidden}: expected a build, then a cache hit; got cached={miss["cached"]}, '
                           f'{hit["cached"]}')
    return {**miss, 'hit': hit['beyond_graph'], 'hit_cpu': hit['cpu'], 'hit_graph': hit['graph']}


def slope(xs, ys) -> float:
    """The least-squares slope of log(y) against log(x): the exponent of the growth."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def table(rows) -> str:
    def target(row, column, text):
        limit = TARGETS.get(tuple(row['hidden']), {}).get(column)
        return text if limit is None else f'{text} {"✓" if row[column] <= limit else "✗"}'
    lines = ['| model | parameters | graph | codegen (CPU) | C compile | cache hit beyond the graph (CPU) | peak RSS |',
             '|---|---:|---:|---:|---:|---:|---:|']
    for r in rows:
        cells = [f'MLP(784, [{", ".join(map(str, r["hidden"]))}, 10])', f'{r["params"]:,}',
                 target(r, 'graph', '%.2f s' % r['graph']),
                 target(r, 'codegen', '%.2f s (%.2f s)' % (r['codegen'], r['cpu'])),
                 '%.2f s' % r['compile'], target(r, 'hit', '%.2f s (%.2f s)' % (r['hit'], r['hit_cpu'])),
                 target(r, 'peak_rss', f'{r["peak_rss"] / 1e6:,.0f} MB')]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def plot(rows, path) -> bool:
    """Codegen seconds and peak RSS against parameters, log-log; False without matplotlib."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    except ImportError:
        print(f'{path} not written: it needs matplotlib (the plot extra)', file=sys.stderr)
        return False
    params = [r['params'] for r in rows]
    figure = Figure(figsize=(8, 5), layout='constrained')
    axes = figure.subplots()
    # CPU seconds: on a shared machine the wall clock also measures the neighbours
    codegen_cpu = [r['cpu'] for r in rows]
    axes.loglog(params, codegen_cpu, 'o-', label=f'codegen, CPU s (slope {slope(params, codegen_cpu):.2f})')
    axes.loglog(params, [r['hit_cpu'] for r in rows], 's--', label='cache hit beyond the graph, CPU s')
    axes.loglog(params, [r['graph'] for r in rows], '^:', label='building the graph, s')
    axes.set_xlabel('parameters')
    axes.set_ylabel('seconds')
    memory = axes.twinx()
    peak = [r['peak_rss'] for r in rows]
    memory.loglog(params, [p / 1e6 for p in peak], 'kx-', label=f'peak RSS, MB (slope {slope(params, peak):.2f})')
    memory.set_ylabel('peak RSS, MB')
    handles = axes.get_legend_handles_labels()[0] + memory.get_legend_handles_labels()[0]
    axes.legend(handles, [h.get_label() for h in handles], loc='upper left', fontsize=8)
    axes.set_title('MLP(784, [..., 10]), gcc -O3 -march=native, float32')
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    return True


# The front end against karpathy's micrograd (the `micrograd` package, a test dependency): the
# same model and forward pass built as a user builds it, each in a process of its own.
FRONT_END_HIDDEN = (512, 256)
FRONT_ENDS = ('micrograd_c', 'micrograd')


def _rss() -> int:
    with open('/proc/self/statm') as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def measure_front_end(package) -> dict:
    """Seconds (CPU) to build MLP(784, [512, 256, 10])'s parameters and its forward pass on 784
    input Values, the Values of micrograd's graph of the logits, and the bytes they hold (RSS)."""
    import importlib
    import random
    engine, nn = (importlib.import_module(f'{package}.{name}') for name in ('engine', 'nn'))
    random.seed(0)
    before = _rss()
    started = time.process_time()
    model = nn.MLP(784, [*FRONT_END_HIDDEN, 10])
    built = time.process_time()
    logits = model([engine.Value(0.0) for _ in range(784)])
    forward = time.process_time()
    grown = _rss() - before
    made = made_bytes = None
    if package == 'micrograd_c':
        values = engine.value_count(*logits)
        began, before = time.process_time(), _rss()
        engine.topological_order(*logits)  # what backward() walks: the Dots' chains made
        made, made_bytes = time.process_time() - began, _rss() - before
    else:  # its Values, by identity
        seen, stack = set(), list(logits)
        while stack:
            v = stack.pop()
            if id(v) not in seen:
                seen.add(id(v))
                stack.extend(v._prev)
        values = len(seen)
    return {'package': package, 'params': built - started, 'forward': forward - built, 'values': values,
            'bytes': grown, 'made': made, 'made_bytes': made_bytes}


def front_end_table(rows) -> str:
    lines = [f'| front end, MLP(784, [{", ".join(map(str, FRONT_END_HIDDEN))}, 10]) | parameters built (CPU) '
             '| forward pass built (CPU) | Values (micrograd\'s graph) | RSS growth | bytes per Value '
             '| chains made for backward() (CPU, RSS) |',
             '|---|---:|---:|---:|---:|---:|---:|']
    for r in rows:
        made = '-' if r['made'] is None else f'{r["made"]:.2f} s, +{r["made_bytes"] / 1e6:,.0f} MB'
        lines.append(f'| {r["package"]} | {r["params"]:.2f} s | {r["forward"]:.2f} s | {r["values"]:,} '
                     f'| {r["bytes"] / 1e6:,.0f} MB | {r["bytes"] / r["values"]:.0f} | {made} |')
    return '\n'.join(lines)


def front_end_in_process(package) -> dict:
    done = subprocess.run([sys.executable, '-m', 'bench.scale', '--front-end', package], capture_output=True,
                          text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f'the front end of {package} failed:\n{done.stderr}')
    return json.loads(done.stdout.splitlines()[-1])


def parse_hidden(text):
    return tuple(int(n) for n in text.split(','))


def main(argv=None) -> int:
    """One measurement, in this process: python -m bench.scale --child 512,256 --cache DIR."""
    child = argparse.ArgumentParser()
    child.add_argument('--child', type=parse_hidden)
    child.add_argument('--cache')
    child.add_argument('--front-end', choices=FRONT_ENDS)
    args = child.parse_args(argv)
    print(json.dumps(measure_front_end(args.front_end) if args.front_end else measure(args.child, args.cache)))
    return 0


def run(args) -> int:
    """`python -m bench --only scale` (bench/cli.py): each model measured in processes of its own."""
    hidden = [parse_hidden(h) for h in args.hidden] if args.hidden else QUICK if args.quick else HIDDEN
    rows = []
    for h in hidden:
        rows.append(run_model(h))
        print(f'MLP {list(h)}: {rows[-1]["params"]:,} params, codegen {rows[-1]["codegen"]:.2f} s', file=sys.stderr,
              flush=True)
    print(table(rows))
    if len(rows) > 1:
        params = [r['params'] for r in rows]
        slopes = {name: slope(params, [r[column] for r in rows]) for name, column in (
            ('codegen', 'codegen'), ('codegen CPU', 'cpu'), ('cache hit', 'hit'), ('cache hit CPU', 'hit_cpu'),
            ('graph', 'graph'), ('peak RSS', 'peak_rss'))}
        print('\nslopes (log-log, against parameters): ' + ', '.join(f'{n} {v:.2f}' for n, v in slopes.items()))
        if plot(rows, args.plot):
            print(f'plot: {args.plot}')
        pathlib.Path(args.plot).with_suffix('.json').write_text(json.dumps(rows, indent=1))
    if not args.quick:
        print('\n' + front_end_table([front_end_in_process(package) for package in FRONT_ENDS]))
    return 0


if __name__ == '__main__':
    sys.exit(main())
