"""`make mnist`: train micrograd's MLP(784, [50, 10]) on MNIST through its compiled training step.

    python -m mnist.train [--epochs 1] [--lr 0.03] [--compiler gcc] [--opt 2] [--limit N] ...
    python -m mnist.train --hidden 128 64 --optimizer adam --epochs 3 --plot loss.png
    mpiexec -n 4 python -m mnist.train --distributed --batch-size 128 ...   (docs/distributed.md)

The images go to the compiled module's train() in chunks, so that a progress bar can follow;
the test accuracy is measured after every epoch and a summary of the timings ends the run.
"""

import argparse
import math
import os
import statistics
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

import codegen
from codegen import distributed
from codegen.backend import loader, toolchain

from .data import DataError, load_mnist
from .model import (DEFAULT_LR, MODEL_DEFAULTS, PIXEL_SCALE, add_model_arguments, at_least, build_graph,
                    image_loss, model_options, sgd_step)
from .options import add_compiler_arguments, add_data_dir_argument, compiler_options
from .resources import process_peak_rss

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
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default: sgd 0.03, momentum 0.003, adam and adamw 0.001)")
    add_model_arguments(parser)
    parser.add_argument("--schedule", choices=("linear", "constant"), default="linear",
                        help="linear (default): the rate falls from --lr to 0 over the whole run, set per "
                             "chunk of %d images; constant: --lr throughout" % CHUNK)
    parser.add_argument("--batch-size", type=at_least(1), default=1,
                        help="images per optimizer step, which follows their mean gradient (default 1)")
    parser.add_argument("--distributed", action="store_true",
                        help="data-parallel over the MPI processes this runs in (mpiexec -n N python -m mnist.train "
                             "--distributed ...): each takes its share of every batch; rank 0 alone prints, "
                             "evaluates and saves (needs mpi4py: pip install micrograd-c[mpi])")
    parser.add_argument("--rank-timeout", type=float, default=None, metavar="S",
                        help="with --distributed: seconds a process waits for the others before it aborts the run "
                             "(default: no bound; a process that dies ends the run anyway). Rank 0's evaluation "
                             "after each epoch keeps the others waiting: leave room for it")
    parser.add_argument("--threads", type=at_least(1), default=None,
                        help="threads a batch's matrix products run on (default: every core this process may use)")
    parser.add_argument("--seed", type=at_least(0), default=0,
                        help="random.seed for the initial weights, and the shuffle of every epoch (default 0)")
    add_compiler_arguments(parser)
    add_data_dir_argument(parser)
    parser.add_argument("--no-download", action="store_true", help="fail instead of downloading missing files")
    parser.add_argument("--limit", type=at_least(1), metavar="N", help="train on the first N training images only")
    parser.add_argument("--save", type=Path, metavar="PATH.npz",
                        help="save the trained parameters, the architecture and the optimizer's state")
    parser.add_argument("--load", type=Path, metavar="PATH.npz",
                        help="start from a file saved by --save (its architecture and optimizer, unless given)")
    parser.add_argument("--plot", type=Path, metavar="PATH.png",
                        help="draw the training loss (per chunk) and the test accuracy (per epoch) (matplotlib)")
    parser.add_argument("--eval-only", action="store_true", help="only measure the test accuracy, no training")
    parser.add_argument("--interpreted", type=at_least(0), default=0, metavar="N",
                        help="also train pure-Python micrograd_c on N images, to compare speeds (default 0: skip)")
    parser.add_argument("--module-dir", type=Path, default=Path("build"),
                        help="use the nn module `make` built there if it is the build of what these options "
                             "generate (default build)")
    args = parser.parse_args(argv)
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"argument --lr: must be a positive number, got {args.lr}")
    return args


