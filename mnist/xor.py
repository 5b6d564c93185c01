"""`make xor`: micrograd's MLP learns XOR twice, compiled and interpreted, to show that the compiled
training step computes what micrograd_c's interpreter computes.

    python -m mnist.xor [--compiler gcc] [--opt 2] [--scalar] [--steps 300] [--lr 0.1] [--seed 0] [--out build]

Both start from the same weights and take the same full-batch SGD steps on the mean squared error
over the four points (baked into the compiled module as constants). The parameters end up equal
to the last bit or two: fused dot products add in another order; --scalar code replays the
interpreter's every operation, and they end up identical. Exit status 0 if both classify all four
points and their final parameters agree.

The compiled module is also installed as `xor` in --out (default build/), starting from the same
initial weights, so that a script can `sys.path.insert(0, "build"); import xor` and train it.
"""

import argparse
import random
import sys
from pathlib import Path

import codegen
from micrograd_c import MLP, mse

from .build import install
from .model import at_least, sgd_step
from .options import add_compiler_arguments, compiler_options

POINTS = [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)]
TARGETS = [-1.0, 1.0, 1.0, -1.0]  # the sign of the output is the class
REPORT_EVERY = 50
TOLERANCE = 1e-9  # on the parameters: far above rounding differences, far below any real bug


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compiler_arguments(parser, native=False)
    parser.add_argument("--steps", type=at_least(1), default=300, help="SGD steps (default 300)")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate (default 0.1)")
    parser.add_argument("--seed", type=int, default=0, help="random.seed for the initial weights (default 0)")
    parser.add_argument("--out", type=Path, default=Path("build"),
                        help="where to install the module as `xor` (default build; '' to skip)")
    args = parser.parse_args(argv)

    random.seed(args.seed)
    model = MLP(2, [8, 1], activation="tanh")
    predictions = predict(model)
    try:
        net = codegen.compile(mse(predictions, TARGETS), params=model.parameters(), outputs=predictions,
                              **compiler_options(args), name="xor", embed_params=True)
    except codegen.ToolchainError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if str(args.out):
        print(f"installed {install(net, 'xor', args.out, args.compiler, args.opt, False)} "
              f"(import it from {args.out}: it starts from these initial weights)\n")

    print(f"{'step':>6}  {'compiled loss':>18}  {'interpreted loss':>18}")
    for step in range(1, args.steps + 1):
        compiled_loss = net.forward()
        net.zero_grad()
        net.backward()
        net.update(args.lr)
        interpreted_loss = mse(predict(model), TARGETS)
        sgd_step(model, interpreted_loss, args.lr)
        if step == 1 or step % REPORT_EVERY == 0 or step == args.steps:
            print(f"{step:>6}  {compiled_loss:>18.12e}  {interpreted_loss.data:>18.12e}")

    net.forward()  # the outputs at the final parameters
    compiled, interpreted = net.outputs(), [p.data for p in predict(model)]
    difference = max(abs(c - p.data) for c, p in zip(net.params, model.parameters()))
    print(f"\nmax |compiled - interpreted| over the final parameters: {difference:.3g}")
    print(f"{'x':>10}  {'target':>6}  {'compiled':>10}  {'interpreted':>11}")
    for x, target, c, i in zip(POINTS, TARGETS, compiled, interpreted):
        print(f"{str(x):>10}  {target:>6g}  {c:>10.6f}  {i:>11.6f}")
    accuracies = [accuracy(outputs) for outputs in (compiled, interpreted)]
    print(f"accuracy: compiled {accuracies[0]:.0%}, interpreted {accuracies[1]:.0%}")
    return 0 if accuracies == [1.0, 1.0] and difference <= TOLERANCE else 1


def predict(model):
    """The model's output Value for each point."""
    return [model(list(point)) for point in POINTS]


def accuracy(outputs):
    return sum((y > 0) == (t > 0) for y, t in zip(outputs, TARGETS)) / len(TARGETS)


if __name__ == "__main__":
    sys.exit(main())
