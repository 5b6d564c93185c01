"""Threads: train() and predict() release the GIL, a module's lock serialises the threads that
share it (no torn state), Ctrl-C stops a long train() and keeps the steps done."""
import os
import random
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import codegen
from conftest import requires
from micrograd_c import MLP, Value, cross_entropy

N_IN, HIDDEN, N_CLASSES = 16, 32, 4


def compile_classifier(compiler=None, seed=0):
    random.seed(seed)
    model = MLP(N_IN, [HIDDEN, N_CLASSES])
    xs = [Value(0.0) for _ in range(N_IN)]
    ys = [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(xs)
    return codegen.compile(cross_entropy(logits, ys), xs + ys, model.parameters(), outputs=logits,
                           compiler=compiler)


def data(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, N_IN), dtype=np.uint8), rng.integers(0, N_CLASSES, size=n)


def train(net, X, Y, seed=-1):
    return net.train(X, Y, 0.01, scale=1 / 255, batch_size=1, seed=seed)


def in_threads(*calls):
    """Runs the calls in threads started together; their results in order."""
    results, barrier = [None] * len(calls), threading.Barrier(len(calls))

    def run(i):
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.fixture(scope="module")
def net():
    return compile_classifier()


def test_two_threads_on_one_module_equal_the_two_calls_in_sequence(net):
    (XA, YA), (XB, YB) = data(20_000, 1), data(20_000, 2)
    start = bytes(net.params)
    orders = {}
    for order, calls in (("AB", ((XA, YA), (XB, YB))), ("BA", ((XB, YB), (XA, YA)))):
        net.set_params(memoryview(start).cast("d"))
        losses = {name: train(net, *xy) for name, xy in zip(order, calls)}
        orders[order] = (bytes(net.params), losses["A"], losses["B"])
    assert orders["AB"][0] != orders["BA"][0]  # the order shows
    for _ in range(3):
        net.set_params(memoryview(start).cast("d"))
        loss_a, loss_b = in_threads(lambda: train(net, XA, YA, seed=-1), lambda: train(net, XB, YB, seed=-1))
        assert (bytes(net.params), loss_a, loss_b) in orders.values()


def test_predict_while_another_thread_trains_sees_whole_state(net):
    """train() rewrites the inputs every row; predict() on the same module must never see them
    half-written (with lr 0 the parameters stay, so every prediction is the same)."""
    X, Y = data(20_000, 3)
    probe = data(50, 4)[0]
    expected = np.asarray(net.predict(probe, scale=1 / 255)).copy()
    stop = threading.Event()

    def keep_training():
        while not stop.is_set():
            net.train(X, Y, 0.0, scale=1 / 255)

    trainer = threading.Thread(target=keep_training)
    trainer.start()
    try:
        deadline = time.perf_counter() + 0.5
        checks = 0
        while time.perf_counter() < deadline or checks < 20:
            assert np.array_equal(np.asarray(net.predict(probe, scale=1 / 255)), expected)
            net.set_input(np.zeros(N_IN + N_CLASSES))
            assert np.isfinite(net.forward())
            checks += 1
    finally:
        stop.set()
        trainer.join()


def test_train_releases_the_gil(net):
    """Another Python thread runs while train() does: a ticker's ticks fall inside the call."""
    X, Y = data(1_000_000, 5)
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        for _ in range(5):  # long enough that its middle is well clear of the call's edges
            started = time.perf_counter()
            train(net, X, Y)
            ended = time.perf_counter()
            if ended - started > 0.1:
                break
    finally:
        stop.set()
        thread.join()
    assert ended - started > 0.1
    assert sum(started + 0.02 < t < ended - 0.02 for t in ticks) >= 3


def test_two_modules_in_two_threads_equal_each_alone():
    first, second = compile_classifier(), compile_classifier()
    start = bytes(first.params)
    (XA, YA), (XB, YB) = data(20_000, 6), data(20_000, 7)
    alone = []
    for X, Y in ((XA, YA), (XB, YB)):
        first.set_params(memoryview(start).cast("d"))
        alone.append((train(first, X, Y, seed=3), bytes(first.params)))
    first.set_params(memoryview(start).cast("d"))
    losses = in_threads(lambda: train(first, XA, YA, seed=3), lambda: train(second, XB, YB, seed=3))
    assert [(losses[0], bytes(first.params)), (losses[1], bytes(second.params))] == alone


def timed_train(net, X, Y):
    started = time.perf_counter()
    train(net, X, Y)
    return started, time.perf_counter()


def overlap(intervals):
    """The fraction of the shorter interval during which both ran."""
    (a0, a1), (b0, b1) = intervals
    return max(0.0, min(a1, b1) - max(a0, b0)) / min(a1 - a0, b1 - b0)


def test_two_modules_train_at_the_same_time():
    """Holding the GIL, the second train() could only start when the first ended (overlap 0);
    released, they run side by side, whatever the machine's load."""
    first, second = compile_classifier(), compile_classifier()
    X, Y = data(500_000, 10)
    intervals = in_threads(lambda: timed_train(first, X, Y), lambda: timed_train(second, X, Y))
    assert overlap(intervals) > 0.5


