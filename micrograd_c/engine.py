"""A scalar autograd engine with micrograd's API; every op's math comes from the op table (ops.py)."""

import contextlib
import gc
import threading
from array import array
from itertools import accumulate, repeat
from operator import attrgetter

import numpy as np

from . import ops

_ADD, _MUL = ops.OPS["add"], ops.OPS["mul"]
_ADD_DATA, _MUL_DATA = _ADD.pair_fn, _MUL.pair_fn  # (a, b) -> the op's value
_data = attrgetter("data")


class Value:
    """Stores a single scalar value and its gradient."""

    __slots__ = ("data", "grad", "_prev", "_op", "_kind", "_k", "_n")

    def __init__(self, data, _children=(), _op="", _kind=None, _k=None):
        self.data = data
        self.grad = 0
        self._prev = _children if type(_children) is tuple else tuple(_children)  # ordered: x*x keeps both edges
        self._op = _op
        self._kind = _kind  # the ops.Op that made this node; None for leaves
        self._k = _k        # the op's constant attribute (the exponent of **)
        self._n = -1        # its number in the latest numbered_order that reached it (see there)

    def _apply(self, op_name, *others, k=None):
        op = ops.OPS[op_name]
        args = (self,) + tuple(o if isinstance(o, Value) else Value(o) for o in others)
        a = args[0].data
        b = args[1].data if op.arity == 2 else None
        return Value(op.value_fn(a, b, None, k), args, op.label if k is None else op.label.format(k=k), op, k)

    def _backward(self):
        op = self._kind
        if op is None:
            return
        a = self._prev[0].data
        b = self._prev[1].data if op.arity == 2 else None
        for child, grad_fn in zip(self._prev, op.grad_fns):
            child.grad += grad_fn(a, b, self.data, self._k) * self.grad

    # + and *, the ops a model is made of, made lean: no _apply, no frame between the operator
    # and the new Value (a model written without Neuron builds two Values per weight)
    def __add__(self, other):
        if not isinstance(other, Value):
            other = Value(other)
        return Value(_ADD_DATA(self.data, other.data), (self, other), "+", _ADD)

    def __mul__(self, other):
        if not isinstance(other, Value):
            other = Value(other)
        return Value(_MUL_DATA(self.data, other.data), (self, other), "*", _MUL)

    def __pow__(self, other):
        """self ** k for a number k (micrograd's op, '**k'), or self ** other for a Value ('**')."""
        if isinstance(other, Value):
            return self._apply("vpow", other)
        if not isinstance(other, (int, float)):
            return NotImplemented
        return self._apply("pow", k=other)

    def __rpow__(self, other):  # other ** self, other a number
        if not isinstance(other, (int, float)):
            return NotImplemented
        return Value(other)._apply("vpow", self)

    # relu, tanh, sigmoid, exp, log and max (self.max(other)) are made below the class, one per
    # row of the op table that names a method (ops.py's Op.method): x.relu() is x._apply("relu").

    def backward(self):
        self.grad = 1
        for v in reversed(topological_order(self)):
            v._backward()

    # Everything below is built from the ops above, exactly as in micrograd.
    def __neg__(self):  # -self
        return self * -1

    def __radd__(self, other):  # other + self
        return self + other

    def __sub__(self, other):  # self - other
        return self + (-other)

    def __rsub__(self, other):  # other - self
        return other + (-self)

    def __rmul__(self, other):  # other * self
        return self * other

    def __truediv__(self, other):  # self / other
        return self * other**-1

    def __rtruediv__(self, other):  # other / self
        return other * self**-1

    def __repr__(self):
        return f"Value(data={self.data}, grad={self.grad})"


def op_method(op):
    """The Value method an op table row names: self._apply(op.name) for a unary op, with `other`
    for a binary one."""
    if op.arity == 1:
        def method(self):
            return self._apply(op.name)
    elif op.arity == 2:
        def method(self, other):
            return self._apply(op.name, other)
    else:
        raise ValueError(f"op {op.name!r}: a method of {op.arity} arguments is not made")
    method.__name__, method.__qualname__ = op.method, f"Value.{op.method}"
    method.__doc__ = op.doc or f"The op table's {op.name!r}: {op.render(op.value, a='self', b='other')}."
    return method


