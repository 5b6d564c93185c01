"""The Value graph's walk in C (templates/walk.c): what codegen/lower/graph.py reads a graph with, at
about 65 ns per parameter instead of Python's 0.5 µs per Value. Built once per machine with the default compiler
into the build cache's `tools/` directory (hash-named by its source like any module; apart from
the models' builds) and loaded like the generated modules; without a compiler, or if it does not
build, `module()` is None and graph.py walks in Python."""

import functools
import warnings

import templates

from .backend import toolchain

MODULE_NAME = "graph_walk"


@functools.lru_cache(maxsize=None)
def module():
    """The loaded walker, or None (no compiler, or it failed to build: a warning says why)."""
    try:
        compiler = toolchain.find_compiler(None)
    except toolchain.CompilerNotFound:
        return None
    from .backend import cache  # here, not at the top: see toolchain._build
    try:
        return toolchain.build_module(templates.read("walk.c"), MODULE_NAME, compiler=compiler, opt=2,
                                      cache=cache.cache_dir() / "tools")[1]
    except (toolchain.ToolchainError, ImportError, OSError) as error:
        warnings.warn(f"the C graph walker did not build ({error}); reading graphs in Python", stacklevel=2)
        return None
