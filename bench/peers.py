"""Peer implementations of the MNIST training workload, for speed comparisons.

Workload (identical in every peer): MLP 784 -> 50 (ReLU) -> 10, softmax
cross-entropy, SGD with batch size 1, float64, uint8 pixels scaled on the fly.
Every peer starts from the same given parameters, updates them image by image
in order, and exposes the current ones as `params` (dict of float64 arrays).
"""
from __future__ import annotations

import importlib.resources

import cffi
import numpy as np

from codegen.backend.toolchain import build_library

NIN, NHID, NOUT = 784, 50, 10
SCALE = 1 / 255
PARAM_NAMES = ('W1', 'b1', 'W2', 'b2')


def init_params(seed=0) -> dict:
    """micrograd's init: weights uniform(-1, 1), biases 0."""
    rng = np.random.default_rng(seed)
    return {'W1': rng.uniform(-1, 1, (NHID, NIN)), 'b1': np.zeros(NHID),
            'W2': rng.uniform(-1, 1, (NOUT, NHID)), 'b2': np.zeros(NOUT)}


def _copy_params(params) -> dict:
    return {name: np.array(params[name], dtype=np.float64, order='C') for name in PARAM_NAMES}


class NumpyMLP:
    """Hand-written NumPy, one image per step."""

    def __init__(self, params):
        self.params = _copy_params(params)

    def forward(self, x):
        """(hidden activations, logits) for one image (784,) or a batch of rows (n, 784)."""
        p = self.params
        h = np.maximum(x @ p['W1'].T + p['b1'], 0)
        return h, h @ p['W2'].T + p['b2']

    def grads(self, x, label):
        """(loss, gradients by parameter name) for one scaled float64 image x."""
        h, z = self.forward(x)
        shifted = z - z.max()
        exps = np.exp(shifted)
        total = exps.sum()
        loss = np.log(total) - shifted[label]
        dz = exps / total
        dz[label] -= 1
        dh = (self.params['W2'].T @ dz) * (h > 0)
        return loss, {'W1': np.outer(dh, x), 'b1': dh, 'W2': np.outer(dz, h), 'b2': dz}

    def train(self, X_u8, labels, lr, scale=SCALE) -> float:
        total = 0.0
        for pixels, label in zip(X_u8, labels):
            loss, grads = self.grads(pixels * scale, label)
            total += loss
            for name, grad in grads.items():
                grad *= lr  # in place: the gradients are fresh arrays, this saves a temporary
                self.params[name] -= grad
        return total / len(labels)

    def accuracy(self, X_u8, labels, scale=SCALE) -> float:
        _, z = self.forward(X_u8 * scale)  # the whole batch at once: evaluation only
        return float(np.mean(z.argmax(axis=1) == labels))


def _import_torch():
    try:
        import torch  # optional and large: only when a TorchMLP is made
    except ImportError as error:
        raise ImportError('TorchMLP needs PyTorch, which is not installed '
                          '(pip install torch, a CPU-only wheel is enough)') from error
    return torch


