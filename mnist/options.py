"""The command-line options several scripts share, declared once: how to compile the model
(mnist.build, mnist.train, mnist.xor) and where the MNIST files are (mnist.train, mnist.export,
bench)."""
from pathlib import Path


def add_compiler_arguments(parser, native=True):
    """--compiler, --opt, --native (unless native=False), --scalar and --sparse-inputs; compiler_options(args)
    turns them into the keyword arguments of codegen.compile."""
    parser.add_argument("--compiler", default=None,
                        help="tcc, gcc, clang, zig, libtcc or a command (default: $CC, else the first found of "
                             "gcc, clang, zig and tcc)")
    parser.add_argument("--opt", type=int, default=2, choices=range(4), help="-O level (default 2)")
    if native:
        parser.add_argument("--native", action="store_true", help="add -march=native (gcc/clang)")
    parser.add_argument("--scalar", action="store_true", help="pure straight-line scalar code, no fused dots")
    parser.add_argument("--sparse-inputs", action="store_true",
                        help="skip the inputs' zeros (codegen.compile's sparse_inputs): MNIST's pixels are 81%% 0")


def compiler_options(args):
    """codegen.compile's compiler, opt, native, fuse and sparse_inputs, from add_compiler_arguments'
    options."""
    return {"compiler": args.compiler, "opt": args.opt, "native": getattr(args, "native", False),
            "fuse": not args.scalar, "sparse_inputs": args.sparse_inputs}


def which_compiler(args):
    """One line naming the compiler that builds the module, and why that one."""
    import os

    from codegen.backend import toolchain
    if args.compiler:
        return f"compiler: {args.compiler} (--compiler)"
    if os.environ.get("CC"):
        return f"compiler: {os.environ['CC']} ($CC)"
    return (f"compiler: {toolchain.default_compiler_name()}, the first found of "
            f"{', '.join(toolchain.DEFAULT_SEARCH)} (choose with CC=... or --compiler)")


def add_data_dir_argument(parser):
    """--data-dir: the MNIST files (mnist.data.load_mnist's data_dir)."""
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="the MNIST files (default: $MNIST_DIR, else ~/.cache/micrograd_c/mnist, "
                             "downloading what is missing)")
