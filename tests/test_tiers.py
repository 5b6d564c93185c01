"""Tiers (codegen/tiers.py) and the one-backward, short-function form of programs that are mostly
single statements (ir.straight_line_heavy): a module that switches from the first tier to the
optimised one mid-training computes what either computes throughout; a failed or killed optimised
build leaves the first tier training, with a warning carrying the compiler's output; a cache hit
starts optimised; random graphs in the bounded form equal the interpreter."""
import stat
import warnings

import numpy as np
import pytest
from conftest import requires, seeded_cache
from test_compile import check_random_graphs

import codegen
import templates
from bench import irregular
from bench import tiers as bench_tiers
from codegen import tiers
from codegen.backend import toolchain
from codegen.lower import ir
from codegen.write import emit
from micrograd_c import Value

RTOL = 1e-9  # the fused bound (docs/compiler.md, Equivalence)


def rows(graph, n=40, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.uniform(-1, 1, (n, len(graph.inputs)))
    return np.ascontiguousarray(data[:, :-1]), np.ascontiguousarray(data[:, -1:])


@pytest.fixture
def gate(monkeypatch):
    """The background build waits for gate.set() before it starts: a test decides when it is in."""
    import threading
    opened = threading.Event()
    build = tiers.toolchain.build_extension

    def gated(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():  # the background build only
            opened.wait(60)
        return build(*args, **kwargs)
    monkeypatch.setattr(tiers.toolchain, "build_extension", gated)
    return opened


def compile_graph(graph, **options):
    return codegen.compile(graph.loss, graph.inputs, graph.params, batch=1, **options)


@pytest.mark.parametrize("optimised, optimizer", [("gcc", codegen.Adam()), ("clang", None), ("zig", codegen.Adam())],
                         ids=["gcc-adam", "clang-sgd", "zig-adam"])
def test_switch_mid_training_equals_either_tier_throughout(optimised, optimizer, gate, tmp_path):
    """(Adam: its state moves too.)"""
    requires(optimised)
    first = tiers.first_tier_compiler()
    if first is None:
        requires("tcc")
    graph = irregular.graph(150, seed=3)
    X, Y = rows(graph)
    net = compile_graph(graph, compiler=optimised, tiered=True, optimizer=optimizer, cache=seeded_cache(tmp_path / "tiered", optimised))
    assert net.tier == "first" and net.timings["optimised"] is None
    assert net.build.command[0] == first.argv[0] or first.family == "libtcc"
    losses = [net.train(X, Y, 0.05), net.train(X, Y, 0.05, seed=1)]
    assert net.tier == "first"  # the gate holds the optimised build
    gate.set()
    assert net.wait(60) == "optimised"
    assert net.timings["optimised"] > 0 and not net.build.cached
    losses += [net.train(X, Y, 0.05, seed=2), net.train(X, Y, 0.05)]
    for compiler in (first.family, optimised):
        throughout = compile_graph(graph, compiler=compiler, tiered=False, optimizer=optimizer,
                                   cache=seeded_cache(tmp_path / "throughout", compiler))
        assert throughout.tier is None
        expected = [throughout.train(X, Y, 0.05), throughout.train(X, Y, 0.05, seed=1),
                    throughout.train(X, Y, 0.05, seed=2), throughout.train(X, Y, 0.05)]
        np.testing.assert_allclose(losses, expected, rtol=RTOL)
        np.testing.assert_allclose(np.asarray(net.params), np.asarray(throughout.params), rtol=RTOL, atol=RTOL)
        for key, view in throughout.optimizer_state.items():
            np.testing.assert_allclose(np.asarray(net.optimizer_state[key]), np.asarray(view), rtol=RTOL, atol=RTOL)


def test_switch_between_steps_of_the_step_api(gate, tmp_path):
    """The step-by-step API switches at forward(): the gradients accumulated and the inputs set on
    the first tier come along."""
    requires("gcc")
    graph = irregular.graph(100, seed=5)
    X, Y = rows(graph, 4)
    net = compile_graph(graph, compiler="gcc", tiered=True, cache=seeded_cache(tmp_path, "gcc"))
    reference = compile_graph(graph, compiler="gcc", tiered=False, cache=seeded_cache(tmp_path / "reference", "gcc"))
    for i, m in enumerate([net, reference]):
        m.set_input(np.concatenate([X[0], Y[0]]))
        m.zero_grad()
        m.forward()
        m.backward()
        if m is net:
            gate.set()
            net.wait(60)
            assert net.tier == "optimised"
        m.set_input(np.concatenate([X[1], Y[1]]))
        m.forward()
        m.backward()
        m.update(0.1)
    np.testing.assert_allclose(np.asarray(net.params), np.asarray(reference.params), rtol=RTOL, atol=RTOL)
    np.testing.assert_allclose(np.asarray(net.grad), np.asarray(reference.grad), rtol=RTOL, atol=RTOL)


def fake_compiler(tmp_path, body):
    """A command that says it is a C compiler (driven as gcc) and runs `body` to compile."""
    path = tmp_path / "fake-cc"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "fake-cc 1.0"; exit 0; fi\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize("how, said", [
    ("echo 'fake-cc: fatal error: out of memory allocating 6 GB' >&2; exit 1", "out of memory allocating 6 GB"),
    ("echo 'fake-cc: compiling unit 1' >&2; kill -9 $$", "compiling unit 1"),
], ids=["fails", "killed"])
def test_a_failed_or_killed_optimised_build_keeps_the_first_tier_training(how, said, tmp_path):
    if tiers.first_tier_compiler() is None:
        requires("tcc")
    graph = irregular.graph(100, seed=7)
    X, Y = rows(graph)
    net = compile_graph(graph, compiler=fake_compiler(tmp_path, how), tiered=True, cache=tmp_path)
    assert net.tier == "first"
    net._background.done.wait(30)
    with pytest.warns(tiers.TierWarning, match="goes on with the first tier") as caught:
        loss = net.train(X, Y, 0.05)
    assert said in str(caught[0].message)
    assert np.isfinite(loss) and net.tier == "first" and net.timings["optimised"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        net.train(X, Y, 0.05)
        assert net.wait() == "first"


def test_a_cache_hit_starts_optimised_and_small_programs_are_not_tiered(tmp_path):
    requires("gcc")
    graph = irregular.graph(100, seed=9)
    net = compile_graph(graph, compiler="gcc", tiered=True, cache=seeded_cache(tmp_path, "gcc"))
    assert net.wait(60) == "optimised"
    again = compile_graph(graph, compiler="gcc", tiered=True, cache=tmp_path)
    assert again.tier == "optimised" and again.build.cached
    assert compile_graph(graph, compiler="gcc", cache=seeded_cache(tmp_path / "small", "gcc")).tier is None  # tiered=None: small C
    with pytest.raises(TypeError, match="tiered must be"):
        compile_graph(graph, compiler="gcc", tiered="yes")


def test_the_tiered_module_forwards_the_api(tmp_path, gate):
    requires("gcc")
    graph = irregular.graph(100, seed=11)
    net = compile_graph(graph, compiler="gcc", tiered=True, cache=seeded_cache(tmp_path, "gcc"), outputs=graph.outputs)
    assert {"train", "predict", "params", "optimizer_state", "wait", "tier"} <= set(dir(net))
    values = [Value(p.data) for p in graph.params]
    codegen.copy_from_values(net, values)
    codegen.copy_to_values(net, values)
    X, _ = rows(graph, 3)
    predicted = np.asarray(net.predict(np.hstack([X, X[:, :1]])))
    assert predicted.shape == (3, net.n_outputs)
    net.set_threads(1)
    gate.set()
    net.wait(60)
    assert net.threads() == 1 and "optimised tier" in repr(net)


def test_straight_line_programs_get_one_backward_in_short_functions():
    graph = irregular.graph(3_000, seed=1)
    program = ir.lower(graph.loss, graph.inputs, graph.params)
    assert ir.straight_line_heavy(program) and not program.sgd_in_backward
    sources = codegen.generate(graph.loss, graph.inputs, graph.params, batch=1, table=False)
    text = "".join(sources)
    assert "backward_sgd_body_0(" not in text and "backward_tracked_body_0(" not in text
    assert text.count("CHUNK void backward_body_") >= len(program.backward) // emit.STRAIGHT_LINE_CHUNK_STATEMENTS
    assert "backward written once" in codegen.explain(graph.loss, graph.inputs, graph.params, table=False).summary()


@pytest.fixture
def every_program_straight_line(monkeypatch):
    monkeypatch.setattr(ir, "ONE_BACKWARD_MIN_STATEMENTS", 1)


def test_gcc_builds_straight_line_units_at_o1_bit_for_bit(every_program_straight_line, tmp_path, monkeypatch):
    """gcc compiles the extra units of straight-line code at -O1 (compilers.py's straight_line_opt),
    the model's own unit at the build's -O; the unit flags are part of the build key; what it
    trains is tcc's bit for bit."""
    requires("gcc")
    requires("tcc")
    graph = irregular.graph(400, seed=2)
    sources = codegen.generate(graph.loss, graph.inputs, graph.params, batch=1, table=False)
    units = [s for s in sources if not isinstance(s, templates.SharedSource)]
    assert len(units) >= 2 and type(units[0]) is str
    assert all(type(s) is templates.StraightLineSource for s in units[1:])
    gcc = toolchain.find_compiler("gcc")
    assert toolchain.build_key(units, "nn", gcc) != toolchain.build_key([str(s) for s in units], "nn", gcc)
    commands = []
    run = toolchain.run_compiler
    monkeypatch.setattr(toolchain, "run_compiler", lambda command, *args: commands.append(command) or run(command, *args))
    net = compile_graph(graph, compiler="gcc", tiered=False, cache=seeded_cache(tmp_path / "gcc", "gcc"),
                        outputs=graph.outputs)
    levels = {c[c.index("-c") + 1].rsplit("/", 1)[1].split(".", 1)[1]: next(f for f in c if f.startswith("-O"))
              for c in commands if "-c" in c}
    assert levels.pop("c") == "-O2" and len(levels) == len(units) - 1 and set(levels.values()) == {"-O1"}
    reference = compile_graph(graph, compiler="tcc", tiered=False, cache=tmp_path / "tcc", outputs=graph.outputs)
    X, Y = rows(graph)
    for module in (net, reference):
        module.train(X, Y, 1e-2)
    np.testing.assert_array_equal(np.asarray(net.params), np.asarray(reference.params))
    assert np.array_equal(net.predict(X), reference.predict(X))


@pytest.mark.parametrize("compiler", ["tcc", "gcc"])
def test_random_graphs_in_the_bounded_form_equal_the_interpreter(compiler, every_program_straight_line):
    """test_compile's random graphs, lowered as a straight-line-heavy program."""
    requires(compiler)
    check_random_graphs("fused", compiler, opt=2)


@pytest.mark.parametrize("compiler", ["tcc", "gcc"])
def test_train_in_the_bounded_form_equals_the_step_api(compiler, every_program_straight_line, tmp_path):
    """batch-1 train() steps after the one backward: the step-by-step API's numbers."""
    requires(compiler)
    graph = irregular.graph(150, seed=2)
    X, Y = rows(graph, 10)
    net = compile_graph(graph, compiler=compiler, cache=seeded_cache(tmp_path, compiler), tiered=False)
    steps = compile_graph(graph, compiler=compiler, cache=tmp_path, tiered=False)
    net.train(X, Y, 0.05)
    step_by_step(steps, X, Y, 0.05)
    np.testing.assert_array_equal(np.asarray(net.params), np.asarray(steps.params))


def step_by_step(net, X, Y, lr):
    """The step-by-step API over the rows (X, then Y, into the inputs): a step of the module's
    optimizer each."""
    for x, y in zip(X, Y):
        net.set_input(np.concatenate([x, y]))
        net.zero_grad()
        net.forward()
        net.backward()
        net.update(lr)


def test_a_first_tier_that_does_not_build_leaves_the_optimised_build(tmp_path, monkeypatch):
    requires("gcc")
    broken = codegen.backend.toolchain.find_compiler(fake_compiler(tmp_path, "echo 'tcc: error: no such builtin' >&2; exit 1"))
    monkeypatch.setattr(tiers, "first_tier_compiler", lambda: broken)
    graph = irregular.graph(100, seed=13)
    with pytest.warns(tiers.TierWarning, match="no such builtin"):
        net = compile_graph(graph, compiler="gcc", tiered=True, cache=seeded_cache(tmp_path, "gcc"))
    assert net.tier is None and not net.build.cached


@pytest.mark.parametrize("label", ["tcc", "libtcc"])
def test_the_tiers_bench_measures_every_config(label, tmp_path):
    """`make bench`'s irregular graphs (bench/tiers.py): a config's module runtime seeded into a
    directory once, then each form built into a copy of it and timed; libtcc, which builds in
    memory, leaves that directory empty (a missing one stopped the bench)."""
    compiler, opt = bench_tiers.CONFIGS[label]
    requires(compiler)
    seeded = tmp_path / label
    assert bench_tiers.seeded_runtime(compiler, opt, seeded) > 0
    graph = irregular.graph(60, seed=2)
    figures = [bench_tiers.measure(graph, compiler, opt, seeded, **bench_tiers.FORMS[form])
               for form in ("table", "straight")]
    steps, ratios = bench_tiers.step_seconds([f["net"] for f in figures], graph, repeats=1)
    assert all(s > 0 for s in steps) and ratios[0] == 1.0
