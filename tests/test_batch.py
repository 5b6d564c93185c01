"""The batch axis (codegen/lower/batch.py, templates/batch.c): train() with batch_size > 1 and predict()
run whole batches through the batched program, which must give what sample-by-sample passes
give (the same module compiled with batch=1) to the fused bound: every compiler, float64 and
float32, each kind of optimizer, a last short batch, batches bigger than the buffers; the same
bits with any number of threads; a graph without a batched form falls back and says so."""

import random
import re
import types

import numpy as np
import pytest

import codegen
from bench.models import cnn
from codegen.backend.toolchain import COMPILER_NAMES
from codegen.lower.batch import PASS_BYTES, NotBatchable, _Layout, batch_program, pass_capacity
from conftest import bits, compiler_diagonal, seeded_cache
from micrograd_c import MLP, Value, cross_entropy
from tests.test_train import mnist_dir  # noqa: F401 (a fixture)

RTOL = {"float64": 1e-9, "float32": 2e-4}
OPTIMIZERS = {"sgd": None, "momentum": codegen.SGD(momentum=0.9, weight_decay=0.01),
              "nesterov": codegen.SGD(momentum=0.8, nesterov=True), "adam": codegen.Adam(),
              "adamw": codegen.AdamW(weight_decay=0.1)}


def classifier(n_in=12, hidden=(20, 9), n_classes=4, seed=0):
    random.seed(seed)
    model = MLP(n_in, [*hidden, n_classes])
    xs, ys = [Value(0.0) for _ in range(n_in)], [Value(0.0) for _ in range(n_classes)]
    logits = model(xs)
    return model, xs, ys, logits, cross_entropy(logits, ys)


def twins(compiler=None, batch=128, case=None, **options):
    """The same model compiled with a batched program and without one (batch=1), from the same
    values (compiler None: the default one, whichever this machine has)."""
    model, xs, ys, logits, loss = case or classifier()
    init = [p.data for p in model.parameters()]
    nets = []
    for capacity in (batch, 1):
        for p, v in zip(model.parameters(), init):
            p.data = v
        nets.append(codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler,
                                    batch=capacity, **options))
    return nets


def data(n=45, n_in=12, n_classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, n_in)), rng.integers(0, n_classes, n)


def assert_close(got, expected, dtype):
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=RTOL[dtype], atol=RTOL[dtype] * scale)


DTYPES = ("float64", "float32")


def _batch_grid():
    """Every optimizer in both dtypes on TCC (it compiles in a fraction of a second); on the
    optimising compilers a diagonal: every optimizer GCC has on one dtype (alternating), plain SGD
    and Adam on Clang and zig (the other optimizers' C is the same for every compiler), each
    compiler both dtypes. The rest of the grid is in the slow set."""
    diagonal = 0
    for compiler in COMPILER_NAMES:
        for optimizer in OPTIMIZERS:
            for dtype in DTYPES:
                if compiler == "tcc":
                    slow = False
                elif compiler != "gcc" and optimizer not in ("sgd", "adam"):
                    slow = True
                else:
                    slow = dtype != DTYPES[diagonal % 2]
                yield pytest.param(compiler, optimizer, dtype, id=f"{compiler}-{optimizer}-{dtype}",
                                   marks=[pytest.mark.slow] * slow)
            diagonal += compiler != "tcc" and (compiler == "gcc" or optimizer in ("sgd", "adam"))


@pytest.mark.parametrize("compiler, optimizer, dtype", list(_batch_grid()), indirect=["compiler"])
def test_batched_train_equals_sample_by_sample(compiler, dtype, optimizer):
    """Three epochs of batch 8 over 45 rows (a last batch of 5), shuffled: the same losses and
    parameters as one sample at a time with the gradients summed, and not the initial ones."""
    batched, single = twins(compiler, dtype=dtype, optimizer=OPTIMIZERS[optimizer])
    X, y = data()
    for epoch in range(3):
        losses = [net.train(X, y, 0.05, batch_size=8, seed=epoch) for net in (batched, single)]
        assert_close(losses[0], losses[1], dtype)
    assert_close(batched.params, single.params, dtype)
    initial = [p.data for p in classifier()[0].parameters()]
    assert not np.allclose(np.asarray(batched.params), initial)


