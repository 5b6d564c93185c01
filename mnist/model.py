"""The workload: micrograd's MLP(784, [50, 10]) with softmax cross-entropy, one image per step;
other hidden layers, activations and optimizers on request (`make mnist` options)."""

import argparse
import math
import random
from dataclasses import dataclass

import codegen
from codegen.write import dtypes
from micrograd_c import MLP, Value, cross_entropy
from micrograd_c.nn import ACTIVATIONS

N_PIXELS, N_CLASSES = 784, 10
PIXEL_SCALE = 1 / 255  # pixels are uint8; the model sees [0, 1]


@dataclass
class Graph:
    model: MLP
    pixels: list    # input Values, one per pixel
    targets: list   # input Values, the one-hot label
    logits: list
    loss: Value
    params: list    # model.parameters(), listed once (a million-parameter model's list takes 0.05 s)

    def compile(self, **options):
        """The compiled training step (codegen.compile options: compiler, opt, native, fuse...)."""
        return codegen.compile(self.loss, self.pixels + self.targets, self.params,
                               outputs=self.logits, **options)

    def structural_key(self, **options):
        """The structural key of the module compile() would build (codegen.structural_key)."""
        return codegen.structural_key(self.loss, self.pixels + self.targets, self.params, outputs=self.logits,
                                      **options)

    def generate(self, **options):
        """The C source compile() would build."""
        return codegen.generate(self.loss, self.pixels + self.targets, self.params,
                                outputs=self.logits, **options)


INITS = ("he", "micrograd")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
# The learning rate each optimizer trains with unless --lr says otherwise (measured, seed 0)
DEFAULT_LR = {"sgd": 0.03, "momentum": 0.003, "adam": 1e-3, "adamw": 1e-3}


MODEL_DEFAULTS = {"hidden": [50], "activation": "relu", "optimizer": "sgd"}


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


def add_model_arguments(parser):
    """The options that choose the model and its optimizer, shared by `make` (mnist.build) and
    `make mnist` (mnist.train). Those left None take MODEL_DEFAULTS (or, with --load, the file's)."""
    parser.add_argument("--hidden", type=at_least(1), nargs="+", metavar="N",
                        help="hidden layer sizes, e.g. --hidden 128 64 (default 50)")
    parser.add_argument("--activation", choices=ACTIVATIONS, help="the hidden layers' activation (default relu)")
    parser.add_argument("--init", choices=INITS, default="he",
                        help="he (default): micrograd's uniform(-1, 1) draws scaled by sqrt(6 / fan-in); "
                             "micrograd: its init unchanged (trains slower: ~93%% after one epoch)")
    parser.add_argument("--optimizer", choices=OPTIMIZERS,
                        help="sgd (default), momentum (SGD with --momentum), adam, adamw (PyTorch's formulas)")
    parser.add_argument("--momentum", type=float, default=0.9, help="the momentum of --optimizer momentum (default 0.9)")
    parser.add_argument("--weight-decay", type=float, default=None,
                        help="L2 weight decay (AdamW: decoupled); default 0, AdamW 0.01")
    parser.add_argument("--dtype", choices=dtypes.NAMES, default=dtypes.DEFAULT.name,
                        help=f"the element type the module computes in (default {dtypes.DEFAULT.name})")


def model_options(args):
    """args with MODEL_DEFAULTS filled in where left None, and the codegen optimizer (or an
    error message for bad hyperparameters)."""
    for name, default in MODEL_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return make_optimizer(args.optimizer, args.momentum, args.weight_decay)


def make_optimizer(name, momentum=0.9, weight_decay=None):
    """The codegen optimizer for a `--optimizer` name; weight_decay None is the optimizer's
    default (0, and AdamW's 0.01)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    decay = {} if weight_decay is None else {"weight_decay": weight_decay}
    if name == "sgd":
        return codegen.SGD(**decay)
    if name == "momentum":
        return codegen.SGD(momentum=momentum, **decay)
    return (codegen.Adam if name == "adam" else codegen.AdamW)(**decay)


def image_loss(model, pixels, label):
    """The interpreted loss of one uint8 image: micrograd builds a fresh graph per image."""
    return cross_entropy(model([float(p) * PIXEL_SCALE for p in pixels]), int(label))


def sgd_step(model, loss, lr):
    """micrograd's training step: backpropagate the loss, then move every parameter down its gradient."""
    model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.data -= lr * p.grad


def build_graph(seed=0, hidden=(50,), init="micrograd", activation="relu"):
    """The MLP graph, initialised under random.seed(seed) with micrograd's uniform(-1, 1) weights,
    or with init="he" those same draws scaled by sqrt(6 / fan-in) (He et al.'s uniform init):
    micrograd's weights give 784-input neurons pre-activations of tens, which SGD takes epochs
    to undo. `activation` is the hidden layers' (relu, tanh or sigmoid)."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    random.seed(seed)
    model = MLP(N_PIXELS, [*hidden, N_CLASSES], activation=activation)
    if init == "he":
        for neuron in (n for layer in model.layers for n in layer.neurons):
            for w in neuron.w:
                w.data *= math.sqrt(6 / len(neuron.w))
    pixels = [Value(0.0) for _ in range(N_PIXELS)]
    targets = [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(pixels)
    return Graph(model, pixels, targets, logits, cross_entropy(logits, targets), model.parameters())
