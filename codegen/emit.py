"""Emitter: a lowered Program to the C source of an extension module.

Per-op C comes from the op table (micrograd_c/ops.py); the module skeleton is templates/module.c.
Straight-line code is cut into functions of at most `chunk` statements, because optimising
compilers slow down superlinearly on huge basic blocks, and big programs into several C files
that the toolchain compiles in parallel.
"""

import math
from importlib import resources

from . import optim

# Statements per generated function: gcc/clang -O1 take superlinear time in a function's size.
CHUNK_STATEMENTS = 200
# Statements per C file: big programs become several files, compiled in parallel, each in
# bounded compiler memory.
UNIT_STATEMENTS = 20_000


def c_literal(x):
    """A C double literal for x that reads back exactly; negative ones parenthesised so that
    `-{a}` never turns into `--`."""
    x = float(x)
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    text = repr(x)
    return f"({text})" if x < 0 or text.startswith("-") else text


def _ref(node):
    """A node's value in C: its slot, or a constant's literal."""
    return c_literal(node.value) if node.kind == "const" else f"d[{node.slot}]"


class _IndexTables:
    """Static index arrays for dots whose factors are not contiguous; identical ones shared."""

    def __init__(self):
        self.names = {}

    def __call__(self, slots):
        return self.names.setdefault(tuple(slots), f"idx_{len(self.names)}")

    def render(self, declare=False):
        """Definitions, or the declarations another unit needs to use them."""
        if declare:
            return "\n".join(f"extern SHARED const int32_t {name}[];" for name in self.names.values())
        return "\n".join(f"SHARED const int32_t {name}[] = {{{', '.join(map(str, slots))}}};"
                          for slots, name in self.names.items())


def _start_if_contiguous(nodes):
    first = nodes[0].slot
    return first if all(n.slot == first + i for i, n in enumerate(nodes)) else None


class _Emitter:
    def __init__(self, program):
        self.program = program
        self.tables = _IndexTables()

    def _factor_ranges(self, node):
        """(kernel suffix, a operand, b operand) for a dot's factor lists."""
        a0, b0 = _start_if_contiguous(node.a), _start_if_contiguous(node.b)
        if a0 is not None and b0 is not None:
            return "", f"{a0}", f"{b0}"
        return "_gather", self.tables([n.slot for n in node.a]), self.tables([n.slot for n in node.b])

    def forward(self, node):
        if node.kind == "op":
            return f"d[{node.slot}] = {node.op.render(node.op.value, **_operands(node))};"
        parts = [_ref(t) for t in node.args]
        if node.a:
            kind, a, b = self._factor_ranges(node)
            n = len(node.a)
            parts.append(f"dot(d + {a}, d + {b}, {n})" if not kind else f"dot_gather(d, {a}, {b}, {n})")
        return f"d[{node.slot}] = {' + '.join(parts)};"

    def backward(self, node, sgd=False):
        """Statements adding node's gradient into its arguments' gradients. With sgd (see
        sgd_fusable) a contribution to a parameter instead applies `param -= lr * contribution`,
        placed after the statements that still read the parameter's old value."""
        out_grad = f"g[{node.grad_slot}]"
        grads, updates = [], []

        def contribute(to_param, accumulate, update):
            (updates if sgd and to_param else grads).append(update if sgd and to_param else accumulate)

        if node.kind == "op":
            operands = _operands(node, out=f"d[{node.slot}]")
            for arg, formula in zip(node.args, node.op.grads):
                if arg.needs_grad and not arg.shares_grad:
                    local = node.op.render(formula, **operands)
                    term = out_grad if local == "1" else f"({local}) * {out_grad}"
                    contribute(arg.kind == "param", f"g[{arg.grad_slot}] += {term};",
                               f"d[{arg.slot}] -= lr * ({term});")
            return grads + updates
        for t in node.args:
            if t.needs_grad and not t.shares_grad:
                contribute(t.kind == "param", f"g[{t.grad_slot}] += {out_grad};", f"d[{t.slot}] -= lr * {out_grad};")
        if node.a:
            kind, a, b = self._factor_ranges(node)
            n = len(node.a)
            for wrt, other, factors in ((b, a, node.b), (a, b, node.a)):
                if not any(f.needs_grad for f in factors):
                    continue
                if kind:
                    contribute(factors[0].kind == "param", f"axpy_gather(g, {wrt}, {out_grad}, d, {other}, {n});",
                               f"sgd_axpy_gather(d, {wrt}, lr, {out_grad}, {other}, {n});")
                else:
                    contribute(factors[0].kind == "param", f"axpy(g + {wrt}, {out_grad}, d + {other}, {n});",
                               f"sgd_axpy(d + {wrt}, lr, {out_grad}, d + {other}, {n});")
        return grads + updates


def sgd_fusable(program):
    """Whether a batch-1 SGD step can update parameters during backward instead of after it:
    every parameter gets at most one gradient contribution (so `param -= lr * contribution` is
    the whole step, bit for bit), a dot's factor list is all parameters or none, and no
    parameter is itself read as a result."""
    contributions = set()
    for node in program.backward:
        targets = [x for x in node.args if x.needs_grad]
        for factors in (node.a, node.b):
            if any(f.needs_grad for f in factors):
                if len({f.kind == "param" for f in factors}) > 1:
                    return False
                targets += factors
        for t in targets:
            if t.kind == "param":
                if id(t) in contributions:
                    return False
                contributions.add(id(t))
    return all(r.kind != "param" for r in [program.loss, *program.outputs])


