"""The batch axis: the one-sample program the user's graph lowered to, run over a batch of
samples at once (what JAX calls vmap), without B copies of the graph in Python.

Every slot that differs from sample to sample (inputs and everything computed from them) gets
CAPACITY values, side by side (batch innermost): slot s of the one-sample program holds sample b
at `n_params + (s - n_params) * capacity + b`. Parameters keep their slots (one value for the
whole batch) and so do the constants that loops read, after the batched slots. Every group of
the one-sample program becomes the same loop nest with one more loop, over the batch, innermost:
operands that move with the sample get stride 1 along it, parameters and constants stride 0.
A layer over a batch is then a matrix product (the emitter's matmul kernels: forward `Y = W X`,
the inputs' gradients `W^T dY`, the weights' gradients `dY X^T`), and every other op a loop
over the batch that the C compiler vectorises. Parameter gradients add up over the batch.

The batch loop runs to `nb`, the number of samples in the batch (at most the capacity), which
the generated functions take as an argument: a last short batch runs as it is.

A program whose operands cannot be described this way (a list of operands that mixes
parameters with per-sample slots, or gradient slots shared by straight-line scalar code) has
no batched form: `batch_program` says why, and train()/predict() run sample by sample.
"""

import numpy as np

from .gradients import place_gradients
from .types import (DOT, OP, ActiveBatch, Affine, BatchedProgram, BatchExtent, Bounded, Extent, Group, Operands,
                    Sequence, Vector)
from .vector import progression

# Samples side by side in the batch buffers (the batch loop's largest extent): train()'s larger
# batches run in pieces of this many, their gradients summed before the step.
DEFAULT_CAPACITY = 128
# A program of more groups than this (straight-line code: groups that did not become loops) gets
# no batched form: each group would be one more loop for the C compiler (an 8,000-op chain took
# gcc 14 s without it and 66 s with it), where the models that batch pay have tens of groups.
MAX_GROUPS = 2_000
# A sequence program's sample holds every position's slots (microgpt's default: 11,232 a document,
# 90 KB in float64) and its pass runs position by position over the samples that reach each: a
# pass wider than the caches buys no product efficiency (a position's products have one column a
# sample) and pays its buffers' misses. Its passes hold at most the samples whose values fit in
# this many bytes (and their gradients as many again): a power of two, at least 8 (Zen 3, 64
# documents a step: 16 a pass took 0.60x the time a document of 64 a pass, float64). And at most
# half the samples the module is built for (a multiple of 8), so that a batch of that size runs as
# two pieces or more, side by side on the module's threads (templates/batch.c): a pass runs its
# statement loops (attention, softmax, norms) on one thread. microgpt's default built for 16 (32
# in float32) documents a step, passes of 8 (16) took 0.85-0.87x the time of passes of 16 (32) run
# as two halves (piece_samples), on 2 threads, and 0.86-0.89x on one (Zen 3, one process
# alternating, 25 rounds).
SEQUENCE_PASS_BYTES = 2 << 20
# The fewest samples a pass holds: a cache line of each slot (8 in float64, 16 in float32: a
# 64-byte vector of the products' AVX-512 tiles), whatever the bounds above. The bigger GPT of
# docs/gpt.md (102,745 slots a document: 8 documents' values alone are 3.3 MB in float32, past
# every bound) with passes of 16 documents instead of 8, built for 32 (Intel Xeon with AVX-512,
# one process alternating, 15 rounds): float32 0.93x the time on one thread, 0.92-0.97x on 2;
# float64 at 16 took 1.15x (so its 8, a cache line of doubles, stays).
PASS_LINE_BYTES = 64
# Any other program's passes hold at most the samples whose values fit in this many bytes (a
# power of two, at least 8): the zoo's CNN (6,247 slots a sample) built for 128 samples had 6.4 MB
# of values a pass in float64 and as much of gradients, and every layer's loop and product missed
# the caches. Zen 3, 2 threads, modules of each pass alternating in one process: passes of 32
# (1.6 MB) took 0.69x the time of 128 at train(batch_size=32), 0.61x at 128 and 0.78x in predict();
# float32, passes of 64 (1.6 MB) 0.91x, 0.94x, 0.99x. MNIST's MLP(784, [512, 256, 10]) (2,365
# slots) keeps 128 in both dtypes (2.4 MB in float64), where its products over 128 columns pay:
# passes of 64 took 1.06x (float32) and 1.15x (float64) the time at batch_size=128.
PASS_BYTES = 3 << 20


MAX_CAPACITY = 4096


