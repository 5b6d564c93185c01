"""Loops that stop at the sample's length (codegen/lower/positions.py): a loss that weighs each
position's term by an input (microgpt's port: 1/n for a document's n positions, 0 after) makes
train() and gradients() skip every position past the last nonzero weight. The results are the
unbounded program's, bit for bit (forward() and predict() run every position), and microgpt's
own per-length graph's."""

import random
import re

import numpy as np
import pytest

import codegen
import templates
from conftest import compiler_diagonal, seeded_cache
from codegen.backend.toolchain import COMPILER_NAMES
from gpt import data, model, train
from micrograd_c import Value
from test_gpt import TINY as CONFIG, compiled as _compile, tiny  # noqa: F401 (tiny: the fixture)

OPTIMISING = tuple(name for name in COMPILER_NAMES if name != "tcc")
LENGTHS = ["abcde", "", "a", "ab", "abc", "abcd", "edcbaab"]  # 2..5 positions, and cut at block_size


def _split(rows):
    rows = np.atleast_2d(rows)
    block = CONFIG.block_size
    return np.ascontiguousarray(rows[:, :2 * block]), np.ascontiguousarray(rows[:, 2 * block:])


def _full(net, row, n_params):
    """Loss and parameter gradients of forward() and backward(), which run every position."""
    net.set_input(row)
    loss = net.forward()
    net.zero_grad()
    net.backward()
    return loss, np.array(net.grad)[:n_params].copy()


def _bounded(net, row, n_params):
    """The same from gradients(), a training pass: the loops stop at the document's end."""
    net.zero_grad()
    loss = net.gradients(*_split(row))
    return loss, np.array(net.grad)[:n_params].copy()


def test_microgpts_graph_is_bounded_by_its_weights(tiny):
    tokenizer, state, params = tiny
    doc = model.document(state, CONFIG)
    explanation = codegen.explain(doc.loss, doc.inputs, params, doc.outputs)
    program = explanation.program
    assert program.sequence is not None and program.unbounded is None
    assert len(program.sequence.weights) == CONFIG.block_size
    assert "loops stop at each training sample's length" in explanation.summary()
    # every group reads a token: each is cut (a loop stops at the length) or guarded (one position's)
    cut = [s for s in explanation.steps if any(str(n).startswith("<=") for n in s.shape)]
    guarded = [g for g in program.forward if g.guard is not None]
    assert len(cut) >= 30 and len(guarded) >= 4  # (the first positions' softmax of one and of two values)
    assert len(cut) + len(guarded) == len(program.forward) - 1, str(explanation)  # (and the loss's sum)
    assert program.forward[-1].masked == program.sequence.slot


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float64", "float32"])), indirect=["compiler"])
def test_a_training_pass_equals_every_position_computed(tiny, compiler, dtype):
    """Every length (and weights all 0): gradients()'s loss and gradients are forward() and
    backward()'s bit for bit, and microgpt's graph of that length's (the interpreter)."""
    tokenizer, state, params = tiny
    net = _compile(tiny, compiler, dtype)
    tolerance = 1e-9 if dtype == "float64" else 1e-4
    rows = [data.row(tokenizer.encode(d), CONFIG.block_size) for d in LENGTHS]
    silent = rows[1].copy()
    silent[2 * CONFIG.block_size:] = 0
    for doc, row in [*zip(LENGTHS, rows), (None, silent)]:
        full_loss, full_grads = _full(net, row, len(params))
        loss, grads = _bounded(net, row, len(params))
        assert loss == full_loss, doc
        np.testing.assert_array_equal(grads, full_grads, err_msg=str(doc))
        if doc is None:
            assert loss == 0 and not grads.any()
            continue
        expected = model.interpreted_loss(state, CONFIG, tokenizer.encode(doc))
        for p in params:
            p.grad = 0
        expected.backward()
        assert loss == pytest.approx(expected.data, rel=tolerance), doc
        np.testing.assert_allclose(grads, [p.grad for p in params], rtol=tolerance,
                                   atol=tolerance * max(abs(p.grad) for p in params), err_msg=doc)


@pytest.mark.parametrize("compiler", ["tcc", "gcc"], indirect=True)
def test_a_batch_stops_at_its_longest_document(tiny, compiler):
    """The batched program (gradients() of several rows) runs to the batch's longest document,
    position p over the documents that reach it (sorted longest first, whatever the order given):
    the sum of the documents' gradients, one by one with every position, within the fused bound."""
    tokenizer, state, params = tiny
    net = _compile(tiny, compiler, batch=4)
    for docs in (["a", "ab", "", "b"], ["abc", "a", "edcbaab", "ca"], ["", "a", "abc", "edcbaab"]):
        rows = np.stack([data.row(tokenizer.encode(d), CONFIG.block_size) for d in docs])
        one_by_one = [_full(net, row, len(params)) for row in rows]
        loss, grads = _bounded(net, rows, len(params))
        assert loss == pytest.approx(sum(l for l, _ in one_by_one), rel=1e-12)
        expected = sum(g for _, g in one_by_one)
        np.testing.assert_allclose(grads, expected, rtol=1e-9, atol=1e-12 * np.abs(expected).max())


