"""Speed: our compiled module against pure-Python micrograd, NumPy, PyTorch and plain C, in one run,
and whether the project's speed and size targets are met.

    python -m bench --only mnist [--n-train 10000] [--repeats 3] [--timeout 300] [--configs LABEL ...] [--quick]
"""
import time

from codegen import CompilerNotFound
from codegen.write import dtypes
from mnist.data import load_mnist
from mnist.model import build_graph

from .measure import (INTERPRETED, NUMPY, SEED, TORCH, c_reference, columns, compiled,
                      machine_description, markdown_table, measure_all, paired_ratio, ratio_column,
                      speedup_column, table_notes, with_dtype)

# Ours first: the process's peak RSS, which only grows, is then ours before NumPy and PyTorch add theirs.
FUSED = [compiled('tcc'), compiled('gcc', 2), compiled('gcc', 3, native=True),
         compiled('clang', 2), compiled('clang', 3, native=True)]
SCALAR = [compiled('tcc', fuse=False), compiled('gcc', 1, fuse=False)]
# Sparse inputs (the pixels' zeros skipped) and float32, at the best flags: what each buys.
SPARSE = compiled('gcc', 3, native=True, sparse=True)
FLOAT32 = compiled('gcc', 3, native=True, dtype=dtypes.FLOAT32.name)
LEAN = [SPARSE, FLOAT32, compiled('gcc', 3, native=True, dtype=dtypes.FLOAT32.name, sparse=True)]
# The step-by-step API, one Python call per function per image, against train() on the same images
STEP = compiled('gcc', 3, native=True, step_api=True)
# Adam (lr 0.001), whose step moves every parameter every image, against SGD's
ADAM = compiled('gcc', 3, native=True, optimizer='adam')
# The plain-C reference built like our best rows, so that the ratio compares code, not flags; and
# its variant with the same sparsity trick, written by hand.
REFERENCES = {'gcc': c_reference('gcc'), 'clang': c_reference('clang')}
SPARSE_REFERENCE = c_reference('gcc', sparse=True)
# For scale, no target: the hand-written step with W1 stored pixel by pixel (input-major), what a
# layout other than the model's parameter order would buy (docs/speed.md, the roofline).
INPUT_MAJOR_REFERENCE = c_reference('gcc', input_major=True)
CONFIGS = [*FUSED, STEP, ADAM, *LEAN, *SCALAR, *REFERENCES.values(), SPARSE_REFERENCE, INPUT_MAJOR_REFERENCE, INTERPRETED,
           NUMPY, TORCH]
# The targets for them (ratios of times, measured in back-to-back pairs): against the dense
# C reference, the generated sparse code against the hand-written sparse C, the step-by-step API
# and Adam against train() with SGD (the same model, compiler and flags); limit None: for scale.
LEAN_TARGETS = [(SPARSE, REFERENCES['gcc'], 0.5), (FLOAT32, REFERENCES['gcc'], 0.35),
                (SPARSE, SPARSE_REFERENCE, 1.15), (STEP, FUSED[2], 1.3), (ADAM, FUSED[2], 1.5),
                (LEAN[2], REFERENCES['gcc'], None), (INPUT_MAJOR_REFERENCE, REFERENCES['gcc'], None)]
PAIRS = 7
QUICK = {'configs': ['tcc', 'gcc-O2', 'numpy'], 'n_train': 300, 'repeats': 1}


def graph_and_emit_seconds() -> float:
    """Building the model's Value graph and emitting its C: what `make` does before the compiler."""
    started = time.perf_counter()
    build_graph(SEED).generate()
    return time.perf_counter() - started


