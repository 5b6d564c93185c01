"""A lowered Program to the C sources of an extension module (or of exported C): each group's
statements (codegen/write/forward.py and backward.py, whose loop nests and kernel calls
codegen/write/loops.py writes, codegen/write/tree.py renders) cut
into functions of at most `chunk` statements, because optimising compilers slow down
superlinearly on huge basic blocks, and big programs into several C files that the toolchain
compiles in parallel; the layout's #defines (codegen/write/contract.py), the tables, and the
templates filled around them (templates/model.c, the prelude). A module's sources end with the
module runtime (templates/runtime.c), the same C for every model of a dtype, which the toolchain
compiles once and keeps. Per-op C comes from the op table (micrograd_c/ops.py).
"""

import dataclasses

import templates

from . import contract, dtypes, optim, table as tables, tree
from ..lower import ir
from .backward import Backward, Plain, SgdInBackward, Tracked
from .dtypes import c_literals
from .forward import Forward
from .kernels import Call
from .loops import gradients_placed
from .sides import Shared, SideTables

# Statements per generated function: gcc/clang -O1 take superlinear time in a function's size.
CHUNK_STATEMENTS = 200
# Statements per function in a program that is mostly single statements (ir.straight_line_heavy,
# fused): GCC -O2 on a random 5,000-Value graph's unit takes 8 s of CPU in functions of 40 where
# it took 11 s in functions of 200 (alias walking and PRE grow with a function's statements,
# which here are many memory accesses each); the loops of other programs keep CHUNK_STATEMENTS.
STRAIGHT_LINE_CHUNK_STATEMENTS = 40
# Lines per generated function past its first statement: microgpt's backward was one function of
# 650 lines of loop nests (under 200 statements) that held up its build's parallel units; cut
# into functions of 150 lines, gcc -O2 built microgpt in 1.41 s where one unit took 1.90 s and
# units without this cut 1.76 s (medians of 5, Zen 3, 2 cores)
CHUNK_LINES = 150
# The generated functions go into C files of their own, compiled in parallel (a compiler's time
# follows a unit's size, not its statements: a loop nest is one statement and dozens of lines):
# as many files as UNIT_LINES lines make, at most MAX_UNITS, unless files of UNIT_MAX_LINES need
# more (each in bounded compiler memory). microgpt's 1,800 lines of loop nests in one unit took
# gcc -O2 4.2-4.4 s of CPU, in four (the backward's lines cost more) 0.8-2.2 s each (Zen 3,
# shared); each file pays its prelude's parse (~0.1 s), hence the cap.
UNIT_LINES, MAX_UNITS, UNIT_MAX_LINES = 500, 8, 20_000
# From this many generated statements (a loop nest counts one), the generated functions go into a
# file of their own even when they fit one, compiled in parallel with the module's skeleton and
# kernels, which take about half of a fused module's compile time: gcc -O3 -march=native on 2
# cores, 0.66 -> 0.49 s (the zoo's demo), 0.85 -> 0.66 s (MLP(784, [128, 64, 10])), the same
# training speed (MNIST epoch 0.99x gcc, 1.00x clang, paired).
PARALLEL_MIN_STATEMENTS = 16


def _functions(name, params, statements, chunk):
    """C functions of at most `chunk` statements each, as (definition, declaration, statement
    count) triples, and the driver `name` that calls them in order (statements: codegen/write/tree.py's).
    A table.TableCall among the statements is a call in the driver itself, between the functions before and after it."""
    args = tuple(p.split()[-1].lstrip("*") for p in params)
    pieces, calls, run = [], [], []

    def close():
        for body in _chunks(run, chunk):
            function = tree.Function(f"{name}_{len(pieces)}", tuple(params), tuple(body), "CHUNK void")
            calls.append(tree.Invoke(function.name, args))
            pieces.append((tree.render(function) + "\n", tree.prototype(function), len(function.body)))
        run.clear()
    for statement in statements:
        if isinstance(statement, tables.TableCall):
            close()
            calls.append(statement.statement())
        else:
            run.append(statement)
    close()
    return pieces, tree.render(tree.Function(name, tuple(params), tuple(calls))) + "\n"


