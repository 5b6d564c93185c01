"""What a group's statements are before they are C: a small typed tree (assignments, kernel
calls, declarations, loops, blocks and ifs), which codegen/write/forward.py,
codegen/write/backward.py and codegen/write/loops.py build and render() alone writes as C, at the end. Expressions (a
formula's value, a slot's index, a condition) are C text; no code reads them to decide anything.
The functions around them (the chunks codegen/write/emit.py cuts and their drivers, the scans,
init_constants) are nodes too: a Function of statements, an Invoke of another function.

The layout is the generated C's: a function's statements one per line at one indentation, a
block's braces and statements at that same indentation, only the innermost loop's body indented
once more; a block marked inline, and what it holds, on one line.
"""

from dataclasses import dataclass

from ..lower.types import ActiveBatch, Bounded, Parts
from .kernels import Call


@dataclass(frozen=True)
class Assign:
    """`target op value;`: op "=", "+=" or "-="."""
    target: str
    value: str
    op: str = "="


@dataclass(frozen=True)
class Declare:
    """`real name = 0, ...;`: registers that sum a loop's terms."""
    names: tuple


@dataclass(frozen=True)
class Held:
    """`real name[rows][lanes];`: sums over a loop, a row each, kept across it (codegen/write/triangle.py)."""
    name: str
    rows: int
    lanes: int


@dataclass(frozen=True)
class ReadGradient:
    """Backward's first statement: `go`, the group's gradient, read from its slot."""
    at: str


@dataclass(frozen=True)
class ClearGradient:
    """The group's gradient set back to 0 once read (codegen/write/backward.py's Plain, clears);
    `slot`, its Affine (a nest of clears alone may be kernel calls: loops.cleared)."""
    at: str
    slot: object = None


@dataclass(frozen=True)
class Copy:
    """`n` reals copied from `source` to `to` (pointers)."""
    to: str
    source: str
    n: int


@dataclass(frozen=True)
class Block:
    """Statements in braces."""
    body: tuple
    inline: bool = False


@dataclass(frozen=True)
class If:
    """`if (condition) then`, and `else orelse` when given (a statement, a Block or an If)."""
    condition: str
    then: object
    orelse: object = None


@dataclass(frozen=True)
class Loop:
    """`for` over loop index i<index> from 0 to `extent`: with `braced`, around the statements of
    `body` (indented); without, around its one statement. An extent cut at run time
    (types.Bounded, and a batch's samples that reach a position, types.ActiveBatch) is read once,
    before the loop (the loop's stores to d could change it, for all the compiler knows: GCC
    then vectorises no loop over the batch, its count not computable); a family's loop i0
    (types.Parts) keeps tri0 = i0 * (i0 - 1) / 2 as it goes. `independent`: no iteration reads what another writes, which the C compiler is told
    (INDEPENDENT), so that it vectorises without checking at run time. `full` (a Bounded loop's):
    the C of f<index>, a count of first passes that its first pass takes at once (loops.per_pass).
    `start`: C of where the loop starts, else 0 (a family's i0 from there keeps tri0 from there too)."""
    index: int
    extent: object
    body: tuple
    braced: bool = True
    independent: bool = False
    full: str = None
    start: str = None

    def header(self):
        d, n = self.index, self.extent
        read_once = isinstance(n, (Bounded, ActiveBatch, Count))
        first = 0 if self.start is None else self.start
        start, end = (f"i{d} = {first}, n{d} = {n}", f"n{d}") if read_once else (f"i{d} = {first}", n)
        if self.start is not None and d == 0 and isinstance(n, Parts):
            return f"for (long {start}, tri0 = i0 * (i0 - 1) / 2; i0 < {end}; tri0 += i0, i0++)"
        if self.full:
            return f"for (long {start}, f{d} = {self.full}; i{d} < {end}; i{d} += i{d} < f{d} ? f{d} : 1)"
        header = (f"for (long {start}, tri0 = 0; i0 < {end}; tri0 += i0, i0++)" if d == 0 and isinstance(n, Parts)
                  else f"for (long {start}; i{d} < {end}; i{d}++)")
        return ("INDEPENDENT " if self.independent else "") + header


