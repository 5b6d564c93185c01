"""A convolution over a batch (templates/kernels/conv.c, codegen/write/convolution.py): its three
kernels called directly against NumPy (the max difference printed) at shapes with tails (samples
after the last vector, odd filter counts, windows of 1, 10 and 16 elements: groups of 9, 3 and 1),
with the strides the generated code passes, the forward with a ReLU as its epilogue; and a CNN written with scalar Values (two convolutions, the second over
the first's ReLU, so that its inputs need gradients) trained over batches, equal to micrograd_c's
interpreter, in both dtypes on every compiler, and the same bits on 1 and 2 threads."""

import random

import cffi
import numpy as np
import pytest

import codegen
import templates
from codegen.backend import toolchain
from codegen.backend.toolchain import COMPILER_NAMES
from codegen.lower import batch, ir
from codegen.write.convolution import convolution
from conftest import compiler_diagonal
from micrograd_c import Value, cross_entropy

HARNESS = """
static void relu_rows(const real *restrict x, real *restrict y, const real *restrict a, const real *restrict o,
                      long count)
{ (void)a; (void)o; for (long n = 0; n < count; n++) y[n] = where(x[n] < 0, 0, x[n]); }
void call_set(real *out, long out_f, long out_p, long out_q, const real *bias, long bias_f, const real *w, long w_f,
              long w_k, const real *x, long x_p, long x_q, const int32_t *offsets, long F, long P, long Q, long S, long K,
              real *y)
{ conv_set(out, out_f, out_p, out_q, bias, bias_f, w, w_f, w_k, x, x_p, x_q, offsets, F, P, Q, S, K,
           y ? relu_rows : 0, y, P * Q * CAPACITY, Q * CAPACITY, CAPACITY); }
void call_nt(real *out, long out_f, long out_k, real *bias, long bias_f, const real *go, long go_f, long go_p,
             long go_q, const real *x, long x_p, long x_q, const int32_t *offsets, long F, long P, long Q, long S, long K)
{ conv_nt(out, out_f, out_k, bias, bias_f, go, go_f, go_p, go_q, x, x_p, x_q, offsets, F, P, Q, S, K); }
void call_acc(real *out, long out_p, long out_q, const int32_t *offsets, const real *w, long w_f, long w_k,
              const real *go, long go_f, long go_p, long go_q, long F, long P, long Q, long S, long K)
{ conv_acc(out, out_p, out_q, offsets, w, w_f, w_k, go, go_f, go_p, go_q, F, P, Q, S, K); }
"""
DECLARATIONS = """
void call_set(real *out, long out_f, long out_p, long out_q, const real *bias, long bias_f, const real *w, long w_f,
              long w_k, const real *x, long x_p, long x_q, const int *offsets, long F, long P, long Q, long S, long K,
              real *y);
void call_nt(real *out, long out_f, long out_k, real *bias, long bias_f, const real *go, long go_f, long go_p,
             long go_q, const real *x, long x_p, long x_q, const int *offsets, long F, long P, long Q, long S, long K);
void call_acc(real *out, long out_p, long out_q, const int *offsets, const real *w, long w_f, long w_k,
              const real *go, long go_f, long go_p, long go_q, long F, long P, long Q, long S, long K);
"""
DTYPES = {"float64": ("double", np.float64, 1e-12), "float32": ("float", np.float32, 2e-5)}
CAPACITY = 48  # samples a slot holds (the batch buffers' capacity): S at most this
# (filters F, window's rows and columns, image rows and columns, samples S): every window group
# (9, 3, 1), samples after the last vector, single rows, one filter
CASES = [(4, 3, 3, 28, 28, 32), (3, 3, 3, 9, 11, 13), (1, 2, 5, 6, 10, 1), (2, 1, 1, 4, 4, 37),
         (5, 4, 4, 7, 6, 48), (2, 1, 3, 1, 9, 19)]


