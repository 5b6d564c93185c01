"""`make bench`'s minibatch table: train() at batch 1, 32 and 128 and predict() of the test set,
µs per image, micrograd-c (every core, and one thread: wall and process CPU time) beside PyTorch
(every core, eager) and JAX (`jit`, the epoch as one `lax.scan`), on real MNIST, float32 and
float64. Every system and model runs in its own process (PyTorch loaded into a process slows later
runs in it), each figure the median of `--repeats` runs. The roofline row: the B = 128 step of the
biggest MLP in multiply-adds a second, to set beside the machine's peak (`make roofline`,
bench/c/bandwidth.c); the one thread's CPU time gives it on a shared machine, where wall time
counts the other processes' turns.

    python -m bench.minibatch [--models mlp-50 ...] [--dtypes float32] [--images N] [--repeats R]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import codegen
from bench.models import CONV_FILTERS, CONV_SIDE, IMAGE_SIDE, KERNEL, cnn
from mnist.data import load_mnist
from mnist.model import PIXEL_SCALE, build_graph

# name: the MLP's hidden layers, or None for the zoo's CNN (bench/models.py: conv 3x3x4, ReLU, dense 2704 -> 10)
MODELS = {'mlp-50': (50,), 'mlp-128-64': (128, 64), 'mlp-512-256': (512, 256), 'cnn': None}
BATCHES = (1, 32, 128)
SYSTEMS = ('micrograd-c', 'micrograd-c 1 thread', 'pytorch', 'jax')
LR = 0.01
PREDICT_CHUNK = 1000  # predict(): the peers take the test set in chunks of this many rows


def multiply_adds(hidden):  # an MLP's
    """Per image: forward, and training (forward, weights' gradients, the inputs' gradients of
    every layer but the first)."""
    sizes = [784, *hidden, 10]
    layers = [a * b for a, b in zip(sizes, sizes[1:])]
    return sum(layers), 2 * sum(layers) + sum(layers[1:])


# ---- the systems, each run in a worker process ------------------------------------------------

def run_ours(hidden, dtype, data, batches, repeats, threads):
    X, y, Xt = data
    options = dict(compiler='gcc', opt=3, native=True, dtype=dtype, sparse_inputs=True)
    if hidden is None:
        model = cnn()
        net = codegen.compile(model.loss, model.inputs, model.params, outputs=model.outputs, **options)
    else:
        net = build_graph(hidden=hidden, init='he').compile(**options)
    if threads:
        net.set_threads(threads)
    cpu = {}
    train = {b: _median(lambda b=b: net.train(X, y, LR, scale=PIXEL_SCALE, batch_size=b), repeats, cpu, b)
             for b in batches}
    predict = _median(lambda: net.predict(Xt, scale=PIXEL_SCALE), repeats, cpu, 'predict')
    return train, predict, net.threads(), cpu


def run_torch(hidden, dtype, data, batches, repeats):
    import torch
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    kind = getattr(torch, dtype)
    X, y, Xt = data
    X, y = torch.tensor(X, dtype=kind) * PIXEL_SCALE, torch.tensor(y, dtype=torch.int64)
    Xt = torch.tensor(Xt, dtype=kind) * PIXEL_SCALE
    if hidden is None:
        X, Xt = X.reshape(-1, 1, IMAGE_SIDE, IMAGE_SIDE), Xt.reshape(-1, 1, IMAGE_SIDE, IMAGE_SIDE)
        model = torch.nn.Sequential(torch.nn.Conv2d(1, CONV_FILTERS, KERNEL, dtype=kind), torch.nn.ReLU(),
                                    torch.nn.Flatten(), torch.nn.Linear(CONV_FILTERS * CONV_SIDE ** 2, 10, dtype=kind))
    else:
        sizes = [784, *hidden, 10]
        layers = []
        for a, b in zip(sizes, sizes[1:]):
            layers += [torch.nn.Linear(a, b, dtype=kind), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def epoch(b):
        for i in range(0, len(y), b):
            loss = torch.nn.functional.cross_entropy(model(X[i:i + b]), y[i:i + b])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    def predict():
        with torch.no_grad():
            for i in range(0, len(Xt), PREDICT_CHUNK):
                model(Xt[i:i + PREDICT_CHUNK])
    return {b: _median(lambda b=b: epoch(b), repeats) for b in batches}, _median(predict, repeats), torch.get_num_threads()


def run_jax(hidden, dtype, data, batches, repeats):
    if np.dtype(dtype).itemsize == 8:  # JAX computes in 32 bits unless told
        os.environ['JAX_ENABLE_X64'] = '1'
    import jax
    import jax.numpy as jnp
    X, y, Xt = data
    kind = getattr(jnp, dtype)
    sizes = [784, *hidden, 10] if hidden else [KERNEL * KERNEL, CONV_FILTERS * CONV_SIDE ** 2, 10]
    keys = jax.random.split(jax.random.PRNGKey(0), len(sizes))
    params = [(jax.random.uniform(k, (a, b), kind, -1, 1) * (6 / a) ** 0.5, jnp.zeros(b, kind))
              for k, a, b in zip(keys, sizes, sizes[1:])]

    def forward(params, x):
        if hidden is None:  # the convolution's 4 filters of 3 x 3 (params[0]), then the dense layer
            (w, b), (dense, bias) = params
            kernels = w[:, :CONV_FILTERS].T.reshape(CONV_FILTERS, 1, KERNEL, KERNEL)
            planes = jax.lax.conv_general_dilated(x.reshape(-1, 1, IMAGE_SIDE, IMAGE_SIDE), kernels, (1, 1), 'VALID')
            x = jax.nn.relu(planes + b[:CONV_FILTERS, None, None]).reshape(x.shape[0], -1)
            return x @ dense + bias
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        return x @ w + b

    def loss(params, x, labels):
        logits = forward(params, x)
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1))

    def step(params, batch):
        grads = jax.grad(loss)(params, *batch)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), None

    @jax.jit
    def epoch(params, xs, ys):
        return jax.lax.scan(step, params, (xs, ys))[0]

    predict = jax.jit(forward)
    train = {}
    for b in batches:
        n = len(y) // b * b
        xs = jnp.asarray(X[:n].reshape(-1, b, 784), kind) * PIXEL_SCALE
        ys = jnp.asarray(y[:n].reshape(-1, b))
        jax.block_until_ready(epoch(params, xs, ys))  # compiled before the clock starts
        train[b] = _median(lambda: jax.block_until_ready(epoch(params, xs, ys)), repeats) * len(y) / n
    chunks = [jnp.asarray(Xt[i:i + PREDICT_CHUNK], kind) * PIXEL_SCALE for i in range(0, len(Xt), PREDICT_CHUNK)]
    jax.block_until_ready(predict(params, chunks[0]))

    def predict_all():
        for chunk in chunks:
            jax.block_until_ready(predict(params, chunk))
    return train, _median(predict_all, repeats), os.cpu_count()


def _median(run, repeats, cpu=None, key=None):
    """The median wall time of `repeats` runs; with `cpu`, cpu[key] the median process CPU time."""
    times, cpu_times = [], []
    for _ in range(repeats):
        started, cpu_started = time.perf_counter(), time.process_time()
        run()
        times.append(time.perf_counter() - started)
        cpu_times.append(time.process_time() - cpu_started)
    if cpu is not None:
        cpu[key] = statistics.median(cpu_times)
    return statistics.median(times)


def worker(args):
    train_images, train_labels, test_images, _ = load_mnist(args.data_dir, download_missing=False)
    data = (train_images[:args.images], train_labels[:args.images].astype(np.int64), test_images)
    hidden = MODELS[args.model]
    cpu = {}
    if args.system.startswith('micrograd-c'):
        train, predict, threads, cpu = run_ours(hidden, args.dtype, data, args.batches, args.repeats,
                                                1 if args.system.endswith('1 thread') else None)
    else:
        train, predict, threads = {'pytorch': run_torch, 'jax': run_jax}[args.system](
            hidden, args.dtype, data, args.batches, args.repeats)
    print(json.dumps({'train': {b: t / args.images * 1e6 for b, t in train.items()},
                      'predict': predict / len(test_images) * 1e6, 'threads': threads,
                      'cpu': {b: t / (len(test_images) if b == 'predict' else args.images) * 1e6
                              for b, t in cpu.items()}}))


# ---- the table --------------------------------------------------------------------------------

def measure(system, model, dtype, args):
    """µs/image of one system in its own process: {'train': {batch: µs}, 'predict': µs}, or None
    when it cannot run here (the reason printed)."""
    command = [sys.executable, '-m', 'bench.minibatch', '--worker', '--system', system, '--model', model,
               '--dtype', dtype, '--images', str(args.images), '--repeats', str(args.repeats),
               '--batches', *map(str, args.batches)]
    if args.data_dir:
        command += ['--data-dir', str(args.data_dir)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ['?'])[-1]
        print(f'  {system} {model} {dtype}: not measured ({last})', flush=True)
        return None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result['train'] = {int(b): t for b, t in result['train'].items()}
    result['cpu'] = {b if b == 'predict' else int(b): t for b, t in result['cpu'].items()}
    return result


def table(results, args):
    peers = ('pytorch', 'jax')
    one_thread = SYSTEMS.index('micrograd-c 1 thread') + 1
    head = ['model', 'dtype', 'run'] + [*SYSTEMS[:one_thread], '1 thread, CPU time', *SYSTEMS[one_thread:]] + [
        'ours / best peer']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for (model, dtype), by_system in results.items():
        runs = [(f'train B={b}', b) for b in args.batches]
        runs.append((f'predict ({PREDICT_CHUNK}-row chunks for the peers)', 'predict'))
        for name, key in runs:
            cells = [(r['predict'] if key == 'predict' else r['train'].get(key)) if (r := by_system.get(s)) else None
                     for s in SYSTEMS]
            best_peer = min((c for s, c in zip(SYSTEMS, cells) if s in peers and c), default=None)
            ratio = f'**{cells[0] / best_peer:.2f}x**' if cells[0] and best_peer else '-'
            cpu = (by_system.get('micrograd-c 1 thread') or {}).get('cpu', {}).get(key)
            cells.insert(one_thread, cpu)
            lines.append('| ' + ' | '.join([model, dtype, name, *[f'{c:.1f}' if c else '-' for c in cells], ratio])
                         + ' |')
    return '\n'.join(lines)


QUICK = ['--models', 'mlp-50', '--dtypes', 'float32', '--images', '2000', '--repeats', '1']


def run(args):
    """`python -m bench --only minibatch` (bench/cli.py): the whole table, or with --quick a smoke test."""
    return main(QUICK if args.quick else [])


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m bench.minibatch', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', choices=list(MODELS), default=list(MODELS))
    parser.add_argument('--dtypes', nargs='+', choices=('float32', 'float64'), default=['float32', 'float64'])
    parser.add_argument('--systems', nargs='+', choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument('--batches', nargs='+', type=int, default=list(BATCHES))
    parser.add_argument('--images', type=int, default=10_000, help='training images per timed run (default 10,000)')
    parser.add_argument('--repeats', type=int, default=3, help='timed runs per figure, median (default 3)')
    parser.add_argument('--data-dir', default=os.environ.get('MNIST_DIR'))
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--system', choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument('--model', choices=list(MODELS), help=argparse.SUPPRESS)
    parser.add_argument('--dtype', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    results = {}
    for model in args.models:
        for dtype in args.dtypes:
            results[model, dtype] = {s: measure(s, model, dtype, args) for s in args.systems}
            print(f'  measured {model} {dtype}', flush=True)
    print(f'\nµs per image, median of {args.repeats} runs over {args.images:,} training images '
          f'(predict: the 10,000 test images); each system in its own process\n')
    print(table(results, args))
    print('\nmicrograd-c with sparse_inputs=True (the first layer skips the input rows that are 0 in '
          'the whole batch: no peer does); PyTorch on every core; JAX jit, the epoch one lax.scan')
    big = results.get(('mlp-512-256', 'float32'), {})
    _, train_macs = multiply_adds(MODELS['mlp-512-256'])
    if big.get('micrograd-c') and 128 in big['micrograd-c']['train']:
        rate = train_macs / big['micrograd-c']['train'][128] / 1e3
        print(f'\nMLP(784, [512, 256, 10]) float32, train B=128: {rate:.1f} G multiply-adds/s on '
              f'{big["micrograd-c"]["threads"]} thread(s) (`make roofline` measures the machine\'s peak per core)')
    if big.get('micrograd-c 1 thread') and 128 in big['micrograd-c 1 thread']['cpu']:
        rate = train_macs / big['micrograd-c 1 thread']['cpu'][128] / 1e3
        print(f'MLP(784, [512, 256, 10]) float32, train B=128 on one thread: {rate:.1f} G multiply-adds '
              f'per second of its process CPU time (against one core\'s peak)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
