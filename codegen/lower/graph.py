"""The user's Value graph read once, into arrays: what lowering (ir.build_nodes) walks, and the
structural key by which compile() finds a module built for the same graph without lowering it.

Reading a graph is the one pass whose cost follows the node count: a walk over every Value
(engine.numbered_order, which numbers them in place), then a few C-speed maps over the order
(each Value's op, children, constant, a leaf's data). Everything after it works on these arrays
or on the groups lowering finds. An engine.Dot (what a Neuron builds) is read as one node.
"""

import functools
import hashlib
import pathlib
from array import array
from dataclasses import dataclass
from itertools import chain, compress, repeat
from operator import attrgetter, is_not

import numpy as np

from micrograd_c.engine import NUMBERING, Dot, Value, compact_children, no_gc, numbered_order, topological_order

from .types import Role

_children, _number, _kind, _k, _data = (attrgetter(a) for a in ("_prev", "_n", "_kind", "_k", "data"))

# A leaf's role by its position in `role` (codegen/lower/types.py)
CONST, PARAM, INPUT = Role.CONST, Role.PARAM, Role.INPUT


@dataclass
class Graph:
    """The Values reachable from the roots (outputs, then loss) as nodes 0 to n - 1, children
    first, the outputs' ancestors first. Node i's children are kids[starts[i]:starts[i + 1]].
    It holds no Value: what lowering reads of them is in the arrays."""
    n: int                # the number of nodes
    n_output_values: int  # nodes below n_output_values are what the outputs need
    roots: np.ndarray     # positions of the outputs, then the loss
    starts: np.ndarray    # N + 1 offsets into kids
    kids: np.ndarray      # children's positions, node by node, in _prev order
    params: np.ndarray    # each param's position; -1 if the roots do not reach it
    inputs: np.ndarray    # each input's position, likewise
    codes: np.ndarray     # each node's op as a number: 0 for a leaf, else 1 + its place in op_table
    op_table: list        # the distinct ops (ops.Op), sorted by their repr
    k_positions: np.ndarray  # the nodes whose constant attribute (_k: the exponent of **) is not None
    k_values: list           # those attributes
    values: np.ndarray       # float64 per node: a leaf's data (0 for a computed node)

    def is_op(self, op):
        """A boolean array: which nodes apply `op` (None: which are leaves)."""
        if op is None:
            return self.codes == 0
        found = [code for code, o in enumerate(self.op_table, 1) if o is op]
        return self.codes == found[0] if found else np.zeros(self.n, dtype=bool)

    @functools.cached_property  # (the key, find_sums and build_nodes read it)
    def role(self):
        """Per node: CONST, PARAM or INPUT for a leaf (computed nodes: CONST, unused)."""
        role = np.zeros(self.n, dtype=np.int8)
        role[self.params[self.params >= 0]] = PARAM
        role[self.inputs[self.inputs >= 0]] = INPUT
        return role

    def leaves_listed_once(self, inputs, params):
        """Whether every input and param is a leaf and no Value is among them twice: by position
        where the roots reach them (a mark per node, at C speed), by identity for the others
        (usually none). (Array by array, and no copies where all are reached: a fresh array of a
        million positions costs its page faults.)"""
        listed = np.zeros(self.n, dtype=bool)
        n_reached, unreached = 0, []
        for positions, values in ((self.inputs, inputs), (self.params, params)):
            reached = positions if (positions >= 0).all() else positions[positions >= 0]
            if len(reached) < len(positions):
                unreached += [v for v, i in zip(values, positions.tolist()) if i < 0]
            listed[reached] = True
            n_reached += len(reached)
            if self.codes[reached].any():  # (a code: not a leaf)
                return False
        if np.count_nonzero(listed) < n_reached:
            return False
        return len(set(map(id, unreached))) == len(unreached) and not any(map(_children, unreached))

    def dots(self):
        """{position of each engine.Dot read as one node: (its start, its factors a, b) as arrays
        of positions}: find_sums' form of a sum."""
        found = {}
        for i in np.flatnonzero(self.is_op(Dot)).tolist():
            terms = self.kids[self.starts[i]:self.starts[i + 1]]
            found[i] = (terms[:1], terms[1::2], terms[2::2])
        return found

    def has_constant_products(self):
        """Whether a Dot read as one node multiplies two constants (leaves neither params nor
        inputs). On arrays, from the edges to constants (a model has few)."""
        constant = (self.role == CONST) & self.is_op(None)
        edges = np.flatnonzero(constant[self.kids])
        reader = np.searchsorted(self.starts, edges, side="right") - 1
        factor = self.is_op(Dot)[reader] & ((edges - self.starts[reader]) % 2 == 1)  # a Dot's a[j]: odd places
        return bool(constant[self.kids[edges[factor] + 1]].any())  # and its b[j], after it

    def data(self, positions, leaves):
        """The data of `leaves` (params or inputs) at `positions` (this graph's params or inputs),
        as float64: read by the walk, or from the Values the roots do not reach."""
        if (positions >= 0).all():
            return self.values[positions]
        found = self.values[np.maximum(positions, 0)]
        for i in np.flatnonzero(positions < 0).tolist():
            found[i] = float(leaves[i].data)
        return found

    def children(self, i):
        """Node i's children's positions."""
        return self.kids[self.starts[i]:self.starts[i + 1]].tolist()

    def uses(self):
        """How many times each node is read by another (an edge per use: x*x reads x twice)."""
        return np.bincount(self.kids, minlength=self.n)


