"""What a build is, for the toolchain (codegen/backend/toolchain.py) and the in-memory compiler
(codegen/backend/libtcc.py) alike: its errors, its result, its name and files (written whole or
not at all), and where Debian keeps the system's headers and libraries."""
from __future__ import annotations

import os
import pathlib
import platform
import re
import shlex
import shutil
import subprocess
import sysconfig
import tempfile
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


def check_identifier(name) -> None:
    """A module or library name must be a C identifier (it names PyInit_<name>, the file, the C)."""
    if not isinstance(name, str) or not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', name):
        raise ValueError(f'name must be a C identifier, not {name!r}')


def unit_file_name(stem: str, index: int) -> str:
    """The file of a build's C source number `index`: stem.c for the module, stem.1.c... after it."""
    return f'{stem}.{index}.c' if index else f'{stem}.c'


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
    """Write text or bytes to path through a temporary file beside it, then rename: a reader
    never sees a partial file, and an interrupted write leaves none (the temporary is removed)."""
    path = pathlib.Path(path)
    fd, temp_path = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb' if isinstance(data, bytes) else 'w') as file:
            file.write(data)
        os.replace(temp_path, path)
    except BaseException:
        os.unlink(temp_path)
        raise
