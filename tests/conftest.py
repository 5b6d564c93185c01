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


@pytest.fixture(autouse=True, scope='session')
def _private_build_cache(tmp_path_factory):
    """Tests build into their own cache, not the user's."""
    previous = os.environ.get('MICROGRAD_C_CACHE')
    os.environ['MICROGRAD_C_CACHE'] = str(tmp_path_factory.mktemp('build-cache'))
    yield
    if previous is None:
        del os.environ['MICROGRAD_C_CACHE']
    else:
        os.environ['MICROGRAD_C_CACHE'] = previous