def read(loss, inputs, params, outputs, walker=None, compact=True):
    """The Graph of `loss` and `outputs` (Values), with the positions of `inputs` and `params`;
    walked by `walker` (codegen/walker.py's module, which builds) if given, else in Python.
    compact: an engine.Dot is one node, its children its `_terms` (start, a[0], b[0], a[1], ...)
    and its op `Dot`; else its chain's Values (made if they were not yet) are read as any."""
    roots = [*outputs, loss]
    if not compact:
        topological_order(*roots)  # (its walk makes the Dots' chains)
    parts = (_read_in_c(walker, roots, params, inputs, compact) if walker
             else _read_in_python(roots, params, inputs, compact))
    n, n_output_values, root_positions, offsets, kids, param_positions, input_positions, kinds, raw_codes, \
        k_positions, k_values, values = parts
    # Each node's op as a small number: 0 for a leaf, else 1 + the op's place in `op_table`,
    # sorted by the ops' full descriptions (formulas, arity), so that the numbers do not depend
    # on which op the walk met first and two tables' "add" differ if their formulas do.
    table = sorted(kinds, key=repr)
    place = {id(op): code for code, op in enumerate(table, 1)}
    renumber = np.array([0] + [place[id(op)] for op in kinds], dtype=np.uint16)
    return Graph(n, n_output_values, root_positions, offsets, kids, param_positions, input_positions,
                 renumber[raw_codes], table, k_positions, k_values, values)


def _read_in_c(walker, roots, params, inputs, compact):
    """read's parts by the C walker (codegen/walker.py)."""
    # It marks the Values in place for the time of the call, where no collection may visit them
    # (it pauses the collector itself from Python 3.10).
    with NUMBERING, no_gc():
        n, starts, offsets, kids, kinds, codes, root_positions, param_positions, input_positions, \
            k_positions, k_values, values = walker.walk(Value, Dot, roots, params, inputs, compact)
    return (n, starts[-1], _int64(root_positions), _int64(offsets), _int64(kids), _int64(param_positions),
            _int64(input_positions), kinds, np.frombuffer(codes, dtype=np.uint16), _int64(k_positions), k_values,
            np.frombuffer(values, dtype=np.float64))


def _int64(buffer):
    return np.frombuffer(buffer, dtype=np.int64)


