"""draw_dot: the Value graph as an SVG/PNG through graphviz's `dot`, and a clear error without it."""

import re
import textwrap
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from micrograd_c import Value, draw_dot
from micrograd_c.draw import GraphvizNotFound, to_dot


def small_graph():
    a, b = Value(2.0), Value(3.0)
    out = (a * b + a * a).relu()
    out.backward()
    return out


def test_dot_source_has_a_node_per_value_an_op_node_per_op_and_an_edge_per_use():
    source = to_dot(small_graph())
    # values: a, b, a*b, a*a, sum, relu; ops: *, *, +, ReLU
    assert source.count("shape=record") == 6
    assert source.count("_op [label=") == 4
    assert source.count("_op -> v") == 4  # each op to its value
    assert source.count("_op;") == 7  # an edge per use: a*b 2, a*a 2 (both a), + 2, relu 1
    assert 'label="{ data 2.0000 | grad 7.0000 }"' in source  # a: d(ab + a^2)/da = b + 2a
    assert to_dot(small_graph()) == source  # deterministic


@pytest.mark.requires("dot")
def test_draw_dot_writes_an_svg(tmp_path):
    path = draw_dot(small_graph(), tmp_path / "graph.svg")
    root = ElementTree.parse(path).getroot()
    assert root.tag.endswith("svg")
    texts = [t.text for t in root.iter() if t.tag.endswith("text")]
    assert "ReLU" in texts and "data 2.0000" in texts and "grad 7.0000" in texts


@pytest.mark.requires("dot")
def test_draw_dot_writes_a_png(tmp_path):
    path = draw_dot(small_graph(), tmp_path / "graph.out", format="png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_dot_on_path_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GraphvizNotFound, match="apt-get install graphviz"):
        draw_dot(small_graph(), tmp_path / "graph.svg")
    assert not (tmp_path / "graph.svg").exists()


def test_unknown_format_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="format must be one of"):
        draw_dot(small_graph(), tmp_path / "graph.pdf")


@pytest.mark.requires("dot")
def test_readme_example_draws(tmp_path, monkeypatch):
    """The draw_dot example of docs/compiler.md runs as written."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "compiler.md").read_text()
    code = re.search(r"\*\*`draw_dot\(root, path, format=None\)`\*\*.*?```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(textwrap.dedent(code), {})
    assert ElementTree.parse(tmp_path / "graph.svg").getroot().tag.endswith("svg")
