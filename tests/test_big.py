"""The MNIST model in the straight-line scalar mode (~120k nodes, several C units) builds with
every compiler at -O0 and -O1 and trains the same numbers as the fused mode. Slow: `make test-all`."""

import numpy as np
import pytest

from mnist.model import PIXEL_SCALE, build_graph


@pytest.fixture(scope="module")
def graph():
    return build_graph(seed=0, init="he")


@pytest.mark.slow
@pytest.mark.parametrize("opt", [0, 1])
def test_scalar_mnist_builds_and_matches_fused(graph, compiler, opt):
    rng = np.random.default_rng(0)
    X = rng.integers(0, 256, size=(50, 784), dtype=np.uint8)
    labels = rng.integers(0, 10, size=50)
    nets = [graph.compile(compiler=compiler, opt=opt, fuse=fuse, tiered=False) for fuse in (False, True)]
    units = list(nets[0].build.source.parent.glob(nets[0].build.source.stem + ".*.c"))
    assert len(units) >= 5  # compiled as several units
    losses = [net.train(X, labels, 0.01, scale=PIXEL_SCALE) for net in nets]
    assert losses[0] == pytest.approx(losses[1], rel=1e-9)
    np.testing.assert_allclose(np.asarray(nets[0].params), np.asarray(nets[1].params), rtol=1e-9, atol=1e-12)
