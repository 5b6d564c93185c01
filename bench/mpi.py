"""`make bench-mpi`: data-parallel training (codegen/distributed.py) on 1 and 2 ranks, one thread
each, MLP(784, [512, 256, 10]) float32 at a global batch of 128 on MNIST's training images:
images per second, their ratio, and each part's share of the step (this rank's gradients, the
Allreduce with its wait for the slower rank, the optimizer step). Each rank count is its own
`mpiexec -n k python -m bench.mpi --worker` run; the figures are rank 0's, the median of
--repeats passes over --images images after one warm-up pass.

    python -m bench.mpi [--ranks 1 2] [--images 7680] [--repeats 3] [--hidden 512 256]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from codegen import distributed
from mnist.data import load_mnist
from mnist.model import PIXEL_SCALE, build_graph

BATCH = 128
LR = 0.01
PARTS = ("gradients", "allreduce", "step")

# The step-time model of docs/distributed.md: n machines on Ethernet, a ring Allreduce
BANDWIDTH = 10e9 / 8   # bytes/s: 10 Gb/s
LATENCY = 50e-6        # s per message: MPI over TCP on 10 Gb/s Ethernet (20-50 µs measured commonly; the high end)
MACHINES = (4, 16)


def allreduce_seconds(n, gradient_bytes, bandwidth=BANDWIDTH, latency=LATENCY):
    """A ring Allreduce among n: a reduce-scatter and an allgather, each n - 1 messages of
    bytes / n per rank."""
    return 2 * (n - 1) / n * gradient_bytes / bandwidth + 2 * (n - 1) * latency


def step_seconds(n, batch, seconds_per_image, gradient_bytes):
    """One global batch's step on n machines: each computes batch / n images, then the Allreduce."""
    return seconds_per_image * batch / n + (allreduce_seconds(n, gradient_bytes) if n > 1 else 0.0)


def payoff_batches(n, seconds_per_image, gradient_bytes):
    """(the batch from which n machines beat one, from which they run at least half n times as fast)."""
    reduce = allreduce_seconds(n, gradient_bytes)
    return reduce / (seconds_per_image * (1 - 1 / n)), n * reduce / seconds_per_image


PAYOFF_HEADER = ("| model | parameters | µs/image | " + " | ".join(
    f"{n} machines: Allreduce ms | beat 1 from B | half of {n}x from B" for n in MACHINES) + " |\n|"
    + "---|" * (3 + 3 * len(MACHINES)))


def payoff_row(label, seconds_per_image, n_params, dtype_bytes=4):
    gradient_bytes = n_params * dtype_bytes
    cells = [f"{label}", f"{n_params:,}", f"{1e6 * seconds_per_image:.1f}"]
    for n in MACHINES:
        even, half = payoff_batches(n, seconds_per_image, gradient_bytes)
        cells += [f"{1e3 * allreduce_seconds(n, gradient_bytes):.2f}", f"{even:,.0f}", f"{half:,.0f}"]
    return "| " + " | ".join(cells) + " |"


def worker(args):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    X, y, _, _ = load_mnist()
    X, y = X[:args.images], y[:args.images]
    graph = build_graph(hidden=args.hidden, init="he")
    options = dict(compiler="gcc", opt=3, native=True, dtype="float32")
    if comm.Get_rank() == 0:  # one build: the other ranks load it from the cache
        net = graph.compile(**options)
    comm.Barrier()
    if comm.Get_rank() != 0:
        net = graph.compile(**options)
    net.set_threads(1)
    distributed.train(net, X, y, LR, batch_size=BATCH, comm=comm, scale=PIXEL_SCALE, timeout=args.timeout)  # warm-up
    runs = []
    for _ in range(args.repeats):
        timings = {}
        comm.Barrier()
        started = time.perf_counter()
        distributed.train(net, X, y, LR, batch_size=BATCH, comm=comm, scale=PIXEL_SCALE, timings=timings,
                          timeout=args.timeout)
        runs.append((time.perf_counter() - started, timings))
    seconds, timings = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    alone = allreduce_alone(comm, np.zeros(net.n_params, np.float32))
    if comm.Get_rank() == 0:
        print(json.dumps({"ranks": comm.Get_size(), "seconds": seconds, "images": len(X), "n_params": net.n_params,
                          "steps": -(-len(X) // BATCH), "allreduce_alone": alone,
                          **{part: timings[part] for part in PARTS}}))


def allreduce_alone(comm, grads, count=50):
    """The median seconds of an Allreduce of the gradient's size with no compute around it (each
    after a Barrier): its cost without the wait for a slower rank."""
    from mpi4py import MPI
    seconds = []
    for _ in range(count):
        comm.Barrier()
        started = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)

def run(ranks, args):
    mpiexec = Path(sys.executable).with_name("mpiexec")
    command = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(ranks), sys.executable, "-m", "bench.mpi",
               "--worker", "--images", str(args.images), "--repeats", str(args.repeats),
               "--hidden", *map(str, args.hidden), *(["--timeout", str(args.timeout)] if args.timeout else [])]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "MICROGRAD_C_THREADS": "1"})
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--images", type=int, default=60 * BATCH)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, nargs="+", default=[512, 256])
    parser.add_argument("--timeout", type=float, default=None,
                        help="distributed.train's timeout: its polled collectives instead of blocking ones")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    print(f"MLP(784, [{', '.join(map(str, args.hidden))}, 10]) float32, global batch {BATCH}, one thread per rank, "
          f"{args.images:,} images, median of {args.repeats}")
    print(f"{'ranks':>5}  {'images/s':>9}  {'vs 1':>5}  {'µs/image':>9}  {'ms/step':>8}  "
          + "  ".join(f"{part:>9}" for part in PARTS))
    first = None
    for ranks in args.ranks:
        result = run(ranks, args)
        rate = result["images"] / result["seconds"]
        first = first or rate
        shares = "  ".join(f"{result[part] / result['seconds']:>9.1%}" for part in PARTS)
        print(f"{ranks:>5}  {rate:>9,.0f}  {rate / first:>5.2f}  {1e6 / rate:>9.1f}  "
              f"{1e3 * result['seconds'] / result['steps']:>8.2f}  {shares}", flush=True)
    print(f"one Allreduce of the gradient ({result['n_params']:,} float32 = {result['n_params'] * 4 / 2**20:.2f} MiB) "
          f"alone, {result['ranks']} ranks: {1e3 * result['allreduce_alone']:.2f} ms")
    label = f"MLP(784, [{', '.join(map(str, args.hidden))}, 10])"
    print(f"the model for more machines (docs/distributed.md), from one rank's µs/image, {BANDWIDTH * 8 / 1e9:g} Gb/s, "
          f"{LATENCY * 1e6:g} µs:")
    print(PAYOFF_HEADER)
    print(payoff_row(label, 1 / first, result["n_params"]))
    print(f"load average while measuring: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    return 0

if __name__ == "__main__":
    sys.exit(main())