class TorchMLP:
    """PyTorch eager, one image per step, float64, single thread."""

    def __init__(self, params):
        torch = _import_torch()
        torch.set_num_threads(1)  # a fair comparison with the single-threaded peers
        self.model = torch.nn.Sequential(torch.nn.Linear(NIN, NHID, dtype=torch.float64),
                                         torch.nn.ReLU(),
                                         torch.nn.Linear(NHID, NOUT, dtype=torch.float64))
        with torch.no_grad():
            for tensor, name in zip(self._tensors(), PARAM_NAMES):
                tensor.copy_(torch.tensor(np.asarray(params[name]), dtype=torch.float64))

    def _tensors(self):
        """Parameter tensors in PARAM_NAMES order."""
        return [t for layer in (self.model[0], self.model[2]) for t in (layer.weight, layer.bias)]

    @property
    def params(self) -> dict:
        return {name: t.detach().numpy().copy() for name, t in zip(PARAM_NAMES, self._tensors())}

    @staticmethod
    def _inputs(X_u8, labels):
        # torch.tensor copies: from_numpy would refuse/warn on read-only data (np.frombuffer).
        import torch  # optional: a TorchMLP exists, so it is installed
        return torch.tensor(np.asarray(X_u8)), torch.tensor(np.asarray(labels), dtype=torch.int64)

    def train(self, X_u8, labels, lr, scale=SCALE) -> float:
        import torch
        X, y = self._inputs(X_u8, labels)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)
        total = 0.0
        for i in range(len(y)):
            x = X[i:i + 1].to(torch.float64) * scale
            loss = torch.nn.functional.cross_entropy(self.model(x), y[i:i + 1])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        return total / len(y)

    def accuracy(self, X_u8, labels, scale=SCALE) -> float:
        import torch
        X, y = self._inputs(X_u8, labels)
        with torch.no_grad():
            z = self.model(X.to(torch.float64) * scale)
        return (z.argmax(dim=1) == y).double().mean().item()


_CDEF = """
double mlp_train_epoch(double *W1, double *b1, double *W2, double *b2,
                       const unsigned char *X, const unsigned char *labels,
                       long n, double scale, double lr);
long mlp_count_correct(const double *W1, const double *b1, const double *W2,
                       const double *b2, const unsigned char *X,
                       const unsigned char *labels, long n, double scale);
"""


class CReference:
    """bench/c/mnist_reference.c, compiled with codegen.backend.toolchain and called through cffi (ABI mode)."""

    def __init__(self, params, compiler='gcc', opt=3, native=True, measure_memory=False, sparse=False,
                 input_major=False):
        c = importlib.resources.files('bench') / 'c'
        source = (c / 'zoo_common.h').read_text() + (c / 'mnist_reference.c').read_text()  # dot() is shared
        if sparse:  # its variant that visits only the nonzero pixels
            source = '#define SPARSE_INPUTS 1\n' + source
        if input_major:  # its variant with W1 stored pixel by pixel (the transpose of the model's order)
            source = '#define INPUT_MAJOR 1\n' + source
        self.build = build_library(source, 'mlp_reference', compiler=compiler, opt=opt, native=native,
                                   measure_memory=measure_memory)
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self.lib = self.ffi.dlopen(str(self.build.path))
        self.params = _copy_params(params)
        if input_major:
            self.params['W1'] = np.ascontiguousarray(self.params['W1'].T)

    def _args(self, X_u8, labels):
        """Pointers to the parameters (updated in place) and to the data; validates the data."""
        X = np.ascontiguousarray(X_u8, dtype=np.uint8)
        labels = np.asarray(labels)
        if X.ndim != 2 or X.shape[1] != NIN or labels.shape != X.shape[:1]:
            raise ValueError(f'expected images (n, {NIN}) and n labels, got {X.shape} and {labels.shape}')
        if ((labels < 0) | (labels >= NOUT)).any():  # the C code indexes by label unchecked
            raise ValueError(f'labels must be in 0..{NOUT - 1}')
        labels = np.ascontiguousarray(labels, dtype=np.uint8)
        buf = self.ffi.from_buffer
        return ([buf('double[]', self.params[name], require_writable=True) for name in PARAM_NAMES]
                + [buf('unsigned char[]', X), buf('unsigned char[]', labels), len(X)])

    def train(self, X_u8, labels, lr, scale=SCALE) -> float:
        return self.lib.mlp_train_epoch(*self._args(X_u8, labels), scale, lr)

    def accuracy(self, X_u8, labels, scale=SCALE) -> float:
        return self.lib.mlp_count_correct(*self._args(X_u8, labels), scale) / len(labels)


PEERS = {'numpy': NumpyMLP, 'torch': TorchMLP, 'c': CReference}
