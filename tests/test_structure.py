"""The structural key (codegen.structural_key, codegen/lower/graph.py) and the build cache's index by it:
a graph built twice the same way finds its module without its C being generated again; graphs or
options that differ anywhere get different keys; a damaged or missing entry falls back to codegen."""
import os
import pathlib
import random
import subprocess
import sys
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import seeded_cache

import codegen
from codegen.backend import cache as build_cache
from micrograd_c import MLP, Value, cross_entropy, dot


def mlp_graph(seed=0, hidden=(4,), activation="relu", const=1.0):
    random.seed(seed)
    model = MLP(3, [*hidden, 2], activation=activation)
    xs = [Value(0.0) for _ in range(3)]
    ys = [Value(0.0) for _ in range(2)]
    logits = model([x * const for x in xs])
    return cross_entropy(logits, ys), xs + ys, model.parameters(), logits


def key(graph, **options):
    loss, inputs, params, outputs = graph
    return codegen.structural_key(loss, inputs, params, outputs, **options)


def test_equal_for_a_graph_built_twice():
    assert key(mlp_graph()) == key(mlp_graph())
    # the parameters' values are loaded, not compiled: they do not count, unless embedded
    assert key(mlp_graph(seed=0)) == key(mlp_graph(seed=1))
    assert key(mlp_graph(seed=0), embed_params=True) != key(mlp_graph(seed=1), embed_params=True)


def test_different_for_a_changed_op_constant_or_order():
    base = key(mlp_graph())
    assert key(mlp_graph(activation="tanh")) != base      # op
    assert key(mlp_graph(const=2.0)) != base              # constant
    assert key(mlp_graph(hidden=(5,))) != base            # shape
    loss, inputs, params, outputs = mlp_graph()
    assert key((loss, inputs, params[::-1], outputs)) != base         # parameter order
    assert key((loss, inputs[::-1], params, outputs)) != base         # input order
    assert key((loss, inputs, params, outputs[:1])) != base           # output list
    assert key((loss, inputs, params, outputs[::-1])) != base
    assert key((loss, inputs, params, None)) != base


def test_different_for_zero_and_minus_zero():
    x = Value(1.0)
    assert codegen.structural_key(x * 0.0, [x]) != codegen.structural_key(x * -0.0, [x])


def test_different_for_a_changed_edge():
    def graph(shared):
        x, y = Value(1.0), Value(2.0)
        a = x * y
        b = a if shared else x * y  # one node read twice, or two alike
        return codegen.structural_key(a + b, [x, y])
    assert graph(True) != graph(False)
    x, y = Value(1.0), Value(2.0)
    assert codegen.structural_key(x * y + x, [x, y]) != codegen.structural_key(y * x + x, [x, y])


@pytest.mark.parametrize("option, value", [
    ("fuse", False), ("input_grads", True), ("name", "other"), ("optimizer", codegen.Adam()),
    ("embed_params", True), ("dtype", "float32"), ("sparse_inputs", True), ("batch", 1), ("batch", 64)])
def test_different_for_each_option(option, value):
    assert key(mlp_graph(), **{option: value}) != key(mlp_graph())


def test_different_for_the_optimizers_settings():
    assert key(mlp_graph(), optimizer=codegen.Adam(eps=1e-7)) != key(mlp_graph(), optimizer=codegen.Adam())


# ---- random graphs: rebuilt equal, mutated different ----------------------------------------------
UNARY = ("relu", "tanh", "exp", "sigmoid")
BINARY = ("+", "*", "max", "dot")  # dot: a Dot over the two operands (what a Neuron builds)