def test_batches_bigger_than_the_buffers_and_predict(compiler):
    """batch=8 buffers: a batch of 20 runs as pieces of 8, 8 and 4 whose gradients add up before
    one step; predict() runs 45 rows as pieces of 8 and equals forward() row by row."""
    batched, single = twins(compiler, batch=8)
    X, y = data()
    assert_close(batched.train(X, y, 0.1, batch_size=20), single.train(X, y, 0.1, batch_size=20), "float64")
    assert_close(batched.params, single.params, "float64")
    assert_close(batched.predict(X), single.predict(X), "float64")
    for i in (0, 44):
        single.set_input(np.concatenate([X[i], np.zeros(4)]))
        single.forward()
        assert_close(np.asarray(batched.predict(X))[i], single.outputs(), "float64")


@pytest.mark.parametrize("n_in, hidden, batch_size", [(128, (160, 40), 64), (64, (96, 384), 32)])
def test_the_same_bits_with_any_number_of_threads(n_in, hidden, batch_size):
    """The products split their rows between threads, or a sum in parts continued in order: 1, 2
    and 3 threads give the same parameters and predictions bit for bit (models big enough for
    the products to be split, over gemm.c's GEMM_PARALLEL_MIN: the first layer's 1.3 M
    multiply-adds a batch; and a second layer of 384 neurons over batches of 32, whose inputs'
    gradients sum over the neurons in parts, one a thread (gemm.c's GEMM_PIPELINE_COLUMNS), the
    last batch of 12)."""
    case = classifier(n_in=n_in, hidden=hidden, n_classes=10)
    X, y = data(300, n_in, 10)
    results = []
    for threads in (1, 2, 3):
        net = twins(case=case, threads=threads)[0]
        assert net.threads() == threads
        net.train(X, y, 0.05, batch_size=batch_size, seed=1)
        results.append((np.asarray(net.params).copy(), np.asarray(net.predict(X, threads=threads)).copy()))
    for params, predictions in results[1:]:
        np.testing.assert_array_equal(params, results[0][0])
        np.testing.assert_array_equal(predictions, results[0][1])


def test_train_times_its_batches_to_choose_its_threads():
    """train() runs 5 batches on one thread and 5 on all from the 64th batch with more than one
    thread asked for, again 1,024 batches later (or 64-1,024 after choosing one thread: templates/
    pool.c's threads_for_batch), and the batches until the next probe on one thread if its median
    took under 0.95x the others': thread_choice() says what the last probe measured and what it
    chose, and the parameters stay the same bits as one thread's across the probes (1,200 batches of
    32: two probes or more; the second layer's products split between the threads in between)."""
    case = classifier(n_in=64, hidden=(96, 384), n_classes=10)
    X, y = data(32 * 1200, 64, 10)
    nets = {threads: twins(case=case, threads=threads)[0] for threads in (1, 2)}
    for net in nets.values():
        net.train(X, y, 0.05, batch_size=32, seed=1)
    np.testing.assert_array_equal(np.asarray(nets[2].params), np.asarray(nets[1].params))
    assert nets[1].thread_choice() == {"threads": 1, "batches": 0, "one_thread_us": None, "all_threads_us": None}
    choice = nets[2].thread_choice()
    assert choice["batches"] == 1200 and choice["one_thread_us"] > 0 and choice["all_threads_us"] > 0
    assert choice["threads"] == (1 if choice["one_thread_us"] < 0.95 * choice["all_threads_us"] else 2)
    assert nets[2].threads() == 2  # (what was asked for)


@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
def test_a_big_models_step_is_the_same_bits_on_any_number_of_threads(optimizer):
    """From optim.c's STEP_PARALLEL_MIN parameters (76,482 here) train()'s optimizer step runs
    on the module's threads, each a share of the parameters (the batch's mean, the update, the
    gradients cleared): 1, 2 and 3 threads, the same parameters bit for bit, and the step
    sample by sample (one thread) the same numbers to the batch's bound."""
    case = classifier(n_in=256, hidden=(256, 40), n_classes=10)
    assert sum(1 for _ in case[0].parameters()) >= 65536
    X, y = data(96, 256, 10)
    results = []
    for threads in (1, 2, 3):
        batched, single = twins(case=case, threads=threads, optimizer=OPTIMIZERS[optimizer], dtype="float32")
        for epoch in range(2):
            batched.train(X, y, 0.01, batch_size=32, seed=epoch)
        results.append(np.asarray(batched.params).copy())
        if threads == 1:
            for epoch in range(2):
                single.train(X, y, 0.01, batch_size=32, seed=epoch)
            assert_close(batched.params, single.params, "float32")
    for params in results[1:]:
        np.testing.assert_array_equal(params, results[0])
    assert not np.array_equal(results[0], [p.data for p in case[0].parameters()])


