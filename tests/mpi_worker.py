"""One rank of tests/test_mpi.py's runs (`mpiexec -n N python tests/mpi_worker.py ...`): trains a
small classifier with codegen.distributed.train and, on rank 0, checks the result; prints one JSON
line on rank 0 and exits 0 when every check passed, 1 when one failed.

    --optimizer sgd|adam   the compiled optimizer
    --epochs K, --batch B  K passes over 45 rows in global batches of B (shuffled by epoch)
    --kill-after E         rank 1 SIGKILLs itself after E epochs (the others are then in a step)
    --stop-after E         rank 1 SIGSTOPs itself after E epochs; the others wait --timeout s
    --timeout S            distributed.train's timeout
"""
import argparse
import json
import os
import signal
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import codegen  # noqa: E402
from codegen import distributed  # noqa: E402
from tests.test_batch import classifier, data  # noqa: E402

OPTIMIZERS = {"sgd": None, "adam": codegen.Adam()}
LR = {"sgd": 0.1, "adam": 0.01}
RTOL = 1e-9  # float64, the batched tests' fused bound (tests/test_batch.py)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--timeout", type=float)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()

    def compiled():
        """The classifier's module (from the second on, its build from the cache: each load its own state)."""
        model, xs, ys, logits, loss = classifier()
        return codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, optimizer=OPTIMIZERS[args.optimizer])

    # rank 0 builds first: the others then load its build from the cache instead of compiling too
    if rank == 0:
        distributed_net = compiled()
    comm.Barrier()
    if rank != 0:
        distributed_net = compiled()
    # each rank but 0 starts from other parameters: train() broadcasts rank 0's
    np.asarray(distributed_net.params)[:] += rank

    X, y = data()
    losses = []
    for epoch in range(args.epochs):
        if rank == 1 and epoch == args.kill_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 1 and epoch == args.stop_after:
            os.kill(os.getpid(), signal.SIGSTOP)
        losses.append(distributed.train(distributed_net, X, y, LR[args.optimizer], batch_size=args.batch,
                                        comm=comm, seed=epoch, timeout=args.timeout))

    params = comm.gather(np.asarray(distributed_net.params).copy(), root=0)
    state = comm.gather({k: np.asarray(v).copy() for k, v in distributed_net.optimizer_state.items()}, root=0)
    if rank != 0:
        return 0
    # one process, the same global batches: train() over the rows in the same visiting order
    single = compiled()
    single_losses = []
    for epoch in range(args.epochs):
        order = distributed.visiting_order(len(X), epoch)
        single_losses.append(single.train(X[order], y[order], LR[args.optimizer], batch_size=args.batch))
    expected = np.asarray(single.params)
    report = {
        "ranks": comm.Get_size(),
        "identical_params": all(np.array_equal(p, params[0]) for p in params),
        "identical_state": all(np.array_equal(s[k], state[0][k]) for s in state for k in s),
        "max_rel_error": float(np.abs(params[0] - expected).max() / np.abs(expected).max()),
        "loss_rel_error": max(abs(a - b) / abs(b) for a, b in zip(losses, single_losses)),
        "moved": float(np.abs(params[0] - np.asarray(compiled().params)).max()),
    }
    print(json.dumps(report), flush=True)
    ok = (report["identical_params"] and report["identical_state"] and report["max_rel_error"] <= RTOL
          and report["loss_rel_error"] <= RTOL and report["moved"] > 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
