"""The compiled optimizers against PyTorch's update formulas: 100 steps of each (SGD, momentum,
Nesterov, Adam, AdamW, each with and without weight decay) through update() and through train()
(batch 1 and larger), with every compiler, against a NumPy reference written here from
torch.optim's documented algorithms, and against torch.optim itself when PyTorch is installed.

The model is compiled in the straight-line scalar mode, whose gradients are the interpreter's to
the bit, so that the tests hold the optimizer alone (to 1e-12).
"""

import functools
import math
import platform
import random
import shlex
from pathlib import Path

import numpy as np
import pytest

import codegen
from codegen.backend.toolchain import find_compiler
from conftest import compiler_diagonal, requires
from micrograd_c import MLP, Value, mse

STEPS = 100
RTOL = 1e-12

OPTIMIZERS = {
    "sgd": codegen.SGD(),
    "sgd-wd": codegen.SGD(weight_decay=0.1),
    "momentum": codegen.SGD(momentum=0.9),
    "momentum-wd": codegen.SGD(momentum=0.9, weight_decay=0.05),
    "nesterov": codegen.SGD(momentum=0.8, nesterov=True),
    "nesterov-wd": codegen.SGD(momentum=0.8, nesterov=True, weight_decay=0.05),
    "adam": codegen.Adam(),
    "adam-wd": codegen.Adam(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw-no-wd": codegen.AdamW(weight_decay=0.0),
    "adamw": codegen.AdamW(betas=(0.85, 0.995), weight_decay=0.1),
    "adam-beta1-below-half": codegen.Adam(betas=(0.3, 0.9)),  # torch's lerp takes its other form
}


class Reference:
    """torch.optim's single-tensor algorithms (dampening 0, no amsgrad), step for step in NumPy."""

    def __init__(self, optimizer, n):
        self.o = optimizer
        self.buf = None
        self.m, self.v, self.t = np.zeros(n), np.zeros(n), 0

    def step(self, p, grad, lr):
        o = self.o
        if isinstance(o, codegen.SGD):
            if o.weight_decay:
                grad = grad + o.weight_decay * p
            if o.momentum:
                self.buf = grad.copy() if self.buf is None else self.buf * o.momentum + grad
                grad = grad + o.momentum * self.buf if o.nesterov else self.buf
            return p + -lr * grad
        self.t += 1
        beta1, beta2 = o.betas
        if isinstance(o, codegen.AdamW):
            p = p * (1 - lr * o.weight_decay)
        elif o.weight_decay:
            grad = grad + o.weight_decay * p
        weight = 1 - beta1  # torch: exp_avg.lerp_(grad, 1 - beta1)
        self.m = self.m + weight * (grad - self.m) if weight < 0.5 else grad - (grad - self.m) * (1 - weight)
        self.v = self.v * beta2 + (1 - beta2) * grad * grad
        step_size = lr / (1 - beta1 ** self.t)
        denom = np.sqrt(self.v) / math.sqrt(1 - beta2 ** self.t) + o.eps
        return p + (-step_size * self.m) / denom


def model_case(seed=3):
    """A small tanh MLP regressing its last input; (Value builder, initial params, data rows)."""
    random.seed(seed)
    init = [p.data for p in MLP(3, [4, 1], activation="tanh").parameters()]
    rng = np.random.default_rng(seed)
    rows = np.concatenate([rng.normal(size=(12, 3)), rng.normal(size=(12, 1))], axis=1)

    def build(params, inputs):
        random.seed(seed)
        model = MLP(3, [4, 1], activation="tanh")
        values = iter(params)
        for neuron in (n for layer in model.layers for n in layer.neurons):
            neuron.w = [next(values) for _ in neuron.w]
            neuron.b = next(values)
        return mse([model(inputs[:3])], [inputs[3]])

    return build, np.array(init), rows


def interpreted_gradient(build, p, row):
    params, inputs = [Value(float(x)) for x in p], [Value(float(x)) for x in row]
    build(params, inputs).backward()
    return np.array([v.grad for v in params])


def learning_rate(step):
    """A rate that changes every call, as a schedule does."""
    return 0.05 * (1 - step / (2 * STEPS))


def compiled(build, init, optimizer, compiler, dtype="float64", opt=2):
    params, inputs = [Value(float(x)) for x in init], [Value(0.0) for _ in range(4)]
    return codegen.compile(build(params, inputs), inputs, params, optimizer=optimizer, compiler=compiler,
                           fuse=False, dtype=dtype, opt=opt)


def assert_close(got, expected, what):
    scale = max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=RTOL * scale, err_msg=what)


