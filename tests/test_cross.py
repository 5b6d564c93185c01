"""codegen.export(..., target=...): the MNIST MLP exported and built by zig cc for aarch64,
riscv64 and wasm32-wasi (32-bit ARM in the slow set), its programs run under qemu-user (wasmtime
for WebAssembly), against the host's compiled module and against the same C built for this machine
(x86_64-linux-musl, run natively).

What holds, measured on an x86-64 host (qemu 7.2, zig 0.17.1): with -ffp-contract=off, the
default, every target prints the x86-64 musl build's bits (the same operations in the same order,
IEEE double everywhere). The host module differs from them only through the C library: glibc's exp
is 1 ulp from musl's for about 10% of arguments (and its log for a few), so the module's losses
are within 1e-13 of theirs, and the frozen classifier's logits within 1e-13 (its sums run left to
right, the module's in sixteen lanes). With fma=True the multiply-adds fuse on aarch64 and riscv64:
other bits, within the same bounds over the steps tested."""
import functools
import platform
import sys

import numpy as np
import pytest

import codegen
from codegen.backend import targets, toolchain
from codegen.backend.toolchain import CompileError, CompilerNotFound
from conftest import requires
from micrograd_c import Value
from mnist.export import (LOGIT_BOUND, losses_agree, module_training, target_predictions, target_training,
                          training_rows)
from mnist.model import PIXEL_SCALE, build_graph
from test_wasm import REAL_MNIST, mnist  # noqa: F401  (the real MNIST files, as the other tests find them)

CROSS = ("aarch64-linux-musl", "riscv64-linux-musl", "wasm32-wasi")
HOST = "x86_64-linux-musl"      # the reference: the same C and libm (musl), run without an emulator
HIDDEN, LR = 8, 0.03            # MLP(784, [8, 10]): the frozen code is 13,000 statements
# Against the host module (glibc's libm, the module's sixteen-lane sums), measured 7.1e-15 (logits)
# and 1.2e-14 (losses, relative, 200 steps): bounds mnist.export's LOGIT_BOUND, losses_agree;
# parameters 4.4e-16
PARAM_BOUND = 1e-13


def runs_here(triple):
    """Skips (fails in CI) unless this machine runs the target's programs: natively, under qemu, or
    through wasmtime."""
    target = targets.lookup(triple)
    if platform.machine() != target.arch:
        requires(target.emulator)


@pytest.fixture(scope="module")
def trained(mnist):  # noqa: F811
    """MLP(784, [8, 10]) trained on 2,000 images by the host module, its Values set to the result."""
    requires("zig")
    train_X, train_Y, _, _ = mnist
    graph = build_graph(0, hidden=[HIDDEN], init="he")
    net = graph.compile(compiler=None)
    net.train(train_X[:2000], train_Y[:2000], LR, scale=PIXEL_SCALE)
    codegen.copy_to_values(net, graph.params)
    return graph, net


@pytest.fixture(scope="module")
def exports(trained, tmp_path_factory):
    """export(graph, triple, frozen, fma): its Exported with .build, built once per module."""
    graph, _ = trained
    directory = tmp_path_factory.mktemp("cross")

    @functools.lru_cache(maxsize=None)
    def export(triple, frozen, fma=False):
        name = "mnist" if frozen else "mnist_train"
        # -O0 for the frozen straight-line code (zig cc -O2: 35 s for these 13,000 statements)
        return codegen.export(graph.loss, graph.pixels + ([] if frozen else graph.targets), graph.params,
                              graph.logits, path=directory / f"fma-{fma}", name=name, frozen=frozen,
                              target=triple, opt=0 if frozen else 2, fma=fma)
    return export


def built_for(build):
    """Whether the program's file is for its target: its ELF machine, or WebAssembly's magic."""
    header = build.program.read_bytes()[:20]
    if build.target.machine is None:
        return header[:4] == b"\0asm"
    return header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == build.target.machine


def check_predictions(exports, trained, mnist, triple, n):  # noqa: F811
    runs_here(triple)
    runs_here(HOST)
    graph, net = trained
    _, _, test_X, test_Y = mnist
    build = exports(triple, frozen=True).build
    assert built_for(build)
    got = target_predictions(build, test_X[:n])
    expected = np.asarray(net.predict(test_X[:n], scale=PIXEL_SCALE))
    assert got.shape == expected.shape
    assert np.array_equal(got.argmax(axis=1), expected.argmax(axis=1))
    assert np.max(np.abs(got - expected)) < LOGIT_BOUND
    assert np.mean(got.argmax(axis=1) == test_Y[:n]) > 0.5  # trained (measured 66%; chance is 10%)
    assert np.array_equal(got, target_predictions(exports(HOST, frozen=True).build, test_X[:n]))  # the same bits


def check_training(exports, trained, mnist, triple, steps, tmp_path, fma=False):  # noqa: F811
    """Holds the program's steps to the host module's within the bounds; whether they are the host
    musl build's bits."""
    runs_here(triple)
    runs_here(HOST)
    graph, _ = trained
    train_X, train_Y, _, _ = mnist
    rows = training_rows(train_X[2000:2000 + steps], train_Y[2000:2000 + steps])
    losses, params = target_training(exports(triple, frozen=False, fma=fma).build, rows, LR, tmp_path / "params.f64")
    host_losses, host_params = module_training(graph, rows, LR)
    assert len(losses) == steps and losses_agree(losses, host_losses)
    np.testing.assert_allclose(params, host_params, rtol=0, atol=PARAM_BOUND)
    assert not np.allclose(params, [p.data for p in graph.params], rtol=0, atol=1e-6)  # it trained
    reference = target_training(exports(HOST, frozen=False).build, rows, LR, tmp_path / "host.f64")
    return np.array_equal(losses, reference[0]) and np.array_equal(params, reference[1])


