"""The sparse-input kernels of templates/kernels/sparse.c called directly, against dot() and the dense
updates as the reference (llm.c's way: every kernel checked, its max difference printed):
matvec, four rows at a time over short nonzero chunk lists and a row at a time otherwise, and
dot_nz, axpy_nz and sgd_axpy_nz; and axpy_offsets_lanes (a batch's lanes side by side) against
axpy_offsets lane by lane, and the *_lanes_rows kernels against their lanes kernels row by row. Each promises the reference's numbers exactly, for every compiler and
dtype. And the row kernels of exp, tanh and sigmoid against the C library's functions, to their
bounds."""


import itertools

import cffi
import numpy as np
import pytest

import templates
from codegen.backend import toolchain
from codegen.write import contract
from codegen.write.dtypes import DTYPES
from codegen.write.sides import nonzero_words
from micrograd_c import ops
from conftest import requires, same_bits

HARNESS = """
void call_dot_rows(real *out, const real *w, long w_j, const real *x, long n, long J)
{ for (long j = 0; j < J; j++) out[j] = dot(w + j * w_j, x, n); }
void call_matvec(real *out, long out_j, const real *bias, long bias_j, const real *w, long w_j,
                 const real *x, long n, long J, const int32_t *nz)
{ matvec(out, out_j, bias, bias_j, w, w_j, x, n, J, nz); }
void call_scan(const real *x, long n, int32_t *nz) { scan_range(x, n, nz); }
real call_dot_nz(const real *a, const real *x, long n, const int32_t *nz) { return dot_nz(a, x, n, nz); }
void call_axpy(real *y, real alpha, const real *x, long n, const int32_t *nz)
{ if (nz) axpy_nz(y, alpha, x, n, nz); else axpy(y, alpha, x, n); }
void call_sgd_axpy(real *w, real lr, real alpha, const real *x, long n, const int32_t *nz)
{ if (nz) sgd_axpy_nz(w, lr, alpha, x, n, nz); else sgd_axpy(w, lr, alpha, x, n); }
void call_row(int f, real *y, const real *x, long n)
{ if (f == 2) sigmoid_range(y, x, n); else if (f) tanh_range(y, x, n); else exp_range(y, x, n); }
void call_gather(int f, real *d, const int32_t *rows, long n)
{ if (f == 2) sigmoid_gather(d, rows, n); else if (f) tanh_gather(d, rows, n); else exp_gather(d, rows, n); }
void call_axpy_lanes(real *y, const int32_t *oy, const real *alpha, const real *x, const int32_t *ox, long n,
                     long lanes, int by_lane)
{
    if (!by_lane)
        axpy_offsets_lanes(y, oy, alpha, x, ox, n, lanes);
    for (long l = 0; by_lane && l < lanes; l++)
        axpy_offsets(y + l, oy, alpha[l], x + l, ox, n);
}
void call_dot_lanes(real *out, const real *a, const int32_t *oa, const real *b, const int32_t *ob, long n,
                    long lanes, int by_lane)
{
    if (!by_lane)
        dot_offsets_lanes(out, a, oa, b, ob, n, lanes);
    for (long l = 0; by_lane && l < lanes; l++)
        out[l] = dot_offsets(a + l, oa, b + l, ob, n);
}
void call_sum_lanes(real *out, const real *x, const int32_t *ox, long n, long lanes, int by_lane)
{
    if (!by_lane)
        sum_offsets_lanes(out, x, ox, n, lanes);
    for (long l = 0; by_lane && l < lanes; l++)
        out[l] = sum_offsets(x + l, ox, n);
}
void call_axpy_lanes_rows(real *y, const int32_t *oy, long y_step, const real *alpha, long alpha_step,
                          const real *x, const int32_t *ox, long x_step, long n, long lanes, long rows, int by_row)
{
    if (!by_row)
        axpy_offsets_lanes_rows(y, oy, y_step, alpha, alpha_step, x, ox, x_step, n, lanes, rows);
    for (long r = 0; by_row && r < rows; r++)
        axpy_offsets_lanes(y + r * y_step, oy, alpha + r * alpha_step, x + r * x_step, ox, n, lanes);
}
void call_dot_lanes_rows(real *out, long out_step, const real *a, const int32_t *oa, const real *b, long b_step,
                         const int32_t *ob, long n, long lanes, long rows, int by_row)
{
    if (!by_row)
        dot_offsets_lanes_rows(out, out_step, a, oa, b, b_step, ob, n, lanes, rows);
    for (long r = 0; by_row && r < rows; r++)
        dot_offsets_lanes(out + r * out_step, a, oa, b + r * b_step, ob, n, lanes);
}
void call_clear_rows(real *y, long y_j, long J, long S) { clear_rows(y, y_j, J, S); }
void call_add_lanes(real *y, const int32_t *oy, const real *alpha, long n, long lanes, int by_lane)
{
    if (!by_lane)
        add_offsets_lanes(y, oy, alpha, n, lanes);
    for (long l = 0; by_lane && l < lanes; l++)
        if (alpha[l] != 0)
            add_offsets(y + l, oy, alpha[l], n);
}
void call_largest_lanes(real *out, real *g, const real *x, long step, long n, const real *go, long lanes, int by_lane)
{
    if (!by_lane) {
        largest_lanes(out, x, step, n, lanes);
        add_to_largest_lanes(g, x, step, n, go, lanes);
    }
    for (long l = 0; by_lane && l < lanes; l++) {
        const long k = largest_at(x + l, step, n);
        out[l] = x[l + step * k];
        g[l + step * k] += go[l];
    }
}
void call_held_sums(real *y, long y_row, real *alpha, const int32_t *oa, int clear, const real *x, long x_row,
                    long x_step, const real *active, long active_step, long first, long n, long lanes, long rows,
                    int by_nest)
{
    if (!by_nest) {
        held_sums_lanes(y, y_row, alpha, oa, clear, x, x_row, x_step, active, active_step, first, n, lanes, rows);
        return;
    }
    real held[16][64]; /* (codegen/write/triangle.py's nest: every row's sums in an array over the lanes) */
    for (long l = 0; l < lanes; l++)
        for (long r = 0; r < rows; r++)
            held[r][l] = y[r * y_row + l];
    for (long i = first; i < n; i++)
        for (long l = 0; l < (long)active[i * active_step]; l++) {
            const real go = alpha[oa[i] + l];
            for (long r = 0; r < rows; r++)
                held[r][l] += go * x[i * x_step + r * x_row + l];
            if (clear)
                alpha[oa[i] + l] = 0;
        }
    for (long l = 0; l < lanes; l++)
        for (long r = 0; r < rows; r++)
            y[r * y_row + l] = held[r][l];
}
void call_row_one_by_one(int f, real *y, const real *x, long n)
{ for (long i = 0; i < n; i++) y[i] = (real)(f == 2 ? sigmoid_value(x[i]) : f ? tanh_value(x[i]) : exp_value(x[i])); }
"""
DECLARATIONS = """
void call_dot_rows(real *out, const real *w, long w_j, const real *x, long n, long J);
void call_matvec(real *out, long out_j, const real *bias, long bias_j, const real *w, long w_j,
                 const real *x, long n, long J, const int32_t *nz);
void call_scan(const real *x, long n, int32_t *nz);
real call_dot_nz(const real *a, const real *x, long n, const int32_t *nz);
void call_axpy(real *y, real alpha, const real *x, long n, const int32_t *nz);
void call_sgd_axpy(real *w, real lr, real alpha, const real *x, long n, const int32_t *nz);
void call_row(int f, real *y, const real *x, long n);
void call_gather(int f, real *d, const int32_t *rows, long n);
void call_axpy_lanes(real *y, const int32_t *oy, const real *alpha, const real *x, const int32_t *ox, long n,
                     long lanes, int by_lane);
void call_dot_lanes(real *out, const real *a, const int32_t *oa, const real *b, const int32_t *ob, long n,
                    long lanes, int by_lane);
void call_sum_lanes(real *out, const real *x, const int32_t *ox, long n, long lanes, int by_lane);
void call_axpy_lanes_rows(real *y, const int32_t *oy, long y_step, const real *alpha, long alpha_step,
                          const real *x, const int32_t *ox, long x_step, long n, long lanes, long rows, int by_row);
void call_dot_lanes_rows(real *out, long out_step, const real *a, const int32_t *oa, const real *b, long b_step,
                         const int32_t *ob, long n, long lanes, long rows, int by_row);
void call_clear_rows(real *y, long y_j, long J, long S);
void call_add_lanes(real *y, const int32_t *oy, const real *alpha, long n, long lanes, int by_lane);
void call_largest_lanes(real *out, real *g, const real *x, long step, long n, const real *go, long lanes, int by_lane);
void call_held_sums(real *y, long y_row, real *alpha, const int32_t *oa, int clear, const real *x, long x_row,
                    long x_step, const real *active, long active_step, long first, long n, long lanes, long rows,
                    int by_nest);
void call_row_one_by_one(int f, real *y, const real *x, long n);
"""
CHUNK = 8  # values per chunk of the nonzero lists


