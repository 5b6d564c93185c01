"""Running a compiler process: waiting on it with a timeout (the whole process group killed
after it), its peak memory measured by a small probe process, and the processes of a build's
owner, so that a background build can be stopped with its compilers (codegen/tiers.py)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

from .builds import CompileError, CompileTimeout

# ru_maxrss is in kilobytes on Linux, bytes on macOS.
MAXRSS_BYTES = 1 if sys.platform == 'darwin' else 1024


# Runs a command as a child of this small process and reports the child's wall time and peak
# memory on a pipe. Measured from the Python process itself, the compiler's peak would include
# the parent's: Linux carries the forking process's resident size into the child's ru_maxrss.
_MEASURE = """
import os, sys, time
report, command = int(sys.argv[1]), sys.argv[2:]
start = time.perf_counter()
pid = os.posix_spawnp(command[0], command, os.environ)
_, status, usage = os.wait4(pid, 0)
os.write(report, b"%r %d" % (time.perf_counter() - start, usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


# The compiler processes running now, by pid: the owner (build_owner) of the build each serves, so
# that a background build (codegen/tiers.py) can be stopped with its compilers.
_running: dict[int, object] = {}
owner_of_thread = threading.local()  # .value: the owner of the builds this thread runs (build_owner)


@contextlib.contextmanager
def build_owner(owner):
    """Builds in this block run their compilers on behalf of `owner` (kill_compilers)."""
    previous = getattr(owner_of_thread, 'value', None)
    owner_of_thread.value = owner
    try:
        yield
    finally:
        owner_of_thread.value = previous


def kill_compilers(owner) -> None:
    """SIGKILL the compiler processes of `owner`'s builds (with cc1, as, ld: their process groups);
    their builds fail with CompileError."""
    for pid, of in list(_running.items()):
        if of is owner:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def run_compiler(command: list[str], timeout: float | None, measure_memory: bool = False,
                  owner=None) -> tuple[float, int | None]:
    """Run the compiler: its wall seconds and, with measure_memory, its peak RSS in bytes (else
    None). Raise CompileError / CompileTimeout. owner: see build_owner."""
    read_end, write_end = os.pipe() if measure_memory else (None, None)
    argv = [sys.executable, '-I', '-S', '-c', _MEASURE, str(write_end), *command] if measure_memory else command
    with tempfile.TemporaryFile() as log, (os.fdopen(read_end, 'rb') if measure_memory
                                           else contextlib.nullcontext()) as report:
        start = time.perf_counter()
        # Own session/process group, so a timeout also kills cc1, as and ld.
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, pass_fds=(write_end,) if measure_memory else ())
        except OSError as error:  # e.g. the compiler was removed since find_compiler saw it
            raise CompileError(command, str(error), 127) from None
        finally:
            if measure_memory:
                os.close(write_end)
        _running[process.pid] = owner
        try:
            status = _wait(process.pid, start, timeout)
        except BaseException as error:  # timeout or Ctrl-C: don't leave the compiler running
            os.killpg(process.pid, signal.SIGKILL)
            os.waitpid(process.pid, 0)
            process.returncode = -signal.SIGKILL
            if isinstance(error, TimeoutError):
                raise CompileTimeout(command, timeout) from None
            raise
        finally:
            _running.pop(process.pid, None)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        measured = report.read().split() if measure_memory else None
        if process.returncode != 0 or (measure_memory and len(measured) != 2):
            log.seek(0)
            raise CompileError(command, log.read().decode(errors='replace'), process.returncode)
    if not measure_memory:
        return seconds, None
    # the compiler's own time, as the probe saw it: the probe's start-up is not the compiler's
    return float(measured[0]), int(measured[1]) * MAXRSS_BYTES


def _wait(pid: int, start: float, timeout: float | None) -> int:
    """os.waitpid with a timeout: the child's wait status; raise TimeoutError."""
    delay = 0.001
    while True:
        reaped, status = os.waitpid(pid, 0 if timeout is None else os.WNOHANG)
        if reaped:
            return status
        remaining = start + timeout - time.perf_counter()
        if remaining <= 0:
            raise TimeoutError
        time.sleep(min(delay, remaining))
        delay = min(2 * delay, 0.05)
