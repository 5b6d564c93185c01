"""Load a built extension module from its file path."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import types


def load_extension(path: str | os.PathLike, module_name: str) -> types.ModuleType:
    """Import the extension at path (its init function is PyInit_<module_name>).

    Not registered in sys.modules: modules built under the same name from different
    sources live at different paths and load side by side, and must not replace an
    unrelated module of that name.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise ImportError(f'extension module file not found: {path}', name=module_name, path=str(path))
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None:
        raise ImportError(f'not an extension module file (unknown suffix): {path}', name=module_name, path=str(path))
    previous = sys.modules.get(module_name)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:  # single-phase init puts the module in sys.modules as a side effect: undo that
        if previous is None:
            sys.modules.pop(module_name, None)
        else:
            sys.modules[module_name] = previous
    return module
