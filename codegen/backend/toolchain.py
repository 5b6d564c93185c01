"""Building C source into a cached shared object (a CPython extension, a plain library, the
module runtime's object) and loading it, with the compiler a Compiler names; the backend's public
names, importable from here: the compilers and their table (codegen/backend/compilers.py), running
them (run.py), builds copied out of the cache (exported.py), what a build is (builds.py)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import templates

from . import libtcc, loader
from .builds import (BuildResult, CompileError, CompilerNotFound, CompileTimeout, ToolchainError, check_identifier,
                     unit_file_name, write_atomically)
from .compilers import (BACKEND_NAMES, COMPILER_NAMES, DEFAULT_SEARCH, FAMILIES, Compiler, CompilerFamily,
                        available_compilers, compile_flags, default_compiler_name, family_of_version,
                        find_compiler, host_cpu)
from .exported import ExportedBuild, export_build, export_record, find_build
from .run import MAXRSS_BYTES, build_owner, kill_compilers, owner_of_thread, run_compiler

__all__ = [  # this module's names and those it gathers (`from codegen.backend import toolchain` reaches them all)
    'build_module', 'build_extension', 'build_library', 'build_key', 'structure_build_key', 'find_by_structure',
    'index_by_structure', 'SHARED_OBJECT_NAME',
    'BuildResult', 'CompileError', 'CompilerNotFound', 'CompileTimeout', 'ToolchainError', 'check_identifier',
    'unit_file_name', 'write_atomically',
    'BACKEND_NAMES', 'COMPILER_NAMES', 'DEFAULT_SEARCH', 'FAMILIES', 'Compiler', 'CompilerFamily',
    'available_compilers', 'compile_flags', 'default_compiler_name', 'family_of_version', 'find_compiler',
    'ExportedBuild', 'export_build', 'export_record', 'find_build',
    'MAXRSS_BYTES', 'build_owner', 'kill_compilers', 'run_compiler',
]


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
    build_and_load = _build_file_and_load if FAMILIES[compiler.family].makes_files else _build_in_memory_and_load
    return build_and_load(sources, name, compiler, opt, native, cache, timeout, measure_memory, structure)


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
    """(sources as a list, Compiler, flags, cache key, the flags of each source's compile), the
    arguments checked. A unit of straight-line code (templates.StraightLineSource) or of loop
    nests (templates.LoopSource) may have flags of its own (compilers.compile_flags): part of the
    key, like which units they are."""
    if kind not in ('extension', 'library', 'object'):
        raise ValueError(f"kind must be 'extension', 'library' or 'object', not {kind!r}")
    check_identifier(name)
    sources = [sources] if isinstance(sources, str) else list(sources)
    if not isinstance(compiler, Compiler):
        compiler = find_compiler(compiler)
    if not FAMILIES[compiler.family].makes_files:
        raise ValueError(f'{compiler.family} builds into memory only, not a file: name a compiler '
                         f'({", ".join(COMPILER_NAMES)}), or use codegen.compile')
    # (an object is a part of an extension: the module runtime)
    include = ['-I' + sysconfig.get_paths()['include']] if kind in ('extension', 'object') else []

    def unit_flags_of(source):
        unit = ({'straight_line': True} if isinstance(source, templates.StraightLineSource)
                else {'loops': True, 'lane_bytes': source.lane_bytes} if isinstance(source, templates.LoopSource)
                else {})
        return [*compile_flags(compiler, opt, native, **unit), *include]
    flags = [*compile_flags(compiler, opt, native), *include]
    unit_flags = [unit_flags_of(s) for s in sources]
    key = hashlib.sha256(json.dumps([
        kind, name, sources, compiler.family, compiler.argv, compiler.link_args, compiler.version, flags,
        unit_flags, sys.implementation.cache_tag, sysconfig.get_config_var('EXT_SUFFIX'),
        host_cpu() if native else None,  # (-march=native means this CPU: see compilers.host_cpu)
    ]).encode()).hexdigest()
    return sources, compiler, flags, key, unit_flags


# The longest timeout (a year): a bigger int would not convert to the float seconds the deadline counts in
MAX_TIMEOUT = 3.2e7


def _build(kind, sources, name, compiler, opt, native, cache, timeout, measure_memory) -> BuildResult:
    # imported here, not at the top: `python -m codegen.backend.cache` imports the codegen package (and so
    # this module) first, and must not find codegen.backend.cache imported already (runpy would warn)
    from . import cache as build_cache
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0
                                or timeout > MAX_TIMEOUT):
        raise ValueError(f'timeout must be a number of seconds > 0 (at most {MAX_TIMEOUT:.0e}) or None, not {timeout!r}')
    if not isinstance(measure_memory, bool):
        raise TypeError(f'measure_memory must be True or False, not {measure_memory!r}')
    sources, compiler, flags, key, unit_flags = _build_plan(kind, sources, name, compiler, opt, native)
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
    unit_flags = [f for s, f in zip(sources, unit_flags) if not any(s is t for t in shared)]
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
        seconds, peak_rss = _compile(compiler, unit_flags, link, sources, c_files, cache, output, timeout, measure_memory,
                                     (lambda: _shared_objects(shared, compiler, opt, native, cache, timeout,
                                                              measure_memory)) if shared else None)
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


def _shared_objects(sources, compiler, opt, native, cache, timeout, measure_memory):
    """_shared_object of each source, built side by side (the module runtime's two units: each
    takes a core), in the sources' order, on behalf of this thread's owner (build_owner)."""
    owner = getattr(owner_of_thread, 'value', None)

    def build(source):
        with build_owner(owner):
            return _shared_object(source, compiler, opt, native, cache, timeout, measure_memory)
    with ThreadPoolExecutor(len(sources)) as pool:
        return list(pool.map(build, sources))


def start_shared_object(source, compiler, opt, native, cache=None, timeout=None):
    """Starts building a shared source's object (templates.SharedSource: the module runtime) in a
    thread of its own, for an extension built later from units that link it: compile() starts it
    before lowering, so that on a cold cache the runtime compiles beside the lowering (a core
    each: gcc -O2 takes 8 s for a float32 runtime) instead of beside the units. Nothing for
    compilers that take it as a unit, or when the cache has it. Returns the thread, or None. The
    build that links the object waits for it by the entry's lock and reports any error itself."""
    from . import cache as build_cache
    if not FAMILIES[compiler.family].parallel_units or not FAMILIES[compiler.family].makes_files:
        return None
    cache = pathlib.Path(cache) if cache is not None else build_cache.cache_dir()
    entry = cache / f'{SHARED_OBJECT_NAME}_{_shared_key(source, compiler, opt, native)[:16]}.o'
    status, _, fd = build_cache.open_entry(entry)
    if fd is not None:
        os.close(fd)
    if status == build_cache.VALID:
        return None

    def build():
        try:
            _, held = _shared_object(source, compiler, opt, native, cache, timeout, False)
            os.close(held)
        except (ToolchainError, OSError):  # (the build that links it meets the error again, and reports it)
            pass
    thread = threading.Thread(target=build, name='module runtime', daemon=True)
    thread.start()
    return thread


def _compile(compiler, unit_flags, link, sources, c_files, cache, output, timeout,
             measure_memory, shared=None) -> tuple[float, int | None]:
    """Write the C files and build `output` from them (each compiled with its unit_flags when they
    compile apart; else with link's), and from the objects shared() gives
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
    owner = getattr(owner_of_thread, 'value', None)  # (read here: the pool's threads have their own)
    held = []  # the shared objects' (build, descriptor)

    def remaining():
        return None if timeout is None else max(0.0, start + timeout - time.perf_counter())

    def compile_unit(c_file, flags, obj):
        return run_compiler([*compiler.argv, *flags, '-c', str(c_file), '-o', str(obj)], remaining(), measure_memory,
                             owner)

    def build_shared():
        with build_owner(owner):
            held.extend(shared())
        return 0.0, max([b.peak_rss or 0 for b, _ in held], default=0) if measure_memory else None

    try:
        if not parallel:  # one compiler process for all the units
            seconds, peak_rss = run_compiler(link(temp_output, c_files), remaining(), measure_memory, owner)
        else:  # several units: compile them on every core, then link; the time is the wall clock's
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                # the shared objects (a cold module runtime) build beside the units
                waiting = pool.submit(build_shared) if shared is not None else None
                runs = list(pool.map(compile_unit, c_files, unit_flags, objects))
                if waiting is not None:
                    runs.append(waiting.result())
            linked = [*objects, *(b.path for b, _ in held)]
            runs.append(run_compiler(link(temp_output, linked), remaining(), measure_memory, owner))
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


def _temp_file(directory: pathlib.Path, name: str, suffix: str = '.tmp') -> str:
    fd, path = tempfile.mkstemp(dir=directory, prefix=f'.{name}.', suffix=suffix)
    os.close(fd)
    return path