@st.composite
def programs(draw):
    """A small program: leaves (params, inputs, constants) then ops over earlier values."""
    n_params, n_inputs = draw(st.integers(1, 3)), draw(st.integers(0, 3))
    constants = draw(st.lists(st.sampled_from([0.5, -1.0, 2.0, 0.0]), min_size=0, max_size=2))
    steps = []
    n = n_params + n_inputs + len(constants)
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            steps.append((draw(st.sampled_from(UNARY)), draw(st.integers(0, n - 1))))
        else:
            steps.append((draw(st.sampled_from(BINARY)), draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))))
        n += 1
    outputs = draw(st.lists(st.integers(0, n - 1), max_size=2))
    return [n_params, n_inputs, constants, steps, outputs]


def run(program):
    return codegen.structural_key(*build(program))


def build(program):
    """(loss, inputs, params, outputs) of a program."""
    n_params, n_inputs, constants, steps, outputs = program
    params = [Value(0.1 * (i + 1)) for i in range(n_params)]
    inputs = [Value(0.2) for _ in range(n_inputs)]
    values = params + inputs + [Value(c) for c in constants]
    for op, *args in steps:
        a = [values[i] for i in args]
        values.append({"relu": lambda: a[0].relu(), "tanh": lambda: a[0].tanh(), "exp": lambda: a[0].exp(),
                       "sigmoid": lambda: a[0].sigmoid(), "+": lambda: a[0] + a[1], "*": lambda: a[0] * a[1],
                       "max": lambda: a[0].max(a[1]), "dot": lambda: dot([a[0], a[1]], [a[1], a[0]], a[0])}[op]())
    loss = sum(values[-3:], Value(0.0))  # reaches params, inputs and constants alike
    loss = loss + sum(params, Value(0.0))
    return loss, inputs, params, [values[i] for i in outputs]


def mutations(program):
    """Programs that differ from `program` in one op, constant, edge or output."""
    n_params, n_inputs, constants, steps, outputs = program
    found = []
    for i, (op, *args) in enumerate(steps):
        family = UNARY if op in UNARY else BINARY
        other = family[(family.index(op) + 1) % len(family)]
        found.append([n_params, n_inputs, constants, steps[:i] + [(other, *args)] + steps[i + 1:], outputs])
        n_before = n_params + n_inputs + len(constants) + i
        if n_before > 1:
            moved = ((args[0] + 1) % n_before, *args[1:])
            found.append([n_params, n_inputs, constants, steps[:i] + [(op, *moved)] + steps[i + 1:], outputs])
    for i, c in enumerate(constants):
        changed = constants[:i] + [c + 0.25] + constants[i + 1:]
        found.append([n_params, n_inputs, changed, steps, outputs])
    found.append([n_params, n_inputs, constants, steps, outputs + [0]])
    return found


@settings(max_examples=60, deadline=None)
@given(programs())
def test_random_graphs_rebuilt_equal_mutated_different(program):
    original = run(program)
    assert run(program) == original
    for mutated in mutations(program):
        # a mutation can leave the graph the same (an output added twice is still one more output,
        # but an edge moved onto a value no one reads may not change what the roots reach): those
        # keys may match only if the graphs do, which the node-by-node check below decides
        if run(mutated) == original:
            assert _same_graph(program, mutated)


def _same_graph(a, b):
    """Whether two programs build graphs equal node by node (what the key must distinguish)."""
    from codegen.lower import ir
    graphs = []
    for program in (a, b):
        g = ir.read_graph(*build(program))
        ops = [g.op_table[code - 1] if code else None for code in g.codes.tolist()]
        k_of = dict(zip(g.k_positions.tolist(), g.k_values))
        graphs.append(([(op and getattr(op, "name", repr(op)), k_of.get(i), value if op is None else None)
                        for i, (op, value) in enumerate(zip(ops, g.values.tolist()))],
                       g.kids.tolist(), g.starts.tolist(), g.params.tolist(), g.inputs.tolist(), g.roots.tolist()))
    return graphs[0] == graphs[1]


# ---- the cache's index by structure ---------------------------------------------------------------
def compile_mlp(cache, **options):
    loss, inputs, params, outputs = mlp_graph()
    cache = seeded_cache(cache, None, options.get("opt", 2))  # the default compiler: a file build
    return codegen.compile(loss, inputs, params, outputs, cache=cache, **options)


