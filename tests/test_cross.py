"""codegen.export(..., target=...): the MNIST MLP and microgpt exported and built by zig cc for
aarch64, riscv64 and wasm32-wasi (32-bit ARM in the slow set), their programs run under qemu-user
(wasmtime for WebAssembly), against the host's compiled module and against the same C built for
this machine (x86_64-linux-musl, run natively).

What holds, measured on an x86-64 host (qemu 7.2, zig 0.17.1): with -ffp-contract=off, the
default, every target prints the x86-64 musl build's bits (the same operations in the same order,
IEEE double everywhere). The host module differs from them only through the C library: glibc's exp
is 1 ulp from musl's for about 10% of arguments (and its log for a few), so the module's losses
are within 1e-13 of theirs, and the frozen classifier's logits within 1e-13 (its sums run left to
right, the module's in sixteen lanes). With fma=True the multiply-adds fuse on aarch64 and riscv64:
other bits, within the same bounds over the steps tested. A token (microgpt's index input) out of
range or not an integer stops either program with the module's message.

The default suite checks each target on a small case in seconds (20 images and 20 steps of the
MNIST MLP; a tiny microgpt's logits for 40 names and 20 steps) against the host module, and
RISC-V's vector build against its scalar one bit for bit; the slow set (`make test-all`) runs all
10,000 test images and 1,000 steps, microgpt's default configuration for 1,000 steps, and holds
every target to the x86-64 musl build's bits. (On a fresh machine zig builds each triple's libc
from source the first time, a minute or two of CPU each: the default suite builds three, for
aarch64, riscv64 and wasm32-wasi, and runs a triple's tests on one worker.)"""
import functools
import platform
import random
import sys

import numpy as np
import pytest

import codegen
from codegen.backend import compilers, targets
from codegen.export import OUTPUT_BOUND, losses_agree, module_steps
from codegen.backend.toolchain import CompileError, CompilerNotFound
from conftest import requires
from gpt import data as gpt_data
from gpt import export as gpt_export
from gpt import model as gpt_model
from micrograd_c import Value
from mnist.export import target_predictions, training_rows
from mnist.model import PIXEL_SCALE, build_graph
from test_wasm import REAL_MNIST, mnist  # noqa: F401  (the real MNIST files, as the other tests find them)

CROSS = ("aarch64-linux-musl", "riscv64-linux-musl", "riscv64-linux-musl+v", "wasm32-wasi")


def one_worker_a_triple(triples):
    """The triples as parameters, each in an xdist group of its triple (Makefile's --dist loadgroup):
    a triple's first build has zig build its libc from source (a minute or more), so a triple's
    tests run on one worker while the others work, instead of waiting on zig's lock side by side."""
    return [pytest.param(t, marks=pytest.mark.xdist_group(t.partition("+")[0])) for t in triples]


HOST = "x86_64-linux-musl"      # the reference: the same C and libm (musl), run without an emulator
# In the default suite, a target's bits are compared with another build of its own libc's
SAME_BITS_AS = {"riscv64-linux-musl+v": "riscv64-linux-musl"}
HIDDEN, LR = 8, 0.03            # MLP(784, [8, 10]): the frozen code is 13,000 statements
# Against the host module (glibc's libm, the module's sixteen-lane sums), measured 7.1e-15 (logits)
# and 1.2e-14 (losses, relative, 200 steps): bounds codegen.export's OUTPUT_BOUND, losses_agree;
# parameters 4.4e-16
PARAM_BOUND = 1e-13
QUICK_IMAGES, QUICK_STEPS = 20, 20  # the default suite's check of each target

# microgpt: a tiny model in the default suite (its C builds in seconds at -O0), microgpt's default
# configuration in the slow set; trained by SGD (the exported step's) from the drawn parameters
GPT_TINY = gpt_model.Config(n_embd=4, n_head=2, n_layer=1, block_size=4)
GPT_LR = gpt_export.CHECK_LR
# The default suite's documents (the census names of ../shared/names are not in every checkout)
NAMES = ("emma olivia ava isabella sophia mia charlotte amelia harper evelyn abigail emily ella elizabeth camila "
         "luna sofia avery mila aria scarlett penelope layla chloe victoria madison eleanor grace nora riley liam "
         "noah oliver elijah james william benjamin lucas henry theodore").split()


