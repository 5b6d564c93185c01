"""C templates for micrograd-c's generated modules (package data). `read(name)` gives one with its
`/*@INCLUDE file@*/` lines replaced by those files (recursively), so that every generated source is
self-contained: the cache keys it by its text, and the C kept beside a build is what was compiled.

    module.c    the training-step module: state, exported functions, lifecycle
    args.c      CPython argument checking (counts, numbers, buffers), shared with jit.c
    threads.c   the module's lock, the GIL and signal checks
    samples.c   train()/predict()'s rows: checking X and Y, loading one sample
    driver.c    the training and prediction loops over the generated functions, without Python
    step.c      the step-by-step API's gradients: zero_grad(), backward(), update(), the `grad` view
    optim.c     the optimizers' steps (codegen/optim.py describes them)
    prelude.c   element type, kernels (dot, axpy, sgd_step, ...), math for the generated code
    jit.c       a codegen.jit function's module
    export/, freestanding/   codegen.export's API and its freestanding math
"""
import re
from importlib import resources

_INCLUDE = re.compile(r"^/\*@INCLUDE ([\w./-]+)@\*/$", re.MULTILINE)


def read(name: str) -> str:
    """The template `name` (a path inside templates/) with its includes expanded."""
    text = resources.files(__name__).joinpath(name).read_text()
    return _INCLUDE.sub(lambda m: read(m.group(1)).rstrip("\n"), text)