def test_a_rebuilt_graph_loads_without_codegen(tmp_path, monkeypatch):
    first = compile_mlp(tmp_path)
    assert not first.build.cached
    with monkeypatch.context() as patch:
        patch.setattr(codegen.lower.ir, "lower", lambda *a, **k: pytest.fail("lowered the graph again"))
        second = compile_mlp(tmp_path)
    assert second.build.cached and second.build.path == first.build.path
    assert second.build.key == first.build.key and second.build.source.read_text() == first.build.source.read_text()
    loss, *_ = mlp_graph()
    assert second.forward() == first.forward() == pytest.approx(loss.data, rel=1e-12)  # compiled equals interpreted
    # another option: another module, lowered
    third = compile_mlp(tmp_path, opt=1)
    assert not third.build.cached and third.build.path != first.build.path


def test_a_build_from_given_sources_is_indexed_too(tmp_path, monkeypatch):
    """compile(sources=generate(...)) (the benchmarks and apps that time codegen apart) also
    indexes its build by the graph's structure: the next compile does not generate the C again."""
    loss, inputs, params, outputs = mlp_graph()
    first = codegen.compile(loss, inputs, params, outputs, cache=seeded_cache(tmp_path, None),
                            sources=codegen.generate(loss, inputs, params, outputs))
    assert not first.build.cached
    with monkeypatch.context() as patch:
        patch.setattr(codegen.lower.ir, "lower", lambda *a, **k: pytest.fail("lowered the graph again"))
        second = compile_mlp(tmp_path)
    assert second.build.cached and second.build.path == first.build.path


@pytest.mark.parametrize("damage", ["entry", "index"])
def test_a_damaged_entry_or_index_falls_back_to_codegen(tmp_path, damage):
    # built in another process: this one must not have the shared object mapped when it is damaged
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'tests'); "
                    f"from tests.test_structure import *; compile_mlp({str(tmp_path)!r})"],
                   check=True, timeout=120, cwd=pathlib.Path(__file__).parent.parent)
    if damage == "entry":
        (so_path,) = tmp_path.glob("*.so")
        os.truncate(so_path, 100)
    else:
        for record in (tmp_path / build_cache.INDEX_DIR).iterdir():
            record.write_text("{not json")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", build_cache.CacheWarning)
        second = compile_mlp(tmp_path)
    assert second.build.cached == (damage == "index")  # an intact entry is found by its C
    loss, *_ = mlp_graph()
    assert second.forward() == pytest.approx(loss.data, rel=1e-12)
    third = compile_mlp(tmp_path)  # and the index is whole again
    assert third.build.cached and third.build.path == second.build.path


def test_a_graph_of_a_different_shape_is_not_found(tmp_path):
    compile_mlp(tmp_path)
    loss, inputs, params, outputs = mlp_graph(hidden=(5,))
    net = codegen.compile(loss, inputs, params, outputs, cache=tmp_path)
    assert not net.build.cached and net.n_params == len(params)


def test_clearing_the_cache_prunes_the_index(tmp_path):
    net = compile_mlp(tmp_path)
    assert len(list((tmp_path / build_cache.INDEX_DIR).iterdir())) == 1
    assert build_cache.prune_index(tmp_path) == 0  # its entry is there
    for path in build_cache.entry_files(tmp_path, build_cache.stem_of(net.build.path)):
        path.unlink()
    assert build_cache.prune_index(tmp_path) == 1
    assert not list((tmp_path / build_cache.INDEX_DIR).iterdir())


def test_different_for_another_version_of_the_code(monkeypatch):
    """A module built by other codegen sources is not found by structure (its C may differ)."""
    from codegen.lower import graph
    before = key(mlp_graph())
    monkeypatch.setattr(graph, "code_fingerprint", lambda: "another version")
    assert key(mlp_graph()) != before
