"""The kernel table (templates/kernels/kernels.h: one prototype per kernel that generated code
calls) and the calls rendered from it by parameter name: call("axpy", y=..., alpha=..., x=...,
n=...) is the C of `axpy(y, alpha, x, n)`, and a missing or unknown argument a TypeError naming
it. Nothing else in codegen writes a kernel's call (tests/test_kernel_table.py checks)."""

import re
from dataclasses import dataclass

import templates

HEADER = "kernels/kernels.h"
_PROTOTYPE = re.compile(r"^(?:KERNEL|static inline|static)\s+(\w+)\s+(\w+)\(([^)]*)\);", re.M)
_PARAMETER = re.compile(r"^(.*?)\s*\b(\w+)$")


@dataclass(frozen=True)
class Kernel:
    """A row of the table: the kernel's name, its C return type, its parameters' (name, C type)."""
    name: str
    returns: str
    parameters: tuple


def parse(text):
    """The rows of a header of prototypes, by name."""
    table = {}
    for returns, name, parameters in _PROTOTYPE.findall(re.sub(r"/\*.*?\*/", "", text, flags=re.S)):
        rows = [_PARAMETER.match(" ".join(p.split())).groups() for p in parameters.split(",")]
        if name in table:
            raise ValueError(f"{HEADER}: {name} declared twice")
        table[name] = Kernel(name, returns, tuple((n, t) for t, n in rows))
    return table


KERNELS = parse(templates.read(HEADER))

# The kernels the module runtime's unit of products defines (templates/products.c: the matrix
# products, the convolutions, the rows' exp, tanh and sigmoid) and the other units of a module only declare
PRODUCTS = ("matmul_set", "matmul_acc", "matmul_nt", "matmul_acc_nt", "conv_set", "conv_nt", "conv_acc",
            "exp_range", "tanh_range", "sigmoid_range", "exp_gather", "tanh_gather", "sigmoid_gather")


def product_declarations():
    """The C declaring PRODUCTS from the table (templates/kernels/gemm.c expands it as
    PRODUCT_DECLARATIONS in the units of a module), written from their prototypes here, once."""
    return " ".join(f"SHARED {k.returns} {k.name}({', '.join(f'{t} {n}' for n, t in k.parameters)});"
                    for k in map(KERNELS.__getitem__, PRODUCTS))


@dataclass(frozen=True)
class Call:
    """A kernel's call, its arguments' C in the kernel's parameter order: an expression as str(),
    a statement (with its `;`) as render()."""
    kernel: Kernel
    arguments: tuple

    def __str__(self):
        return f"{self.kernel.name}({', '.join(self.arguments)})"

    def render(self):
        return f"{self};"


def call(name, **arguments):
    """The call of kernel `name` with each parameter's C given by its name."""
    kernel = KERNELS.get(name)
    if kernel is None:
        raise KeyError(f"no kernel {name!r} in templates/{HEADER}")
    names = [n for n, _ in kernel.parameters]
    missing, extra = [n for n in names if n not in arguments], [n for n in arguments if n not in names]
    if missing or extra:
        raise TypeError(f"{name}: " + "; ".join(([f"missing {', '.join(missing)}"] if missing else [])
                                                + ([f"no parameter {', '.join(extra)}"] if extra else [])))
    return Call(kernel, tuple(str(arguments[n]) for n in names))
