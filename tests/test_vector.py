"""The vector level: alike nodes become loop nests. Structure of the lowered programs for the
models the benchmark relies on, and equivalence with the interpreter for models written the ways
micrograd users write them (a batch in one graph with constant data, a convolution, deep MLPs).
Fused-mode tolerance as in test_compile: loops sum dots and reductions in other orders."""

import functools
import math
import random
import re

import numpy as np
import pytest

import codegen
import templates
from codegen.lower import ir, vector
from micrograd_c import MLP, Layer, Value, cross_entropy, dot
from conftest import compiler_diagonal
from test_compile import assert_equivalent


def lowered(build, n_params, n_inputs):
    params, inputs = [Value(0.1 * i - 0.5) for i in range(n_params)], [Value(0.0) for _ in range(n_inputs)]
    return ir.lower(build(params, inputs), inputs, params)


def loops(program):
    return [g for g in program.forward if g.shape]


# ---- models, written as users write them, over given parameter and input Values ----------------

def moons(n, seed=1):
    rng = np.random.default_rng(seed)
    t = np.linspace(0, math.pi, n // 2)
    X = np.concatenate([np.stack([np.cos(t), np.sin(t)], 1), np.stack([1 - np.cos(t), 0.5 - np.sin(t)], 1)])
    return X + rng.normal(scale=0.1, size=X.shape), np.repeat([-1.0, 1.0], n // 2)


def assign(model, params):
    """Makes `model` compute with the given parameter Values, in model.parameters() order."""
    values = iter(params)
    for neuron in (n for layer in model.layers for n in layer.neurons):
        neuron.w = [next(values) for _ in neuron.w]
        neuron.b = next(values)
    return model


@functools.cache
def demo_case(n_samples=12, hidden=8):
    """micrograd's demo: the whole batch in one graph, data as constants, SVM loss + L2."""
    X, y = moons(n_samples)
    random.seed(1337)
    init = [p.data for p in MLP(2, [hidden, hidden, 1]).parameters()]

    def build(params, inputs):
        model = assign(MLP(2, [hidden, hidden, 1]), params)
        scores = [model(list(map(Value, row))) for row in X]
        losses = [(1 + -yi * si).relu() for yi, si in zip(y, scores)]
        data_loss = sum(losses) * (1.0 / len(losses))
        return data_loss + 1e-4 * sum(p * p for p in params)
    return build, init


@functools.cache
def cnn_case(size=8, filters=2, classes=4):
    """3x3 valid convolution, ReLU, dense layer, softmax cross-entropy on one-hot inputs."""
    n_conv = filters * 10
    out = size - 2
    random.seed(3)
    n_dense = classes * (filters * out * out + 1)
    init = [random.uniform(-0.5, 0.5) for _ in range(n_conv + n_dense)]

    def build(params, inputs):
        w = [[params[f * 9 + 3 * ky:f * 9 + 3 * ky + 3] for ky in range(3)] for f in range(filters)]
        b = params[filters * 9:filters * 10]
        x = [inputs[size * i:size * (i + 1)] for i in range(size)]
        feats = [sum((w[f][ky][kx] * x[i + ky][j + kx] for ky in range(3) for kx in range(3)), b[f]).relu()
                 for f in range(filters) for i in range(out) for j in range(out)]
        dense = assign(MLP(len(feats), [classes]), params[n_conv:])
        return cross_entropy(dense(feats), inputs[size * size:])
    return build, init, size * size + classes


def cnn_rows(size=8, classes=4, n=3, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        target = [0.0] * classes
        target[k % classes] = 1.0
        rows.append(list(rng.uniform(0, 1, size * size)) + target)
    return rows


@functools.cache
def mlp_ce_case(nin=12, nouts=(10, 6, 3), seed=2):
    random.seed(seed)
    init = [p.data for p in MLP(nin, list(nouts)).parameters()]

    def build(params, inputs):
        model = assign(MLP(nin, list(nouts)), params)
        return cross_entropy(model(inputs[:nin]), inputs[nin:])
    return build, init


def mlp_rows(nin=12, classes=3, n=3):
    rng = np.random.default_rng(1)
    return [list(rng.normal(size=nin)) + [float(c == k % classes) for c in range(classes)] for k in range(n)]


# ---- equivalence -----------------------------------------------------------------------------

# -O0 and -O2 on TCC, one of them on each optimising compiler (the rest in the slow set)
OPT_DIAGONAL = pytest.mark.parametrize("compiler, opt", list(compiler_diagonal([2, 0], lambda o: f"O{o}")),
                                       indirect=["compiler"])


@OPT_DIAGONAL
def test_demo_batch_in_one_graph(compiler, opt):
    build, init = demo_case()
    assert_equivalent(build, init, [[]], "fused", compiler=compiler, opt=opt)


@OPT_DIAGONAL
def test_convolution(compiler, opt):
    build, init, n_inputs = cnn_case()
    assert_equivalent(build, init, cnn_rows(), "fused", compiler=compiler, opt=opt)


@OPT_DIAGONAL
def test_deep_mlp_cross_entropy(compiler, opt):
    build, init = mlp_ce_case()
    assert_equivalent(build, init, mlp_rows(), "fused", compiler=compiler, opt=opt)


def test_batch_of_input_rows_sharing_weights(compiler):
    """Several samples' inputs in one graph (a minibatch written out): one loop over samples."""
    random.seed(5)
    init = [p.data for p in MLP(3, [5, 1]).parameters()]

    def build(params, inputs):
        model = assign(MLP(3, [5, 1]), params)
        return sum(((model(inputs[4 * s:4 * s + 3]) - inputs[4 * s + 3]) ** 2 for s in range(6)), Value(0.0))
    rows = [list(np.random.default_rng(2).normal(size=24))]
    assert_equivalent(build, init, rows, "fused", compiler=compiler, opt=2)
    program = lowered(build, len(init), 24)
    assert any(g.shape == (5, 6) for g in program.forward)  # neurons x samples, one loop (samples inside)


def test_scattered_operands_stay_correct(compiler):
    """Alike neurons reading their inputs in different orders: no constant strides, so the class
    falls back to one statement per node, and stays exact."""
    perms = [[0, 1, 2, 3, 4], [4, 2, 0, 1, 3], [3, 3, 1, 0, 2]]

    def build(params, inputs):
        outs = [sum((params[5 * k + i] * inputs[j] for i, j in enumerate(p)), Value(0.0)).tanh()
                for k, p in enumerate(perms)]
        return sum(outs[1:], outs[0])
    rows = [[0.3, -0.2, 0.5, 0.9, -1.1]]
    assert_equivalent(build, [0.1 * i - 0.6 for i in range(15)], rows, "fused", compiler=compiler, opt=2)


def test_constant_factors_in_sums(compiler):
    """Products with one constant factor are factor-list elements: data columns that differ by
    member (short lists written out, 20-long ones through the kernels, in a loop and alone), a
    shared scale (a - b is a + b * -1), 2-term sums that absorb a product, and a product of two
    constants that stays a term."""
    rng = np.random.default_rng(7)
    data = rng.normal(size=(6, 20))

    def build(params, inputs):
        short = [(params[0] + params[1] * float(x[0]) + float(x[1]) * params[2]).tanh() for x in data]
        long = [sum((params[3 + k] * float(x[k]) for k in range(20)), params[23]).relu() for x in data]
        alone = sum((params[k] * float(data[0][k]) for k in range(20)), Value(0.25) * Value(-2.0))
        diffs = [s_ - l_ for s_, l_ in zip(short, long)]  # 2 terms: s + l * -1
        hinge = [(1 + float(-x[2]) * d).relu() for x, d in zip(data, diffs)]
        return sum(hinge) * (1.0 / len(hinge)) + alone * inputs[0] + 1e-3 * sum(p * p for p in params)
    init = list(np.random.default_rng(8).uniform(-0.5, 0.5, 24))
    assert_equivalent(build, init, [[0.7], [-1.3]], "fused", compiler=compiler, opt=2)
    program = lowered(build, len(init), 1)
    dots = [g for g in program.forward if g.first.kind == "dot" and g.shape]
    assert any(g.shape == (6,) and len(g.first.a) == 20 for g in dots)  # the 20-long rows, one loop
    assert any(g.shape == (6,) and len(g.first.a) == 2 for g in dots)   # the short ones
    assert not any(g.first.kind == "op" and g.first.op.name == "mul" and g.shape for g in program.forward)


@functools.cache
def batch_layer_case(loss):
    """test_layer_over_a_batch_kernels's model: (build, initial parameters, input rows)."""
    X = np.random.default_rng(3).normal(size=(37, 3))
    random.seed(9)
    init = [p.data for p in MLP(3, [6, 5, 1]).parameters()]

    def build(params, inputs):
        model = assign(MLP(3, [6, 5, 1]), params)
        scores = [model(list(map(Value, x))) for x in X]
        if loss == "squares":
            terms = [(s + inputs[0]) ** 2 for s in scores]
        else:
            terms = [(float(-100.0 if 8 <= k < 24 else 1.0) + float((-1) ** k) * s * inputs[0]).relu()
                     for k, s in enumerate(scores)]
        return sum(terms, Value(0.0)) * (1.0 / len(X))
    return build, init, [[0.5], [0.2]]


@pytest.mark.parametrize("compiler, case", list(compiler_diagonal(
    [("fused", "squares"), ("float32", "hinge"), ("fused", "hinge"), ("float32", "squares")], "-".join)),
    indirect=["compiler"])
def test_layer_over_a_batch_kernels(compiler, case):
    """A layer over a batch of 37 constant samples: forward, one matmul_set call (the matrix
    product of templates/kernels/gemm.c: six neurons by two vectors of samples, then the tails);
    its weights' gradients are dot_rows calls (each neuron's gradient row against its 6 inputs'
    rows, four rows at a time, then the rest; with the hinge, samples 8-23 are flat whatever the
    weights: whole chunks of zero gradients that dot_rows skips), its inputs' gradients one
    matmul_acc call, the last layer's one too (one neuron). All equal to the interpreter."""
    mode, loss = case
    build, init, rows = batch_layer_case(loss)
    assert_equivalent(build, init, rows, mode, compiler=compiler, opt=2)
    params, inputs = [Value(v) for v in init], [Value(0.0)]
    source = "\n".join(codegen.generate(build(params, inputs), inputs, params))
    assert "dot_rows(g + " in source and ", 37, 6, g + " in source  # the second layer: 6 rows of 37
    assert "matmul_acc(g + " in source and ", 5, 37, 6, epilogue_" in source and ", 1, 37, 5, epilogue_" in source
    # forward: the hidden layers one matmul_set each (6 neurons of 3 inputs, 5 of 6) over 37
    # samples, their ReLU applied by the product as it stores the sums (matmul_set's relu: in
    # place, test_activations_in_place; the last neuron, with two loose terms, is a loop)
    assert all(f", {shape}, NULL, NULL, NULL, 0, 1);" in source for shape in ("6, 37, 3", "5, 37, 6"))


IN_PLACE_CASES = ("relu", "tanh", "sigmoid", "output", "read twice", "square")


@functools.cache
def in_place_case(case):
    """test_activations_in_place's model: (build, initial parameters, input rows). A first layer's
    sums over 37 constant samples, then an activation (`case`'s: ReLU, tanh, sigmoid or x ** 2), a ReLU
    layer and a linear one; a hinge loss over the samples times an input, plus another input times
    sample 0's score. "output": the first layer's sums and their activations are outputs too
    (build's `outputs` list gets them); "read twice": the loss reads the sums too."""
    X = np.random.default_rng(5).normal(size=(37, 3))
    random.seed(11)
    model = MLP(3, [6, 5, 1])
    model.layers[0] = Layer(3, 6, nonlin=False)  # (its activation applied below)
    init = [p.data for p in model.parameters()]

    def build(params, inputs, outputs=None):
        first, second, last = assign(model, params).layers
        sums = [first(list(map(Value, x))) for x in X]
        act = {"tanh": lambda v: v.tanh(), "sigmoid": lambda v: v.sigmoid(), "square": lambda v: v ** 2}.get(
            case, lambda v: v.relu())
        acts = [[act(v) for v in s] for s in sums]
        scores = [last(second(a)) for a in acts]
        hinge = [(1.0 + float((-1) ** k) * s * inputs[0]).relu() for k, s in enumerate(scores)]
        loss = sum(hinge, Value(0.0)) * (1.0 / len(X)) + inputs[1] * scores[0]
        if case == "read twice":
            loss = loss + 0.01 * sum((v * v for s in sums for v in s), Value(0.0))
        if outputs is not None and case == "output":
            outputs += [v for s in sums + acts for v in s]
        return loss
    return build, init, [[0.5, 0.1], [-0.3, 0.2], [0.8, -0.4]]


@pytest.mark.parametrize("compiler, case", list(compiler_diagonal(IN_PLACE_CASES)), indirect=["compiler"])
def test_activations_in_place(compiler, case):
    """A layer over a batch whose activation alone reads its sums, and whose derivative reads the
    activation's results, not its argument (ReLU, tanh, sigmoid), writes its sums where the
    activation's results go and applies it there (Forward._in_place; a ReLU as matmul_set stores
    them, its `relu`, tanh and sigmoid by an epilogue calling their row kernels, tanh_range and
    sigmoid_range); in train()'s backward, which clears, the
    product of the next layer's inputs' gradients goes where the activation's argument's do, its
    epilogue multiplying there (Backward._products; for x ** 2 and an output too). Not in the forward where the
    sums are an output too, are read by the loss too, or the derivative reads them (x ** 2). Each
    equals the interpreter (the step API), and train() equals the step API's loop, bit for bit."""
    build, init, rows = in_place_case(case)
    assert_equivalent(build, init, rows, "fused", compiler=compiler, opt=2)
    params, inputs, outputs = [Value(v) for v in init], [Value(x) for x in rows[0]], []
    loss = build(params, inputs, outputs)
    source = "\n".join(codegen.generate(loss, inputs, params, outputs=outputs))
    # (the first layer's product, 6 neurons by 37 samples of 3 inputs; the second's inputs' gradients)
    in_place = [re.search(r"matmul_set\((d \+ \d+), .*, 6, 37, 3, NULL, (NULL, NULL, 0, 1|epilogue_\d+, \1, 37, 0)\);",
                          source) is not None,
                re.search(r"matmul_acc\((g \+ \d+), .*, 5, 37, 6, epilogue_\d+, \1, ", source) is not None]
    assert in_place == [case in ("relu", "tanh", "sigmoid"), case != "read twice"], (case, in_place)
    if case in ("tanh", "sigmoid"):
        assert f"{case}_range(y, y, count);" in source
    nets = [codegen.compile(loss, inputs, params, outputs=outputs, compiler=compiler) for _ in range(2)]
    nets[1].forward()  # (rows[0]'s inputs, as the graph was built)
    np.testing.assert_allclose(nets[1].outputs(), [v.data for v in outputs], rtol=1e-12)
    X, Y = (np.ascontiguousarray(np.array(rows)[:, k:k + 1]) for k in (0, 1))
    nets[0].train(X, Y, 0.05)
    for row in rows:  # (the step API's backward does not clear: not in place)
        nets[1].set_input(np.array(row))
        nets[1].forward()
        nets[1].zero_grad()
        nets[1].backward()
        nets[1].update(0.05)
    np.testing.assert_array_equal(np.asarray(nets[0].params), np.asarray(nets[1].params))


def test_shared_constant_in_a_moving_list(compiler):
    """score - target, where the score is a neuron over a batch: the subtraction joins the
    neuron's sum as `target * -1`, a shared -1 in the factor list of the hidden values that move
    from sample to sample. The -1 gets a slot per sample (moving alike), and the neuron stays
    one loop over the batch. (The neurons are written as chains: a Dot, what Neuron builds, is
    one node, which a sum that reads it takes as a term.)"""
    X = np.random.default_rng(4).normal(size=(20, 3))
    random.seed(10)
    init = [p.data for p in MLP(3, [6, 1]).parameters()]

    def chain(neuron, x):
        return sum((w * xi for w, xi in zip(neuron.w, x)), neuron.b)

    def build(params, inputs):
        hidden, out = assign(MLP(3, [6, 1]), params).layers

        def score(x):
            return chain(out.neurons[0], [chain(n, x).relu() for n in hidden.neurons])
        return sum(((score(list(map(Value, x))) - inputs[0]) ** 2 for x in X), Value(0.0)) * (1.0 / len(X))
    assert_equivalent(build, init, [[0.5], [-0.2]], "fused", compiler=compiler, opt=2)
    program = lowered(build, len(init), 1)
    scores = [g for g in program.forward if g.first.kind == "dot" and len(g.first.a) == 7]
    assert len(scores) == 1 and scores[0].shape == (20,)


def test_heads_read_as_one_list_keep_their_order(compiler):
    """microgpt's first position: each head's weight times its values, 4 heads x 5 values with no
    parameter operand, then the output projection reads the 20 as one list. The loop over heads
    stays outermost (moved inside, as a batch moves, the list would sit at two strides: a table of
    offsets, the projection not a product), and the projection reads it at a constant stride."""
    random.seed(3)
    n_in, heads, hd, n_out = 6, 4, 5, 3
    init = [random.gauss(0, 0.5) for _ in range((heads * hd + heads) * n_in + n_out * heads * hd)]

    def build(params, inputs):
        at = (heads * hd + heads) * n_in
        rows = [params[i:i + n_in] for i in range(0, at, n_in)]
        wo = [params[i:i + heads * hd] for i in range(at, len(params), heads * hd)]
        x = inputs[:n_in]
        v = [dot(w, x) for w in rows[:heads * hd]]
        weight = [dot(w, x).sigmoid() for w in rows[heads * hd:]]
        head_out = [weight[h] * v[h * hd + j] for h in range(heads) for j in range(hd)]
        return sum((y * y for y in (dot(w, head_out) for w in wo)), Value(0.0))
    rows = [list(np.random.default_rng(6).normal(size=n_in))]
    assert_equivalent(build, init, rows, "fused", compiler=compiler, opt=2)
    program = lowered(build, len(init), n_in)
    [products] = [g for g in program.forward if g.first.kind == "op" and g.first.op.name == "mul"]
    assert products.shape == (heads, hd)
    [projection] = [g for g in program.forward if g.first.kind == "dot" and len(g.first.a) == heads * hd]
    assert projection.operands.a.contiguous and projection.operands.b.contiguous


# ---- structure -------------------------------------------------------------------------------

def test_mnist_mlp_structure():
    """MLP(784, [50, 10]): each layer one dot loop over contiguous rows (no offset tables), the
    activations one loop, and the SGD step inside backward."""
    random.seed(0)
    model = MLP(784, [50, 10])
    inputs = [Value(0.0) for _ in range(794)]
    logits = model(inputs[:784])
    loss, params = cross_entropy(logits, inputs[784:]), model.parameters()
    program = ir.lower(loss, inputs, params, logits)
    outputs = program.forward[:program.n_output_groups]
    assert [(g.first.kind, g.shape) for g in outputs] == [("dot", (50,)), ("op", (50,)), ("dot", (10,))]
    assert all(g.operands.a.contiguous and g.operands.b.contiguous for g in outputs if g.first.kind == "dot")
    assert program.sgd_in_backward
    source = "\n".join(codegen.generate(loss, inputs, params, logits))
    assert "const int32_t offsets_" not in source  # no offset tables: every list is contiguous


def test_demo_is_a_few_loops():
    build, init = demo_case(n_samples=100, hidden=16)
    program = lowered(build, len(init), 0)
    assert len(program.forward) < 20
    first = program.forward[0]  # the first layer: weights times constant data, plus the bias
    assert first.first.kind == "dot" and first.shape == (16, 100) and len(first.first.a) == 2
    assert first.operands.b.start.strides == (0, 1)  # a data column's 100 points side by side
    assert program.constants  # the data points and labels, read by loops from slots
    assert generated_lines(ir.lower(*_demo_graph())) < 300  # was 26,751 lines


def generated_lines(program):
    """Lines of C generated for a program, without the fixed prelude of kernels."""
    from codegen.write import emit
    return len(emit.standalone(program).splitlines()) - len(templates.read("prelude.c").splitlines())


def _demo_graph():
    build, init = demo_case(n_samples=100, hidden=16)
    params = [Value(v) for v in init]
    return build(params, []), [], params


def test_convolution_is_one_loop_nest():
    build, init, n_inputs = cnn_case(size=10, filters=3)
    program = lowered(build, len(init), n_inputs)
    conv = program.forward[0]
    assert conv.first.kind == "dot" and conv.shape == (3, 8, 8)
    assert conv.operands.b.offsets == (0, 1, 2, 10, 11, 12, 20, 21, 22)  # the 3x3 window


def test_grouping_does_not_depend_on_spelling():
    """A layer written with Layer, with dot(), and with a hand-written loop gives the same groups."""
    random.seed(0)

    def with_layer(p, x):
        model = assign(MLP(6, [4]), p)
        return sum(v.tanh() for v in model(x))

    def with_dot(p, x):
        return sum(dot(p[7 * i:7 * i + 6], x, p[7 * i + 6]).tanh() for i in range(4))

    def by_hand(p, x):
        total = 0
        for i in range(4):
            act = p[7 * i + 6]
            for j in range(6):
                act = act + p[7 * i + j] * x[j]
            total = total + act.tanh()
        return total

    shapes = [[(g.first.kind, g.shape) for g in lowered(f, 28, 6).forward] for f in (with_layer, with_dot, by_hand)]
    assert shapes[0] == shapes[1] == shapes[2]
    assert ("dot", (4,)) in shapes[0] and ("op", (4,)) in shapes[0]


def test_decompose():
    rows = np.array([[100 + 16 * s + i, 7 * i, 3 * s] for s in range(5) for i in range(4)])
    shape, strides = vector.decompose(rows)
    assert shape == (5, 4)
    assert strides.tolist() == [[16, 1], [0, 7], [3, 0]]
    assert vector.decompose(np.array([[0], [1], [5]])) is None
    assert vector.decompose(np.array([[3, 4]]))[0] == ()


def test_train_updates_single_contribution_params_in_backward(compiler):
    """A convolution's weights get one gradient contribution per position, the dense layer's one
    each: batch-1 train() updates the dense weights inside backward and the conv weights after
    it, and equals the step-by-step functions."""
    build, init, n_inputs = cnn_case()
    params, inputs = [Value(v) for v in init], [Value(0.0) for _ in range(n_inputs)]
    program = ir.lower(build(params, inputs), inputs, params)
    assert program.sgd_in_backward and program.sgd_after_backward == [(0, 20)]  # 2 filters: 9 + 1 each
    nets = [codegen.compile(build(params, inputs), inputs, params, compiler=compiler) for _ in range(2)]
    rng = np.random.default_rng(4)
    X, labels = rng.uniform(0, 1, size=(12, 64)), rng.integers(0, 4, size=12)
    expected = []
    for x, label in zip(X, labels):
        row = np.zeros(n_inputs)
        row[:64], row[64 + label] = x, 1.0
        nets[0].set_input(row)
        expected.append(nets[0].forward())
        nets[0].zero_grad()
        nets[0].backward()
        nets[0].update(0.05)
    got = nets[1].train(X, labels, 0.05)
    assert got == pytest.approx(np.mean(expected), rel=1e-12)
    np.testing.assert_allclose(np.asarray(nets[1].params), np.asarray(nets[0].params), rtol=1e-12, atol=1e-15)


@pytest.mark.requires("dot")
def test_explain_counts_and_draws_the_program(tmp_path):
    """codegen.explain: the demo as a few loop nests, listed and drawn."""
    explanation = codegen.explain(*_demo_graph())
    assert len(explanation.loops) >= 6 and len(explanation.steps) < 20
    assert sum(s.nodes for s in explanation.loops) > 6_000  # nearly every node is in a loop
    text = str(explanation)
    assert "loop nests" in text and "16 x 100" in text and "relu" in text
    straight = codegen.explain(*_demo_graph(), fuse=False)
    assert not straight.loops and straight.c_lines > 20 * explanation.c_lines
    svg = explanation.draw(tmp_path / "program.svg")
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg")) and "16 x 100" in svg.read_text()


def test_explain_counts_the_copies_of_backward_the_optimizer_gets():
    """Batch-1 SGD steps inside backward only for plain SGD (emit.emit): explain says so."""
    model = MLP(4, [8, 3])
    inputs = [Value(0.5 * i) for i in range(4)]
    graph = (sum(o * o for o in model(inputs)), inputs, model.parameters())
    assert ir.lower(*graph).sgd_in_backward
    assert "backward written two or three times" in codegen.explain(*graph).summary()
    assert "backward written two or three times" in codegen.explain(*graph, optimizer=codegen.SGD()).summary()
    for optimizer in (codegen.Adam(), codegen.SGD(momentum=0.9)):
        assert "backward written once" in codegen.explain(*graph, optimizer=optimizer).summary()


def test_which_classes_read_which_is_linear_in_a_deep_graph():
    """_shared_rows asks whether dot classes read each other, directly or not: the answer carries
    a bit per asked class up a chain of 60,000 classes (full read sets per class, as before, are
    quadratic: a random graph of 100,000 Values ran out of memory)."""
    reads, height = [set()] + [{c - 1} for c in range(1, 60_000)], list(range(60_000))
    below, bit = vector._reads_among(reads, height, [10, 30_000, 59_999])
    assert below[59_999] & bit[10] and below[59_999] & bit[30_000] and below[30_000] & bit[10]
    assert not below[10] and not below[30_000] & bit[59_999]
