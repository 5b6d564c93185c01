"""The table form (codegen/write/table.py, templates/table.c): a program's single statements as
rows that the module runtime's loops run. It computes the straight-line C's numbers bit for bit
(the same formulas, sums and gradient orders: forward, gradients, train() with SGD and Adam,
predict) on random irregular graphs and on a graph holding every op the fused mode lowers to, with
TCC, GCC, Clang and zig, float64 and float32, but for the ops with a row kernel (exp, tanh), whose
rows run the kernel (within its bound of the C library's function; the bits with the formulas
instead, table.ROW_KERNELS); it equals the interpreter on test_compile's random graphs; it is the
default for big irregular graphs with an optimising compiler; bad options are clear errors."""
import random

import numpy as np
import pytest
from conftest import compiler_diagonal, have, requires
from test_compile import check_cases, random_graph_cases
from test_tiers import step_by_step

import codegen
from bench import irregular
from codegen.lower import ir
from codegen.write import table as tables
from micrograd_c import Value, gather, ops


def every_op_graph(seed=0):
    """A graph holding every op of the op table that the fused mode keeps (`max` becomes a
    maximum, of two or more), short and long dots (one too long for a row: compiled), constants
    (terms, factors, a base), a gather of a token input, and alike nodes (a small loop nest).
    (loss, inputs, params, outputs, rows X, Y)."""
    rng = random.Random(seed)
    params = [Value(rng.uniform(-0.8, 0.8)) for _ in range(24)]
    inputs = [Value(rng.uniform(-1, 1)) for _ in range(4)] + [Value(1)]  # the last: a token, an index
    x, token = inputs[:4], inputs[4]
    p = params
    nodes = [p[0] * x[0] + p[1], (p[2] * x[1]).tanh(), x[2] + p[3], p[4] * x[3]]
    for layer in range(3):
        a, b, c, e = nodes[-4:]
        nodes += [
            (a * b).tanh(), (a + c).sigmoid(), (b - e).relu(), (c * e).exp().tanh(),
            (a * a + 1.0).log(), (b * b + 0.5) ** (c * p[5] + 0.3), 1.5 ** (e * p[6]), (a * 0.7 + 1.2) ** -1,
            (b * b + 0.2) ** -0.5, (c * c + 0.3) ** 3, (e * e + 0.4) ** -1.5, (a * a + 1.0) ** -2, a ** 2,
            a.max(b), a.max(c).max(e * 0.5), gather([a, b, c * 2.0, 0.25], token),
            a + b + c + e, 2.0 * a + b * c + p[7] * e + 0.5, sum((p[8 + k] * nodes[-1 - k % 4] for k in range(12)), p[20]),
        ]
        nodes.append(sum(nodes[-19:], Value(0.0)) * 0.05)
    nodes.append(sum((params[k % 24] * nodes[-1 - k] for k in range(40)), Value(0.0)))  # a dot too long for a row
    nodes += [(nodes[-1] * p[k]).tanh() for k in range(5)]  # alike: a loop nest of five
    outputs = nodes[-6:]
    loss = sum((o * o for o in outputs), Value(0.0)) * 0.1
    data = np.random.default_rng(seed).uniform(-1, 1, (12, 5))
    data[:, 4] = np.arange(12) % 7 - 3  # tokens -3..3 of the 4 candidates: negative ones too
    return loss, inputs, params, outputs, np.ascontiguousarray(data[:, :4]), np.ascontiguousarray(data[:, 4:])


def irregular_case(ops_=600, seed=3):
    graph = irregular.graph(ops_, seed)
    data = np.random.default_rng(seed).uniform(-1, 1, (12, len(graph.inputs)))
    return (graph.loss, graph.inputs, graph.params, graph.outputs, np.ascontiguousarray(data[:, :-1]),
            np.ascontiguousarray(data[:, -1:]))


CASES = {"every op": every_op_graph, "irregular": irregular_case}


@pytest.fixture
def formulas(monkeypatch):
    """Every row computes the op table's formula (no row kernel: the straight-line statement's bits)."""
    monkeypatch.setattr(tables, "ROW_KERNELS", False)


@pytest.fixture
def loops_compiled(monkeypatch):
    """Loop nests stay compiled (the table takes single statements only): a loop nest sums a shared
    operand's gradient in a register, where rows would add to it one by one."""
    monkeypatch.setattr(tables, "LOOP_MAX_MEMBERS", 0)


