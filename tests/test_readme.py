"""The README's example runs as written."""

import math
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.requires("gcc")  # the example names it
def test_readme_example_runs():
    code = re.search(r"## Example\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace = {}
    exec(code, namespace)
    assert math.isfinite(namespace["loss_value"]) and namespace["loss_value"] > 0
    assert namespace["net"].n_params == 39760
