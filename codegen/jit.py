"""codegen.jit: compiled value and gradient of any scalar function written with Values.

    from codegen.jit import jit

    @jit
    def f(a, b, c):
        return -a + b * (c - a / b)

    f(1.0, 2.0, 3.0)                  # the value, from C
    f(1.0, 2.0, 3.0, grad=True)       # (value, (df/da, df/db, df/dc))
    f(A, B, C, grad=True)             # NumPy arrays, one per argument (or one (n, 3) array):
                                      # (values (n,), grads (n, 3)), all rows in one C call
    f(X, grad=True, out=(values, grads))   # into arrays of yours (float64, C-contiguous)

The first call with a given number of arguments traces the function with Values (holding that
call's arguments), lowers the graph with codegen (the arguments as inputs, their gradients
wanted) and builds it in templates/jit.c, whose row loop inlines the generated code. Control
flow in the function runs once, at tracing: branch with relu(), max() or where-style ops.
"""
from __future__ import annotations

import functools
import time

import numpy as np

from micrograd_c.engine import Value
import templates

from .write import contract, emit
from .lower import ir
from .backend import libtcc, loader, toolchain

MODULE_NAME = "micrograd_c_jit"
# Graphs up to this many statements are inlined into the row loop (templates/jit.c); bigger ones
# keep the generated code's small noinline functions, which compilers optimise in linear time.
INLINE_STATEMENTS = 2000


def jit(fn=None, *, compiler=None, opt=3, native=False):
    """Decorator: `@jit` or `@jit(compiler="clang", opt=2, native=True)`. compiler as for
    codegen.compile: "tcc", "gcc", "clang", "zig", a command, None ($CC, else the first
    compiler found) or "libtcc" (in memory, a few ms to build, slower code)."""
    if fn is None:
        return lambda f: JitFunction(f, compiler=compiler, opt=opt, native=native)
    return JitFunction(fn, compiler=compiler, opt=opt, native=native)


class JitFunction:
    def __init__(self, fn, compiler=None, opt=3, native=False):
        if not callable(fn):
            raise TypeError(f"jit needs a function, got {type(fn).__name__}")
        functools.update_wrapper(self, fn)
        self.fn, self.compiler, self.opt, self.native = fn, compiler, opt, native
        self.modules = {}  # argument count -> compiled module
        self.timings = {}  # argument count -> {"trace": s, "codegen": s, "compile": s}

    def __call__(self, *args, grad=False, out=None):
        module = self.modules.get(len(args))
        if module is not None and out is None:  # the common case first, cheaply: plain floats
            try:
                return module.value_and_grad(*args) if grad else module.value(*args)
            except TypeError:
                pass  # arrays or other numbers: below
        return self._call(args, grad, out)

    def _call(self, args, grad, out):
        if not args:
            raise TypeError(f"{self.__name__}() needs at least one argument")
        if len(args) == 1 and np.ndim(args[0]) == 2:  # one row per evaluation
            X = np.ascontiguousarray(args[0], dtype=np.float64)
            return self._batch(X, grad, out)
        arrays = [np.asarray(a, dtype=np.float64) if _numeric(a) else a for a in args]
        for i, a in enumerate(arrays):
            if not isinstance(a, np.ndarray) or a.ndim > 1:
                raise TypeError(f"{self.__name__}(): argument {i} must be a number or a 1-D array of numbers, "
                                f"got {type(args[i]).__name__}" + (f" of {a.ndim} dimensions" if isinstance(a, np.ndarray) else ""))
        if all(a.ndim == 0 for a in arrays):
            if out is not None:
                raise TypeError(f"{self.__name__}(): out= is for arrays of arguments")
            module = self.compiled(len(args), [float(a) for a in arrays])
            return module.value_and_grad(*map(float, arrays)) if grad else module.value(*map(float, arrays))
        try:
            columns = np.broadcast_arrays(*arrays)
        except ValueError:
            raise ValueError(f"{self.__name__}(): the array arguments have different lengths "
                             f"{[a.shape[0] for a in arrays if a.ndim]}") from None
        return self._batch(np.ascontiguousarray(np.stack(columns, axis=1)), grad, out)

    def _batch(self, X, grad, out):
        n, k = X.shape
        if k == 0:
            raise TypeError(f"{self.__name__}(): the rows have no columns (one per argument)")
        module = self.compiled(k, X[0].tolist() if n else None)
        if out is None:
            values, grads = np.empty(n), np.empty((n, k)) if grad else None
        else:
            values, grads = out if grad else (out, None)
            _check_out("values", values, (n,))
            if grad:
                _check_out("grads", grads, (n, k))
        module.batch(X, values, grads)
        return (values, grads) if grad else values

    def compiled(self, n_args, example=None):
        """The module for n_args arguments: traced (with the example's values) and built on first use."""
        module = self.modules.get(n_args)
        if module is None:
            module = self.modules[n_args] = self._build(n_args, example)
        return module

    def _build(self, n_args, example):
        started = time.perf_counter()
        inputs, out = self._trace(n_args, example)
        traced = time.perf_counter()
        program = ir.lower(out, inputs, (), input_grads=True)
        source = jit_source(program)
        generated = time.perf_counter()
        build, module = toolchain.build_module([source], MODULE_NAME, compiler=self.compiler, opt=self.opt,
                                               native=self.native)
        seconds = build.seconds
        self.timings[n_args] = {"trace": traced - started, "codegen": generated - traced, "compile": seconds}
        return module

    def _trace(self, n_args, example):
        """(input Values, output Value). Traced with the example's values (the first call's), or
        if that fails on a value (say 1/0) with others: only the graph matters."""
        attempts = [list(example)] if example is not None else []
        attempts.append([0.5 + 0.25 * i for i in range(n_args)])
        for values in attempts:
            inputs = [Value(float(v)) for v in values]
            try:
                out = self.fn(*inputs)
            except ArithmeticError:
                continue
            if isinstance(out, (int, float)) and not isinstance(out, bool):
                out = Value(float(out))  # a constant function
            if not isinstance(out, Value):
                raise TypeError(f"{self.__name__}() must return a Value (or a number), got {type(out).__name__}")
            return inputs, out
        return inputs, self.fn(*inputs)  # raises the error for the user to see


def jit_source(program):
    """The jit module's C: templates/jit.c around the graph."""
    inline = len(program.forward) + len(program.backward) <= INLINE_STATEMENTS
    constants = "\n".join([*contract.module_names(MODULE_NAME), contract.inline_graph(inline)])
    return templates.fill("jit.c", CONSTANTS=constants, GRAPH=emit.standalone(program, thread_pool=True))


def _check_out(what, array, shape):
    if not isinstance(array, np.ndarray) or array.dtype != np.float64 or array.shape != shape or \
            not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError(f"out: {what} must be a writable C-contiguous float64 array of shape {shape}, got "
                         + (f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__))


def _numeric(a):
    return isinstance(a, (int, float, np.ndarray, np.generic, list, tuple)) and not isinstance(a, bool)