def results(case, table, **options):
    """observed() of a module of `case` in the table form (table=True) or not."""
    loss, inputs, params, outputs, X, Y = case
    net = codegen.compile(loss, inputs, params, outputs, batch=1, tiered=False, input_grads=True, table=table,
                          **options)
    return net, observed(net, X, Y)


def observed(net, X, Y):
    """Forward, outputs, predict, gradients (params and inputs) of the first row, then the
    parameters after train() with the module's optimizer and after the step API."""
    got = {}
    net.set_input(np.concatenate([X[0], Y[0]]))
    got["loss"] = net.forward()
    got["outputs"] = list(net.outputs())
    net.zero_grad()
    net.backward()
    got["grad"] = np.asarray(net.grad)[:net.n_params + net.n_inputs].copy()
    got["predict"] = np.asarray(net.predict(np.hstack([X, Y]))).copy()
    got["train"] = net.train(X, Y, 0.05, seed=1)
    got["params"] = np.asarray(net.params).copy()
    step_by_step(net, X, Y, 0.05)
    got["steps"] = np.asarray(net.params).copy()
    return got


def assert_same(a, b):
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float64", "float32"])), indirect=["compiler"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_table_form_computes_the_straight_line_bits(compiler, dtype, name, loops_compiled, formulas):
    case = CASES[name]()
    optimizer = codegen.Adam() if name == "irregular" else None
    _, table = results(case, True, compiler=compiler, dtype=dtype, optimizer=optimizer)
    _, straight = results(case, False, compiler=compiler, dtype=dtype, optimizer=optimizer)
    assert_same(table, straight)
    loss, inputs, params, outputs, *_ = case
    for form in (True, False):
        sources = codegen.generate(loss, inputs, params, outputs, batch=1, table=form)
        assert ("table_forward(table +" in sources[0]) is form


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float64", "float32"])), indirect=["compiler"])
def test_rows_with_a_row_kernel_run_it(compiler, dtype, loops_compiled):
    """By default the rows of exp and tanh go through exp_gather and tanh_gather: every figure within
    the fused bound of the straight-line C's (libm's exp and tanh), and not all of them its bits."""
    case = every_op_graph()
    runtime = tables.runtime_cases(dtype)["TABLE_FORWARD"]
    assert "tanh_gather(d, w, count)" in runtime and "exp_gather(d, w, count)" in runtime
    net, table = results(case, True, compiler=compiler, dtype=dtype)
    _, straight = results(case, False, compiler=compiler, dtype=dtype)
    rtol = 1e-12 if dtype == "float64" else 1e-5
    differ = []
    for key in table:
        np.testing.assert_allclose(np.asarray(table[key], dtype=float), np.asarray(straight[key], dtype=float),
                                   rtol=rtol, atol=rtol, err_msg=key)
        differ.append(not np.array_equal(np.asarray(table[key]), np.asarray(straight[key])))
    assert any(differ)  # (the kernels' values are not libm's bits: the rows do run them)


def test_every_op_the_fused_mode_keeps_is_in_the_rows(loops_compiled):
    loss, inputs, params, outputs, *_ = every_op_graph()
    program = ir.lower(loss, inputs, params, outputs)
    plan = tables.plan(program)
    rows = [n for g in program.forward if tables.rowable(g) for n in g.members]
    kinds = {n.op.name if n.kind == "op" else "dot" for n in rows}
    # the op table's `max` is the fused mode's maximum (ir.find_maxima): every other op is a row's
    assert kinds == (set(ops.OPS) - {"max"}) | {"dot"}
    maxima = [len(n.args) for n in rows if n.kind == "op" and n.op.selects == "largest"]
    assert 2 in maxima and max(maxima) > 2  # a cheap row, and one of its own
    # compiled: the loop nests (this fixture's), the dot of 40 products (the kernels sum in lanes)
    assert all(g.shape or len(g.first.a) == 40 for g in plan.compiled)
    assert any(not g.shape for g in plan.compiled)


def test_loop_nests_as_rows_equal_the_interpreter():
    """The default: loop nests of a few nodes become rows (their gradients summed row by row)."""
    loss, inputs, params, outputs, X, Y = every_op_graph()
    program = ir.lower(loss, inputs, params, outputs)
    assert any(g.shape and tables.rowable(g) for g in program.forward)
    net = codegen.compile(loss, inputs, params, outputs, compiler="tcc", batch=1, table=True)
    net.set_input(np.array([v.data for v in inputs]))
    net.forward()
    net.zero_grad()
    net.backward()
    for v in params:
        v.grad = 0
    loss.backward()
    np.testing.assert_allclose(np.asarray(net.params), [v.data for v in params])
    np.testing.assert_allclose(np.asarray(net.grad)[:net.n_params], [v.grad for v in params], rtol=1e-9, atol=1e-12)
    assert net.forward() == pytest.approx(loss.data, rel=1e-12)


