"""The matrix products of templates/kernels/gemm.c called directly, against NumPy (llm.c's way: every
kernel checked against a reference, its max difference printed): matmul_set (a layer over a
batch, from its bias), matmul_acc (its inputs' gradients) and matmul_nt (its weights'
gradients), at sizes that leave tails in every direction (rows after the last block of six,
columns after the last pair of vectors and the last vector), with strides as the generated code
passes them, over all input rows and over the list scan_rows makes of those that hold a nonzero
(sparse inputs, a third of the rows zero; and a quarter of the gradient rows 0, which matmul_acc
leaves out; matmul_set and matmul_acc with an epilogue, a ReLU and its gradient, and matmul_set
with relu, the ReLU of its sums as they are stored; matmul_nt with the biases' gradients, and
stepping the weights and the biases; both in one call, matmul_acc_nt, the bits of the two); each
variant of the micro-kernel built (the plain loops, AVX2's tile, AVX-512's: every build holds
them all), those this CPU has run, forced in turn (gemm_forced_variant), with the sums in slices (gemm_forced_depth: 7 terms, the depth chosen for
the L2) and in one piece, the vector variants and depths giving the same bits; and as a module
builds them, in chunks of rows with B packed once for the chunks (gemm_packed), the same bits
as unpacked."""

import functools
import itertools

import cffi
import numpy as np
import pytest

import templates
from codegen.backend import toolchain
from codegen.backend.toolchain import COMPILER_NAMES
from conftest import bits, compiler_diagonal, requires
from pathlib import Path

HARNESS = """
static void relu_rows(const real *restrict x, real *restrict y, const real *restrict a, const real *restrict o,
                      long count)
{ (void)a; (void)o; for (long n = 0; n < count; n++) y[n] = where(x[n] < 0, 0, x[n]); }
static void relu_gradient_rows(const real *restrict x, real *restrict y, const real *restrict a,
                               const real *restrict o, long count)
{ (void)a; for (long n = 0; n < count; n++) y[n] += (o[n] > 0) * x[n]; }
void call_set(real *out, long out_j, const real *bias, long bias_j, const real *w, long w_j, long w_k,
              const real *x, long x_k, long J, long S, long K, const int32_t *rows, real *y, int relu)
{ matmul_set(out, out_j, bias, bias_j, w, w_j, w_k, x, x_k, J, S, K, rows, y ? relu_rows : 0, y, 128, relu); }
void call_acc(real *out, long out_k, const real *w, long w_j, long w_k, const real *go, long go_j,
              long J, long S, long K, real *y, const real *o, int overwrite)
{ matmul_acc(out, out_k, w, w_j, w_k, go, go_j, J, S, K, y ? relu_gradient_rows : 0, y, 128, 0, 0, o, 128, overwrite); }
void call_nt(real *out, long out_j, const real *go, long go_j, const real *x, long x_k, long J, long K, long S,
             const int32_t *rows, real *w, real rate, real *bias)
{ matmul_nt(out, out_j, go, go_j, x, x_k, J, K, S, rows, w, rate, bias, out_j); }
real call_sum(const real *x, long n) { return sum_range(x, n); }
void call_acc_nt(real *out, real *w, long w_j, const real *go, long J, long S, long K, real *y, const real *o,
                 real *grad, const real *x, const int32_t *rows, real rate, real *bias)
{ matmul_acc_nt(out, 128, w, w_j, 1, go, 128, J, S, K, y ? relu_gradient_rows : 0, y, 128, 0, 0, o, 128, 0,
                grad, w_j, x, 128, rows, w, rate, bias, w_j); }
void call_scan(const real *x, long stride, long nb, long n, int32_t *list) { scan_rows(x, stride, nb, n, list); }
void call_transpose(const real *x, long x_k, long n, long p, real *xt) { gemm_transpose(x, x_k, n, p, xt); }
const char *call_variant(void) { return gemm_variant()->name; }
void call_force(int variant, long depth) { gemm_forced_variant = variant, gemm_forced_depth = depth; }
"""
DECLARATIONS = """
void call_set(real *out, long out_j, const real *bias, long bias_j, const real *w, long w_j, long w_k,
              const real *x, long x_k, long J, long S, long K, const int *rows, real *y, int relu);
void call_acc(real *out, long out_k, const real *w, long w_j, long w_k, const real *go, long go_j,
              long J, long S, long K, real *y, const real *o, int overwrite);
void call_nt(real *out, long out_j, const real *go, long go_j, const real *x, long x_k, long J, long K, long S,
             const int *rows, real *w, real rate, real *bias);
real call_sum(const real *x, long n);
void call_acc_nt(real *out, real *w, long w_j, const real *go, long J, long S, long K, real *y, const real *o,
                 real *grad, const real *x, const int *rows, real rate, real *bias);
void call_scan(const real *x, long stride, long nb, long n, int *list);
void call_transpose(const real *x, long x_k, long n, long p, real *xt);
const char *call_variant(void);
void call_force(int variant, long depth);
"""
DTYPES = {"float64": ("double", np.float64, 1e-12), "float32": ("float", np.float32, 2e-5)}
# (neurons J, samples S, inputs K): tails of rows, vectors and columns (the last vector loaded
# and stored in part); one of each size 1; a projection over 7 positions (microgpt)
SIZES = [(13, 37, 29), (6, 64, 8), (1, 1, 1), (7, 5, 3), (25, 128, 70), (100, 33, 150), (140, 40, 9), (48, 7, 16),
         (150, 9, 40)]