@pytest.fixture(scope="module", params=list(DTYPES))
def dtype(request):
    return request.param


def kernels(compiler, dtype, native=True):
    """The kernels built by `compiler` (-march=native where it takes it and `native`: AVX-512 where
    the machine has it, in the unit or chosen when they run)."""
    ctype = DTYPES[dtype].c_type
    source = (contract.Prelude(DTYPES[dtype], thread_pool=False).render() + templates.read("prelude.c")
              + HARNESS.replace("static ", ""))
    native = native and toolchain.FAMILIES[toolchain.find_compiler(compiler).family].native
    build = toolchain.build_library(source, "kernels", compiler, opt=2, native=bool(native))
    ffi = cffi.FFI()
    ffi.cdef(f"typedef {ctype} real;\n" + DECLARATIONS.replace("int32_t", "int"))
    return ffi, ffi.dlopen(str(build.path))


def pointer(ffi, array):
    return ffi.cast("real *" if array.dtype != np.int32 else "int *", array.ctypes.data)


def inputs(n, rng, kind):
    """n input values: dense, 20% nonzero, only the values after the last whole chunk, only the
    second chunk's, or all zero."""
    x = rng.uniform(-1, 1, n)
    if kind == "sparse":
        x *= rng.random(n) < 0.2
    elif kind == "tail":
        x[:n // CHUNK * CHUNK] = 0
    elif kind == "odd chunk":
        x[:] = 0
        x[CHUNK:2 * CHUNK] = rng.uniform(-1, 1, CHUNK)[:len(x[CHUNK:2 * CHUNK])]
    elif kind == "zero":
        x[:] = 0
    return x


KINDS = ["dense", "sparse", "tail", "odd chunk", "zero"]


@pytest.mark.parametrize("n, J", [(7, 4), (19, 5), (45, 7), (64, 8), (100, 13), (784, 50)])
def test_matvec_is_dot_exactly(compiler, dtype, n, J):
    ffi, lib = kernels(compiler, dtype)
    real = DTYPES[dtype].numpy.type
    rng = np.random.default_rng(n * J)
    w_j = n + 3  # rows apart, as a neuron's weights and bias are
    w = rng.uniform(-1, 1, J * w_j).astype(real)
    bias = rng.uniform(-1, 1, 2 * J).astype(real)
    worst = 0.0
    for kind in KINDS:
        x = inputs(n, rng, kind).astype(real)
        nz = np.zeros(nonzero_words(n), np.int32)
        lib.call_scan(pointer(ffi, x), n, pointer(ffi, nz))
        assert nz[0] + nz[1] == sum(np.any(x[c * CHUNK:(c + 1) * CHUNK] != 0) for c in range(n // CHUNK))
        dots = np.zeros(J, real)
        lib.call_dot_rows(pointer(ffi, dots), pointer(ffi, w), w_j, pointer(ffi, x), n, J)
        out = np.full(3 * J, 7.0, real)  # out_j 3: the slots between are left alone
        lib.call_matvec(pointer(ffi, out), 3, pointer(ffi, bias), 2, pointer(ffi, w), w_j, pointer(ffi, x), n, J,
                        pointer(ffi, nz))
        expected = np.full(3 * J, 7.0, real)
        expected[::3] = bias[::2] + dots
        worst = max(worst, float(np.max(np.abs(out - expected))))
        np.testing.assert_array_equal(out, expected)
        without_bias = np.zeros(J, real)
        lib.call_matvec(pointer(ffi, without_bias), 1, ffi.NULL, 0, pointer(ffi, w), w_j, pointer(ffi, x), n, J,
                        pointer(ffi, nz))
        np.testing.assert_array_equal(without_bias, dots)
        for j in range(J):
            row = w[j * w_j:]
            assert lib.call_dot_nz(pointer(ffi, row), pointer(ffi, x), n, pointer(ffi, nz)) == dots[j]
    print(f"matvec vs dot, {compiler} {dtype} n={n} J={J}: max difference {worst:g}")


@pytest.mark.parametrize("n", [7, 19, 45, 784])
def test_sparse_updates_are_the_dense_ones_exactly(compiler, dtype, n):
    ffi, lib = kernels(compiler, dtype)
    real = DTYPES[dtype].numpy.type
    rng = np.random.default_rng(n)
    worst = 0.0
    for kind in KINDS:
        x = inputs(n, rng, kind).astype(real)
        nz = np.zeros(nonzero_words(n), np.int32)
        lib.call_scan(pointer(ffi, x), n, pointer(ffi, nz))
        start = rng.uniform(-1, 1, n).astype(real)
        for call, args in ((lib.call_axpy, (real(0.3),)), (lib.call_sgd_axpy, (real(0.01), real(-0.7)))):
            dense, sparse = start.copy(), start.copy()
            call(pointer(ffi, dense), *args, pointer(ffi, x), n, ffi.NULL)
            call(pointer(ffi, sparse), *args, pointer(ffi, x), n, pointer(ffi, nz))
            worst = max(worst, float(np.max(np.abs(dense - sparse))))
            np.testing.assert_array_equal(sparse, dense)
            assert np.array_equal(sparse, start) == (not np.any(x))  # an update happened where due
    print(f"sparse vs dense updates, {compiler} {dtype} n={n}: max difference {worst:g}")


# lanes: every block (AVX-512's 64 bytes where this CPU has it, AVX's 32, 16, lane by lane) and tails
LANES = [1, 3, 4, 8, 13, 16, 24, 35]


def _alphas(rng, lanes, real):
    """A lanes kernel's alphas, with the lanes whose alpha is 0 (the first of them -0): none, the
    first, the last, every other one."""
    for zeros in ([], [0], [lanes - 1], list(range(0, lanes, 2))):
        alpha = rng.uniform(-1, 1, lanes).astype(real)
        alpha[zeros] = 0
        if zeros and lanes > 1:
            alpha[zeros[0]] = -0.0
        yield zeros, alpha


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lanes", LANES)
def test_axpy_over_lanes_is_its_calls_bits(compiler, dtype, lanes, native):
    """axpy_offsets_lanes (templates/kernels/axpy.c: the batch's lanes side by side) against
    axpy_offsets lane by lane, bit for bit: lanes whose alpha is 0 (or -0) keep their y, even a y
    of -0 beside an x that is inf or NaN, in blocks that have such a lane and blocks that do not;
    built for this CPU and not (a module's default: the widest blocks chosen when they run)."""
    ffi, lib = kernels(compiler, dtype, native)
    real = DTYPES[dtype].numpy.type
    rng = np.random.default_rng(lanes)
    n, stride = 5, 48  # terms, and lanes a term apart (a batch's capacity)
    oy = (np.arange(n, dtype=np.int32) * stride)[::-1].copy()  # (y's terms in another order than x's)
    ox = np.arange(n, dtype=np.int32) * stride
    x = rng.uniform(-1, 1, n * stride).astype(real)
    x[ox[1]] = np.inf  # (lane 0: with a zero alpha below, skipped; with a nonzero one, inf)
    x[ox[2] + lanes - 1] = np.nan
    y = rng.uniform(-1, 1, n * stride).astype(real)
    y[oy[3]:oy[3] + lanes] = -0.0
    for zeros, alpha in _alphas(rng, lanes, real):
        by_calls, by_lanes = y.copy(), y.copy()
        for out, by_lane in ((by_calls, 1), (by_lanes, 0)):
            lib.call_axpy_lanes(pointer(ffi, out), pointer(ffi, oy), pointer(ffi, alpha), pointer(ffi, x),
                                pointer(ffi, ox), n, lanes, by_lane)
        bits = np.uint64 if real == np.float64 else np.uint32
        assert np.array_equal(by_lanes.view(bits), by_calls.view(bits)), (zeros, by_lanes - by_calls)
        assert all(np.array_equal(by_lanes[oy + l].view(bits), y[oy + l].view(bits)) for l in zeros)
    print(f"axpy_offsets_lanes vs calls, {compiler} {dtype} lanes={lanes} native={native}: the same bits")


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lanes", LANES)
def test_add_over_lanes_is_its_calls_bits(compiler, dtype, lanes, native):
    """add_offsets_lanes (a sum's gradient to its terms over the batch's lanes) against add_offsets
    lane by lane where alpha is not 0 (the loop's `if (go != 0)`), bit for bit: a lane whose alpha
    is 0 or -0 keeps its y, -0 and NaN among them; a term listed twice gets alpha twice, in order."""
    ffi, lib = kernels(compiler, dtype, native)
    real = DTYPES[dtype].numpy.type
    bits = np.uint64 if real == np.float64 else np.uint32
    rng = np.random.default_rng(200 + lanes)
    stride = 48
    for oy in ([0, 2, 1], [3, 0, 3, 1, 3], list(range(17))[::-1]):
        oy = np.array(oy, dtype=np.int32) * stride
        y = rng.uniform(-1e3, 1e3, (oy.max() + 1) * stride).astype(real)
        y[oy[0]:oy[0] + lanes] = -0.0
        y[oy[-1] + lanes - 1] = np.nan
        for zeros, alpha in _alphas(rng, lanes, real):
            by_calls, by_lanes = y.copy(), y.copy()
            for out, by_lane in ((by_calls, 1), (by_lanes, 0)):
                lib.call_add_lanes(pointer(ffi, out), pointer(ffi, oy), pointer(ffi, alpha), len(oy), lanes, by_lane)
            assert np.array_equal(by_lanes.view(bits), by_calls.view(bits)), (zeros, by_lanes - by_calls)
            assert all(np.array_equal(by_lanes[oy + l].view(bits), y[oy + l].view(bits)) for l in zeros)
            assert not np.array_equal(by_lanes.view(bits), y.view(bits)) or len(zeros) == lanes
    print(f"add_offsets_lanes vs calls, {compiler} {dtype} lanes={lanes} native={native}: the same bits")


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lanes", LANES)
def test_dot_over_lanes_is_its_calls_bits(compiler, dtype, lanes, native):
    """dot_offsets_lanes against dot_offsets lane by lane, and sum_offsets_lanes against
    sum_offsets, bit for bit (each lane's eight partial sums in the call's order, multiplies and
    adds fused as the unit fuses them; a sum of -0s stays +0 as the call's), over term counts
    with every tail, built for this CPU and not."""
    ffi, lib = kernels(compiler, dtype, native)
    real = DTYPES[dtype].numpy.type
    rng = np.random.default_rng(100 + lanes)
    bits = np.uint64 if real == np.float64 else np.uint32
    stride = 48
    for n in (1, 7, 8, 19):
        oa, ob = np.arange(n, dtype=np.int32) * stride, (np.arange(n, dtype=np.int32) * stride)[::-1].copy()
        a, b = (rng.uniform(-1, 1, n * stride).astype(real) * 10.0 ** rng.integers(-3, 4, n * stride) for _ in "ab")
        by_calls, by_lanes = np.zeros(lanes, real), np.zeros(lanes, real)
        for out, by_lane in ((by_calls, 1), (by_lanes, 0)):
            lib.call_dot_lanes(pointer(ffi, out), pointer(ffi, a), pointer(ffi, oa), pointer(ffi, b), pointer(ffi, ob),
                               n, lanes, by_lane)
        assert np.array_equal(by_lanes.view(bits), by_calls.view(bits)), (n, by_lanes - by_calls)
        a[oa[0]:oa[0] + lanes // 2] = -0.0  # (for n = 1 a lane of -0: the calls' sum starts at +0)
        for out, by_lane in ((by_calls, 1), (by_lanes, 0)):
            lib.call_sum_lanes(pointer(ffi, out), pointer(ffi, a), pointer(ffi, oa), n, lanes, by_lane)
        assert np.array_equal(by_lanes.view(bits), by_calls.view(bits)), (n, by_lanes - by_calls)
    print(f"dot_offsets_lanes and sum_offsets_lanes vs calls, {compiler} {dtype} lanes={lanes} native={native}: "
          "the same bits")

@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lanes", LANES)
def test_held_sums_over_lanes_are_the_nests_bits(compiler, dtype, lanes, native):
    """held_sums_lanes (the attention's query-key dots' backward, its sums held over a causal
    triangle's terms: codegen/write/triangle.py) against the loop nest it replaces, sums held in an
    array over the lanes, bit for bit: 1 to 16 rows (passes of 8, 4 and 1), terms from `first`,
    each reaching its own count of lanes (a query's documents, fewer as the queries rise, none for
    some) or every term the same count (active_step 0); its alphas cleared where they were read
    and nowhere else; -0 sums and inf/NaN values beside lanes a term does not reach."""
    ffi, lib = kernels(compiler, dtype, native)
    real = DTYPES[dtype].numpy.type
    bits = np.uint64 if real == np.float64 else np.uint32
    rng = np.random.default_rng(300 + lanes)
    capacity, n = 48, 9
    for rows, first, step, clear in itertools.product((1, 3, 8, 13, 16), (0, 2), (0, 1), (0, 1)):
        y_row, x_row = 5 * capacity, 3 * capacity
        x_step = rows * x_row
        oa = (np.arange(n, dtype=np.int32) * capacity * 2)[::-1].copy()  # (a table: terms in any order)
        active = np.zeros(n * 2, real)
        active[::2] = np.minimum(lanes, np.maximum(0, lanes + 2 - np.arange(n) * (lanes // 4 + 1)))
        if step == 0:
            active[0] = lanes
        x = rng.uniform(-1, 1, n * x_step + capacity).astype(real)
        x[x_step * (n - 1) + lanes - 1] = np.inf  # (the last term: it reaches lane lanes - 1 only if all do)
        x[x_step * (n - 1) + x_row + lanes - 1] = np.nan
        y = rng.uniform(-1, 1, rows * y_row).astype(real)
        y[:lanes] = -0.0
        alpha = rng.uniform(-1, 1, n * capacity * 2).astype(real)
        alpha[oa[1]] = 0
        results = []
        for by_nest in (1, 0):
            out, a = y.copy(), alpha.copy()
            lib.call_held_sums(pointer(ffi, out), y_row, pointer(ffi, a), pointer(ffi, oa), clear, pointer(ffi, x),
                               x_row, x_step, pointer(ffi, active), 2 * step, first, n, lanes, rows, by_nest)
            results.append((out, a))
        (by_nest, a_nest), (by_call, a_call) = results
        assert np.array_equal(by_call.view(bits), by_nest.view(bits)), (rows, first, step, by_call - by_nest)
        assert np.array_equal(a_call.view(bits), a_nest.view(bits)), (rows, first, step, clear)
        assert not np.array_equal(by_nest, y) and np.array_equal(a_nest, alpha) == (not clear or not active.any())
    print(f"held_sums_lanes vs its nest, {compiler} {dtype} lanes={lanes} native={native}: the same bits")


# (the rows kernels' lanes run the lanes kernels' blocks, LANES above: a whole block, parts, tails)
ROWS_LANES = [3, 16, 35]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lanes", ROWS_LANES)
def test_axpy_over_rows_is_its_calls_bits(compiler, dtype, lanes, native):
    """axpy_offsets_lanes_rows (an attention's weighted sums' backward, a row a head's dimension:
    codegen/write/rows.py) against axpy_offsets_lanes row by row, bit for bit: into the same
    targets for every row (y_step 0: held over the rows), into a row of targets each (x_step 0: x
    read once), and both moving; 1 to 16 rows; no alpha of 0, and alphas of 0 and -0 in some rows'
    lanes (skipped, y of -0 and x of inf or NaN beside them)."""
    ffi, lib = kernels(compiler, dtype, native)
    real = DTYPES[dtype].numpy.type
    bits = np.uint64 if real == np.float64 else np.uint32
    rng = np.random.default_rng(200 + lanes)
    n, stride = 6, 48  # terms, and lanes a term apart (a batch's capacity)
    oy = (np.arange(n, dtype=np.int32) * stride)[::-1].copy()
    ox = np.arange(n, dtype=np.int32) * stride
    for rows, zeros in itertools.product((1, 2, 3, 16), (False, True)):
        block = n * stride
        for y_step, x_step in ((0, block), (block, 0), (block, block)):
            x = rng.uniform(-1, 1, block * rows).astype(real)
            x[ox[1]] = np.inf
            x[ox[2] + lanes - 1 + x_step * (rows - 1)] = np.nan
            y = rng.uniform(-1, 1, block * rows).astype(real)
            y[oy[3]:oy[3] + lanes] = -0.0
            alpha = rng.uniform(-1, 1, (rows, stride)).astype(real)
            if zeros:
                alpha[rows // 2, [0, lanes - 1]] = 0
                alpha[rows - 1, lanes // 2] = -0.0
            by_rows, by_call = y.copy(), y.copy()
            for out, by_row in ((by_rows, 1), (by_call, 0)):
                lib.call_axpy_lanes_rows(pointer(ffi, out), pointer(ffi, oy), y_step, pointer(ffi, alpha), stride,
                                         pointer(ffi, x), pointer(ffi, ox), x_step, n, lanes, rows, by_row)
            assert np.array_equal(by_rows, y) == (not np.any(alpha[:, :lanes]))  # (it added where due)
            assert np.array_equal(by_call.view(bits), by_rows.view(bits)), (rows, y_step, x_step, by_call - by_rows)
    print(f"axpy_offsets_lanes_rows vs calls, {compiler} {dtype} lanes={lanes} native={native}: the same bits")


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lanes", ROWS_LANES)
def test_dot_over_rows_is_its_calls_bits(compiler, dtype, lanes, native):
    """dot_offsets_lanes_rows (an attention's weighted sums, a row a head's dimension, two rows
    sharing their weights' reads) against dot_offsets_lanes row by row, bit for bit: 1 to 16 rows
    (pairs and one after them), term counts with every tail."""
    ffi, lib = kernels(compiler, dtype, native)
    real = DTYPES[dtype].numpy.type
    bits = np.uint64 if real == np.float64 else np.uint32
    rng = np.random.default_rng(300 + lanes)
    stride = 48
    for n in (1, 7, 8, 19):
        oa, ob = np.arange(n, dtype=np.int32) * stride, (np.arange(n, dtype=np.int32) * stride)[::-1].copy()
        for rows in (1, 2, 3, 16):
            a = rng.uniform(-1, 1, n * stride).astype(real) * 10.0 ** rng.integers(-3, 4, n * stride)
            b = rng.uniform(-1, 1, n * stride * rows).astype(real) * 10.0 ** rng.integers(-3, 4, n * stride * rows)
            by_rows, by_call = np.zeros(rows * stride, real), np.zeros(rows * stride, real)
            for out, by_row in ((by_rows, 1), (by_call, 0)):
                lib.call_dot_lanes_rows(pointer(ffi, out), stride, pointer(ffi, a), pointer(ffi, oa), pointer(ffi, b),
                                        n * stride, pointer(ffi, ob), n, lanes, rows, by_row)
            assert np.array_equal(by_call.view(bits), by_rows.view(bits)), (n, rows, by_call - by_rows)
    print(f"dot_offsets_lanes_rows vs calls, {compiler} {dtype} lanes={lanes} native={native}: the same bits")


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("lanes", LANES)
def test_a_maximum_over_lanes_is_largest_at_lane_by_lane_bits(compiler, dtype, lanes, native):
    """largest_lanes and add_to_largest_lanes (templates/kernels/axpy.c: a maximum a sample over
    the batch's lanes) against largest_at lane by lane, bit for bit: the largest, and go added to
    the gradient of the candidate it is; the first of equals (-0 and +0 among them), a NaN never
    picked after the first candidate and kept as the first, infinities; 1 to 40 candidates, spaced
    forward and backward; the candidates of NumPy's argmax where no NaN is."""
    ffi, lib = kernels(compiler, dtype, native)
    real = DTYPES[dtype].numpy.type
    bits = np.uint64 if real == np.float64 else np.uint32
    rng = np.random.default_rng(100 + lanes)
    for n, step in ((1, 0), (2, 48), (5, 48), (17, 40), (28, 512), (40, -48)):
        size = abs(step) * n + 64
        start = abs(step) * (n - 1) if step < 0 else 0
        x = rng.integers(-3, 4, size).astype(real)  # (small integers: many equal candidates)
        x[rng.random(size) < 0.05] = -0.0
        at = [start + k * step for k in range(n)]
        if n > 2:
            x[at[0]] = np.nan  # lane 0: a NaN first (kept)
            x[at[1] + lanes - 1] = np.nan  # the last lane: a NaN later (never picked)
            x[at[n - 1] + lanes // 2] = np.inf
        go = rng.uniform(-1, 1, lanes).astype(real)
        g = rng.uniform(-1, 1, size).astype(real)
        by_lanes, by_calls = [(np.full(lanes + 3, 7, real), g.copy()) for _ in range(2)]
        for (out, grad), by_lane in ((by_calls, 1), (by_lanes, 0)):
            lib.call_largest_lanes(pointer(ffi, out), pointer(ffi, grad[start:]), pointer(ffi, x[start:]), step, n,
                                   pointer(ffi, go), lanes, by_lane)
        for ours, theirs in zip(by_lanes, by_calls):
            assert np.array_equal(ours.view(bits), theirs.view(bits)), (n, step, ours - theirs)
        assert (by_lanes[0][lanes:] == 7).all()  # nothing written past the lanes
        candidates = x[np.add.outer(np.array(at), np.arange(lanes))]
        plain = ~np.isnan(candidates).any(axis=0)
        assert np.array_equal(by_lanes[0][:lanes][plain], candidates.max(axis=0)[plain])
    print(f"largest_lanes and add_to_largest_lanes vs largest_at, {compiler} {dtype} lanes={lanes} native={native}: "
          f"the same bits")


def test_clear_rows_sets_its_rows_to_zero_and_nothing_else(compiler, dtype):
    """clear_rows (a gradient's rows cleared once read: codegen/write/loops.py's cleared) against
    the plain rows: J rows of S values y_j apart set to +0, every other value as it was (NaN, inf,
    -0 among them); rows end to end (one memset), long rows apart (a memset a row), short rows apart
    (a loop), one row, rows that overlap or coincide, none."""
    ffi, lib = kernels(compiler, dtype)
    real = DTYPES[dtype].numpy.type
    bits = np.uint64 if real == np.float64 else np.uint32
    rng = np.random.default_rng(400)
    for y_j, J, S in ((16, 32, 16), (512, 256, 512), (512, 7, 96), (512, 9, 64), (512, 9, 63), (48, 5, 3),
                      (40, 1, 100), (5, 4, 9), (0, 3, 20), (512, 0, 16), (512, 3, 0)):
        y = rng.uniform(-1, 1, y_j * J + S + 64).astype(real)
        y[::7], y[1::11], y[2::13] = np.nan, -np.inf, -0.0
        expected = y.copy()
        for j in range(J):
            expected[j * y_j:j * y_j + S] = 0
        lib.call_clear_rows(pointer(ffi, y), y_j, J, S)
        assert np.array_equal(y.view(bits), expected.view(bits)), (y_j, J, S)
    print(f"clear_rows vs the rows, {compiler} {dtype}: the same bits")


def _special(name, info):
    """Each function's hard values: its edges, its range's ends, the special values."""
    if name != "tanh":
        top, bottom = np.log(info.max), np.log(info.smallest_subnormal)
        return [0.5 * np.log(2), -0.5 * np.log(2), top, top * (1 - 1e-7), top * (1 + 1e-7), bottom, bottom - 0.1,
                bottom + 0.3, np.log(info.tiny), -1000.0, 1000.0]
    return [20.0, -20.0, 20.000001, 19.999999, 0.5493061443340549, 0.17, 0.1733, 0.35, 5e-324, 1e-30, -1e-30,
            0.5 * np.log(2), 40.0, -40.0, -1e300, 1e300]


ROW_FUNCTIONS = {"exp": 0, "tanh": 1, "sigmoid": 2}  # (the harness's f)


@pytest.mark.parametrize("name", list(ROW_FUNCTIONS))
def test_row_kernels_are_the_libraries_functions_within_a_bound(compiler, dtype, name):
    """exp_range, tanh_range and sigmoid_range (templates/kernels/exp.c) against the C library's
    exp and tanh and the op table's sigmoid with that exp (the interpreter's: the op table's values; in
    float32 their values rounded), to 1, TANH_ULPS (4) and 2 ulps of them, the max difference in
    ulps printed: the whole range, with overflow to inf and
    results under the normal numbers, the special values (-0 stays -0); the same bits one value at
    a time (TCC's way, and any CPU's without AVX2) and with TCC; each value the same wherever it
    sits in a row, and nothing written past n; the gathered forms over the table form's rows
    (exp_gather, tanh_gather, sigmoid_gather) the same bits as the rows', nothing else written."""
    ffi, lib = kernels(compiler, dtype)
    which = ROW_FUNCTIONS[name]
    bound = {"exp": 1, "tanh": 4, "sigmoid": 2}[name]  # (TANH_ULPS)
    library = ops.OPS[name].value_fn  # (the interpreter's: the C library's exp and tanh, Python's arithmetic)
    real = DTYPES[dtype].numpy.type
    info = np.finfo(real)
    rng = np.random.default_rng(7)
    wide = (np.log(info.smallest_subnormal) - 2, np.log(info.max) + 2) if name != "tanh" else (-25, 25)
    special = [0.0, -0.0, 1.0, -1.0, 1e-300, -1e-300, *_special(name, info), np.inf, -np.inf, np.nan]
    with np.errstate(over="ignore"):  # (float32: 1e300 is inf)
        x = np.concatenate([rng.uniform(-30, 5, 3000), rng.uniform(*wide, 3000), rng.uniform(-1, 1, 2000) ** 5,
                            special]).astype(real)
    with np.errstate(over="ignore", under="ignore"):
        y = np.full(len(x) + 3, 7, real)
        lib.call_row(which, pointer(ffi, y), pointer(ffi, x), len(x))
        expected = np.array([library(v, None, None, None) for v in x.astype(np.float64)]).astype(real)
    assert (y[len(x):] == 7).all()  # nothing past n
    y = y[:len(x)]
    np.testing.assert_array_equal(np.isnan(y), np.isnan(x))
    np.testing.assert_array_equal(np.signbit(y[~np.isnan(x)]), np.signbit(expected[~np.isnan(x)]))
    same = (y == expected) | np.isnan(x)  # (inf against inf too)
    ulps = np.abs(y[~same].astype(np.float64) - expected[~same]) / np.spacing(expected[~same]).astype(np.float64)
    ulps = np.append(ulps, 0)
    print(f"{compiler} {dtype}: {(~same).sum()} of {len(x)} values differ from the library's")
    print(f"{name}_range vs the C library's {name}, {compiler} {dtype}: max difference {ulps.max():g} ulp")
    assert ulps.max() <= bound
    for other_ffi, other in ((ffi, lib), kernels(requires("tcc"), dtype)):
        again = np.zeros(len(x), real)
        other.call_row_one_by_one(which, pointer(other_ffi, again), pointer(other_ffi, x), len(x))
        assert same_bits(again, y)
        for n in (1, 2, 3, 4, 5, 7, 9, 64, len(x)):  # the table's rows: operands and results anywhere in d
            d = np.full(2 * len(x) + 5, 7, real)
            picked = rng.permutation(len(x))[:n]
            d[:len(x)] = x
            rows = np.stack([picked, len(x) + 5 + rng.permutation(len(x))[:n]], axis=1).astype(np.int32)
            other.call_gather(which, pointer(other_ffi, d), pointer(other_ffi, rows), n)
            assert same_bits(d[rows[:, 1]], y[picked])
            written = np.ones(len(d), bool)
            written[rows[:, 1]] = False
            written[:len(x)] = False
            assert (d[written] == 7).all()
    for offset in range(4):  # a row starting at any lane, of any length: the same values
        for n in range(1, 10):
            part = np.full(n + 1, 7, real)
            lib.call_row(which, pointer(ffi, part), pointer(ffi, x[offset:]), n)
            np.testing.assert_array_equal(part[:n], y[offset:offset + n])
            assert part[n] == 7
