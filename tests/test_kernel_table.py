"""The kernel table (templates/kernels/kernels.h, read by codegen/write/kernels.py): its prototypes are
the definitions' (compiled together, a changed signature is an error, by every compiler and
dtype), each is defined in the templates, calls are rendered by parameter name with a missing or
unknown one a Python error, and no emitter writes a kernel's call by hand."""
import re
import textwrap
import subprocess
import tempfile
from pathlib import Path

import pytest

import cffi
import numpy as np

import templates
from codegen.write import contract, kernels
from codegen.write.dtypes import DTYPES
from codegen.backend import toolchain
from codegen.backend.toolchain import find_compiler
from conftest import requires

REPO = Path(__file__).resolve().parents[1]


def prelude(dtype):
    """templates/prelude.c (every kernel's definition) with what it needs defined before it."""
    return contract.Prelude(DTYPES[dtype], thread_pool=False).render() + templates.read("prelude.c")


def syntax_errors(compiler, dtype, header, definitions="", source=None):
    """The compiler's complaints about the prelude and `definitions` followed by `header` (or
    about `source`), or "" when it takes them."""
    source = source if source is not None else prelude(dtype) + "\n" + definitions + "\n" + header + "\n"
    argv = find_compiler(requires(compiler)).argv
    with tempfile.TemporaryDirectory() as folder:  # (zig cc takes no source on stdin)
        path = Path(folder) / "kernels.c"
        path.write_text(source)
        # GCC's and Clang's front end checks alone, no code (zig cc 0.17's -fsyntax-only fails to
        # rename an object it did not write; TCC has none, and its code is cheap)
        output = ["-fsyntax-only"] if compiler in ("gcc", "clang") else ["-c", "-o", str(path.with_suffix(".o"))]
        run = subprocess.run([*argv, *output, str(path)], capture_output=True, text=True)
    return "" if run.returncode == 0 else run.stderr


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("compiler", ["tcc", "gcc", "clang", "zig"])
def test_the_table_is_the_definitions_signatures(compiler, dtype):
    header = templates.read(kernels.HEADER)
    assert syntax_errors(compiler, dtype, header) == ""
    # a parameter's type changed in the table only: the compiler sees two declarations disagree
    changed = header.replace("KERNEL void axpy(real *restrict y, real alpha,", "KERNEL void axpy(real *restrict y, long alpha,")
    assert changed != header and "axpy" in syntax_errors(compiler, dtype, changed)


def test_every_row_is_defined_in_the_templates():
    sources = "\n".join(p.read_text() for p in (REPO / "templates").rglob("*.c"))
    for name in kernels.KERNELS:
        assert re.search(rf"^\w[^;(]*\b{name}\([^;]*?\)\s*(\{{|$)", sources, re.M), f"{name}: no definition"


def test_calls_render_by_parameter_name():
    assert str(kernels.call("axpy", n=3, x="d + 4", alpha="go", y="g + 1")) == "axpy(g + 1, go, d + 4, 3)"
    assert kernels.call("add_range", y="g", alpha="go", n=2).render() == "add_range(g, go, 2);"
    with pytest.raises(TypeError, match="axpy: missing n"):
        kernels.call("axpy", y="g", alpha="go", x="d")
    with pytest.raises(TypeError, match="no parameter count"):
        kernels.call("axpy", y="g", alpha="go", x="d", n=2, count=2)
    with pytest.raises(KeyError, match="no kernel 'axpby'"):
        kernels.call("axpby", y="g")


def test_the_table_reads_parameters_and_types():
    row = kernels.KERNELS["matmul_nt"]
    assert row.returns == "void"
    assert row.parameters[:2] == (("out", "real *restrict"), ("out_j", "long"))
    assert dict(row.parameters)["rows"] == "const int32_t *"
    assert kernels.KERNELS["gather_index"].parameters == (("x", "double"), ("n", "long"))


def test_no_emitter_writes_a_kernel_call_by_hand():
    """A kernel's name followed by `(` and an argument appears in codegen/ only in
    codegen/write/kernels.py (which renders them): every call goes through the table."""
    called = re.compile(r"\b(%s)\((?!\))" % "|".join(kernels.KERNELS))
    found = [f"{p.relative_to(REPO)}: {m.group(0)}" for p in sorted((REPO / "codegen").rglob("*.py"))
             if p.name != "kernels.py" for m in called.finditer(p.read_text())]
    assert not found


def readme_blocks(language):
    """The code blocks of the README's "How to add a kernel", in order."""
    text = (REPO / "README.md").read_text()
    start = text.index("\n## How to add a kernel\n")
    part = text[start:text.index("\n## ", start + 1)]
    return [textwrap.dedent(code) for code in re.findall(rf"^ *```{language}\n(.*?)^ *```", part, re.S | re.M)]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_readme_walk_through_adds_a_kernel(dtype, monkeypatch):
    """The README's new kernel as its snippets say: the row joins the table, the call renders from
    it by name, the row and the definition agree (compiled), and the call computes y[i] * alpha."""
    (row, definition), (use,) = readme_blocks("c"), readme_blocks("python")
    table = kernels.parse(templates.read(kernels.HEADER) + row)
    (name,) = set(table) - set(kernels.KERNELS)
    monkeypatch.setattr(kernels, "KERNELS", table)
    rendered = eval(use, {"call": kernels.call})
    assert rendered.render() == f"{name}(g + 12, go, 8);"
    assert syntax_errors("gcc", dtype, templates.read(kernels.HEADER) + row, definition) == ""
    harness = definition + f"\nvoid run(real *g, real go) {{ {rendered.render()} }}\n"
    build = toolchain.build_library(prelude(dtype) + harness, "added")
    ffi = cffi.FFI()
    ffi.cdef(f"void run({DTYPES[dtype].c_type} *g, {DTYPES[dtype].c_type} go);")
    library = ffi.dlopen(str(build.path))
    g = np.arange(24, dtype=DTYPES[dtype].numpy)
    expected = g.copy()
    expected[12:20] *= np.asarray(2.5, dtype=g.dtype)
    library.run(ffi.cast(f"{DTYPES[dtype].c_type} *", g.ctypes.data), 2.5)
    assert np.array_equal(g, expected)


@pytest.mark.parametrize("compiler", ["tcc", "gcc"])
@pytest.mark.parametrize("missing", ["REAL_IS_FLOAT", "HAVE_THREAD_POOL"])
def test_the_prelude_names_what_is_missing(compiler, missing):
    """What the generated C must define before templates/prelude.c, which reads it with `#if`
    (a missing one would be read as 0), is checked there: leaving one out is a compile error that
    names it."""
    source = "\n".join(line for line in prelude("float64").splitlines() if not line.startswith(f"#define {missing} "))
    assert f"{missing} must be defined" in syntax_errors(compiler, "float64", "", source=source)
