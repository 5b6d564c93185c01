"""The first tier's program (codegen/write/graph_rows.py, codegen.first_tier): the graph as read, a
table row per computed Value, no lowering. Built by TCC, GCC, Clang and zig, float64 and float32,
it computes what the lowered program computes within the fused bound (forward, outputs,
gradients of the params and inputs, predict, train() with SGD and Adam, the step API) on a graph
of every op (a gather of a token input, maxima, powers, constants), on random irregular graphs and
on a layer of engine.Dots longer than a row (chained rows); its rows are the same words with the
C walker's walks and Python's; tiered=None tiers by the graph's computed Values, and compile()
returns the first tier before any lowering; a gather's index that is not an input is the clear
error lowering gives."""
import threading

import numpy as np
import pytest
from conftest import compiler_diagonal, requires, seeded_cache
from test_table import every_op_graph, irregular_case, observed

import codegen
from bench import irregular
from codegen import tiers
from codegen.backend import toolchain
from codegen.lower import ir
from codegen.write import graph_rows
from micrograd_c import MLP, Value, gather

RTOL = {"float64": 1e-9, "float32": 1e-4}  # the fused bound (docs/compiler.md), test_float32's


def layer_case(seed=0):
    """Two layers of engine.Dots, the first over 150 inputs: a dot longer than a row (64 parts)."""
    rng = np.random.default_rng(seed)
    model = MLP(150, [3, 1])
    for p, x in zip(model.parameters(), rng.uniform(-0.3, 0.3, len(model.parameters()))):
        p.data = float(x)
    inputs = [Value(0.0) for _ in range(151)]
    out = model(inputs[:150])
    loss = (out - inputs[150]) ** 2
    data = rng.uniform(-1, 1, (12, 151))
    return (loss, inputs, model.parameters(), [out], np.ascontiguousarray(data[:, :150]),
            np.ascontiguousarray(data[:, 150:]))


CASES = {"every op": every_op_graph, "irregular": irregular_case, "long dots": layer_case}


def first_tier_module(case, compiler, cache, **options):
    """The first tier of `case`, built by `compiler`, its params loaded from the Values."""
    loss, inputs, params, outputs, *_ = case
    sources = codegen.first_tier(loss, inputs, params, outputs, input_grads=True, name="first", **options)
    _, net = toolchain.build_module(sources, "first", toolchain.find_compiler(compiler), 2, False, cache, None, False,
                                    None)
    net.set_params(np.array([p.data for p in params]))
    return net


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float64", "float32"])), indirect=["compiler"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_first_tier_computes_the_lowered_programs_numbers(compiler, dtype, name, tmp_path):
    case = CASES[name]()
    optimizer = codegen.Adam() if name == "irregular" else None
    first = first_tier_module(case, compiler, seeded_cache(tmp_path, compiler, dtypes=(dtype,)), optimizer=optimizer,
                              dtype=dtype)
    got = observed(first, *case[-2:])
    loss, inputs, params, outputs, X, Y = case
    lowered = codegen.compile(loss, inputs, params, outputs, compiler=compiler, batch=1, tiered=False,
                              input_grads=True, optimizer=optimizer, dtype=dtype)
    expected = observed(lowered, X, Y)
    assert first.n_params == lowered.n_params and first.n_inputs == lowered.n_inputs
    assert first.n_slots != lowered.n_slots or name == "irregular"  # (another program: its own slots)
    for key, value in expected.items():
        np.testing.assert_allclose(np.asarray(got[key], dtype=float), np.asarray(value, dtype=float),
                                   rtol=RTOL[dtype], atol=RTOL[dtype], err_msg=key)
    print(name, dtype, "max difference of the parameters after training:",
          np.max(np.abs(got["steps"] - expected["steps"])))


def read(case):
    loss, inputs, params, outputs, *_ = case
    return codegen.read_graph(loss, inputs, params, outputs, True)


@pytest.mark.parametrize("name", list(CASES))
def test_the_rows_are_the_same_words_by_the_walker_and_by_python(name):
    graph = read(CASES[name]())
    walker = codegen.walker.module()
    if walker is None:
        requires("gcc")
    by_c, by_python = graph_rows.plan(graph, True, walker)[1], graph_rows.plan(graph, True, None)[1]
    np.testing.assert_array_equal(by_c.words, by_python.words)
    again = graph_rows.plan(read(CASES[name]()), True, walker)[1]
    np.testing.assert_array_equal(again.words, by_c.words)  # deterministic
    assert by_c.rows >= int(np.count_nonzero(graph.codes)) and by_c.runs > 0


@pytest.mark.first_tier
def test_compile_returns_the_first_tier_before_any_lowering(tmp_path, monkeypatch):
    """tiered=None tiers a graph of tiers.TIERED_MIN_VALUES computed Values or more (here lowered
    to 300), lowering it only in the background build's thread; a smaller graph is not tiered."""
    requires("gcc")
    if tiers.first_tier_compiler() is None:
        requires("tcc")
    lowered_in = []
    lower = ir.lower

    def recorded(*args, **kwargs):
        lowered_in.append(threading.current_thread() is threading.main_thread())
        return lower(*args, **kwargs)
    monkeypatch.setattr(ir, "lower", recorded)
    monkeypatch.setattr(tiers, "TIERED_MIN_VALUES", 300)
    graph = irregular.graph(500, seed=21)
    assert int(np.count_nonzero(read((graph.loss, graph.inputs, graph.params, [])).codes)) >= 300
    net = codegen.compile(graph.loss, graph.inputs, graph.params, compiler="gcc", batch=1,
                          cache=seeded_cache(tmp_path / "big", "gcc"))
    assert net.tier == "first" and True not in lowered_in
    assert net.wait(120) == "optimised" and lowered_in == [False]
    assert net.timings["optimised_codegen"] > 0
    small = irregular.graph(150, seed=21)
    assert codegen.compile(small.loss, small.inputs, small.params, compiler="gcc", batch=1,
                           cache=seeded_cache(tmp_path / "small", "gcc")).tier is None


def test_a_gathers_index_that_is_not_an_input_is_an_error_before_any_build():
    p, x = Value(1.0), Value(1.0)
    loss = gather([x * 2.0, x * 3.0], p) * p
    with pytest.raises(ValueError, match="a gather's index must be one of the inputs"):
        codegen.first_tier(loss, [x], [p])


def test_a_sequence_models_first_tier_is_its_lowered_c(tmp_path):
    """A graph that gathers (token inputs) keeps tcc's build of its lowered C as its first tier:
    its loops stop at each sample's length, where rows run every position."""
    requires("gcc")
    if tiers.first_tier_compiler() is None:
        requires("tcc")
    loss, inputs, params, outputs, X, Y = every_op_graph()
    net = codegen.compile(loss, inputs, params, outputs, compiler="gcc", batch=1, tiered=True,
                          cache=seeded_cache(tmp_path / "gathers", "gcc"))
    assert net.tier == "first" and net.first_tier == "lowered"
    graph = irregular.graph(300, seed=22)
    rows = codegen.compile(graph.loss, graph.inputs, graph.params, compiler="gcc", batch=1, tiered=True,
                           cache=seeded_cache(tmp_path / "irregular", "gcc"))
    assert rows.tier == "first" and rows.first_tier == "rows"
    assert net.wait(120) == "optimised" and rows.wait(120) == "optimised"
