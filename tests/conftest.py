import os

import pytest

from codegen.toolchain import COMPILER_NAMES, CompilerNotFound, find_compiler


@pytest.fixture(params=COMPILER_NAMES)
def compiler(request) -> str:
    """Name of each C compiler. A missing one skips, or fails when MICROGRAD_C_REQUIRE_COMPILERS=1 (CI)."""
    try:
        find_compiler(request.param)
    except CompilerNotFound as error:
        if os.environ.get('MICROGRAD_C_REQUIRE_COMPILERS') == '1':
            pytest.fail(str(error))
        pytest.skip(str(error))
    return request.param
