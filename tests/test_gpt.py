"""microgpt ported to micrograd_c (gpt/): the compiled Document graph against microgpt's own
interpreted loss, document by document and length by length, on every compiler; chains of max
compiled as one maximum; training steps and sampling against microgpt's loop; the app.

Tolerances: float64 fused code sums in another order than the interpreter (1e-9 relative, as
tests/test_compile.py holds the fused mode), and the compiled loss weighs each position by 1/n
where microgpt multiplies the sum by 1/n (a rounding apart). float32: 1e-4, as there.
"""

import functools
import random
import subprocess
import sys

import numpy as np
import pytest

import codegen
import templates
from conftest import compiler_diagonal
from gpt import data, model, train
from micrograd_c import Value
from test_optim import OPTIMIZERS, Reference

TINY = model.Config(n_embd=4, n_head=2, n_layer=1, block_size=5)
DOCS = ["ava", "bo", "cy", "dee", "e", "abcde", "bac", "edcba", "ca", "adeb"]


@pytest.fixture
def tiny():
    """(tokenizer, state, params): fresh for each test (their data and grads change)"""
    random.seed(1)
    tokenizer = data.Tokenizer(DOCS)
    state, params = model.init_state(TINY, tokenizer.vocab_size)
    return tokenizer, state, params


def compiled(tiny, compiler="tcc", dtype="float64", batch=1, **options):
    """The tiny GPT's module, built by `compiler` (tiered=False unless asked: its C is long enough
    that a compile would tier, and the tests would run the first tier's TCC build)."""
    options.setdefault("tiered", False)
    tokenizer, state, params = tiny
    doc = model.document(state, TINY)
    return codegen.compile(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, compiler=compiler,
                           dtype=dtype, batch=batch, optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS),
                           **options)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float64", "float32"])), indirect=["compiler"])
def test_every_length_equals_microgpts_loss(tiny, compiler, dtype):
    """One module for documents of 1 to block_size positions (and longer ones, cut as microgpt
    cuts them): loss and every parameter's gradient as microgpt's graph of that length gives."""
    tokenizer, state, params = tiny
    net = compiled(tiny, compiler, dtype)
    tolerance = 1e-9 if dtype == "float64" else 1e-4
    for doc in ["", "a", "ab", "abc", "abcd", "abcde", "edcbaab"]:
        tokens = tokenizer.encode(doc)
        expected = model.interpreted_loss(state, TINY, tokens)
        for p in params:
            p.grad = 0
        expected.backward()
        net.set_input(data.row(tokens, TINY.block_size))
        loss = net.forward()
        net.zero_grad()
        net.backward()
        grads = np.asarray(net.grad)[:len(params)]
        expected_grads = np.array([p.grad for p in params])
        assert loss == pytest.approx(expected.data, rel=tolerance), doc
        np.testing.assert_allclose(grads, expected_grads, rtol=tolerance, atol=tolerance * np.abs(expected_grads).max(),
                                   err_msg=doc)
        assert np.abs(expected_grads).max() > 0


