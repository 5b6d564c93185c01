"""The cores' multiply-add peak (bench/c/bandwidth.c, `make roofline`'s program, built with gcc -O3
-march=native): once, as `make roofline` prints it (rates()), or served beside the runs it is set
against (served()): a window of multiply-adds on one thread and on every core, taken in turn with
the runs' windows (bench/windows.py), so that a share of the peak and the threads' gain compare the
same seconds. This VM's cores change speed on their own for minutes at a time: its two threads' peak
read 1.0x one thread's in one run and 1.9-2.0x minutes later.

    with peak.built() as exe:
        commands = peak.around(exe, "float32", ours)   # {"round trip": argv, **ours, "peak 1 thread": argv, "peak": argv}
"""
import contextlib
import os
import pathlib
import re
import statistics
import subprocess
import tempfile

SOURCE = pathlib.Path(__file__).resolve().parent / "c" / "bandwidth.c"
WINDOW_SECONDS = 0.25  # a served window: about an epoch's window of bench.minibatch's MLP at B = 128
ONE, EVERY, TRIP = "peak 1 thread", "peak", "round trip"


@contextlib.contextmanager
def built():
    """The program's path in a temporary directory, or None when gcc cannot build it here."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = pathlib.Path(tmp) / "bandwidth"
        done = subprocess.run(["gcc", "-O3", "-march=native", str(SOURCE), "-o", str(exe), "-lpthread"],
                              capture_output=True)
        yield exe if done.returncode == 0 else None


def cores():
    return max(1, min(64, len(os.sched_getaffinity(0))))


def served(exe, dtype, seconds=WINDOW_SECONDS):
    """{name: argv} of the peak's served windows (bench/windows.py): ONE on one thread, EVERY on
    every core this process may run on; each prints G multiply-adds a second of wall time."""
    return {ONE: [str(exe), "--serve", "1", dtype, str(seconds)],
            EVERY: [str(exe), "--serve", str(cores()), dtype, str(seconds)]}


def around(exe, dtype, commands, seconds=WINDOW_SECONDS):
    """The served `commands` ({name: argv}, in their order) with the peak's windows (served())
    after them and, on more than one core, TRIP before them: a cache line's round trip between two
    threads in ns, measured right before the first command's window of each round (the host moves
    this VM's vCPUs: the round trip changes several-fold for minutes at a time, and the threads'
    gain of a product shared between the cores with it)."""
    return {**({TRIP: [str(exe), "--serve-trips"]} if cores() > 1 else {}), **commands,
            **served(exe, dtype, seconds)}


def rates():
    """{(dtype, threads): G/s} as `make roofline` prints them (the best of its passes, each thread's
    CPU time); {} when the program cannot be built."""
    with built() as exe:
        if exe is None:
            return {}
        out = subprocess.run([str(exe)], capture_output=True, text=True).stdout
    return {(dtype, int(threads or 1)): float(rate) for dtype, rate, threads in
            re.findall(r"multiply-adds +(float\d+): ([0-9.]+) G/s (?:on (\d+) threads|\()", out)}


def in_rounds(times, multiply_adds, ours, one=None):
    """What the served peak's windows say of a run's windows taken in the same rounds (times:
    {system: [a window's us per item]}, multiply_adds per item): medians over the rounds of our
    rate (G/s), the round's peak on every core, our share of it; with `one` (our run on one
    thread) the threads' gain (one / ours), the machine's own (its peak on every core over one
    thread's) and ours over the machine's, each of the same round; with TRIP served, the cores'
    round trip's median and largest over the rounds (ns), and with `one` the threads' gain in the
    rounds whose round trip was within 2x of the fastest round's (gain_near, rounds_near): the
    vCPUs' nearer placement. {} without the peak's windows."""
    if EVERY not in times:
        return {}
    rates = [multiply_adds / us / 1e3 for us in times[ours]]
    found = {'rate': statistics.median(rates), 'peak': statistics.median(times[EVERY]),
             'share': statistics.median(r / p for r, p in zip(rates, times[EVERY]))}
    if one is not None and ONE in times:
        machine = [e / o for e, o in zip(times[EVERY], times[ONE])]
        gains = [o / u for o, u in zip(times[one], times[ours])]
        found.update(machine_gain=statistics.median(machine), gain=statistics.median(gains),
                     of_machine=statistics.median(g / m for g, m in zip(gains, machine)))
    if TRIP in times:
        trips = times[TRIP]
        found.update(trip=statistics.median(trips), trip_max=max(trips))
        if "gain" in found:  # (the two placements' rounds apart: the rounds within 2x of the run's fastest trip)
            near = [g for g, trip in zip(gains, trips) if trip < 2 * min(trips)]
            found.update(gain_near=statistics.median(near), rounds_near=len(near))
    return found