@pytest.mark.parametrize("compiler, mode", list(compiler_diagonal(["fused", "float32"])), indirect=["compiler"])
def test_random_graphs_in_the_table_form_equal_the_interpreter(compiler, mode):
    """test_compile's random graphs (every op of its recipes, sums of products), all rows."""
    check_cases(random_graph_cases(), mode, compiler=compiler, opt=2, table=True)


def test_train_with_a_batch_runs_sample_by_sample(loops_compiled):
    """The table form has no batched form: train(batch_size=4) steps on each batch's mean gradient,
    computed sample by sample, as the straight-line module of batch=1 does."""
    loss, inputs, params, outputs, X, Y = irregular_case()
    nets = [codegen.compile(loss, inputs, params, compiler="tcc", batch=b, table=t) for b, t in ((128, True), (1, False))]
    losses = [net.train(X, Y, 0.05, batch_size=4, seed=2) for net in nets]
    assert losses[0] == losses[1]
    np.testing.assert_array_equal(np.asarray(nets[0].params), np.asarray(nets[1].params))


def test_by_default_for_big_irregular_graphs_and_explain(monkeypatch):
    """table=None gives the table form to a program mostly single statements, at least
    TABLE_MIN_STATEMENTS of them, with an optimising compiler (tcc, or -O0: the straight-line C);
    table=False the straight-line C whatever the graph; True the rows; explain says which and why."""
    monkeypatch.setattr(tables, "TABLE_MIN_STATEMENTS", 1_000)  # (a smaller graph than the default's)
    small = irregular.graph(300, seed=4)
    big = irregular.graph(4_000, seed=4)
    for graph, default in ((small, False), (big, True)):
        program = ir.lower(graph.loss, graph.inputs, graph.params)
        assert tables.chosen(program, None) is default and not tables.chosen(program, False)
        assert tables.chosen(program, True)
        for table in (None, False, True):
            summary = codegen.explain(graph.loss, graph.inputs, graph.params, table=table).summary()
            assert ("the table form:" in summary) is (default if table is None else table)
        reason = codegen.explain(graph.loss, graph.inputs, graph.params).summary()
        assert ("by default: " in reason) is default and ("table=False" in reason) is default
    assert tables.single_statements(ir.lower(big.loss, big.inputs, big.params)) >= 1_000
    # the compiler decides too: tcc (its straight-line C builds at once) and -O0 keep the straight-line C
    assert tables.for_compiler(None, True) is None and tables.for_compiler(None, False) is False
    assert tables.for_compiler(True, False) is True
    assert not codegen._optimises("tcc", 2)
    optimising = [name for name in ("gcc", "clang", "zig") if have(name)]  # (a bare machine: zig's wheel)
    assert all(not codegen._optimises(name, 0) and codegen._optimises(name, 1) for name in optimising)
    net = codegen.compile(big.loss, big.inputs, big.params, compiler="tcc", batch=1, tiered=False)
    assert "table_forward(table +" not in net.build.source.read_text()
    # the model's own C: no statement per node, and the same text every time
    first, again = (codegen.generate(big.loss, big.inputs, big.params, batch=1) for _ in range(2))
    assert first == again
    assert len(first) == 3 and "TABLE_TEXT" in first[0]  # the model's unit and the runtime's two
    assert "CHUNK void forward_rest_" not in first[0] and "CHUNK void backward_body_" not in first[0]
    straight = codegen.generate(big.loss, big.inputs, big.params, batch=1, table=False)
    assert "table_forward(table +" not in straight[0] and "CHUNK void backward_body_" in "".join(straight)


def test_bad_table_options_are_clear_errors():
    graph = irregular.graph(100, seed=5)
    with pytest.raises(TypeError, match="table must be True, False or None"):
        codegen.compile(graph.loss, graph.inputs, graph.params, compiler="tcc", table="yes")
    with pytest.raises(ValueError, match="table=True needs fuse=True"):
        codegen.generate(graph.loss, graph.inputs, graph.params, fuse=False, table=True)
    if have("gcc"):  # a tiered compile, whose lowering would run in the background: at once too
        with pytest.raises(ValueError, match="table=True needs fuse=True"):
            codegen.compile(graph.loss, graph.inputs, graph.params, compiler="gcc", fuse=False, table=True,
                            tiered=True)


