"""Families (codegen/lower/vector.py's _families): the parts of a class that differ only in where
they start and how far they run, a causal attention's triangle (position t's query against its
t + 1 keys, its softmax over them, its weighted sum of t + 1 values), become one loop nest over
positions whose inner loop grows with the position (types.Extent), with operand lists that grow
too. Checked here on a small causal self-attention written with scalar Values: it lowers to as
many groups at every length, and compiled it equals the interpreter (every compiler and column,
a batch, float32)."""

import functools
import random

import numpy as np
import pytest

import codegen
from conftest import compiler_diagonal
from codegen.lower import ir
from codegen.lower.types import Extent
from micrograd_c import Value
from tests.test_batch import assert_close
from tests.test_compile import assert_equivalent

HEADS, HEAD_DIM = 2, 2
WIDTH = HEADS * HEAD_DIM


def attention(params, inputs, length=6):
    """A causal self-attention over `length` positions of WIDTH inputs each (inputs[t * WIDTH +
    j]), the query, key and value projections params[0:3 * WIDTH * WIDTH], softmax with its max
    in the graph; returns each position's output's squared norm (the loss is their sum)."""
    x = [inputs[t * WIDTH:(t + 1) * WIDTH] for t in range(length)]
    w = [[params[(m * WIDTH + i) * WIDTH:(m * WIDTH + i + 1) * WIDTH] for i in range(WIDTH)] for m in range(3)]

    def linear(xs, rows):
        return [sum(wi * xi for wi, xi in zip(row, xs)) for row in rows]

    keys, values, outputs = [], [], []
    for t in range(length):
        q, k, v = (linear(x[t], w[m]) for m in range(3))
        keys.append(k)
        values.append(v)
        out = []
        for h in range(HEADS):
            hs = slice(h * HEAD_DIM, (h + 1) * HEAD_DIM)
            logits = [sum(a * b for a, b in zip(q[hs], key[hs])) / HEAD_DIM ** 0.5 for key in keys]
            top = functools.reduce(Value.max, logits)
            exps = [(logit - top).exp() for logit in logits]
            total = sum(exps)
            weights = [e / total for e in exps]
            out += [sum(wt * value[hs][j] for wt, value in zip(weights, values)) for j in range(HEAD_DIM)]
        outputs.append(sum(o * o for o in out))
    return outputs


def initial(length, seed=0):
    rng = random.Random(seed)
    return [rng.gauss(0, 0.5) for _ in range(3 * WIDTH * WIDTH)], \
        [[rng.gauss(0, 1) for _ in range(length * WIDTH)] for _ in range(3)]


def lowered(length):
    params, rows = initial(length)
    ps, xs = [Value(p) for p in params], [Value(x) for x in rows[0]]
    loss = sum(attention(ps, xs, length))
    return ir.lower(loss, xs, ps)


def test_the_triangle_is_one_loop_nest_at_every_length():
    """As many groups for 6 positions as for 11, some of them loops that grow with the position;
    scores, softmax and weighted sums would otherwise be a loop nest per position."""
    programs = [lowered(length) for length in (6, 11)]
    assert len(programs[0].forward) == len(programs[1].forward)
    assert len(programs[0].backward) == len(programs[1].backward)
    growing = [g for g in programs[1].forward if any(isinstance(n, Extent) for n in g.shape)]
    assert growing and all(g.shape[0] >= 8 for g in growing)
    lists = [v for g in programs[1].forward if g.first.kind == "dot"
             for v in (g.operands.terms, g.operands.a) if v is not None and v.length is not None]
    assert lists  # the softmax's sum and the weighted sums: lists that grow with the position


# (scalar mode makes no loops: test_compile's columns run it)
@pytest.mark.parametrize("compiler, mode", list(compiler_diagonal(["fused", "float32"])), indirect=["compiler"])
def test_the_family_equals_the_interpreter(compiler, mode):
    opt = 2
    params, rows = initial(6)
    assert_equivalent(attention, params, rows, mode, compiler=compiler, opt=opt)


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(["float64", "float32"])), indirect=["compiler"])
def test_a_batch_through_the_family_equals_samples_one_by_one(compiler, dtype):
    """train() over batches of 4 (a last one of 2) through the batched program's families: the
    losses and parameters of the same module run sample by sample."""
    length = 6
    params, _ = initial(length)
    ps, xs = [Value(p) for p in params], [Value(0.0) for _ in range(length * WIDTH)]
    loss = sum(attention(ps, xs, length))
    nets = [codegen.compile(loss, xs, ps, compiler=compiler, dtype=dtype, batch=capacity, tiered=False)
            for capacity in (4, 1)]
    assert codegen.explain(loss, xs, ps).batched.startswith("batched")
    X = np.random.default_rng(1).normal(size=(10, length * WIDTH))
    X, Y = (np.ascontiguousarray(part) for part in (X[:, :-WIDTH], X[:, -WIDTH:]))  # (a row: X's then Y's)
    losses = [net.train(X, Y, 0.01, batch_size=4) for net in nets]
    assert_close(losses[0], losses[1], dtype)
    assert_close(nets[0].params, nets[1].params, dtype)
    assert not np.allclose(np.asarray(nets[0].params), params)
