"""The graph's walk in C (codegen/walker.py, templates/walk.c): the same arrays as the Python read
(codegen/lower/graph.py) on hypothesis-generated graphs, its errors, and the Python read as the fallback
when the walker cannot be built."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codegen
from codegen.lower import graph as graph_arrays
from codegen import walker
from codegen.backend import toolchain
from micrograd_c import Value, dot
from micrograd_c.engine import _PREV, Dot, compact_children, topological_order
from conftest import requires, same_bits


@pytest.fixture(scope="module")
def walk_module():
    requires("gcc")  # the default compiler where CI runs
    found = walker.module()
    assert found is not None
    return found


def random_graph(draw_ops, n_leaves):
    """Values from `draw_ops` (op, operand indices), over n_leaves leaves: shared nodes, x*x, **k,
    Dots (of the last Values by the ones before them, from a)."""
    values = [Value(float(i) + 0.5) for i in range(n_leaves)]
    for op, i, j in draw_ops:
        a, b = values[i % len(values)], values[j % len(values)]
        values.append({"add": lambda: a + b, "mul": lambda: a * b, "pow": lambda: a ** 3, "relu": a.relu,
                       "const": lambda: a * 2.0,
                       "dot": lambda: dot(values[-2:], values[-3:-1] if len(values) > 2 else values[-2:], a)}[op]())
    return values


def reached(roots, compact):
    """The Values the roots reach (by identity), found without touching their marks."""
    found, stack = {}, list(roots)
    while stack:
        v = stack.pop()
        if id(v) not in found:
            found[id(v)] = v
            stack += compact_children(v) if compact else v._prev
    return list(found.values())


def parts_equal(c_parts, python_parts):
    for ours, theirs in zip(c_parts, python_parts, strict=True):
        if isinstance(ours, np.ndarray):
            assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
        elif isinstance(ours, list):  # Values, kinds, constant attributes: the same objects
            assert len(ours) == len(theirs) and all(x is y for x, y in zip(ours, theirs))
        else:
            assert ours == theirs


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "mul", "pow", "relu", "const", "dot"]), st.integers(0, 99),
                              st.integers(0, 99)), max_size=40),
       n_leaves=st.integers(1, 6), picks=st.lists(st.integers(0, 99), min_size=1, max_size=4),
       n_params=st.integers(0, 3), walked_before=st.booleans(), compact=st.booleans())
def test_the_c_walk_reads_what_python_reads(walk_module, ops, n_leaves, picks, n_params, walked_before, compact):
    values = random_graph(ops, n_leaves)
    roots = [values[p % len(values)] for p in picks]  # repeated roots and leaf roots too
    params, inputs = values[:n_params], values[n_params:n_leaves]  # some unreached
    if walked_before:  # backward() leaves its walk's numbers in the Values (and makes the Dots' chains)
        topological_order(values[-1])
    if not compact:  # graph.read's first step then: the Dots' chains made
        topological_order(*roots)
    marks = [v._n for v in values]
    c_parts = graph_arrays._read_in_c(walk_module, roots, params, inputs, compact)
    walked = reached(roots, compact)
    assert c_parts[0] == len(walked)
    assert all(v._n == -1 for v in walked)  # the walk's marks are gone, the others' are as they were
    assert [v._n for v in values if all(v is not w for w in walked)] == \
        [n for v, n in zip(values, marks) if all(v is not w for w in walked)]
    parts_equal(c_parts, graph_arrays._read_in_python(roots, params, inputs, compact))
    if compact and not walked_before:  # a Dot read as one node: its chain is not made
        assert all(_PREV.__get__(v) is None for v in walked if type(v) is Dot)


def test_a_long_chain_is_walked_without_recursion(walk_module):
    xs = [Value(1.0) for _ in range(100_000)]
    total = sum(xs)
    n, _, _, _, _, _, roots = walk_module.walk(Value, Dot, [total], xs, [], True)[:7]
    assert n == 2 * len(xs) + 1 and np.frombuffer(roots, dtype=np.int64).tolist() == [n - 1]  # (sum() starts from 0)


def test_what_is_not_a_value_raises_and_leaves_no_marks(walk_module):
    x = Value(1.0)
    y = x + 1
    z = (y * 2) * x
    y._prev = (x, 3.0)
    with pytest.raises(TypeError, match="child must be a Value"):
        walk_module.walk(Value, Dot, [z], [], [], True)
    y._prev = [x]
    with pytest.raises(TypeError, match="_prev must be a tuple"):
        walk_module.walk(Value, Dot, [z], [], [], True)
    with pytest.raises(TypeError, match="must be a Value"):
        walk_module.walk(Value, Dot, [x], [x, 1.0], [], True)
    assert all(v._n == -1 for v in (x, y, z, *z._prev, *z._prev[0]._prev))
    y._prev = (x, Value(1))
    assert len(topological_order(z)) == 6  # x, 1, y, 2, y * 2, z


def test_without_a_compiler_graphs_are_read_in_python(monkeypatch):
    def loss_and_leaves():
        xs, ws = [Value(0.5) for _ in range(6)], [Value(0.1 * i) for i in range(6)]
        return (sum(w * x for w, x in zip(ws, xs)).relu(), xs, ws)
    expected = codegen.generate(*loss_and_leaves())

    def no_compiler(name=None):
        raise toolchain.CompilerNotFound("none here")
    monkeypatch.setattr(toolchain, "find_compiler", no_compiler)
    walker.module.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no compiler is no reason to warn
            assert walker.module() is None
        assert codegen.generate(*loss_and_leaves()) == expected
    finally:
        walker.module.cache_clear()


def test_a_walker_that_does_not_build_warns_and_python_reads(monkeypatch):
    def failing(*args, **kwargs):
        raise toolchain.ToolchainError("broken")
    monkeypatch.setattr(toolchain, "build_module", failing)
    walker.module.cache_clear()
    try:
        with pytest.warns(UserWarning, match="reading graphs in Python"):
            assert walker.module() is None
        x = Value(2.0)
        assert codegen.structural_key(x * x, [x], []) == codegen.structural_key(x * x, [x], [])
    finally:
        walker.module.cache_clear()


def test_bad_leaves_get_their_messages_through_the_walker(walk_module):
    x, p = Value(1.0), Value(2.0)
    unreached = Value(3.0) * 2
    with pytest.raises(TypeError, match="every param must be a Value, got float"):
        codegen.structural_key(x * p, [x], [p, 1.0])
    with pytest.raises(ValueError, match="inputs and params must be leaves"):
        codegen.structural_key(x * p, [x], [p, unreached])  # not reached by the loss
    with pytest.raises(ValueError, match="inputs and params must be leaves"):
        codegen.structural_key(x * p, [x * p], [p])
    with pytest.raises(ValueError, match="listed twice"):
        codegen.structural_key(x * p, [x, unreached._prev[0]], [p, unreached._prev[0]])


def test_the_walks_over_arrays_check_their_positions(walk_module):
    """reach and depths (codegen/write/graph_rows.py's walks) on a node or child outside the
    arrays: a ValueError, no read outside them."""
    starts, kids = np.array([0, 0, 0, 2], dtype=np.int64), np.array([0, 1], dtype=np.int64)
    nodes = np.array([2], dtype=np.int64)
    flags, depth = np.array([1, 0, 0], dtype=np.uint8), np.zeros(3, dtype=np.int64)
    walk_module.reach(starts, kids, nodes, flags, False)
    walk_module.depths(starts, kids, nodes, depth)
    assert flags.tolist() == [1, 0, 1] and depth.tolist() == [0, 0, 1]
    for bad_kids, bad_nodes in ((np.array([0, 7], dtype=np.int64), nodes), (kids, np.array([5], dtype=np.int64))):
        with pytest.raises(ValueError, match="outside the arrays"):
            walk_module.reach(starts, bad_kids, bad_nodes, flags, True)
        with pytest.raises(ValueError, match="outside the arrays"):
            walk_module.depths(starts, bad_kids, bad_nodes, depth)


def _chain_terms(rng, n, kinds):
    """n Values of data drawn from `kinds`: floats of every magnitude (subnormals, -0.0, inf, nan)
    and ints (a ReLU's 0, a count)."""
    specials = [0.0, -0.0, 1e-310, -5e-324, 1e308, -1e308, float("inf"), float("-inf"), float("nan"), 1.0]
    out = []
    for _ in range(n):
        kind = kinds[rng.integers(len(kinds))]
        if kind == "float":
            out.append(float(rng.standard_normal() * 10.0 ** rng.integers(-8, 9)))
        elif kind == "special":
            out.append(specials[rng.integers(len(specials))])
        else:
            out.append(int(rng.integers(-3, 4)))
    return [Value(x) for x in out]


def test_a_dot_made_in_c_has_pythons_bits(compiler):
    """templates/walk.c's float_chain (engine.Dot's chain over floats, as each compiler builds it)
    gives the value and steps of Dot's own Python, bit for bit (a NaN as a NaN): floats of every magnitude and the
    specials, ints beside floats (a ReLU's 0), int starts; None, and Python then, where a product is
    of two ints or a datum neither a float nor an int."""
    import templates
    from micrograd_c import engine
    native = toolchain.FAMILIES[toolchain.find_compiler(compiler).family].native
    for build in ([False, True] if native else [False]):  # (-march=native: FMAs the C must not contract into)
        _, walk = toolchain.build_module(templates.read("walk.c"), walker.MODULE_NAME, compiler=compiler, opt=2,
                                         native=build)
        _check_chains(walk, compiler)


def _check_chains(walk, compiler):
    from micrograd_c import engine
    rng = np.random.default_rng(0)
    checked = 0
    for case in range(300):
        n = int(rng.integers(1, 70))
        a = _chain_terms(rng, n, ["float", "float", "special"])
        b = _chain_terms(rng, n, ["float", "special", "int"])
        start = [0.0, 2, -1.5, float(rng.standard_normal())][case % 4]
        made = walk.float_chain(Value, start, a, b)
        value, steps = engine._chain_values(start, [v.data for v in a], [v.data for v in b])
        assert made is not None
        assert same_bits([made[0]], [value]), (case, made[0], value)
        assert same_bits(np.frombuffer(made[1]), np.frombuffer(steps.tobytes())), case
        checked += 1
    ints = [Value(2), Value(3)]
    assert walk.float_chain(Value, 0.0, ints, ints) is None  # (int * int is an int: Python keeps it)
    assert walk.float_chain(Value, 0.0, [Value(True)], [Value(1.0)]) is None
    assert walk.float_chain(Value, 0.0, [Value(np.float64(1.0))], [Value(1.0)]) is None
    assert walk.float_chain(Value, "0", [Value(1.0)], [Value(1.0)]) is None
    assert walk.float_chain(Value, 0.0, [Value(2 ** 2000)], [Value(1.0)]) is None  # (Python raises)
    with pytest.raises(TypeError, match="Values"):
        walk.float_chain(Value, 0.0, [1.0], [Value(1.0)])
    with pytest.raises(ValueError, match="one length"):
        walk.float_chain(Value, 0.0, [Value(1.0)], [])
    print(f"{compiler}: {checked} chains the same bits as Python's")


def test_dots_made_after_import_codegen_are_the_pythons(walk_module):
    """`import codegen` installs the walker's chain for every Dot (engine.use_compiled_chain): a
    Dot's value and steps, its chain's Values and a backward() are those of a Dot made by
    NumPy's chain; a Dot of ints (no floats) is Python's own, ints kept."""
    from micrograd_c import engine
    rng = np.random.default_rng(1)
    a, b = _chain_terms(rng, 40, ["float", "int"]), _chain_terms(rng, 40, ["float"])
    start = Value(0.25)
    with_c = Dot(start, a, b)
    assert engine._compiled_chain is walk_module.float_chain
    engine.use_compiled_chain(None)
    try:
        by_numpy = Dot(start, a, b)
    finally:
        engine.use_compiled_chain(walk_module.float_chain)
    assert with_c.data == by_numpy.data and with_c._steps == by_numpy._steps
    assert [v.data for v in topological_order(with_c)] == [v.data for v in topological_order(by_numpy)]
    ints = Dot(Value(1), [Value(2), Value(3)], [Value(4), Value(5)])
    assert ints.data == 1 + 8 + 15 and type(ints.data) is int and ints._steps == (8, 15, 9)
