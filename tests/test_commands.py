"""The commands of the README and docs/, run as a user runs them (make in the repository) at a
small size, so that a broken command fails here instead of for a user. make runs with this test's
Python as its virtualenv (no venv is made) and writes into the test's directory (BUILD=...), not
build/."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import have, requires
from test_train import mnist_dir  # noqa: F401  (a fixture: the real MNIST files)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def make(tmp_path):
    """make(target, *variables) -> its output; fails the test on a non-zero exit."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    # a script, not a link: a link to a virtualenv's python outside it loses the virtualenv's packages
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    (venv / ".installed").touch()  # newer than pyproject.toml: make installs nothing

    def run(target, *variables, env=None):
        command = ["make", "--no-print-directory", target, f"VENV={venv}", f"BUILD={tmp_path / 'build'}", *variables]
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                              env={**os.environ, **(env or {})})
        assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr
    return run


def test_make_xor(make, tmp_path):
    out = make("xor")
    assert "accuracy: compiled 100%, interpreted 100%" in out
    assert list((tmp_path / "build").glob("xor*.so"))


def test_make_mnist_says_which_compiler_and_trains(make, mnist_dir, tmp_path):  # noqa: F811
    out = make("mnist", f"ARGS=--limit 2000 --data-dir {mnist_dir} --no-download")
    assert len(re.findall(r"^compiler: \S+", out, re.M)) == 1
    assert f"module: prebuilt {tmp_path / 'build'}" in out  # `make` built it; the training took it
    accuracy = float(re.findall(r"test accuracy\s+([\d.]+)%", out)[-1])
    assert accuracy >= 70  # 2,000 images, one epoch
    # docs/compiler.md's one-liner on the module `make` built
    n_params = subprocess.run([sys.executable, "-c", 'import sys; sys.path.insert(0, "build"); import nn; '
                               'print(nn.n_params)'], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert n_params.stdout.split() == ["39760"]


def test_make_export(make, mnist_dir, tmp_path):  # noqa: F811
    out = make("export", f"ARGS=--limit 2000 --hidden 16 --data-dir {mnist_dir} --no-download", env={"MNIST_DIR": str(mnist_dir)})
    assert "same class as the module for 100.00%" in out
    assert {p.name for p in (tmp_path / "build" / "export").iterdir()} >= {
        "mnist.c", "mnist.h", "mnist_train.c", "mnist_train.h", "freestanding"}


def test_make_export_gpt(make, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("emma\nolivia\nava\nliam\nnoah\n")
    out = make("export-gpt", f"ARGS=--data {names} --steps 5 --n-embd 4 --n-head 2 --block-size 4 --quiet")
    assert "trained 288 parameters for 5 steps" in out  # wte, lm_head 10 x 4; wpe 4 x 4; the layer 12 x 16
    assert {p.name for p in (tmp_path / "build" / "export-gpt").iterdir()} == {
        "gpt.c", "gpt.h", "gpt_train.c", "gpt_train.h", "freestanding"}


def test_make_compare_with_one_configuration(make, mnist_dir, tmp_path):  # noqa: F811
    out = make("compare", f"ARGS=--configs tcc numpy libtcc --n-train 300 --repeats 1 --data-dir {mnist_dir} "
                          f"--out {tmp_path / 'results'}")
    rows = {line.split(" | ")[0].strip("| "): line for line in out.splitlines() if line.startswith("| ")}
    assert {"tcc", "numpy", "libtcc"} <= set(rows) and all(" ok " in rows[k] for k in ("tcc", "numpy", "libtcc"))
    assert (tmp_path / "results" / "compare.csv").exists()


def test_make_bench_jit(make):
    out = make("bench-jit", "ARGS=--n 2000 --repeats 1 --interpreted 100 --per-call 100")
    assert "codegen.jit(compiler='libtcc'), batched" in out


def test_make_bench_mpi(make, mnist_dir):  # noqa: F811
    requires("mpiexec")
    requires("gcc")
    out = make("bench-mpi", "ARGS=--images 512 --repeats 1 --hidden 16", env={"MNIST_DIR": str(mnist_dir)})
    assert re.search(r"^ +1 +[\d,]+ +1\.00 ", out, re.M) and re.search(r"^ +2 +[\d,]+ +[\d.]+ ", out, re.M), out
    assert "| MLP(784, [16, 10]) | 12,730 |" in out


def test_make_roofline(make):
    if not any(map(have, ("gcc", "clang", "zig"))):
        requires("gcc")  # a compiler taking -march=native
    out = make("roofline")
    assert re.search(r"multiply-adds\s+float64: [\d.]+ G/s", out)
    assert re.search(r"vectors of (16|32|64) bytes", out)  # the CPU's own width
    assert re.search(r"float32: [\d.]+ G/s on 1 thread\(s\) \(dgemm, sgemm\)", out)  # NumPy's check


def test_cache_list_command():
    done = subprocess.run([sys.executable, "-m", "codegen.backend.cache", "list"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