@pytest.mark.parametrize("compiler", ["tcc", "clang"], indirect=True)
def test_a_batch_runs_each_position_over_the_documents_that_reach_it(tiny, compiler):
    """In a training pass the batched program's loops of position p run over the samples that
    reach p (the batch sorted longest first; codegen/lower/batch.py's _active_samples; against
    the documents one by one: the test above): train()'s steps are the same on 1 and 2 threads;
    predict() after it runs every sample at every position (forward()'s outputs, row by row)."""
    tokenizer, state, params = tiny
    net = _compile(tiny, compiler, batch=4)
    doc = model.document(state, CONFIG)
    units = codegen.generate(doc.loss, doc.inputs, params, doc.outputs, batch=4,
                             optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS))
    # (the count read once, before the loop: GCC vectorises no loop whose count its stores may change)
    header = r"for \(long i(\d) = 0, n\1 = \(long\)d\[\d+ \+ i\d\]; i\1 < n\1; i\1\+\+\)"
    assert re.search(header, "\n".join(map(str, units)))
    rows = np.stack([data.row(tokenizer.encode(d), CONFIG.block_size) for d in ["", "a", "abc", "edcbaab"]])
    stepped = []
    for threads in (1, 2):  # (each its own module: Adam's state moves with a step)
        fresh = _compile(tiny, compiler, batch=4)
        fresh.train(*_split(rows[::-1]), 0.01, batch_size=4, threads=threads)
        stepped.append(np.asarray(fresh.params).copy())
    np.testing.assert_array_equal(stepped[0], stepped[1])
    predicted = np.asarray(net.predict(_split(rows)[0]))
    for row, out in zip(rows, predicted):
        net.set_input(row)
        net.forward()
        np.testing.assert_allclose(out, net.outputs(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compiler", ["gcc"], indirect=True)
def test_a_batch_of_several_passes_runs_longest_first(tiny, compiler):
    """train() with a batch_size over the module's pass (batch=4: three passes): the batch's
    documents are sorted longest first across its passes (templates/batch.c's
    longest_first_pieces), which run side by side on the module's threads (add_pieces_side_by_side);
    one step equals the documents one by one (a module without a batched form) within the fused
    bound, and is the same bits on 1, 2 and 3 threads (a piece each, or two pieces on one thread)."""
    tokenizer, state, params = tiny
    docs = ["a", "edcbaab", "", "abc", "ab", "abcde", "b", "ca", "abcd", "e"]
    X, Y = _split(np.stack([data.row(tokenizer.encode(d), CONFIG.block_size) for d in docs]))
    stepped = []
    for batch, threads in ((1, 1), (4, 1), (4, 2), (4, 3)):  # (each its own module: Adam's state moves with a step)
        net = _compile(tiny, compiler, batch=batch)
        for _ in range(2):  # (the second step from the first's parameters, in every buffer set)
            loss = net.train(X, Y, 0.01, batch_size=len(docs), threads=threads)
        stepped.append((loss, np.asarray(net.params).copy()))
    (one_by_one, expected), (loss, params_after), *others = stepped
    assert loss == pytest.approx(one_by_one, rel=1e-12)
    np.testing.assert_allclose(params_after, expected, rtol=1e-9, atol=1e-12)
    assert not np.array_equal(params_after, np.asarray(_compile(tiny, compiler, batch=4).params))  # (it stepped)
    for loss_n, params_n in others:
        assert loss_n == loss
        np.testing.assert_array_equal(params_n, params_after)


@pytest.mark.parametrize("compiler", ["gcc"], indirect=True)
def test_pieces_gradients_add_up_on_the_threads_in_order(compiler):
    """A sequence's pieces' parameter gradients add up on the module's threads (templates/batch.c's
    add_piece_gradients: from 16,384 values, here 3 pieces of a model of n_embd 32, 12,832
    parameters), each parameter's in the pieces' order: the same bits on 1, 2 and 3 threads, and
    the numbers of the documents one by one within the fused bound."""
    config = model.Config(n_embd=32, n_head=2, n_layer=1, block_size=5)
    random.seed(2)
    docs = ["a", "edcbaab", "", "abc", "ab", "abcde", "b", "ca", "abcd", "e"]
    tokenizer = data.Tokenizer(docs)
    state, params = model.init_state(config, tokenizer.vocab_size)
    assert len(params) * 3 >= 16384
    X, Y = _split(np.stack([data.row(tokenizer.encode(d), config.block_size) for d in docs]))
    doc = model.document(state, config)
    stepped = []
    for batch, threads in ((1, 1), (4, 1), (4, 2), (4, 3)):
        net = codegen.compile(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, compiler=compiler,
                              batch=batch, optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS), tiered=False)
        losses = [net.train(X, Y, 0.01, batch_size=len(docs), threads=threads) for _ in range(2)]
        stepped.append((losses, np.asarray(net.params).copy()))
    (one_by_one, expected), (losses, after), *others = stepped
    assert losses == pytest.approx(one_by_one, rel=1e-12)
    np.testing.assert_allclose(after, expected, rtol=1e-9, atol=1e-12)
    for losses_n, after_n in others:
        assert losses_n == losses
        np.testing.assert_array_equal(after_n, after)



@pytest.mark.parametrize("compiler", COMPILER_NAMES, indirect=True)
def test_a_batch_of_one_pass_runs_as_two_halves(tiny, compiler):
    """A sequence's batch of more than 8 documents that one pass would hold runs as two pieces
    side by side (templates/batch.c's piece_samples: halves rounded up to 8), so that its
    statement loops take two cores: a batch of 12 on a module of 16 a pass (built for 32: a pass
    holds half, codegen/lower/batch.py's pass_capacity) is the pieces of 8 and 4 a module of 8 a
    pass (built for 16) runs, the same bits, on 1 or 2 threads; and the documents one by one
    within the fused bound."""
    tokenizer, state, params = tiny
    docs = ["a", "edcbaab", "", "abc", "ab", "abcde", "b", "ca", "abcd", "e", "dee", "bac"]
    X, Y = _split(np.stack([data.row(tokenizer.encode(d), CONFIG.block_size) for d in docs]))
    stepped = []
    for batch, threads in ((1, 1), (32, 1), (32, 2), (16, 1)):
        net = _compile(tiny, compiler, batch=batch)
        losses = [net.train(X, Y, 0.01, batch_size=len(docs), threads=threads) for _ in range(2)]
        stepped.append((losses, np.asarray(net.params).copy()))
    doc = model.document(state, CONFIG)
    program = codegen.lower.ir.lower(doc.loss, doc.inputs, params, doc.outputs)
    assert [codegen.lower.batch.batched_form(program, built)[0].capacity for built in (32, 16, 4)] == [16, 8, 4]
    (one_by_one, expected), halves, *same = stepped
    assert halves[0] == pytest.approx(one_by_one, rel=1e-12)
    np.testing.assert_allclose(halves[1], expected, rtol=1e-9, atol=1e-12)
    for losses, params_after in same:
        assert losses == halves[0]
        np.testing.assert_array_equal(params_after, halves[1])

def test_positions_past_the_end_are_skipped_and_predict_runs_them_all(tiny):
    """After a training pass on a short document the outputs of the later positions are the
    previous pass's (not computed); predict() and forward() compute every position."""
    tokenizer, state, params = tiny
    net = _compile(tiny)
    long, short = (data.row(tokenizer.encode(d), CONFIG.block_size) for d in ("abcde", "b"))
    vocab = tokenizer.vocab_size
    net.set_input(long)
    net.forward()
    before = np.array(net.outputs())
    net.gradients(*_split(short))
    after = np.array(net.outputs())
    assert not np.array_equal(after[vocab:2 * vocab], before[vocab:2 * vocab])  # position 1: the new document's
    np.testing.assert_array_equal(after[2 * vocab:], before[2 * vocab:])  # positions 2..: skipped
    predicted = np.asarray(net.predict(_split(short)[0]))[0]
    net.set_input(short)
    net.forward()
    np.testing.assert_array_equal(predicted, net.outputs())
    assert not np.array_equal(predicted[2 * vocab:], before[2 * vocab:])


def test_training_steps_equal_the_unbounded_module(tiny):
    """train() on documents of mixed lengths, one a step (Adam), against the same steps taken
    from forward() and backward() and update(): the same parameters, bit for bit."""
    tokenizer, state, params = tiny
    bounded, full = _compile(tiny), _compile(tiny)
    assert bounded is not full
    for doc in ["ab", "abcde", "a", "edcbaab", "", "dee"]:
        row = data.row(tokenizer.encode(doc), CONFIG.block_size)
        loss = bounded.train(*_split(row), 0.01)
        full.set_input(row)
        assert full.forward() == loss
        full.zero_grad()
        full.backward()
        full.update(0.01)
        np.testing.assert_array_equal(np.asarray(bounded.params), np.asarray(full.params))


@pytest.mark.parametrize("compiler", ["tcc", "gcc", "clang", "zig"], indirect=True)
def test_backward_leaves_the_gradients_it_reads_zero(tiny, compiler):
    """A sequence module's backward sets each gradient back to 0 once read (codegen/write/
    backward.py's Plain, clears), so train() clears none before the next document: documents of
    mixed lengths in one call and in calls one after another, and a call after values were
    written into the gradients through `grad`, take the steps forward(), backward() and update()
    take (which clear every gradient first), bit for bit; after train() every gradient is 0."""
    tokenizer, state, params = tiny
    # (the optimised build throughout: a first tier's TCC rounds some sums 1 ulp apart from GCC's and
    # Clang's, and under load one module's calls could run on each; seen once in a full run)
    trained, stepped = _compile(tiny, compiler, tiered=False), _compile(tiny, compiler, tiered=False)
    docs = ["edcbaab", "a", "abcde", "", "ab", "edcbaab", "dee", "a"]
    rows = np.stack([data.row(tokenizer.encode(doc), CONFIG.block_size) for doc in docs])
    trained.train(*_split(rows[:4]), 0.01)  # (one call)
    for row in rows[4:6]:  # (calls one after another)
        trained.train(*_split(row), 0.01)
    grads = np.asarray(trained.grad)
    assert not grads.any()
    grads[len(params):] = np.arange(len(grads) - len(params))  # (what train() must clear first)
    del grads
    trained.train(*_split(rows[6:]), 0.01)
    for row in rows:
        stepped.set_input(row)
        stepped.forward()
        stepped.zero_grad()
        stepped.backward()
        stepped.update(0.01)
    np.testing.assert_array_equal(np.asarray(trained.params), np.asarray(stepped.params))


def test_a_loss_whose_loops_cannot_stop_computes_every_position():
    """A layer whose members reach the weighted terms out of order (member 0 term 2, member 1
    term 0, ...) cannot stop at a length: nothing is cut, explain says why, results as before."""
    xs = [Value(0.0) for _ in range(3)]
    ws = [Value(0.0) for _ in range(3)]
    ps = [Value(0.3 * (i + 1)) for i in range(3)]
    h = [(x * p).tanh() for x, p in zip(xs, ps)]
    terms = [h[1] * 2.0, h[2] * 2.0, h[0] * 2.0]
    loss = sum(w * t for w, t in zip(ws, terms))
    explanation = codegen.explain(loss, xs + ws, ps)
    assert explanation.program.sequence is None
    assert "every position computed (a loop nest's positions do not rise" in explanation.summary()
    net = codegen.compile(loss, inputs=xs + ws, params=ps, compiler="tcc")
    row = np.array([[0.5, -1.0, 2.0, 1.0, 0.0, 0.0]])
    assert net.gradients(row[:, :3], row[:, 3:]) == pytest.approx(2.0 * np.tanh(-1.0 * 0.6), rel=1e-12)


def _bodies(text, prefix):
    """The bodies of the generated functions named prefix + a number (a function ends at the
    first closing brace in its first column), one after another."""
    return "\n".join(re.findall(rf"\bvoid {prefix}\d+\([^)]*\)\n\{{\n(.*?)\n\}}\n", text, flags=re.S))


def test_a_batch_runs_each_positions_projections_as_one_product(tiny):
    """In the batched program a projection over (outputs, positions, batch) moves its positions'
    loop outside (codegen/lower/batch.py): per position, one matmul_set over the batch (here q, k
    and v as one product, the MLP's two and the head's), their inputs' gradients matmul_acc, and
    the weights' gradient matmul_nt where its rows are 16 long or more (here the MLP's second
    layer's; lists of 4 are dot_rows). (The generated functions' bodies only: the prelude
    mentions the kernels too.)"""
    tokenizer, state, params = tiny
    doc = model.document(state, CONFIG)
    units = codegen.generate(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, batch=8,
                             optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS))
    text = "\n".join(str(u) for u in units)
    forward, backward = _bodies(text, "forward_outputs_batch_"), _bodies(text, "backward_batch_")
    assert forward.count("matmul_set(") == 4
    assert backward.count("matmul_acc(") == 6 and backward.count("matmul_nt(") == 1
    assert "n0 = upto(" in forward  # (the positions' loop, outside, stops at the batch's longest document)