def reference_state(ref):
    if isinstance(ref.o, codegen.SGD):
        return {"momentum_buffer": ref.buf} if ref.o.momentum else {}
    return {"step": [ref.t], "exp_avg": ref.m, "exp_avg_sq": ref.v}


@functools.cache
def reference_steps(name):
    """The reference's 100 steps of update() (the same for every compiler: computed once): the
    interpreted gradient of each step, then the parameters and the Reference after them."""
    build, p, rows = model_case()
    ref = Reference(OPTIMIZERS[name], len(p))
    grads = []
    for step in range(STEPS):
        grads.append(interpreted_gradient(build, p, rows[step % len(rows)]))
        p = ref.step(p, grads[-1], learning_rate(step))
    return grads, p, ref


# every optimizer on TCC, each on one optimising compiler; the rest in the slow set
@pytest.mark.parametrize("compiler, name", list(compiler_diagonal(list(OPTIMIZERS))), indirect=["compiler"])
def test_update_follows_the_reference_for_100_steps(name, compiler, opt=2):
    optimizer = OPTIMIZERS[name]
    build, p, rows = model_case()
    net = compiled(build, p, optimizer, compiler, opt=opt)
    grads, p, ref = reference_steps(name)
    for step in range(STEPS):
        net.set_input(rows[step % len(rows)])
        net.forward()
        net.zero_grad()
        net.backward()
        assert_close(np.asarray(net.grad)[:net.n_params], grads[step], f"gradient at step {step}")
        net.update(learning_rate(step))
    assert_close(np.asarray(net.params), p, "parameters after 100 steps")
    expected_state = reference_state(ref)
    assert sorted(net.optimizer_state) == sorted(expected_state)
    for key, value in expected_state.items():
        assert_close(np.asarray(net.optimizer_state[key]), np.asarray(value, dtype=float), key)
    assert net.optimizer == repr(optimizer)


def cpu_vector_bytes():
    """The vector widths this CPU runs, as templates/optim.c's dispatch asks for them: SSE2 on
    every x86-64, AVX and AVX-512F by /proc/cpuinfo's flags."""
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return {16} | ({32} if "avx" in flags else set()) | ({64} if "avx512f" in flags else set())


# each width on one optimising compiler (SSE2's and AVX-512's first: unforced, the widest this CPU has
# runs in the test above); the rest in the slow set
@pytest.mark.parametrize("family, width", list(compiler_diagonal([16, 64, 32], compilers=["gcc", "clang", "zig"])))
def test_each_adam_vector_pass(family, width):
    """Adam's pass runs on the widest vectors the CPU has (templates/optim.c); each width, forced,
    follows the reference (the model's 21 parameters: whole vectors, then a tail). A width this
    CPU lacks would die of an illegal instruction: it is built, not run. At -O0: the forced width
    is a runtime of its own, and the test checks what the pass computes, not how fast."""
    forced = shlex.join([*find_compiler(requires(family)).argv, f"-DADAM_VECTOR_BYTES={width}"])
    runs_here = width in cpu_vector_bytes()
    for name in ("adam", "adamw"):
        if runs_here:
            test_update_follows_the_reference_for_100_steps(name, forced, opt=0)
        else:
            build, p, _ = model_case()
            assert compiled(build, p, OPTIMIZERS[name], forced, opt=0).optimizer == repr(OPTIMIZERS[name])


