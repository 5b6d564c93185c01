"""The import structure (pyproject.toml's [tool.importlinter] contracts): the packages in layers,
no circle of modules inside one, C generation apart from building it. A back-import fails here."""
from pathlib import Path

from importlinter.cli import lint_imports

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_imports_keep_the_contracts(capsys):
    status = lint_imports(config_filenames=(str(PYPROJECT),), no_cache=True, no_logo=True)
    report = capsys.readouterr().out
    assert status == 0, report
    assert "0 broken" in report
