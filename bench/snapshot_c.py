"""The generated C of the zoo and MNIST models, one file per model and options: to check that a
change to lowering leaves the C byte-identical (run it before and after, then --compare).

    python -m bench.snapshot_c DIR                 # write DIR/<model>.c
    python -m bench.snapshot_c DIR --compare OLD   # and say which differ from OLD/<model>.c
"""
import argparse
import pathlib
import sys

import codegen
from mnist import model as mnist_model

from . import models


def sources():
    """(label, C sources) of each model and set of options."""
    for name, build in models.MODELS.items():
        m = build()
        for fuse in (True, False):
            if fuse or name != "cnn":  # the scalar CNN is slow to generate and adds nothing
                yield f"zoo-{name}-fuse{fuse}", codegen.generate(m.loss, m.inputs, m.params, m.outputs, fuse=fuse)
        yield f"zoo-{name}-f32-adam-sparse", codegen.generate(
            m.loss, m.inputs, m.params, m.outputs, dtype="float32", optimizer=codegen.Adam(), sparse_inputs=True,
            embed_params=True, input_grads=True)
    for hidden in ([50], [128, 64], [512, 256]):
        graph = mnist_model.build_graph(hidden=hidden, init="he")
        label = "-".join(map(str, hidden))
        yield f"mnist-{label}-f32", graph.generate(dtype="float32")
        if hidden == [50]:
            yield f"mnist-{label}-f64-sparse-adam", graph.generate(sparse_inputs=True, optimizer=codegen.Adam())
            yield f"mnist-{label}-tanh", mnist_model.build_graph(hidden=hidden, activation="tanh").generate()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.snapshot_c", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--compare", type=pathlib.Path, metavar="OLD", help="an earlier snapshot to diff against")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    differ = 0
    for label, units in sources():
        path = args.out / f"{label}.c"
        path.write_text("\n/* unit */\n".join(units))
        if args.compare is not None:
            old = args.compare / path.name
            same = old.exists() and old.read_bytes() == path.read_bytes()
            differ += not same
            print(f"{'same' if same else 'DIFFERS'}  {label}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