class Count(str):
    """A loop's extent given as C text, read once before the loop (as a Bounded one)."""


@dataclass(frozen=True)
class Invoke:
    """`function(arguments);` for a function that is not a kernel (kernels.Call is): a generated
    chunk, the runtime's table loops, memcpy."""
    function: str
    arguments: tuple


@dataclass(frozen=True)
class Function:
    """A C function's definition: `qualifiers name(params)` and its statements, one per line in
    braces under it, or with `inline` on its one line. prototype() is its declaration."""
    name: str
    params: tuple
    body: tuple
    qualifiers: str = "static void"
    inline: bool = False

    def head(self):
        return f"{self.qualifiers} {self.name}({', '.join(self.params)})"


def prototype(function):
    """The declaration of a Function: its head and `;`."""
    return f"{function.head()};"


@dataclass(frozen=True)
class Unused:
    """`(void)name; ...`: parameters a function may not read, on one line."""
    names: tuple


@dataclass(frozen=True)
class Seq:
    """Statements that follow each other and count as one (one entry of a generated function)."""
    body: tuple


def nest(shape, body, braced=True, independent=False, first=0):
    """Loops over `shape` (indices i<first>, ...) around `body`: the outer ones each around the
    next, the innermost around body (braced or not; independent or not). No loops: body's one
    statement."""
    if not shape:
        (node,) = body
        return node
    node = Loop(first + len(shape) - 1, shape[-1], tuple(body), braced, independent)
    for d in range(len(shape) - 2, -1, -1):
        node = Loop(first + d, shape[d], (node,), braced=False)
    return node


def line_count(node):
    """How many lines render(node) writes: one for the statements that never break a line (what a
    straight-line program is made of), else counted from the rendering."""
    if isinstance(node, (Call, Assign, ReadGradient, ClearGradient, Invoke, Unused, Declare, Held, Copy)):
        return 1
    return render(node).count("\n") + 1


def render(node, pad="    "):
    """The C of a statement: its lines after the first start with `pad` (None: all on one line)."""
    if isinstance(node, Call):
        return f"{node};"
    if isinstance(node, Assign):
        return f"{node.target} {node.op} {node.value};"
    if isinstance(node, ReadGradient):
        return f"const real go = {node.at};"
    if isinstance(node, ClearGradient):
        return f"{node.at} = 0;"
    if isinstance(node, Invoke):
        return f"{node.function}({', '.join(node.arguments)});"
    if isinstance(node, Unused):
        return " ".join(f"(void){name};" for name in node.names)
    if isinstance(node, Function):
        if node.inline:
            return f"{node.head()} {{ " + " ".join(render(s, None) for s in node.body) + " }"
        return f"{node.head()}\n{{\n" + "\n".join(f"    {render(s)}" for s in node.body) + "\n}"
    if isinstance(node, Declare):
        return "real " + ", ".join(f"{name} = 0" for name in node.names) + ";"
    if isinstance(node, Held):
        return f"real {node.name}[{node.rows}][{node.lanes}];"
    if isinstance(node, Copy):
        return f"memcpy({node.to}, {node.source}, {node.n} * sizeof(real));"
    if isinstance(node, If):
        text = f"if ({node.condition}) {render(node.then, pad)}"
        return text if node.orelse is None else f"{text} else {render(node.orelse, pad)}"
    if isinstance(node, Block):
        inner = None if node.inline else pad
        return _lines(["{", *(render(s, inner) for s in node.body), "}"], inner)
    if isinstance(node, Seq):
        return _lines([render(s, pad) for s in node.body], pad)
    if isinstance(node, Loop):
        if not node.braced:
            (body,) = node.body
            return _lines([node.header(), render(body, pad)], pad)
        inner = pad + "    "
        return f"{node.header()} {{" + "".join(f"\n{inner}{render(s, inner)}" for s in node.body) + f"\n{pad}}}"
    raise TypeError(f"not a statement: {node!r}")


def _lines(parts, pad):
    return (" " if pad is None else "\n" + pad).join(parts)
