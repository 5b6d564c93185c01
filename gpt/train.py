"""`python -m gpt`: microgpt trained through a compiled module (or, with --interpret, microgpt's
own loop on the interpreter), printing microgpt's step lines and samples, then a summary.

The run is microgpt's: random.seed(seed), the documents shuffled, the parameters drawn in its
order, one document a step (or --batch-size of them), Adam with betas (0.85, 0.99) and a learning
rate decaying linearly to 0, then 20 samples at temperature 0.5 drawn with random.choices.
"""

import argparse
import math
import os
import pathlib
import random
import sys
import time

import numpy as np
from tqdm import tqdm

import codegen
from codegen.backend import toolchain
from micrograd_c import engine

from . import data, model

BETAS, EPS = (0.85, 0.99), 1e-8  # microgpt's Adam


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m gpt", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="a text file, one document per line (default: $GPT_DATA, else "
                                  "../shared/names/first.txt)")
    p.add_argument("--windows", action="store_true",
                   help="the file is one long text: train on windows of block-size characters, newlines included")
    p.add_argument("--held-out", type=float, default=0.0, metavar="FRACTION",
                   help="hold out this fraction of the (shuffled) documents and report their mean loss "
                        "before and after training (default 0: microgpt's run)")
    p.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    p.add_argument("--n-embd", type=int, default=16)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-layer", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate at step 0 (default 0.01)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--batch-size", type=int, default=1, help="documents a step (default 1, microgpt's)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    p.add_argument("--compiler", default=os.environ.get("CC") or "tcc",
                   help="gcc, clang, zig, tcc, libtcc or a command (default: $CC, else tcc: docs/gpt.md says why)")
    p.add_argument("--opt", type=int, default=2, choices=range(4), help="-O level (default 2)")
    p.add_argument("--samples", type=int, default=20, help="names to sample after training (default 20)")
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--interpret", action="store_true", help="microgpt's own loop on the interpreter (slow)")
    p.add_argument("--quiet", action="store_true", help="no step lines (the progress bar and summary stay)")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "samples"):
        if getattr(args, name) < (0 if name == "samples" else 1):
            p.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'samples' else 1}")
    if not args.lr > 0 or not args.temperature > 0:
        p.error("--lr and --temperature must be positive")
    if not 0 <= args.held_out < 1:
        p.error("--held-out must be a fraction in [0, 1)")
    try:
        args.config = model.Config(args.n_embd, args.n_head, args.n_layer, args.block_size)
    except ValueError as error:
        p.error(str(error))
    if args.interpret and args.batch_size != 1:
        p.error("--interpret runs microgpt's loop: one document a step (--batch-size 1)")
    return args


def setup(args):
    """microgpt's start: the seed, the documents shuffled, the tokenizer, the parameters. With
    --windows the documents are windows of one text (data.load_windows)."""
    random.seed(args.seed)
    path = args.data or data.default_path()
    docs = data.load_windows(path, args.config.block_size) if args.windows else data.load_docs(path)
    random.shuffle(docs)
    tokenizer = data.Tokenizer(docs, framed=not args.windows)
    state, params = model.init_state(args.config, tokenizer.vocab_size)
    return docs, tokenizer, state, params


def compile_document(state, params, config, args):
    """The Document graph's module (Adam compiled in): (module, the compiler's description, seconds
    building the graph in Python, seconds of codegen (the graph read and, unless the cache has its
    build, lowered to C), seconds of building or loading)."""
    t0 = time.perf_counter()
    with engine.no_gc(survivors=True):  # a graph of Values is no garbage: 3-5x faster without the rescans
        doc = model.document(state, config)
    compiler = toolchain.find_compiler(args.compiler)
    name = pathlib.Path(compiler.argv[0]).name
    # an optimising compiler builds in the background while a first tier trains (codegen/tiers.py)
    tiered = not name.startswith(("tcc", "libtcc"))
    t1 = time.perf_counter()
    net = codegen.compile(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, dtype=args.dtype,
                          batch=args.batch_size, optimizer=codegen.Adam(betas=BETAS, eps=EPS), compiler=compiler,
                          opt=args.opt, tiered=tiered)
    compiled = time.perf_counter() - t1
    flags = " ".join(toolchain.compile_flags(compiler, args.opt, False))
    first = f", the first tier ({net.first_tier}) meanwhile" if tiered and net.tier == "first" else ""
    how = f"{name} {flags}".strip() + first + (", from the build cache" if net.build.cached else "")
    return net, how, t1 - t0, net.timings["codegen"], compiled - net.timings["codegen"]


