"""`make export`: the trained MNIST classifier as plain C files with no Python.

    python -m mnist.export --load build/mnist_params.npz [--out build/export] [--check-compiler tcc]

Writes OUT/mnist.c and OUT/mnist.h (frozen: mnist_predict(const double *in, double *out), the
784 pixels scaled to [0, 1] in, the 10 logits out, the weights constants in the code),
OUT/mnist_train.c and OUT/mnist_train.h (the trainable step, starting from these parameters) and
OUT/freestanding/ (math.h, string.h for builds with no libc). Then it builds mnist.c with
--check-compiler as a shared library, runs it on the 10,000 test images through cffi and prints
its accuracy and how far its logits are from the compiled module's.
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
from codegen import toolchain

from .data import DataError, load_mnist
from .model import PIXEL_SCALE, build_graph
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
    frozen = codegen.export(graph.loss, graph.pixels, params, graph.logits, path=args.out, name=args.name,
                            frozen=True)
    trainable = codegen.export(graph.loss, graph.pixels + graph.targets, params, graph.logits, path=args.out,
                               name=f"{args.name}_train")
    print(f"exported {describe(graph.model)} ({epochs} epoch(s) trained) in {time.perf_counter() - started:.1f} s:")
    for exported in (frozen, trainable):
        for path in (exported.source, exported.header):
            print(f"  {path}  {path.stat().st_size:,} bytes")
    print(f"  {frozen.freestanding}/  math.h, string.h for builds with no libc")
    if args.check_compiler != "none":
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
        ffi.cdef(f"void {name}_predict(const double *in, double *out);")
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


if __name__ == "__main__":
    sys.exit(main())
