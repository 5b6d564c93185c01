"""The workload: micrograd's MLP(784, [50, 10]) with softmax cross-entropy, one image per step."""

import math
import random
from dataclasses import dataclass

import codegen
from micrograd_c import MLP, Value, cross_entropy

N_PIXELS, N_CLASSES = 784, 10
PIXEL_SCALE = 1 / 255  # pixels are uint8; the model sees [0, 1]


@dataclass
class Graph:
    model: MLP
    pixels: list    # input Values, one per pixel
    targets: list   # input Values, the one-hot label
    logits: list
    loss: Value

    def compile(self, **options):
        """The compiled training step (codegen.compile options: compiler, opt, native, fuse...)."""
        return codegen.compile(self.loss, self.pixels + self.targets, self.model.parameters(),
                               outputs=self.logits, **options)

    def generate(self, **options):
        """The C source compile() would build."""
        return codegen.generate(self.loss, self.pixels + self.targets, self.model.parameters(),
                                outputs=self.logits, **options)


INITS = ("he", "micrograd")


def image_loss(model, pixels, label):
    """The interpreted loss of one uint8 image: micrograd builds a fresh graph per image."""
    return cross_entropy(model([float(p) * PIXEL_SCALE for p in pixels]), int(label))


def sgd_step(model, loss, lr):
    """micrograd's training step: backpropagate the loss, then move every parameter down its gradient."""
    model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.data -= lr * p.grad


def build_graph(seed=0, hidden=(50,), init="micrograd"):
    """The MLP graph, initialised under random.seed(seed) with micrograd's uniform(-1, 1) weights,
    or with init="he" those same draws scaled by sqrt(6 / fan-in) (He et al.'s uniform init):
    micrograd's weights give 784-input neurons pre-activations of tens, which SGD takes epochs
    to undo."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    random.seed(seed)
    model = MLP(N_PIXELS, [*hidden, N_CLASSES])
    if init == "he":
        for neuron in (n for layer in model.layers for n in layer.neurons):
            for w in neuron.w:
                w.data *= math.sqrt(6 / len(neuron.w))
    pixels = [Value(0.0) for _ in range(N_PIXELS)]
    targets = [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(pixels)
    return Graph(model, pixels, targets, logits, cross_entropy(logits, targets))
