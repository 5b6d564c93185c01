"""bench/peak.py: the cores' multiply-add peak served in windows beside the runs it is set against,
and what the same rounds' figures say (a share of the peak, the threads' gain beside the machine's)."""
import subprocess

import pytest

from bench import peak, windows


def test_the_same_rounds_figures():
    """Each figure is the median over the rounds of that round's own ratio, not a ratio of medians."""
    times = {"ours": [10.0, 20.0, 40.0], "one": [18.0, 30.0, 80.0],  # us an item
             peak.EVERY: [100.0, 50.0, 40.0], peak.ONE: [50.0, 25.0, 40.0]}  # G/s
    found = peak.in_rounds(times, 500_000, "ours", "one")
    # rates 50, 25 and 12.5 G/s against 100, 50 and 40: shares 0.5, 0.5 and 0.3125
    assert found["rate"] == 25.0 and found["peak"] == 50.0 and found["share"] == 0.5
    # the machine's gains 2, 2 and 1; ours 1.8, 1.5 and 2; ours over the machine's 0.9, 0.75 and 2
    assert found["machine_gain"] == 2.0 and found["gain"] == 1.8 and found["of_machine"] == 0.9
    assert "gain" not in peak.in_rounds(times, 500_000, "ours")  # (no one-thread run: no gains)
    assert "trip" not in found  # (no round trip served)
    times[peak.TRIP] = [90.0, 400.0, 100.0]  # ns
    trips = peak.in_rounds(times, 500_000, "ours", "one")
    assert trips["trip"] == 100.0 and trips["trip_max"] == 400.0 and trips["gain"] == 1.8
    # the rounds within 2x of the fastest trip (90 ns): the first and the last, gains 1.8 and 2
    assert trips["rounds_near"] == 2 and trips["gain_near"] == 1.9
    assert peak.in_rounds({"ours": [1.0]}, 1, "ours") == {}  # (no peak served)


@pytest.mark.requires("gcc")
def test_the_served_peak_windows():
    """bandwidth.c --serve: "ready", then a rate a line, in G multiply-adds a second, on one
    thread and on every core; a bad argument is a usage error."""
    with peak.built() as exe:
        assert exe is not None
        commands = peak.around(exe, "float32", {}, seconds=0.02)
        assert list(commands)[-2:] == [peak.ONE, peak.EVERY]  # (the round trip first: before the runs')
        times = windows.in_turn(commands, ["a", "b"], 3)
        assert set(times) == {peak.ONE, peak.EVERY} | ({peak.TRIP} if peak.cores() > 1 else set())
        for rates in times.values():  # (G/s; a round trip's ns: tens to thousands)
            assert [len(r) for r in rates.values()] == [3, 3] and all(x > 0.1 for r in rates.values() for x in r)
        if peak.TRIP in times:
            assert all(5 < x < 100_000 for r in times[peak.TRIP].values() for x in r)
        bad = subprocess.run([str(exe), "--serve", "0", "float32", "0.1"], capture_output=True, text=True)
        assert bad.returncode == 2 and "usage" in bad.stderr