# gemm.c's table of variants when built without -march=native (each width, chosen when it runs)
VARIANTS = {"plain": 0, "avx2 6x2": 1, "avx512 6x2": 2}
ONE_PIECE = 1 << 30  # a depth that no sum is sliced at


# A module's build (HAVE_THREAD_POOL 1) whose products run in chunks of a tile's rows, the last
# chunk first, on the caller's thread: each product shared (GEMM_PARALLEL_MIN 0) and B packed
# (templates/kernels/gemm.c's gemm_packed) where a slice fits 4,096 values and the product has
# 6 rows, so that some sizes are packed and others not, and the chunks after the first read the
# panels the first packed; the weights' gradients (parallel_shares) in two shares of rows, the
# second first; the inputs' gradients of a batch of at most J / 8 (parallel_pipeline) in
# PIPELINE_PARTS parts of the neurons' rows (two: gemm_pipeline_share's uneven cut; three: even)
# on each chunk, the last chunk first, then the parts' `then` (the weights' gradients of
# matmul_acc_nt), the last part's first.
CHUNKED = """#define HAVE_THREAD_POOL 1
#define GEMM_PARALLEL_MIN 0
#define GEMM_PACK_B 4096
#define GEMM_PACK_B_ROWS 6
"""
CHUNKS = """
SHARED void parallel_rows(RowTask task, void *args, long rows, long align)
{ for (long first = (rows - 1) / align * align; first >= 0; first -= align) task(args, first, first + align < rows ? first + align : rows); }
SHARED void parallel_shares(RowTask task, void *args, long rows, long align)
{ long half = (rows + 2 * align - 1) / (2 * align) * align; half = half < rows ? half : rows; task(args, half, rows); task(args, 0, half); }
SHARED int pool_parts(void) { return 1; }
SHARED void parallel_share(long rows, long align, int part, int parts, long *first, long *last)
{ long blocks = (rows + align - 1) / align; *first = blocks * part / parts * align; *last = blocks * (part + 1) / parts * align;
  *first = *first < rows ? *first : rows; *last = *last < rows ? *last : rows; }
SHARED void parallel_pipeline(PartTask task, PartTask then, void *args, long rows, long align, long terms,
                              long terms_align)
{ (void)terms, (void)terms_align; for (long first = (rows - 1) / align * align; first >= 0; first -= align)
  for (int part = 0; part < PIPELINE_PARTS; part++) task(args, first, first + align < rows ? first + align : rows, part, PIPELINE_PARTS);
  for (int part = PIPELINE_PARTS - 1; then && part >= 0; part--) then(args, 0, 0, part, PIPELINE_PARTS); }
"""