def check_capacity(batch):
    """compile()'s and explain()'s `batch`, checked: an int from 1 to MAX_CAPACITY."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_CAPACITY:
        raise ValueError(f"batch must be an int from 1 to {MAX_CAPACITY} (samples per batched pass), not {batch!r}")
    return batch


def pass_capacity(program, capacity, itemsize):
    """The samples a pass of the batched program holds: `capacity`, or fewer when their slots
    outgrow PASS_BYTES (SEQUENCE_PASS_BYTES for a sequence program), at least a cache line of
    each slot (PASS_LINE_BYTES: 8 in float64, 16 in float32); for a sequence program at most half
    of `capacity` rounded up to 8 (train()'s larger batches run in pieces)."""
    per_sample = _Layout(program, capacity).per_sample
    bound = SEQUENCE_PASS_BYTES if program.sequence else PASS_BYTES
    fit = max(8, PASS_LINE_BYTES // itemsize)
    while fit < capacity and 2 * fit * per_sample * itemsize <= bound:  # (no per-sample slot: capacity)
        fit *= 2
    held = min(capacity, fit)
    return min(held, -(-capacity // 16) * 8) if program.sequence else held


class _Layout:
    """Where a one-sample slot goes in the batch buffers."""

    def __init__(self, program, capacity):
        self.capacity = capacity
        self.params = program.n_params
        const_slots = [slot for slot, _ in program.constants]
        self.first_constant = min(const_slots) if const_slots else program.n_slots
        self.per_sample = self.first_constant - self.params      # slots that get `capacity` values
        self.constants_base = self.params + self.per_sample * capacity
        self.n_slots = self.constants_base + program.n_slots - self.first_constant

    def region(self, lo, hi):
        """(scale of the slot numbers, stride along the batch) for slots lo..hi, or None when
        they are not all of one kind."""
        for start, stop, scale, stride in ((0, self.params, 1, 0),
                                           (self.params, self.first_constant, self.capacity, 1),
                                           (self.first_constant, 1 << 62, 1, 0)):
            if start <= lo and hi < stop:
                return scale, stride
        return None

    def slot(self, s):
        if s < self.params:
            return s
        if s < self.first_constant:
            return self.params + (s - self.params) * self.capacity
        return self.constants_base + s - self.first_constant


class NotBatchable(Exception):
    """The program has no batched form; the message says why."""


def _affine(layout, affine, shape, offsets=(0,)):
    """The Affine in the batched layout (one more loop index, the sample), and the scale its
    offsets take."""
    if affine.grad_base is not None and affine.grad_base != affine.base:
        raise NotBatchable("a gradient slot is shared (straight-line scalar code)")
    region = layout.region(*affine.span(shape, offsets))
    if region is None:
        raise NotBatchable("an operand list mixes per-sample values with parameters or constants")
    scale, stride = region
    strides = tuple(s.scaled(scale) if isinstance(s, Extent) else s * scale for s in affine.strides)
    return Affine(layout.slot(affine.base), strides + (stride,), tri=affine.tri * scale), scale


def _vector(layout, vector, shape):
    if vector is None:
        return None
    start, scale = _affine(layout, vector.start, shape, vector.offsets)
    return Vector(start, tuple(o * scale for o in vector.offsets), vector.length)


def _group(layout, g, extent, active):
    ops, shape = g.operands, g.shape
    args = tuple(a if isinstance(a, float) else _affine(layout, a, shape)[0] for a in ops.args)
    op = g.first.op
    if g.first.kind == OP and op.selects and len({a.strides for a in args[op.first_choice:]}) > 1:
        raise NotBatchable(f"a {op.name} picks among per-sample values and parameters or constants at once")
    batched = Group(g.members, tuple(n.at(layout.slot(n.slot)) if isinstance(n, Bounded) else n for n in shape)
                    + (extent,), guard=g.guard and (layout.slot(g.guard[0]), g.guard[1]),
                    masked=None if g.masked is None else layout.slot(g.masked))
    batched.operands = Operands(_affine(layout, ops.out, shape)[0], args, ops.constants, ops.term_positions,
                                _vector(layout, ops.terms, shape), _vector(layout, ops.a, shape),
                                _vector(layout, ops.b, shape), ops.choices)
    return _active_samples(_sequence_outside(batched), active)


def _active_samples(g, active):
    """A group of one position of a sequence with its batch loop over the samples that reach
    that position only (ActiveBatch: a training pass sorts its batch longest document first);
    g as it is when it is not one (a loop over pairs of positions laid flat, the positions not a
    loop's pass), or the program has no sequence. The samples left out have loss weights of 0
    there and after: what they would compute adds exact zeros to every gradient."""
    if active is None:
        return g
    extent = g.shape[-1]
    if g.guard is not None:
        batch = ActiveBatch(int(extent), active, g.guard[1])
    else:
        cut = [k for k, n in enumerate(g.shape[:-1]) if isinstance(n, Bounded) and n.counts is None]
        if len(cut) != 1:
            return g
        batch = ActiveBatch(int(extent), active, g.shape[cut[0]].first, cut[0])
    g.shape = g.shape[:-1] + (batch,)
    return g


def _sequence_outside(g):
    """A batched layer whose one-sample program ran it over a sequence (microgpt's projections:
    outputs by positions, the positions where a layer has its batch) with the positions' loop
    moved outside the outputs': per position, the outputs over the batch are then a layer over a
    batch, one matrix product (codegen/write/loops.py's layer_over_batch); else g. The pattern:
    a dot group of three loops or more, one factor list (the weights) moving along an outer loop
    k only, the other (the inputs) along the loop before the batch's and the batch's only, each
    list at a constant step."""
    ops, shape = g.operands, g.shape
    if g.first.kind != DOT or len(shape) < 3 or g.family or ops.constants or not ops.a or \
            any(isinstance(n, Extent) for n in shape):
        return g
    inner = len(shape) - 2  # the loop just outside the batch's
    for weights, rows in ((ops.a, ops.b), (ops.b, ops.a)):
        w, x = weights.start.strides, rows.start.strides
        moving = [k for k in range(inner) if w[k]]
        if (len(moving) == 1 and w[inner] == 0 and w[-1] == 0 and x[-1] == 1 and x[inner] and x[moving[0]] == 0
                and progression(weights.offsets) is not None and progression(rows.offsets) is not None):
            return _swapped(g, moving[0], inner)
    return g


def _swapped(g, k, j):
    """Group g with its loops k and j swapped (strides, extents, members in the new loop order)."""
    order = list(range(len(g.shape)))
    order[k], order[j] = order[j], order[k]

    def swap(affine):
        return Affine(affine.base, tuple(affine.strides[d] for d in order), affine.grad_base, affine.tri)

    def vector(v):
        return None if v is None else Vector(swap(v.start), v.offsets, v.length)
    members = np.empty(len(g.members), dtype=object)
    members[:] = g.members
    one_sample = [int(n) for n in g.shape[:-1]]
    members = list(members.reshape(one_sample).transpose(order[:-1]).ravel())
    swapped = Group(members, tuple(g.shape[d] for d in order), guard=g.guard, masked=g.masked)
    ops = g.operands
    swapped.operands = Operands(swap(ops.out), tuple(a if isinstance(a, float) else swap(a) for a in ops.args),
                                ops.constants, ops.term_positions, vector(ops.terms), vector(ops.a), vector(ops.b),
                                ops.choices)
    return swapped


def batch_program(program, capacity=DEFAULT_CAPACITY):
    """The BatchedProgram of an ir.Program over batches of up to `capacity` samples; raises
    NotBatchable (saying why) when it has none."""
    if not program.fused:
        raise NotBatchable("scalar mode (fuse=False) keeps the reference post's straight-line code")
    if program.n_inputs == 0:
        raise NotBatchable("the graph has no inputs: every sample is the same")
    if len(program.forward) > MAX_GROUPS:
        raise NotBatchable(f"{len(program.forward):,} groups, over {MAX_GROUPS:,}: the batched program would be "
                           "as many loops to compile")
    layout = _Layout(program, capacity)
    extent = BatchExtent(capacity)
    sequence = program.sequence
    active = layout.n_slots if sequence else None  # (slots after the others: see ActiveBatch)
    by_id = {}
    forward = []
    for g in program.forward:
        by_id[id(g)] = _group(layout, g, extent, active)
        forward.append(by_id[id(g)])
    batched = BatchedProgram(
        capacity=capacity, n_params=program.n_params, n_slots=layout.n_slots + (len(sequence.weights) if sequence else 0),
        input_base=layout.slot(program.input_base), n_inputs=program.n_inputs, loss_slot=layout.slot(program.loss.slot),
        output_slots=[layout.slot(n.slot) for n in program.outputs], constants_base=layout.constants_base,
        forward=forward,
        n_output_groups=program.n_output_groups, backward=[by_id[id(g)] for g in program.backward],
        constants=[(layout.slot(slot), value) for slot, value in program.constants],
        sequence=sequence and Sequence(layout.slot(sequence.slot), tuple(layout.slot(w) for w in sequence.weights),
                                       active),
        read_after=program.read_after)
    if batched.backward_clears:
        batched.gradients = place_gradients(batched)
    return batched


def batched_form(program, capacity=DEFAULT_CAPACITY, itemsize=8):
    """(the BatchedProgram over `capacity` samples (pass_capacity's, for values of `itemsize`
    bytes), or None; why there is none, or None)."""
    if capacity == 1:
        return None, "batch=1"
    try:
        return batch_program(program, pass_capacity(program, capacity, itemsize)), None
    except NotBatchable as why:
        return None, str(why)
