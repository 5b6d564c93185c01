"""The exported C as WebAssembly (freestanding: clang --target=wasm32 linked by wasm-ld, and zig cc,
which links it without lld), run through the
wasmtime package: a small tanh classifier, and the frozen MNIST classifier on 100 test images,
with the predictions of the compiled extension module."""
import os
from pathlib import Path

import numpy as np
import pytest

import codegen
from mnist.data import load_mnist
from mnist.model import PIXEL_SCALE, build_graph

from codegen.backend.toolchain import find_compiler
from conftest import REQUIRED, have, requires
from test_export import classifier, rows, run

REAL_MNIST = Path(os.environ.get("MNIST_DIR") or Path(__file__).resolve().parents[2] / "shared" / "mnist")

# The test's own wrapper: buffers in linear memory for the host to fill and read.
WRAPPER = r"""
#include "@NAME@.h"
static double in[@UPPER@_N_INPUTS], out[@UPPER@_N_OUTPUTS];
double *input_buffer(void) { return in; }
double *output_buffer(void) { return out; }
int predict(void) { return @NAME@_predict(in, out); }
"""


@pytest.fixture(scope="module")
def wasmtime():
    return requires("wasmtime")


# Each compiler of WebAssembly: the tools it needs, and its command with the target flag. clang links
# with wasm-ld (apt's lld); zig cc (the ziglang wheel) links it itself.
WASM_COMPILERS = {
    "clang": (("wasm-ld", "clang"), lambda: [find_compiler("clang").argv[0], "--target=wasm32"]),
    # -O0 of zig cc adds UBSan, whose runtime a freestanding module lacks
    "zig": (("zig",), lambda: [*find_compiler("zig").argv, "--target=wasm32-freestanding", "-fno-sanitize=undefined"]),
}


def wasm_command(name):
    tools, command = WASM_COMPILERS[name]
    for tool in tools:
        requires(tool)
    return command()


@pytest.fixture(params=WASM_COMPILERS)
def wasm_cc(request):
    return wasm_command(request.param)


@pytest.fixture
def first_wasm_cc():
    """The first compiler of WebAssembly the machine has: one is enough for the long MNIST test."""
    name = next((name for name, (tools, _) in WASM_COMPILERS.items() if all(map(have, tools))), "clang")
    return wasm_command(name)


def build_wasm(cc, exported, name, opt="-O2"):
    """exported (frozen) C and the wrapper, compiled and linked by cc into a .wasm; its path."""
    directory = exported.source.parent
    wrapper = directory / "wrapper.c"
    wrapper.write_text(WRAPPER.replace("@NAME@", name).replace("@UPPER@", name.upper()))
    wasm = directory / f"{name}.wasm"
    run([*cc, opt, "-ffreestanding", "-nostdlib", "-nostdlibinc", f"-I{exported.freestanding}",
         f"-I{directory}", "-Wl,--no-entry", "-Wl,--export=input_buffer", "-Wl,--export=output_buffer",
         "-Wl,--export=predict", "-o", str(wasm), str(exported.source), str(wrapper)])
    return wasm


class WasmPredictor:
    def __init__(self, wasmtime, path, n_inputs, n_outputs):
        self.store = wasmtime.Store()
        module = wasmtime.Module.from_file(self.store.engine, str(path))
        assert not module.imports, f"needs imports: {[i.name for i in module.imports]}"  # no libc, nothing
        exports = wasmtime.Instance(self.store, module, []).exports(self.store)
        self.memory, self.predict_fn = exports["memory"], exports["predict"]
        self.inputs, self.outputs = exports["input_buffer"](self.store), exports["output_buffer"](self.store)
        self.n_inputs, self.n_outputs = n_inputs, n_outputs

    def __call__(self, X):
        result = np.empty((len(X), self.n_outputs))
        for i, x in enumerate(np.asarray(X, dtype="<f8")):
            self.memory.write(self.store, x.tobytes(), self.inputs)
            self.predict_fn(self.store)
            result[i] = np.frombuffer(self.memory.read(self.store, self.outputs, self.outputs + 8 * self.n_outputs),
                                      dtype="<f8")
        return result


def test_small_classifier_with_tanh_as_webassembly(wasmtime, wasm_cc, tmp_path):
    model, xs, ys, logits, loss = classifier()
    exported = codegen.export(loss, xs, model.parameters(), logits, path=tmp_path, name="small", frozen=True)
    predict = WasmPredictor(wasmtime, build_wasm(wasm_cc, exported, "small"), 6, 3)
    X = np.ascontiguousarray(rows(20)[:, :6])
    net = codegen.compile(loss, xs + ys, model.parameters(), logits, compiler=None)
    # the freestanding tanh is within a few ulp of the C library's
    np.testing.assert_allclose(predict(X), np.asarray(net.predict(X)), rtol=1e-12, atol=1e-14)


@pytest.fixture(scope="module")
def mnist():
    if not REAL_MNIST.is_dir():
        message = f"real MNIST files not found in {REAL_MNIST} (set $MNIST_DIR)"
        if os.environ.get("CI") or REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    return load_mnist(REAL_MNIST, download_missing=False)


def test_frozen_mnist_classifier_as_webassembly(wasmtime, first_wasm_cc, mnist, tmp_path):
    train_X, train_Y, test_X, test_Y = mnist
    # MLP(784, [16, 10]), 6,000 images: 88% on these 100 (the default [50] after 3,000: the same
    # check over three times the straight-line code)
    graph = build_graph(0, hidden=[16], init="he")
    net = graph.compile(compiler=None)
    net.train(train_X[:6000], train_Y[:6000], 0.03, scale=PIXEL_SCALE)
    codegen.copy_to_values(net, graph.model.parameters())
    exported = codegen.export(graph.loss, graph.pixels, graph.model.parameters(), graph.logits, path=tmp_path,
                              name="mnist", frozen=True)
    # -O0: clang took 5 s over the straight-line code of 40,000 constant weights (-O1: 14 s), and
    # wasmtime 2 s more to load it; WebAssembly's arithmetic is IEEE's at every level
    predict = WasmPredictor(wasmtime, build_wasm(first_wasm_cc, exported, "mnist", opt="-O0"), 784, 10)
    images, labels = test_X[:100], test_Y[:100]
    got = predict(images * PIXEL_SCALE)
    expected = np.asarray(net.predict(images, scale=PIXEL_SCALE))
    assert np.array_equal(got.argmax(axis=1), expected.argmax(axis=1))
    difference = np.max(np.abs(got - expected))
    print(f"max |logit difference| wasm vs extension on 100 test images: {difference:.3g}")
    assert difference < 1e-12
    assert np.mean(got.argmax(axis=1) == labels) >= 0.8  # a trained classifier