def test_positions_past_the_end_get_no_gradient(tiny):
    """A document of two positions: the rows of wpe past them get exactly 0."""
    tokenizer, state, params = tiny
    net = compiled(tiny)
    net.set_input(data.row(tokenizer.encode("ab"), TINY.block_size))
    net.forward()
    net.zero_grad()
    net.backward()
    grads = np.asarray(net.grad)
    wpe = [id(p) for row in state["wpe"] for p in row]
    position = {pid: i // TINY.n_embd for i, pid in enumerate(wpe)}
    for i, p in enumerate(params):
        if id(p) in position:
            assert (grads[i] == 0) == (position[id(p)] >= 3), position[id(p)]


def test_training_follows_microgpts_loop(tiny):
    """60 steps of the compiled module (Adam inside) against microgpt's loop on the interpreter,
    from the same parameters over the same documents: the losses agree step by step."""
    tokenizer, state, params = tiny
    start = [p.data for p in params]
    args = train.parse_args(["--steps", "60", "--n-embd", "4", "--n-head", "2", "--block-size", "5", "--lr", "0.05"])
    args.config = TINY
    net = compiled(tiny)
    bar = _Bar()
    compiled_losses = list(train.train_compiled(net, DOCS, tokenizer, args, bar))
    interpreted = list(train.train_interpreted(state, params, DOCS, tokenizer, args, bar))
    for p, v in zip(params, start):
        p.data = v
    np.testing.assert_allclose(compiled_losses, interpreted, rtol=1e-9)
    assert np.mean(interpreted[-10:]) < np.mean(interpreted[:10]) - 0.1  # it learned


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw"])
def test_a_batch_of_mixed_lengths_steps_on_the_documents_mean_gradient(tiny, optimizer):
    """train(batch_size=4) over documents of 1 to block_size+ positions: each step is the
    optimizer's on the mean of microgpt's per-document gradients (the interpreter's), the
    returned loss their mean; 3 steps, the last batch short."""
    tokenizer, state, params = tiny
    description = OPTIMIZERS[optimizer]
    doc = model.document(state, TINY)
    net = codegen.compile(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, compiler="tcc",
                          optimizer=description, batch=4)
    docs = ["", "abcdeab", "ab", "e", "dee", "abcde", "ca", "b", "eddy", "a"]
    rows = np.stack([data.row(tokenizer.encode(d), TINY.block_size) for d in docs])
    reference = Reference(description, len(params))
    p = np.array([v.data for v in params])
    lr = 0.05
    for start in range(0, len(docs), 4):
        batch = docs[start:start + 4]
        X = np.ascontiguousarray(rows[start:start + 4, :2 * TINY.block_size])
        Y = np.ascontiguousarray(rows[start:start + 4, 2 * TINY.block_size:])
        loss = net.train(X, Y, lr, batch_size=4)
        losses, grads = [], []
        for d in batch:
            for v, x in zip(params, p):
                v.data, v.grad = x, 0
            expected = model.interpreted_loss(state, TINY, tokenizer.encode(d))
            expected.backward()
            losses.append(expected.data)
            grads.append([v.grad for v in params])
        assert loss == pytest.approx(np.mean(losses), rel=1e-9)
        p = reference.step(p, np.mean(grads, axis=0), lr)
        np.testing.assert_allclose(np.asarray(net.params), p, rtol=1e-9, atol=1e-12)


def test_sampling_through_the_module_is_microgpts(tiny):
    tokenizer, state, params = tiny
    net = compiled(tiny)
    args = train.parse_args(["--samples", "8", "--n-embd", "4", "--n-head", "2", "--block-size", "5"])
    args.config = TINY
    random.seed(5)
    from_module = train.sample_names(train.compiled_logits(net, tokenizer, TINY), tokenizer, args)
    random.seed(5)
    interpreted = train.sample_names(train.interpreted_logits(state, TINY), tokenizer, args)
    assert from_module == interpreted and len(set(from_module)) > 1


def test_max_chains_are_one_maximum(compiler):
    """reduce(Value.max, xs) compiles to one maximum: the chain's value, and its gradient on the
    first of equal largest values (ties), evenly spaced or not, with constants."""
    xs = [Value(v) for v in (0.5, 2.0, -1.0, 2.0, 1.5)]
    p = Value(0.25)
    picks = [xs[4] * p, xs[0], xs[2] * 1.0, xs[1] + 0.0, xs[3] * p, Value(-3.0), xs[1] * p]
    top = functools.reduce(Value.max, picks)
    loss = top * top + functools.reduce(Value.max, [x * p for x in xs])
    program = codegen.lower.ir.lower(loss, [], xs + [p])
    assert sum(1 for g in program.forward if g.first.kind == "op" and g.first.op.name == "maximum") == 2
    loss.backward()
    net = codegen.compile(loss, params=xs + [p], compiler=compiler)
    assert net.forward() == loss.data
    net.zero_grad()
    net.backward()
    assert list(np.asarray(net.grad)[:6]) == [x.grad for x in xs + [p]]
    assert xs[1].grad != 0 and xs[3].grad == 0  # the first of the equal largest


def test_attention_is_loops_not_statements(tiny):
    """The per-position code is shared: every position is one loop nest's iteration (the first one
    or two positions' attention aside), and the causal triangle is one loop nest over the
    positions, not one per position (codegen/lower/vector.py's _families, _shared_rows): the
    program has as many groups at every block_size, with one layer or two."""
    counts = []
    for block_size, n_layer in ((6, 1), (9, 1), (6, 2), (9, 2)):
        config = model.Config(n_embd=8, n_head=2, n_layer=n_layer, block_size=block_size)
        state, params = model.init_state(config, tiny[0].vocab_size)
        doc = model.document(state, config)
        program = codegen.lower.ir.lower(doc.loss, doc.inputs, params, doc.outputs)
        singles = sum(1 for g in program.forward if not g.shape)
        assert singles <= 3, singles  # (the first positions' projections join the later ones': _shared_rows)
        assert any(g.shape[0] >= config.block_size for g in program.forward if g.shape)  # every position a loop's pass
        counts.append((len(program.forward), len(program.backward)))
    assert counts[0] == counts[1] and counts[2] == counts[3], counts
    assert counts[2][0] < 2 * counts[0][0], counts  # a second layer: its own loops, no more statements



def test_the_units_compile_side_by_side_in_about_equal_time():
    """microgpt's generated functions go into C files cut where their slot accesses (which a
    compiler's time follows; codegen/write/emit.py's _compile_cost) are about equal, not their
    lines: its forward's loops cost more a line than its backward's (cut by lines, the two files
    held 665 and 357 accesses, and took 1.3 and 0.9 s of gcc -O2). The cuts are the best the
    functions allow (emit._units): no function moved across one makes the larger side smaller."""
    random.seed(42)
    config = model.Config(n_embd=16, n_head=4, n_layer=1, block_size=16)  # microgpt's default
    state, params = model.init_state(config, 27)
    doc = model.document(state, config)
    sources = codegen.generate(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, batch=1,
                               optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS))
    units = [s for s in sources[1:] if not isinstance(s, templates.SharedSource)]
    functions = [[f.count("[") for f in unit.split("\nCHUNK void ")[1:]] for unit in units]  # (each one's accesses)
    accesses = [sum(unit) for unit in functions]
    assert len(units) >= 2 and max(accesses) <= 1.5 * min(accesses), accesses
    for k in range(len(units) - 1):  # no function at a cut, moved across it, makes the larger unit smaller
        left, right = accesses[k], accesses[k + 1]
        assert max(left - functions[k][-1], right + functions[k][-1]) >= max(left, right), (accesses, functions)
        assert max(left + functions[k + 1][0], right - functions[k + 1][0]) >= max(left, right), (accesses, functions)


