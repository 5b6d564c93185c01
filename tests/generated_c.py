"""Writes the C this project generates for MNIST and the model zoo into a directory, to compare a
refactoring's output byte for byte with the code before it:

    .venv/bin/python tests/generated_c.py /tmp/before     # on the old commit
    .venv/bin/python tests/generated_c.py /tmp/after      # on the new one
    diff -r /tmp/before /tmp/after

MNIST's MLP(784, [50, 10]) in float64 and float32, dense and sparse, with Adam, with momentum and
embedded parameters, in scalar mode; each zoo model (bench/models.py) in both dtypes; a small
microgpt (gpt/); a jit function; the demo exported trainable and frozen.
"""
import pathlib
import random
import sys
import tempfile

import codegen
import templates
from bench import models
from codegen.lower import ir
from codegen.write import dtypes
from codegen.jit import jit_source
from gpt import model as gpt_model
from micrograd_c import Value
from mnist.model import build_graph


def main(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)

    def save(name, sources):
        for i, source in enumerate(sources):
            # units that some compilers build with flags of their own are named so (a change of flags shows)
            kind = (".straight-line" if isinstance(source, templates.StraightLineSource)
                    else f".loops{source.lane_bytes or ''}" if isinstance(source, templates.LoopSource) else "")
            (out / f"{name}.{i}{kind}.c").write_text(source)

    graph = build_graph(0, (50,), init="he")
    for dtype in dtypes.NAMES:
        for sparse in (False, True):
            save(f"mnist-{dtype}-{'sparse' if sparse else 'dense'}", graph.generate(dtype=dtype, sparse_inputs=sparse))
        save(f"mnist-{dtype}-adam", graph.generate(dtype=dtype, optimizer=codegen.Adam()))
        save(f"mnist-{dtype}-momentum-embed", graph.generate(dtype=dtype, optimizer=codegen.SGD(momentum=0.9),
                                                             embed_params=True))
    save("mnist-scalar", graph.generate(fuse=False))
    for name, make in models.MODELS.items():
        model = make()
        for dtype in dtypes.NAMES:
            save(f"zoo-{name}-{dtype}", codegen.generate(model.loss, model.inputs, model.params, model.outputs,
                                                         dtype=dtype))
    random.seed(42)  # microgpt (gpt/): a small configuration, every length in one graph, tokens as inputs
    config = gpt_model.Config(n_embd=8, n_head=2, n_layer=1, block_size=8)
    state, params = gpt_model.init_state(config, 27)
    document = gpt_model.document(state, config)
    save("gpt", codegen.generate(document.loss, document.inputs, params, document.outputs,
                                 optimizer=codegen.Adam(betas=(0.85, 0.99))))
    a, b, c = Value(1.0), Value(2.0), Value(3.0)
    f = (-a + b * (c - a / b)).exp().log() + (a ** 3).tanh()
    save("jit", [jit_source(ir.lower(f, [a, b, c], (), input_grads=True))])
    demo = models.MODELS["demo"]()
    for frozen in (False, True):
        with tempfile.TemporaryDirectory() as directory:
            codegen.export(demo.loss, demo.inputs, demo.params, demo.outputs, path=directory, name="demo",
                           frozen=frozen)
            for path in sorted(pathlib.Path(directory).rglob("*.[ch]")):
                relative = path.relative_to(directory).as_posix().replace("/", "_")
                (out / f"export-{'frozen' if frozen else 'trainable'}-{relative}").write_text(path.read_text())
    print(f"{len(list(out.iterdir()))} files in {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "generated_c")
