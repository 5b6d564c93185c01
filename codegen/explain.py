"""What the compiler made of a graph: the lowered program's groups (loop nests and single
statements), counted, listed and drawn, so that a user sees why a model compiles fast or slow.

    print(codegen.explain(loss, inputs, params, outputs))
    codegen.explain(loss, inputs, params, outputs).draw("program.svg")
"""

from dataclasses import dataclass

from micrograd_c.draw import render
from micrograd_c.engine import value_count

import templates

from .lower import batch as batching, ir
from .lower.types import OP, Bounded
from .write import dtypes, emit, optim
from .write.convolution import convolution
from .write import table as tables
from .backend import targets


@dataclass
class Step:
    """One group of the lowered program: what it computes, over which loop nest."""
    index: int
    what: str          # e.g. "relu", "sum of 1 term + 784 products"
    shape: tuple       # loop extents, outermost first; () for a single statement
    nodes: int         # graph nodes it computes
    reads: list        # indices of the steps whose results it reads
    phase: str         # "outputs" (predict runs it) or "loss"

    @property
    def loop(self):
        return bool(self.shape)


@dataclass
class Explanation:
    values: int        # Values in the graph
    steps: list
    c_lines: int       # generated C (the kernels' fixed prelude excluded)
    program: object    # the ir.Program
    batched: str = ""  # whether train() and predict() run whole batches, or why not
    vectors: str = ""  # with target=: what the loops become on that machine (codegen/backend/targets.py)
    straight_line: str = ""  # what the single statements became (functions, backward copies, or rows of a table)
    positions: str = ""  # whether a sequence's loops stop at the sample's length (lower/positions.py), or why not

    @property
    def loops(self):
        return [s for s in self.steps if s.loop]

    def summary(self):
        single = len(self.steps) - len(self.loops)
        covered = sum(s.nodes for s in self.loops)
        return (f"{self.values:,} Values -> {sum(s.nodes for s in self.steps):,} nodes after fusing sums -> "
                f"{len(self.steps):,} steps: {len(self.loops):,} loop nests ({covered:,} nodes) and "
                f"{single:,} single statements; {self.c_lines:,} lines of generated C; {self.straight_line}; "
                f"{self.batched}" + (f"; {self.positions}" if self.positions else "")
                + (f"; {self.vectors}" if self.vectors else ""))

    def __str__(self):
        rows = [f"{'#':>4}  {'computes':<40} {'loop nest':<16} {'nodes':>9}  reads"]
        for s in self.steps:
            shape = " x ".join(map(str, s.shape)) if s.shape else "-"
            rows.append(f"{s.index:>4}  {s.what:<40} {shape:<16} {s.nodes:>9,}  {', '.join(map(str, s.reads))}")
        return self.summary() + "\n" + "\n".join(rows)

    def to_dot(self):
        lines = ["digraph program {", "  rankdir=LR;", '  node [shape=record, fontname="monospace"];']
        for s in self.steps:
            shape = " x ".join(map(str, s.shape)) if s.shape else "single"
            style = ', style=filled, fillcolor="#d8ecd8"' if s.loop else ""
            lines.append(f'  s{s.index} [label="{{#{s.index} {s.what} | {shape} | {s.nodes:,} nodes}}"{style}];')
            lines += [f"  s{r} -> s{s.index};" for r in s.reads]
        lines.append("}")
        return "\n".join(lines)

    def draw(self, path, format=None):
        """The program as a picture (svg or png), loop nests shaded, an edge per group read."""
        return render(self.to_dot(), path, format, "explain.draw")