CALL_STEPS = 100  # steps a train() call of train_compiled runs


def learning_rate(args, step):
    return args.lr * (1 - step / args.steps)


def train_compiled(net, docs, tokenizer, args, bar):
    """args.steps steps of args.batch_size documents (taken in order, cycling); yields each step's loss.
    The steps run CALL_STEPS to a train() call, each with its own learning rate (microgpt's
    schedule: train()'s lr as one rate a step, its losses= each step's loss), so that Python runs
    between calls only, not between steps (a call a step cost microgpt's step a tenth more: 3.9 us,
    docs/gpt.md); a tiered module moves to its optimised build between calls."""
    block, batch = args.config.block_size, args.batch_size
    rows = np.stack([data.row(tokenizer.encode(d), block) for d in docs]) if len(docs) <= 100_000 else None
    for first in range(0, args.steps, CALL_STEPS):
        steps = range(first, min(first + CALL_STEPS, args.steps))
        picked = [(first * batch + k) % len(docs) for k in range(len(steps) * batch)]
        chunk = rows[picked] if rows is not None else np.stack([data.row(tokenizer.encode(docs[i]), block)
                                                                  for i in picked])
        losses = np.empty(len(steps))
        net.train(np.ascontiguousarray(chunk[:, :2 * block]), np.ascontiguousarray(chunk[:, 2 * block:]),
                  [learning_rate(args, step) for step in steps], batch_size=batch, losses=losses)
        for loss in losses.tolist():
            bar.update(1)
            yield loss


def train_interpreted(state, params, docs, tokenizer, args, bar):
    """microgpt's loop: a graph per document, backward, Adam in Python; yields each step's loss."""
    m, v = [0.0] * len(params), [0.0] * len(params)
    beta1, beta2 = BETAS
    for step in range(args.steps):
        loss = model.interpreted_loss(state, args.config, tokenizer.encode(docs[step % len(docs)]))
        loss.backward()
        lr_t = learning_rate(args, step)
        for i, p in enumerate(params):
            m[i] = beta1 * m[i] + (1 - beta1) * p.grad
            v[i] = beta2 * v[i] + (1 - beta2) * p.grad ** 2
            m_hat = m[i] / (1 - beta1 ** (step + 1))
            v_hat = v[i] / (1 - beta2 ** (step + 1))
            p.data -= lr_t * m_hat / (v_hat ** 0.5 + EPS)
            p.grad = 0
        bar.update(1)
        yield loss.data


def sample_probs(logits, temperature):
    """microgpt's softmax([l / temperature for l in logits]) on floats, operation for operation
    (its Value division is a product with the inverse)."""
    scaled = [l * temperature ** -1 for l in logits]
    top = max(scaled)
    exps = [math.exp(x + -top) for x in scaled]
    inverse = sum(exps) ** -1
    return [e * inverse for e in exps]


def sample_names(logits_at, tokenizer, args):
    """microgpt's sampling: from BOS (tokenizer.start), a token at a time by random.choices on the
    probabilities at temperature args.temperature, until BOS or block_size tokens. logits_at(tokens, pos):
    the logits at position pos after the tokens so far."""
    names = []
    for _ in range(args.samples):
        tokens = [tokenizer.start]
        for pos in range(args.config.block_size):
            probs = sample_probs(logits_at(tokens, pos), args.temperature)
            token = random.choices(range(tokenizer.vocab_size), weights=probs)[0]
            if token == tokenizer.bos:
                break
            tokens.append(token)
        names.append(tokenizer.decode(tokens[1:]))
    return names


def compiled_logits(net, tokenizer, config):
    vocab = tokenizer.vocab_size

    def logits_at(tokens, pos):
        row = data.row(tokens + [tokenizer.bos], config.block_size)
        outputs = np.asarray(net.predict(row[None, :]))
        return outputs[0, pos * vocab:(pos + 1) * vocab].tolist()
    return logits_at


