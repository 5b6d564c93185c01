"""The model zoo: small models written as a micrograd user writes them, for the benchmark (bench.zoo)
and for equivalence tests.

Each builder returns a ZooModel: the pieces codegen.compile takes (loss, inputs, params, outputs),
the parameters' initial values, and the data the steps use. Batch-1 models (the CNN and the MLPs)
train one row per step on fixed random uint8 images and labels (a seeded NumPy generator, no
download): row k goes, times `scale`, into the first inputs and its label one-hot into the rest,
as the compiled module's train(X, Y, lr, scale) does. micrograd's demo has no inputs: its 100
points are constants in the graph, and step k uses the demo's rate 1.0 - 0.9 * k / 100.

Parameters are listed as micrograd lists them (neuron by neuron: its weights, then its bias); the
C references (bench/c/) use that same flat layout, so one vector of values describes every peer.

    model = models.mlp((50,))
    net = codegen.compile(model.loss, model.inputs, model.params, model.outputs, compiler="gcc")
    net.train(model.X[:100], model.Y[:100], model.lr(0), scale=model.scale)
    losses, params = models.interpret(model, 3)   # the same 3 steps in micrograd_c's interpreter
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from micrograd_c import MLP, Value, cross_entropy
from micrograd_c.nn import Layer

PIXEL_SCALE = 1 / 255
N_ROWS = 2_000          # data rows of a batch-1 model; steps past them wrap around
IMAGE_SIDE, N_CLASSES = 28, 10


@dataclass
class ZooModel:
    name: str
    loss: Value
    inputs: list            # input Values (empty for the demo)
    params: list            # parameter Values, in micrograd's order
    outputs: list           # the model's outputs (logits, scores)
    init: np.ndarray        # the parameters' initial values, float64, in params order
    loss_of: Callable       # loss_of(row) -> the loss Value of data row `row`, a new graph (the demo ignores row)
    X: np.ndarray | None = None   # (N_ROWS, n_x) uint8, batch-1 models
    Y: np.ndarray | None = None   # (N_ROWS,) labels
    scale: float = 1.0
    base_lr: float = 0.01
    decay_steps: int | None = None  # step k's rate falls as base_lr * (1.0 - 0.9 * k / decay_steps): the demo's
    steps: int = 1_000      # steps of one timed run in the benchmark
    shape: dict = field(default_factory=dict)  # what the NumPy peer and the C reference need to know

    def lr(self, k: int) -> float:
        """The learning rate of step k (0-based) of a run."""
        return self.base_lr * (1.0 - 0.9 * k / self.decay_steps) if self.decay_steps else self.base_lr

    def reset(self):
        """Puts the initial values back into the parameter Values."""
        for p, value in zip(self.params, self.init):
            p.data = float(value)


def _init(params) -> np.ndarray:
    return np.array([p.data for p in params], dtype=np.float64)


def _he_scale(model: MLP) -> None:
    """micrograd's uniform(-1, 1) draws scaled by sqrt(6 / fan-in), as mnist.model's init="he": with
    micrograd's own weights a 784-input neuron's pre-activation is tens, and SGD diverges on random data."""
    for neuron in (n for layer in model.layers for n in layer.neurons):
        for w in neuron.w:
            w.data *= math.sqrt(6 / len(neuron.w))


def _images(seed: int, n_pixels: int):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (N_ROWS, n_pixels), dtype=np.uint8),
            rng.integers(0, N_CLASSES, N_ROWS, dtype=np.uint8))


def _one_hot(label) -> list:
    return [1.0 if k == label else 0.0 for k in range(N_CLASSES)]


def make_moons(n_samples=100, noise=0.1, seed=0):
    """sklearn.datasets.make_moons, written in NumPy: two interleaving half circles, (X, y) with y in {0, 1}."""
    rng = np.random.default_rng(seed)
    n_out = n_samples // 2
    n_in = n_samples - n_out
    outer = np.linspace(0, np.pi, n_out)
    inner = np.linspace(0, np.pi, n_in)
    X = np.vstack([np.column_stack([np.cos(outer), np.sin(outer)]),
                   np.column_stack([1 - np.cos(inner), 1 - np.sin(inner) - 0.5])])
    y = np.hstack([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    return X + rng.normal(scale=noise, size=X.shape), y


def demo(seed=0) -> ZooModel:
    """micrograd's demo.ipynb: MLP(2, [16, 16, 1]) on 100 two-moons points, SVM max-margin loss plus
    1e-4 * sum(p*p), the whole batch in one graph; 100 steps at rate 1.0 - 0.9 * k / 100."""
    random.seed(seed)
    X, y = make_moons(n_samples=100, noise=0.1, seed=seed)
    y = y * 2 - 1  # -1 or 1
    model = MLP(2, [16, 16, 1])
    alpha = 1e-4

    def loss():  # the demo's loss(): a new graph from the current parameters, the points as constants
        inputs = [list(map(Value, map(float, xrow))) for xrow in X]
        scores = list(map(model, inputs))
        losses = [(1 + -float(yi) * scorei).relu() for yi, scorei in zip(y, scores)]
        data_loss = sum(losses) * (1.0 / len(losses))
        reg_loss = alpha * sum((p * p for p in model.parameters()))
        return data_loss + reg_loss, scores

    total_loss, scores = loss()
    params = model.parameters()
    return ZooModel('demo MLP(2, [16, 16, 1])', total_loss, [], params, scores, _init(params),
                    loss_of=lambda row: loss()[0], base_lr=1.0, decay_steps=100, steps=100,
                    shape={'kind': 'moons', 'X': X.astype(np.float64), 'y': y.astype(np.float64), 'alpha': alpha})


def mlp(hidden=(50,), seed=0, steps=1_000) -> ZooModel:
    """MLP(784, [*hidden, 10]) (ReLU hidden layers, micrograd's init scaled as He's), softmax
    cross-entropy, batch 1, on random 28x28 uint8 images."""
    random.seed(seed)
    sizes = (IMAGE_SIDE * IMAGE_SIDE, *hidden, N_CLASSES)
    model = MLP(sizes[0], list(sizes[1:]))
    _he_scale(model)
    pixels = [Value(0.0) for _ in range(sizes[0])]
    targets = [Value(0.0) for _ in range(N_CLASSES)]
    logits = model(pixels)
    X, Y = _images(seed, sizes[0])
    params = model.parameters()

    def loss_of(row):
        return cross_entropy(model([float(p) * PIXEL_SCALE for p in X[row]]), _one_hot(Y[row]))

    return ZooModel(f'MLP({sizes[0]}, {list(sizes[1:])})', cross_entropy(logits, targets), pixels + targets, params,
                    logits, _init(params), loss_of, X, Y, PIXEL_SCALE, steps=steps,
                    shape={'kind': 'mlp', 'sizes': sizes})


CONV_FILTERS, KERNEL = 4, 3
CONV_SIDE = IMAGE_SIDE - KERNEL + 1  # 26: a valid convolution


def cnn(seed=0, steps=500) -> ZooModel:
    """3x3 convolution with 4 filters (valid, ReLU), then dense 2704 -> 10, softmax cross-entropy, batch 1.
    The convolution is Python loops over Values, as a micrograd user writes it."""
    random.seed(seed)
    fan_in = KERNEL * KERNEL
    w = [[[Value(random.uniform(-1, 1) * math.sqrt(6 / fan_in)) for _ in range(KERNEL)] for _ in range(KERNEL)]
         for _ in range(CONV_FILTERS)]
    b = [Value(0.0) for _ in range(CONV_FILTERS)]
    dense = Layer(CONV_FILTERS * CONV_SIDE * CONV_SIDE, N_CLASSES, nonlin=False)
    for neuron in dense.neurons:
        for weight in neuron.w:
            weight.data *= math.sqrt(6 / len(neuron.w))

    def forward(x):  # x: 28 rows of 28 Values or numbers
        out = [[[(sum(w[f][ky][kx] * x[i + ky][j + kx] for ky in range(KERNEL) for kx in range(KERNEL))
                  + b[f]).relu()
                 for j in range(CONV_SIDE)] for i in range(CONV_SIDE)] for f in range(CONV_FILTERS)]
        return dense([v for plane in out for line in plane for v in line])

    pixels = [Value(0.0) for _ in range(IMAGE_SIDE * IMAGE_SIDE)]
    targets = [Value(0.0) for _ in range(N_CLASSES)]
    logits = forward([pixels[r * IMAGE_SIDE:(r + 1) * IMAGE_SIDE] for r in range(IMAGE_SIDE)])
    X, Y = _images(seed, IMAGE_SIDE * IMAGE_SIDE)
    params = [v for plane in w for line in plane for v in line] + b + dense.parameters()

    def loss_of(row):
        image = (X[row].reshape(IMAGE_SIDE, IMAGE_SIDE) * PIXEL_SCALE).tolist()
        return cross_entropy(forward(image), _one_hot(Y[row]))

    return ZooModel('CNN(conv3x3x4, 2704 -> 10)', cross_entropy(logits, targets), pixels + targets, params, logits,
                    _init(params), loss_of, X, Y, PIXEL_SCALE, steps=steps, shape={'kind': 'cnn'})


# name -> builder; the benchmark's order
MODELS = {
    'demo': demo,
    'cnn': cnn,
    'mlp-128-64': lambda: mlp((128, 64), steps=500),
    'mlp-50': lambda: mlp((50,), steps=2_000),
}
BIG_HIDDEN = (512, 256)  # MLP(784, [512, 256, 10]): about 1.6M nodes, the graph-size target


def interpret(model: ZooModel, steps: int):
    """`steps` steps of SGD in micrograd_c's interpreter from model.init, each on a new graph as micrograd
    builds it (row k of the data; the demo: its constants): (the losses, the parameters after them).
    The model's parameter Values are back at model.init afterwards."""
    model.reset()
    losses = []
    for k in range(steps):
        loss = model.loss_of(k % N_ROWS)
        for p in model.params:
            p.grad = 0
        loss.backward()
        lr = model.lr(k)
        for p in model.params:
            p.data -= lr * p.grad
        losses.append(loss.data)
    params = _init(model.params)
    model.reset()
    return losses, params
