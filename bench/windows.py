"""Ratios that hold on a machine whose speed changes: systems kept running, each in its own process,
timed in windows taken in turn (one runs while the others wait), and the median over rounds of
one window over another's of the same round. This VM's host slows it by up to 2x for seconds to
minutes at a time, with no sign in the load average; rows measured one after another straddle
those spells, windows a fraction of a second apart do not (bench/gpt.py, bench/minibatch.py).

A served system is a command that prints "ready" once it is set up, then, for each line it reads,
times one window of the run the line names and prints one number (its time, e.g. us an image);
it stops at the end of its input."""

import statistics
import subprocess


def in_turn(commands, runs, rounds):
    """{system: {run: [a number a window]}} of the commands ({system: argv}) kept running, every
    run of `runs` (the lines sent) timed once a round in each system in turn; or a str: why a
    system did not start (its last line of error)."""
    serving = {name: subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
               for name, argv in commands.items()}
    try:
        for name, process in serving.items():
            if process.stdout.readline().strip() != "ready":
                return f"{name}: " + (process.communicate()[1].strip().splitlines() or ["failed"])[-1]
        times = {name: {run: [] for run in runs} for name in serving}
        for _ in range(rounds):
            for run in runs:
                for name, process in serving.items():
                    process.stdin.write(f"{run}\n")
                    process.stdin.flush()
                    times[name][run].append(float(process.stdout.readline()))
        return times
    finally:
        for process in serving.values():
            if not process.stdin.closed:
                process.stdin.close()
            process.wait()


def ratio(ours, peer):
    """The median over rounds of ours' window over the peer's window of the same round."""
    return statistics.median(o / p for o, p in zip(ours, peer))


def serve(windows):
    """The served end (see the module's docstring): `windows` maps a run's name to a function that
    times one window of it and returns its number."""
    import sys
    print("ready", flush=True)
    for line in sys.stdin:
        print(windows[line.strip()](), flush=True)