@functools.cache
def kernels(compiler, dtype, chunked=0):
    """The kernels built into a library with the harness (every variant, each forced in turn):
    as exported C builds them (no threads), or in chunks (CHUNKED), a pipeline in `chunked` parts."""
    ctype = DTYPES[dtype][0]
    defines = f"#define REAL_IS_FLOAT {int(dtype == 'float32')}\n" + (
        CHUNKED + f"#define PIPELINE_PARTS {chunked}\n" if chunked else "#define HAVE_THREAD_POOL 0\n")
    source = defines + templates.read("prelude.c") + (CHUNKS if chunked else "") + HARNESS
    build = toolchain.build_library(source, f"gemm_chunked{chunked}" if chunked else "gemm", compiler, opt=2)
    ffi = cffi.FFI()
    ffi.cdef(f"typedef {ctype} real;\n" + DECLARATIONS)
    return ffi, ffi.dlopen(str(build.path))


def check(compiler, dtype, variant=None, depth=None, chunked=0):
    """The products at every size against NumPy, asserting the bound; the results, in order.
    variant and depth: forced (None: the machine's choice); chunked: kernels()'s."""
    ffi, lib = kernels(compiler, dtype, chunked)
    lib.call_force(-1 if variant is None else VARIANTS[variant], depth or 0)
    ran = ffi.string(lib.call_variant()).decode()
    assert variant is None or ran == variant, (variant, ran)
    _, np_type, rtol = DTYPES[dtype]
    rng = np.random.default_rng(0)

    def ptr(a):
        return ffi.cast("real *", a.ctypes.data)
    worst, results = 0.0, []
    for (J, S, K), sparse in itertools.product(SIZES, (False, True)):
        # the generated code's layout: weights rows of K + 1 (a bias after them), rows of 128 samples
        w = rng.standard_normal((J, K + 1)).astype(np_type)
        x = np.zeros((K, 128), np_type)
        x[:, :S] = rng.standard_normal((K, S))
        rows = ffi.NULL
        if sparse:  # every third input row 0 over the batch, listed out by scan_rows
            x[::3] = 0
            listed = np.zeros(K + 1, np.int32)
            lib.call_scan(ptr(x), 128, S, K, ffi.cast("int *", listed.ctypes.data))
            assert list(listed[1:1 + listed[0]]) == [k for k in range(K) if k % 3]
            rows = ffi.cast("int *", listed.ctypes.data)
        go = np.zeros((J, 128), np_type)
        go[:, :S] = rng.standard_normal((J, S))
        if sparse:  # and every fourth neuron's gradient row 0 (a ReLU that is off): matmul_acc leaves it out
            go[1::4] = 0
        W, X, G, bias = w[:, :K].astype(np.float64), x[:, :S].astype(np.float64), go[:, :S].astype(np.float64), w[:, K]
        out, relu = np.zeros((J, 128), np_type), np.zeros((J, 128), np_type)
        bias_column = w[:, K:].copy()  # kept alive through the call (a temporary's memory could be reused)
        lib.call_set(ptr(out), 128, ptr(bias_column), 1, ptr(w), K + 1, 1, ptr(x), 128, J, S, K, rows,
                     ptr(relu) if sparse else ffi.NULL, 0)
        expected = W @ X + bias[:, None]
        worst = max(worst, compare(out[:, :S], expected, rtol, "matmul_set", J, S, K, sparse))
        assert not out[:, S:].any()  # nothing past the batch
        if sparse:  # with an epilogue (a ReLU): applied to every row, exactly, and nothing past the batch
            np.testing.assert_array_equal(relu[:, :S], np.where(out[:, :S] < 0, 0, out[:, :S]))
            assert not relu[:, S:].any()
        in_place = np.zeros((J, 128), np_type)  # with relu: the sums' ReLU, stored as such, exactly
        lib.call_set(ptr(in_place), 128, ptr(bias_column), 1, ptr(w), K + 1, 1, ptr(x), 128, J, S, K, rows,
                     ffi.NULL, 1)
        np.testing.assert_array_equal(in_place, np.where(out < 0, 0, out))
        start = rng.standard_normal((K, 128)).astype(np_type)
        dx = start.copy()
        # with an epilogue (sparse cases): a ReLU's gradient, from its results x (a third of them 0)
        dy, relu_out = rng.standard_normal((K, 128)).astype(np_type), x.copy()
        dy_before = dy.copy()
        lib.call_acc(ptr(dx), 128, ptr(w), K + 1, 1, ptr(go), 128, J, S, K,
                     *((ptr(dy), ptr(relu_out)) if sparse else (ffi.NULL, ffi.NULL)), 0)
        worst = max(worst, compare(dx[:, :S], start[:, :S] + W.T @ G, rtol, "matmul_acc", J, S, K, sparse))
        np.testing.assert_array_equal(dx[:, S:], start[:, S:])
        if sparse:  # exactly the loop's sums, from the finished inputs' gradients; nothing past the batch
            expected_dy = dy_before[:, :S] + (relu_out[:, :S] > 0) * dx[:, :S]
            np.testing.assert_array_equal(dy[:, :S], expected_dy)
            np.testing.assert_array_equal(dy[:, S:], dy_before[:, S:])
        # overwriting: the sum from 0 whatever out held, the bits of adding it to a cleared out; and
        # where no neuron's gradient row holds a nonzero, 0
        cleared, written = np.zeros((K, 128), np_type), rng.standard_normal((K, 128)).astype(np_type)
        held = written.copy()
        for into, overwrite in ((cleared, 0), (written, 1)):
            lib.call_acc(ptr(into), 128, ptr(w), K + 1, 1, ptr(go), 128, J, S, K, ffi.NULL, ffi.NULL, overwrite)
        np.testing.assert_array_equal(bits(written[:, :S]), bits(cleared[:, :S]))
        np.testing.assert_array_equal(written[:, S:], held[:, S:])
        silent, off = rng.standard_normal((K, 128)).astype(np_type), np.zeros_like(go)
        lib.call_acc(ptr(silent), 128, ptr(w), K + 1, 1, ptr(off), 128, J, S, K, ffi.NULL, ffi.NULL, 1)
        assert not silent[:, :S].any() and not np.signbit(silent[:, :S]).any()
        dw = rng.standard_normal((J, K + 1)).astype(np_type)
        before = dw.copy()
        # with the biases' gradients (the column after the weights'): each row's sum_range added
        lib.call_nt(ptr(dw), K + 1, ptr(go), 128, ptr(x), 128, J, K, S, rows, ffi.NULL, 0, ptr(dw[:, K:]))
        worst = max(worst, compare(dw[:, :K], before[:, :K] + G @ X.T, rtol, "matmul_nt", J, S, K, sparse))
        worst = max(worst, compare(dw[:, K], before[:, K] + G.sum(axis=1), rtol, "matmul_nt's bias", J, S, K, sparse))
        sums = np.array([lib.call_sum(ptr(go[j]), S) for j in range(J)], np_type)
        np.testing.assert_array_equal(dw[:, K], before[:, K] + sums)
        if sparse:  # an unlisted row adds nothing to its weights' gradients
            np.testing.assert_array_equal(dw[:, :K:3], before[:, :K:3])
        # stepping the weights instead (SGD after a batch, from zero gradients), in pieces of 32
        # samples (HAVE_THREAD_POOL 0; 128 chunked): the gradients stay (or end) 0
        weights, zero = w.copy(), np.zeros((J, K + 1), np_type)
        lib.call_nt(ptr(zero), K + 1, ptr(go), 128, ptr(x), 128, J, K, S, rows, ptr(weights), 0.25,
                    ptr(weights[:, K:]) if sparse else ffi.NULL)
        worst = max(worst, compare(weights[:, :K], W - 0.25 * (G @ X.T), rtol, "matmul_nt stepping", J, S, K, sparse))
        # the biases (the column after the weights) stepped too, when given: by the sums' step, exactly
        np.testing.assert_array_equal(weights[:, K], w[:, K] - np_type(0.25) * sums if sparse else w[:, K])
        assert not zero.any()
        # both in one call (matmul_acc_nt: the weights read, then stepped): the two calls' bits
        fused_dx, fused_dy, fused_w, fused_zero = start.copy(), dy_before.copy(), w.copy(), np.zeros_like(zero)
        lib.call_acc_nt(ptr(fused_dx), ptr(fused_w), K + 1, ptr(go), J, S, K,
                        *((ptr(fused_dy), ptr(relu_out)) if sparse else (ffi.NULL, ffi.NULL)), ptr(fused_zero),
                        ptr(x), rows, 0.25, ptr(fused_w[:, K:]) if sparse else ffi.NULL)
        for got, expected in ((fused_dx, dx), (fused_dy, dy), (fused_w, weights), (fused_zero, zero)):
            np.testing.assert_array_equal(bits(got), bits(expected))
        results += [out, relu, dx, dy, written, dw, weights]
    chunks = f", chunked, a pipeline in {chunked} parts" if chunked else ""
    print(f"{compiler} {dtype} {ran}, depth {depth or 'for the L2'}{chunks}: max relative difference {worst:.2e}")
    return results