def runs_here(triple):
    """Skips (fails in CI) unless this machine runs the target's programs: natively, under qemu, or
    through wasmtime."""
    target = targets.lookup(triple)
    if platform.machine() != target.arch:
        requires(target.emulator)


@pytest.fixture(scope="module")
def trained(mnist):  # noqa: F811
    """MLP(784, [8, 10]) trained on 2,000 images by the host module (tcc's: built in a second), its
    Values set to the result."""
    requires("zig")
    train_X, train_Y, _, _ = mnist
    graph = build_graph(0, hidden=[HIDDEN], init="he")
    net = graph.compile(compiler="tcc")
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


def check_predictions(exports, trained, mnist, triple, n, host_bits=False):  # noqa: F811
    """The frozen program's logits for n test images: the host module's classes, within the bound;
    host_bits: the x86-64 musl build's bits too."""
    runs_here(triple)
    graph, net = trained
    _, _, test_X, test_Y = mnist
    codegen.copy_from_values(net, graph.params)  # the exported parameters (an earlier check trained it)
    build = exports(triple, frozen=True).build
    assert built_for(build)
    got = target_predictions(build, test_X[:n])
    expected = np.asarray(net.predict(test_X[:n], scale=PIXEL_SCALE))
    assert got.shape == expected.shape
    assert np.array_equal(got.argmax(axis=1), expected.argmax(axis=1))
    assert np.max(np.abs(got - expected)) < OUTPUT_BOUND
    assert np.mean(got.argmax(axis=1) == test_Y[:n]) > 0.5  # trained (measured 66%; chance is 10%)
    if host_bits:
        runs_here(HOST)
        assert np.array_equal(got, target_predictions(exports(HOST, frozen=True).build, test_X[:n]))


def check_training(exports, trained, mnist, triple, steps, tmp_path, fma=False, reference=None):  # noqa: F811
    """Holds the program's steps to the host module's within the bounds; whether they are the bits
    of the build (without fma) for `reference`, a triple (None: not compared)."""
    runs_here(triple)
    graph, net = trained
    train_X, train_Y, _, _ = mnist
    rows = training_rows(train_X[2000:2000 + steps], train_Y[2000:2000 + steps])
    losses, params = exports(triple, frozen=False, fma=fma).build.train(rows, LR, tmp_path / "params.f64")
    codegen.copy_from_values(net, graph.params)  # the exported parameters (an earlier check trained it)
    host_losses, host_params = module_steps(net, rows, LR)
    assert len(losses) == steps and losses_agree(losses, host_losses)
    np.testing.assert_allclose(params, host_params, rtol=0, atol=PARAM_BOUND)
    assert not np.allclose(params, [p.data for p in graph.params], rtol=0, atol=1e-6)  # it trained
    if reference is None:
        return None
    runs_here(reference)
    expected = exports(reference, frozen=False).build.train(rows, LR, tmp_path / "reference.f64")
    return np.array_equal(losses, expected[0]) and np.array_equal(params, expected[1])


@pytest.mark.parametrize("triple", one_worker_a_triple(CROSS))
def test_cross_built_classifier_predicts_and_trains_as_the_host_module(exports, trained, mnist, triple,  # noqa: F811
                                                                       tmp_path):
    check_predictions(exports, trained, mnist, triple, n=QUICK_IMAGES)
    # (the x86-64 musl build's bits in the slow set: its musl takes zig a minute or two to build)
    same_bits = check_training(exports, trained, mnist, triple, steps=QUICK_STEPS, tmp_path=tmp_path,
                               reference=SAME_BITS_AS.get(triple))
    assert same_bits in (None, True)