def _read_in_python(roots, params, inputs, compact):
    """read's parts by engine.numbered_order and C-speed maps (no compiler for the walker)."""
    children = compact_children if compact else _children
    # The numbers hold until another walk renumbers these Values (a thread's backward()): taken
    # out into arrays under the lock the walk takes.
    with NUMBERING:
        order, base = numbered_order(*roots, starts=(starts := []), compact=compact)
        n = len(order)
        arity = np.fromiter(map(len, map(children, order)), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(arity, out=offsets[1:])
        kids = np.fromiter(map(_number, chain.from_iterable(map(children, order))), dtype=np.int64,
                           count=int(offsets[-1])) - base
        root_positions = np.fromiter(map(_number, roots), dtype=np.int64, count=len(roots)) - base

        def positions(values):
            found = np.fromiter(map(_number, values), dtype=np.int64, count=len(values)) - base
            found[found < 0] = -1
            return found
        param_positions, input_positions = positions(params), positions(inputs)
        ops = list(map(_compact_kind if compact else _kind, order))
        values = np.fromiter(map(_leaf_value, order, ops), dtype=np.float64, count=n)
        # The numbers are out in arrays: back to the one shared -1 ("not visited" for any later
        # walk), so that the Values do not keep an int object each (32 bytes per Value).
        for v in order:  # (a specialised store: faster than any map of setattr)
            v._n = -1
    ids = list(map(id, ops))
    distinct = dict(zip(ids, ops))
    distinct.pop(id(None), None)
    kinds = list(distinct.values())
    code_of = {id(op): code for code, op in enumerate(kinds, 1)}
    code_of[id(None)] = 0
    codes = np.frombuffer(array("H", map(code_of.__getitem__, ids)), dtype=np.uint16)
    ks = list(map(_k, order))
    k_positions = np.fromiter(compress(range(n), map(is_not, ks, repeat(None))), dtype=np.int64)
    return (n, starts[-1], root_positions, offsets, kids, param_positions, input_positions, kinds, codes,
            k_positions, [ks[i] for i in k_positions.tolist()], values)


def _leaf_value(v, op):
    """A leaf's data as the walk in C reads it (a number: float, int, or what has __float__ or
    __index__); 0 for a computed node."""
    if op is not None:
        return 0.0
    data = v.data
    if not isinstance(data, (int, float)) and not any(hasattr(type(data), m) for m in ("__float__", "__index__")):
        raise TypeError(f"a leaf Value's data must be a number, got {type(data).__name__}")
    return float(data)


def _compact_kind(v):
    return Dot if type(v) is Dot and v._terms else v._kind


def structural_key(graph, params, options):
    """A SHA-256 of everything lowering and emission read from the graph: per node its op (the
    whole Op: formulas, arity), its constant attribute, its children, a constant leaf's value,
    the params' and inputs' positions, the roots; and `options` (a string: everything else the C
    depends on). Graphs that differ anywhere get different keys; a graph built twice the same way
    gets the same key (positions, not identities). With embed_params in `options`, the caller
    passes the params whose values the C holds."""
    digest = hashlib.sha256()

    def part(tag, data):  # length-prefixed: the parts' boundaries are part of what is hashed
        if isinstance(data, np.ndarray):  # its bytes as they lie (no copy), tagged with its type
            tag, data = f"{tag} {data.dtype.str}", memoryview(np.ascontiguousarray(data)).cast("B")
        elif not isinstance(data, (bytes, bytearray, memoryview)):
            data = str(data).encode()
        digest.update(tag.encode() + len(data).to_bytes(8, "little"))
        digest.update(data)

    part("ops", "\n".join(map(repr, graph.op_table)))
    part("codes", graph.codes)
    part("k", repr(list(zip(graph.k_positions.tolist(), graph.k_values))))
    # the edges in the fewest bytes that hold them (half the int64 arrays' bytes to hash)
    part("starts", _narrowest(graph.starts))
    part("kids", _narrowest(graph.kids))
    part("params", graph.params)
    part("inputs", graph.inputs)
    part("roots", graph.roots)
    part("outputs", str(graph.n_output_values))
    leaves = np.flatnonzero(graph.codes == 0)
    constants = leaves[graph.role[leaves] == CONST]
    part("constants", constants)
    part("values", graph.values[constants])
    if params is not None:
        part("param values", _floats(map(_data, params)))
    part("options", options)
    part("code", code_fingerprint())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def code_fingerprint():
    """A SHA-256 of the sources that turn a graph into C (codegen, the templates, the op table, the
    engine's Dot): part of every structural key, so that a module built by another version of them
    is not found by structure (the build cache's own key is the C itself)."""
    import templates
    from micrograd_c import engine, ops
    digest = hashlib.sha256()
    roots = [pathlib.Path(__file__).parents[1], pathlib.Path(templates.__file__).parent]  # (all of codegen/)
    files = sorted(p for root in roots for p in root.rglob("*") if p.is_file() and p.suffix in (".py", ".c", ".h"))
    for path in files + [pathlib.Path(ops.__file__), pathlib.Path(engine.__file__)]:  # (engine: Dot's chain)
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _narrowest(numbers):
    """Non-negative integers in the narrowest unsigned type that holds them all."""
    top = int(numbers.max()) if len(numbers) else 0
    return numbers.astype(next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if top <= np.iinfo(t).max))


def _floats(values):
    """The values' float64 bytes (what the C reads of them: float(value))."""
    return array("d", map(float, values)).tobytes()

