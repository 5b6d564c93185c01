"""`make mnist`: train micrograd's MLP(784, [50, 10]) on MNIST through its compiled training step.

    python -m mnist.train [--epochs 1] [--lr 0.03] [--compiler gcc] [--opt 2] [--limit N] ...

The images go to the compiled module's train() in chunks, so that a progress bar can follow;
the test accuracy is measured after every epoch and a summary of the timings ends the run.
"""

import argparse
import json
import math
import statistics
import sys
import sysconfig
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

import codegen
from codegen import loader, toolchain

from .data import DataError, load_mnist
from .resources import process_peak_rss
from .model import INITS, PIXEL_SCALE, build_graph, image_loss, sgd_step

# Images per train() call: the call costs microseconds, the chunk milliseconds, so the progress
# bar updates often at no measurable cost. Batches never span two chunks: a --batch-size that
# divides it keeps every batch full.
CHUNK = 2000


class UsageError(Exception):
    """Bad options or files; main() prints the message as one line."""


@dataclass
class Origin:
    """Where the compiled module came from, for the summary."""
    how: str              # e.g. "compiled", "from the build cache"
    codegen_seconds: float
    compile: str          # compile seconds, or why there were none
    compiler: str         # compiler and flags


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except (UsageError, DataError, codegen.ToolchainError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(1), default=1, help="passes over the training set (default 1)")
    parser.add_argument("--lr", type=float, default=0.03, help="learning rate (default 0.03)")
    parser.add_argument("--init", choices=INITS, default="he",
                        help="he (default): micrograd's uniform(-1, 1) draws scaled by sqrt(6 / fan-in); "
                             "micrograd: its init unchanged (trains slower: ~93%% after one epoch)")
    parser.add_argument("--schedule", choices=("linear", "constant"), default="linear",
                        help="linear (default): the rate falls from --lr to 0 over the whole run, set per "
                             "chunk of %d images; constant: --lr throughout" % CHUNK)
    parser.add_argument("--batch-size", type=at_least(1), default=1,
                        help="images per SGD step, which follows their mean gradient (default 1)")
    parser.add_argument("--seed", type=at_least(0), default=0,
                        help="random.seed for the initial weights, and the shuffle of every epoch (default 0)")
    parser.add_argument("--compiler", default=None, help="tcc, gcc, clang or a command (default: $CC, else gcc)")
    parser.add_argument("--opt", type=int, default=2, choices=range(4), help="-O level (default 2)")
    parser.add_argument("--native", action="store_true", help="add -march=native (gcc/clang)")
    parser.add_argument("--scalar", action="store_true", help="pure straight-line scalar code, no fused dots")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="the MNIST files (default: $MNIST_DIR, else ~/.cache/micrograd_c/mnist)")
    parser.add_argument("--no-download", action="store_true", help="fail instead of downloading missing files")
    parser.add_argument("--limit", type=at_least(1), metavar="N", help="train on the first N training images only")
    parser.add_argument("--save", type=Path, metavar="PATH.npz", help="save the trained parameters")
    parser.add_argument("--load", type=Path, metavar="PATH.npz", help="start from parameters saved by --save")
    parser.add_argument("--eval-only", action="store_true", help="only measure the test accuracy, no training")
    parser.add_argument("--interpreted", type=at_least(0), default=0, metavar="N",
                        help="also train pure-Python micrograd_c on N images, to compare speeds (default 0: skip)")
    parser.add_argument("--module-dir", type=Path, default=Path("build"),
                        help="use the nn module `make` built there if its C files are what these options "
                             "generate (default build)")
    args = parser.parse_args(argv)
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"argument --lr: must be a positive number, got {args.lr}")
    return args