def compare(got, expected, rtol, what, *case):
    scale = np.abs(expected).max() + 1
    diff = float(np.abs(got.astype(np.float64) - expected).max() / scale)
    assert diff <= rtol, f"{what} at J, S, K, sparse = {case}: {diff:.3e} > {rtol}"
    return diff


@pytest.mark.parametrize("dtype", DTYPES)
def test_products_follow_numpy(compiler, dtype):
    """The widest vectors the CPU has (TCC: the plain loops)."""
    check(compiler, dtype)


def cpu_variants():
    """The variants this CPU runs, as templates/kernels/gemm.c's choice asks for them (/proc/cpuinfo's
    flags): the plain loops everywhere, AVX2's tile with FMA, AVX-512's with AVX-512F."""
    flags = next((set(line.split(":", 1)[1].split()) for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("flags")), set())
    return {"plain"} | ({"avx2 6x2"} if {"avx2", "fma"} <= flags else set()) | (
        {"avx512 6x2"} if "avx512f" in flags else set())


VECTOR_COMPILERS = [name for name in COMPILER_NAMES if toolchain.FAMILIES[name].native]


@pytest.fixture(params=VECTOR_COMPILERS)
def vector_compiler(request):
    """Each compiler that builds the vector kernels (not TCC: it builds the plain loops only)."""
    return requires(request.param)