WIDE = model.Config(n_embd=16, n_head=2, n_layer=1, block_size=9)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float64", "float32"])), indirect=["compiler"])
def test_products_over_the_positions_equal_the_interpreter(tiny, compiler, dtype):
    """At a width of 16 and 9 positions the projections over the positions are kernel calls whose
    loops stop at the document's length (the forward matmul_set, the inputs' gradients
    matmul_acc, the weights' matmul_nt over fewer columns than a vector tile: 1..9): gradients()
    equals forward() and backward() bit for bit, and microgpt's per-length graph."""
    tokenizer = tiny[0]
    random.seed(3)
    state, params = model.init_state(WIDE, tokenizer.vocab_size)
    doc = model.document(state, WIDE)
    kwargs = dict(inputs=doc.inputs, params=params, outputs=doc.outputs, dtype=dtype,
                  optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS))
    net = codegen.compile(doc.loss, compiler=compiler, tiered=False, **kwargs)  # (its C is read)
    c = "\n".join(path.read_text() for path in net.build.c_files)
    calls = {kernel: len(re.findall(pattern + r"\([^;]*upto\(", c))  # (matmul_acc_nt: both backward ones)
             for kernel, pattern in (("matmul_set", "matmul_set"), ("matmul_acc", "matmul_acc(?:_nt)?"),
                                     ("matmul_nt", "matmul_(?:acc_)?nt"))}
    assert min(calls.values()) >= 4, calls  # the q/k/v, MLP and head projections at least
    tolerance = 1e-9 if dtype == "float64" else 2e-4
    for text in ["abc", "abcdeab", "abcdeabcdeab"]:  # 4, 8 and (cut) 9 positions
        tokens = tokenizer.encode(text)
        row = data.row(tokens, WIDE.block_size)
        net.set_input(row)
        full_loss = net.forward()
        net.zero_grad()
        net.backward()
        full_grads = np.array(net.grad)[:len(params)].copy()
        net.zero_grad()
        block = WIDE.block_size
        loss = net.gradients(row[None, :2 * block], row[None, 2 * block:])
        grads = np.array(net.grad)[:len(params)]
        assert loss == full_loss, text
        np.testing.assert_array_equal(grads, full_grads, err_msg=text)
        expected = model.interpreted_loss(state, WIDE, tokens)
        for p in params:
            p.grad = 0
        expected.backward()
        expected_grads = np.array([p.grad for p in params])
        assert loss == pytest.approx(expected.data, rel=tolerance), text
        np.testing.assert_allclose(grads, expected_grads, rtol=tolerance,
                                   atol=tolerance * np.abs(expected_grads).max(), err_msg=text)