def run(args):
    args.comm = mpi_world() if args.distributed else None
    args.leader = args.comm is None or args.comm.Get_rank() == 0
    if not args.leader:  # the other ranks stay quiet: their output would repeat rank 0's
        sys.stdout = open(os.devnull, "w")
    # Cheap checks first: a bad --load or --plot, or a missing compiler, fails before any download.
    saved = read_saved(args.load) if args.load else None
    optimizer = resolve_model_options(args, saved)
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    if args.plot:
        check_plotting()
    graph = build_graph(args.seed, hidden=args.hidden, init=args.init, activation=args.activation)
    if saved:
        check_saved_size(saved, graph.model)
    if args.comm is None:
        net, origin = compiled_module(graph, args, optimizer)
    else:  # rank 0 builds; then the others find its build in the cache instead of compiling it too
        if args.leader:
            net, origin = compiled_module(graph, args, optimizer)
        args.comm.Barrier()
        if not args.leader:
            net, origin = compiled_module(graph, args, optimizer)
    net.set_threads(args.threads if args.threads or not args.comm else threads_per_process(args.comm))
    epochs_before = restore(saved, net) if saved else 0
    codegen.copy_to_values(net, graph.params)  # --interpreted starts where the module does
    print(f"module: {origin.how}; codegen {origin.codegen_seconds:.2f} s, compile {origin.compile} ({origin.compiler})")
    summary = [
        ("model", f"{describe(graph.model)}, {args.activation}, {net.n_params:,} parameters, {args.dtype}, seed {args.seed}"),
        ("optimizer", net.optimizer),
        ("module", origin.how),
        *([("processes", f"{args.comm.Get_size()} (MPI), each batch shared")] if args.comm else []),
        ("codegen", f"{origin.codegen_seconds:.2f} s"),
        ("compile", origin.compile),
        ("compiler", origin.compiler),
    ]
    train_images, train_labels, test_images, test_labels = load_mnist(args.data_dir, not args.no_download)
    train_images, train_labels = train_images[:args.limit], train_labels[:args.limit]
    n_train = len(train_images)

    epochs_trained, per_epoch = 0, None
    if args.eval_only:
        accuracy = test_accuracy(net, test_images, test_labels) if args.leader else None
    else:
        epoch_seconds, accuracy, history = train(net, args, train_images, train_labels, test_images, test_labels)
        epochs_trained, per_epoch = len(epoch_seconds), statistics.median(epoch_seconds)
        summary += [
            ("training", f"{args.epochs} epoch(s) x {n_train:,} images, lr {args.lr:g} ({args.schedule}), "
                         f"batch {args.batch_size}"
                         + (f", {net.threads()} thread(s)" if args.batch_size > 1 else "")),
            ("s/epoch", f"{per_epoch:.2f} (median of {args.epochs})"),
            ("images/s", f"{n_train / per_epoch:,.0f}"),
        ]
    if not args.leader:
        return
    summary.append(("test accuracy", f"{accuracy:.2%} of {len(test_images):,} images"))
    if args.save:
        save_params(args.save, net, args, epochs_before + epochs_trained)
    if args.plot and not args.eval_only:
        plot(args.plot, history, n_train, f"{describe(graph.model)}, {args.activation}, {net.optimizer}, lr {args.lr:g}")
        summary.append(("plot", str(args.plot)))
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


def built_batch(batch_size):
    """compile()'s `batch` for training in batches of batch_size: that many samples a pass (a pass's
    rows are `batch` values apart whatever the batch: MNIST's MLP(784, [50, 10]) built for 32 trained
    batches of 32 in 0.83x the time of the default 128, and predicted in 0.80x, docs/batches.md); for
    batch-1 training the default, whose passes predict() runs."""
    return min(batch_size, codegen.lower.batch.MAX_CAPACITY) if batch_size > 1 else codegen.lower.batch.DEFAULT_CAPACITY


