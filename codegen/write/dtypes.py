"""The element types the generated C computes in (codegen.compile's dtype), one row each: what
the emitter writes (literals, calls of the op table's primitives, whether it is the float branch of
templates/prelude.c and optim.c), what the module's views hold, and what the command
lines offer. templates/prelude.c's `#if REAL_IS_FLOAT` switch is the C side of the table: the
row's c_type, buffer_format and math_suffix must be what its branch says (tests/test_float32.py
holds them to it).
"""
import re
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dtype:
    name: str              # codegen.compile's dtype=, the command lines' --dtype
    short: str             # in benchmark labels: gcc-O3-native-f32
    c_type: str            # `real` in the C
    real_is_float: bool    # templates/prelude.c's REAL_IS_FLOAT branch (codegen/write/contract.py's Prelude)
    literal_suffix: str    # of a C literal: 0.1f is the float nearest 0.1
    primitive_prefix: str  # the op table's exp(, log(, tanh(, pow( are called as prefix + name
    math_suffix: str       # of C's math functions for c_type (expf): what prelude.c's real_exp is
    buffer_format: str     # the struct format of the module's views
    numpy: np.dtype


# float32 calls prelude.c's real_exp & co. (expf ...), so that float code does not widen to
# double; float64 keeps the op table's formulas as written (C's double functions).
FLOAT64 = Dtype("float64", "f64", "double", False, "", "", "", "d", np.dtype(np.float64))
FLOAT32 = Dtype("float32", "f32", "float", True, "f", "real_", "f", "f", np.dtype(np.float32))
DTYPES = {row.name: row for row in (FLOAT64, FLOAT32)}
NAMES = tuple(DTYPES)
DEFAULT = FLOAT64
PRIMITIVES = ("exp", "log", "tanh", "pow")  # the op table's calls of C math functions


def lookup(dtype) -> Dtype:
    """The row of a dtype name (or the row itself); ValueError naming the choices otherwise."""
    if isinstance(dtype, Dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    return DTYPES[dtype]


def c_literal(x, dtype=DEFAULT):
    """A C literal for x that reads back exactly in the dtype (float32: an `f` literal, the float
    nearest to x); negative ones parenthesised so that `-{a}` never turns into `--`."""
    return c_literals([x], dtype)[0]


def c_literals(xs, dtype=DEFAULT):
    """c_literal of each of xs (a loop of repr for the finite ones: a graph's many constants)."""
    suffix = lookup(dtype).literal_suffix
    out = []
    for x in map(float, xs):
        if x - x == 0:  # finite
            text = repr(x) + suffix
            out.append(f"({text})" if text[0] == "-" else text)
        elif x != x:
            out.append("NAN")
        else:  # TCC 0.9.27 cannot negate INFINITY in a static initializer (the constants' table,
            # embedded parameters), but folds this division
            out.append("INFINITY" if x > 0 else f"(-1.0{suffix} / 0.0{suffix})")
    return out


_PRIMITIVE_CALL = re.compile(r"\b(" + "|".join(PRIMITIVES) + r")\(")


def formula(dtype, text):
    """An op-table formula for the dtype: its primitives called through the row's prefix."""
    prefix = lookup(dtype).primitive_prefix
    return _PRIMITIVE_CALL.sub(prefix + r"\1(", text) if prefix else text
