"""Seeing the graph: draw_dot(root, path) renders a Value graph with graphviz, as micrograd's
trace_graph notebook does: a record node per Value with its data and grad, a small node per op,
an edge per use. graphviz's `dot` program comes from the system (apt-get install graphviz).
"""

import shutil
import subprocess
from pathlib import Path

from .engine import topological_order

FORMATS = ("svg", "png")


class GraphvizNotFound(RuntimeError):
    """graphviz's `dot` program is not on PATH."""


def to_dot(root):
    """The graph of `root` in graphviz's dot language, left to right, inputs first."""
    lines = ["digraph micrograd {", "  rankdir=LR;", '  node [fontname="Helvetica"];']
    ids = {}
    for n, v in enumerate(topological_order(root)):  # children first: stable, deterministic names
        ids[id(v)] = f"v{n}"
        label = f"{{ data {v.data:.4f} | grad {v.grad:.4f} }}"
        lines.append(f'  v{n} [shape=record, label="{label}"];')
        if v._op:
            lines.append(f'  v{n}_op [label="{_escape(v._op)}"];')
            lines.append(f"  v{n}_op -> v{n};")
    for v in topological_order(root):
        for child in v._prev:  # one edge per use: x*x draws two
            lines.append(f"  {ids[id(child)]} -> {ids[id(v)]}_op;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _escape(text):
    return text.replace("\\", "\\\\").replace('"', '\\"')


def draw_dot(root, path, format=None):
    """Renders the graph of `root` to `path` (an SVG or PNG file: `format`, else the path's
    suffix, else svg) with graphviz's `dot`; returns the path."""
    return render(to_dot(root), path, format, "draw_dot")


def render(source, path, format=None, who="draw_dot"):
    """Renders graphviz `source` to `path` (svg or png: `format`, else the path's suffix, else
    svg) with the system's `dot` program; `who` names the caller in errors. Returns the path."""
    path = Path(path)
    format = format or path.suffix.lstrip(".").lower() or "svg"
    if format not in FORMATS:
        raise ValueError(f"{who}: format must be one of {FORMATS}, got {format!r}")
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizNotFound(f"{who} needs graphviz's `dot` program, which is not on PATH: "
                               "install it with `apt-get install graphviz` (or your system's package manager)")
    result = subprocess.run([dot, f"-T{format}", "-o", str(path)], input=source, text=True,
                            capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(f"{who}: `dot -T{format}` failed (exit {result.returncode}): {result.stderr.strip()}")
    return path