def test_a_signal_handler_using_the_training_module_gets_an_error_not_a_deadlock(net):
    X, Y = data(300_000, 8)
    calls = []

    def handler(signum, frame):
        calls.append(signum)
        net.forward()  # the module is busy in this very thread

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.02)
        with pytest.raises(RuntimeError, match=r"forward\(\) called while this thread is already running"):
            train(net, X, Y)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert calls == [signal.SIGALRM]
    assert np.isfinite(net.forward())  # the lock was released


CTRL_C = textwrap.dedent("""
    import os, random, signal, sys, threading, time
    # A process started from a pytest worker inherits what the worker's earlier tests left: an
    # ignored or blocked SIGINT would make this test about them, not about train(). Say what was
    # inherited, then start as a shell's Python does (a CI run saw the signal never arrive, twice
    # in a row; its cause not found: no test was seen to change either)
    print("inherited:", signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []), file=sys.stderr)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy as np
    import codegen
    from micrograd_c import MLP, Value, cross_entropy
    random.seed(0)
    model = MLP(32, [128, 4])
    xs, ys = [Value(0.0) for _ in range(32)], [Value(0.0) for _ in range(4)]
    net = codegen.compile(cross_entropy(model(xs), ys), xs + ys, model.parameters(), compiler=sys.argv[1])
    rng = np.random.default_rng(0)
    X, Y = rng.integers(0, 256, (1_000_000, 32), dtype=np.uint8), rng.integers(0, 4, 1_000_000)
    before = np.array(net.params)
    sent = []
    def interrupt():
        time.sleep(0.3)
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=interrupt).start()
    started = time.perf_counter()
    try:
        net.train(X, Y, 0.01, scale=1 / 255)
        print("finished", time.perf_counter() - started, "signal sent" if sent else "no signal sent")
    except KeyboardInterrupt:
        stopped = time.perf_counter()
        after = np.array(net.params)
        print("interrupted", stopped - sent[0], int((after != before).sum()), bool(np.isfinite(after).all()),
              net.forward() > 0)
""")


# the same template code for every compiler: tcc (fastest to build) by default, the others with -m slow
@pytest.mark.parametrize("compiler", ["tcc", pytest.param("gcc", marks=pytest.mark.slow),
                                      pytest.param("clang", marks=pytest.mark.slow)])
def test_ctrl_c_stops_a_long_train_within_a_second(compiler):
    requires(compiler)
    run = subprocess.run([sys.executable, "-c", CTRL_C, compiler], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(run.stdout.split()) == 5, (run.stdout, run.stderr)
    outcome, latency, changed, finite, usable = run.stdout.split()
    assert outcome == "interrupted"
    assert float(latency) < 1.0  # checked every 50 ms
    assert int(changed) > 0 and finite == "True" and usable == "True"  # the steps done are kept


def two_thread_ratio(repeats=5, rows=20_000):
    """Median over back-to-back pairs of (two modules trained in two threads) / (one alone):
    about 1 when they run in parallel on two free cores, 2 or more when they take turns. The
    model is MNIST-sized: with a tiny one, the argument checks that run with the GIL held (a
    pass over every label) would weigh as much as the training and serialise the threads."""
    def mnist_sized():
        random.seed(0)
        model, xs = MLP(784, [50, 10]), [Value(0.0) for _ in range(794)]
        logits = model(xs[:784])
        return codegen.compile(cross_entropy(logits, xs[784:]), xs, model.parameters(), logits, compiler=None)
    first, second = mnist_sized(), mnist_sized()
    rng = np.random.default_rng(9)
    X, Y = rng.integers(0, 256, size=(rows, 784), dtype=np.uint8), rng.integers(0, 10, size=rows)
    ratios = []
    for _ in range(repeats):
        started = time.perf_counter()
        train(first, X, Y)
        alone = time.perf_counter() - started
        started = time.perf_counter()
        in_threads(lambda: train(first, X, Y), lambda: train(second, X, Y))
        ratios.append((time.perf_counter() - started) / alone)
    return statistics.median(ratios)


@pytest.mark.slow
def test_two_modules_train_in_parallel():
    ratio = two_thread_ratio()
    print(f"two modules in two threads: {ratio:.2f}x the time of one ({os.cpu_count()} CPUs)")
    if (os.cpu_count() or 1) >= 2:
        assert ratio < 1.75  # taking turns: 2 or more (2.57 measured with the GIL held)


def test_readme_threads_example_runs():
    import pathlib
    import re
    readme = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "robustness.md").read_text()
    code = re.search(r"# Robustness: threads, cache, fuzzing\n.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace = {}
    exec(code, namespace)
    first, second = namespace["nets"]
    assert bytes(first.params) == bytes(second.params) != bytes(np.zeros(first.n_params))
