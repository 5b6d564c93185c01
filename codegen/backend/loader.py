"""Load a built extension module from its file path."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import types
import warnings


def load_extension(path: str | os.PathLike, module_name: str) -> types.ModuleType:
    """Import the extension at path (its init function is PyInit_<module_name>).

    Not registered in sys.modules: modules built under the same name from different
    sources live at different paths and load side by side, and must not replace an
    unrelated module of that name.

    A build cache entry (a file with a record beside it, see codegen/backend/cache.py) is checked
    against its record before it is loaded: a damaged one raises ImportError (dlopen of a
    truncated file would kill the process with SIGBUS). Once loaded, it is kept from eviction
    for the life of the process.
    """
    from . import cache  # here, not at the top: see toolchain._build
    path = pathlib.Path(path)
    if not path.is_file():
        raise ImportError(f'extension module file not found: {path}', name=module_name, path=str(path))
    lock_fd = None
    if cache.record_path(path).exists():
        status, why, lock_fd = cache.open_entry(path)
        if status != cache.VALID:
            raise ImportError(f'build cache entry {path} is {status}: {why}', name=module_name, path=str(path))
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None:
        if lock_fd is not None:
            os.close(lock_fd)
        raise ImportError(f'not an extension module file (unknown suffix): {path}', name=module_name, path=str(path))
    previous = sys.modules.get(module_name)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    finally:  # single-phase init puts the module in sys.modules as a side effect: undo that
        if previous is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous
    if lock_fd is not None:
        cache.hold(lock_fd)
    return module


def build_and_load(build, module_name: str):
    """build() -> toolchain.BuildResult, then load it: (result, module). A cached module that
    fails to load (damaged, or built for another machine) is removed and rebuilt once, with a
    cache.CacheWarning."""
    from . import cache  # here, not at the top: see toolchain._build
    result = build()
    try:
        return result, load_extension(result.path, module_name)
    except ImportError as error:
        if not result.cached:
            raise
        warnings.warn(f'cached module {result.path} does not load ({error}); removing and rebuilding it',
                      cache.CacheWarning, stacklevel=3)
        cache.remove_entry(result.path)
    result = build()
    return result, load_extension(result.path, module_name)