@pytest.mark.xdist_group("aarch64-linux-musl")
def test_fused_multiply_adds_change_the_bits_within_the_bound(exports, trained, mnist, tmp_path):  # noqa: F811
    assert not check_training(exports, trained, mnist, "aarch64-linux-musl", steps=100, tmp_path=tmp_path, fma=True,
                              reference="aarch64-linux-musl")


@pytest.mark.slow
@pytest.mark.parametrize("triple", one_worker_a_triple((*CROSS, "arm-linux-musleabihf")))
def test_all_test_images_and_1000_steps(exports, trained, mnist, triple, tmp_path):  # noqa: F811
    check_predictions(exports, trained, mnist, triple, n=10_000, host_bits=True)
    assert check_training(exports, trained, mnist, triple, steps=1000, tmp_path=tmp_path, reference=HOST)


class Microgpt:
    """microgpt's Document graph of `config` on `docs` (parameters drawn as microgpt draws them),
    its host module (SGD) and its exports, built once per target: the frozen straight-line code at
    -O0 (zig cc -O2 takes minutes on the default configuration's), the trainable at trainable_opt."""

    def __init__(self, config, docs, directory, trainable_opt):
        random.seed(42)
        self.config, self.docs = config, list(docs)
        self.tokenizer = gpt_data.Tokenizer(self.docs)
        state, self.params = gpt_model.init_state(config, self.tokenizer.vocab_size)
        self.doc = gpt_model.document(state, config)
        self.net = gpt_export.reference_module(self.doc, self.params)
        self.directory, self.trainable_opt = directory, trainable_opt

    @functools.lru_cache(maxsize=None)
    def export(self, triple, frozen):
        return gpt_export.export(self.doc, self.params, self.directory, "gpt" if frozen else "gpt_train",
                                 frozen=frozen, target=triple, opt=0 if frozen else self.trainable_opt).build


@pytest.fixture(scope="module")
def tiny_gpt(tmp_path_factory):
    requires("zig")
    return Microgpt(GPT_TINY, NAMES, tmp_path_factory.mktemp("gpt"), trainable_opt=0)


def check_microgpt(gpt, triple, steps, tmp_path, reference=None):
    """The frozen program's logits for every document (and for them with negative tokens, as Python
    indexes) and `steps` SGD steps of the trainable one: the host module's within the bounds, and
    the bits of the build for `reference`, a triple (None: not compared)."""
    runs_here(triple)
    block, vocab = gpt.config.block_size, gpt.tokenizer.vocab_size
    frozen, trainable = gpt.export(triple, frozen=True), gpt.export(triple, frozen=False)
    assert built_for(frozen) and built_for(trainable)
    codegen.copy_from_values(gpt.net, gpt.params)  # the exported parameters (an earlier check trained it)
    rows = gpt_export.token_rows(gpt.tokenizer, gpt.docs, block)
    rows = np.concatenate([rows, rows[:5] - vocab])  # -1 is the last token, as Python indexes
    logits = frozen.predict(rows)
    expected = np.asarray(gpt.net.predict(rows))
    assert logits.shape == expected.shape == (len(rows), block * vocab)
    assert np.max(np.abs(logits - expected)) < OUTPUT_BOUND
    assert np.array_equal(logits[-5:], logits[:5])
    training = gpt_export.training_rows(gpt.tokenizer, gpt.docs, steps, block)
    losses, params = trainable.train(training, GPT_LR, tmp_path / "params.f64")
    host_losses, host_params = module_steps(gpt.net, training, GPT_LR)
    assert len(losses) == steps and losses_agree(losses, host_losses)
    np.testing.assert_allclose(params, host_params, rtol=0, atol=PARAM_BOUND)
    assert not np.allclose(params, [p.data for p in gpt.params], rtol=0, atol=1e-6)  # it trained
    if reference is not None:
        runs_here(reference)
        assert np.array_equal(logits, gpt.export(reference, frozen=True).predict(rows))
        expected_training = gpt.export(reference, frozen=False).train(training, GPT_LR, tmp_path / "reference.f64")
        assert np.array_equal(losses, expected_training[0]) and np.array_equal(params, expected_training[1])
    print(f"{triple}: {len(rows)} documents' logits within {np.max(np.abs(logits - expected)):.2g} of the module's; "
          f"{steps} steps' losses within {np.max(np.abs(losses - host_losses) / host_losses):.2g} relative, "
          f"parameters within {np.max(np.abs(params - host_params)):.2g}"
          + (f"; the {reference} build's bits" if reference else ""))
    return losses


