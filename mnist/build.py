"""`make`: generate and build the MNIST model's module as `nn` in a directory (default build/),
so that a script can `sys.path.insert(0, "build"); import nn` and train it: the module starts from
the model's initial parameters (he init, --seed), baked into its C.

    python -m mnist.build [--compiler gcc] [--opt 2] [--native] [--scalar] [--out build]
                          [--hidden 50] [--activation relu] [--optimizer sgd] ...
"""

import argparse
import sys
import time
from pathlib import Path

import codegen
from codegen.backend import toolchain

from .model import add_model_arguments, build_graph, model_options
from .options import add_compiler_arguments, compiler_options, which_compiler


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compiler_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="random.seed for the initial weights")
    parser.add_argument("--out", type=Path, default=Path("build"))
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    try:
        optimizer = model_options(args)
    except (TypeError, ValueError) as error:
        parser.error(str(error))

    started = time.perf_counter()
    try:
        print(which_compiler(args))
    except codegen.CompilerNotFound as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    graph = build_graph(args.seed, hidden=args.hidden, init=args.init, activation=args.activation)
    try:
        net = graph.compile(**compiler_options(args), optimizer=optimizer, embed_params=True, dtype=args.dtype,
                            tiered=False)  # (the optimised build is what it installs)
    except (codegen.ToolchainError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    target = install(net, "nn", args.out, args.compiler, args.opt, args.native)
    how = "from the cache" if net.build.cached else f"compiled in {net.build.seconds:.2f} s"
    print(f"{target}: {net.n_params} params, {net.n_slots} slots, {net.optimizer}; codegen "
          f"{net.timings['codegen']:.2f} s, {how} ({' '.join(net.build.command)}); total "
          f"{time.perf_counter() - started:.2f} s")
    return 0


def install(net, name, out, compiler, opt, native):
    """Copies the built module `net` out of the build cache into `out` as `name` (toolchain.export_build:
    the module, its C files and out/<name>.json, which records its cache key, so that a script
    finds it with toolchain.find_build only if it is the build it asks for). Returns the module's path."""
    record = {"compiler": list(toolchain.find_compiler(compiler).argv), "opt": opt, "native": native}
    return toolchain.export_build(net.build, out, name, record=record).path


if __name__ == "__main__":
    sys.exit(main())
