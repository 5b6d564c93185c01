"""The gradients' own layout: a pass on the batched program (after codegen/lower/batch.py) that
lets gradients that are never live at the same time share the batch buffer g.

A backward that sets every gradient it reads back to 0 (a sequence's: BatchedProgram's
backward_clears) leaves a per-sample slot's gradient 0 except from the first group, in backward
order, that adds to it to the group that reads it. Slots whose gradients are live at different
times can then have one place in g: the bigger GPT of docs/gpt.md has 102,745 slots a document, of
which at most 22% are live at once, and its two pieces of 16 documents held 13 MB of batch buffers
each (values and gradients), which the two cores' L3 misses paid for.

Regions: the spans of slots each group's gradients are read and written in (its result's, its
operands' and its operand lists' over its loop nest, whole rows of the batch; the candidates of
an op that picks one as one span), merged where they overlap, so that no access leaves its region
and a region moves as a whole (its strides, offsets tables and kernels' rows as they were): the
C's index of a gradient is its region's place plus its distance from the region's first slot
(GradientLayout.at, which codegen/write/loops.py's slot_index applies). A region is live from the
group before the first that touches it to the group after the last (backward.pass_ folds an
activation's group into the product before it); the loss's from the start (the runtime sets it to
1 before the backward); a region that holds inputs (leaves no group reads and clears) all the
time. Regions are placed largest first, each at the lowest place clear of every region placed
before it that is live at the same time (the greedy order of TFLite's arena planner): the same
layout for the same program.
"""

import bisect
from dataclasses import dataclass

from .types import OP


@dataclass(frozen=True)
class GradientLayout:
    """Where the batched program's per-sample gradients live in g: `regions`, sorted, are (first
    row, last row, place) in rows of `capacity` slots from n_params (row r: slots n_params + r *
    capacity ...); the parameters' gradients stay at their slots; g holds `n_slots`."""
    n_params: int
    capacity: int
    regions: tuple
    n_slots: int

    def at(self, slot):
        """The index in g of the gradient of batched slot `slot`."""
        if slot < self.n_params:
            return slot
        row, lane = divmod(slot - self.n_params, self.capacity)
        k = bisect.bisect_right(self.regions, (row, float("inf"))) - 1
        if k < 0 or not self.regions[k][0] <= row <= self.regions[k][1]:
            raise ValueError(f"slot {slot} is in no gradient region: no group reads or writes its gradient")
        first, _, place = self.regions[k]
        return self.n_params + (place + row - first) * self.capacity + lane


def place_gradients(batched):
    """The GradientLayout of a BatchedProgram whose backward leaves its gradients 0."""
    params, capacity = batched.n_params, batched.capacity
    rows = lambda lo, hi: ((lo - params) // capacity, (hi - params) // capacity)  # noqa: E731
    touched = [[rows(*span) for span in _gradient_spans(g) if params <= span[0] and span[1] < batched.constants_base]
               for g in batched.backward]
    regions = _merged(sorted(span for spans in touched for span in spans))
    live = _live(regions, touched, rows(batched.loss_slot, batched.loss_slot)[0],
                 rows(batched.input_base, batched.input_base + batched.n_inputs * capacity - 1))
    sizes = [hi - lo + 1 for lo, hi in regions]
    places = _placed(sizes, live)
    return GradientLayout(params, capacity, tuple((lo, hi, at) for (lo, hi), at in zip(regions, places)),
                          params + max(map(sum, zip(places, sizes)), default=0) * capacity)


def _merged(spans):
    """Sorted (first row, last row) spans merged where they overlap."""
    regions = []
    for lo, hi in spans:
        if regions and lo <= regions[-1][1]:
            regions[-1] = (regions[-1][0], max(regions[-1][1], hi))
        else:
            regions.append((lo, hi))
    return regions


def _live(regions, touched, loss, inputs):
    """Each region's [first, last] group in backward order that it is live in: a group either side
    of those whose spans (touched, a list a group) reach it; the loss's row's from the start, the
    input rows' (inputs: first, last) throughout."""
    starts = [lo for lo, _ in regions]
    end = len(touched)
    live = [[end, -1] for _ in regions]
    for t, spans in enumerate(touched):
        for lo, _ in spans:
            k = bisect.bisect_right(starts, lo) - 1
            live[k] = [min(live[k][0], t - 1), max(live[k][1], t + 1)]
    for k, (lo, hi) in enumerate(regions):
        if lo <= loss <= hi:
            live[k][0] = -1
        if lo <= inputs[1] and inputs[0] <= hi:
            live[k] = [-1, end]
    return live


def _placed(sizes, live):
    """Each region's first row in g: largest first (then in order), the lowest place clear of the
    regions placed before it whose live ranges meet its own."""
    places = [None] * len(sizes)
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        taken = sorted((places[j], places[j] + sizes[j]) for j in range(len(sizes))
                       if places[j] is not None and live[j][0] <= live[k][1] and live[k][0] <= live[j][1])
        place = 0
        for start, stop in taken:
            if start - place >= sizes[k]:
                break
            place = max(place, stop)
        places[k] = place
    return places


def _gradient_spans(g):
    """The (lowest, highest) slots of group g's operands over its loop nest: every gradient its
    backward reads or writes is in one of them, and every access is within one (an op that picks
    among its arguments reaches its candidates' gradients from the first's: one span)."""
    ops, shape = g.operands, g.shape
    args = [a.span(shape) if hasattr(a, "base") else None for a in ops.args]  # (None: a constant)
    if g.first.kind == OP and g.first.op.selects:
        first = g.first.op.first_choice
        picked = [span for span in args[first:] if span]
        args = args[:first] + [(min(lo for lo, _ in picked), max(hi for _, hi in picked))] if picked else args[:first]
    vectors = [v.start.span(shape, v.offsets) for v in (ops.terms, ops.a, ops.b) if v is not None]
    return [ops.out.span(shape), *(span for span in args if span), *vectors]