@functools.cache
def reference_epochs(name, batch_size):
    """The reference's training (the same for every compiler: computed once): the number of
    epochs, then the parameters and the Reference after them."""
    build, p, rows = model_case()
    ref = Reference(OPTIMIZERS[name], len(p))
    epochs = STEPS // math.ceil(len(rows) / batch_size)
    for epoch in range(epochs):
        for start in range(0, len(rows), batch_size):
            batch = rows[start:start + batch_size]
            grad = sum(interpreted_gradient(build, p, row) for row in batch) / len(batch)
            p = ref.step(p, grad, learning_rate(epoch * 10))
    return epochs, p, ref


@pytest.mark.parametrize("batch_size", [1, 5])
@pytest.mark.parametrize("compiler, name", list(compiler_diagonal(list(OPTIMIZERS))), indirect=["compiler"])
def test_train_follows_the_reference(name, batch_size, compiler):
    """train(): one optimizer step per batch on its mean gradient; the last batch may be short."""
    build, init, rows = model_case()
    net = compiled(build, init, OPTIMIZERS[name], compiler)
    epochs, p, ref = reference_epochs(name, batch_size)
    X, Y = np.ascontiguousarray(rows[:, :3]), np.ascontiguousarray(rows[:, 3:])
    for epoch in range(epochs):
        net.train(X, Y, learning_rate(epoch * 10), batch_size=batch_size)
    assert_close(np.asarray(net.params), p, f"parameters after {epochs} epochs")
    assert not np.any(np.asarray(net.grad)[:net.n_params])  # zeroed after every step
    for key, value in reference_state(ref).items():
        assert_close(np.asarray(net.optimizer_state[key]), np.asarray(value, dtype=float), key)


def test_a_float32_quotient_rounded_once_is_the_doubles_rounded_twice():
    """templates/optim.c's mean_division divides float32 gradients by the batch's size in float32
    vectors where `g[i] /= mean_of` divided in double and rounded that to float32: the same bits,
    as 53 bits hold 2 x 24 + 2 (a quotient's double rounding is innocuous). Checked over float32
    values of every magnitude, signs, zeros, infinities and the normal numbers' ends, by counts up
    to 1,000 and the powers of two."""
    rng = np.random.default_rng(5)
    g = (rng.uniform(1, 2, 20_000) * 2.0 ** rng.integers(-126, 128, 20_000)).astype(np.float32)
    g = np.concatenate([g, -g, np.float32([0.0, -0.0, np.inf, -np.inf, np.finfo(np.float32).tiny,
                                           np.finfo(np.float32).max, 1.0, 3.0])])
    for by in [*range(1, 1001), 2 ** 20, 2 ** 24]:
        rounded_twice = (g.astype(np.float64) / by).astype(np.float32)
        rounded_once = g / np.float32(by)
        assert np.array_equal(rounded_twice.view(np.uint32), rounded_once.view(np.uint32)), by


@pytest.mark.parametrize("family", ["gcc", "clang", "zig"])
def test_the_batchs_mean_in_vectors_is_the_doubles_bits(family, tmp_path):
    """train()'s mean of a batch's gradients divides them in vectors of the module's reals
    (templates/optim.c's mean_division): float32 and float64, batches of 5 and 7 and a last one
    short, Adam's steps: the same bits as a build that divides them one by one, in double
    (MEAN_DIVISION_ONE_BY_ONE)."""
    build, init, rows = model_case()
    X, Y = np.ascontiguousarray(rows[:, :3]), np.ascontiguousarray(rows[:, 3:])
    compiler = find_compiler(requires(family)).argv
    for dtype in ("float32", "float64"):
        trained = []
        for one_by_one in (False, True):
            forced = shlex.join([*compiler, *(["-DMEAN_DIVISION_ONE_BY_ONE"] if one_by_one else [])])
            params, inputs = [Value(float(x)) for x in init], [Value(0.0) for _ in range(4)]
            net = codegen.compile(build(params, inputs), inputs, params, optimizer=codegen.Adam(), compiler=forced,
                                  fuse=False, dtype=dtype, batch=8, tiered=False)
            for batch_size in (5, 7):
                net.train(X, Y, 0.05, batch_size=batch_size)
            trained.append(np.asarray(net.params).copy())
        assert not np.array_equal(trained[0], np.asarray(init, dtype=trained[0].dtype))  # (it stepped)
        np.testing.assert_array_equal(trained[0], trained[1])


