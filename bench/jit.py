"""`make bench-jit`: one million evaluations of the value and gradient of f(a, b, c) =
-a + b * (c - a / b), with codegen.jit (batched and per call), the interpreter, and, where
installed, symengine.Lambdify(backend="llvm") and JAX jit(vmap(value_and_grad)).

    python -m bench.jit [--n 1000000] [--repeats 5] [--compiler gcc]

Slow methods are timed on fewer evaluations and extrapolated. The targets (batched >= 100x faster
than per call, and faster than both peers) are checked on back-to-back pairs of runs (median of
their ratios), since the machine may be shared and noisy.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from codegen.backend import libtcc
from codegen.jit import jit
from micrograd_c import Value


def f(a, b, c):
    return -a + b * (c - a / b)


def inputs(n, seed=0):
    """(n, 3) rows with b kept away from 0."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, 3))
    X[:, 1] = np.sign(X[:, 1]) * (0.5 + np.abs(X[:, 1]))
    return X


def timed(run, repeats):
    """(median seconds, last result) over repeats runs."""
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


class Method:
    """One row: build() once (timed), then run() evaluates `evaluations` rows of X."""

    def __init__(self, name, evaluations=None):
        self.name, self.evaluations = name, evaluations


def interpreted(X):
    def run():
        values, grads = np.empty(len(X)), np.empty_like(X)
        for i, (a, b, c) in enumerate(X.tolist()):
            args = [Value(a), Value(b), Value(c)]
            out = f(*args)
            out.backward()
            values[i], grads[i] = out.data, [v.grad for v in args]
        return values, grads
    return run


def per_call(g, X):
    def run():
        values, grads = np.empty(len(X)), np.empty_like(X)
        for i, (a, b, c) in enumerate(X.tolist()):
            values[i], grads[i] = g(a, b, c, grad=True)
        return values, grads
    return run


def symengine_method():
    import symengine  # an optional peer: its row appears when installed
    a, b, c = symengine.symbols("a b c")
    expr = f(a, b, c)
    started = time.perf_counter()
    function = symengine.Lambdify([a, b, c], [expr, expr.diff(a), expr.diff(b), expr.diff(c)], backend="llvm",
                                  cse=True)
    build = time.perf_counter() - started

    def make(X):
        def run():
            out = function(X)
            return out[:, 0], out[:, 1:]
        return run
    return build, make, f"symengine {symengine.__version__} Lambdify(backend='llvm', cse=True)"


