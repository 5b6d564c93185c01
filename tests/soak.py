"""`make soak`: long runs watching the process's memory.

- 10^6 training steps through train(), and 10^6 through the step-by-step API (set_input,
  zero_grad, forward, backward, update), on a small model: resident memory at start and end
  (after a warm-up); growth above 1 MB fails (exit status 1).
- 10,000 compile-load cycles of 10 small models in one process (all cache hits after the first
  of each): memory at start and end, and the cache holding 10 entries.
- The build cache filled past a small cap: its size after every build.
- Two modules trained in two threads against one alone (wall-time ratio, median of pairs).

    python tests/soak.py [--steps N] [--cycles N]
"""
import argparse
import gc
import os
import random
import sys
import tempfile
import time

import numpy as np

import codegen
from codegen.backend import cache, toolchain
from micrograd_c import MLP, Value, cross_entropy

N_IN, N_CLASSES = 6, 3
MAX_GROWTH_MB = 1.0


def rss_mb():
    """This process's resident memory now (not the peak), MB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError("no VmRSS in /proc/self/status")


def measured(label, run, limit_mb=None):
    gc.collect()
    start = rss_mb()
    started = time.perf_counter()
    run()
    seconds = time.perf_counter() - started
    gc.collect()
    end = rss_mb()
    verdict = "" if limit_mb is None else ("  ok" if end - start <= limit_mb else f"  FAILED (> {limit_mb} MB)")
    print(f"{label}: RSS {start:.2f} MB -> {end:.2f} MB, growth {end - start:+.3f} MB, {seconds:.1f} s{verdict}",
          flush=True)
    return limit_mb is None or end - start <= limit_mb


def classifier(hidden=8, compiler="gcc"):
    random.seed(0)
    model = MLP(N_IN, [hidden, N_CLASSES])
    xs, ys = [Value(0.0) for _ in range(N_IN)], [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(xs)
    return cross_entropy(logits, ys), xs + ys, model.parameters(), logits


def soak_steps(steps):
    loss, inputs, params, logits = classifier()
    net = codegen.compile(loss, inputs, params, outputs=logits, compiler="gcc")
    rng = np.random.default_rng(0)
    X, Y = rng.integers(0, 256, (1000, N_IN), dtype=np.uint8), rng.integers(0, N_CLASSES, 1000)
    net.train(X, Y, 0.01, scale=1 / 255)  # warm-up

    def through_train():
        for _ in range(steps // len(X)):
            net.train(X, Y, 0.01, scale=1 / 255, seed=1)

    rows = [np.concatenate([x / 255, np.eye(N_CLASSES)[y]]) for x, y in zip(X, Y)]
    set_input, zero_grad, forward, backward, update = net.set_input, net.zero_grad, net.forward, net.backward, net.update

    def step_by_step(n):
        for i in range(n):
            set_input(rows[i % 1000])
            zero_grad()
            forward()
            backward()
            update(0.01)

    step_by_step(10_000)  # warm-up
    ok = measured(f"{steps:,} steps through train()", through_train, MAX_GROWTH_MB)
    ok &= measured(f"{steps:,} steps through set_input/zero_grad/forward/backward/update",
                   lambda: step_by_step(steps), MAX_GROWTH_MB)
    assert np.isfinite(np.asarray(net.params)).all()
    return ok


def soak_compile_load(cycles, directory):
    graphs = [classifier(hidden) for hidden in range(2, 12)]  # 1 would make a Value, not a list
    for graph in graphs:  # the first of each builds; the rest are cache hits
        loss, inputs, params, logits = graph
        codegen.compile(loss, inputs, params, outputs=logits, compiler="tcc", cache=directory)
    hits = [0, 0]

    def cycle(n):
        for i in range(n):
            loss, inputs, params, logits = graphs[i % len(graphs)]
            net = codegen.compile(loss, inputs, params, outputs=logits, compiler="tcc", cache=directory)
            hits[net.build.cached] += 1
            net.forward()

    fds = len(os.listdir("/proc/self/fd"))
    half = cycles // 2  # the second half shows whether memory keeps growing or has levelled off
    measured(f"{half:,} compile-load cycles of {len(graphs)} models", lambda: cycle(half))
    measured(f"{cycles - half:,} more compile-load cycles", lambda: cycle(cycles - half))
    print(f"  cache hits {hits[True]:,} of {sum(hits):,}; {len(cache.entries(directory))} entries in the cache; "
          f"open file descriptors {fds} -> {len(os.listdir('/proc/self/fd'))}", flush=True)
    return hits[False] == 0


def fill_past_the_cap(directory, cap_mb=0.5, builds=40):
    os.environ["MICROGRAD_C_CACHE_MAX_MB"] = str(cap_mb)
    written, largest = 0, 0
    try:
        for i in range(builds):
            source = f"double value_{i}(void) {{ return {i}.0; }}\n" + f"/* {i} */\n" * 2000
            toolchain.build_library(source, "lib", "tcc", cache=directory)
            written += len(source)
            largest = max(largest, cache.total_size(directory))
    finally:
        del os.environ["MICROGRAD_C_CACHE_MAX_MB"]
    size = cache.total_size(directory)
    ok = largest <= cap_mb * 1e6
    print(f"cache cap {cap_mb} MB: {builds} builds, {written / 1e6:.2f} MB of C written (plus their .so); "
          f"largest size after a build {largest / 1e6:.3f} MB, now {size / 1e6:.3f} MB in "
          f"{len(cache.entries(directory))} entries: {'honoured' if ok else 'EXCEEDED'}", flush=True)
    return ok


def two_threads():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_threads import two_thread_ratio
    ratio = two_thread_ratio()
    print(f"two modules trained in two threads: {ratio:.2f}x the wall time of one alone (median of 5 "
          f"back-to-back pairs, 1,000,000 rows each; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f})", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10**6)
    parser.add_argument("--cycles", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="micrograd_c_soak_") as directory:
        os.environ["MICROGRAD_C_CACHE"] = directory  # not the user's cache
        ok = soak_steps(args.steps)
        ok &= soak_compile_load(args.cycles, os.path.join(directory, "cycles"))
        ok &= fill_past_the_cap(os.path.join(directory, "capped"))
        two_threads()
    print("soak: ok" if ok else "soak: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