def _skipping(seed=0):
    """classifier()'s MLP(12, [20, 9, 4]) whose loss also reads the first layer's activations (a
    penalty on their sum): their gradients get two contributions, so the second layer's product
    adds to them (only the last layer's may write its inputs' gradients)."""
    random.seed(seed)
    model = MLP(12, [20, 9, 4])
    xs, ys = [Value(0.0) for _ in range(12)], [Value(0.0) for _ in range(4)]
    first = model.layers[0](xs)
    logits = model.layers[2](model.layers[1](first))
    return model, xs, ys, logits, cross_entropy(logits, ys) + 0.01 * sum(first)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(DTYPES)), indirect=["compiler"])
def test_products_write_the_gradients_only_they_add_to(compiler, dtype, tmp_path, monkeypatch):
    """A layer's inputs' gradients and its activation's, when only its product adds to them, are
    written by matmul_acc and its epilogue (the runtime clears the other rows only): the same bits
    as adding them to rows cleared first (backward.Backward._overwrites off), batch after batch
    (what a batch left in those rows is never read): an MLP whose second layer's ReLUs are all off
    (its product's path with no neuron on, which writes 0s), and one whose loss reads the first
    layer's activations too (added to, as before)."""
    from codegen.write import backward
    written = backward.Backward._overwrites
    X, y = data(70)
    dead = classifier()
    for neuron in dead[0].layers[1].neurons:  # (the second layer's ReLUs off for every sample)
        neuron.b.data = -50.0
    for name, case, overwrites in (("dead", dead, [1, 1]), ("skipping", _skipping(), [1, 0])):
        model, xs, ys, logits, loss = case
        init = [p.data for p in model.parameters()]
        monkeypatch.setattr(backward.Backward, "_overwrites", written)
        source = "\n".join(codegen.generate(loss, xs + ys, model.parameters(), outputs=logits, dtype=dtype))
        calls = [a for a in _calls(source, "matmul_acc(?:_nt)?")  # (the layers': their ReLUs' epilogues)
                 if a[10].startswith("epilogue_")]
        assert [int(a[17]) for a in calls] == overwrites, (name, calls)  # (overwrite)
        assert source.count("y[n] = (real)0 + ") == 1 and "BATCH_CLEAR_RUNS[][2] = {{0, " in source
        runs = {}
        for label in ("written", "added"):
            monkeypatch.setattr(backward.Backward, "_overwrites",
                                written if label == "written" else lambda self, mode, g: False)
            for p, v in zip(model.parameters(), init):
                p.data = v
            net = codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler, dtype=dtype,
                                  cache=seeded_cache(tmp_path / f"{name}-{label}", compiler, dtypes=(dtype,)))
            losses = np.array([net.train(X, y, 0.1, batch_size=16, seed=epoch) for epoch in range(2)], dtype=np.float64)
            runs[label] = (np.asarray(net.params).copy(), losses)
        for got, expected in zip(runs["written"], runs["added"]):
            np.testing.assert_array_equal(bits(got), bits(expected), err_msg=name)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(DTYPES)), indirect=["compiler"])
def test_biases_gradients_in_the_weights_product(compiler, dtype, tmp_path, monkeypatch):
    """A layer's biases' gradients over a batch (each a sum of its neuron's gradient row) are
    summed by the layer's weights' gradients' product (matmul_nt's bias, on the thread that reads
    those rows) instead of in a loop of their own, and stepped there when the weights are: each
    layer's call names its biases and their gradients (the slot after its weights' row), no sum
    of a gradient row is left in the code, and training (plain SGD, batches of one piece: stepped
    in backward) gives the bits of the loop's form (backward.Backward._bias_in_product off: the
    biases stepped after the batch)."""
    from codegen.write import backward
    folded = backward.Backward._bias_in_product
    model, xs, ys, logits, loss = classifier(n_in=20, hidden=(24, 16))  # (layers of 16 inputs and more)
    init = [p.data for p in model.parameters()]
    source = "\n".join(codegen.generate(loss, xs + ys, model.parameters(), outputs=logits, dtype=dtype))
    # (matmul_nt's out, out_j, K and bias, bias_j; matmul_acc_nt's grad, grad_j, K and bias, bias_j)
    calls = [(a[0], a[1], a[7], *a[-2:]) for a in _calls(source, "matmul_nt")]
    calls += [(a[18], a[19], a[9], *a[-2:]) for a in _calls(source, "matmul_acc_nt")]
    assert len(calls) == 3 and "sum_range(g + " not in source
    for out, out_j, K, bias, bias_j in calls:  # (out is "g + <the weights' row>")
        at = int(out.split(" + ")[1]) + int(K)  # (stepped with the weights when train() steps in backward)
        assert (bias, bias_j) == (f"rate ? d + {at} : g + {at}", out_j)
    X, y = data(70, n_in=20)
    runs = {}
    for label in ("folded", "loop"):
        monkeypatch.setattr(backward.Backward, "_bias_in_product", folded if label == "folded"
                            else lambda self, terms, products, shape, mode: terms + products)
        for p, v in zip(model.parameters(), init):
            p.data = v
        net = codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler, dtype=dtype,
                              cache=seeded_cache(tmp_path / label, compiler, dtypes=(dtype,)))
        losses = np.array([net.train(X, y, 0.1, batch_size=16, seed=epoch) for epoch in range(2)], dtype=np.float64)
        runs[label] = (np.asarray(net.params).copy(), losses)
    for got, expected in zip(runs["folded"], runs["loop"]):
        np.testing.assert_array_equal(bits(got), bits(expected))