def explain(loss, inputs=(), params=(), outputs=(), fuse=True, input_grads=False, target=None, optimizer=None,
            table=None, batch=batching.DEFAULT_CAPACITY, dtype=dtypes.DEFAULT.name):
    """The lowered program of `loss` as compile() would build it, step by step; with target (a zig
    triple of codegen.backend.targets.TARGETS), also the vectors its exported loops get there; optimizer
    (compile()'s: None is plain SGD) decides how many copies of backward the module has, table
    (compile()'s) whether its single statements become rows of a table (codegen/write/table.py; None:
    as compile() decides for an optimising compiler, and the summary says why); batch and dtype
    (compile()'s) how many samples a batched pass holds (codegen/lower/batch.py's pass_capacity)."""
    vectors = f"vectors on {target}: {targets.lookup(target).vectors}" if target is not None else ""
    batch, itemsize = batching.check_capacity(batch), dtypes.lookup(dtype).numpy.itemsize
    program = ir.lower(loss, inputs, params, outputs, fuse=fuse, input_grads=input_grads)
    step_of = {}
    for i, g in enumerate(program.forward):
        for node in g.members:
            step_of[id(node)] = i
    steps = []
    for i, g in enumerate(program.forward):
        reads = sorted({step_of[id(x)] for node in g.members for x in node.reads() if id(x) in step_of} - {i})
        steps.append(Step(i, _what(g.first), tuple(f"<={int(n)}" if isinstance(n, Bounded) else n
                                                   for n in g.shape), len(g.members), reads,
                          "outputs" if g.first.for_outputs else "loss"))
    plan = tables.plan(program) if tables.chosen(program, tables.check(table)) else None
    c_lines = len(emit.standalone(program, plan=plan).splitlines()) - len(templates.read("prelude.c").splitlines())
    values = value_count(*outputs, loss)
    batched, why_not = ((None, "the table form") if plan
                        else batching.batched_form(program, batch, itemsize))
    how = (f"batched over up to {batched.capacity} samples (train() with batch_size > 1, predict())"
           + _convolutions(batched) + _gradients(batched) if batched
           else f"no batched form ({why_not}): train() and predict() run sample by sample")
    sequence = (f"loops stop at each training sample's length (one past its last nonzero loss weight, of "
                f"{len(program.sequence.weights)})" if program.sequence
                else f"every position computed ({program.unbounded})" if program.unbounded else "")
    return Explanation(values, steps, c_lines, program, how, vectors,
                       (_table(plan) if plan else _straight_line(program, optim.check(optimizer)))
                       + (f" ({tables.reason(program, table)})" if plan or emit.straight_line_code(program) else ""),
                       sequence)


def _convolutions(batched):
    """Which steps run over the batch as convolution kernels (codegen/write/convolution.py)."""
    steps = [i for i, g in enumerate(batched.forward) if convolution(g)]
    if not steps:
        return ""
    return (f"; step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))} a convolution over the batch "
            "(conv_set, conv_nt, conv_acc: templates/kernels/conv.c)")


def _gradients(batched):
    """How much of the batch's gradient memory its gradients take (codegen/lower/gradients.py)."""
    if batched.gradients is None:
        return ""
    share = (batched.gradients.n_slots - batched.n_params) / (batched.constants_base - batched.n_params)
    return f"; its gradients in {share:.0%} of its values' slots (those live at different times share)"


def _table(plan):
    """What compile() makes of a program in the table form."""
    return (f"the table form: {plan.rows:,} rows (single statements and loop nests of at most "
            f"{tables.LOOP_MAX_MEMBERS} nodes, forward and backward) in {plan.runs:,} runs of one kind each, "
            f"run by the module runtime's loops; {len(plan.compiled):,} groups compiled as C")


def _straight_line(program, optimizer):
    """What compile() makes of the program's statements: functions of how many, and how many
    copies of backward (emit.emit: SGD inside backward only for plain SGD)."""
    functions = f"statements in functions of at most {emit.chunk_statements(program)}"
    if emit.straight_line_code(program):
        return (f"mostly single statements: backward written once (batch-1 SGD steps after it), {functions}, "
                "their extra units built by gcc at -O1 at most")
    if program.sgd_in_backward and optimizer.plain_sgd:
        return (f"backward written two or three times (plain, with batch-1 SGD in it, the step API's when it "
                f"tracks rows), {functions}")
    return f"backward written once, {functions}"



def _what(node):
    if node.kind == OP:
        return node.op.name if node.k is None else f"{node.op.name} {node.k:g}"
    return f"sum of {len(node.args)} term{'s' * (len(node.args) != 1)} + {len(node.a)} products"
