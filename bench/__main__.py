"""`make bench`: the MNIST benchmark (bench.mnist), the model zoo (bench.zoo), then the scale table
(bench.scale: codegen time and peak memory from 40k to 1.9M parameters), each in its own process,
so that neither's memory peak or loaded libraries (PyTorch) colour the other's figures.

    python -m bench [--only mnist|zoo|scale] [--quick] [options of any part: python -m bench --help]
"""
import subprocess
import sys

from . import cli

PARTS = {'mnist': 'MNIST: MLP(784, [50, 10]), one epoch', 'zoo': 'The model zoo',
         'scale': 'Scale: lowering from 40k to 1.9M parameters'}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = cli.parser('python -m bench', __doc__).parse_args(argv)  # bad options fail before anything runs
    status = 0
    for part, title in PARTS.items():
        if args.only in (None, part):
            print(f'\n## {title}\n', flush=True)
            status |= subprocess.run([sys.executable, '-m', f'bench.{part}', *argv]).returncode
    return status


if __name__ == '__main__':
    sys.exit(main())