@pytest.mark.parametrize("triple", CROSS)
def test_cross_built_classifier_predicts_as_the_host_module(exports, trained, mnist, triple):  # noqa: F811
    check_predictions(exports, trained, mnist, triple, n=200)


@pytest.mark.parametrize("triple", CROSS)
def test_cross_built_training_follows_the_host_module(exports, trained, mnist, triple, tmp_path):  # noqa: F811
    assert check_training(exports, trained, mnist, triple, steps=100, tmp_path=tmp_path)


def test_fused_multiply_adds_change_the_bits_within_the_bound(exports, trained, mnist, tmp_path):  # noqa: F811
    assert not check_training(exports, trained, mnist, "aarch64-linux-musl", steps=100, tmp_path=tmp_path, fma=True)


@pytest.mark.slow
@pytest.mark.parametrize("triple", (*CROSS, "arm-linux-musleabihf"))
def test_all_test_images_and_1000_steps(exports, trained, mnist, triple, tmp_path):  # noqa: F811
    check_predictions(exports, trained, mnist, triple, n=10_000)
    assert check_training(exports, trained, mnist, triple, steps=1000, tmp_path=tmp_path)


@pytest.mark.parametrize("triple, vector_instruction, vectors", [
    ("aarch64-linux-musl", "fmul\tv", "NEON"),       # fmul v0.2d, v1.2d, v2.2d: two doubles
    ("riscv64-linux-musl", "vfmul", "none"),         # no V extension: scalar fmul.d only
])
def test_the_vectors_each_target_gets(exports, triple, vector_instruction, vectors):
    exported = exports(HOST, frozen=False)  # the trainable C: its dots are dot()'s sixteen lanes
    code = targets.assembly(exported.source, triple)
    assert targets.TARGETS[triple].vectors.startswith(vectors)
    assert (vector_instruction in code) == (vectors != "none")
    assert "fmul" in code  # and the dots are there


def test_bad_targets_and_missing_tools(tmp_path, monkeypatch):
    v = Value(1.0)
    with pytest.raises(ValueError, match="unknown target 'sparc-linux'; the known targets: x86_64-linux-musl, "
                                         "aarch64-linux-musl, riscv64-linux-musl, arm-linux-musleabihf"):
        codegen.export(v * 2.0, [v], path=tmp_path, target="sparc-linux")
    with pytest.raises(ValueError, match="opt must be 0, 1, 2 or 3, not 4"):
        codegen.export(v * 2.0, [v], path=tmp_path, target="aarch64-linux-musl", opt=4)
    assert not (tmp_path / "model.c").exists()  # before any work
    requires("zig")
    (tmp_path / "broken.c").write_text("int f(void) { return undeclared; }\n")
    with pytest.raises(CompileError, match="undeclared"):
        targets.build(tmp_path / "broken.c", "int main(void) { return 0; }", "broken", "aarch64-linux-musl")
    build = targets.TargetBuild(targets.TARGETS["riscv64-linux-musl"], tmp_path / "lib.a", tmp_path / "prog", (), 0.0)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(targets.EmulatorNotFound, match="qemu-riscv64 not found .*apt-get install qemu-user"):
        build.command()
    monkeypatch.setitem(sys.modules, "ziglang", None)  # as if the wheel were not installed
    toolchain._find_compiler.cache_clear()
    try:
        with pytest.raises(CompilerNotFound, match=r"zig not found; .*pip install 'micrograd-c\[zig\]'"):
            codegen.export(v * 2.0, [v], path=tmp_path, target="aarch64-linux-musl")
    finally:
        toolchain._find_compiler.cache_clear()


def test_explain_names_the_vectors_of_a_target():
    v = Value(1.0)
    summary = codegen.explain(v * 2.0, [v], target="aarch64-linux-musl").summary()
    assert summary.endswith("; vectors on aarch64-linux-musl: " + targets.TARGETS["aarch64-linux-musl"].vectors)
    assert "vectors" not in codegen.explain(v * 2.0, [v]).summary()
    with pytest.raises(ValueError, match="unknown target 'riscv'"):
        codegen.explain(v * 2.0, [v], target="riscv")


def test_the_make_export_script_for_a_target(trained, mnist, tmp_path, capsys):  # noqa: F811
    """python -m mnist.export --target (make export ARGS="--target=..."): builds, runs and checks."""
    from mnist import export as export_script
    runs_here("aarch64-linux-musl")
    graph, _ = trained
    params = tmp_path / "params.npz"
    np.savez(params, params=np.array([p.data for p in graph.params]), seed=0, hidden=[HIDDEN], epochs=1)
    out, data = tmp_path / "out", str(REAL_MNIST)
    common = ["--load", str(params), "--out", str(out), "--data-dir", data, "--target-opt", "0"]
    assert export_script.main([*common, "--target=aarch64-linux-musl", "--check-images", "200",
                               "--check-steps", "50"]) == 0
    printed = capsys.readouterr().out
    assert "same class as the module for 100.00%" in printed and "50 SGD steps" in printed
    assert {p.name for p in (out / "aarch64-linux-musl").iterdir()} == {
        "libmnist.a", "mnist", "mnist_main.c", "libmnist_train.a", "mnist_train", "mnist_train_main.c"}
    assert export_script.main([*common, "--target=mips-linux"]) == 2
    assert "unknown target 'mips-linux'; the known targets: x86_64-linux-musl" in capsys.readouterr().err