def refused(build, rows, *args):
    """The message of a program that refused its rows."""
    with pytest.raises(targets.ProgramFailed, match="exit status 1") as error:
        build.run(*args, stdin=np.ascontiguousarray(rows, dtype=np.float64).tobytes())
    return str(error.value)


@pytest.mark.parametrize("triple", one_worker_a_triple(CROSS))
def test_cross_built_microgpt_follows_the_host_module(tiny_gpt, triple, tmp_path):
    check_microgpt(tiny_gpt, triple, steps=QUICK_STEPS, tmp_path=tmp_path, reference=SAME_BITS_AS.get(triple))
    # a token out of range, or not an integer, stops the program before it reads a table
    vocab, block = tiny_gpt.tokenizer.vocab_size, GPT_TINY.block_size
    rows = gpt_export.token_rows(tiny_gpt.tokenizer, NAMES[:3], block)
    rows[2, 1] = vocab
    assert refused(tiny_gpt.export(triple, frozen=True), rows).endswith(
        f"row 2: input 1 is an index into {vocab} values, so it must hold an integer from -{vocab} to {vocab - 1}, "
        f"not {vocab}")
    training = gpt_export.training_rows(tiny_gpt.tokenizer, NAMES, 3, block)
    training[1, block + 2] = 2.5  # a target
    assert refused(tiny_gpt.export(triple, frozen=False), training, GPT_LR).endswith(
        f"row 1: input {block + 2} is an index into {vocab} values, so it must hold an integer from -{vocab} to "
        f"{vocab - 1}, not 2.5")


@pytest.fixture(scope="module")
def default_gpt(tmp_path_factory):
    """microgpt's default configuration (n_embd 16, 4 heads, block 16) on 1,000 census names, the
    trainable step built at -O2."""
    requires("zig")
    try:
        names = gpt_data.load_docs(gpt_data.default_path())
    except gpt_data.DataError as error:
        pytest.skip(str(error))
    random.seed(42)
    random.shuffle(names)
    return Microgpt(gpt_model.Config(), names[:1000], tmp_path_factory.mktemp("gpt-default"), trainable_opt=2)


@pytest.mark.slow
@pytest.mark.parametrize("triple", one_worker_a_triple(CROSS))
def test_microgpt_default_config_for_1000_steps(default_gpt, triple, tmp_path):
    """The logits of 1,000 names and 1,000 SGD steps."""
    losses = check_microgpt(default_gpt, triple, steps=1000, tmp_path=tmp_path, reference=HOST)
    assert np.mean(losses[-100:]) < np.mean(losses[:100]) - 0.2  # it learned (measured 2.70 -> 2.31)


@pytest.mark.parametrize("triple, vector_instruction, vectors", [
    ("aarch64-linux-musl", "fmul\tv", "NEON"),       # fmul v0.2d, v1.2d, v2.2d: two doubles
    ("riscv64-linux-musl", "vfmul", "none"),         # no V extension: scalar fmul.d only
    ("riscv64-linux-musl+v", "vfmul", "RVV"),        # vfmul.vv under vsetvli: the V extension
])
def test_the_vectors_each_target_gets(exports, triple, vector_instruction, vectors):
    exported = exports(None, frozen=False)  # the trainable C (not built): its dots are dot()'s sixteen lanes
    code = targets.assembly(exported.source, triple)
    assert targets.TARGETS[triple].vectors.startswith(vectors)
    assert (vector_instruction in code) == (vectors != "none")
    assert "fmul" in code  # and the dots are there


