"""`make bench`'s command line: `python -m bench` runs the MNIST benchmark (bench.mnist), the
model zoo (bench.zoo), the minibatch table (bench.minibatch), the scale table (bench.scale) and
irregular graphs (bench.tiers) and microgpt (bench.gpt),
each in its own process, so that neither's memory peak or loaded libraries
(PyTorch) colour the other's figures; `--only mnist` or `--only zoo` runs one part, in this
process. Both parts accept the same options, and each uses those that concern it.

    python -m bench [--only mnist|zoo|minibatch|scale|tiers|gpt] [--quick] [options of either part: python -m bench --help]
"""
import argparse
import subprocess
import sys

from . import gpt, minibatch, mnist, scale, tiers, zoo
from .measure import add_arguments

PARTS = {'mnist': ('MNIST: MLP(784, [50, 10]), one epoch', mnist.run), 'zoo': ('The model zoo', zoo.run),
         'minibatch': ('Minibatches: train() and predict() beside PyTorch and JAX', minibatch.run),
         'scale': ('Scale: lowering from 40k to 1.9M parameters', scale.run),
         'tiers': ('Irregular graphs: bounded straight-line code and tiers', tiers.run),
         'gpt': ('microgpt: the compiled step beside the interpreted port, hand-written C, JAX and PyTorch', gpt.run)}


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # --configs: the labels of both parts (the same label, e.g. gcc-O3-native, selects it in both)
    labels = {c.label: c for c in [*mnist.CONFIGS, *zoo.CONFIGS]}
    add_arguments(parser, n_train=10_000, timeout=300, configs=list(labels.values()))
    parser.add_argument('--only', choices=tuple(PARTS), help='run only this part, in this process')
    parser.add_argument('--models', nargs='+', metavar='NAME', choices=list(zoo.models.MODELS),
                        help='zoo: measure only these models: ' + ' '.join(zoo.models.MODELS))
    parser.add_argument('--quick', action='store_true',
                        help=f'a smoke test: MNIST {" ".join(mnist.QUICK["configs"])} on {mnist.QUICK["n_train"]} '
                             f'images; zoo {" ".join(zoo.QUICK["models"])} with {" ".join(zoo.QUICK["configs"])}, '
                             'a tenth of the steps, once, without the big-graph check; scale: the two smallest models; '
                             'tiers: the 5k graph')
    parser.add_argument('--hidden', nargs='+', metavar='N,N',
                        help='scale: the models\' hidden layers (default: 50 128,64 256,128 512,256 1024,256 1024,1024)')
    parser.add_argument('--plot', default='build/scale.png', help='scale: where its plot goes (default build/scale.png)')
    tiers.add_arguments(parser)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser('python -m bench', __doc__).parse_args(argv)  # bad options fail before anything runs
    if args.only:
        return PARTS[args.only][1](args)
    status = 0
    for part, (title, _) in PARTS.items():
        print(f'\n## {title}\n', flush=True)
        status |= subprocess.run([sys.executable, '-m', 'bench', *argv, '--only', part]).returncode
    return status
