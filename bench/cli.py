"""The command line `make bench` shares: `python -m bench` (both parts), `python -m bench.mnist` and
`python -m bench.zoo` accept the same options, and each part uses those that concern it."""
import argparse


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    from . import mnist, zoo  # here: both import this module
    from .measure import add_arguments

    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # --configs: the labels of both parts (the same label, e.g. gcc-O3-native, selects it in both)
    labels = {c.label: c for c in [*mnist.CONFIGS, *zoo.CONFIGS]}
    add_arguments(parser, n_train=10_000, timeout=300, configs=list(labels.values()))
    parser.add_argument('--only', choices=('mnist', 'zoo', 'scale'), help='python -m bench: run only this part')
    parser.add_argument('--models', nargs='+', metavar='NAME', choices=list(zoo.models.MODELS),
                        help='zoo: measure only these models: ' + ' '.join(zoo.models.MODELS))
    parser.add_argument('--quick', action='store_true',
                        help=f'a smoke test: MNIST {" ".join(mnist.QUICK["configs"])} on {mnist.QUICK["n_train"]} '
                             f'images; zoo {" ".join(zoo.QUICK["models"])} with {" ".join(zoo.QUICK["configs"])}, '
                             'a tenth of the steps, once, without the big-graph check; scale: the two smallest models')
    parser.add_argument('--hidden', nargs='+', metavar='N,N',
                        help='scale: the models\' hidden layers (default: 50 128,64 256,128 512,256 1024,256 1024,1024)')
    parser.add_argument('--plot', default='build/scale.png', help='scale: where its plot goes (default build/scale.png)')
    return parser
