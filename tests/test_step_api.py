"""The step-by-step API (set_input, zero_grad, forward, backward, update and the `grad` view)
against micrograd's semantics, run by the interpreter: gradients accumulate over backward() calls
until zero_grad(), update(lr) steps with them, and `grad` shows them exactly whenever it is
looked at, and what is written through it is what update() uses (templates/step.c: with plain
SGD, zero_grad() and update() skip the gradient rows that no backward() wrote since, and a row
with one contribution is kept as rank one). Random sequences of calls, with several backward()
calls between zero_grad()s, reads and writes through the view (and through a numpy array over it
held across calls), train() in between, other optimizers; fused mode, so tolerance 1e-9
(tests/test_compile.py)."""

import gc
import random
import weakref

import numpy as np
import pytest

import codegen
from conftest import compiler_diagonal
from micrograd_c import MLP, Value, cross_entropy

N_IN, HIDDEN, N_CLASSES = 24, 20, 5  # lists of 24 and 20 weights: kernels, so rows are tracked
RTOL = 1e-9
LR = 0.05


def classifier(seed=3):
    random.seed(seed)
    return MLP(N_IN, [HIDDEN, N_CLASSES])


def compile_classifier(compiler, **options):
    model = classifier()
    xs = [Value(0.0) for _ in range(N_IN)]
    ys = [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(xs)
    net = codegen.compile(cross_entropy(logits, ys), xs + ys, model.parameters(), outputs=logits,
                          compiler=compiler, **options)
    return net, np.array([p.data for p in model.parameters()])


def sample_rows(n, seed):
    """Inputs with zeros among them (ReLUs off, sparse rows) and a one-hot target."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, N_IN)) * (rng.random((n, N_IN)) < 0.6)
    labels = rng.integers(0, N_CLASSES, n)
    return np.hstack([x, np.eye(N_CLASSES)[labels]]), x, labels


class Interpreted:
    """micrograd's loop over persistent parameter Values, the module's functions by name."""

    def __init__(self, init, momentum=0.0):
        self.model = classifier()
        self.params = self.model.parameters()
        for p, value in zip(self.params, init):
            p.data = float(value)
        self.row = np.zeros(N_IN + N_CLASSES)
        self.momentum, self.buffer = momentum, None

    def loss(self):
        xs = [Value(float(v)) for v in self.row[:N_IN]]
        return cross_entropy(self.model(xs), [Value(float(v)) for v in self.row[N_IN:]])

    def set_input(self, row):
        self.row = np.array(row)

    def zero_grad(self):
        for p in self.params:
            p.grad = 0.0

    def forward(self):
        return self.loss().data

    def backward(self):
        self.loss().backward()  # adds into the parameters' grads

    def update(self, lr):
        grads = np.array(self.grads())
        if self.momentum:  # torch.optim.SGD, dampening 0: the first step's buffer is the gradient
            self.buffer = grads if self.buffer is None else self.momentum * self.buffer + grads
            grads = self.buffer
        for p, g in zip(self.params, grads):
            p.data -= lr * g

    def train(self, rows, lr):
        """train(X, Y, lr): the gradients zeroed, then a step per row; they end at zero."""
        for row in rows:
            self.set_input(row)
            self.zero_grad()
            self.backward()
            self.update(lr)
        self.zero_grad()

    def grads(self):
        return [p.grad for p in self.params]

    def set_grads(self, index, values):
        for i, v in zip(index, values):
            self.params[i].grad = float(v)

    def values(self):
        return [p.data for p in self.params]


def assert_close(got, expected, what):
    got, expected = np.asarray(got, dtype=float), np.asarray(expected, dtype=float)
    scale = max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=RTOL * scale, err_msg=what)


def module_grads(net):
    return np.asarray(net.grad)[:net.n_params].copy()  # the view and its buffer released at once


def run_sequence(net, init, rng, steps, momentum=0.0, train_rows=None):
    """A random sequence of calls on net and on the interpreter, compared as it goes."""
    net.set_params(init)
    net.zero_grad()
    ref = Interpreted(init, momentum)
    net.set_input(ref.row)  # zeros, as the interpreter's
    rows, x, labels = sample_rows(8, int(rng.integers(1 << 30)))
    held = None  # a numpy array over `grad`, kept across calls
    grad = net.grad  # the `grad` object itself, kept across every call: each use looks afresh
    calls = ["set_input", "zero_grad", "forward", "backward", "backward", "update", "read", "write",
             "hold", "write_held", "release", "read_items", "write_items"] + (["train"] if train_rows is not None else [])
    for step in range(steps):
        call = calls[rng.integers(len(calls))]
        if call == "set_input":
            k = int(rng.integers(len(rows)))
            net.set_input(rows[k])
            ref.set_input(rows[k])
        elif call == "forward":
            assert_close(net.forward(), ref.forward(), f"loss at call {step}")
        elif call == "zero_grad":
            net.zero_grad()
            ref.zero_grad()
        elif call == "backward":  # of the current input: the module's backward needs its forward
            net.forward()
            net.backward()
            ref.backward()
        elif call == "update":
            lr = float(rng.choice([LR, 0.01, -0.02]))
            net.update(lr)
            ref.update(lr)
            assert_close(np.asarray(net.params), ref.values(), f"params after update at call {step}")
        elif call == "read":
            assert_close(module_grads(net), ref.grads(), f"grads read at call {step}")
        elif call == "write":
            index = rng.choice(net.n_params, 30, replace=False)
            values = rng.normal(size=30)
            np.asarray(net.grad)[index] = values
            ref.set_grads(index, values)
        elif call == "hold" and held is None:
            held = np.asarray(net.grad)
        elif call == "write_held" and held is not None:
            assert_close(held[:net.n_params], ref.grads(), f"grads held across calls, at call {step}")
            index = rng.choice(net.n_params, 30, replace=False)
            values = rng.normal(size=30)
            held[index] = values
            ref.set_grads(index, values)
        elif call == "release":
            held = None
        elif call == "read_items":  # by index and by slice, through the object held since the start
            k = int(rng.integers(net.n_params))
            assert_close([grad[k]], [ref.grads()[k]], f"grad[{k}] at call {step}")
            assert_close(grad[:net.n_params].tolist(), ref.grads(), f"grad[:n_params] at call {step}")
        elif call == "write_items":
            index = rng.choice(net.n_params, 3, replace=False)
            values = rng.normal(size=3)
            for i, v in zip(index, values):
                grad[int(i)] = float(v)
            ref.set_grads(index, values)
        elif call == "train":
            X, labels_ = train_rows
            net.train(X, labels_, LR)
            ref.train(np.hstack([X, np.eye(N_CLASSES)[labels_]]), LR)
    assert_close(np.asarray(net.params), ref.values(), "params at the end")
    assert_close(module_grads(net), ref.grads(), "grads at the end")


def step(targets, row, update=False):
    """set_input(row), zero_grad(), forward(), backward() and, with update, update(LR), on each target."""
    for target in targets:
        target.set_input(row)
        target.zero_grad()
        target.forward()
        target.backward()
        if update:
            target.update(LR)


def test_rows_are_tracked():
    """The classifier's weight rows and biases go through the stamps; nothing is swept (else this
    file would test the old path only)."""
    model = classifier()
    xs, ys = [Value(0.0) for _ in range(N_IN)], [Value(0.0) for _ in range(N_CLASSES)]
    source = "\n".join(codegen.generate(cross_entropy(model(xs), ys), xs + ys, model.parameters()))
    assert f"#define N_TRACKED_ROWS {2 * (HIDDEN + N_CLASSES)}" in source
    assert "static const long SWEPT_RUNS[][2] = {{0, 0}};" in source  # every parameter is in a row
    assert source.count("rank1[") >= 2 and "sgd_rank1_row(" in source


BUILDS = {"O2": {}, "sparse": {"sparse_inputs": True}, "O0": {"opt": 0}}


# each build on TCC, one on each optimising compiler (the rest in the slow set)
@pytest.mark.parametrize("compiler, build", list(compiler_diagonal(list(BUILDS))), indirect=["compiler"])
def test_random_sequences_equal_the_interpreter(compiler, build):
    net, init = compile_classifier(compiler, **{"opt": 2, **BUILDS[build]})
    rng = np.random.default_rng(0)
    _, x, labels = sample_rows(12, 99)
    for _ in range(6):
        run_sequence(net, init, rng, 60, train_rows=(x, labels))


def test_float32(compiler):
    """The same sequences in float32: to the float64 interpreter within 1e-4, as tests/test_compile.py."""
    global RTOL
    net, init = compile_classifier(compiler, opt=2, dtype="float32")
    saved, RTOL = RTOL, 1e-4
    try:
        run_sequence(net, init, np.random.default_rng(1), 40)
    finally:
        RTOL = saved


def test_momentum_steps_every_parameter(compiler):
    """SGD with momentum updates every parameter every step (its buffer moves with no gradient)."""
    net, init = compile_classifier(compiler, opt=2, optimizer=codegen.SGD(momentum=0.9))
    rng = np.random.default_rng(2)
    for _ in range(4):
        np.asarray(net.optimizer_state["momentum_buffer"])[:] = 0  # a fresh optimizer each time
        run_sequence(net, init, rng, 50, momentum=0.9)


def test_accumulation_zero_grad_and_update_without_backward(compiler):
    """The sequences spelled out: two backward()s add up, zero_grad() twice is zero_grad(), update()
    with nothing accumulated leaves the parameters, and grads written in between are used."""
    net, init = compile_classifier(compiler, opt=2)
    ref = Interpreted(init)
    rows, _, _ = sample_rows(3, 5)
    net.set_params(init)
    for target in (net, ref):
        target.zero_grad()
        target.update(LR)  # nothing accumulated yet: no change
    assert_close(np.asarray(net.params), init, "update with zero gradients")
    for row in rows[:2]:
        for target in (net, ref):
            target.set_input(row)
            target.forward()
            target.backward()
    assert_close(module_grads(net), ref.grads(), "two backward() calls add up")
    for target in (net, ref):
        target.zero_grad()
        target.zero_grad()
        target.update(LR)
    assert_close(np.asarray(net.params), init, "zero_grad twice, then update")
    assert not np.any(module_grads(net))
    for target in (net, ref):
        target.set_input(rows[2])
        target.forward()
        target.backward()
    np.asarray(net.grad)[:5] = 1.0  # written through the view: update uses it
    ref.set_grads(range(5), [1.0] * 5)
    for target in (net, ref):
        target.backward()
        target.update(LR)
    assert_close(np.asarray(net.params), ref.values(), "update after writes through the view")
    assert_close(module_grads(net), ref.grads(), "gradients after the update are kept")


def test_a_held_view_sees_zero_grad_and_backward(compiler):
    """A numpy array over `grad`, kept while the module runs, always shows the gradients."""
    net, init = compile_classifier(compiler, opt=2)
    ref = Interpreted(init)
    rows, _, _ = sample_rows(4, 6)
    net.set_params(init)
    held = np.asarray(net.grad)
    for row in rows:
        step((net, ref), row)
        assert_close(held[:net.n_params], ref.grads(), "the held array after backward")
        for target in (net, ref):
            target.update(LR)
    for target in (net, ref):
        target.zero_grad()
    assert not np.any(held[:net.n_params])
    del held  # back to skipping rows: the next steps still agree
    for row in rows:
        step((net, ref), row, update=True)
    assert_close(np.asarray(net.params), ref.values(), "params after steps without the view")


def test_the_step_loop_trains_as_train_does(compiler):
    """set_input, zero_grad, forward, backward, update per row: the parameters train() gives, bit for bit
    (both round `param - lr * (0 + go * x)` the same way)."""
    net, init = compile_classifier(compiler, opt=2)
    _, x, labels = sample_rows(30, 7)
    net.set_params(init)
    net.train(x, labels, LR)
    trained = np.asarray(net.params).copy()
    net.set_params(init)
    for row in np.hstack([x, np.eye(N_CLASSES)[labels]]):
        net.set_input(row)
        net.zero_grad()
        net.forward()
        net.backward()
        net.update(LR)
    np.testing.assert_array_equal(np.asarray(net.params), trained)


def test_the_grad_object():
    """`grad` is one object in the module's dict (a module __getattr__ would stop CPython from
    specialising `net.forward` and the like); it acts as a memoryview of the gradients, each use
    looking afresh, and keeps its module alive."""
    net, _ = compile_classifier(None, opt=0)
    grad = net.grad
    assert grad is net.grad and "__getattr__" not in vars(net)
    assert grad.format == "d" and grad.shape == (net.n_slots,) and not grad.readonly and grad.nbytes == 8 * net.n_slots
    assert len(grad) == net.n_slots and "grad" in dir(net) and "gradients" in repr(grad)
    grad[2] = 1.5
    grad[3:5] = memoryview(np.array([2.0, 3.0]))
    assert grad[2] == 1.5 and grad[3:5].tolist() == [2.0, 3.0] and grad.tolist()[2:5] == [1.5, 2.0, 3.0]
    assert list(grad)[:5] == [0.0, 0.0, 1.5, 2.0, 3.0] and np.asarray(grad)[4] == 3.0
    assert grad == memoryview(np.asarray(grad).copy()) and grad.cast("B").nbytes == grad.nbytes
    with pytest.raises(TypeError, match="cannot delete"):
        del grad[0]
    for name in ("no_such_thing", "_private"):
        with pytest.raises(AttributeError, match=f"GradBuffer' object has no attribute '{name}'"):
            getattr(grad, name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        net.no_such_thing
    module = weakref.ref(net)
    del net
    gc.collect()
    assert module() is not None and grad[2] == 1.5  # grad keeps its module
    del grad
    gc.collect()
    assert module() is None  # and the two are collected together


@pytest.mark.parametrize("compiler", ["gcc"], indirect=True)
def test_train_after_train_starts_from_zero_gradients(compiler):
    """train() a row at a time with Adam: each call leaves the parameters' gradients 0 as it steps,
    and the next, when nothing ran between, does not zero them again (templates/runtime.c); a
    write through `grad` or a backward() between two calls is zeroed as before. Every way, the
    parameters of one train() call over the rows, bit for bit."""
    net, init = compile_classifier(compiler, opt=2, optimizer=codegen.Adam())
    rows, x, labels = sample_rows(9, 5)
    net.set_params(init)
    net.train(x, labels, LR)
    expected = np.asarray(net.params).copy()
    for between in (None, "grad", "backward"):
        net, _ = compile_classifier(compiler, opt=2, optimizer=codegen.Adam())
        net.set_params(init)
        for i in range(len(x)):
            net.train(x[i:i + 1], labels[i:i + 1], LR)
            if between == "grad" and i == 4:
                np.asarray(net.grad)[:] = 7.0
            elif between == "backward" and i == 4:
                net.set_input(rows[i])
                net.forward()
                net.backward()
        np.testing.assert_array_equal(np.asarray(net.params), expected, err_msg=str(between))