def jax_method():
    import jax  # an optional peer, large: its row appears when installed
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    gradient = jax.jit(jax.vmap(jax.value_and_grad(f, argnums=(0, 1, 2))))

    def make(X):
        columns = [jnp.asarray(X[:, i]) for i in range(3)]

        def run():
            value, grads = gradient(*columns)
            value.block_until_ready()
            return np.asarray(value), np.stack([np.asarray(g) for g in grads], axis=1)
        return run
    started = time.perf_counter()
    make(inputs(8))()  # traces and compiles (for this shape: the timed shape compiles below)
    build = time.perf_counter() - started
    return build, make, f"JAX {jax.__version__} jit(vmap(value_and_grad)), float64, CPU"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1_000_000, help="evaluations (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=21,
                        help="runs of each batched method, and pairs of runs for the targets (default 21)")
    parser.add_argument("--compiler", default=None, help="jit's compiler (default: $CC, else the first found of gcc, clang, zig, tcc)")
    parser.add_argument("--interpreted", type=int, default=3_000, help="evaluations timed for the interpreter")
    parser.add_argument("--per-call", type=int, default=100_000, help="evaluations timed per call")
    args = parser.parse_args(argv)
    X = inputs(args.n)
    # an empty build cache, so that "build s" is a real compile (Python.h for libtcc is ready:
    # that is once per machine)
    libtcc.python_header()
    cache = tempfile.TemporaryDirectory(prefix="micrograd_c_jit_bench_")
    os.environ["MICROGRAD_C_CACHE"] = cache.name

    rows = []  # (method, build s, s per n evaluations, evaluations timed, max |difference| from batched)

    def measure(name, run, evaluations, build=None, reference=None):
        seconds, (values, grads) = timed(run, args.repeats if evaluations >= args.n else 3)
        difference = None
        if reference is not None:
            k = len(values)
            difference = max(np.max(np.abs(values - reference[0][:k])), np.max(np.abs(grads - reference[1][:k])))
        rows.append((name, build, seconds * args.n / evaluations, evaluations, difference))
        return values, grads

    started = time.perf_counter()
    g = jit(compiler=args.compiler)(f)
    g(1.0, 2.0, 3.0)
    build = time.perf_counter() - started
    out = (np.empty(args.n), np.empty((args.n, 3)))
    reference = measure("codegen.jit, batched: f(X, grad=True)", lambda: g(X, grad=True), args.n, build)
    measure("codegen.jit, batched into arrays: f(X, grad=True, out=...)", lambda: g(X, grad=True, out=out),
            args.n, build, reference)
    started = time.perf_counter()
    in_memory = jit(compiler="libtcc")(f)
    in_memory(1.0, 2.0, 3.0)
    measure("codegen.jit(compiler='libtcc'), batched", lambda: in_memory(X, grad=True), args.n,
            time.perf_counter() - started, reference)
    measure("codegen.jit, per call: f(a, b, c, grad=True)", per_call(g, X[:args.per_call]), args.per_call,
            build, reference)
    measure("interpreted micrograd_c (Value, backward())", interpreted(X[:args.interpreted]), args.interpreted,
            None, reference)
    peers = {}
    for label, method in (("symengine", symengine_method), ("jax", jax_method)):
        try:
            build, make, name = method()
        except ImportError as error:
            rows.append((f"{label}: not installed ({error.name}; pip install {label})", None, None, None, None))
            continue
        run = make(X)
        run()  # warm-up (JAX compiles for this shape)
        measure(name, run, args.n, build, reference)
        peers[label] = run

    print(f"one evaluation = the value and the 3 partial derivatives of f(a, b, c) = -a + b * (c - a / b); "
          f"seconds for {args.n:,} evaluations (median of {args.repeats} runs, 3 for per call, 1 for the "
          f"interpreter, whose fewer evaluations are extrapolated)\n")
    batched = rows[0][2]
    interpreted_s = next(r[2] for r in rows if r[0].startswith("interpreted"))
    print("| method | build s | s / 1e6 evals | ns / eval | evaluations timed | speedup vs interpreted | "
          "time / jit batched | max abs diff vs jit batched |")
    print("|---|---|---|---|---|---|---|---|")
    for name, build, seconds, evaluations, difference in rows:
        if seconds is None:
            print(f"| {name} | - | - | - | - | - | - | - |")
            continue
        per_million = seconds * 1e6 / args.n
        print(f"| {name} | {'-' if build is None else f'{build:.3g}'} | {per_million:.3g} | "
              f"{seconds / args.n * 1e9:,.3g} | {evaluations:,} | {interpreted_s / seconds:,.0f}x | "
              f"{seconds / batched:,.3g}x | {'-' if difference is None else f'{difference:.2g}'} |")

    # targets, on back-to-back pairs, taken in alternating order: (median of the pairs' ratios,
    # ratio of the best times)
    def paired(ours, theirs, ours_n, theirs_n):
        ratios, best_ours, best_theirs = [], [], []
        for i in range(args.repeats):
            if i % 2:
                b, _ = timed(theirs, 1)
                a, _ = timed(ours, 1)
            else:
                a, _ = timed(ours, 1)
                b, _ = timed(theirs, 1)
            ratios.append((b / theirs_n) / (a / ours_n))
            best_ours.append(a / ours_n)
            best_theirs.append(b / theirs_n)
        return statistics.median(ratios), min(best_theirs) / min(best_ours)

    batched_run = lambda: g(X, grad=True)  # noqa: E731
    print(f"\ntargets, from {args.repeats} back-to-back pairs of runs (the median of their ratios; the ratio of "
          f"the best times):")
    ratio, best = paired(batched_run, per_call(g, X[:args.per_call // 10]), args.n, args.per_call // 10)
    print(f"- batched >= 100x faster than per call: {ratio:,.0f}x; {best:,.0f}x -> {'met' if ratio >= 100 else 'NOT met'}")
    for label, run in peers.items():
        ratio, best = paired(batched_run, run, args.n, args.n)
        print(f"- batched faster than {label}: {ratio:.2f}x; {best:.2f}x -> {'met' if ratio > 1 else 'NOT met'}")
    # the same on 10,000 rows a hundred times over: the data stays in the cache, so the
    # computation counts rather than the memory's bandwidth
    small = X[:10_000]
    small_peers = {"symengine": symengine_method, "jax": jax_method}
    for label in peers:
        run = small_peers[label]()[1](small)
        run()
        ratio, best = paired(lambda: [g(small, grad=True) for _ in range(100)], lambda: [run() for _ in range(100)],
                             1, 1)
        print(f"  {label}, 10,000 rows 100 times over, in the cache: {ratio:.2f}x; {best:.2f}x")
    for label in ("symengine", "jax"):
        if label not in peers:
            print(f"- batched faster than {label}: not measured ({label} not installed)")
    cache.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
