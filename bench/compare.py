"""Compiler tradeoffs: build time against training speed for every compiler and -O level, in the fused
and the straight-line scalar mode, with pure-Python micrograd, NumPy and PyTorch for scale.

    python -m bench.compare [--n-train 5000] [--repeats 3] [--timeout 180] [--out results/] [--quick]

Writes the table to stdout and to OUT/compare.md (with the command, date and machine), the raw
numbers to OUT/compare.csv and, when matplotlib is installed, the plot to OUT/compare.png.
"""
import argparse
import datetime
import sys
from pathlib import Path

from mnist.data import load_mnist

from .libtcc_row import LIBTCC, measure_libtcc
from .measure import (INTERPRETED, NUMPY, TORCH, Column, add_arguments, columns, compiled, machine_description,
                      markdown_table, measure_all, speedup_column, table_notes, with_dtype, write_csv)

OPTIMISING = ('gcc', 'clang', 'zig')  # zig: `zig cc` from the ziglang wheel (pip install '.[zig]')
BUILDS = [('tcc', 0, False),
          *[(cc, opt, False) for cc in OPTIMISING for opt in range(4)],
          *[(cc, opt, True) for cc in OPTIMISING for opt in (2, 3)]]
CONFIGS = [INTERPRETED,
           *[compiled(cc, opt, native, fuse) for fuse in (True, False) for cc, opt, native in BUILDS],
           NUMPY, TORCH]
QUICK = {'configs': ['gcc-O0', 'gcc-O2', 'numpy'], 'n_train': 300, 'repeats': 1}


def _compiled_and_timed(rows):
    """The rows with both a compile time and a training time: the points of the plot."""
    return [r for r in rows if r.status == 'ok' and r.compile_s is not None and r.s_per_epoch is not None]


def pareto_front(rows):
    """The measured rows that no other row beats on both compile time and s/epoch (at least as good on
    both and better on one), in order of compile time."""
    points = _compiled_and_timed(rows)

    def beaten(row):
        return any(o.compile_s <= row.compile_s and o.s_per_epoch <= row.s_per_epoch
                   and (o.compile_s < row.compile_s or o.s_per_epoch < row.s_per_epoch) for o in points)

    return sorted((r for r in points if not beaten(r)), key=lambda r: r.compile_s)


def plot(rows, path) -> bool:
    """compile s (x) against s/epoch (y), both log, the Pareto front joined; False without matplotlib."""
    try:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state
    except ImportError:
        print(f'{path} not written: it needs matplotlib (`pip install matplotlib`, or `make` installs the '
              'plot extra into .venv)', file=sys.stderr)
        return False
    points, front = _compiled_and_timed(rows), pareto_front(rows)
    figure = Figure(figsize=(11, 7), layout='constrained')
    axes = figure.subplots()
    for mode, colour in (('fused', 'tab:blue'), ('scalar', 'tab:orange')):
        ours = [r for r in points if r.config.mode == mode]
        if ours:
            axes.scatter([r.compile_s for r in ours], [r.s_per_epoch for r in ours], color=colour,
                         label=mode)
    axes.plot([r.compile_s for r in front], [r.s_per_epoch for r in front], 'k--o', fillstyle='none',
              markersize=11, label='Pareto front')
    # Neighbours in s/epoch get their labels above and below alternately: fewer collide.
    for i, row in enumerate(sorted(points, key=lambda r: r.s_per_epoch)):
        axes.annotate(row.config.label, (row.compile_s, row.s_per_epoch), xytext=(5, 3 if i % 2 else -9),
                      textcoords='offset points', fontsize=7)
    # Configurations without a compile step, as horizontal lines for scale, unless they would squash
    # the plot (pure Python is four orders of magnitude slower): those are named in a corner.
    ceiling = 10 * max((r.s_per_epoch for r in points), default=float('inf'))
    off_chart = []
    for row in rows:
        if row.status != 'ok' or row.compile_s is not None:
            continue
        if row.s_per_epoch > ceiling:
            off_chart.append(f'{row.config.label}: {row.s_per_epoch:,.0f} s/epoch')
            continue
        axes.axhline(row.s_per_epoch, color='grey', linestyle=':', linewidth=1)
        axes.annotate(row.config.label, (0, row.s_per_epoch), xycoords=('axes fraction', 'data'),
                      xytext=(4, 3), textcoords='offset points', fontsize=8, color='grey')
    if off_chart:
        axes.annotate('off the chart: ' + ', '.join(off_chart), (1, 1), xycoords='axes fraction',
                      xytext=(-4, -12), textcoords='offset points', ha='right', fontsize=8, color='grey')
    axes.set(xscale='log', yscale='log', xlabel='compile time (s)', ylabel='training time (s/epoch, 60,000 images)',
             title='micrograd-c MNIST: compile time against training speed')
    axes.grid(True, which='both', alpha=0.3)
    axes.legend()
    figure.savefig(path, dpi=120)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, n_train=5_000, timeout=180, configs=CONFIGS + [LIBTCC])
    parser.add_argument('--out', type=Path, default=Path('results'), help='directory for the outputs')
    parser.add_argument('--quick', action='store_true',
                        help=f'a smoke test: {" ".join(QUICK["configs"])} on {QUICK["n_train"]} images, once')
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    data = load_mnist(args.data_dir)

    configs = with_dtype([c for c in CONFIGS if not args.configs or c.label in args.configs], args.dtype)
    want_libtcc = not args.configs or LIBTCC.label in args.configs
    args.configs = None  # chosen: with --dtype float32 the labels changed
    rows = measure_all(configs, data, args)
    if want_libtcc:  # in-memory JIT, after tcc (bench/libtcc_row.py)
        rows.insert(next((i + 1 for i, r in enumerate(rows) if r.config.label == 'tcc'), len(rows)),
                    measure_libtcc(data, args))
    on_front = {id(row) for row in pareto_front(rows)}
    table_columns = [*columns('config', 'mode', 'compiler', 'flags', 'status', 'codegen s', 'C lines', 'C bytes',
                              'compile s', 'compiler peak MB', 's/epoch', 'images timed'),
                     speedup_column(rows, INTERPRETED.label), *columns('test accuracy'),
                     Column('Pareto front', lambda r: 'yes' if id(r) in on_front else None)]
    table = markdown_table(rows, table_columns)
    notes = '\n\n'.join([*table_notes(args), 'Pareto front: no other configuration both compiles and trains '
                                                  'faster (plotted in compare.png).'])
    print(table + '\n\n' + notes)

    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, table_columns, args.out / 'compare.csv')
    figure = '\n\n![compile time against training speed](compare.png)' if plot(rows, args.out / 'compare.png') else ''
    command = ' '.join(['python -m bench.compare', *(argv if argv is not None else sys.argv[1:])])
    machine = '\n'.join(f'- {line}' for line in machine_description())
    (args.out / 'compare.md').write_text(
        f'## Compiler tradeoffs\n\n`{command}`, {datetime.date.today().isoformat()}\n\n{machine}\n\n'
        f'{table}\n\n{notes}{figure}\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