def at_least(minimum):
    """An argparse type: an int >= minimum."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def run(args):
    # Cheap checks first: a bad --load or a missing compiler fails before any download.
    graph = build_graph(args.seed, init=args.init)
    epochs_before = load_params(args.load, graph.model) if args.load else 0
    net, origin = compiled_module(graph, args)
    print(f"module: {origin.how}; codegen {origin.codegen_seconds:.2f} s, compile {origin.compile} ({origin.compiler})")
    summary = [
        ("model", f"{describe(graph.model)}, {net.n_params:,} parameters, seed {args.seed}"),
        ("module", origin.how),
        ("codegen", f"{origin.codegen_seconds:.2f} s"),
        ("compile", origin.compile),
        ("compiler", origin.compiler),
    ]
    train_images, train_labels, test_images, test_labels = load_mnist(args.data_dir, not args.no_download)
    train_images, train_labels = train_images[:args.limit], train_labels[:args.limit]
    n_train = len(train_images)

    epochs_trained, per_epoch = 0, None
    if args.eval_only:
        accuracy = test_accuracy(net, test_images, test_labels)
    else:
        epoch_seconds, accuracy = train(net, args, train_images, train_labels, test_images, test_labels)
        epochs_trained, per_epoch = len(epoch_seconds), statistics.median(epoch_seconds)
        summary += [
            ("training", f"{args.epochs} epoch(s) x {n_train:,} images, lr {args.lr:g} ({args.schedule}), "
                         f"batch {args.batch_size}"),
            ("s/epoch", f"{per_epoch:.2f} (median of {args.epochs})"),
            ("images/s", f"{n_train / per_epoch:,.0f}"),
        ]
    summary.append(("test accuracy", f"{accuracy:.2%} of {len(test_images):,} images"))
    if args.save:
        save_params(args.save, net, args.seed, layer_sizes(graph.model)[:-1], epochs_before + epochs_trained)
    if args.interpreted:
        summary.append(("interpreted", compare_interpreted(graph.model, train_images[:args.interpreted],
                                                           train_labels[:args.interpreted], args.lr, n_train,
                                                           per_epoch)))
    print_summary(summary)


def print_summary(rows):
    """The (label, value) rows as a table, and the process's peak memory so far."""
    peak_rss = process_peak_rss()
    rows = [*rows, ("peak RSS", f"{peak_rss / 2**20:,.0f} MiB")]
    width = max(len(label) for label, _ in rows)
    print("\nsummary")
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def compiled_module(graph, args):
    """The module and its Origin: the one `make` built in --module-dir if its C files are those
    these options generate, else compiled now (or taken from the build cache). It holds the
    model's current parameters."""
    fuse = not args.scalar
    compiler = toolchain.find_compiler(args.compiler)
    try:
        flags = " ".join(toolchain.compile_flags(compiler, args.opt, args.native))
    except ValueError as error:  # flags the compiler cannot take, e.g. --native with tcc
        raise UsageError(error) from error
    prebuilt = args.module_dir / ("nn" + sysconfig.get_config_var("EXT_SUFFIX"))
    recorded = build_record(args.module_dir)
    if prebuilt.is_file() and recorded.get("compiler") == list(compiler.argv) and \
            recorded.get("opt") == args.opt and recorded.get("native") == args.native:
        started = time.perf_counter()
        sources = graph.generate(fuse=fuse)  # the module, then any extra units: nn.c, nn.1.c, nn.2.c...
        codegen_seconds = time.perf_counter() - started
        c_files = [args.module_dir / toolchain.unit_file_name("nn", i) for i in range(len(sources))]
        if all(c.is_file() and c.read_text() == source for c, source in zip(c_files, sources)):
            net = loader.load_extension(prebuilt, "nn")
            codegen.copy_from_values(net, graph.model.parameters())
            compile_time = "cached" if recorded.get("cached") else f"{recorded.get('compile_seconds', 0):.2f} s"
            return net, Origin(f"prebuilt {prebuilt} (`make`; its C files match these options)", codegen_seconds,
                               f"{compile_time} (by `make`)", f"{Path(compiler.argv[0]).name} {flags}")
    net = graph.compile(compiler=compiler, opt=args.opt, native=args.native, fuse=fuse)
    return net, Origin("from the build cache" if net.build.cached else "compiled", net.timings["codegen"],
                       "cached" if net.build.cached else f"{net.timings['compile']:.2f} s",
                       f"{Path(compiler.argv[0]).name} {flags}")


