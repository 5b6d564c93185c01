"""micrograd, with every op defined once in a table that the C compiler (codegen) also reads."""

from .draw import draw_dot
from .engine import Table, Value, dot, gather
from .losses import cross_entropy, log_softmax, mse
from .nn import MLP, Layer, Module, Neuron

__all__ = ["Value", "dot", "gather", "Table", "draw_dot", "Module", "Neuron", "Layer", "MLP", "cross_entropy", "log_softmax", "mse"]
