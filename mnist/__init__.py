"""The MNIST app: reading and downloading the data (data), the workload MLP(784, [50, 10]) (model),
building its module for `make` (build), training it (train) and the XOR demo (xor)."""
