"""C templates for micrograd-c's generated modules (package data). `read(name)` gives one with its
`/*@INCLUDE file@*/` lines replaced by those files (recursively), so that every generated source is
self-contained: the cache keys it by its text, and the C kept beside a build is what was compiled.
`fill(name, KEY=value, ...)` is that text with its placeholders `@KEY@` replaced: the one way the
generated C gets into a template.

    model.c     a model's own unit: the generated graph, the steps over its tables, its descriptor
                MODEL, PyInit_<name>
    epilogue.c  a layer kernel's epilogue (kernels/gemm.c's Epilogue) around its one statement
    model.h     the contract: the descriptor the runtime reads (sizes, slots, tables, functions)
    runtime.c   the module runtime, the same for every model: state, exported functions, lifecycle
    products.c  the module runtime's other unit: its matrix products (kernels/gemm.c, conv.c)
    args.c      CPython argument checking (counts, numbers, buffers), shared with jit.c
    threads.c   the module's lock, the GIL and signal checks
    samples.c   train()/predict()'s rows: checking X and Y, loading one sample
    driver.c    the training and prediction loops over the generated functions, without Python
    step.c      the step-by-step API's gradients: zero_grad(), backward(), update(), the `grad` view
    optim.c     the optimizers' steps (codegen/write/optim.py describes them)
    batch.c     train()/predict() over whole batches (the batched program, codegen/lower/batch.py)
    pool.c      the threads a batch's matrix products (and codegen.jit's rows) run on
    prelude.c   element type and portability macros, then the kernels by family:
      kernels/dot.c     dot products and sums (fused sums of one sample)
      kernels/rows.c    a layer's weights' gradients over a batch built into the graph (dot_rows)
      kernels/gemm.c    the matrix products of a layer over a batch: one register-blocked micro-kernel
      kernels/conv.c    a convolution over a batch: its forward and both gradients (conv_set, conv_nt, conv_acc)
      kernels/axpy.c    updates: axpy, SGD steps, lists at offsets (a convolution's window)
      kernels/sparse.c  sparse inputs: nonzero chunk lists, matvec, dot_nz, axpy_nz
    jit.c       a codegen.jit function's module
    walk.c      the Value graph's reader at C speed (codegen/walker.py), built once per machine
    export/, freestanding/   codegen.export's API and its freestanding math
"""
import re
from importlib import resources

_INCLUDE = re.compile(r"^/\*@INCLUDE ([\w./-]+)@\*/$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")


class SharedSource(str):
    """A C source that many builds share word for word (runtime.c, the module runtime): a
    toolchain that compiles units apart may compile it once per compiler and flags and keep the
    object (codegen/backend/toolchain.py); any other treats it as one more unit."""


class StraightLineSource(str):
    """A unit of an irregular graph's straight-line code (codegen/write/emit.py): functions of
    single statements, no loop the vectoriser would take. A compiler family may compile it at a
    lower -O level than the build's (codegen/backend/compilers.py's straight_line_opt), since its
    optimiser's time there grows with the statements and buys little."""


# The widest vector a build here uses (AVX-512's): a unit of loops over narrower lanes may prefer
# vectors of their width (LoopSource's lane_bytes, codegen/backend/compilers.py's host_loop_flags).
WIDEST_VECTOR_BYTES = 64


class LoopSource(str):
    """A unit of a model's loop nests (codegen/write/emit.py: its passes' functions, but an
    irregular graph's): a compiler family that builds for the host's vectors may build it for
    the widest (codegen/backend/compilers.py's host_loop_flags), the same bits. lane_bytes: the
    bytes of a pass's lanes where every loop of the unit runs over a batch's (the batched
    program's functions), None otherwise: vectors wider than that would leave its loops to their
    narrower remainders."""

    def __new__(cls, text, lane_bytes=None):
        unit = super().__new__(cls, text)
        unit.lane_bytes = lane_bytes
        return unit


def read(name: str) -> str:
    """The template `name` (a path inside templates/) with its includes expanded."""
    text = resources.files(__name__).joinpath(name).read_text()
    return _INCLUDE.sub(lambda m: read(m.group(1)).rstrip("\n"), text)


def fill(name: str, **values) -> str:
    """The template `name` (includes expanded) with each placeholder @KEY@ replaced by str(values[KEY]),
    in one pass: the values are not searched for placeholders. Values a template does not use are
    left out (a header and its source share theirs); a placeholder without a value is a KeyError."""
    def value(match):
        key = match.group(1)
        if key not in values:
            raise KeyError(f"template {name}: no value for @{key}@")
        return str(values[key])
    return _PLACEHOLDER.sub(value, read(name))