def target_lines(rows, emit_seconds, paired) -> list[str]:
    """One line per target: the goal, the measured numbers and whether they meet it."""
    ok = {row.config.label: row for row in rows if row.status == 'ok'}
    fused = [ok[c.label] for c in FUSED if c.label in ok]
    ours = [row for row in ok.values() if row.config.kind == 'compiled']

    def check(goal, needed, test):
        """test(*needed) -> (numbers, met); needed: the rows it looks at, all of which must have run."""
        if not needed or None in needed:
            return f'- {goal}: not measured'
        numbers, met = test(*needed)
        return f'- {goal}: {numbers} -> {"met" if met else "NOT MET"}'

    def near_reference(row, reference):
        ratio = paired.get(row.config.label)
        if ratio is None:
            return 'not measured in pairs', False
        return (f'{row.s_per_epoch:.3f} s/epoch, {ratio:.2f}x {reference.config.label} '
                f'(median of {PAIRS} back-to-back pairs of runs)', row.s_per_epoch <= 1.0 and ratio <= 1.15)

    def worst(rows, value, unit, limit):
        row = max(rows, key=value)
        return f'{value(row):,.2f} {unit} ({row.config.label})', value(row) <= limit

    lines = [check(f'{cc} -O3 -march=native <= 1.0 s/epoch and <= 1.15x the plain-C reference',
                   [ok.get(f'{cc}-O3-native'), ok.get(reference.label)], near_reference)
             for cc, reference in REFERENCES.items()]
    for config, reference, limit in LEAN_TARGETS:
        ratio = paired.get((config.label, reference.label))
        measured = 'not measured in pairs' if ratio is None else f'{ratio:.2f}x (median of {PAIRS} back-to-back pairs of runs)'
        if limit is None:  # for scale
            lines.append(f'- for scale, {config.label} / {reference.label}: {measured}')
        else:
            lines.append(f'- {config.label} <= {limit}x {reference.label}: {measured}'
                         + ('' if ratio is None else ' -> ' + ('met' if ratio <= limit else 'NOT MET')))
    lines += [
        check('codegen + compile <= 3 s (fused builds)', fused,
              lambda *rows: worst(rows, lambda r: r.codegen_s + r.compile_s, 's', 3.0)),
        check('TCC <= 4 s/epoch with compile <= 0.5 s', [ok.get('tcc')],
              lambda r: (f'{r.s_per_epoch:.2f} s/epoch, compile {r.compile_s:.3f} s',
                         r.s_per_epoch <= 4.0 and r.compile_s <= 0.5)),
        check('scalar mode compiles <= 60 s at -O0/-O1, TCC scalar <= 45 s/epoch',
              [ok.get('tcc-scalar'), ok.get('gcc-O1-scalar')],
              lambda tcc, gcc: (f'compile {tcc.compile_s:.1f} s (tcc), {gcc.compile_s:.1f} s (gcc -O1); '
                                f'tcc scalar {tcc.s_per_epoch:.1f} s/epoch',
                                max(tcc.compile_s, gcc.compile_s) <= 60 and tcc.s_per_epoch <= 45)),
        f'- building the graph + emitting C <= 2 s: {emit_seconds:.2f} s -> '
        + ('met' if emit_seconds <= 2 else 'NOT MET'),
        check('training process peak RSS <= 500 MB (this process, after our rows)', ours,
              lambda *rows: worst(rows, lambda r: r.process_peak_mb, 'MB', 500)),
        check('compiler peak RSS <= 1 GB', ours,
              lambda *rows: worst(rows, lambda r: r.compiler_peak_mb, 'MB', 1000)),
    ]
    return lines


def run(args) -> int:
    """The MNIST part of `make bench` (bench/cli.py parses args): prints the table, its notes and the
    targets."""
    if args.quick:
        vars(args).update(QUICK)
    if args.configs and not set(args.configs) & {c.label for c in CONFIGS}:
        print('MNIST: none of --configs is an MNIST configuration; skipped')
        return 0
    configs = with_dtype([c for c in CONFIGS if not args.configs or c.label in args.configs], args.dtype)
    args.configs = None  # chosen: with --dtype float32 the labels changed
    data = load_mnist(args.data_dir)

    emit_seconds = graph_and_emit_seconds()
    # The 1.15x target compares ours with the reference in alternating runs (the same machine load),
    # before anything else runs: once PyTorch is loaded, this process's later runs are slowed
    # unevenly (measured: ours/reference 1.00x before loading it, 1.12x after).
    chosen = {c.label for c in configs}
    paired = {}
    for cc, reference in REFERENCES.items():
        if {f'{cc}-O3-native', reference.label} <= chosen:
            try:
                paired[f'{cc}-O3-native'] = paired_ratio(compiled(cc, 3, native=True), reference, data,
                                                         args.n_train, PAIRS, args.lr)
            except CompilerNotFound:
                pass  # its rows say 'not installed'
    for config, reference, _ in LEAN_TARGETS:
        if {config.label, reference.label} <= chosen:
            paired[(config.label, reference.label)] = paired_ratio(config, reference, data, args.n_train, PAIRS,
                                                                   args.lr)
    rows = measure_all(configs, data, args)
    table_columns = [*columns('config', 'status', 's/epoch', 'codegen s', 'compile s', 'compiler peak MB',
                              'process peak MB', 'test accuracy'),
                     speedup_column(rows, INTERPRETED.label), ratio_column(rows, REFERENCES['gcc'].label),
                     ratio_column(rows, NUMPY.label), ratio_column(rows, TORCH.label)]
    print(markdown_table(rows, table_columns))
    print('\n' + '\n'.join(table_notes(args)))
    print('\nTargets:')
    print('\n'.join(target_lines(rows, emit_seconds, paired)))
    print('\n' + '\n'.join(machine_description()))
    return 0