LANES_DOCS = ["edcbaabcde", "abcdeabcd", "abcd", "bac", "ab", "a", "edcbaab", "ca", "adebcaed"]


def _lanes_case(dtype, batch=8, n_embd=4, docs=LANES_DOCS, n_layer=1):
    """A batched tiny GPT whose documents of up to 10 positions (sums of 8 terms and more, and
    fewer) reach a position in a full vector of lanes or in part of one: (graph, compile()'s
    options, inputs, targets)."""
    config = model.Config(n_embd=n_embd, n_head=2, n_layer=n_layer, block_size=10)
    random.seed(1)
    tokenizer = data.Tokenizer(docs)
    state, params = model.init_state(config, tokenizer.vocab_size)
    rows = np.stack([data.row(tokenizer.encode(d), config.block_size) for d in docs])
    X, Y = np.ascontiguousarray(rows[:, :2 * config.block_size]), np.ascontiguousarray(rows[:, 2 * config.block_size:])
    doc = model.document(state, config)
    options = dict(inputs=doc.inputs, params=params, outputs=doc.outputs, batch=batch, dtype=dtype,
                   optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS))
    return doc, options, X, Y


def _two_steps(net, X, Y, batch_size=8):
    """train()'s loss after two steps and the parameters, checked to have moved."""
    before = np.asarray(net.params).copy()
    for _ in range(2):
        loss = net.train(X, Y, 0.01, batch_size=batch_size)
    after = np.asarray(net.params).copy()
    assert not np.array_equal(after, before)  # (it stepped)
    return loss, after


