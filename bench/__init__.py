"""The benchmark harness: our compiled modules against pure-Python micrograd, NumPy, PyTorch and
plain-C references.

    python -m bench            # `make bench`: the MNIST bench (bench.mnist), then the model zoo (bench.zoo)
    python -m bench --only zoo # one part (bench/cli.py: the options)
    python -m bench.compare    # `make compare`: every compiler and -O level on MNIST

measure (one MNIST configuration, its table), peers (NumPy, PyTorch and C peers of the MNIST MLP),
models (the zoo's models as a micrograd user writes them), zoo (their table) and c/ (the C references).
"""