def compiled_module(graph, args, optimizer):
    """The module and its Origin: the one `make` built in --module-dir if it is the build of the C
    these options generate, with this compiler and flags (its record holds the structure key of
    this graph and options: found without generating the C), else compiled now (or taken from the
    build cache). It holds the model's initial parameters: baked into the prebuilt's C, loaded
    into the other. Its batched passes hold --batch-size samples (built_batch)."""
    options = {**compiler_options(args), "batch": built_batch(args.batch_size)}
    compiler = toolchain.find_compiler(args.compiler)
    try:
        flags = " ".join(toolchain.compile_flags(compiler, args.opt, args.native))
    except ValueError as error:  # flags the compiler cannot take, e.g. --native with tcc
        raise UsageError(error) from error
    prebuilt = None
    if toolchain.export_record(args.module_dir, "nn"):  # else nothing to compare
        started = time.perf_counter()  # the graph's structural key: what `make` recorded, without generating C
        structure = graph.structural_key(fuse=options["fuse"], sparse_inputs=options["sparse_inputs"],
                                         batch=options["batch"], optimizer=optimizer, embed_params=True,
                                         dtype=args.dtype)
        codegen_seconds = time.perf_counter() - started
        prebuilt = toolchain.find_build(args.module_dir, "nn", toolchain.structure_build_key(
            structure, "nn", compiler, args.opt, args.native))
    if prebuilt:
        net = loader.load_extension(prebuilt.path, "nn")
        recorded = prebuilt.record
        compile_time = "cached" if recorded.get("cached") else f"{recorded.get('compile_seconds', 0):.2f} s"
        return net, Origin(f"prebuilt {prebuilt.path} (`make`; the build of these options)", codegen_seconds,
                           f"{compile_time} (by `make`)", f"{Path(compiler.argv[0]).name} {flags}")
    # Not embedded: compile() loads the params from the Values (baking them into the C, as `make`
    # must for `import nn`, made MLP(784, [1024, 1024, 10])'s C compile 8.4 s instead of 1.5)
    net = graph.compile(**{**options, "compiler": compiler}, optimizer=optimizer, dtype=args.dtype)
    return net, Origin("from the build cache" if net.build.cached else "compiled", net.timings["codegen"],
                       "cached" if net.build.cached else f"{net.timings['compile']:.2f} s",
                       f"{Path(compiler.argv[0]).name} {flags}")


def train(net, args, train_images, train_labels, test_images, test_labels):
    """Trains for args.epochs; returns each epoch's training seconds, the final test accuracy and
    the history: (images seen, mean loss) per chunk, (epoch, test accuracy) per epoch."""
    shuffle = np.random.default_rng(args.seed)
    n = len(train_images)
    epoch_seconds = []
    history = {"chunks": [], "epochs": []}
    for epoch in range(args.epochs):
        order = shuffle.permutation(n)
        loss_sum = 0.0
        with tqdm(total=n, unit="img", desc=f"epoch {epoch + 1}/{args.epochs}", disable=not args.leader) as bar:
            started = time.perf_counter()
            for start in range(0, n, CHUNK):
                rows = order[start:start + CHUNK]
                lr = learning_rate(args, done=epoch * n + start, total=args.epochs * n)
                if args.comm is None:
                    chunk_loss = net.train(train_images[rows], train_labels[rows], lr, scale=PIXEL_SCALE,
                                           batch_size=args.batch_size)
                else:
                    chunk_loss = distributed.train(net, train_images[rows], train_labels[rows], lr,
                                                   batch_size=args.batch_size, comm=args.comm, scale=PIXEL_SCALE,
                                                   timeout=args.rank_timeout)
                loss_sum += len(rows) * chunk_loss
                history["chunks"].append((epoch * n + start + len(rows), chunk_loss))
                bar.set_postfix(loss=f"{loss_sum / (start + len(rows)):.4f}", refresh=False)
                bar.update(len(rows))
            epoch_seconds.append(time.perf_counter() - started)
        accuracy = test_accuracy(net, test_images, test_labels) if args.leader else None  # rank 0's to measure
        history["epochs"].append((epoch + 1, accuracy))
        if args.leader:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / n:.4f}, test accuracy {accuracy:.2%}, "
                  f"{epoch_seconds[-1]:.2f} s")
    return epoch_seconds, accuracy, history


def mpi_world():
    """MPI's world communicator, for --distributed."""
    try:
        from mpi4py import MPI
    except ImportError as error:
        raise UsageError(f"--distributed needs mpi4py and an MPI (pip install micrograd-c[mpi]): {error}") from None
    return MPI.COMM_WORLD


