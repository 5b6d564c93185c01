"""Neural-net building blocks with micrograd's API, init and repr."""

import random
from itertools import chain

from .engine import Value, dot, no_gc

ACTIVATIONS = ("relu", "tanh", "sigmoid")


class Module:

    def zero_grad(self):
        for p in self.parameters():
            p.grad = 0

    def parameters(self):
        return []


class Neuron(Module):

    def __init__(self, nin, nonlin=True, activation="relu"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.w = [Value(random.uniform(-1, 1)) for _ in range(nin)]
        self.b = Value(0)
        self.nonlin = nonlin
        self.activation = activation

    def __call__(self, x):
        if isinstance(x, (list, tuple)) and len(x) == len(self.w):
            act = dot(self.w, x, self.b)  # micrograd's chain, its Values made when read (engine.Dot)
        else:  # (zip's truncation, as micrograd)
            act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return getattr(act, self.activation)() if self.nonlin else act

    def parameters(self):
        return self.w + [self.b]

    def __repr__(self):
        kind = {"relu": "ReLU", "tanh": "Tanh", "sigmoid": "Sigmoid"}[self.activation]
        return f"{kind if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):

    def __init__(self, nin, nout, **kwargs):
        with no_gc(survivors=True):  # see engine.no_gc: a layer's Values are no garbage
            self.neurons = [Neuron(nin, **kwargs) for _ in range(nout)]

    def __call__(self, x):
        with no_gc(survivors=True):
            out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out

    def parameters(self):
        return list(self._parameter_parts())

    def _parameter_parts(self):
        """parameters() as an iterator over the neurons' own lists: a million-parameter model's
        list is made in one pass at C speed, with no list per neuron (each would touch every
        Value twice more). A Neuron subclass's parameters() is called as such."""
        plain = Neuron.parameters
        return chain.from_iterable(chain(n.w, (n.b,)) if type(n).parameters is plain else n.parameters()
                                   for n in self.neurons)

    def __repr__(self):
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module):
    """Hidden layers use `activation` (micrograd's ReLU by default); the last layer is linear."""

    def __init__(self, nin, nouts, activation="relu"):
        sz = [nin] + nouts
        self.layers = [Layer(sz[i], sz[i + 1], nonlin=i != len(nouts) - 1, activation=activation)
                       for i in range(len(nouts))]

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self):
        plain = Layer.parameters
        return list(chain.from_iterable(layer._parameter_parts() if type(layer).parameters is plain
                                        else layer.parameters() for layer in self.layers))

    def __repr__(self):
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
