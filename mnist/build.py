"""`make`: generate and build the MNIST model's module as `nn` in a directory (default build/),
so that a script can `sys.path.insert(0, "build"); import nn`.

    python -m mnist.build [--compiler gcc] [--opt 2] [--native] [--scalar] [--out build]
"""

import argparse
import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path

from codegen import toolchain

from .model import build_graph


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compiler", default=None, help="tcc, gcc, clang or a command (default: $CC, else gcc)")
    parser.add_argument("--opt", type=int, default=2, choices=range(4), help="-O level (default 2)")
    parser.add_argument("--native", action="store_true", help="add -march=native (gcc/clang)")
    parser.add_argument("--scalar", action="store_true", help="pure straight-line scalar code, no fused dots")
    parser.add_argument("--seed", type=int, default=0, help="random.seed for the initial weights")
    parser.add_argument("--out", type=Path, default=Path("build"))
    args = parser.parse_args(argv)

    started = time.perf_counter()
    graph = build_graph(args.seed)
    net = graph.compile(compiler=args.compiler, opt=args.opt, native=args.native, fuse=not args.scalar)
    args.out.mkdir(parents=True, exist_ok=True)
    for source in sorted(net.build.source.parent.glob(net.build.source.stem + "*.c")):  # nn.c, nn.1.c...
        shutil.copyfile(source, args.out / source.name.replace(net.build.source.stem, "nn"))
    # How it was built, so that a script can tell whether this module is the one it asks for.
    (args.out / "nn.json").write_text(json.dumps({
        "compiler": list(toolchain.find_compiler(args.compiler).argv), "opt": args.opt, "native": args.native,
        "command": list(net.build.command), "compile_seconds": net.build.seconds,
        "cached": net.build.cached}, indent=1))
    target = args.out / ("nn" + sysconfig.get_config_var("EXT_SUFFIX"))
    tmp = target.with_name(target.name + ".tmp")
    shutil.copyfile(net.build.path, tmp)
    tmp.replace(target)
    how = "from the cache" if net.build.cached else f"compiled in {net.build.seconds:.2f} s"
    print(f"{target}: {net.n_params} params, {net.n_slots} slots; codegen {net.timings['codegen']:.2f} s, "
          f"{how} ({' '.join(net.build.command)}); total {time.perf_counter() - started:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