def threads_per_process(comm):
    """--distributed's default threads: this machine's cores shared among its processes (more
    threads than cores would only wait for each other)."""
    from mpi4py import MPI
    on_this_machine = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    return max(1, len(os.sched_getaffinity(0)) // on_this_machine)


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


def check_plotting():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib (the project's `plot` extra)") from None


def plot(path, history, n_train, title):
    """The training loss per chunk (against epochs) and the test accuracy per epoch, side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axes, accuracy_axes) = plt.subplots(1, 2, figsize=(11, 4))
    seen, losses = zip(*history["chunks"])
    loss_axes.plot(np.array(seen) / n_train, losses)
    loss_axes.set(xlabel="epoch", ylabel="mean training loss per chunk", yscale="log",
                  title=f"training loss (chunks of {CHUNK:,} images)")
    epochs, accuracies = zip(*history["epochs"])
    accuracy_axes.plot(epochs, [100 * a for a in accuracies], marker="o")
    accuracy_axes.set(xlabel="epoch", ylabel="test accuracy (%)", title="test accuracy after each epoch",
                      xticks=epochs)
    figure.suptitle(title)
    figure.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=100)
    except OSError as error:
        raise UsageError(f"cannot write the plot: {error}") from error
    finally:
        plt.close(figure)
    print(f"plotted the training loss and test accuracy to {path}")


def save_params(path, net, args, epochs):
    """The parameters, the architecture, the optimizer and its state, the seed and the epochs.
    Written atomically (a temporary file beside it, renamed over it): a run killed while saving
    leaves the previous file whole."""
    state = {f"state_{name}": np.asarray(view) for name, view in net.optimizer_state.items()}
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as file:  # a file object: np.savez would add .npz to a name
            np.savez(file, params=np.asarray(net.params), seed=args.seed, hidden=args.hidden,
                     activation=args.activation, optimizer=args.optimizer, optimizer_repr=net.optimizer,
                     epochs=epochs, **state)
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise UsageError(f"cannot save the parameters: {error}") from error
    print(f"saved the parameters and the optimizer state ({epochs} epoch(s) of training) to {path}")


def read_saved(path):
    """The contents of a file saved by --save, as a dict (files from before the architecture and
    optimizer were saved get the defaults they were trained with)."""
    try:
        with np.load(path) as saved:
            contents = {key: saved[key] for key in saved.files}
        contents["params"], contents["epochs"] = contents["params"], int(contents["epochs"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise UsageError(f"{path}: not a parameter file saved by --save: {error}") from error
    contents["path"] = path
    contents["hidden"] = [int(h) for h in contents.get("hidden", MODEL_DEFAULTS["hidden"])]
    contents["activation"] = str(contents.get("activation", MODEL_DEFAULTS["activation"]))
    contents["optimizer"] = str(contents.get("optimizer", MODEL_DEFAULTS["optimizer"]))
    return contents


def resolve_model_options(args, saved):
    """Fills the model options left unset from the --load file (else the defaults) and returns
    the optimizer; options that contradict the file are refused."""
    if saved:
        for name, flag in (("hidden", "--hidden"), ("activation", "--activation"), ("optimizer", "--optimizer")):
            given, theirs = getattr(args, name), saved[name]
            if given is None:
                setattr(args, name, theirs)
            elif given != theirs and not (name == "optimizer" and args.eval_only):
                show = " ".join(map(str, theirs)) if name == "hidden" else theirs
                raise UsageError(f"{saved['path']} was saved from a model with {flag} {show}, not "
                                 f"{' '.join(map(str, given)) if name == 'hidden' else given}: it is from another "
                                 f"model (leave {flag} out to take the file's)")
    try:
        return model_options(args)
    except (TypeError, ValueError) as error:
        raise UsageError(error) from error


def check_saved_size(saved, model):
    values, count = saved["params"], len(model.parameters())
    if values.shape != (count,):
        raise UsageError(f"{saved['path']} holds {values.size:,} parameters but {describe(model)} has {count:,}: "
                         f"it was saved from a different model")


def restore(saved, net):
    """Loads the saved parameters and optimizer state into net; returns the epochs trained."""
    path = saved["path"]
    net.set_params(np.ascontiguousarray(saved["params"], dtype=np.float64))
    for name, view in net.optimizer_state.items():
        if f"state_{name}" not in saved:
            if saved["epochs"]:
                print(f"note: {path} has no optimizer state {name!r}; it starts from zero")
            continue
        np.asarray(view)[:] = saved[f"state_{name}"]
    return saved["epochs"]


if __name__ == "__main__":
    sys.exit(main())
