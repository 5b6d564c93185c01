"""train()'s schedule in one call (templates/runtime.c's get_schedule, templates/driver.c's Schedule):
lr as one rate a step and losses= as a buffer of each step's mean loss take the same steps, bit for
bit, as a train() call a step with those rates, on every compiler and on each of train()'s paths:
plain SGD inside the backward pass (batch 1), an optimizer sample by sample (batch 1, and batches
of a program without a batched form), and the batched program (a last short batch). Bad schedules
are clear errors that leave the module as it was."""

import numpy as np
import pytest

import codegen
from tests.test_batch import classifier, data

ROWS = 11
PATHS = {  # name: (optimizer, batch capacity the module is built with, batch_size)
    "sgd-in-backward": (None, 1, 1),
    "adam-rows": (codegen.Adam(), 1, 1),
    "adam-rows-of-3": (codegen.Adam(), 1, 3),
    "momentum-batched": (codegen.SGD(momentum=0.9), 128, 3),
}


def twins(compiler, optimizer, capacity):
    """Two modules of the same model from the same values."""
    model, xs, ys, logits, loss = classifier()
    init = [p.data for p in model.parameters()]
    nets = []
    for _ in range(2):
        for p, v in zip(model.parameters(), init):
            p.data = v
        nets.append(codegen.compile(loss, xs + ys, model.parameters(), outputs=logits, compiler=compiler,
                                    batch=capacity, optimizer=optimizer))
    return nets


@pytest.mark.parametrize("path", PATHS)
def test_a_schedule_in_one_call_equals_a_call_a_step(compiler, path):
    optimizer, capacity, batch = PATHS[path]
    scheduled, stepped = twins(compiler, optimizer, capacity)
    X, Y = data(ROWS)
    steps = -(-ROWS // batch)
    rates = [0.05 * (1 - k / steps) for k in range(steps)]
    losses = np.full(steps, np.nan)
    mean = scheduled.train(X, Y, rates, batch_size=batch, losses=losses)
    one_by_one = [stepped.train(X[k * batch:(k + 1) * batch], Y[k * batch:(k + 1) * batch], rates[k],
                                batch_size=batch) for k in range(steps)]
    assert losses.tolist() == one_by_one  # each step's mean loss, bit for bit
    assert np.array_equal(np.array(scheduled.params), np.array(stepped.params))
    sizes = [min(batch, ROWS - k * batch) for k in range(steps)]
    assert mean == pytest.approx(np.dot(one_by_one, sizes) / ROWS, rel=1e-14)
    # a number is the same rate for every step, as before
    again, constant = twins(compiler, optimizer, capacity)
    again.train(X, Y, [0.03] * steps, batch_size=batch)
    constant.train(X, Y, 0.03, batch_size=batch)
    assert np.array_equal(np.array(again.params), np.array(constant.params))


def test_numpy_rates_and_a_shuffled_order():
    net, _ = twins(None, None, 128)
    X, Y = data(ROWS)
    losses = np.zeros(4)
    net.train(X, Y, np.linspace(0.1, 0.01, 4, dtype=np.float32), batch_size=3, seed=5, losses=losses)
    assert np.isfinite(losses).all() and (losses > 0).all()
    net.train(X, Y, np.full(ROWS, 1, dtype=np.int64), scale=0.0)
    before = np.array(net.params)
    net.train(X, Y, np.float32(0.0))  # a NumPy scalar is a number: every step at that rate
    assert np.array_equal(np.array(net.params), before)


@pytest.mark.parametrize("lr, losses, error, message", [
    ([0.1] * 10, None, ValueError, r"lr holds 10 rates; this call takes 11 steps"),
    ([0.1] * 10 + [float("nan")], None, ValueError, r"lr\[10\] must be finite"),
    ([0.1] * 10 + [None], None, TypeError, r"lr\[10\] must be a number, not NoneType"),
    ("0.1", None, TypeError, r"lr must be a number or a sequence of one rate a step, not str"),
    (0.1, np.zeros(10), ValueError, r"losses must hold 11 values, got 10"),
    (0.1, np.zeros(11, dtype=np.float32), TypeError, r"losses has element format 'f'; expected float64 \('d'\)"),
    (0.1, np.zeros((1, 11)), ValueError, r"losses must have 1 dimension"),
    (0.1, np.zeros(11)[::-1], ValueError, r"losses must be a writable C-contiguous buffer"),
    (0.1, bytes(88), ValueError, r"losses must be a writable C-contiguous buffer"),
])
def test_bad_schedules_are_clear_errors_and_change_nothing(lr, losses, error, message):
    net, _ = twins(None, None, 1)
    X, Y = data(ROWS)
    before = np.array(net.params)
    with pytest.raises(error, match=message):
        net.train(X, Y, lr, losses=losses)
    assert np.array_equal(np.array(net.params), before)