def test_bad_targets_and_missing_tools(tmp_path, monkeypatch):
    v = Value(1.0)
    with pytest.raises(ValueError, match="unknown target 'sparc-linux'; the known targets: x86_64-linux-musl, "
                                         "aarch64-linux-musl, riscv64-linux-musl, riscv64-linux-musl\\+v, arm-linux-musleabihf"):
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
    compilers._find_compiler.cache_clear()
    try:
        with pytest.raises(CompilerNotFound, match=r"zig not found; .*pip install 'micrograd-c\[zig\]'"):
            codegen.export(v * 2.0, [v], path=tmp_path, target="aarch64-linux-musl")
    finally:
        compilers._find_compiler.cache_clear()


def test_explain_names_the_vectors_of_a_target():
    v = Value(1.0)
    summary = codegen.explain(v * 2.0, [v], target="aarch64-linux-musl").summary()
    assert summary.endswith("; vectors on aarch64-linux-musl: " + targets.TARGETS["aarch64-linux-musl"].vectors)
    assert "vectors" not in codegen.explain(v * 2.0, [v]).summary()
    with pytest.raises(ValueError, match="unknown target 'riscv'"):
        codegen.explain(v * 2.0, [v], target="riscv")


@pytest.mark.slow  # builds its own exports (15 s); test_the_gpt_export_script runs gpt's
def test_the_make_export_script_for_a_target(trained, mnist, tmp_path, capsys):  # noqa: F811
    """python -m mnist.export --target (make export ARGS="--target=..."): builds, runs and checks."""
    from mnist import export as export_script
    runs_here("aarch64-linux-musl")
    graph, _ = trained
    params = tmp_path / "params.npz"
    np.savez(params, params=np.array([p.data for p in graph.params]), seed=0, hidden=[HIDDEN], epochs=1)
    out, data = tmp_path / "out", str(REAL_MNIST)
    common = ["--load", str(params), "--out", str(out), "--data-dir", data, "--target-opt", "0"]
    assert export_script.main([*common, "--target=aarch64-linux-musl", "--check-images", "20",
                               "--check-steps", "10"]) == 0
    printed = capsys.readouterr().out
    assert "same class as the module for 100.00%" in printed and "10 SGD steps" in printed
    assert {p.name for p in (out / "aarch64-linux-musl").iterdir()} == {
        "libmnist.a", "mnist", "mnist_main.c", "libmnist_train.a", "mnist_train", "mnist_train_main.c"}
    assert export_script.main([*common, "--target=mips-linux"]) == 2
    assert "unknown target 'mips-linux'; the known targets: x86_64-linux-musl" in capsys.readouterr().err


@pytest.mark.xdist_group("aarch64-linux-musl")
def test_the_gpt_export_script(tmp_path, capsys):
    """python -m gpt.export --target (make export-gpt): trains, exports, builds, runs and checks (for
    aarch64, whose musl the quick checks have zig build)."""
    requires("zig")
    triple = "aarch64-linux-musl"
    runs_here(triple)
    names = tmp_path / "names.txt"
    names.write_text("\n".join(NAMES) + "\n")
    out = tmp_path / "out"
    common = ["--out", str(out), "--data", str(names), "--steps", "10", "--n-embd", "4", "--n-head", "2",
              "--block-size", "4", "--quiet"]
    assert gpt_export.main([*common, f"--target={triple}", "--target-opt", "0", "--check-docs", "40",
                            "--check-steps", "20"]) == 0
    printed = capsys.readouterr().out
    assert "the logits of 40 documents" in printed and "20 SGD steps" in printed
    vocab = gpt_data.Tokenizer(NAMES).vocab_size
    assert (f"token {vocab} (out of range): input 0 is an index into {vocab} values, so it must hold an integer "
            f"from -{vocab} to {vocab - 1}, not {vocab}") in printed
    assert {p.name for p in (out / triple).iterdir()} == {
        "libgpt.a", "gpt", "gpt_main.c", "libgpt_train.a", "gpt_train", "gpt_train_main.c"}
    assert gpt_export.main([*common, "--target=mips-linux"]) == 2
    assert "unknown target 'mips-linux'; the known targets: x86_64-linux-musl" in capsys.readouterr().err