def build_record(module_dir):
    """What `make` recorded of how it built the module in module_dir ({} if nothing)."""
    try:
        return json.loads((module_dir / "nn.json").read_text())
    except (OSError, ValueError):
        return {}


def train(net, args, train_images, train_labels, test_images, test_labels):
    """Trains for args.epochs; returns each epoch's training seconds and the final test accuracy."""
    shuffle = np.random.default_rng(args.seed)
    n = len(train_images)
    epoch_seconds = []
    for epoch in range(args.epochs):
        order = shuffle.permutation(n)
        loss_sum = 0.0
        with tqdm(total=n, unit="img", desc=f"epoch {epoch + 1}/{args.epochs}") as bar:
            started = time.perf_counter()
            for start in range(0, n, CHUNK):
                rows = order[start:start + CHUNK]
                lr = learning_rate(args, done=epoch * n + start, total=args.epochs * n)
                loss_sum += len(rows) * net.train(train_images[rows], train_labels[rows], lr, scale=PIXEL_SCALE,
                                                  batch_size=args.batch_size)
                bar.set_postfix(loss=f"{loss_sum / (start + len(rows)):.4f}", refresh=False)
                bar.update(len(rows))
            epoch_seconds.append(time.perf_counter() - started)
        accuracy = test_accuracy(net, test_images, test_labels)
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / n:.4f}, test accuracy {accuracy:.2%}, "
              f"{epoch_seconds[-1]:.2f} s")
    return epoch_seconds, accuracy


def learning_rate(args, done, total):
    """The rate for the next chunk, after `done` of the run's `total` images."""
    return args.lr * (1 - done / total) if args.schedule == "linear" else args.lr


def test_accuracy(net, images, labels):
    """The fraction of images whose largest logit is at their label."""
    logits = np.asarray(net.predict(images, scale=PIXEL_SCALE))
    return float((logits.argmax(axis=1) == labels).mean())


def compare_interpreted(model, images, labels, lr, n_train, compiled_epoch):
    """Trains pure-Python micrograd_c on the images, one SGD step each, and sets its speed against
    the compiled module's seconds per epoch of n_train images (None: not measured)."""
    started = time.perf_counter()
    for pixels, label in tqdm(zip(images, labels), total=len(images), unit="img", desc="interpreted"):
        sgd_step(model, image_loss(model, pixels, label), lr)
    per_image = (time.perf_counter() - started) / len(images)
    comparison = (f"{1 / per_image:.2f} images/s, so {per_image * n_train:,.0f} s/epoch "
                  f"(timed on the first {len(images)} training images)")
    if compiled_epoch:
        comparison += f"; compiled is {per_image * n_train / compiled_epoch:,.0f}x faster"
    return comparison


def layer_sizes(model):
    return [len(layer.neurons) for layer in model.layers]


def describe(model):
    """e.g. 'MLP(784, [50, 10])'."""
    return f"MLP({len(model.layers[0].neurons[0].w)}, {layer_sizes(model)})"


def save_params(path, net, seed, hidden, epochs):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, params=np.asarray(net.params), seed=seed, hidden=hidden, epochs=epochs)
    except OSError as error:
        raise UsageError(f"cannot save the parameters: {error}") from error
    print(f"saved the parameters ({epochs} epoch(s) of training) to {path}")


def load_params(path, model):
    """Sets the model's parameters to those saved in path; returns the epochs they were trained for."""
    try:
        with np.load(path) as saved:
            values, epochs = saved["params"], int(saved["epochs"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise UsageError(f"{path}: not a parameter file saved by --save: {error}") from error
    params = model.parameters()
    if values.shape != (len(params),):
        raise UsageError(f"{path} holds {values.size:,} parameters but {describe(model)} has {len(params):,}: "
                         f"it was saved from a different model")
    for value, data in zip(params, values):
        value.data = float(data)
    return epochs


if __name__ == "__main__":
    sys.exit(main())
