"""The Value graph's walk in C (templates/walk.c): what codegen/lower/graph.py reads a graph with, at
about 65 ns per parameter instead of Python's 0.5 µs per Value. Built once per machine with the default compiler
into the build cache's `tools/` directory (hash-named by its source like any module; apart from
the models' builds) and loaded like the generated modules; without a compiler, or if it does not
build, `module()` is None and graph.py walks in Python."""

import functools
import warnings

import templates
from micrograd_c import engine

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


def _float_chain(value_type, start, a, b):
    """engine.Dot's chain over floats by the walker's C (templates/walk.c's float_chain, the same
    bits as the engine's own but a NaN's sign): installed below, so that a model built after `import codegen` makes its
    Dots at C speed. Its first call builds or loads the walker (which compile() would build
    anyway) and installs the walker's own function; without a walker, Dots go back to NumPy."""
    walk = module()
    engine.use_compiled_chain(walk.float_chain if walk is not None else None)
    return walk.float_chain(value_type, start, a, b) if walk is not None else None


engine.use_compiled_chain(_float_chain)
