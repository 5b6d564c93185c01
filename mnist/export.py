"""`make export`: the trained MNIST classifier as plain C files with no Python.

    python -m mnist.export --load build/mnist_params.npz [--out build/export] [--check-compiler tcc]
    python -m mnist.export --load build/mnist_params.npz --target aarch64-linux-musl

Writes OUT/mnist.c and OUT/mnist.h (frozen: mnist_predict(const double *in, double *out), the
784 pixels scaled to [0, 1] in, the 10 logits out, the weights constants in the code),
OUT/mnist_train.c and OUT/mnist_train.h (the trainable step, starting from these parameters) and
OUT/freestanding/ (math.h, string.h for builds with no libc). Then it builds mnist.c with
--check-compiler as a shared library, runs it on the 10,000 test images through cffi and prints
its accuracy and how far its logits are from the compiled module's. With --target (a zig triple,
codegen.backend.targets.TARGETS), it also builds both for that machine with zig cc (OUT/<target>/:
libmnist.a and the program mnist, libmnist_train.a and mnist_train), and the check runs them
there (under qemu-user on another machine): the frozen program on the test images, against the
module's predictions, and the trainable one for --check-steps SGD steps, against the module's.
"""
import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cffi
import numpy as np

import codegen
from codegen.backend import toolchain
from codegen.export import OUTPUT_BOUND, losses_agree, module_steps

