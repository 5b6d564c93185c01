"""The training scripts end to end, through their main(argv): MNIST on the real files, XOR, bad input."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import codegen
from codegen.backend import toolchain
from conftest import seeded_cache
from mnist import build, train, xor
from mnist.data import FILES, TEST_LABELS

REAL_MNIST = Path(os.environ.get("MNIST_DIR") or Path(__file__).resolve().parents[2] / "shared" / "mnist")
# --limit 10000, one epoch, the default lr and seed: 85.80% with tcc, gcc and clang alike (their
# sums run in the same order). The bar leaves room for other platforms' libm, not for bugs.
SUBSET_ACCURACY = 0.91  # measured 92.3% (seed 0, he init, lr 0.03 linear)


@pytest.fixture
def mnist_dir():
    """The real MNIST files: skipped without them, except in CI, which must have them."""
    if not REAL_MNIST.is_dir():
        message = f"real MNIST files not found in {REAL_MNIST} (set $MNIST_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return REAL_MNIST


@pytest.fixture(autouse=True)
def build_cache(tmp_path, monkeypatch):
    """A fresh build cache: the scripts really compile their models (gcc -O2 takes about a second);
    it starts with the run's module runtimes (both dtypes), which every model links."""
    monkeypatch.setenv("MICROGRAD_C_CACHE", str(seeded_cache(tmp_path / "cache", None, 2, ("float64", "float32"))))


def run_train(capsys, *argv):
    """(exit status, stdout, stderr) of `python -m mnist.train argv`."""
    status = train.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def summary_accuracy(out):
    """The summary's test accuracy (after the last epoch): the last of the lines that give one."""
    return float(re.findall(r"test accuracy\s+([\d.]+)%", out)[-1]) / 100


def test_trains_on_a_subset_saves_and_reloads(mnist_dir, tmp_path, capsys):
    params = tmp_path / "params.npz"
    common = ["--data-dir", str(mnist_dir), "--no-download", "--opt", "2"]
    status, out, _ = run_train(capsys, *common, "--limit", "10000", "--save", str(params),
                               "--module-dir", str(tmp_path / "no-module"))
    assert status == 0
    assert "module: compiled;" in out
    accuracy = summary_accuracy(out)
    assert accuracy >= SUBSET_ACCURACY

    saved = np.load(params)
    assert saved["params"].shape == (39760,)
    assert (int(saved["seed"]), list(saved["hidden"]), int(saved["epochs"])) == (0, [50], 1)

    # the module `make` builds is used when its nn.c matches, and given the loaded parameters
    module_dir = tmp_path / "build"
    assert build.main(["--out", str(module_dir)]) == 0
    status, out, _ = run_train(capsys, *common, "--load", str(params), "--eval-only", "--module-dir", str(module_dir))
    assert status == 0
    assert f"module: prebuilt {module_dir}" in out
    assert summary_accuracy(out) == accuracy


def test_float32_trains_the_subset_and_the_float64_module_is_not_taken_for_it(mnist_dir, tmp_path, capsys):
    """--dtype float32 (make DTYPE=float32): a float32 build, used by the training only when it
    asks for float32; its accuracy on the subset as float64's bar."""
    module_dir = tmp_path / "build"
    assert build.main(["--out", str(module_dir)]) == 0  # float64
    common = ["--data-dir", str(mnist_dir), "--no-download", "--limit", "10000",
              "--module-dir", str(module_dir)]
    status, out, _ = run_train(capsys, *common, "--dtype", "float32")
    assert status == 0 and "module: compiled;" in out and "float32" in out
    assert summary_accuracy(out) >= SUBSET_ACCURACY
    assert build.main(["--out", str(module_dir), "--dtype", "float32"]) == 0
    capsys.readouterr()
    status, out, _ = run_train(capsys, *common, "--dtype", "float32")
    assert status == 0 and f"module: prebuilt {module_dir}" in out


@pytest.mark.slow
def test_float32_full_mnist_one_epoch(mnist_dir, tmp_path, capsys):
    """The issue's bar: one epoch in float32 >= 96% test accuracy (measured 96.56%)."""
    status, out, _ = run_train(capsys, "--data-dir", str(mnist_dir), "--no-download", "--dtype", "float32",
                               "--module-dir", str(tmp_path))
    assert status == 0 and summary_accuracy(out) >= 0.96


def test_full_mnist_reaches_the_targets(mnist_dir, tmp_path, capsys):
    """docs/mnist.md's claim: >= 95% test accuracy after one epoch, >= 97% after three."""
    status, out, _ = run_train(capsys, "--data-dir", str(mnist_dir), "--no-download", "--epochs", "3",
                               "--module-dir", str(tmp_path))
    assert status == 0
    accuracies = [float(a) / 100 for a in re.findall(r"epoch \d/3: loss [\d.]+, test accuracy ([\d.]+)%", out)]
    assert len(accuracies) == 3
    assert accuracies[0] >= 0.95 and accuracies[-1] >= 0.97