def _add_op_methods():
    for op in ops.OPS.values():
        if op.method:
            if op.method in vars(Value):
                raise ValueError(f"op {op.name!r}: Value already has {op.method!r}")
            setattr(Value, op.method, op_method(op))


_add_op_methods()


def dot(a, b, start=0.0):
    """start + sum(a[i] * b[i]), the Value micrograd's Neuron builds (a chain of + over *): the
    interpreter computes it term by term. When every operand is a Value, it is a Dot, which makes
    the chain's Values only when they are first read (codegen compiles it to one loop)."""
    if len(a) != len(b):
        raise ValueError(f"dot of {len(a)} values with {len(b)} values")
    start = start if isinstance(start, Value) else Value(start)
    if len(a) and all(map(isinstance, a, repeat(Value))) and all(map(isinstance, b, repeat(Value))):
        return Dot(start, a, b)
    return sum((x * y for x, y in zip(a, b)), start)


def gather(values, index):
    """values[index] as a Value, for an index that is itself a Value (a token, a target: an
    input set per sample, holding an int): Python's indexing, negative indices included, and
    the gradient flows to the one value picked. Compiled, it reads the index at run time, so one
    graph serves every token. `values`: Values (numbers become constants)."""
    values = [v if isinstance(v, Value) else Value(v) for v in values]
    if not isinstance(index, Value):
        raise TypeError(f"gather's index must be a Value (an input set per sample), not {type(index).__name__}")
    return Gather(index, values)


class Gather(Value):
    """values[index]: op table's GATHER. Its children are (index, *values)."""

    __slots__ = ()

    def __init__(self, index, values):
        picked = values[_position(index.data, len(values))]
        super().__init__(_GATHER.value_fn(picked.data, None, None, None), (index, *values), "gather", _GATHER)

    def _backward(self):
        index, *values = self._prev
        picked = values[_position(index.data, len(values))]
        picked.grad += _GATHER.grad_fns[0](picked.data, None, self.data, None) * self.grad


def _position(index, n):
    """The position an index value picks among n, as Python's list indexing finds it."""
    if isinstance(index, bool) or not float(index).is_integer():
        raise TypeError(f"an index must hold an integer, not {index!r}")
    i = int(index)
    if not -n <= i < n:
        raise IndexError(f"index {i} out of range for {n} values")
    return i + n if i < 0 else i


class Table(list):
    """A list that a Value can index: `table[token]` with `token` a Value is gather() (for a
    table of rows, a row of gathers, one per column: an embedding lookup); any other index is
    the list's own. Wrap a model's matrices in it (`Table(rows)`) and index them by inputs."""

    def __getitem__(self, i):
        if not isinstance(i, Value):
            return list.__getitem__(self, i)
        if self and isinstance(list.__getitem__(self, 0), (list, tuple)):
            return [gather(column, i) for column in zip(*self)]
        return gather(self, i)


_GATHER = ops.GATHER
_PREV = Value._prev  # the slot under Dot's _prev property