def _calls(source, kernel):
    """The arguments of each call of `kernel` (a regular expression) on a line of its own in the
    generated C, in order."""
    return [c.split(", ") for c in re.findall(rf"^\s*{kernel}\((g \+ .*)\);$", source, re.M)]


def test_threads_option_checks_its_value():
    net = twins()[0]
    X, y = data()
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises((ValueError, TypeError), match="threads"):
            net.train(X, y, 0.1, batch_size=4, threads=bad)
        with pytest.raises((ValueError, TypeError), match="threads"):
            net.set_threads(bad)
    assert net.set_threads(None) >= 1
    with pytest.raises(ValueError, match="batch must be"):
        twins(batch=0)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(DTYPES)), indirect=["compiler"])
def test_backward_steps_the_weights_of_plain_sgd(compiler, dtype):
    """With plain SGD and batches of one piece, the batched backward takes the step on the weights
    of its weights' gradient products (matmul_nt with a rate): the same training as sample by
    sample, with batches of 16 (a last one of 6) and of the whole set (70, two pieces of the
    buffers: no step in backward then); lr 0 changes nothing; gradients() gives the gradients,
    no step."""
    case = classifier(n_in=40, hidden=(24, 18), n_classes=5)
    batched, single = twins(compiler, batch=64, case=case, dtype=dtype)
    source = "\n".join(codegen.generate(case[-1], case[1] + case[2], case[0].parameters()))
    assert "rate ? d + " in source  # the first two layers' weights (40 and 24 inputs)
    X, y = data(70, 40, 5)
    for epoch, batch_size in enumerate((16, 16, 70)):
        assert_close(batched.train(X, y, 0.05, batch_size=batch_size, seed=epoch),
                     single.train(X, y, 0.05, batch_size=batch_size, seed=epoch), dtype)
    assert_close(batched.params, single.params, dtype)
    before = np.asarray(batched.params).copy()
    batched.train(X, y, 0.0, batch_size=16)
    np.testing.assert_array_equal(batched.params, before)
    for net in (batched, single):
        net.zero_grad()
        net.gradients(X, y)
    n = batched.n_params
    assert_close(np.asarray(batched.grad)[:n], np.asarray(single.grad)[:n], dtype)
    np.testing.assert_array_equal(batched.params, before)


def test_a_convolution_over_a_batch():
    """The zoo's CNN (a 3x3 convolution's windows, then a dense layer) batched: the same as one
    image at a time, training and predicting. Built for the default 128 samples, its passes hold
    32 (their values fit PASS_BYTES), so that a batch of 40 runs as pieces of 32 and 8."""
    model = cnn()
    model.reset()
    explained = codegen.explain(model.loss, model.inputs, model.params, model.outputs).summary()
    assert "batched over up to 32 samples" in explained
    nets = []
    for capacity in (128, 1):
        model.reset()
        nets.append(codegen.compile(model.loss, model.inputs, model.params, outputs=model.outputs,
                                    batch=capacity, tiered=False))
    X, y = model.X[:80], model.Y[:80]
    losses = [net.train(X, y, 0.02, scale=model.scale, batch_size=40) for net in nets]
    assert_close(losses[0], losses[1], "float64")
    assert_close(nets[0].params, nets[1].params, "float64")
    assert_close(nets[0].predict(X, scale=model.scale), nets[1].predict(X, scale=model.scale), "float64")