def torch_optimizer(torch, optimizer, tensor):
    if isinstance(optimizer, codegen.SGD):
        return torch.optim.SGD([tensor], lr=1.0, momentum=optimizer.momentum, nesterov=optimizer.nesterov,
                               weight_decay=optimizer.weight_decay)
    kind = torch.optim.AdamW if isinstance(optimizer, codegen.AdamW) else torch.optim.Adam
    return kind([tensor], lr=1.0, betas=optimizer.betas, eps=optimizer.eps, weight_decay=optimizer.weight_decay)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_update_follows_torch_optim(name):
    """The same 100 steps as torch.optim takes them (PyTorch is optional: `make torch`)."""
    torch = requires("torch")
    optimizer = OPTIMIZERS[name]
    build, p, rows = model_case()
    net = compiled(build, p, optimizer, "tcc")  # (the optimizer's C is the same for every compiler)
    tensor = torch.tensor(p, dtype=torch.float64, requires_grad=True)
    theirs = torch_optimizer(torch, optimizer, tensor)
    for step in range(STEPS):
        net.set_input(rows[step % len(rows)])
        net.forward()
        net.zero_grad()
        net.backward()
        lr = learning_rate(step)
        net.update(lr)
        tensor.grad = torch.tensor(interpreted_gradient(build, tensor.detach().numpy(), rows[step % len(rows)]))
        for group in theirs.param_groups:
            group["lr"] = lr
        theirs.step()
    assert_close(np.asarray(net.params), tensor.detach().numpy(), "parameters after 100 torch steps")
    state = theirs.state[tensor]
    for key, view in net.optimizer_state.items():
        assert_close(np.atleast_1d(np.asarray(view)), np.atleast_1d(np.asarray(state[key], dtype=float)), key)


SUBNORMAL_STEPS = 40  # 45 times the smallest normal number, decaying by 0.8-0.9 a step, is then below it


@pytest.mark.parametrize("compiler, case", list(compiler_diagonal(
    [(name, dtype) for dtype in ("float64", "float32") for name in ("momentum", "nesterov", "adam", "adamw")],
    "-".join)), indirect=["compiler"])
def test_moments_decaying_into_subnormals(case, compiler):
    """A gradient seen once, then zeros: the momentum buffer and Adam's first moment decay
    geometrically into subnormal numbers, which the steps flush to zero (templates/optim.c: x86
    CPUs take microcode assists on them). The parameters still follow the reference, which keeps
    the subnormals, and the caller's floating-point mode is back after every step."""
    name, dtype = case
    optimizer = OPTIMIZERS[name]
    tiny = np.finfo(dtype).tiny
    build, p, _ = model_case()
    net = compiled(build, p, optimizer, compiler, dtype)
    p = np.asarray(net.params, dtype=float).copy()  # rounded to dtype
    ref = Reference(optimizer, len(p))
    first = tiny * 45 * np.random.default_rng(0).uniform(0.5, 1.5, len(p))
    for step in range(SUBNORMAL_STEPS):
        grad = first if step == 0 else np.zeros(len(p))
        np.asarray(net.grad)[:net.n_params] = grad
        net.update(0.01)
        assert np.float64(1e-307) / np.float64(1e3) != 0 and np.float32(1e-37) / np.float32(1e3) != 0  # mode restored
        p = ref.step(p, grad, 0.01)
    moment = ref.m if isinstance(optimizer, codegen.Adam) else ref.buf
    moment = moment.astype(dtype)
    assert np.any((moment != 0) & (np.abs(moment) < tiny))  # the reference got there
    state = np.asarray(net.optimizer_state["exp_avg" if isinstance(optimizer, codegen.Adam) else "momentum_buffer"])
    if platform.machine().lower() in ("x86_64", "amd64"):  # where the steps flush (__x86_64__)
        assert not np.any((state != 0) & (np.abs(state) < tiny))  # flushed
    rtol = RTOL if dtype == "float64" else 1e-6
    np.testing.assert_allclose(np.asarray(net.params), p, rtol=rtol, atol=rtol, err_msg="parameters")


