"""compiler="libtcc": the module compiled in memory through libtcc. The equivalence and module
tests of test_compile.py and test_module.py run again here against libtcc-built modules (their
`compiler` and `net` fixtures are overridden below); then what is particular to the JIT."""
import gc
import os
import subprocess

import pytest

import codegen
from conftest import requires
from codegen.backend import libtcc
from micrograd_c import Value

# Collected again in this module, where `compiler` is libtcc.
from test_compile import (test_each_op, test_explicit_dot_compiles_to_one_fused_loop,  # noqa: F401
                          test_fused_dot_with_scattered_and_repeated_factors, test_random_graphs, test_xor_mlp)
from test_module import (compile_classifier, test_a_leaf_output_and_a_constant_output,  # noqa: F401
                         test_bad_arguments_raise_clear_errors, test_constants_are_printed_exactly,
                         test_predict_equals_forward_outputs, test_read_only_and_other_buffers_are_accepted_for_reading,
                         test_train_equals_the_single_step_functions, test_values_round_trip_and_state_views)


@pytest.fixture
def compiler():
    return requires("libtcc")


@pytest.fixture
def opt():  # libtcc does not optimise: one level is enough
    return 0


@pytest.fixture(params=["scalar", "fused", "float32"])
def column(request):  # test_compile's (mode, -O level) pairs, at the one level
    return request.param, 0


@pytest.fixture(scope="module")
def net():
    return compile_classifier(compiler="libtcc")[0]


def test_module_is_built_in_memory_without_a_file_or_a_process(compiler, tmp_path, monkeypatch):
    libtcc.python_header()  # made once per Python and tcc version, into the cache
    cache = tmp_path / "cache"
    monkeypatch.setenv("MICROGRAD_C_CACHE", str(cache))
    libtcc.python_header.cache_clear()
    libtcc.python_header()
    made = sorted(os.listdir(cache))
    assert len(made) == 1 and made[0].startswith("libtcc-python-")

    def no_process(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)
    monkeypatch.setattr(os, "posix_spawn", no_process)
    monkeypatch.setattr(os, "fork", no_process)
    net, model = compile_classifier(compiler="libtcc")
    assert sorted(os.listdir(cache)) == made
    assert net.build.path is None and net.build.command == ("libtcc",) and not net.build.cached
    assert 0 < net.build.seconds == net.timings["compile"]
    assert list(net.params) == [p.data for p in model.parameters()]


def test_the_prepared_header_and_plain_python_h_build_the_same_module(compiler):
    x, p = Value(0.5), Value(-1.5)
    source = codegen.generate((x * p).tanh() + p.exp(), [x], [p])
    for prepared in (True, False):
        state = libtcc.compile_in_memory(source, prepared_header=prepared)
        assert state.symbol("PyInit_nn") != 0 and state.symbol("fn_forward") == 0  # statics stay local
        state.delete()


def test_compile_errors_carry_libtccs_messages(compiler, monkeypatch):
    x = Value(1.0)
    monkeypatch.setattr(codegen.write.loops, "c_literal", lambda value, dtype="float64": "syntax error here")  # the constant operand
    with pytest.raises(codegen.CompileError) as error:
        codegen.compile(x * 2.0, [x], [], compiler="libtcc")
    assert "<module>:" in error.value.stderr and "error" in error.value.stderr
    assert "libtcc" in str(error.value)
    with pytest.raises(codegen.CompileError, match="undefined symbol 'no_such_function'"):
        libtcc.compile_in_memory("int no_such_function(void); int f(void) { return no_such_function(); }")


def test_native_is_refused(compiler):
    x = Value(1.0)
    with pytest.raises(ValueError, match="native=True.*libtcc"):
        codegen.compile(x * 2.0, [x], [], compiler="libtcc", native=True)


def test_two_loads_have_their_own_state_and_states_are_freed(compiler):
    a, _ = compile_classifier(compiler="libtcc")
    b, _ = compile_classifier(compiler="libtcc")
    a.params[0] = 7.0
    assert b.params[0] != 7.0
    forward = b.forward  # a method keeps its module, and so its code, alive
    a_state, b_state = a._libtcc_state, b._libtcc_state
    del a, b
    gc.collect()
    compile_classifier(compiler="libtcc")  # deletes the states of modules that are gone
    assert a_state.pointer is None and b_state.pointer is not None
    assert forward() == 0.0  # b's code still runs (zero target: zero loss)


def grad_types():
    return sum(t.__name__ == "GradBuffer" for t in object.__subclasses__())


def test_a_gone_modules_types_go_with_it(compiler):
    """The module's `grad` type is its own heap type: once the module is collected nothing of it
    stays registered with `object`. A static type, readied from libtcc's memory, stayed after the
    memory was freed, and crashed the garbage collector a few hundred compiles later."""
    gc.collect()
    before = grad_types()
    net, _ = compile_classifier(compiler="libtcc")
    grad = net.grad
    assert grad_types() == before + 1
    del net
    gc.collect()
    assert grad[0] == 0.0  # grad keeps its module, and so its code
    del grad
    gc.collect()
    assert grad_types() == before
    for _ in range(50):  # the crash's recipe: modules compiled and dropped, their memory reused
        compile_classifier(compiler="libtcc")[0].grad[0] = 1.0
    gc.collect()
    assert grad_types() == before and libtcc.live_states() <= 2


def test_programs_split_into_several_units(compiler):
    """Huge straight-line programs come as several C files: one TCCState compiles them all."""
    x, p = Value(0.5), Value(1.0)
    y = x
    for i in range(2_400):  # (as test_compile's long chain: 10 files of the model's)
        y = y * p + 0.25 if i % 2 else (y * 0.5).tanh()
    sources = codegen.generate(y, [x], [p], fuse=False)
    assert len(sources) > 2  # the model's, then the module runtime
    net = codegen.compile(y, [x], [p], compiler="libtcc", fuse=False, sources=sources)
    assert net.forward() == y.data
