"""MNIST data: reading IDX files, downloading and checking the data set."""
