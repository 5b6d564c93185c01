"""NumPy's BLAS GEMM on this machine (sgemm, dgemm: G multiply-adds a second, best of 7), on one
thread and on every core: `make roofline`'s check of the multiply-add peak that
bench/c/bandwidth.c measures (a tuned BLAS reaches 85-95% of it on a big product). Each thread
count runs in its own process, the BLAS's threads set before NumPy loads it. Timed by the
process's CPU time over its threads (as bandwidth.c times its threads: on a shared machine, the
rate of the cycles it got; the BLAS's threads spin while they wait, so waiting counts too).

    python -m bench.blas [--size N]
"""
import argparse
import os
import subprocess
import sys
import time

THREAD_VARIABLES = ('OPENBLAS_NUM_THREADS', 'OMP_NUM_THREADS', 'MKL_NUM_THREADS')
REPEATS = 7


def rate(dtype, n, threads):
    """G multiply-adds a second of an n x n by n x n product on `threads` threads, the best of REPEATS."""
    import numpy as np
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    a @ b  # the BLAS's threads started, its buffers allocated
    best = float('inf')
    for _ in range(REPEATS):
        started = time.process_time()
        a @ b
        best = min(best, (time.process_time() - started) / threads)
    return n ** 3 / best / 1e9


def worker(n, threads):
    print(' '.join(f'{rate(dtype, n, threads):.1f}' for dtype in ('float64', 'float32')))


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.blas', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--size', type=int, default=1536, help='the square matrices\' side (default 1536)')
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.size, int(os.environ['OPENBLAS_NUM_THREADS']))
        return 0
    import numpy as np
    blas = np.show_config(mode='dicts').get('Build Dependencies', {}).get('blas', {})
    cores = len(os.sched_getaffinity(0))
    print(f"NumPy's BLAS ({blas.get('name', '?')} {blas.get('version', '')}), {args.size} x {args.size} products, "
          f'best of {REPEATS}:')
    for threads in sorted({1, cores}):
        env = dict(os.environ, **{name: str(threads) for name in THREAD_VARIABLES})
        done = subprocess.run([sys.executable, '-m', 'bench.blas', '--worker', '--size', str(args.size)],
                              env=env, capture_output=True, text=True, check=True)
        f64, f32 = done.stdout.split()
        print(f'multiply-adds  float64: {f64} G/s, float32: {f32} G/s on {threads} thread(s) (dgemm, sgemm)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