def test_a_pass_holds_what_fits_the_caches(monkeypatch):
    """pass_capacity: the most samples a pass holds is the largest power of two (at least a
    cache line of each slot: 8 in float64, 16 in float32; at most the module's batch) whose
    values fit PASS_BYTES; the zoo's CNN's 6,247 slots a sample give 32 in float64 and 64 in
    float32, a small MLP keeps the batch it is built for."""
    model = cnn()
    cnn_program = codegen.lower.ir.lower(model.loss, model.inputs, model.params, model.outputs)
    mlp, xs, ys, logits, loss = classifier()
    mlp_program = codegen.lower.ir.lower(loss, xs + ys, mlp.parameters(), logits)
    for program, itemsize, built, expected in ((cnn_program, 8, 128, 32), (cnn_program, 4, 128, 64),
                                               (cnn_program, 8, 16, 16), (cnn_program, 8, 4, 4),
                                               (mlp_program, 8, 128, 128), (mlp_program, 4, 1024, 1024)):
        held = pass_capacity(program, built, itemsize)
        per_sample = held * _Layout(program, built).per_sample * itemsize
        assert held == expected and per_sample <= PASS_BYTES and (held == built or 2 * per_sample > PASS_BYTES)
    with pytest.raises(ValueError, match="batch must be an int from 1 to 4096"):
        codegen.explain(model.loss, model.inputs, model.params, model.outputs, batch=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        codegen.explain(model.loss, model.inputs, model.params, model.outputs, dtype="float16")
    no_sample_slots = types.SimpleNamespace(sequence=None, n_params=3, constants=[], n_slots=3)
    assert pass_capacity(no_sample_slots, 128, 8) == 128  # (found by test_fuzz: it looped for ever)
    monkeypatch.setattr(codegen.lower.batch, "PASS_BYTES", 1)
    assert pass_capacity(cnn_program, 128, 8) == 8 and pass_capacity(cnn_program, 128, 4) == 16
    assert pass_capacity(cnn_program, 12, 4) == 12  # (never more than the module's batch)
    summary = codegen.explain(model.loss, model.inputs, model.params, model.outputs, dtype="float32").summary()
    assert "batched over up to 16 samples" in summary


def test_no_batched_form_falls_back_and_explain_says_so():
    """Scalar mode (fuse=False) has no batched form: train() with batches runs sample by sample,
    correctly, and codegen.explain says why."""
    model, xs, ys, logits, loss = classifier(hidden=(5,))
    program = codegen.lower.ir.lower(loss, xs + ys, model.parameters(), logits, fuse=False)
    with pytest.raises(NotBatchable, match="scalar mode"):
        batch_program(program)
    explanation = codegen.explain(loss, xs + ys, model.parameters(), logits, fuse=False)
    assert "no batched form" in explanation.summary() and "scalar mode" in explanation.summary()
    assert "batched over up to 128 samples" in codegen.explain(loss, xs + ys, model.parameters(), logits).summary()
    init = [p.data for p in model.parameters()]
    nets = []
    for fuse in (False, True):
        for p, v in zip(model.parameters(), init):
            p.data = v
        nets.append(codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, fuse=fuse))
    X, y = data()
    assert_close(nets[0].train(X, y, 0.1, batch_size=6), nets[1].train(X, y, 0.1, batch_size=6), "float64")
    assert_close(nets[0].params, nets[1].params, "float64")


