"""The README and docs/*.md keep their promises: every relative link reaches a file (and a heading,
for #anchor), every ```python block marked runnable runs, and the README's "How to add an op"
walk-through, applied as written, gives an op that compiles to what the interpreter computes.

A runnable block is a ```python block on the line after `<!-- runs -->`, or `<!-- runs: tool -->`
when it needs a tool (requires(tool): skipped without it). It runs in a fresh directory. Blocks
that other tests already run with their own checks (the README's example: test_readme.py; the
draw_dot, export, jit and threads examples; docs/mnist.md's `import nn`) are not marked."""
import math
import re
import textwrap
from pathlib import Path

import pytest

from conftest import requires

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)


def prose(text):
    """The text without its fenced code blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(path):
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens,
    a repeated one numbered."""
    seen, result = {}, set()
    for heading in re.findall(r"^#+ (.*)$", FENCE.sub("", path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        result.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return result


def links(path):
    return re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text()))


def test_the_pages_exist_and_the_readme_is_a_guide():
    assert {p.name for p in PAGES} >= {"README.md", "mnist.md", "speed.md", "compiler.md", "batches.md", "scale.md"}
    assert len((REPO / "README.md").read_text().splitlines()) <= 400


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = (page.parent / file).resolve() if file else page
        if not resolved.exists():
            broken.append(f"{target}: no file {resolved}")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)


def runnable_blocks():
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"^<!-- runs(?:: ([\w.-]+))? -->\n *```python\n(.*?)^ *```", text, re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            yield pytest.param(match.group(1), textwrap.dedent(match.group(2)), id=f"{page.name}:{line}")


@pytest.mark.parametrize("tool, code", list(runnable_blocks()))
def test_runnable_block_runs(tool, code, tmp_path, monkeypatch):
    if tool:
        requires(tool)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<docs block>", "exec"), {"__name__": "__docs__"})


def section(heading):
    text = (REPO / "README.md").read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def python_blocks(text):
    return [textwrap.dedent(code) for code in re.findall(r"^ *```python\n(.*?)^ *```", text, re.S | re.M)]


@pytest.fixture
def op_added(monkeypatch):
    """The README's new op, applied as its three snippets say: the table row (which makes the
    Value method, as engine.py does for each row of _TABLE), the test_engine entry and the
    test_compile case. Returns (name, unary entry, compile case)."""
    from micrograd_c import Value, engine, ops
    row, unary, case = python_blocks(section("How to add an op"))
    op = eval(row.strip().rstrip(","), vars(ops))  # the row as it stands in _TABLE
    assert isinstance(op, ops.Op) and op.name not in ops.OPS and not hasattr(Value, op.method)
    monkeypatch.setitem(ops.OPS, op.name, op)
    monkeypatch.setattr(Value, op.method, engine.op_method(op), raising=False)
    (name, entry), = eval("{" + unary + "}", {"math": math}).items()
    (case_name, build), = eval("{" + case + "}").items()
    assert name == case_name == op.name
    return name, entry, build


def test_the_added_op_is_the_interpreters(op_added, monkeypatch):
    import test_engine
    name, entry, _ = op_added
    monkeypatch.setitem(test_engine.UNARY, name, entry)
    for x in (0.3, 1.7, -0.8):
        test_engine.test_unary_op_value_and_gradient(name, x)  # the test the walk-through adds to


@pytest.mark.parametrize("mode", ["scalar", "fused", "float32"])
def test_the_added_op_compiles_to_what_the_interpreter_computes(op_added, mode):
    """test_each_op's check on the new case alone, with the default compiler at -O0 (the new op's
    runtime is a build of its own: -O2's takes seconds more and checks nothing more)."""
    import codegen
    import test_compile
    from micrograd_c import Value
    name, _, build = op_added
    params, rows = [0.8, -0.4], test_compile.OP_ROWS
    test_compile.assert_equivalent(build, params, rows, mode, opt=0)
    # the row's formula is what the C computes, not something written elsewhere
    param_values, inputs = [Value(p) for p in params], [Value(x) for x in rows[0]]
    source = "".join(codegen.generate(build(param_values, inputs), inputs, param_values, fuse=False))
    assert "log(1 + exp(" in source


def test_the_compiler_row_is_one_row(monkeypatch):
    """The README's example row of FAMILIES is a CompilerFamily that find_compiler then knows: it
    finds the compiler, or says how to install it."""
    from codegen.backend import compilers
    row, = python_blocks(section("How to add a compiler"))
    family = eval(row.strip().rstrip(","), vars(compilers))
    assert isinstance(family, compilers.CompilerFamily)
    monkeypatch.setitem(compilers.FAMILIES, family.name, family)
    compilers._find_compiler.cache_clear()
    try:
        try:
            found = compilers.find_compiler(family.name)
        except compilers.CompilerNotFound as error:
            assert family.install_advice in str(error)
        else:
            assert found.family == family.name
    finally:
        compilers._find_compiler.cache_clear()