from .data import DataError, load_mnist
from .model import DEFAULT_LR, N_CLASSES, N_PIXELS, PIXEL_SCALE, build_graph
from .options import add_data_dir_argument
from .train import UsageError, check_saved_size, describe, read_saved


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", type=Path, required=True, metavar="PATH.npz",
                        help="parameters saved by `python -m mnist.train --save`")
    parser.add_argument("--out", type=Path, default=Path("build/export"), help="directory for the C files")
    parser.add_argument("--name", default="mnist", help="C name prefix of the frozen classifier (default mnist)")
    parser.add_argument("--check-compiler", default="tcc",
                        help="compiler that builds mnist.c for the check (default tcc: the straight-line code "
                             "of 40,000 constants takes gcc -O2 about 40 s); 'none' skips the check")
    parser.add_argument("--target", default=None,
                        help="also build both for this machine with zig cc, and check them there (under qemu-user "
                             "elsewhere): " + ", ".join(codegen.backend.targets.TARGETS))
    parser.add_argument("--target-opt", type=int, default=2, choices=range(4),
                        help="zig cc's -O level for --target (default 2)")
    parser.add_argument("--check-images", type=int, default=10_000, metavar="N",
                        help="test images the check classifies (default all 10,000)")
    parser.add_argument("--check-steps", type=int, default=1000, metavar="N",
                        help="SGD steps the --target check trains (default 1000)")
    add_data_dir_argument(parser)
    args = parser.parse_args(argv)
    try:
        run(args)
    except (UsageError, DataError, toolchain.ToolchainError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def run(args):
    saved = read_saved(args.load)
    graph = build_graph(0, hidden=saved["hidden"], activation=saved["activation"])
    check_saved_size(saved, graph.model)
    params, epochs = graph.params, saved["epochs"]
    for p, value in zip(params, saved["params"]):
        p.data = float(value)
    started = time.perf_counter()
    build = {"target": args.target, "opt": args.target_opt}
    frozen = codegen.export(graph.loss, graph.pixels, params, graph.logits, path=args.out, name=args.name,
                            frozen=True, **build)
    trainable = codegen.export(graph.loss, graph.pixels + graph.targets, params, graph.logits, path=args.out,
                               name=f"{args.name}_train", **build)
    print(f"exported {describe(graph.model)} ({epochs} epoch(s) trained) in {time.perf_counter() - started:.1f} s:")
    for exported in (frozen, trainable):
        for path in (exported.source, exported.header):
            print(f"  {path}  {path.stat().st_size:,} bytes")
    print(f"  {frozen.freestanding}/  math.h, string.h for builds with no libc")
    if args.target:
        for exported in (frozen, trainable):
            b = exported.build
            print(f"  {b.library}, {b.program}  built by zig cc -O{args.target_opt} in {b.seconds:.1f} s")
        print(f"  vectors on {args.target}: {frozen.build.target.vectors}")
        if args.check_compiler != "none":
            check_target(frozen, trainable, graph, args)
    elif args.check_compiler != "none":
        check(frozen, args.name, graph, args)


def check(exported, name, graph, args):
    """Builds the frozen C as a shared library and compares it with the module on the test set."""
    compiler = toolchain.find_compiler(args.check_compiler)
    _, _, test_X, test_Y = load_mnist(args.data_dir)
    with tempfile.TemporaryDirectory() as directory:  # a one-off build: not kept in the build cache
        # the C file is compiled where the build puts it: its header must be beside it
        shutil.copy(exported.header, directory)
        build = toolchain.build_library(exported.source.read_text(), name, compiler, opt=2, cache=Path(directory))
        build_seconds = build.seconds
        ffi = cffi.FFI()
        ffi.cdef(f"int {name}_predict(const double *in, double *out);")
        lib = ffi.dlopen(str(build.path))
        predict = getattr(lib, f"{name}_predict")
        pixels = np.ascontiguousarray(test_X * PIXEL_SCALE, dtype=np.float64)
        logits = np.empty((len(pixels), 10))
        started = time.perf_counter()
        for i in range(len(pixels)):
            predict(ffi.from_buffer("double[]", pixels[i]), ffi.from_buffer("double[]", logits[i]))
        seconds = time.perf_counter() - started
    net = graph.compile()
    expected = np.asarray(net.predict(test_X, scale=PIXEL_SCALE))
    accuracy = np.mean(logits.argmax(axis=1) == test_Y)
    agree = np.mean(logits.argmax(axis=1) == expected.argmax(axis=1))
    print(f"check: {exported.source.name} built by {Path(compiler.argv[0]).name} in {build_seconds:.1f} s; "
          f"{len(pixels):,} test images in {seconds:.2f} s: accuracy {accuracy:.2%}, same class as the module "
          f"for {agree:.2%}, max |logit difference| {np.max(np.abs(logits - expected)):.2g}")
    if agree != 1.0:
        raise ValueError("the exported classifier disagrees with the compiled module")


def target_predictions(build, images):
    """The frozen program's logits for uint8 images, a row each."""
    return build.predict(images * PIXEL_SCALE)


def training_rows(images, labels):
    """The trainable program's rows: the scaled pixels, then the one-hot label."""
    rows = np.zeros((len(images), N_PIXELS + N_CLASSES))
    rows[:, :N_PIXELS] = images * PIXEL_SCALE
    rows[np.arange(len(rows)), N_PIXELS + labels.astype(int)] = 1.0
    return rows


def check_target(frozen, trainable, graph, args):
    """The target's programs against the module: classes and logits on the test images, losses and
    parameters over --check-steps SGD steps."""
    train_X, train_Y, test_X, test_Y = load_mnist(args.data_dir)
    images = test_X[:args.check_images]
    started = time.perf_counter()
    logits = target_predictions(frozen.build, images)
    seconds = time.perf_counter() - started
    expected = np.asarray(graph.compile().predict(images, scale=PIXEL_SCALE))
    agree = np.mean(logits.argmax(axis=1) == expected.argmax(axis=1))
    logit_difference = np.max(np.abs(logits - expected))
    print(f"check: {frozen.build.program.name} ({args.target}) on {len(images):,} test images in {seconds:.1f} s: "
          f"accuracy {np.mean(logits.argmax(axis=1) == test_Y[:len(images)]):.2%}, same class as the module for "
          f"{agree:.2%}, max |logit difference| {logit_difference:.2g}")
    rows, lr = training_rows(train_X[:args.check_steps], train_Y[:args.check_steps]), DEFAULT_LR["sgd"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as directory:
        losses, params = trainable.build.train(rows, lr, Path(directory) / "params.f64")
    seconds = time.perf_counter() - started
    module_losses, module_params = module_steps(graph.compile(), rows, lr)
    print(f"check: {trainable.build.program.name} ({args.target}), {len(rows):,} SGD steps (lr {lr}) in "
          f"{seconds:.1f} s: max relative loss difference {np.max(np.abs(losses - module_losses) / module_losses):.2g}"
          f", max |loss difference| {np.max(np.abs(losses - module_losses)):.2g}, max |parameter difference| "
          f"{np.max(np.abs(params - module_params)):.2g}")
    if agree != 1.0 or logit_difference > OUTPUT_BOUND or not losses_agree(losses, module_losses):
        raise ValueError(f"the {args.target} build disagrees with the compiled module")


if __name__ == "__main__":
    sys.exit(main())