def _chunks(statements, chunk):
    """The statements cut into runs of at most `chunk` statements and, past one, CHUNK_LINES lines
    (a loop nest is one statement of dozens of lines)."""
    runs, lines = [[]], 0
    for statement in statements:
        n = tree.line_count(statement)
        if runs[-1] and (len(runs[-1]) >= chunk or lines + n > CHUNK_LINES):
            runs.append([])
            lines = 0
        runs[-1].append(statement)
        lines += n
    return [run for run in runs if run]


def _units(pieces, unit):
    """The chunk functions packed in order into groups whose largest compile time (_compile_cost)
    is the least it can be: one per `unit` lines, at most MAX_UNITS unless groups of
    UNIT_MAX_LINES need more (they compile side by side, so the largest is the build's time)."""
    lines = sum(piece[0].count("\n") for piece in pieces)
    count = min(-(-lines // unit), max(MAX_UNITS, -(-lines // UNIT_MAX_LINES)))
    costs = [_compile_cost(piece[0]) for piece in pieces]

    def packed(most):  # (in order, each unit filled up to `most`)
        units, cost = [[]], 0
        for piece, n in zip(pieces, costs):
            if units[-1] and cost + n > most:
                units.append([])
                cost = 0
            units[-1].append(piece)
            cost += n
        return units

    low, high = max(costs, default=0), sum(costs)  # the least `most` that needs no more than count units
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if len(packed(middle)) <= max(1, count) else (middle + 1, high)
    return packed(low)


def _apart(units, batched):
    """units with the one that holds the batched program's first function (batched[0]: the last
    pieces are its functions) after others cut in two there: a unit of the batched program's loops
    alone takes vectors of a pass's lanes (templates.LoopSource's lane_bytes)."""
    for k, group in enumerate(units):
        for cut, piece in enumerate(group):
            if piece is batched[0]:
                return units if cut == 0 else [*units[:k], group[:cut], group[cut:], *units[k + 1:]]
    return units


def _compile_cost(definition):
    """A generated function's share of its unit's compile time: its slot accesses (each one `[`).
    A C compiler's time follows them, not lines: microgpt's functions took gcc -O2 -mavx2 1.1-2.3 ms
    of CPU an access and 0.8-4.0 ms a line (a forward of 53 loops over 141 lines, 4.0 ms a line;
    a backward of 150 lines, 1.6 ms), so that units of equal lines took 1.2 and 0.74 s (Zen 3)."""
    return definition.count("[")


def emit(program, module_name, chunk=CHUNK_STATEMENTS, unit=UNIT_LINES, optimizer=None,
         initial_params=None, dtype=dtypes.DEFAULT.name, sparse_inputs=False, batched=None, table=False):
    """The C sources of the extension module `module_name` computing `program`: the module
    itself, then (for big programs) extra units of generated functions compiled alongside.
    optimizer: a codegen.write.optim description (None: SGD); initial_params: values every load of
    the module starts its parameters from (None: zeros); dtype: a name of codegen/write/dtypes.py, the
    element type of the whole state, the kernels and the module's views; sparse_inputs: dots
    that read an input range skip its chunks of zeros when most of them are (dense inputs keep
    the dense kernels); batched: the program's codegen.lower.types.BatchedProgram (train() and
    predict() run whole batches through it), or None; table: whether the program's single statements
    become rows that the runtime's loops run (codegen/write/table.py: table.chosen decides; such a
    program has no batched form), or the rows themselves, a table.Plan of the program (the first
    tier's, codegen/write/graph_rows.py)."""
    module = contract.Module(module_name, optim.check(optimizer),
                             None if initial_params is None else tuple(initial_params))
    if program.sgd_in_backward and not module.optimizer.plain_sgd:  # (its backward copies would never run)
        program = dataclasses.replace(program, sgd_in_backward=False, sgd_after_backward=[])
    if initial_params is not None and len(initial_params) != program.n_params:
        raise ValueError(f"{len(initial_params)} initial parameter values for {program.n_params} parameters")
    if table and batched is not None:
        raise ValueError("a program in the table form has no batched form")
    graph, extra = _render(program, chunk, unit, module=True, thread_pool=True, dtype=dtype, sparse_inputs=bool(sparse_inputs),
                           batched=batched, plan=table if isinstance(table, tables.Plan) else tables.plan(program) if table else None)
    return [templates.fill("model.c", CONSTANTS=module.render(), GRAPH=graph)] + extra + runtime_sources(dtype)


def runtime_sources(dtype=dtypes.DEFAULT.name):
    """The module runtime for modules of element type `dtype`: templates/runtime.c, then the unit
    of its matrix products (templates/products.c): the same C for every model, which the toolchain
    compiles once per compiler and flags (templates.SharedSource), the two units side by side."""
    real = dtypes.lookup(dtype)
    return [templates.SharedSource(templates.fill("runtime.c", PRELUDE=_prelude(real, True, contract.RUNTIME_HAS_PRODUCTS),
                                                  **tables.runtime_cases(dtype))),
            templates.SharedSource(templates.fill("products.c",
                                                  PRELUDE=_prelude(real, True, contract.RUNTIME_DEFINES_PRODUCTS)))]


def _prelude(dtype, thread_pool, products=contract.STATIC_PRODUCTS, vectorise_loops=False):
    """What every generated C file starts with: what the prelude reads (codegen/write/contract.py's
    Prelude), then templates/prelude.c."""
    return contract.Prelude(dtype, thread_pool, products, vectorise_loops).render() + templates.read("prelude.c")


def standalone(program, chunk=CHUNK_STATEMENTS, thread_pool=False, plan=None):
    """The graph as one C source with no Python in it: the prelude and kernels, the layout
    #defines (N_SLOTS, N_PARAMS, N_INPUTS, INPUT_BASE, LOSS_SLOT, N_OUTPUTS, OUTPUT_SLOTS,
    SGD_IN_BACKWARD) and the functions forward_outputs(d), forward_rest(d), backward_body(d, g)
    and backward_sgd_body(d, g, lr) (static). For exporting a model out of Python; with
    thread_pool, for a module that includes templates/pool.c (codegen.jit). plan: the program's
    table form (codegen.explain counts its lines; its passes call the module runtime's loops)."""
    graph, _ = _render(program, chunk, unit=None, module=False, thread_pool=thread_pool, plan=plan)
    return graph


def straight_line_code(program):
    """Whether `program` is mostly single statements (an irregular graph's, fused): its functions
    hold fewer statements, and its units are templates.StraightLineSource."""
    return program.fused and ir.straight_line_heavy(program)


def chunk_statements(program, chunk=CHUNK_STATEMENTS):
    """The most statements a generated function of `program` holds: fewer in straight-line code."""
    return min(chunk, STRAIGHT_LINE_CHUNK_STATEMENTS) if straight_line_code(program) else chunk


def _render(program, chunk, unit, module, thread_pool, dtype=dtypes.DEFAULT.name, sparse_inputs=False, batched=None,
            plan=None):
    """(the graph's C: prelude, layout #defines, tables, functions, drivers; the extra units).
    module: an extension module's graph (its input lists, the step API's tables and tracked
    backward, the batch layout; products from its runtime), or standalone C (exported, jit: none
    of those, products defined in the file). thread_pool: the products run on templates/pool.c's
    threads. sparse_inputs (modules only): dots over an input range use its nonzero list
    (scan_nonzeros and the words after d's slots). plan: the program's table form (table.plan), or None."""
    dtype = dtypes.lookup(dtype)
    chunk = chunk_statements(program, chunk)
    straight_line = plan is None and straight_line_code(program)
    if plan is not None:
        program = plan.program
    shared = Shared()  # (the batched program's statements use the same offset tables and epilogues)
    sides = SideTables(program, shared, sparse_inputs)
    # the batched program's: the inputs' row lists with sparse inputs
    batch_sides = SideTables.batched(batched, shared, sparse_inputs) if batched else None
    forward, backward_of = Forward(program, sides, dtype), Backward(program, sides, dtype)
    # A module's backward leaves its gradients 0 for the next pass (backward.Plain), so that the
    # runtime need not clear them all before it: a sequence's, and a fused program's that is not
    # straight-line code (micrograd's demo, whose 7,342 slots the runtime cleared before each
    # backward: 0.92x the step with gcc -O3 -march=native, 0.94x with clang; the zoo's CNN and MLPs
    # 0.98-1.00x; not a random irregular graph's straight-line C, a statement more a node: 1.04x
    # at 5,000 Values). Not with the inputs' gradients, leaves that no group reads and clears.
    clears = (module and plan is None and not program.input_grads
              and (program.sequence is not None or (program.fused and not straight_line)))
    if plan is None:
        forward_outputs = forward.pass_(program.forward[:program.n_output_groups])
        forward_rest = forward.pass_(program.forward[program.n_output_groups:])
        backward = backward_of.pass_(program.backward, Plain(clears))
    else:
        forward_outputs, forward_rest = (_with_table(plan.passes[name], forward.pass_)
                                         for name in ("forward_outputs", "forward_rest"))
        backward = _with_table(plan.passes["backward"], lambda groups: backward_of.pass_(groups, Plain()))
    backward_sgd = backward_of.pass_(program.backward, SgdInBackward(clears)) if program.sgd_in_backward else []
    # The step-by-step API's backward (modules only): the tracked rows' (sgd_in_backward); and
    # where backward_body clears, one that does not, so that after backward() `grad` holds every
    # gradient, as micrograd's Values do (but a sequence's, whose step cleared them before);
    # otherwise backward_body itself
    step_backward = module and clears and program.sequence is None
    backward_tracked = backward_of.pass_(program.backward, Tracked(sides)) \
        if module and (program.sgd_in_backward or step_backward) else []
    d, dg = ["real *restrict d"], ["real *restrict d", "real *restrict g"]
    tracking = ["uint64_t *restrict stamp", "real *restrict rank1", "real *restrict snap", "uint32_t *restrict live",
                "uint64_t gen"]
    pieces, drivers = [], []
    passes = [("forward_outputs", d, forward_outputs), ("forward_rest", d, forward_rest),
              ("backward_body", dg, backward), ("backward_sgd_body", dg + ["real lr"], backward_sgd),
              *([("backward_tracked_body", dg + tracking, backward_tracked)] if sides.tracked_rows or step_backward else [])]

    def write(functions_of):
        for name, params, statements in functions_of:
            functions, driver = _functions(name, params, statements, chunk)
            pieces.extend(functions)
            drivers.append(driver)
    write(passes)
    unbatched = len(pieces)
    with gradients_placed(batched and batched.gradients):  # (its statements made and written in it)
        write(_batched_functions(batch_sides, dtype))
    lane_bytes = batched.capacity * dtype.numpy.itemsize if batched else None
    units = _units(pieces, unit) if unit else [pieces]
    narrow = lane_bytes is not None and lane_bytes < templates.WIDEST_VECTOR_BYTES
    if unit and narrow and unbatched < len(pieces):
        units = _apart(units, pieces[unbatched:])
    # a module's units call the products its runtime defines
    prelude = _prelude(dtype, thread_pool, contract.RUNTIME_HAS_PRODUCTS if module else contract.STATIC_PRODUCTS,
                       vectorise_loops=program.sequence is not None)
    layout = "\n".join([
        contract.Layout.of(program, clears).render(),
        _constants(program.constants, dtype),
        *([contract.TableForm.of(plan).render()] if plan is not None else []),
        *([contract.Words("NONZERO_WORDS", sides.nonzero_words()).render(),
           _scan("scan_nonzeros", ["real *restrict d"], sides.nonzero_scans()),
           contract.StepTables.of(program, sides.tracked_rows, step_backward).render()] if module else []),
        *([_batch_layout(batch_sides, dtype)] if module else []),
    ])
    epilogues = _epilogue_definitions(shared.epilogues)
    if not unit or (len(units) == 1 and sum(p[2] for p in pieces) < PARALLEL_MIN_STATEMENTS):
        graph = [prelude, layout, shared.offsets.render(), epilogues, *(p[0] for p in pieces), *drivers]
        return "\n".join(graph), []
    graph = [prelude, layout, shared.offsets.render(), *(p[1] for p in pieces), *drivers]
    extra = [prelude + "\n" + shared.offsets.render(declare=True) + "\n" + epilogues + "\n"
             + "\n".join(p[0] for p in group) for group in units]
    # the units of an irregular graph's passes (not the batched program's loops over a batch)
    straight = {id(p) for p in pieces[:unbatched]} if straight_line else set()
    # and the batched program's, each of whose loops runs over a pass's lanes
    lanes = {id(p) for p in pieces[unbatched:]}
    return "\n".join(graph), [templates.StraightLineSource(text) if all(id(p) in straight for p in group)
                              else templates.LoopSource(text, lane_bytes if all(id(p) in lanes for p in group) else None)
                              for text, group in zip(extra, units)]


def _with_table(items, statements):
    """A pass of the table form: the statements of its compiled groups (`statements` of a list of
    them) with its table.TableCalls in place."""
    out, groups = [], []
    for item in items:
        if isinstance(item, tables.TableCall):
            out += statements(groups)
            groups = []
            out.append(item)
        else:
            groups.append(item)
    return out + statements(groups)


def _constants(constants, dtype, name="init_constants", table="CONSTANT_VALUES"):
    """init_constants(d): writes the constants that loops read into their slots (consecutive)."""
    if not constants:
        return tree.render(tree.Function(name, ("real *d",), (tree.Unused(("d",)),), inline=True))
    copy = tree.Invoke("memcpy", (f"d + {constants[0][0]}", table, f"sizeof {table}"))
    return (contract.constant_values(table, c_literals([v for _, v in constants], dtype)) + "\n"
            + tree.render(tree.Function(name, ("real *d",), (copy,), inline=True)))


def _batched_functions(sides, dtype):
    """(name, parameters, statements) of the batched program's functions (codegen/lower/batch.py):
    forward_outputs_batch(d, nb), forward_rest_batch(d, nb), backward_batch(d, g, nb, rate) (rate:
    0, or the SGD step's, which it takes on sides.stepped); sides: its side tables, or None."""
    if sides is None:
        return []
    batched = sides.program
    forward, backward = Forward(batched, sides, dtype), Backward(batched, sides, dtype)
    outputs, rest = batched.forward[:batched.n_output_groups], batched.forward[batched.n_output_groups:]
    d, dg = ["real *restrict d", "long nb"], ["real *restrict d", "real *restrict g", "long nb"]
    return [("forward_outputs_batch", d, forward.pass_(outputs)),
            ("forward_rest_batch", d, forward.pass_(rest)),
            ("backward_batch", dg + ["real rate"], backward.pass_(batched.backward, Plain(batched.backward_clears)))]


def _batch_layout(sides, dtype):
    """The batched program's layout (codegen/write/contract.py's BatchLayout), its constants and
    row lists (templates/batch.c; sides: its side tables, filled when its functions were written),
    or none."""
    if sides is None:
        return contract.BatchLayout.render_none()
    return "\n".join([
        contract.BatchLayout.of(sides.program, sides.stepped, sides.overwritten).render(),
        _constants(sides.program.constants, dtype, "init_batch_constants", "BATCH_CONSTANT_VALUES"),
        contract.Words("BATCH_LIST_WORDS", sides.row_list_words()).render(),
        _scan("scan_batch_rows", ["real *restrict d", "long nb"], sides.row_scans()),
    ])


def _scan(name, params, calls):
    """A scan of the inputs into their lists (sides.SideTables's nonzero_scans, row_scans)."""
    return tree.render(tree.Function(name, tuple(params), (*calls, tree.Unused(tuple(p.split()[-1] for p in params)))))


def _epilogue_definitions(epilogues):
    """The epilogues' C (templates/epilogue.c; static: each unit that calls one defines it): a
    statement over element n in a loop, or a row kernel's call over the row."""
    def body(statement):
        if isinstance(statement, Call):
            return f"    {statement.render()}"
        return f"    INDEPENDENT for (long n = 0; n < count; n++)\n        {tree.render(statement)}"
    return "\n".join(templates.fill("epilogue.c", NAME=name, BODY=body(statement)).rstrip("\n")
                     for statement, name in epilogues.items())