@pytest.mark.requires("gcc")  # the table's micrograd-c is gcc -O3 -march=native
def test_the_minibatch_benchmark_runs(mnist_dir, capsys, monkeypatch):
    """`make bench`'s minibatch table (bench/minibatch.py) at a small size: our rows measured in
    their own processes, the table printed with every run it promises; then the windows taken in
    turn from processes kept running (bench/windows.py), each run's median, and the one thread's
    beside ours: the threads' gain."""
    from bench import minibatch
    monkeypatch.setattr(minibatch, "WINDOW_ROWS", (("mlp-50", "float32"),))
    assert minibatch.main(["--systems", "micrograd-c", "micrograd-c 1 thread", "--models", "mlp-50",
                           "--dtypes", "float32", "--images", "256", "--repeats", "1", "--batches", "1", "32",
                           "--windows", "2", "--data-dir", str(mnist_dir)]) == 0
    out = capsys.readouterr().out
    table, windowed = out.split("Windows taken in turn")
    for run in ("train B=1", "train B=32", "predict"):
        row = next(line for line in table.splitlines() if line.startswith(f"| mlp-50 | float32 | {run}"))
        ours, one_thread = row.split(" | ")[3:5]
        assert float(ours) > 0 and float(one_thread) > 0
    windowed, against_peak = windowed.split("The same rounds against the cores' multiply-add peak")
    rows = [line.split(" | ") for line in windowed.splitlines() if line.startswith("| mlp-50 | float32 |")]
    assert [r[2] for r in rows] == ["train B=32", "predict"]  # (batches of 32 and more)
    assert all(float(r[3]) > 0 and r[4] == r[5] == r[6] == "-" for r in rows)  # no peer asked for
    # the one thread's windows beside, and the threads' gain: its window over ours, a median
    assert all(float(r[8]) > 0 and float(r[9].strip("*x")) > 0 for r in rows)
    # the served peak's windows in the same rounds: our rate, the peak's, the share, the gains
    rows = [line.split(" | ") for line in against_peak.splitlines() if line.startswith("| mlp-50 | float32 |")]
    assert [r[2] for r in rows] == ["train B=32", "predict"]
    for r in rows:
        rate, top, share = float(r[3]), float(r[4]), float(r[5].strip("*%")) / 100
        assert rate > 0 and top > 0 and share > 0
        assert all(float(cell.strip("*x%")) > 0 for cell in r[7:10])


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(DTYPES)), indirect=["compiler"])
def test_sparse_inputs_skip_the_zero_rows_of_a_batch(compiler, dtype):
    """sparse_inputs=True: the first layer's products visit only the input rows that hold a
    nonzero in the batch (a list scan_batch_rows makes); the numbers are the dense ones."""
    X, y = data(60)
    X[:, ::2] = 0  # half the inputs 0 in every row, the others in some rows only
    X[X < 0.4] = 0
    batched, single = twins(compiler, dtype=dtype, sparse_inputs=True)
    assert "scan_rows(" in batched.build.source.read_text()
    for epoch in range(2):
        assert_close(batched.train(X, y, 0.05, batch_size=16, seed=epoch),
                     single.train(X, y, 0.05, batch_size=16, seed=epoch), dtype)
    assert_close(batched.params, single.params, dtype)
    assert_close(batched.predict(X), single.predict(X), dtype)


def test_a_program_of_too_many_groups_has_no_batched_form():
    """Straight-line code (groups that did not become loops) past batch.MAX_GROUPS: no batched
    form, which would be as many more loops to compile."""
    from codegen.lower import batch
    x = Value(0.5)
    y = x
    for i in range(batch.MAX_GROUPS + 10):  # a chain: every op its own group
        y = (y * 1.0001 + 0.001).tanh() if i % 2 else y + x
    program = codegen.lower.ir.lower(y, [x], [])
    assert len(program.forward) > batch.MAX_GROUPS
    with pytest.raises(NotBatchable, match="groups"):
        batch_program(program)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(DTYPES)), indirect=["compiler"])
def test_uint8_rows_load_as_their_float_values(compiler, dtype):
    """A batch's uint8 X (images) loads into its columns 16 samples by 16 columns at a time where
    the compiler has SSE2 (templates/batch.c's load_byte_tiles: a transpose of bytes, then each
    column converted as one vector), the rest a value at a time: train() and predict() give the
    same bits as the same X in float64, whose values load one at a time. 40 inputs (two tiles of
    columns and 8 after) and 37 samples (two tiles and 5), shuffled."""
    case = classifier(n_in=40)
    batched, _ = twins(compiler, batch=64, case=case, dtype=dtype)
    twin, _ = twins(compiler, batch=64, case=case, dtype=dtype)
    rng = np.random.default_rng(3)
    X, y = rng.integers(0, 256, (37, 40), dtype=np.uint8), rng.integers(0, 4, 37)
    predicted = [np.asarray(net.predict(rows, scale=1 / 255)) for net, rows in ((batched, X), (twin, X.astype(float)))]
    np.testing.assert_array_equal(bits(predicted[0]), bits(predicted[1]))
    for epoch in range(2):
        assert (batched.train(X, y, 0.05, scale=1 / 255, batch_size=32, seed=epoch)
                == twin.train(X.astype(np.float64), y, 0.05, scale=1 / 255, batch_size=32, seed=epoch))
    np.testing.assert_array_equal(bits(np.asarray(batched.params)), bits(np.asarray(twin.params)))
