"""Synchronous data-parallel training over MPI: one compiled module per process, the same parameters
in each, every batch's gradient summed across the processes before one optimizer step.

    from mpi4py import MPI
    from codegen import distributed
    loss = distributed.train(net, X, y, lr, batch_size=128, comm=MPI.COMM_WORLD, seed=epoch)

run as `mpiexec -n 4 python script.py` (or `mpiexec -f hosts -n 16 ...` over machines). Every rank
passes the same X and y (or arrays of the same rows, e.g. each loads the same files).

A step: rank r of n takes the rows r, r + n, r + 2n, ... of the global batch (in the visiting
order), runs them forward and backward with the module's gradients() (the batched program when the
model has one), one Allreduce sums the parameter gradients in place in the module's gradient
buffer (the `grad` view's memory: no copy; mpi4py releases the GIL while it waits), and every rank
takes the same optimizer step, step(lr, batch rows), on the global batch's mean gradient. The
parameters and the optimizer state therefore stay the same on every rank, bit for bit: each rank
steps from the same bits with the same reduced gradient (MPI's reductions give every rank the same
sum: tests/test_mpi.py checks it).

The numbers are one process's train() on the same batches, to the rounding of summing the rows'
gradients in another order (float64: 1e-9 relative; with one rank: the same bits).

A rank that dies ends the run: mpiexec kills the others and says which died. A rank that hangs
(a stopped process, a lost machine the launcher does not notice) would keep the others waiting
in the Allreduce for ever; timeout=seconds bounds that wait: the waiting ranks print the rank and
the step, and MPI_Abort the whole run.
"""

import sys
import time

import numpy as np

__all__ = ["train", "visiting_order", "broadcast_state", "RANK_TIMEOUT_EXIT"]

# The exit status a rank gives MPI_Abort when the others did not answer within `timeout`
RANK_TIMEOUT_EXIT = 75
# How long a rank waits between printing why it aborts and MPI_Abort: the launcher forwards a rank's
# stderr by polling its pipe, and an abort that reaches it first can end the run with the message
# unread (seen once in CI under load: the right exit status, an empty stderr)
ABORT_DRAIN_SECONDS = 0.5


def visiting_order(n, seed):
    """The order distributed.train visits n rows in: 0..n-1, or with seed >= 0 numpy's permutation
    under default_rng(seed) (every rank computes the same)."""
    return np.arange(n) if seed is None or seed < 0 else np.random.default_rng(seed).permutation(n)


def broadcast_state(net, comm, root=0, timeout=None):
    """The root's parameters and optimizer state into every rank's module, in place."""
    from mpi4py import MPI
    for view in (net.params, *net.optimizer_state.values()):
        _wait(comm, comm.Ibcast(np.asarray(view), root=root), timeout, "the parameters' broadcast", MPI)


def train(net, X, Y, lr, batch_size, comm, scale=1.0, seed=-1, threads=None, timeout=None, timings=None):
    """One pass over the rows of X, Y (as net.train takes them) in global batches of batch_size
    rows shared by comm's ranks; returns the mean loss over every row (the same on every rank).

    Every rank must call it with the same arguments. The parameters and optimizer state start
    from rank 0's (broadcast first), so ranks that initialised differently still train as one.
    seed >= 0 shuffles the rows (visiting_order). timeout: seconds a rank waits for the others'
    gradients before it aborts the run (None: no bound; a rank that dies ends the run anyway).
    timings: a dict to add the seconds of each part of the steps to: "gradients" (this rank's
    rows), "allreduce" (the sum, with the wait for the slowest rank), "step" (the optimizer).
    """
    from mpi4py import MPI  # here: importing codegen must not need mpi4py

    n_rows, rank, ranks = len(X), comm.Get_rank(), comm.Get_size()
    _check_same_everywhere(comm, (n_rows, net.n_params, batch_size), timeout, MPI)
    broadcast_state(net, comm, timeout=timeout)
    order = visiting_order(n_rows, seed)
    net.zero_grad()
    # the module's gradient memory, taken once: Allreduce sums into it in place (taking it writes
    # every gradient row out, and keeps zero_grad() and step() writing them out while it is held)
    grads = np.asarray(net.grad)[:net.n_params]
    loss_sum = np.zeros(1)
    try:
        for step, first in enumerate(range(0, n_rows, batch_size)):
            batch = order[first:first + batch_size]
            mine = batch[rank::ranks]  # rank r: the batch's rows r, r + n, ...
            started = time.perf_counter()
            if len(mine):
                loss_sum += net.gradients(X[mine], Y[mine], scale=scale, threads=threads)
            computed = time.perf_counter()
            _sum_in_place(comm, grads, timeout, f"the gradients of step {step}", MPI)
            reduced = time.perf_counter()
            net.step(lr, len(batch))
            if timings is not None:
                for part, seconds in (("gradients", computed - started), ("allreduce", reduced - computed),
                                      ("step", time.perf_counter() - reduced)):
                    timings[part] = timings.get(part, 0.0) + seconds
    finally:
        del grads
    _sum_in_place(comm, loss_sum, timeout, "the losses", MPI)
    return float(loss_sum[0]) / n_rows if n_rows else 0.0


def _check_same_everywhere(comm, facts, timeout, MPI):
    """Every rank must see the same rows, model and batch: else a rank would wait for a step the
    others never take. Raised on every rank alike (they all see the gathered facts)."""
    mine = np.array(facts, dtype=np.int64)
    seen = np.empty((comm.Get_size(), len(mine)), dtype=np.int64)
    _wait(comm, comm.Iallgather(mine, seen), timeout, "the ranks' shapes", MPI)
    if (seen != seen[0]).any():
        raise ValueError("distributed.train: the ranks disagree on (rows, parameters, batch_size): "
                         + ", ".join(f"rank {r}: {tuple(f)}" for r, f in enumerate(seen.tolist())))


def _sum_in_place(comm, buffer, timeout, what, MPI):
    """The buffer's sum over the ranks, into it on every rank."""
    if timeout is None:  # the blocking call: MPICH's fastest path
        comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
    else:
        _wait(comm, comm.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM), timeout, what, MPI)


def _wait(comm, request, timeout, what, MPI):
    """Waits for a non-blocking collective; with a timeout, polls it until the deadline (a blocking
    MPI call cannot be given one) and past it aborts the run with a message saying what was awaited."""
    if timeout is None:
        request.Wait()
        return
    deadline = time.monotonic() + timeout
    while not request.Test():
        if time.monotonic() > deadline:
            print(f"distributed.train: rank {comm.Get_rank()} of {comm.Get_size()}: {what} did not arrive from "
                  f"the other ranks within {timeout:g} s (a rank hangs, or is gone): aborting the run",
                  file=sys.stderr, flush=True)
            time.sleep(ABORT_DRAIN_SECONDS)
            comm.Abort(RANK_TIMEOUT_EXIT)
        time.sleep(0)  # lets another thread (and, oversubscribed, another rank) run
