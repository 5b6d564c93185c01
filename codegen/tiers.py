"""Tiers, as a JIT has them: compile(..., tiered=True) loads a module built by a compiler that
takes milliseconds (libtcc in memory, else tcc) and returns at once, while the optimising compiler
(gcc, clang or zig at the chosen -O) builds the model in the background; at the next call that
starts a step (train, gradients, forward, predict) after that build is in, the module moves its
state (parameters, inputs, their gradients, optimizer state, threads) to the optimised code and
runs it from then on.

For a big graph (by_rows: an irregular one of tens of thousands of Values, where lowering and
planning take seconds of Python) the first tier does not wait for the lowering either: its program
is the graph as read, a table row per computed Value (codegen/write/graph_rows.py: 0.2-0.4 s at
100,000 Values, tcc included), run by the module runtime's table loops, and the lowering runs in
the background build's thread (the runtime releases the GIL while it trains). Both compute the
graph's formulas, summing an engine.Dot's parts in another order: the same numbers within the
fused bound of docs/compiler.md. Otherwise the first tier is tcc's build of the optimised build's
own C, made before compile() returns (no FMA contraction without -march=native: in practice the
same bits). A build that fails, or whose compiler is killed or times out, leaves the first tier
running and says why once (a TierWarning with the compiler's output). The optimised build goes
into the build cache as any build does, indexed by the graph's structure: compiling the same graph
again finds it and starts optimised.

    net = codegen.compile(loss, inputs, params, compiler="gcc", tiered=True)
    net.tier            # "first" while gcc builds, "optimised" after the switch
    net.wait()          # block until the optimised build is in (or failed); switch now

When the process exits with a build still running, the build's compilers are killed.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import warnings

import numpy as np

from micrograd_c import ops
from templates import SharedSource

from .backend import loader, toolchain

# A tiered compile's first tier runs the graph's rows (codegen/write/graph_rows.py) when the graph
# has at most ROWS_MAX_EDGES edges (the rows' C grows with them: microgpt's bigger configuration
# has 7.2 M, 30 M words of rows) and no gather (token inputs: a sequence model, whose lowered loops
# stop at each sample's length where the rows run every position: microgpt with gcc trained on
# its rows at 3.3 ms a step, on tcc's build of its lowered C at 0.53 ms), else tcc's build of the
# lowered C. tiered=None tiers a graph of rows with at least TIERED_MIN_VALUES computed Values (an
# engine.Dot counts one), or one whose lowered C has at least TIERED_MIN_LINES lines (a few seconds
# of gcc -O2; each unit's prelude counts): a random irregular graph of 20,000 Values (16,500
# computed) took compile() 0.7-0.9 s untiered with gcc -O2, 0.6 s of it lowering, one of 100,000
# Values 3.6 s, where the rows took 0.1-0.45 s, libtcc included; one of 5,000 Values 0.3 s.
# (Models of layers lower faster, the zoo's CNN, 54,000 computed Values, in 0.19 s, its rows in
# 0.24 s, and tcc's build of their lowered C steps faster than their rows; but what a graph's
# lowering costs is not known before it runs.)
TIERED_MIN_VALUES = 10_000
ROWS_MAX_EDGES = 1_000_000
TIERED_MIN_LINES = 8_000
# The compilers of the first tier, the first found: libtcc builds the rows of a random 100,000-Value
# graph in memory in 0.92x tcc's time (no process, no file; compile() returned in 0.44 s against 0.47)
FIRST_TIER = ('libtcc', 'tcc')
FIRST, OPTIMISED = 'first', 'optimised'
# The calls that start a step: the module switches tiers before one of these only
_SWITCH_POINTS = frozenset({'train', 'gradients', 'forward', 'predict'})


class TierWarning(UserWarning):
    """The optimised build failed or was killed: the module goes on with the first tier."""


def first_tier_compiler():
    """The first of FIRST_TIER found, as a toolchain.Compiler; None if none is."""
    for name in FIRST_TIER:
        try:
            return toolchain.find_compiler(name)
        except toolchain.CompilerNotFound:
            continue
    return None


def check(tiered):
    if tiered not in (None, True, False):
        raise TypeError(f'tiered must be True, False or None (tiers for big programs), not {tiered!r}')
    return tiered


def by_rows(graph):
    """Whether a tiered compile's first tier runs the graph's rows (ROWS_MAX_EDGES, no gather)."""
    return len(graph.kids) <= ROWS_MAX_EDGES and not graph.is_op(ops.OPS["gather"]).any()


def tiered_by_default(graph):
    """Whether tiered=None tiers the graph before its C is made (TIERED_MIN_VALUES)."""
    return by_rows(graph) and np.count_nonzero(graph.codes) >= TIERED_MIN_VALUES


def build_and_load(sources, rows, name, compiler, opt, native, cache, timeout, measure_memory, structure, tiered):
    """toolchain.build_module's counterpart for compile(): (BuildResult, module, tier). sources: the
    optimised build's C or a function returning it (lowering the graph); rows: None where the
    graph's rows do not fit (by_rows), else (a function returning the first tier's C as the
    graph's rows, whether tiered=None tiers the graph: tiered_by_default). The module is a
    TieredModule (tier "first") when the optimised build runs in the background; else the plain
    module, with tier "optimised" on a cache hit of the optimised build, None when not tiered
    (tiered=False, a small program with tiered=None, no first-tier compiler, or a compiler that
    does not optimise)."""
    compiler = compiler if isinstance(compiler, toolchain.Compiler) else toolchain.find_compiler(compiler)
    family = toolchain.FAMILIES[compiler.family]
    first = first_tier_compiler() if family.optimises and family.makes_files and tiered is not False else None

    def plain(tier=None):
        return (*toolchain.build_module(sources, name, compiler, opt, native, cache, timeout, measure_memory,
                                        structure), tier)
    if first is None:
        return plain()
    structure_key = structure() if structure else None
    index_key = structure_key and toolchain.structure_build_key(structure_key, name, compiler, opt, native)
    if index_key and toolchain.find_by_structure(index_key, cache):
        return plain(OPTIMISED)  # a cache hit: the optimised module at once
    first_sources = rows[0] if rows is not None and (tiered or rows[1]) else None
    if first_sources is None:  # the optimised build's C, made now, is the first tier's too
        sources = toolchain._source_text(sources)
        sources = first_sources = [sources] if isinstance(sources, str) else list(sources)
        lines = sum(s.count('\n') for s in sources if not isinstance(s, SharedSource))
        if tiered is None and lines < TIERED_MIN_LINES:
            return plain()
    try:
        first_build, module = toolchain.build_module(first_sources, name, first, 2, False, cache, timeout, False, None)
    except toolchain.ToolchainError as error:  # (tcc lacking something gcc has): the optimised build alone
        warnings.warn(f'the first tier ({first.family}) did not build, so compile() waits for {compiler.family}:\n'
                      f'{error}', TierWarning, stacklevel=3)
        return plain()
    kind = 'lowered' if first_sources is sources else 'rows'
    background = _Build(sources, name, compiler, opt, native, cache, timeout, measure_memory, index_key)
    return first_build, TieredModule(module, first_build, background, name, kind), FIRST


class _Build:
    """The optimised build in a thread of its own, its C generated there too (the compilers are
    its child processes): its BuildResult and the seconds its C took, or its error, once `done`
    is set."""

    def __init__(self, sources, name, compiler, opt, native, cache, timeout, measure_memory, index_key):
        self.result = self.error = self.codegen = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f'{name}: {compiler.family} -O{opt}', daemon=True,
                                       args=(sources, name, compiler, opt, native, cache, timeout, measure_memory,
                                             index_key))
        _pending.add(self)
        self.thread.start()

    def _run(self, sources, name, compiler, opt, native, cache, timeout, measure_memory, index_key):
        try:
            with toolchain.build_owner(self):
                started = time.perf_counter()
                text = toolchain._source_text(sources)
                self.codegen = time.perf_counter() - started
                result = toolchain.build_extension(text, name, compiler, opt=opt, native=native, cache=cache,
                                                   timeout=timeout, measure_memory=measure_memory)
            if index_key:
                toolchain.index_by_structure(index_key, result, cache)
                result = dataclasses.replace(result, structure_key=index_key)
            self.result = result
        except BaseException as error:  # reported by the module at its next switch point
            self.error = error
        finally:
            _pending.discard(self)
            self.done.set()

    def kill(self):
        toolchain.kill_compilers(self)


class TieredModule:
    """The module compile(tiered=...) returns: every attribute and function of the extension
    module that runs (see the README's API table), plus `tier` ("first" or "optimised"), `wait()`,
    `build` (the running tier's BuildResult), `first_build`, `first_tier` ("rows": the graph's
    rows, codegen/write/graph_rows.py; "lowered": tcc's build of the optimised build's C), and
    `timings["optimised"]` (the background build's compile seconds, None while it runs or if it
    failed; "optimised_codegen", the seconds its C took in the background).

    Views taken from the module (params, data, grad, optimizer_state...) belong to the tier that
    gave them: after a switch, take them again."""

    def __init__(self, module, build, background, name, first_tier):
        vars(self).update(_module=module, _background=background, _name=name, tier=FIRST, build=build,
                          first_build=build, first_tier=first_tier, timings={})

    def __getattr__(self, attribute):
        value = getattr(self._module, attribute)
        if attribute in _SWITCH_POINTS and self._background is not None and self._background.done.is_set():
            self._switch()
            value = getattr(self._module, attribute)
        return value

    def __setattr__(self, attribute, value):
        if attribute in vars(self):
            vars(self)[attribute] = value
        else:
            setattr(self._module, attribute, value)

    def __dir__(self):
        return sorted(set(dir(self._module)) | set(vars(self)) | {'wait', 'building'})

    def __repr__(self):
        return f'<tiered module {self._name!r}, {self.tier} tier: {self.build.path}>'

    @property
    def building(self):
        """Whether the optimised build is still to be switched to (running, or done and not yet taken)."""
        return self._background is not None

    def wait(self, timeout=None):
        """Block until the optimised build is in or has failed (at most `timeout` seconds), then
        switch to it now; returns the tier that runs."""
        if self._background is not None and self._background.done.wait(timeout):
            self._switch()
        return self.tier

    def _switch(self):
        background, self._background = self._background, None
        if background.error is not None:
            self.timings['optimised'] = None
            warnings.warn(f'the optimised build of {self._name!r} failed; training goes on with the first tier '
                          f'({self.first_build.command[0]}):\n{background.error}', TierWarning, stacklevel=3)
            return
        result = background.result
        started = time.perf_counter()
        optimised = loader.load_extension(result.path, self._name)
        move_state(self._module, optimised)
        self._module, self.build, self.tier = optimised, result, OPTIMISED
        self.timings['optimised'] = result.seconds
        self.timings['optimised_codegen'] = background.codegen
        self.timings['switch'] = time.perf_counter() - started


def move_state(source, target):
    """Copy a module's state into another module of the same graph: the parameters' and inputs'
    values (the first slots of every program; the intermediates are the next forward's), the
    parameters' gradients (what the step API accumulates; the others are cleared before each
    backward), the optimizer state, the threads."""
    leaves, n_params = source.n_params + source.n_inputs, source.n_params
    np.asarray(target.data)[:leaves] = np.asarray(source.data)[:leaves]
    np.asarray(target.grad)[:n_params] = np.asarray(source.grad)[:n_params]
    for key, view in source.optimizer_state.items():
        np.asarray(target.optimizer_state[key])[:] = np.asarray(view)
    target.set_threads(source.threads())


_pending = set()  # the background builds running


def _kill_pending():
    """At exit: the background builds' compilers are killed (a non-daemon thread pool of a build
    would otherwise hold the exit until they finish), and their threads given a moment to clean up."""
    for build in list(_pending):
        build.kill()
    for build in list(_pending):
        build.done.wait(2.0)


# (threading's exit hooks run before the interpreter joins threads; atexit's only after)
getattr(threading, '_register_atexit', __import__('atexit').register)(_kill_pending)