def kernels(compiler, dtype):
    ctype = DTYPES[dtype][0]
    source = (f"#define REAL_IS_FLOAT {int(dtype == 'float32')}\n#define HAVE_THREAD_POOL 0\n"
              + templates.read("prelude.c") + f"#define CAPACITY {CAPACITY}\n" + HARNESS)
    build = toolchain.build_library(source, "conv", compiler, opt=2)
    ffi = cffi.FFI()
    ffi.cdef(f"typedef {ctype} real;\n" + DECLARATIONS)
    return ffi, ffi.dlopen(str(build.path))


def compare(got, expected, rtol, what, case):
    scale = np.abs(expected).max() + 1
    diff = float(np.abs(got.astype(np.float64) - expected).max() / scale)
    assert diff <= rtol, f"{what} at {case}: {diff:.3e} > {rtol}"
    return diff


@pytest.mark.parametrize("compiler, dtype", list(compiler_diagonal(list(DTYPES))), indirect=["compiler"])
def test_kernels_follow_numpy(compiler, dtype):
    """conv_set, conv_nt and conv_acc on images laid out as the batch buffers (a slot's CAPACITY
    samples side by side), weights in rows with a gap after them (the bias elsewhere), against
    NumPy's sums over windows; nothing past the batch's S samples written."""
    ffi, lib = kernels(compiler, dtype)
    _, np_type, rtol = DTYPES[dtype]
    rng = np.random.default_rng(0)

    def ptr(a):
        return ffi.cast("real *", a.ctypes.data)
    worst = 0.0
    for case in CASES:
        F, kh, kw, H, W, S = case
        P, Q, K = H - kh + 1, W - kw + 1, kh * kw
        window = [(ky, kx) for ky in range(kh) for kx in range(kw)]
        offsets = np.array([(ky * W + kx) * CAPACITY for ky, kx in window], np.int32)
        table = ffi.cast("int *", offsets.ctypes.data)
        x = rng.standard_normal((H, W, CAPACITY)).astype(np_type)
        w = rng.standard_normal((F, K + 2)).astype(np_type)  # a filter's K weights, then 2 other values
        bias = rng.standard_normal(F).astype(np_type)
        X = np.stack([x[ky:ky + P, kx:kx + Q, :S] for ky, kx in window], axis=2).astype(np.float64)  # P, Q, K, S
        Wk = w[:, :K].astype(np.float64)
        expected = np.einsum("fk,pqks->fpqs", Wk, X) + bias[:, None, None, None]
        out, relu = np.full((F, P, Q, CAPACITY), 7, np_type), np.full((F, P, Q, CAPACITY), 7, np_type)
        lib.call_set(ptr(out), P * Q * CAPACITY, Q * CAPACITY, CAPACITY, ptr(bias), 1, ptr(w), K + 2, 1, ptr(x),
                     W * CAPACITY, CAPACITY, table, F, P, Q, S, K, ptr(relu))
        worst = max(worst, compare(out[..., :S], expected, rtol, "conv_set", case))
        assert (out[..., S:] == 7).all() and (relu[..., S:] == 7).all()  # nothing past the batch
        np.testing.assert_array_equal(relu[..., :S], np.where(out[..., :S] < 0, 0, out[..., :S]))  # the epilogue
        go = rng.standard_normal((F, P, Q, CAPACITY)).astype(np_type)
        G = go[..., :S].astype(np.float64)
        gw, gb = rng.standard_normal((F, K + 2)).astype(np_type), rng.standard_normal(F).astype(np_type)
        gw_before, gb_before = gw.copy(), gb.copy()
        lib.call_nt(ptr(gw), K + 2, 1, ptr(gb), 1, ptr(go), P * Q * CAPACITY, Q * CAPACITY, CAPACITY, ptr(x),
                    W * CAPACITY, CAPACITY, table, F, P, Q, S, K)
        worst = max(worst, compare(gw[:, :K], gw_before[:, :K] + np.einsum("fpqs,pqks->fk", G, X), rtol, "conv_nt",
                                   case))
        np.testing.assert_array_equal(gw[:, K:], gw_before[:, K:])  # the gap untouched
        worst = max(worst, compare(gb, gb_before + G.sum(axis=(1, 2, 3)), rtol, "conv_nt's bias", case))
        gx = rng.standard_normal((H, W, CAPACITY)).astype(np_type)
        expected_gx = gx.astype(np.float64)
        terms = np.einsum("fk,fpqs->pqks", Wk, G)
        for k, (ky, kx) in enumerate(window):
            expected_gx[ky:ky + P, kx:kx + Q, :S] += terms[:, :, k]
        lib.call_acc(ptr(gx), W * CAPACITY, CAPACITY, table, ptr(w), K + 2, 1, ptr(go), P * Q * CAPACITY,
                     Q * CAPACITY, CAPACITY, F, P, Q, S, K)
        worst = max(worst, compare(gx, expected_gx, rtol, "conv_acc", case))  # (past S: unchanged, exactly)
    print(f"{compiler} {dtype}: max relative difference {worst:.2e}")


