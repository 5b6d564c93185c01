"""`make`: generate and build the MNIST model's module as `nn` in a directory (default build/),
so that a script can `sys.path.insert(0, "build"); import nn` and train it: the module starts from
the model's initial parameters (he init, --seed), baked into its C.

    python -m mnist.build [--compiler gcc] [--opt 2] [--native] [--scalar] [--out build]
                          [--hidden 50] [--activation relu] [--optimizer sgd] ...
"""

import argparse
import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import codegen
from codegen import toolchain

from .model import add_model_arguments, build_graph, model_options


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiler", default=None, help="tcc, gcc, clang or a command (default: $CC, else gcc)")
    parser.add_argument("--opt", type=int, default=2, choices=range(4), help="-O level (default 2)")
    parser.add_argument("--native", action="store_true", help="add -march=native (gcc/clang)")
    parser.add_argument("--scalar", action="store_true", help="pure straight-line scalar code, no fused dots")
    parser.add_argument("--seed", type=int, default=0, help="random.seed for the initial weights")
    parser.add_argument("--out", type=Path, default=Path("build"))
    add_model_arguments(parser)
    args = parser.parse_args(argv)
    try:
        optimizer = model_options(args)
    except (TypeError, ValueError) as error:
        parser.error(str(error))

    started = time.perf_counter()
    graph = build_graph(args.seed, hidden=args.hidden, init=args.init, activation=args.activation)
    try:
        net = graph.compile(compiler=args.compiler, opt=args.opt, native=args.native, fuse=not args.scalar,
                            optimizer=optimizer, embed_params=True, dtype=args.dtype)
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
    """Copies the built module `net` to out/<name><EXT_SUFFIX>, its C files to out/<name>.c (and
    <name>.1.c...), and records how it was built in out/<name>.json, so that a script can tell
    whether this module is the one it asks for. Returns the module's path."""
    out.mkdir(parents=True, exist_ok=True)
    stem = net.build.source.stem
    for source in sorted(net.build.source.parent.glob(stem + "*.c")):  # nn.c, nn.1.c...
        shutil.copyfile(source, out / source.name.replace(stem, name))
    (out / f"{name}.json").write_text(json.dumps({
        "compiler": list(toolchain.find_compiler(compiler).argv), "opt": opt, "native": native,
        "command": list(net.build.command), "compile_seconds": net.build.seconds,
        "cached": net.build.cached}, indent=1))
    target = out / (name + sysconfig.get_config_var("EXT_SUFFIX"))
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(net.build.path, tmp)
    tmp.replace(target)
    return target


if __name__ == "__main__":
    sys.exit(main())