def _bits_with_and_without(case, turn_off, check, compiler, dtype, monkeypatch, tmp_path, batch_size=8):
    """A batched case (_lanes_case's) built as it is and with a rewrite turned off (turn_off(patch),
    patch: monkeypatch's context), each in a cache of its own (a build is found by the graph's
    structure), check(units, on) asserting on each one's C: two train() steps, then a batch's
    gradients (Adam's steps from the first are near lr * sign(gradient): the gradients too), the
    same bits both ways."""
    doc, options, X, Y = case
    results = []
    for on in (True, False):
        with monkeypatch.context() as patch:
            if not on:
                turn_off(patch)
            check("\n".join(map(str, codegen.generate(doc.loss, **options))), on)
            net = codegen.compile(doc.loss, **options, compiler=compiler, tiered=False,
                                  cache=seeded_cache(tmp_path / str(on), compiler, dtypes=(dtype,)))
            assert not net.build.cached
        loss, after = _two_steps(net, X, Y, batch_size=batch_size)
        net.zero_grad()
        net.gradients(X, Y)
        results.append((loss, after, np.asarray(net.grad)[:net.n_params].copy()))
    (loss, after, grads), (loss_off, after_off, grads_off) = results
    assert loss == loss_off
    np.testing.assert_array_equal(after, after_off)
    np.testing.assert_array_equal(grads, grads_off)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_a_batchs_lanes_are_its_calls_bits(compiler, dtype, monkeypatch, tmp_path):
    """The batch's loops of dot_offsets and axpy_offsets calls (a call a sample: the attention's
    weighted sums and their gradients) are one call over the batch's lanes
    (templates/kernels/axpy.c's *_lanes), whose lanes sum what each call summed in its order:
    train()'s steps are the same bits as with the calls (loops.along_lanes turned off)."""
    from codegen.write import backward, forward

    def turn_off(patch):
        for module in (forward, backward):
            patch.setattr(module, "along_lanes", lambda *_: False)

    def check(units, lanes):
        assert bool(re.search(r"dot_offsets_lanes(_rows)?\(d \+", units)
                    and re.search(r"axpy_offsets_lanes(_rows)?\(g \+", units)) == lanes
    _bits_with_and_without(_lanes_case(dtype), turn_off, check, compiler, dtype, monkeypatch, tmp_path)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_the_weighted_sums_rows_are_their_calls_bits(compiler, dtype, monkeypatch, tmp_path):
    """A loop of lanes calls along a head's dimensions (the weighted sums, a row a dimension, and
    their backward's two calls a row) is one *_lanes_rows call (codegen/write/rows.py): the weights
    read once for two rows, their gradients held over the rows, the values' read once for them all.
    Three rows (a pair and one), 20 documents of mixed lengths on 16 lanes (AVX-512's 64-byte block
    where the CPU has it, then narrower blocks, then lanes one by one): two steps and the gradients
    after them, the same bits as the calls a row."""
    from codegen.write import backward, forward
    docs = [d[:k] for d in LANES_DOCS for k in (len(d), 1 + len(d) // 2)][:20]

    def turn_off(patch):
        patch.setattr(forward, "dot_calls_as_rows", lambda *_: None)
        patch.setattr(backward, "axpy_calls_as_rows", lambda *_: None)

    def check(units, rows):
        assert (units.count("dot_offsets_lanes_rows(d +"), units.count("axpy_offsets_lanes_rows(g +")) == (
            (1, 2) if rows else (0, 0))
    _bits_with_and_without(_lanes_case(dtype, batch=32, n_embd=6, docs=docs), turn_off, check, compiler, dtype,
                           monkeypatch, tmp_path, batch_size=len(docs))


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_a_repeated_lanes_call_is_one_call_of_two_rows_bits(compiler, dtype, monkeypatch, tmp_path):
    """RMSNorm's sum of squares, x times x, gives its gradient to x twice: the same
    axpy_offsets_lanes call twice a position, which is one axpy_offsets_lanes_rows call of two
    rows, every step 0 (codegen/write/rows.py's axpy_calls_repeated): each target's two terms added
    in a register in the calls' order. Three norms of 40 features, 20 documents of mixed lengths on
    32 lanes (AVX-512's 64-byte blocks where the CPU has it, narrower blocks, single lanes): two
    steps and the gradients after them, the same bits as the two calls."""
    from codegen.write import backward
    docs = [d[:k] for d in LANES_DOCS for k in (len(d), 1 + len(d) // 2)][:20]

    def check(units, merged):
        repeated = re.findall(r"axpy_offsets_lanes_rows\(g \+ [^,]*, offsets_\d+, 0, g \+ [^,]*, 0, d \+ [^;]*, 2\);", units)
        assert (len(repeated), units.count("axpy_offsets_lanes(g +")) == ((3, 0) if merged else (0, 6))
    case = _lanes_case(dtype, batch=32, n_embd=40, docs=docs)  # (sums of 40 terms: calls)
    _bits_with_and_without(case, lambda patch: patch.setattr(backward, "axpy_calls_repeated", lambda *_: None),
                           check, compiler, dtype, monkeypatch, tmp_path, batch_size=len(docs))


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_a_maximum_over_lanes_is_largest_at_lane_by_lane_bits(compiler, dtype, monkeypatch, tmp_path):
    """A maximum a sample in a batch's loop (the softmax's largest logit over the attention's keys,
    and over the vocabulary in the loss) is one largest_lanes call over the lanes forward and one
    add_to_largest_lanes backward (statements.py's _largest_lanes), each lane's compares in
    largest_at's order. 20 documents of mixed lengths on 32 lanes (AVX-512's 64-byte blocks where
    the CPU has it, narrower blocks, single lanes): two steps and the gradients after them, the
    same bits as largest_at a lane."""
    from codegen.write.statements import Statements
    docs = [d[:k] for d in LANES_DOCS for k in (len(d), 1 + len(d) // 2)][:20]

    def check(units, lanes):
        calls = (units.count("largest_lanes(d +"), units.count("add_to_largest_lanes(g +"), units.count("largest_at(d +"))
        assert calls == ((2, 2, 4) if lanes else (0, 0, 8)), calls  # (and the one-sample program's 4)
    _bits_with_and_without(_lanes_case(dtype, batch=32, n_embd=6, docs=docs),
                           lambda patch: patch.setattr(Statements, "_largest_lanes", lambda *_: None), check,
                           compiler, dtype, monkeypatch, tmp_path, batch_size=len(docs))


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_a_sums_gradient_over_lanes_is_its_calls_bits(compiler, dtype, monkeypatch, tmp_path):
    """A sum's gradient to its terms at offsets, an add_offsets call a sample behind `if (go != 0)`
    (the softmax's denominators' over the attention's keys), is one add_offsets_lanes call over
    the lanes (backward.py's AddLanes). 20 documents of mixed lengths on 32 lanes: two steps and the
    gradients after them, the same bits as the calls."""
    from codegen.write import backward
    docs = [d[:k] for d in LANES_DOCS for k in (len(d), 1 + len(d) // 2)][:20]

    def check(units, lanes):
        calls = units.count("add_offsets_lanes(g +"), len(re.findall(r"^ *add_offsets\(g \+", units, re.M))
        assert calls == ((1, 0) if lanes else (0, 1)), calls
    _bits_with_and_without(_lanes_case(dtype, batch=32, n_embd=6, docs=docs),
                           lambda patch: patch.setattr(backward, "AddLanes", lambda *_: None), check,
                           compiler, dtype, monkeypatch, tmp_path, batch_size=len(docs))


def test_a_loop_over_lanes_apart_is_one_whose_lanes_touch_their_own_slots():
    """loops.lanes_apart: a batch's loop whose every Affine steps one slot a lane, lane 0 at one
    remainder by the capacity (in d, and in g) whatever the loops outside, including a family's
    growing blocks (Extent steps, tri); not where a step outside, a base, a block's growth or a
    gradient's place would put one lane's slot in another lane's."""
    from codegen.lower.types import Affine, BatchExtent, Extent
    from codegen.write.loops import lanes_apart
    shape = (Extent(2, 1, 31), 4, BatchExtent(16))
    a = Affine(1175552, (32, 8432, 1), tri=16)
    b = Affine(1211392, (128, Extent(32, 16, 31), 1), tri=64)
    assert lanes_apart(shape, a, b)
    assert lanes_apart(shape, Affine(5, (32, 16, 1)), Affine(21, (16, 48, 1), grad_base=37))
    for other in (Affine(1211392 + 3, (128, 16, 1)), Affine(1211392, (128, 8, 1)), Affine(1211392, (128, Extent(32, 8, 31), 1)),
                  Affine(1211392, (128, 16, 1), tri=8), Affine(1211392, (128, 16, 1), grad_base=1211392 + 1),
                  Affine(1211392, (128, 16, 2)), Affine(1211392, (128, 16, 0))):
        assert not lanes_apart(shape, a, other), other
    assert not lanes_apart((4, 16), a, b)  # (not a batch's loop)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_a_familys_loop_over_lanes_apart_is_the_plain_loops_bits(compiler, dtype, monkeypatch, tmp_path):
    """A family's elementwise gradient over a batch's lanes (the attention's weights times the
    softmax's 1 / total, its blocks growing with the query) is marked INDEPENDENT where its lanes
    are apart (loops.lanes_apart): the C compiler vectorises it. 20 documents of mixed lengths on
    32 lanes: two steps and the gradients after them, the same bits as the loop unmarked."""
    from codegen.write import backward
    docs = [d[:k] for d in LANES_DOCS for k in (len(d), 1 + len(d) // 2)][:20]
    family = r"^ *(INDEPENDENT )?for \(long i3 = 0, n3 = \(long\)d\[\d+ \+ i0\]; i3 < n3; i3\+\+\) \{\n *g\[.*\+= \(d\["

    def check(units, apart):
        marked = [m.group(1) is not None for m in re.finditer(family, units, re.M)]
        assert marked == [apart], marked
    _bits_with_and_without(_lanes_case(dtype, batch=32, n_embd=6, docs=docs),
                           lambda patch: patch.setattr(backward, "lanes_apart", lambda *_: False), check,
                           compiler, dtype, monkeypatch, tmp_path, batch_size=len(docs))


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_the_gradients_cleared_by_rows_are_the_loops_bits(compiler, dtype, monkeypatch, tmp_path):
    """A gradient cleared once read in a nest of its own (after the products that read it) is a
    clear_rows call a pass (codegen/write/loops.py's cleared): the first positions that every
    document reaches at once, then a position's documents, row by row. Batches of 8 documents on
    8 lanes: every one of all 10 positions (a layer's gradients one run: one memset), of 8 or 9
    (a memset a row), of mixed lengths (short rows): two steps, then the gradients of the batches
    (each step's start from gradients at 0: a cell left uncleared would add into the next step's),
    the same bits as with the loops."""
    from codegen.write import backward, loops
    full, long = ([(d * 10)[:n + k % 2] for k, d in enumerate(LANES_DOCS[:8])] for n in (9, 7))
    mixed = [d[:k] for d in LANES_DOCS for k in (len(d), 1 + len(d) // 2)][:8]

    def turn_off(patch):
        nest = lambda shape, clears: loops.loop_nest(shape, clears, independent=True)  # noqa: E731
        patch.setattr(loops, "cleared", nest)
        patch.setattr(backward, "cleared", nest)

    def check(units, rows):
        calls = re.findall(r"clear_rows\(g \+ \d+ \+ \d+ \* i0, \d+, \d+, \(i0 < f0 \? f0 \* 8 : ", units)
        assert (len(calls) >= 2) == rows and ("clear_rows(g" in units) == rows
    _bits_with_and_without(_lanes_case(dtype, docs=full + long + mixed), turn_off, check, compiler, dtype,
                           monkeypatch, tmp_path)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"], compilers=OPTIMISING)),
                         indirect=["compiler"])
def test_a_build_for_the_hosts_vectors_is_the_baselines_bits(compiler, dtype, monkeypatch):
    """An optimising build takes the host's vector width (compilers.host_vector_flags: -mavx2
    where the CPU has AVX2, no FMA; the units of the model's loops also AVX-512 where it has that,
    host_loop_flags, no FMA either): the statement loops in 32- or 64-byte vectors (passes of 8
    lanes, float32's 32 bytes and float64's 64; float32 also in passes of 16 lanes, a module built
    for 32 documents), the lanes kernels
    in blocks of a 64-byte vector (chosen when they run), a 32-byte one, a 16-byte one and single
    lanes. train()'s steps are the bits of the baseline build (x86-64's SSE2: 16-byte vectors,
    blocks of one), every result rounded alike."""
    from codegen.backend import compilers
    if not compilers.host_vector_flags():
        pytest.skip("this CPU has no vectors wider than the baseline's")
    for batch in (8, 32) if dtype == "float32" else (8,):
        doc, options, X, Y = _lanes_case(dtype, batch)
        stepped = []
        for host in (True, False):
            with monkeypatch.context() as patch:
                if not host:
                    patch.setattr(compilers, "host_vector_flags", lambda: ())
                    patch.setattr(compilers, "host_loop_flags", lambda lane_bytes=None: ())
                net = codegen.compile(doc.loss, **options, compiler=compiler, tiered=False)
                assert ("-mavx2" in net.build.command) == host
                assert len(net.build.c_files) > 1  # (the model's loops in units of their own: templates.LoopSource)
            stepped.append(_two_steps(net, X, Y))
        (loss, after), (loss_baseline, after_baseline) = stepped
        assert loss == loss_baseline
        np.testing.assert_array_equal(after, after_baseline)


@pytest.mark.parametrize("dtype, batch, lane_bytes", [("float32", 8, 32), ("float64", 8, 64), ("float32", 16, 32),
                                                      ("float32", 32, 64)])
def test_a_batchs_loop_units_know_the_bytes_of_a_passs_lanes(dtype, batch, lane_bytes):
    """The units of the batched program's loops (templates.LoopSource) carry the bytes of a pass's
    lanes (8 documents up to a batch of 16, codegen/lower/batch.py's pass_capacity), which choose
    their vectors' width (compilers.host_loop_flags); the units of the one-document program's
    loops carry none, nor one that holds functions of both, which lanes narrower than the widest
    vector do not share."""
    doc, options, X, Y = _lanes_case(dtype, batch)
    units = [s for s in codegen.generate(doc.loss, **options) if isinstance(s, templates.LoopSource)]
    batched = [re.search(r"CHUNK void (forward_outputs|forward_rest|backward)_batch_\d+\(", s) is not None
               for s in units]
    one = [re.search(r"CHUNK void (forward_outputs|forward_rest|backward_body|backward_sgd_body)_\d+\(", s) is not None
           for s in units]
    assert any(batched) and any(one)
    assert lane_bytes >= templates.WIDEST_VECTOR_BYTES or not any(map(all, zip(batched, one)))
    assert [s.lane_bytes for s in units] == [lane_bytes if b and not o else None for b, o in zip(batched, one)]


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_the_attentions_backward_holds_its_sums_over_keys_and_queries(tiny, compiler, dtype, monkeypatch, tmp_path):
    """The query-key dots' backward over a batch as two nests, the queries' gradients held over the
    keys and the keys' over the queries (codegen/write/triangle.py), each a held_sums_lanes call
    (and, that declined, the loops holding the sums in an array): documents of mixed lengths
    (fewer lanes at the later positions), two steps, the same bits as the one nest."""
    tokenizer, state, params = tiny
    docs = ["a", "edcbaab", "", "abc", "ab", "abcde", "b", "ca", "abcd", "e", "dee", "bac"]
    X, Y = _split(np.stack([data.row(tokenizer.encode(d), CONFIG.block_size) for d in docs]))
    initial = [p.data for p in params]
    doc = model.document(state, CONFIG)
    stepped, sources = [], []
    for variant in ("kernel", "held", "one nest"):
        if variant == "held":
            monkeypatch.setattr(codegen.write.triangle, "_held_call", lambda *args: None)
        if variant == "one nest":
            monkeypatch.setattr(codegen.write.backward, "held_sums", lambda *args: None)
        sources.append("".join(codegen.generate(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs,
                                                batch=16)))
        for p, value in zip(params, initial):
            p.data = value
        monkeypatch.setenv("MICROGRAD_C_CACHE", str(tmp_path / variant))  # (a build is found by the graph's structure)
        net = _compile(tiny, compiler, dtype, batch=16)
        stepped.append(([net.train(X, Y, 0.01, batch_size=len(docs)) for _ in range(2)], np.asarray(net.params).copy()))
    kernel, held, one_nest = sources
    assert kernel.count("held_sums_lanes(g + ") == 2 * CONFIG.n_layer and "real held[" not in kernel
    assert held.count("real held[") == 2 * CONFIG.n_layer and "held_sums_lanes(g + " not in held
    assert "real held[" not in one_nest and "held_sums_lanes(g + " not in one_nest
    (losses, after), *others = stepped
    for expected_losses, expected in others:
        assert losses == expected_losses
        np.testing.assert_array_equal(after, expected)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float32", "float64"])), indirect=["compiler"])
def test_gradients_live_at_different_times_share_g_bits(compiler, dtype, monkeypatch, tmp_path):
    """A sequence's batched backward sets each gradient back to 0 once read, so gradients live at
    different times share the batch buffer g (codegen/lower/gradients.py): g holds fewer slots than
    d, and train()'s steps (documents of mixed lengths, a last piece of one) and a batch's
    gradients are the same bits as with every gradient at its value's slot."""
    from codegen.lower import batch

    def turn_off(patch):
        patch.setattr(batch, "place_gradients", lambda batched: None)

    def check(units, on):
        slots, grad_slots = (int(re.search(rf"#define {name} (\d+)", units)[1])
                             for name in ("N_BATCH_SLOTS", "N_BATCH_GRAD_SLOTS"))
        assert (grad_slots < slots / 2) if on else grad_slots == slots
    case = _lanes_case(dtype, n_layer=2)
    _bits_with_and_without(case, turn_off, check, compiler, dtype, monkeypatch, tmp_path)


def test_gradients_live_at_the_same_time_never_share_a_place(tiny):
    """The tiny GPT's gradient layout (codegen/lower/gradients.py), row by row: a row of the batch
    is live from the group before the first, in backward order, whose operands reach it to the
    group after the last (the loss's from the start, the inputs' throughout); two rows live at the
    same time never have one place in g, every row of d a group reaches has one, and the
    parameters' gradients stay at their slots; explain() says how much of g it takes."""
    from codegen.lower.gradients import GradientLayout
    tokenizer, state, params = tiny
    doc = model.document(state, CONFIG)
    batched = codegen.lower.batch.batched_form(codegen.lower.ir.lower(doc.loss, doc.inputs, params, doc.outputs),
                                               16)[0]
    layout, capacity, first = batched.gradients, batched.capacity, batched.n_params
    assert isinstance(layout, GradientLayout) and layout.n_slots < batched.n_slots
    assert [layout.at(slot) for slot in range(first)] == list(range(first))
    end = len(batched.backward)
    live = {}
    for t, g in enumerate(batched.backward):
        ops = g.operands
        spans = [ops.out.span(g.shape), *(a.span(g.shape) for a in ops.args if hasattr(a, "base")),
                 *(v.start.span(g.shape, v.offsets) for v in (ops.terms, ops.a, ops.b) if v is not None)]
        for lo, hi in spans:
            if first <= lo and hi < batched.constants_base:
                for row in range((lo - first) // capacity, (hi - first) // capacity + 1):
                    a, b = live.get(row, (t - 1, t + 1))
                    live[row] = (min(a, t - 1), max(b, t + 1))
    live[(batched.loss_slot - first) // capacity] = (-1, live[(batched.loss_slot - first) // capacity][1])
    for row in range((batched.input_base - first) // capacity,
                     (batched.input_base + batched.n_inputs * capacity - first - 1) // capacity + 1):
        live[row] = (-1, end)
    place = {row: (layout.at(first + row * capacity) - first) // capacity for row in live}
    assert all(layout.at(first + row * capacity + lane) == first + place[row] * capacity + lane
               for row in live for lane in range(capacity))
    for t in range(-1, end + 1):
        now = [row for row, (a, b) in live.items() if a <= t <= b]
        assert len({place[row] for row in now}) == len(now), t
    with pytest.raises(ValueError, match="no gradient region"):
        layout.at(batched.constants_base)
    share = (layout.n_slots - first) / (batched.constants_base - first)
    assert f"its gradients in {share:.0%} of its values' slots" in codegen.explain(
        doc.loss, doc.inputs, params, doc.outputs, batch=16).summary()


def test_an_op_that_picks_reaches_its_candidates_gradients_in_one_region():
    """An op that picks among its arguments (a gather: an index, then the candidates) reaches the
    picked one's gradient from the first candidate's (codegen/write/statements.py's _picked), so
    its candidates' spans are one (codegen/lower/gradients.py), however far apart they lie; the
    index keeps its own."""
    from types import SimpleNamespace
    from codegen.lower.gradients import _gradient_spans
    from codegen.lower.types import OP, Affine, Operands
    from micrograd_c.ops import OPS
    gather = OPS["gather"]
    group = SimpleNamespace(first=SimpleNamespace(kind=OP, op=gather), shape=(4,))
    group.operands = Operands(Affine(900, (1,)), (Affine(10, (1,)), Affine(100, (1,)), Affine(500, (1,)), 2.0))
    assert sorted(_gradient_spans(group)) == [(10, 13), (100, 503), (900, 903)]