def compiled_loss_of(net, config):
    """A document's loss (its tokens) by the module's forward pass."""
    def loss_of(tokens):
        net.set_input(data.row(tokens, config.block_size))
        return net.forward()
    return loss_of


def interpreted_loss_of(state, config):
    """A document's loss (its tokens) by microgpt's graph on the interpreter."""
    return lambda tokens: model.interpreted_loss(state, config, tokens).data


def mean_loss(loss_of, docs, tokenizer):
    """The documents' mean loss (each document's own: the mean over its positions)."""
    return sum(loss_of(tokenizer.encode(d)) for d in docs) / len(docs)


def interpreted_logits(state, config):
    def logits_at(tokens, pos):
        keys, values = [[] for _ in range(config.n_layer)], [[] for _ in range(config.n_layer)]
        for p in range(pos + 1):
            logits = model.gpt(state, config, tokens[p], p, keys, values)
        return [l.data for l in logits]
    return logits_at


def run(args, out=sys.stdout):
    docs, tokenizer, state, params = setup(args)
    docs, held_out = data.split(docs, args.held_out)
    print(f"num docs: {len(docs)}" + (f" (and {len(held_out)} held out)" if held_out else ""), file=out)
    print(f"vocab size: {tokenizer.vocab_size}", file=out)
    print(f"num params: {len(params)}", file=out)
    summary = {"graph_s": 0.0, "codegen_s": 0.0, "build_s": 0.0}
    if not args.interpret:
        net, compiler, summary["graph_s"], summary["codegen_s"], summary["build_s"] = compile_document(
            state, params, args.config, args)
        print(f"module: graph {summary['graph_s']:.2f} s, codegen {summary['codegen_s']:.2f} s, "
              f"build {summary['build_s']:.2f} s ({compiler})", file=out)
    loss_of = interpreted_loss_of(state, args.config) if args.interpret else compiled_loss_of(net, args.config)
    if held_out:
        summary["held_out_before"] = mean_loss(loss_of, held_out, tokenizer)
        print(f"held-out loss before training: {summary['held_out_before']:.4f}", file=out)
    losses = []
    t0 = time.perf_counter()
    with tqdm(total=args.steps, unit="step", desc="training", file=sys.stderr, disable=None) as bar:
        steps = (train_interpreted(state, params, docs, tokenizer, args, bar) if args.interpret
                 else train_compiled(net, docs, tokenizer, args, bar))
        for step, loss in enumerate(steps):
            losses.append(loss)
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            if not args.quiet:
                print(f"step {step + 1:4d} / {args.steps:4d} | loss {loss:.4f}", file=out)
    train_s = time.perf_counter() - t0
    if held_out:
        summary["held_out"] = mean_loss(loss_of, held_out, tokenizer)
        print(f"held-out loss: {summary['held_out']:.4f} ({len(held_out)} documents)", file=out)
    print(f"--- inference (new, hallucinated {'names' if tokenizer.framed else 'text'}) ---", file=out)
    logits_at = interpreted_logits(state, args.config) if args.interpret else compiled_logits(net, tokenizer, args.config)
    names = sample_names(logits_at, tokenizer, args)
    for i, name in enumerate(names):
        print(f"sample {i + 1:2d}: {name if tokenizer.framed else repr(name)}", file=out)  # (a text's newlines)
    summary.update(train_s=train_s, step_us=train_s / args.steps * 1e6, final_loss=losses[-1], losses=losses,
                   samples=names)
    tier = getattr(net, "tier", None) if not args.interpret else None
    optimised = getattr(net, "timings", {}).get("optimised") if tier else None
    tiers = (f", ran on the {tier} tier" + (f" (the optimised build took {optimised:.1f} s)" if optimised else "")
             if tier else "")
    print(f"summary: {args.steps} steps of {args.batch_size} document(s) in {train_s:.2f} s "
          f"({summary['step_us']:.1f} us a step), graph {summary['graph_s']:.2f} s, codegen {summary['codegen_s']:.2f} s, "
          f"build {summary['build_s']:.2f} s{tiers}, last loss {losses[-1]:.4f}", file=out)
    return summary


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except data.DataError as error:
        sys.exit(f"python -m gpt: {error}")


if __name__ == "__main__":
    main()
