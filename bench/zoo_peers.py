"""Trainers of the zoo's models (bench.models): our compiled module, the plain-C references (bench/c/)
and NumPy, behind one interface for bench.zoo:

    trainer.reset()        back to the model's initial parameters
    trainer.run(steps)     `steps` SGD steps from there (batch-1 models: data rows 0..steps-1); the mean loss
    trainer.params         the current parameters, flat, in the model's params order

Construction builds (and raises CompilerNotFound, CompileTimeout... as the build does).
"""
from __future__ import annotations

import importlib.resources

import cffi
import numpy as np

import codegen
from codegen.backend.toolchain import build_library

from .models import N_ROWS, ZooModel


def _check_steps(model: ZooModel, steps: int) -> None:
    if model.X is not None and not 1 <= steps <= N_ROWS:
        raise ValueError(f'{model.name}: steps must be in 1..{N_ROWS} (the data rows), got {steps}')


class Module:
    """Our compiled module. Batch-1 models train through train(X, Y, lr, scale); the demo, which has no
    inputs (its batch is in the graph), through one train() call of a run's steps on empty rows,
    with the demo's rate of each step (train()'s lr as one rate a step)."""

    def __init__(self, model: ZooModel, compiler, opt=2, native=False, timeout=None):
        self.model = model
        self.net = codegen.compile(model.loss, model.inputs, model.params, model.outputs, compiler=compiler,
                                   opt=opt, native=native, timeout=timeout,
                                   tiered=False)  # (the optimised build is what it times)
        self.lrs = {}

    def reset(self):
        self.net.set_params(self.model.init)

    def run(self, steps: int) -> float:
        _check_steps(self.model, steps)
        model, net = self.model, self.net
        if model.X is not None:
            return net.train(model.X[:steps], model.Y[:steps], model.lr(0), scale=model.scale)
        lrs = self.lrs.get(steps) or self.lrs.setdefault(steps, [model.lr(k) for k in range(steps)])
        nothing = np.zeros((steps, 0))  # a step of the whole batch a row (a graph without inputs: empty rows)
        return net.train(nothing, nothing, lrs)

    @property
    def params(self) -> np.ndarray:
        return np.array(self.net.params)


def _c_text(name: str) -> str:
    return (importlib.resources.files('bench') / 'c' / name).read_text()


_CDEF_BATCH1 = ('double zoo_{kind}_train(double *params, const unsigned char *X, const unsigned char *labels, '
                'long n, double scale, double lr);')
_CDEF_MOONS = ('double zoo_moons_train(double *params, const double *X, const double *y, long n_steps, '
               'const double *lrs, double alpha);')


class CReference:
    """The model's plain-C reference (bench/c/zoo_<kind>.c after zoo_common.h), built with
    codegen.backend.toolchain like our modules and called through cffi (ABI mode)."""

    def __init__(self, model: ZooModel, compiler, opt=3, native=True, timeout=None):
        self.model, kind = model, model.shape['kind']
        shape = ''
        if kind == 'mlp':
            sizes = model.shape['sizes']
            shape = (f'#define N_LAYERS {len(sizes) - 1}\n#define SIZES {{{", ".join(map(str, sizes))}}}\n'
                     f'#define MAX_WIDTH {max(sizes)}\n')
        source = _c_text('zoo_common.h') + shape + _c_text(f'zoo_{kind}.c')
        self.build = build_library(source, f'zoo_{kind}', compiler=compiler, opt=opt, native=native,
                                   timeout=timeout)
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF_MOONS if kind == 'moons' else _CDEF_BATCH1.format(kind=kind))
        self.lib = self.ffi.dlopen(str(self.build.path))
        self.train = getattr(self.lib, f'zoo_{kind}_train')
        self.params = model.init.copy()
        buf = self.ffi.from_buffer
        self.params_ptr = buf('double[]', self.params, require_writable=True)
        if kind == 'moons':
            self.X, self.y = (np.ascontiguousarray(model.shape[k], dtype=np.float64) for k in ('X', 'y'))
            self.data_ptrs = (buf('double[]', self.X), buf('double[]', self.y))
        else:
            self.X = np.ascontiguousarray(model.X, dtype=np.uint8)
            self.Y = np.ascontiguousarray(model.Y, dtype=np.uint8)  # labels 0..9: the C indexes by them
            self.data_ptrs = (buf('unsigned char[]', self.X), buf('unsigned char[]', self.Y))
        self.lrs = {}

    def reset(self):
        self.params[:] = self.model.init

    def run(self, steps: int) -> float:
        _check_steps(self.model, steps)
        model = self.model
        if model.X is not None:
            return self.train(self.params_ptr, *self.data_ptrs, steps, model.scale, model.lr(0))
        if steps not in self.lrs:
            lrs = np.array([model.lr(k) for k in range(steps)])
            self.lrs[steps] = (lrs, self.ffi.from_buffer('double[]', lrs))
        return self.train(self.params_ptr, *self.data_ptrs, steps, self.lrs[steps][1], model.shape['alpha'])