# ---- a CNN over batches -----------------------------------------------------------------------

SIDE, FIRST, SECOND, CLASSES = 9, 2, 3, 4  # 9x9 images, 3x3 windows: 2 planes of 7x7, then 3 of 5x5


def two_convolutions(seed=0, first=FIRST, second=SECOND):
    """(params, pixels, targets, logits, loss, forward): 3x3 convolution with `first` filters, ReLU,
    3x3 convolution over those planes with `second` filters (windows of 9 * first; each product
    written input first, so the weights are the dot's second list), ReLU, dense to CLASSES,
    softmax cross-entropy; forward(image) builds one sample's logits for the interpreter."""
    random.seed(seed)
    uniform = lambda n, scale: [Value(random.uniform(-1, 1) * scale) for _ in range(n)]
    w1, b1 = uniform(first * 9, 0.8), uniform(first, 0.1)
    w2, b2 = uniform(second * first * 9, 0.5), uniform(second, 0.1)
    dense = uniform(CLASSES * second * 25, 0.3)
    bias = uniform(CLASSES, 0.1)
    params = w1 + b1 + w2 + b2 + dense + bias

    def forward(x):  # x: SIDE rows of SIDE Values or numbers
        h = [[[(sum(w1[f * 9 + 3 * ky + kx] * x[i + ky][j + kx] for ky in range(3) for kx in range(3)) + b1[f]).relu()
               for j in range(7)] for i in range(7)] for f in range(first)]
        h2 = [(sum(h[c][i + ky][j + kx] * w2[(f * first + c) * 9 + 3 * ky + kx]  # (inputs first: swapped)
                   for c in range(first) for ky in range(3) for kx in range(3)) + b2[f]).relu()
              for f in range(second) for i in range(5) for j in range(5)]
        return [sum(dense[n * len(h2) + k] * v for k, v in enumerate(h2)) + bias[n] for n in range(CLASSES)]

    pixels = [Value(0.0) for _ in range(SIDE * SIDE)]
    targets = [Value(0.0) for _ in range(CLASSES)]
    logits = forward([pixels[r * SIDE:(r + 1) * SIDE] for r in range(SIDE)])
    return (params, pixels, targets, logits, cross_entropy(logits, targets),
            lambda image: forward(image.reshape(SIDE, SIDE).tolist()))


def interpreted(params, forward, X, y, lr, batch_size):
    """SGD on each batch's mean gradient in micrograd_c's interpreter; the parameters' values after it
    (the Values set back to where they started)."""
    start = [p.data for p in params]
    for first in range(0, len(X), batch_size):
        rows = range(first, min(first + batch_size, len(X)))
        total = np.zeros(len(params))
        for r in rows:
            for p in params:
                p.grad = 0
            cross_entropy(forward(X[r]), [1.0 if k == y[r] else 0.0 for k in range(CLASSES)]).backward()
            total += [p.grad for p in params]
        for p, g in zip(params, total / len(rows)):
            p.data -= lr * g
    after = np.array([p.data for p in params])
    for p, v in zip(params, start):
        p.data = v
    return after