class _Bar:
    def update(self, n):
        pass


@pytest.mark.parametrize("batch", [1, 3])
def test_the_app_trains_and_samples(tmp_path, batch):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(DOCS * 3) + "\n")
    run = subprocess.run([sys.executable, "-m", "gpt", "--data", str(names), "--steps", "12", "--n-embd", "4",
                          "--n-head", "2", "--block-size", "6", "--samples", "3", "--compiler", "tcc",
                          "--batch-size", str(batch)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "num docs: 30" in lines and "vocab size: 9" in lines  # a to e, v, y, o and BOS
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 12 and steps[0].startswith("step    1 /   12 | loss ")
    assert sum(line.startswith("sample ") for line in lines) == 3
    assert lines[-1].startswith(f"summary: 12 steps of {batch} document(s)")


def test_the_app_reports_bad_data(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    for path, message in ((empty, "no documents"), (tmp_path / "missing.txt", "no such file")):
        run = subprocess.run([sys.executable, "-m", "gpt", "--data", str(path), "--steps", "1"],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode != 0 and message in run.stderr
    run = subprocess.run([sys.executable, "-m", "gpt", "--n-embd", "6", "--n-head", "4"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "multiple of n_head" in run.stderr


def test_windows_cut_a_text_so_every_character_is_a_target_once(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("abcdefghij\nk")  # 12 characters
    windows = data.load_windows(text, 4)
    assert windows == ["abcde", "efghi", "ij\nk"]
    tokenizer = data.Tokenizer(windows, framed=False)
    assert tokenizer.encode("ab") == [1, 2] and tokenizer.start == 0  # no BOS; "\n" sorts first
    rows = [data.row(tokenizer.encode(w), 4) for w in windows]
    targets = "".join(tokenizer.decode(r[4:4 + len(w) - 1].astype(int)) for r, w in zip(rows, windows))
    assert targets == "bcdefghij\nk"  # every character after the first, once
    assert rows[2][8:].tolist() == [1 / 3] * 3 + [0.0]  # the last window's 3 positions
    one = tmp_path / "one.txt"
    one.write_text("a")
    with pytest.raises(data.DataError, match="at least 2 characters"):
        data.load_windows(one, 4)


def test_held_out_split_and_its_loss(tiny):
    """The held-out documents are the shuffled list's last ones, and their mean loss through the
    module is the interpreter's."""
    tokenizer, state, params = tiny
    train_docs, held_out = data.split(DOCS, 0.3)
    assert train_docs == DOCS[:7] and held_out == DOCS[7:]
    assert data.split(DOCS, 0) == (DOCS, [])
    for bad in (0.01, 0.99, 1.0, -0.1):
        with pytest.raises(data.DataError):
            data.split(DOCS, bad)
    net = compiled(tiny)
    compiled_mean = train.mean_loss(train.compiled_loss_of(net, TINY), held_out, tokenizer)
    interpreted_mean = train.mean_loss(train.interpreted_loss_of(state, TINY), held_out, tokenizer)
    assert compiled_mean == pytest.approx(interpreted_mean, rel=1e-12)


def test_the_app_trains_on_windows_of_a_text_and_reports_held_out_loss(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat.\nthe dog sat on the log.\n" * 4)
    run = subprocess.run([sys.executable, "-m", "gpt", "--data", str(text), "--windows", "--held-out", "0.25",
                          "--steps", "20", "--n-embd", "4", "--n-head", "2", "--block-size", "6", "--samples", "2",
                          "--quiet", "--compiler", "tcc"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "num docs: 24 (and 8 held out)" in lines  # 192 characters in windows of 7 every 6
    before = [float(line.split()[-1]) for line in lines if line.startswith("held-out loss before training: ")]
    after = [float(line.split()[2]) for line in lines if line.startswith("held-out loss: ")]
    assert len(before) == len(after) == 1 and after[0] < before[0]
    assert "--- inference (new, hallucinated text) ---" in lines
    assert sum(line.startswith("sample ") for line in lines) == 2
    bad = subprocess.run([sys.executable, "-m", "gpt", "--data", str(text), "--held-out", "1.5"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--held-out" in bad.stderr