class Dot(Value):
    """start + a[0]*b[0] + ... + a[n-1]*b[n-1] (n >= 1): the top `+` of the chain micrograd's
    Neuron builds, `(...(start + a[0]*b[0]) + ...) + a[n-1]*b[n-1]`, holding its operands instead
    of the chain's other 2n - 1 Values. Those (each product, each partial sum: the values they had
    when the Dot was built) are made when `_prev` is first read (backward(), draw_dot,
    topological_order), so that the interpreter sees micrograd's graph; the compiler reads
    `_terms` and never makes them. A model's Values are mostly these chains: a Dot holds 32 bytes
    per term (two references, a product and a partial sum) where the chain holds two Values, their
    tuples and floats (about 380)."""

    __slots__ = ("_terms", "_steps")

    def __init__(self, start, a, b):
        terms = [start] * (2 * len(a) + 1)  # (filled by slices: 5x faster than interleaving them one by one)
        terms[1::2], terms[2::2] = a, b
        compiled = _compiled_chain(Value, start.data, a, b) if _compiled_chain and _FLOAT_CHAIN else None
        if compiled is not None:
            data, raw = compiled
            steps = array("d")
            steps.frombytes(raw)
        else:
            data, steps = _chain_values(start.data, list(map(_data, a)), list(map(_data, b)))
        Value.__init__(self, data, (), "+", _ADD)
        _PREV.__set__(self, None)
        self._terms = tuple(terms)  # start, a[0], b[0], a[1], b[1], ...: the order of the chain's walk
        # the chain's products and partial sums (the last sum is self.data): floats in an array
        self._steps = steps

    @property
    def _prev(self):
        prev = _PREV.__get__(self)
        if prev is None:
            if getattr(_unmade, "stop", False):
                raise _ChainUnmade
            prev = self._chain()
            _PREV.__set__(self, prev)
        return prev

    @_prev.setter
    def _prev(self, children):  # other children: a Value like any from then on, read by its _prev
        _PREV.__set__(self, children)
        self._terms = self._steps = None

    def _chain(self):
        """The chain's Values below this one, with the values they had: this one's children."""
        terms, steps = self._terms, self._steps
        n = (len(terms) - 1) // 2
        product = list(map(Value, steps[:n], zip(terms[1::2], terms[2::2]), repeat("*"), repeat(_MUL)))
        total = terms[0]
        for data, p in zip(steps[n:], product):  # (the last product is this one's own term)
            total = Value(data, (total, p), "+", _ADD)
        return (total, product[-1])


# The op table's + and * are Python's on floats: a chain of floats is then computed in numpy, or
# by compiled code where codegen installed it (use_compiled_chain)
_FLOAT_CHAIN = _ADD.value == "{a} + {b}" and _MUL.value == "{a} * {b}"
_FLOAT_ONLY = {float}
_compiled_chain = None


def use_compiled_chain(chain):
    """Let every Dot made from now on compute its chain over floats with `chain(value_type, start,
    a, b)` -> (the value, the bytes of its steps as float64) or None (not all floats: NumPy's and
    Python's then), the same bits as _float_chain; None: _float_chain again. codegen installs its
    graph walker's (templates/walk.c's float_chain; the front end builds no C itself): a Dot of
    85 terms took ~50 us with NumPy's chain and its checks, mostly overhead."""
    global _compiled_chain
    _compiled_chain = chain


def _chain_values(start, x, y):
    """(the value, the steps) of a Dot's chain from `start` over the terms' data x and y, as Dot
    keeps them: the products, then the partial sums before the last (floats in an array), each
    computed by the op table's * and + in the chain's order; over floats, _float_chain's."""
    if _FLOAT_CHAIN and type(start) in (float, int) and {*map(type, x), *map(type, y)} == _FLOAT_ONLY:
        return _float_chain(start, x, y)
    products = list(map(_MUL_DATA, x, y))
    sums = list(accumulate(products, _ADD_DATA, initial=start))
    steps = products + sums[1:-1]
    return sums[-1], array("d", steps) if set(map(type, steps)) == _FLOAT_ONLY else tuple(steps)


def _float_chain(start, x, y):
    """(the value, the steps) of a Dot's chain over floats x, y from `start` (a float or an
    int), as Dot keeps them, at C speed: a float64 product is Python's float product, and
    numpy's accumulate adds in order (it never sums pairwise), so every step has the bits the
    chain's Python arithmetic gives (start + x[0] * y[0], then + x[1] * y[1], ...)."""
    n = len(x)
    running = np.empty(n + 1)
    with np.errstate(all="ignore"):  # (Python's floats overflow to inf without a word)
        np.multiply(x, y, out=running[1:])
        steps = array("d", running[1:].tobytes())  # the products
        running[0] = start
        np.add.accumulate(running, out=running)
    steps.frombytes(running[1:n].tobytes())  # the partial sums
    return float(running[n]), steps


_paused = 0  # no_gc blocks running, in any thread
_resume = False  # whether the collector ran before the first of them
_pausing = threading.Lock()


