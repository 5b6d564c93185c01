"""The comments of the compiler, the templates and the front-end find the way by naming files and
what is in them; these must not go stale when code moves. Two forms are checked, in every .py, .c
and .h file under codegen/, templates/ and micrograd_c/:
  - a path from the repository's root (codegen/write/loops.py, templates/kernels/gemm.c, tests/...):
    the file exists;
  - "PATH's NAME", PATH such a path or a file's bare name (gemm.c's gemm_variant, unique in the
    repository; names of files outside it, llm.c's, are left alone): NAME is defined there (a
    Python def, class or assignment; a C file: NAME appears in it as a word).
"""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("codegen", "templates", "micrograd_c")
TOP = ("codegen", "templates", "micrograd_c", "tests", "mnist", "gpt", "bench", "docs")
PATH = re.compile(r"\b((?:%s)/[\w/]+\.(?:py|c|h|md))\b" % "|".join(TOP))
NAMED = re.compile(r"\b([\w/]+\.(?:py|c|h))'s (\w+)")
SOURCES = sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*")
                 if p.suffix in (".py", ".c", ".h") and "__pycache__" not in p.parts)


def resolve(name):
    """The repository's file a comment names: a path from the root, or a unique bare name; None
    for a name the repository has no file of."""
    if "/" in name:
        return REPO / name
    found = [p for folder in TOP if (REPO / folder).is_dir() for p in (REPO / folder).rglob(name)]
    return found[0] if len(found) == 1 else None


def defines(path, name):
    text = path.read_text()
    if path.suffix == ".py":
        return re.search(rf"^\s*(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]", text, re.M) is not None
    return re.search(rf"\b{name}\b", text) is not None


def stale(path):
    text, problems = path.read_text(), []
    for target in PATH.findall(text):
        if not (REPO / target).exists():
            problems.append(f"{target}: no such file")
    for target, name in NAMED.findall(text):
        file = resolve(target)
        if "/" in target and not file.exists():
            continue  # reported above
        if file is not None and not defines(file, name):
            problems.append(f"{target}'s {name}: not defined there")
    return problems


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_comments_name_files_and_names_that_exist(path):
    problems = stale(path)
    assert not problems, f"{path.relative_to(REPO)}: " + "; ".join(problems)


def test_the_check_sees_a_stale_reference(tmp_path):
    """A comment naming a moved file or a renamed function fails the check."""
    source = tmp_path / "x.c"
    source.write_text("/* codegen/emitter.py; codegen/write/statements.py's _nonzero_words; gemm.c's gemm_variant */")
    assert stale(source) == ["codegen/emitter.py: no such file",
                             "codegen/write/statements.py's _nonzero_words: not defined there"]