@pytest.mark.parametrize("scalar, tolerance", [(False, 1e-12), (True, 0.0)])
def test_xor_compiled_and_interpreted_agree(capsys, tmp_path, scalar, tolerance):
    """Fused dot products add in another order than the interpreter; scalar code replays it exactly."""
    assert xor.main(["--opt", "2", "--out", str(tmp_path)] + ["--scalar"] * scalar) == 0
    out = capsys.readouterr().out
    difference = float(re.search(r"over the final parameters: (\S+)", out).group(1))
    assert difference <= tolerance
    assert "accuracy: compiled 100%, interpreted 100%" in out


def test_load_with_the_wrong_parameter_count_is_a_clear_error(tmp_path, capsys):
    params = tmp_path / "small.npz"
    np.savez(params, params=np.zeros(5), seed=0, hidden=[50], epochs=1)
    status, _, err = run_train(capsys, "--load", str(params), "--data-dir", str(tmp_path), "--no-download")
    assert status == 2
    assert err.startswith(f"error: {params} holds 5 parameters but MLP(784, [50, 10]) has 39,760")


@pytest.mark.parametrize("option, saved, message", [
    (["--hidden", "128", "64"], {}, "was saved from a model with --hidden 50, not 128 64: it is from another model"),
    (["--activation", "tanh"], {}, "was saved from a model with --activation relu, not tanh: it is from another model"),
    (["--optimizer", "sgd"], {"optimizer": "adam"}, "was saved from a model with --optimizer adam, not sgd: it is from another model"),
])
def test_load_refuses_a_file_from_another_model(tmp_path, capsys, option, saved, message):
    params = tmp_path / "model.npz"
    np.savez(params, **{"params": np.zeros(39760), "seed": 0, "hidden": [50], "activation": "relu",
                        "optimizer": "sgd", "epochs": 1, **saved})
    status, _, err = run_train(capsys, "--load", str(params), *option, "--data-dir", str(tmp_path), "--no-download")
    assert status == 2
    assert err == f"error: {params} {message} (leave {option[0]} out to take the file's)\n"


def test_adam_with_a_plot_saves_and_resumes_its_state(mnist_dir, tmp_path, capsys):
    """--optimizer adam --plot on a subset; --load takes the architecture and the optimizer (and
    its step count) from the file."""
    common = ["--data-dir", str(mnist_dir), "--no-download", "--limit", "2000",
              "--module-dir", str(tmp_path)]
    saved, picture = tmp_path / "adam.npz", tmp_path / "loss.png"
    status, out, _ = run_train(capsys, *common, "--optimizer", "adam", "--hidden", "20", "--activation", "tanh",
                               "--plot", str(picture), "--save", str(saved))
    assert status == 0
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "MLP(784, [20, 10]), tanh" in out and "Adam(betas=(0.9, 0.999)" in out
    file = np.load(saved)
    assert (list(file["hidden"]), str(file["activation"]), str(file["optimizer"])) == ([20], "tanh", "adam")
    assert file["state_step"][0] == 2000 and file["state_exp_avg"].shape == (15910,)
    status, out, _ = run_train(capsys, *common, "--load", str(saved), "--save", str(saved))
    assert status == 0
    assert "MLP(784, [20, 10]), tanh" in out and "lr 0.001" in out
    assert np.load(saved)["state_step"][0] == 4000 and int(np.load(saved)["epochs"]) == 2


def run_python(code, cwd, **environment):
    """Runs code in a fresh interpreter (as a user's script), in cwd, with more environment
    variables; returns its stdout."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), **environment}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def readme_snippet(heading):
    readme = (Path(__file__).resolve().parents[1] / "docs" / "mnist.md").read_text()
    return re.search(heading + r".*?```python\n(.*?)```", readme, re.S).group(1)


def test_import_nn_built_by_make_trains_from_the_readme(mnist_dir, tmp_path):
    """docs/mnist.md's `import nn` snippet, in a fresh process, on the module `make` builds:
    it starts from the model's initial weights and reaches >= 95% after one epoch."""
    assert build.main(["--out", str(tmp_path / "build")]) == 0
    code = readme_snippet("## Training the module `make` built") + "\nprint(f'accuracy {accuracy}')\n"
    out = run_python(code, tmp_path, MNIST_DIR=str(mnist_dir))
    assert float(re.search(r"accuracy ([\d.]+)", out).group(1)) >= 0.95