def _operands(node, **names):
    """The C for an op's placeholders: {a}, {b} its arguments, {k} its constant."""
    names.update(zip("ab", map(_ref, node.args)))
    if node.k is not None:
        names["k"] = c_literal(node.k)
    return names


def _functions(name, params, statements, chunk):
    """C functions of at most `chunk` statements each, as (definition, declaration, statement
    count) triples, and the driver `name` that calls them in order."""
    args = ", ".join(p.split()[-1].lstrip("*") for p in params)
    signature = ", ".join(params)
    pieces, calls = [], []
    for i in range(0, len(statements), chunk):
        head = f"CHUNK void {name}_{i // chunk}({signature})"
        body = "\n    ".join(statements[i:i + chunk])
        pieces.append((f"{head}\n{{\n    {body}\n}}\n", f"{head};", len(statements[i:i + chunk])))
        calls.append(f"    {name}_{i // chunk}({args});")
    driver = f"static void {name}({signature})\n{{\n" + "\n".join(calls) + "\n}\n"
    return pieces, driver


def _units(pieces, unit):
    """The chunk functions packed in order into groups of about `unit` statements."""
    units, size = [[]], 0
    for piece in pieces:
        if size >= unit:
            units.append([])
            size = 0
        units[-1].append(piece)
        size += piece[2]
    return units


def emit(program, module_name, chunk=CHUNK_STATEMENTS, unit=UNIT_STATEMENTS, optimizer=None,
         initial_params=None):
    """The C sources of the extension module `module_name` computing `program`: the module
    itself, then (for big programs) extra units of generated functions compiled alongside.
    optimizer: a codegen.optim description (None: SGD); initial_params: values every load of
    the module starts its parameters from (None: zeros)."""
    if not module_name.isidentifier() or not module_name.isascii():
        raise ValueError(f"module name must be a C identifier, got {module_name!r}")
    graph, extra = _render(program, chunk, unit)
    constants = "\n".join([
        f'#define MODULE_NAME_STR "{module_name}"',
        f"#define MODULE_INIT PyInit_{module_name}",
        optim.check(optimizer).c_defines(),
    ])
    if initial_params is not None:
        if len(initial_params) != program.n_params:
            raise ValueError(f"{len(initial_params)} initial parameter values for {program.n_params} parameters")
        constants += ("\n#define HAVE_INITIAL_PARAMS 1\nstatic const double INITIAL_PARAMS[] = {"
                      + ", ".join(map(c_literal, initial_params)) + "};")
    module = (_template("module.c").replace("/*@CONSTANTS@*/", constants).replace("/*@GRAPH@*/", graph)
              .replace("/*@OPTIM@*/", _template("optim.c")))
    return [module] + extra


def standalone(program, chunk=CHUNK_STATEMENTS):
    """The graph as one C source with no Python in it: the prelude and kernels, the layout
    #defines (N_SLOTS, N_PARAMS, N_INPUTS, INPUT_BASE, LOSS_SLOT, N_OUTPUTS, OUTPUT_SLOTS,
    SGD_IN_BACKWARD) and the functions forward_outputs(d), forward_rest(d), backward_body(d, g)
    and backward_sgd_body(d, g, lr) (static). For exporting a model out of Python."""
    graph, _ = _render(program, chunk, unit=None)
    return graph


def _render(program, chunk, unit):
    """(the graph's C: prelude, layout #defines, tables, functions, drivers; the extra units)."""
    e = _Emitter(program)
    forward = [e.forward(n) for n in program.forward]
    backward = [line for n in program.backward for line in e.backward(n)]
    # The straight-line scalar mode stays the reference post's plain program (and half the C).
    fused_sgd = program.fused and sgd_fusable(program)
    backward_sgd = [line for n in program.backward for line in e.backward(n, sgd=True)] if fused_sgd else []
    d, dg = ["double *restrict d"], ["double *restrict d", "double *restrict g"]
    pieces, drivers = [], []
    for name, params, statements in [("forward_outputs", d, forward[:program.n_output_nodes]),
                                     ("forward_rest", d, forward[program.n_output_nodes:]),
                                     ("backward_body", dg, backward),
                                     ("backward_sgd_body", dg + ["double lr"], backward_sgd)]:
        functions, driver = _functions(name, params, statements, chunk)
        pieces += functions
        drivers.append(driver)
    units = _units(pieces, unit) if unit else [pieces]
    prelude = _template("prelude.c")
    output_slots = [n.slot for n in program.outputs] or [0]
    layout = "\n".join([
        f"#define N_SLOTS {program.n_slots}",
        f"#define N_PARAMS {program.n_params}",
        f"#define N_INPUTS {program.n_inputs}",
        f"#define INPUT_BASE {program.input_base}",
        f"#define LOSS_SLOT {program.loss.slot}",
        f"#define N_OUTPUTS {len(program.outputs)}",
        f"#define SGD_IN_BACKWARD {int(fused_sgd)}",
        f"static const long OUTPUT_SLOTS[] = {{{', '.join(map(str, output_slots))}}};",
    ])
    if len(units) == 1:
        graph = [prelude, layout, e.tables.render(), *(p[0] for p in pieces), *drivers]
        return "\n".join(graph), []
    graph = [prelude, layout, e.tables.render(), *(p[1] for p in pieces), *drivers]
    extra = [prelude + "\n" + e.tables.render(declare=True) + "\n" + "\n".join(p[0] for p in group)
             for group in units]
    return "\n".join(graph), extra


def _template(name):
    return resources.files("templates").joinpath(name).read_text()