# each variant on one compiler (the rest in the slow set)
@pytest.mark.parametrize("vector_compiler, variant", list(compiler_diagonal(
    ["avx2 6x2", "plain", "avx512 6x2"], compilers=VECTOR_COMPILERS)), indirect=["vector_compiler"])
def test_each_variant(vector_compiler, variant):
    """Each variant (GCC, Clang: the plain loops, AVX2's tile, AVX-512's), forced, its sums in slices
    of 7 terms (tails in every slice) and in one piece: run where the CPU has it, built (not run) where it does not (an
    illegal instruction would kill the run)."""
    if variant in cpu_variants():
        for dtype in DTYPES:
            for depth in (7, ONE_PIECE):
                check(vector_compiler, dtype, variant, depth)
    else:  # (every build holds every variant)
        kernels(vector_compiler, "float32")


# each dtype on one compiler at least (the rest in the slow set)
@pytest.mark.parametrize("vector_compiler, dtype", list(compiler_diagonal(list(DTYPES), compilers=VECTOR_COMPILERS)),
                         indirect=["vector_compiler"])
def test_same_bits_in_every_vector_variant(vector_compiler, dtype):
    """The vector variants this CPU runs, and the sums' slices (3 terms, the L2's depth, one
    piece), give the same bits: each element is summed the same way in each (the choice of
    variant and depth is the machine's, the numbers are not)."""
    runs = [(v, d) for v in sorted(cpu_variants() - {"plain"}) for d in (3, None, ONE_PIECE)]
    if not runs:
        pytest.skip("this CPU has no vector variant")
    first = check(vector_compiler, dtype, *runs[0])
    for variant, depth in runs[1:]:
        for a, b in zip(first, check(vector_compiler, dtype, variant, depth)):
            np.testing.assert_array_equal(a, b, err_msg=f"{runs[0]} against {variant}, depth {depth}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_b_has_the_same_bits(compiler, dtype):
    """A module's products in chunks, B packed once for the chunks that read it (gemm_packed), at
    the sizes kernels() packs and those it does not, in one piece and in slices: NumPy's within the
    bound, and the bits of the products unpacked (exported C's build: no threads, no packing);
    TCC's plain loops pack nothing and are the same build either way. The inputs' gradients in
    two parts (the first part's share bigger: gemm_pipeline_share) and in three."""
    native = toolchain.FAMILIES[toolchain.find_compiler(compiler).family].native
    for depth in (3, ONE_PIECE):
        for parts in (2, 3):
            for a, b in zip(check(compiler, dtype, None, depth), check(compiler, dtype, None, depth, chunked=parts)):
                np.testing.assert_array_equal(a, b, err_msg=f"depth {depth}, native {native}, {parts} parts")


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_is_numpys(compiler, dtype):
    """matmul_nt's packing (gemm_transpose: AVX's squares of lanes where the CPU has them, the plain
    loops forced or on TCC) is NumPy's transpose exactly, at sizes with columns and samples after
    the last square, from rows of a longer stride."""
    ffi, lib = kernels(compiler, dtype)
    np_type = DTYPES[dtype][1]
    rng = np.random.default_rng(1)
    forced = [-1, VARIANTS["plain"]] if toolchain.FAMILIES[toolchain.find_compiler(compiler).family].native else [-1]
    for variant, n, p in itertools.product(forced, (1, 3, 4, 8, 13, 16, 64), (1, 5, 8, 12, 31, 128)):
        lib.call_force(variant, 0)
        x = rng.standard_normal((n, p + 3)).astype(np_type)
        xt = np.full((p, n), np.nan, np_type)
        lib.call_transpose(ffi.cast("real *", x.ctypes.data), p + 3, n, p, ffi.cast("real *", xt.ctypes.data))
        np.testing.assert_array_equal(xt, x[:, :p].T, err_msg=f"variant {variant}, n {n}, p {p}")
    lib.call_force(-1, 0)


def test_chosen_variant_is_the_widest_the_cpu_runs(compiler):
    """Left to choose, the build takes the widest vectors this CPU has (TCC: the plain loops), zig's
    too (CPUID read directly: its compiler-rt answers __builtin_cpu_supports with 0)."""
    ffi, lib = kernels(compiler, "float32")
    lib.call_force(-1, 0)  # (the library is shared with the tests that force one)
    ran = ffi.string(lib.call_variant()).decode()
    if not toolchain.FAMILIES[toolchain.find_compiler(compiler).family].native:
        assert ran == "plain"
    else:
        assert ran == max(cpu_variants(), key=lambda v: {"plain": 0, "avx2 6x2": 32, "avx512 6x2": 64}[v])


def test_module_reports_its_variant(compiler):
    """A module's gemm_kernel() names the variant its products run (the widest this CPU has;
    TCC: the plain loops) and that variant's tile."""
    from mnist.model import build_graph
    net = build_graph(hidden=(4,), init="he").compile(compiler=compiler, dtype="float32")
    kernel = net.gemm_kernel()
    assert kernel["variant"] in cpu_variants() and kernel["l2_bytes"] >= 65536
    if kernel["variant"] == "plain":
        assert (kernel["tile_rows"], kernel["tile_columns"], kernel["vector_bytes"]) == (6, 1, 0)
    else:  # 6 rows by 2 vectors of float32
        assert (kernel["tile_rows"], kernel["tile_columns"]) == (6, 2 * kernel["vector_bytes"] // 4)
    if not toolchain.FAMILIES[toolchain.find_compiler(compiler).family].native:
        assert kernel["variant"] == "plain"