def test_state_views_are_writable_and_per_module():
    build, p, rows = model_case()
    first, second = (compiled(build, p, codegen.Adam(), "tcc") for _ in range(2))
    first.set_input(rows[0])
    first.forward()
    first.backward()
    first.update(0.01)
    assert first.optimizer_state["step"][0] == 1.0 and second.optimizer_state["step"][0] == 0.0
    # restoring the state (as mnist.train --load does) continues where it left off
    for key, view in first.optimizer_state.items():
        np.asarray(second.optimizer_state[key])[:] = view
    second.set_params(np.asarray(first.params))
    np.asarray(second.grad)[:] = first.grad
    for net in (first, second):
        net.update(0.01)
    np.testing.assert_array_equal(np.asarray(first.params), np.asarray(second.params))


def test_plain_sgd_keeps_the_fused_training_step():
    """Only plain SGD updates during backward; the others accumulate then step."""
    build, p, _ = model_case()
    params, inputs = [Value(float(x)) for x in p], [Value(0.0) for _ in range(4)]
    loss = build(params, inputs)
    sgd = codegen.generate(loss, inputs, params)[0]
    adam = codegen.generate(loss, inputs, params, optimizer=codegen.Adam())[0]
    assert "#define PLAIN_SGD 1" in sgd and "#define PLAIN_SGD 0" in adam
    assert "#define OPTIMIZER 2" in adam and "#define BETA2 0.999" in adam


@pytest.mark.parametrize("make, error, message", [
    (lambda: codegen.SGD(momentum=-0.1), ValueError, r"SGD momentum must be >= 0, got -0.1"),
    (lambda: codegen.SGD(nesterov=True), ValueError, r"nesterov needs a momentum > 0"),
    (lambda: codegen.SGD(weight_decay="0.1"), TypeError, r"SGD weight_decay must be a finite number"),
    (lambda: codegen.Adam(betas=(0.9, 1.0)), ValueError, r"Adam beta2 must be >= 0 and < 1, got 1.0"),
    (lambda: codegen.Adam(betas=0.9), TypeError, r"betas must be a pair"),
    (lambda: codegen.AdamW(eps=math.nan), TypeError, r"AdamW eps must be a finite number"),
])
def test_bad_hyperparameters_are_clear_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_optimizer_must_be_a_description():
    x = Value(1.0)
    with pytest.raises(TypeError, match="optimizer must be codegen.SGD"):
        codegen.generate(x * x, params=[x], optimizer="adam")


def test_embedded_params_start_every_load():
    build, p, rows = model_case()
    params, inputs = [Value(float(x)) for x in p], [Value(0.0) for _ in range(4)]
    loss = build(params, inputs)
    net = codegen.compile(loss, inputs, params, compiler="tcc", embed_params=True)
    again = codegen.backend.loader.load_extension(net.build.path, "nn")  # a fresh load, as `import nn` is
    np.testing.assert_array_equal(np.asarray(again.params), p)
    plain = codegen.backend.loader.load_extension(codegen.compile(loss, inputs, params, compiler="tcc").build.path, "nn")
    assert not np.any(np.asarray(plain.params))  # without it, parameters start at zero
