"""Optimizers for the compiled step: what update(lr) and train(X, Y, lr) do with the gradient.

    net = codegen.compile(loss, inputs, params, optimizer=codegen.Adam())
    net.train(X, Y, 1e-3)            # the learning rate stays the call's argument

Each is PyTorch's update rule (torch.optim.SGD with dampening 0, Adam, AdamW; amsgrad and
maximize left out), compiled into the module as constants. The learning rate is not part of the
description: update(lr) and train(..., lr) take it on every call, so a schedule can change it
between calls. The optimizer's state (momentum buffer, moments, step count) lives in the module:
`net.optimizer_state` maps PyTorch's state names to writable float64 memoryviews.
"""

import math
from dataclasses import dataclass


__all__ = ["SGD", "Adam", "AdamW", "Optimizer"]


class Optimizer:
    """Base of the optimizer descriptions; `kind` selects the C step (templates/optim.c)."""

    kind = None
    state_names = ()  # the module's optimizer_state views, PyTorch's names

    @property
    def plain_sgd(self):
        """param -= lr * grad and nothing else: the step batch-1 training can take inside backward
        (ir.sgd_in_backward)."""
        return self.kind == _SGD and self.constants().get("WEIGHT_DECAY", 0.0) == 0

    def constants(self):
        """The step's constants of templates/optim.c, by name (codegen/write/contract.py renders them)."""
        return {}


def _check(name, value, lo, hi=math.inf, hi_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    if value < lo or value > hi or (hi_open and value == hi):
        upper = f"< {hi}" if hi_open else f"<= {hi}"
        raise ValueError(f"{name} must be >= {lo}" + ("" if hi == math.inf else f" and {upper}") + f", got {value!r}")
    return float(value)


# Values of OPTIMIZER in templates/optim.c; the step count's slot is padded to a cache line
STATE_LINE = 8
_SGD, _MOMENTUM, _ADAM = 0, 1, 2


@dataclass(frozen=True)
class SGD(Optimizer):
    """torch.optim.SGD (dampening 0): g += weight_decay * p; buf = momentum * buf + g (buf = g at
    the first step); g = g + momentum * buf if nesterov else buf; p -= lr * g."""

    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "momentum", _check("SGD momentum", self.momentum, 0))
        object.__setattr__(self, "weight_decay", _check("SGD weight_decay", self.weight_decay, 0))
        if not isinstance(self.nesterov, bool):
            raise TypeError(f"SGD nesterov must be True or False, got {self.nesterov!r}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("SGD nesterov needs a momentum > 0")

    @property
    def kind(self):
        return _MOMENTUM if self.momentum else _SGD

    @property
    def state_names(self):
        return ("momentum_buffer",) if self.momentum else ()

    def constants(self):
        return {"MOMENTUM": self.momentum, "NESTEROV": int(self.nesterov), "WEIGHT_DECAY": self.weight_decay}


@dataclass(frozen=True)
class Adam(Optimizer):
    """torch.optim.Adam: g += weight_decay * p (L2); m = lerp(m, g, 1 - beta1);
    v = beta2 * v + (1 - beta2) * g * g; p -= lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)."""

    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0

    kind = _ADAM
    state_names = ("step", "exp_avg", "exp_avg_sq")
    decoupled = False

    def __post_init__(self):
        name = type(self).__name__
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise TypeError(f"{name} betas must be a pair of numbers, got {self.betas!r}")
        object.__setattr__(self, "betas", tuple(_check(f"{name} beta{i + 1}", b, 0, 1, hi_open=True)
                                                for i, b in enumerate(self.betas)))
        object.__setattr__(self, "eps", _check(f"{name} eps", self.eps, 0))
        object.__setattr__(self, "weight_decay", _check(f"{name} weight_decay", self.weight_decay, 0))

    def constants(self):
        return {"BETA1": self.betas[0], "BETA2": self.betas[1], "EPS": self.eps,
                "WEIGHT_DECAY": self.weight_decay, "DECOUPLED_DECAY": int(self.decoupled)}


@dataclass(frozen=True)
class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled weight decay, p *= 1 - lr * weight_decay before the
    step, instead of adding weight_decay * p to the gradient."""

    weight_decay: float = 0.01
    decoupled = True


def check(optimizer):
    """The optimizer to compile: None means plain SGD."""
    if optimizer is None:
        return SGD()
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be codegen.SGD(...), codegen.Adam(...) or codegen.AdamW(...), "
                        f"got {optimizer!r}")
    return optimizer