def _layer_views(flat, sizes, offset=0):
    """(weights, biases) per layer as views into a flat vector in micrograd's layout (a row per neuron:
    its weights, then its bias), starting at `offset`."""
    layers = []
    for nin, nout in zip(sizes[:-1], sizes[1:]):
        rows = flat[offset:offset + nout * (nin + 1)].reshape(nout, nin + 1)
        layers.append((rows[:, :nin], rows[:, nin]))
        offset += nout * (nin + 1)
    return layers


def _softmax_cross_entropy(z, label):
    """(loss, dloss/dz) of logits z against class label."""
    shifted = z - z.max()
    exps = np.exp(shifted)
    total = exps.sum()
    dz = exps / total
    dz[label] -= 1
    return np.log(total) - shifted[label], dz


class Numpy:
    """Hand-written NumPy, the same math and order of updates as the C references."""

    def __init__(self, model: ZooModel):
        self.model, self.kind = model, model.shape['kind']
        self.params = model.init.copy()
        self.grad = np.zeros_like(self.params)
        if self.kind == 'mlp':
            self.layers = _layer_views(self.params, model.shape['sizes'])
        elif self.kind == 'moons':
            sizes = (2, 16, 16, 1)
            self.layers = _layer_views(self.params, sizes)
            self.grads = _layer_views(self.grad, sizes)
        else:
            n_conv = 4 * 9
            self.filters = self.params[:n_conv].reshape(4, 9)  # [f][ky * 3 + kx]
            self.biases = self.params[n_conv:n_conv + 4]
            [self.dense] = _layer_views(self.params, (4 * 26 * 26, 10), offset=n_conv + 4)

    def reset(self):
        self.params[:] = self.model.init

    def run(self, steps: int) -> float:
        _check_steps(self.model, steps)
        if self.kind == 'moons':
            return sum(self._moons_step(self.model.lr(k)) for k in range(steps)) / steps
        step = self._mlp_step if self.kind == 'mlp' else self._cnn_step
        lr, scale = self.model.lr(0), self.model.scale
        return sum(step(pixels * scale, int(label), lr)
                   for pixels, label in zip(self.model.X[:steps], self.model.Y[:steps])) / steps

    def _mlp_step(self, x, label, lr):
        acts = [x]
        for i, (W, b) in enumerate(self.layers):
            a = W @ acts[-1] + b
            acts.append(np.maximum(a, 0) if i < len(self.layers) - 1 else a)
        loss, d = _softmax_cross_entropy(acts[-1], label)
        for i in range(len(self.layers) - 1, -1, -1):
            W, b = self.layers[i]
            below = (d @ W) * (acts[i] > 0) if i > 0 else None  # through the weights before the update
            W -= lr * np.outer(d, acts[i])
            b -= lr * d
            d = below
        return loss

    def _cnn_step(self, x, label, lr):
        patches = np.lib.stride_tricks.sliding_window_view(x.reshape(28, 28), (3, 3)).reshape(26 * 26, 9)
        h = np.maximum(self.filters @ patches.T + self.biases[:, None], 0).ravel()  # [f][i][j]
        W, b = self.dense
        loss, dz = _softmax_cross_entropy(W @ h + b, label)
        dh = ((dz @ W) * (h > 0)).reshape(4, 26 * 26)
        W -= lr * np.outer(dz, h)
        b -= lr * dz
        self.filters -= lr * (dh @ patches)
        self.biases -= lr * dh.sum(axis=1)
        return loss

    def _moons_step(self, lr):
        X, y, alpha = self.model.shape['X'], self.model.shape['y'], self.model.shape['alpha']
        (W1, b1), (W2, b2), (W3, b3) = self.layers
        (G1, g1), (G2, g2), (G3, g3) = self.grads
        h1 = np.maximum(X @ W1.T + b1, 0)
        h2 = np.maximum(h1 @ W2.T + b2, 0)
        score = h2 @ W3[0] + b3[0]
        margin = 1 - y * score
        loss = np.maximum(margin, 0).sum() * (1.0 / len(y)) + alpha * (self.params @ self.params)
        ds = np.where(margin > 0, -y * (1.0 / len(y)), 0.0)
        dh2 = np.outer(ds, W3[0]) * (h2 > 0)
        dh1 = (dh2 @ W2) * (h1 > 0)
        np.multiply(self.params, 2 * alpha, out=self.grad)
        G3[0] += ds @ h2
        g3[0] += ds.sum()
        G2 += dh2.T @ h1
        g2 += dh2.sum(axis=0)
        G1 += dh1.T @ X
        g1 += dh1.sum(axis=0)
        self.params -= lr * self.grad
        return loss
