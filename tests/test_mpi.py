"""Data-parallel training over MPI (codegen/distributed.py), run for real: `mpiexec -n 2` and `-n 3`
(uneven shards: 45 rows, batches of 7 or 8) on localhost, each rank tests/mpi_worker.py. After
three shuffled epochs the parameters equal one process's train() over the same global batches to
the fused bound, for SGD and Adam; every rank's parameters and optimizer state are the same bits.
A rank killed mid-run ends the run with an error, and a rank that stops answering makes the
others abort within their timeout; neither hangs. One process (COMM_SELF) gives train()'s bits,
and the module's gradients() and step() keep the step-by-step API's meaning."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import codegen
from codegen import distributed
from conftest import requires
from tests.test_batch import classifier, data
from tests.test_train import mnist_dir  # noqa: F401 (a fixture)

WORKER = Path(__file__).with_name("mpi_worker.py")
REPO = WORKER.parents[1]
BOUND_SECONDS = 30  # a failed run must end within this (it ends in ~3 s)


def run_ranks(ranks, *args, timeout=120, program=(str(WORKER),)):
    """`mpiexec -n ranks python tests/mpi_worker.py args` (or python `program` args): (exit status,
    stdout, stderr, seconds)."""
    mpiexec = requires("mpiexec")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MICROGRAD_C_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, *program, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


# SGD over 2 ranks and Adam over 3 (uneven shares of the batch); the other two in the slow set
@pytest.mark.parametrize("optimizer, ranks, batch", [
    pytest.param(optimizer, ranks, batch, id=f"{optimizer}-{ranks}-{batch}", marks=[pytest.mark.slow] * (slow))
    for optimizer, (ranks, batch), slow in [("sgd", (2, 8), False), ("adam", (3, 7), False), ("sgd", (3, 7), True),
                                            ("adam", (2, 8), True)]])
def test_ranks_train_as_one_process(ranks, batch, optimizer):
    status, out, err, _ = run_ranks(ranks, "--optimizer", optimizer, "--batch", batch)
    assert status == 0, out + err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["ranks"] == ranks
    assert report["identical_params"] and report["identical_state"], report
    assert report["max_rel_error"] <= 1e-9 and report["loss_rel_error"] <= 1e-9, report
    assert report["moved"] > 0.01, report  # the parameters trained


def test_a_killed_rank_ends_the_run():
    status, out, err, seconds = run_ranks(2, "--kill-after", 1, timeout=BOUND_SECONDS)
    assert status != 0
    assert "BAD TERMINATION" in out + err and "Killed" in out + err, out + err
    assert seconds < BOUND_SECONDS


def test_a_stopped_rank_times_the_others_out():
    """Rank 1 stops (SIGSTOP: alive, silent): rank 0 gives up after timeout=2 s, says so, and its
    MPI_Abort ends the whole run, the stopped rank included."""
    status, out, err, seconds = run_ranks(2, "--stop-after", 1, "--timeout", 2, timeout=BOUND_SECONDS)
    assert status == distributed.RANK_TIMEOUT_EXIT, out + err
    assert "rank 0 of 2" in err and "did not arrive from the other ranks within 2 s" in err, err
    assert seconds < BOUND_SECONDS


@pytest.mark.parametrize("capacity", [128, 1], ids=["batched", "sample-by-sample"])
def test_one_process_gives_train_bits(capacity):
    """With one rank, distributed.train is train(): gradients() then step() per batch take the same
    arithmetic as train()'s batches (the batched program, or sample by sample)."""
    requires("mpiexec")
    from mpi4py import MPI
    model, xs, ys, logits, loss = classifier()
    nets = [codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, batch=capacity,
                            optimizer=codegen.Adam()) for _ in range(2)]  # one build, two loads (two states)
    X, y = data()
    for epoch in range(2):
        order = distributed.visiting_order(len(X), epoch)
        nets[0].train(X[order], y[order], 0.01, batch_size=8)
        distributed.train(nets[1], X, y, 0.01, batch_size=8, comm=MPI.COMM_SELF, seed=epoch)
    assert np.array_equal(np.asarray(nets[0].params), np.asarray(nets[1].params))


def test_gradients_add_to_backward_and_step_takes_their_mean(compiler):
    """gradients() adds to what backward() accumulated, as backward() would; step(lr, n) is update()
    on the gradients divided by n, after which they are 0. Every compiler (the C of both)."""
    model, xs, ys, logits, loss = classifier()
    net, reference = (codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler)
                      for _ in range(2))  # one build, two loads (two states)
    X, y = data(n=6)
    one_hot = np.eye(4)[y]
    for module in (net, reference):
        module.zero_grad()
        module.set_input(np.concatenate([X[0], one_hot[0]]))
        module.forward()
        module.backward()
    loss_sum = net.gradients(X[1:], y[1:])
    expected_loss = 0.0
    for row in range(1, 6):
        reference.set_input(np.concatenate([X[row], one_hot[row]]))
        expected_loss += reference.forward()
        reference.backward()
    assert loss_sum == pytest.approx(expected_loss, rel=1e-12)
    grad, expected = np.asarray(net.grad)[:net.n_params].copy(), np.asarray(reference.grad)[:net.n_params]
    np.testing.assert_allclose(grad, expected, rtol=1e-9, atol=1e-12)
    params = np.asarray(net.params).copy()
    net.step(0.5, 6)
    np.testing.assert_allclose(np.asarray(net.params), params - 0.5 * grad / 6, rtol=1e-12, atol=1e-15)
    assert not np.asarray(net.grad)[:net.n_params].any()


def test_step_refuses_a_bad_count():
    model, xs, ys, logits, loss = classifier()
    net = codegen.compile(loss, xs + ys, model.parameters(), outputs=logits)
    with pytest.raises(ValueError, match="n"):
        net.step(0.1, 0)


def test_mnist_trains_distributed_and_rank_0_alone_speaks_and_saves(mnist_dir, tmp_path):
    """`mpiexec -n 2 python -m mnist.train --distributed`: one summary, one epoch line, one file
    saved (and no temporary one left), the same test accuracy as one process on the same batches."""
    options = ["--data-dir", mnist_dir, "--limit", 600, "--batch-size", 20, "--no-download"]
    status, out, err, _ = run_ranks(2, "--distributed", "--save", tmp_path / "p.npz", *options,
                                    program=("-m", "mnist.train"))
    assert status == 0, out + err
    assert out.count("\nsummary\n") == 1 and out.count("epoch 1/1:") == 1, out
    assert "processes      2 (MPI)" in out
    assert [p.name for p in tmp_path.iterdir()] == ["p.npz"]
    single = subprocess.run([sys.executable, "-m", "mnist.train", *map(str, options)], capture_output=True,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    accuracy = [line for line in out.splitlines() if "test accuracy" in line and "epoch" in line]
    assert accuracy[0].split("test accuracy")[1].split(",")[0] in single.stdout, (out, single.stdout)
