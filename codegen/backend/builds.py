"""What a build is, for the toolchain (codegen/backend/toolchain.py) and the in-memory compiler
(codegen/backend/libtcc.py) alike: its errors, its result, and where Debian keeps the system's headers
and libraries."""
from __future__ import annotations

import pathlib
import platform
import shlex
import shutil
import subprocess
import sysconfig
from dataclasses import dataclass


class ToolchainError(RuntimeError):
    pass


class CompilerNotFound(ToolchainError):
    pass


class CompileError(ToolchainError):
    def __init__(self, command: list[str], stderr: str, returncode: int):
        self.command = command
        self.stderr = stderr
        super().__init__(f'C compiler failed (exit status {returncode}):\n  {shlex.join(command)}\n{stderr}')


class CompileTimeout(ToolchainError):
    def __init__(self, command: list[str], seconds: float):
        self.command = command
        self.seconds = seconds
        super().__init__(f'C compiler killed after exceeding the {seconds:g} s timeout:\n  {shlex.join(command)}')


@dataclass(frozen=True)
class BuildResult:
    path: pathlib.Path
    cached: bool             # True if found in the cache (no compiler run)
    # wall time of the compiler runs (0.0 when cached); with measure_memory, a single compiler
    # process's time as its probe saw it (the probe's own start-up is not counted)
    seconds: float
    # peak resident memory of the largest compiler process, bytes: only with measure_memory=True
    # (None when cached or not measured)
    peak_rss: int | None
    command: tuple[str, ...]
    source: pathlib.Path | None = None  # the C file beside it, for users to read
    c_files: tuple[pathlib.Path, ...] = ()  # all its C files: source, then the extra units
    key: str | None = None   # the cache key: a hash of the sources, compiler and flags (see build_key)
    # the key the build is indexed under by its graph's structure (structure_build_key), if any
    structure_key: str | None = None


def multiarch_triplet() -> str:
    """Debian's multiarch directory name, e.g. x86_64-linux-gnu (/usr/include/<it>, /usr/lib/<it>)."""
    multiarch = sysconfig.get_config_var('MULTIARCH')
    if not multiarch and shutil.which('gcc'):
        multiarch = subprocess.run(['gcc', '-print-multiarch'], capture_output=True, text=True).stdout.strip()
    return multiarch or f'{platform.machine()}-linux-gnu'