def data(n=20, seed=1):
    rng = np.random.default_rng(seed)
    return rng.random((n, SIDE * SIDE)), rng.integers(0, CLASSES, n)


def test_both_convolutions_become_kernels():
    """The lowering's groups for the two convolutions are Convolutions over the batch, the
    batched C calls each kernel (the second's inputs need gradients: conv_acc; each ReLU is
    conv_set's epilogue), and codegen.explain names them."""
    params, pixels, targets, logits, loss, _ = two_convolutions()
    program = batch.batch_program(ir.lower(loss, pixels + targets, params, logits))
    found = [convolution(g) for g in program.forward if convolution(g)]
    assert [(len(c.inputs.offsets), c.swapped) for c in found] == [(9, False), (18, True)]
    source = "\n".join(codegen.generate(loss, pixels + targets, params, logits))
    for kernel, calls in (("conv_set(d", 2), ("conv_nt(g", 2), ("conv_acc(g", 1)):
        assert source.count(kernel) == calls, kernel
    assert source.count("nb, 9, epilogue_") == 1 and source.count("nb, 18, epilogue_") == 1
    assert "steps 0, 2 a convolution over the batch" in codegen.explain(loss, pixels + targets, params, logits).summary()


def _model_grid():
    """Both dtypes on TCC and GCC float32 (the benchmark's compiler) in the default suite (a model's
    build by an optimising compiler takes 1.5 s); the rest of the grid in the slow set."""
    for compiler in COMPILER_NAMES:
        for dtype in ("float64", "float32"):
            slow = compiler != "tcc" and (compiler, dtype) != ("gcc", "float32")
            yield pytest.param(compiler, dtype, id=f"{compiler}-{dtype}", marks=[pytest.mark.slow] * slow)


@pytest.mark.parametrize("compiler, dtype", list(_model_grid()), indirect=["compiler"])
def test_a_cnn_over_batches_equals_the_interpreter(compiler, dtype):
    """Batches of 13 and 7 (samples after the last vector in both dtypes), the mean gradient's step:
    the parameters equal the interpreter's to the fused bound; predict() equals its forward."""
    params, pixels, targets, logits, loss, forward = two_convolutions()
    X, y = data()
    expected = interpreted(params, forward, X, y, 0.1, 13)
    net = codegen.compile(loss, pixels + targets, params, outputs=logits, compiler=compiler, dtype=dtype, batch=16,
                          tiered=False)
    net.train(X, y, 0.1, batch_size=13)
    rtol = {"float64": 1e-9, "float32": 2e-4}[dtype]
    np.testing.assert_allclose(net.params, expected, rtol=rtol, atol=rtol * np.abs(expected).max())
    assert not np.allclose(expected, [p.data for p in params])  # it moved
    for p, v in zip(params, net.params):
        p.data = float(v)
    predicted = np.asarray(net.predict(X))
    reference = np.array([[v.data for v in forward(image)] for image in X])
    np.testing.assert_allclose(predicted, reference, rtol=rtol, atol=rtol * np.abs(reference).max())


def test_the_same_bits_on_one_and_two_threads():  # (TCC: the split is the same in every build)
    """Filters (the weights' gradients) and rows (the forward) split between threads, never a
    sum: the parameters after an epoch of batches of 64 are the same bits on 1 and 2 threads
    (8 and 8 filters: the second convolution's 0.9 M multiply-adds a batch are shared, gemm.c's
    GEMM_PARALLEL_MIN)."""
    params, pixels, targets, logits, loss, _ = two_convolutions(first=8, second=8)
    X, y = data(192, seed=2)
    results = []
    for threads in (1, 2):
        net = codegen.compile(loss, pixels + targets, params, outputs=logits, compiler="tcc", threads=threads)
        assert net.threads() == threads
        net.train(X, y, 0.05, batch_size=64)
        results.append(np.asarray(net.params).copy())
    np.testing.assert_array_equal(results[0], results[1])
