"""`python -m gpt.export` (`make export-gpt`): microgpt's model as plain C with no Python
(codegen.export), trained first as `python -m gpt` trains it (its options: --steps, --n-embd, ...).

    python -m gpt.export [--out build/export-gpt] [--target aarch64-linux-musl] [gpt's options]

Writes OUT/gpt.c, .h (frozen: gpt_predict(tokens, logits), block_size tokens in (model.Document's
tokens; pad past the document's end with any valid token), the logits of every position out,
block_size x vocab_size of them) and OUT/gpt_train.c, .h (trainable: gpt_train_set_input takes a row of
data.row, the document's tokens, targets and weights; one SGD step per row). A token is an index
input: gpt_predict and gpt_train_set_input return nonzero, computing nothing, for one that is not an
integer from -vocab_size to vocab_size - 1. With --target (a zig triple, codegen.backend.targets.TARGETS)
both are also built for that machine by zig cc (OUT/<target>/: libgpt.a and the program gpt,
libgpt_train.a and gpt_train) and checked there (under qemu-user or wasmtime on another machine):
the frozen program's logits for --check-docs documents, and --check-steps SGD steps of the
trainable one, against the host's compiled module; and that a token out of range is refused.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

import codegen
from codegen.backend import targets, toolchain
from codegen.export import OUTPUT_BOUND, losses_agree, module_steps

from . import data, model, train

CHECK_LR = 0.1  # the SGD rate of the trainable program's check (the exported step is SGD, not Adam)


def export(doc, params, path, name="gpt", frozen=False, **options):
    """codegen.export of a Document graph (model.document): frozen, its tokens in and the logits
    of every position out; else the training step over its inputs (tokens, targets, weights)."""
    inputs = doc.tokens if frozen else doc.inputs
    return codegen.export(doc.loss, inputs, params, doc.outputs, path=path, name=name, frozen=frozen, **options)


def token_rows(tokenizer, docs, block_size):
    """The frozen program's rows: each document's tokens (data.row's first block_size values)."""
    return np.stack([data.row(tokenizer.encode(d), block_size)[:block_size] for d in docs])


def training_rows(tokenizer, docs, steps, block_size):
    """The trainable program's rows: data.row of the documents in order, cycling, one per step."""
    return np.stack([data.row(tokenizer.encode(docs[step % len(docs)]), block_size) for step in range(steps)])


def reference_module(doc, params, compiler="tcc"):
    """The host's compiled module of the Document graph, from the Values' parameters, with SGD: the
    reference the exported programs are held to (tcc builds it in a second; docs/gpt.md)."""
    return codegen.compile(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, compiler=compiler)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m gpt.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/export-gpt"), help="directory for the C files")
    parser.add_argument("--target", default=None,
                        help="also build both for this machine with zig cc, and check them there: "
                             + ", ".join(targets.TARGETS))
    parser.add_argument("--target-opt", type=int, default=2, choices=range(4),
                        help="zig cc's -O level for the trainable step (default 2)")
    parser.add_argument("--frozen-opt", type=int, default=0, choices=range(4),
                        help="zig cc's -O level for the frozen model (default 0: its straight-line code of "
                             "every weight a constant takes -O2 minutes)")
    parser.add_argument("--check-docs", type=int, default=1000, metavar="N",
                        help="documents whose logits the --target check compares (default 1000)")
    parser.add_argument("--check-steps", type=int, default=1000, metavar="N",
                        help="SGD steps the --target check trains (default 1000)")
    args, rest = parser.parse_known_args(argv)
    gpt_args = train.parse_args(rest)  # the model, the data and the training before the export
    try:
        run(args, gpt_args)
    except (data.DataError, toolchain.ToolchainError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def run(args, gpt_args):
    if args.target:
        targets.lookup(args.target)  # a bad target fails before training
    docs, tokenizer, state, params = train.setup(gpt_args)
    net, how, *_ = train.compile_document(state, params, gpt_args.config, gpt_args)
    with tqdm(total=gpt_args.steps, unit="step", desc="training", file=sys.stderr, disable=None) as bar:
        losses = list(train.train_compiled(net, docs, tokenizer, gpt_args, bar))
    codegen.copy_to_values(net, params)
    print(f"trained {len(params):,} parameters for {gpt_args.steps} steps ({how}): last loss {losses[-1]:.4f}")
    started = time.perf_counter()
    doc = model.document(state, gpt_args.config)
    frozen = export(doc, params, args.out, "gpt", frozen=True, target=args.target, opt=args.frozen_opt)
    trainable = export(doc, params, args.out, "gpt_train", target=args.target, opt=args.target_opt)
    print(f"exported in {time.perf_counter() - started:.1f} s:")
    for exported in (frozen, trainable):
        for path in (exported.source, exported.header):
            print(f"  {path}  {path.stat().st_size:,} bytes")
        if exported.build:
            b, opt = exported.build, args.frozen_opt if exported is frozen else args.target_opt
            print(f"  {b.library}, {b.program}  built by zig cc -O{opt} in {b.seconds:.1f} s")
    if args.target:
        check_target(frozen.build, trainable.build, doc, params, tokenizer, docs, args)


def check_target(frozen, trainable, doc, params, tokenizer, docs, args):
    """The target's programs against the host module: logits of --check-docs documents, losses and
    parameters over --check-steps SGD steps, and a token out of range refused."""
    block = len(doc.tokens)
    net = reference_module(doc, params)
    rows = token_rows(tokenizer, docs[:args.check_docs], block)
    started = time.perf_counter()
    logits = frozen.predict(rows)
    seconds = time.perf_counter() - started
    difference = np.max(np.abs(logits - np.asarray(net.predict(rows))))
    print(f"check: {frozen.program.name} ({args.target}), the logits of {len(rows):,} documents in {seconds:.1f} s: "
          f"max |logit difference| from the module {difference:.2g}")
    training = training_rows(tokenizer, docs, args.check_steps, block)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        losses, trained = trainable.train(training, CHECK_LR, Path(directory) / "params.f64")
    seconds = time.perf_counter() - started
    module_losses, module_params = module_steps(net, training, CHECK_LR)
    tenth = max(1, len(losses) // 10)
    print(f"check: {trainable.program.name} ({args.target}), {len(training):,} SGD steps (lr {CHECK_LR}) in "
          f"{seconds:.1f} s: mean loss {np.mean(losses[:tenth]):.4f} over the first tenth, "
          f"{np.mean(losses[-tenth:]):.4f} over the last; max relative loss difference "
          f"{np.max(np.abs(losses - module_losses) / module_losses):.2g}, max |parameter difference| "
          f"{np.max(np.abs(trained - module_params)):.2g}")
    bad = rows[:1].copy()
    bad[0, 0] = tokenizer.vocab_size
    try:
        frozen.predict(bad)
        refused = "not refused"
    except targets.ProgramFailed as error:
        refused = str(error).rpartition(": row 0: ")[2]
    print(f"check: token {tokenizer.vocab_size} (out of range): {refused}")
    if difference > OUTPUT_BOUND or not losses_agree(losses, module_losses) or refused == "not refused":
        raise ValueError(f"the {args.target} build disagrees with the compiled module")


if __name__ == "__main__":
    sys.exit(main())
