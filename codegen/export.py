"""Models out of Python: a Value graph as plain C99 files with no Python and no allocation.

    codegen.export(loss, inputs=xs + ys, params=model.parameters(), outputs=logits,
                   path="out", name="mnist")                 # out/mnist.c, out/mnist.h: training
    codegen.export(loss, inputs=xs, params=model.parameters(), outputs=logits,
                   path="out", name="mnist_frozen", frozen=True)   # only mnist_frozen_predict()

    codegen.export(..., target="aarch64-linux-musl")   # also out/aarch64-linux-musl/: libmnist.a, mnist

The graph's C is codegen.write.emit.standalone(); templates/export/ wraps it in the API. Beside the
files goes freestanding/ (math.h, string.h), for building with no libc (WebAssembly). With a
target, codegen/backend/targets.py builds them for that machine with zig cc.
"""
from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

import numpy as np

import templates

from .write import emit
from .lower import ir
from .backend import targets
from .write.dtypes import c_literal

FREESTANDING_HEADERS = ("math.h", "string.h")


@dataclass(frozen=True)
class Exported:
    source: pathlib.Path      # DIR/<name>.c
    header: pathlib.Path      # DIR/<name>.h
    freestanding: pathlib.Path  # DIR/freestanding: the headers for builds with no libc
    n_inputs: int
    n_outputs: int
    n_params: int             # 0 when frozen: the parameters are constants in the code
    build: targets.TargetBuild | None = None  # with target=: the library and program built for it


def export(loss, inputs=(), params=(), outputs=(), path=".", name="model", frozen=False, fuse=True, target=None,
           opt=2, fma=False):
    """Writes path/<name>.c and path/<name>.h (and path/freestanding/) computing the graph.

    frozen=False: the training step, with <name>_init, _set_input, _forward, _outputs, _backward,
    _zero_grad, _update, _params and _param_grads over a caller-owned <name>_state; the
    parameters start at the Values' current .data.
    frozen=True: inference only, <name>_predict(const double *in, double *out); the parameters'
    current values become constants in the code, and `out` receives `outputs` (or the loss when
    none are given). The code is then straight-line: each weight is a literal the compiler folds
    into an instruction (dot-product fusion only fuses products of two slots).
    target: a zig triple of codegen.backend.targets.TARGETS (e.g. "aarch64-linux-musl"): also builds, with
    zig cc -O<opt>, path/<target>/lib<name>.a and the command-line program path/<target>/<name>
    (templates/export/*_main.c); Exported.build says where, and how to run it. fma=True lets
    the compiler fuse multiply-adds where the target has them (then the numbers differ from the
    host's in the last bits).
    """
    if target is not None:
        targets.check(target, opt)  # a bad name or level fails before any work
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"name must be a C identifier, got {name!r}")
    inputs, params, outputs = list(inputs), list(params), list(outputs)
    directory = pathlib.Path(path)
    if frozen:
        outputs = outputs or [loss]
        # the params are ordinary leaves, so constants; the loss is not needed, only the outputs
        program = ir.lower(outputs[0], inputs, (), outputs, fuse=False)
        values = {"N_SLOTS": program.n_slots}
        kind = "frozen"
    else:
        program = ir.lower(loss, inputs, params, outputs, fuse=fuse)
        initial = [float(v.data) for v in params + inputs]
        values = {"N_SLOTS": program.n_slots, "N_PARAMS": len(params),
                  "INITIAL": _wrap([c_literal(x) for x in initial] + ["0.0"])}
        kind = "trainable"
    values.update(NAME=name, UPPER=name.upper(), GUARD=f"{name.upper()}_H", N_INPUTS=len(inputs),
                  N_OUTPUTS=len(program.outputs))
    graph = emit.standalone(program)
    directory.mkdir(parents=True, exist_ok=True)
    source, header = directory / f"{name}.c", directory / f"{name}.h"
    header.write_text(templates.fill(f"export/{kind}.h", **values))
    source.write_text(templates.fill(f"export/{kind}.c", **values, GRAPH=graph))
    freestanding = directory / "freestanding"
    freestanding.mkdir(exist_ok=True)
    for header_name in FREESTANDING_HEADERS:
        (freestanding / header_name).write_text(templates.read(f"freestanding/{header_name}"))
    build = None
    if target is not None:
        main = templates.fill(f"export/{kind}_main.c", NAME=name, UPPER=name.upper())
        build = targets.build(source, main, name, target, opt=opt, fma=fma)
    return Exported(source, header, freestanding, len(inputs), len(program.outputs),
                    0 if frozen else len(params), build)


def _wrap(literals, per_line=6):
    return ",\n".join("    " + ", ".join(literals[i:i + per_line]) for i in range(0, len(literals), per_line))


def module_steps(net, rows, lr):
    """The reference for an exported trainable program: the same SGD steps by a compiled module
    (one per row, through its step API), from its parameters. (losses, final parameters)."""
    losses = []
    for row in rows:
        net.set_input(row)
        losses.append(net.forward())
        net.zero_grad()
        net.backward()
        net.update(lr)
    return np.array(losses), np.array(net.params)


# How far a target's numbers may be from the host module's (docs/export.md): its libm is musl's,
# whose exp is 1 ulp from glibc's for about 10% of arguments, and the frozen code sums left to
# right. Losses within LOSS_BOUND relative, or LOSS_ATOL: a loss of 1e-4 is -log of a probability
# near 1, one ulp of which is 1.1e-16 of loss (measured on MNIST: 2.2e-16, 1.9e-12 relative, in
# 1,000 steps); outputs within OUTPUT_BOUND.
LOSS_BOUND, LOSS_ATOL, OUTPUT_BOUND = 1e-12, 1e-15, 1e-12


def losses_agree(losses, expected):
    """Whether every loss is within LOSS_BOUND relative or LOSS_ATOL of the expected one."""
    losses, expected = np.asarray(losses), np.asarray(expected)
    return len(losses) == len(expected) and bool(np.all(np.abs(losses - expected)
                                                        <= LOSS_ATOL + LOSS_BOUND * np.abs(expected)))
