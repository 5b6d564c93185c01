"""The libtcc row of `make compare`: the MNIST module compiled in memory (codegen.compile(...,
compiler="libtcc"), no file, no process), its compile time and s/epoch beside the tcc process
build (the reference post's JIT against AOT). Measured like mnist.measure's compiled rows, but the
compiler runs inside this process, so it has no compiler peak memory of its own."""
import statistics
import sys
import time

import numpy as np

from codegen.backend import libtcc
from codegen.backend.toolchain import CompilerNotFound

from .measure import EPOCH_IMAGES, SEED, Config, Row, process_peak_rss
from mnist.model import PIXEL_SCALE, build_graph

LIBTCC = Config('libtcc', 'compiled', 'libtcc', 0)


def measure_libtcc(data, args) -> Row:
    """args: n_train, repeats and lr as mnist.measure.add_arguments defines them. The compile time
    is a module's: Python.h, preprocessed once per machine into the build cache, is ready before."""
    print(f'[+] {LIBTCC.label} ...', end=' ', file=sys.stderr, flush=True)
    row = Row(LIBTCC)
    train_X, train_Y, test_X, test_Y = data
    try:
        libtcc.python_header()
        graph = build_graph(SEED)
        net = graph.compile(compiler='libtcc')
        row.codegen_s, row.compile_s = net.timings['codegen'], net.build.seconds
        sources = graph.generate()
        row.c_lines, row.c_bytes = sum(s.count('\n') for s in sources), sum(len(s.encode()) for s in sources)
        initial = np.array([p.data for p in graph.model.parameters()], dtype=np.float64)
        X, Y = train_X[:args.n_train], train_Y[:args.n_train]
        seconds = []
        for _ in range(args.repeats):
            net.set_params(initial)
            started = time.perf_counter()
            net.train(X, Y, args.lr, scale=PIXEL_SCALE)
            seconds.append(time.perf_counter() - started)
        row.images_timed = len(X)
        row.s_per_epoch = statistics.median(seconds) * EPOCH_IMAGES / len(X)
        logits = np.asarray(net.predict(test_X, scale=PIXEL_SCALE))
        row.accuracy = float(np.mean(logits.argmax(axis=1) == test_Y))
    except CompilerNotFound:
        row.status = 'not installed'
    except Exception as error:  # one broken configuration must not lose the rest of the table
        lines = str(error).strip().splitlines() or [type(error).__name__]
        row.status = f'failed: {lines[0]}'
    row.process_peak_mb = process_peak_rss() / 1e6
    print(f'{row.s_per_epoch:.3g} s/epoch' if row.status == 'ok' else row.status, file=sys.stderr, flush=True)
    return row