@contextlib.contextmanager
def no_gc(survivors=False):
    """The cyclic collector paused: millions of new objects and no garbage, which it would only
    rescan. survivors=True (building a graph: what was made lives on) also moves the objects made
    meanwhile into the oldest generation on the way out (gc.freeze, then gc.unfreeze: a move, no
    scan), so that the collector does not rescan them in its young generations either: three
    quarters of building a model's forward pass went to those scans. The young generations are
    collected first (they are small), so that garbage made before, such as a dropped module's
    cycles, is not moved along; garbage among what was built is still found by the next full
    collection. Skipped if the process froze objects of its own. The collector resumes when the
    last block running ends, in whichever thread (a tiered compile's background lowering starts
    inside compile()'s block and ends after it: resumed by compile(), it took 2x as long)."""
    global _paused, _resume
    with _pausing:
        outermost = _paused == 0
        if outermost:
            _resume = gc.isenabled()
        _paused += 1
        moving = survivors and outermost and _resume and gc.get_freeze_count() == 0
        if moving:
            gc.collect(1)
        gc.disable()
    try:
        yield
    finally:
        with _pausing:
            if moving:
                gc.freeze()
                gc.unfreeze()
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()


def topological_order(*roots, starts=None):
    """Nodes reachable from the roots, children before parents, in the order micrograd's
    recursive build_topo gives (root by root); iterative, so a chain of any length works.
    `starts`, a list, receives the length of the order before each root.

    A walk that meets a Dot whose chain is not made yet starts again with the collector paused
    (no_gc(survivors=True)), as Layer builds: making a model's chains (a million Values) with it
    running took three times as long, its young generations rescanned again and again."""
    _unmade.stop = True
    try:
        return numbered_order(*roots, starts=starts)[0]
    except _ChainUnmade:
        pass
    finally:
        _unmade.stop = False
    if starts is not None:
        starts.clear()
    with no_gc(survivors=True):
        return numbered_order(*roots, starts=starts)[0]


class _ChainUnmade(Exception):
    """A Dot's chain is to be made while topological_order's first walk runs (see there)."""


_unmade = threading.local()  # .stop: raise _ChainUnmade instead of making a chain (this thread)


# numbered_order's numbers only grow, so that a node's number from an earlier walk reads as
# "not visited"; the lock keeps two walks (threads) from numbering the same nodes at once.
NUMBERING = threading.RLock()
_next_number = 0


def numbered_order(*roots, starts=None, compact=False):
    """topological_order, and `base`: every node v of the order gets v._n = base + its position,
    and a node the walk did not reach has v._n < base. The numbers hold until the next walk over
    those nodes: a caller that reads them holds NUMBERING (and may set them back to -1). Marking visited nodes in the node
    instead of a set of ids makes the walk about twice as fast (it reads every node of a graph
    that compile() lowers). compact: a Dot's children are its `_terms` (its chain is not made)."""
    global _next_number
    with NUMBERING:
        base = _next_number
        order = []
        try:
            _walk(roots, starts, compact, base, order.append)
        finally:  # the next walk's numbers start above this one's, also after an error (see topological_order)
            _next_number = base + len(order) + 1
    return order, base


def _walk(roots, starts, compact, base, append):
    """numbered_order's walk."""
    number = base
    for root in roots:
        if starts is not None:
            starts.append(number - base)
        if root._n >= base:
            continue
        root._n = base  # visited (its final number comes when it is appended)
        stack = [(root, iter(compact_children(root) if compact else root._prev))]
        push, pop = stack.append, stack.pop
        while stack:
            node, children = stack[-1]
            for child in children:
                if child._n < base:
                    below = (child._terms or child._prev) if compact and type(child) is Dot else child._prev
                    if not below:  # a leaf: its visit would end at once (a third of a model's Values)
                        child._n = number
                        number += 1
                        append(child)
                        continue
                    child._n = base
                    push((child, iter(below)))
                    break
            else:
                pop()
                node._n = number
                number += 1
                append(node)


def value_count(*roots):
    """len(topological_order(*roots)), counted without making a Dot's chain (its 2n - 1 Values
    below it: len(_terms) - 2)."""
    order = numbered_order(*roots, compact=True)[0]
    return len(order) + sum(len(v._terms) - 2 for v in order if type(v) is Dot and v._terms)


def compact_children(v):
    """A Value's children as the compiler reads them: a Dot's operands (`_terms`), else `_prev`."""
    return (v._terms or v._prev) if type(v) is Dot else v._prev