def test_import_xor_built_by_make_xor_trains_from_the_readme(tmp_path, capsys):
    assert xor.main(["--out", str(tmp_path / "build")]) == 0
    capsys.readouterr()
    out = run_python(readme_snippet("## Training the module `make xor` built"), tmp_path)
    assert out.split()[-4:] == ["-1", "1", "1", "-1"]  # the signs of the outputs: XOR


def test_truncated_data_file_is_a_clear_error(mnist_dir, tmp_path, capsys):
    for name in FILES:
        shutil.copyfile(mnist_dir / name, tmp_path / name)
    truncated = tmp_path / TEST_LABELS
    truncated.write_bytes(truncated.read_bytes()[:-100])
    status, _, err = run_train(capsys, "--data-dir", str(tmp_path), "--no-download", "--limit", "100",
                               "--module-dir", str(tmp_path))
    assert status == 2
    assert err.startswith(f"error: {truncated}: ")
    assert err.count("\n") == 1


def test_missing_data_without_download_is_a_clear_error(tmp_path, capsys):
    status, _, err = run_train(capsys, "--data-dir", str(tmp_path), "--no-download", "--module-dir", str(tmp_path))
    assert status == 2
    assert err.startswith(f"error: {tmp_path}: MNIST files not found")


def test_missing_compiler_is_a_clear_error(tmp_path, capsys):
    status, _, err = run_train(capsys, "--compiler", "no-such-cc", "--module-dir", str(tmp_path))
    assert status == 2
    assert err.startswith("error: C compiler 'no-such-cc' not found")


@pytest.mark.slow
def test_adam_reaches_the_targets(mnist_dir, tmp_path, capsys):
    """Adam, lr 0.001 falling linearly over the run, batch 1, he init, MLP(784, [128, 64, 10]):
    97.38% after one epoch; 98.07% after a run of three (the issue's targets: 97.0% and 98%)."""
    picture = tmp_path / "loss.png"
    common = ["--data-dir", str(mnist_dir), "--no-download", "--optimizer", "adam", "--hidden", "128", "64",
              "--module-dir", str(tmp_path)]
    status, out, _ = run_train(capsys, *common)
    assert status == 0
    assert summary_accuracy(out) >= 0.97
    status, out, _ = run_train(capsys, *common, "--epochs", "3", "--plot", str(picture))
    assert status == 0
    assert summary_accuracy(out) >= 0.98
    assert picture.stat().st_size > 10_000


@pytest.mark.slow
def test_adam_on_the_default_model(mnist_dir, tmp_path, capsys):
    """The default MLP(784, [50, 10]) with Adam: 96.68% after one epoch (seeds 1, 2: 96.49%,
    96.63%), short of 97.0% (see docs/optimizers.md)."""
    status, out, _ = run_train(capsys, "--data-dir", str(mnist_dir), "--no-download", "--optimizer", "adam",
                               "--module-dir", str(tmp_path))
    assert status == 0
    assert summary_accuracy(out) >= 0.965


def test_module_dir_build_is_used_only_for_the_same_build(tmp_path, capsys, monkeypatch):
    """mnist.train takes the module mnist.build exported when its recorded structure key is the one
    these options give (same graph and options, compiler and flags), never a stale one; it finds
    it without generating the C."""
    module_dir = tmp_path / "build"
    assert build.main(["--compiler", "tcc", "--out", str(module_dir)]) == 0
    # the model's unit, its generated functions and the runtime (TCC compiles it as two more units:
    # templates/runtime.c and products.c), and the record
    assert sorted(p.name for p in module_dir.iterdir() if not p.name.endswith(".so")) == [
        "nn.1.c", "nn.2.c", "nn.3.c", "nn.c", "nn.json"]
    hows, lowerings = [], []
    lower = codegen.lower.ir.lower
    monkeypatch.setattr(codegen.lower.ir, "lower", lambda *a, **k: lowerings.append(1) or lower(*a, **k))
    for options in (["--compiler", "tcc"], ["--compiler", "tcc", "--seed", "1"], ["--compiler", "tcc", "--opt", "1"],
                    ["--compiler", "tcc", "--batch-size", "32"]):
        args = train.parse_args([*options, "--module-dir", str(module_dir)])
        optimizer = train.resolve_model_options(args, None)
        graph = train.build_graph(args.seed, hidden=args.hidden, init=args.init, activation=args.activation)
        hows.append(train.compiled_module(graph, args, optimizer)[1].how)
    assert hows[0].startswith(f"prebuilt {module_dir}")
    # other initial weights in the C; other flags; batched passes of 32 (the prebuilt's are 128)
    assert hows[1:] == ["compiled", "compiled", "compiled"]
    assert len(lowerings) == 3  # the C generated for the others only: the prebuilt is found by structure
    assert [train.built_batch(n) for n in (1, 32, 100, 5000)] == [128, 32, 100, 4096]
    assert "structure" in toolchain.export_record(module_dir, "nn")
