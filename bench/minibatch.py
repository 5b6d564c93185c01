"""`make bench`'s minibatch table: train() at batch 1, 32 and 128 and predict() of the test set,
µs per image, micrograd-c (every core, and one thread: wall and process CPU time) beside PyTorch
(every core, eager) and JAX (`jit`, the epoch as one `lax.scan`), on real MNIST, float32 and
float64. Every system and model runs in its own process (PyTorch loaded into a process slows later
runs in it), each figure the median of `--repeats` runs after one that warms up. The roofline row: the B = 128 step of the
biggest MLP in multiply-adds a second, to set beside the machine's peak (`make roofline`,
bench/c/bandwidth.c); the one thread's CPU time gives it on a shared machine, where wall time
counts the other processes' turns. Then issue 35's rows (WINDOW_ROWS) in windows taken in turn
(windows_table, bench/windows.py): ratios that hold while the machine's speed changes; for the MLP
also the cores' multiply-add peak served in the same rounds (bench/peak.py): the step's share of
it and the threads' gain beside the machine's own.

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
from bench import peak, windows
from bench.models import CONV_FILTERS, CONV_SIDE, IMAGE_SIDE, KERNEL, cnn
from mnist.data import load_mnist
from mnist.model import PIXEL_SCALE, build_graph

# name: the MLP's hidden layers, or None for the zoo's CNN (bench/models.py: conv 3x3x4, ReLU, dense 2704 -> 10)
MODELS = {'mlp-50': (50,), 'mlp-128-64': (128, 64), 'mlp-512-256': (512, 256), 'cnn': None}
BATCHES = (1, 32, 128)
SYSTEMS = ('micrograd-c', 'micrograd-c 1 thread', 'pytorch', 'jax')
LR = 0.01
PREDICT_CHUNK = 1000  # predict(): the peers take the test set in chunks of this many rows
WINDOW_ROUNDS = 5  # windows_table's rounds
# issue 35's rows (model, dtype), measured again in windows taken in turn (windows_table)
WINDOW_ROWS = (('mlp-512-256', 'float32'), ('cnn', 'float32'), ('cnn', 'float64'))
THREADS_TARGET = {'mlp-512-256': 1.8}  # issue 35's 2 threads against 1 (the MLP's; the CNN has none)
SHARE_TARGET, SHARE_TARGET_BATCH = {'mlp-512-256': 0.75}, 128  # issue 35's: the B = 128 step's share of the cores' peak


def multiply_adds(hidden):  # an MLP's
    """Per image: forward, and training (forward, weights' gradients, the inputs' gradients of
    every layer but the first)."""
    sizes = [784, *hidden, 10]
    layers = [a * b for a, b in zip(sizes, sizes[1:])]
    return sum(layers), 2 * sum(layers) + sum(layers[1:])


# ---- the systems, each run in a worker process ------------------------------------------------

def runs_ours(hidden, dtype, data, batches, threads=None):
    """{batch: an epoch of train(), 'predict': predict() of the test set}, and the threads."""
    X, y, Xt = data
    options = dict(compiler='gcc', opt=3, native=True, dtype=dtype, sparse_inputs=True, tiered=False)
    if hidden is None:
        model = cnn()
        net = codegen.compile(model.loss, model.inputs, model.params, outputs=model.outputs, **options)
    else:
        net = build_graph(hidden=hidden, init='he').compile(**options)
    if threads:
        net.set_threads(threads)
    runs = {b: (lambda b=b: net.train(X, y, LR, scale=PIXEL_SCALE, batch_size=b)) for b in batches}
    runs['predict'] = lambda: net.predict(Xt, scale=PIXEL_SCALE)
    return runs, net.threads()


def runs_torch(hidden, dtype, data, batches):
    """runs_ours' runs in PyTorch (eager, every core; predict in chunks of PREDICT_CHUNK), and its threads."""
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
    return {**{b: (lambda b=b: epoch(b)) for b in batches}, 'predict': predict}, torch.get_num_threads()


def runs_jax(hidden, dtype, data, batches):
    """runs_ours' runs in JAX (jit; an epoch one lax.scan, compiled by its first run, the
    warm-up), its threads, and the images each batch's epoch trains ({batch: n})."""
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
    runs, images = {}, {}
    for b in batches:
        n = len(y) // b * b
        xs = jnp.asarray(X[:n].reshape(-1, b, 784), kind) * PIXEL_SCALE
        ys = jnp.asarray(y[:n].reshape(-1, b))
        runs[b] = lambda xs=xs, ys=ys: jax.block_until_ready(epoch(params, xs, ys))
        images[b] = n  # (the scan's batches are whole: a last short one is left out)
    chunks = [jnp.asarray(Xt[i:i + PREDICT_CHUNK], kind) * PIXEL_SCALE for i in range(0, len(Xt), PREDICT_CHUNK)]

    def predict_all():
        for chunk in chunks:
            jax.block_until_ready(predict(params, chunk))
    runs['predict'] = predict_all
    return runs, os.cpu_count(), images


def _timed(run):
    """(wall, process CPU) seconds of one run."""
    started, cpu_started = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - started, time.process_time() - cpu_started


def _median(run, repeats):
    """The median (wall, process CPU) seconds of `repeats` runs."""
    times = [_timed(run) for _ in range(repeats)]
    return statistics.median(w for w, _ in times), statistics.median(c for _, c in times)


def _system_runs(args):
    """The system's runs (runs_ours, runs_torch, runs_jax) on the data, and its threads; and the
    number of images a run goes over ({run: images})."""
    train_images, train_labels, test_images, _ = load_mnist(args.data_dir, download_missing=False)
    data = (train_images[:args.images], train_labels[:args.images].astype(np.int64), test_images)
    hidden = MODELS[args.model]
    images = {**{b: args.images for b in args.batches}, 'predict': len(test_images)}
    if args.system.startswith('micrograd-c'):
        runs, threads = runs_ours(hidden, args.dtype, data, args.batches, 1 if args.system.endswith('1 thread') else None)
    elif args.system == 'pytorch':
        runs, threads = runs_torch(hidden, args.dtype, data, args.batches)
    else:
        runs, threads, trained = runs_jax(hidden, args.dtype, data, args.batches)
        images.update(trained)
    return runs, threads, images


def _warm_up(runs):
    """Each run once (its buffers' first touches, a pool's threads, a jit's compile: no window's
    and no median's)."""
    for run in runs.values():
        run()


def worker(args):
    runs, threads, images = _system_runs(args)
    _warm_up(runs)
    medians = {run: _median(f, args.repeats) for run, f in runs.items()}
    print(json.dumps({'train': {b: medians[b][0] / images[b] * 1e6 for b in args.batches},
                      'predict': medians['predict'][0] / images['predict'] * 1e6, 'threads': threads,
                      'cpu': {b: cpu / images[b] * 1e6 for b, (_, cpu) in medians.items()}}))


def serve(args):
    """A system kept running for the windows (bench/windows.py's served end): a window of a run
    (a line: a batch size, or predict) is one epoch of it, its wall time us an image."""
    runs, _, images = _system_runs(args)
    _warm_up(runs)
    windows.serve({str(run): (lambda run=run: _timed(runs[run])[0] / images[run] * 1e6) for run in runs})


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
    parser.add_argument('--windows', type=int, default=WINDOW_ROUNDS,
                        help=f'rounds of the windows taken in turn (default {WINDOW_ROUNDS}; 0: none)')
    parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--serve', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--system', choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument('--model', choices=list(MODELS), help=argparse.SUPPRESS)
    parser.add_argument('--dtype', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.serve:
        serve(args)
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
    if args.windows:
        print(windows_table(args))
    return 0


def windows_table(args):
    """Issue 35's ratios held in the same second: for its rows (WINDOW_ROWS: the models and dtypes
    measured), micrograd-c (every core) and the peers installed kept running in their own
    processes, each run (train at the batches of 32 and more, predict) one epoch a window, taken in turn
    (bench/windows.py): the median over the rounds of ours over the faster peer's window of the
    same round; with "micrograd-c 1 thread" among the systems, also its windows and the threads'
    gain: the median over the rounds of its window over ours (every core) of the same round (issue
    35's 2 threads against 1: the cores' speeds change too, each on its own, for minutes at a time)."""
    runs = [str(b) for b in args.batches if b >= 32] + ['predict']
    one = 'micrograd-c 1 thread' if 'micrograd-c 1 thread' in args.systems else None
    lines = [f'\nWindows taken in turn ({args.windows} rounds, a window one epoch: µs per image, medians): ours '
             'against the faster peer of each round (this machine\'s speed changes for seconds at a time; rows '
             'measured one after another straddle it)\n',
             '| model | dtype | run | micrograd-c | PyTorch | JAX | median of ours / the round\'s faster peer | target |'
             + (' micrograd-c 1 thread | threads\' gain: 1 thread / ours | target |' if one else ''),
             '|---|---|---|---|---|---|---|---|' + ('---|---|---|' if one else '')]
    peak_lines = []
    with peak.built() as exe:
        for model, dtype in WINDOW_ROWS:
            if model not in args.models or dtype not in args.dtypes:
                continue
            common = ['--model', model, '--dtype', dtype, '--images', str(args.images), '--batches', *runs[:-1]]
            if args.data_dir:
                common += ['--data-dir', str(args.data_dir)]
            peers = [s for s in ('pytorch', 'jax') if s in args.systems and _installed(s)]
            commands = {s: [sys.executable, '-m', 'bench.minibatch', '--serve', '--system', s, *common]
                        for s in ['micrograd-c', *peers, *([one] if one else [])]}
            if MODELS[model] is not None and exe is not None:  # (an MLP's multiply-adds are counted)
                commands = peak.around(exe, dtype, commands)
            times = windows.in_turn(commands, runs, args.windows)
            if isinstance(times, str):
                lines.append(f'| {model} | {dtype} | - | not measured: {times} |')
                continue
            for run in runs:
                fastest = [min(round_) for round_ in zip(*(times[s][run] for s in peers))] if peers else None
                cells = [f'{statistics.median(times[s][run]):.1f}' if s in times else '-'
                         for s in ('micrograd-c', 'pytorch', 'jax')]
                ratio = f'**{windows.ratio(times["micrograd-c"][run], fastest):.2f}x**' if fastest else '-'
                name = f'train B={run}' if run != 'predict' else 'predict'
                goal = f'>= {THREADS_TARGET[model]}x' if model in THREADS_TARGET else '-'
                threads = (f' {statistics.median(times[one][run]):.1f} | '
                           f'**{windows.ratio(times[one][run], times["micrograd-c"][run]):.2f}x** | {goal} |' if one else '')
                lines.append(f'| {model} | {dtype} | {name} | {" | ".join(cells)} | {ratio} | <= 0.8x |{threads}')
                if peak.EVERY in times:
                    peak_lines.append(_peak_line(model, dtype, run, name, {s: t[run] for s, t in times.items()}, one))
    if peak_lines:
        lines += ['\nThe same rounds against the cores\' multiply-add peak (bench/c/bandwidth.c served: a window of '
                  f'{peak.WINDOW_SECONDS} s on one thread and on {peak.cores()}, taken in turn with the runs\'): ours '
                  'in G multiply-adds/s (counted from the layers), the share of the peak on every core, and the '
                  'threads\' gain beside the machine\'s own (its peak on every core over one thread\'s), each the median '
                  'over the rounds of the same round\'s figures; and a cache line\'s round trip between two threads '
                  'right before our window of each round (ns, median / largest: this VM\'s host moves its vCPUs, and '
                  'a product shared between the cores pays it a line)\n',
                  '| model | dtype | run | ours G/s | peak G/s | share | target | the machine\'s gain | our threads\' '
                  'gain | ours / the machine\'s | target | round trip ns | our threads\' gain in the rounds whose '
                  'round trip was within 2x of the fastest |',
                  '|---|---|---|---|---|---|---|---|---|---|---|---|---|', *peak_lines]
    return '\n'.join(lines)


def _peak_line(model, dtype, run, name, times, one):
    """A run's row of the windows' peak table: times {system: its windows' us an image}."""
    forward, train = multiply_adds(MODELS[model])
    found = peak.in_rounds(times, forward if run == 'predict' else train, 'micrograd-c', one)
    share_goal = f'>= {SHARE_TARGET[model]:.0%}' if run == str(SHARE_TARGET_BATCH) and model in SHARE_TARGET else '-'
    gain_goal = (f'>= {THREADS_TARGET[model] / peak.cores():.0%} ({THREADS_TARGET[model]}x of {peak.cores()} cores)'
                 if model in THREADS_TARGET else '-')
    gains = (f"{found['machine_gain']:.2f}x | {found['gain']:.2f}x | **{found['of_machine']:.0%}** | {gain_goal} |"
             if 'gain' in found else '- | - | - | - |')
    trips = (f" {found['trip']:.0f} / {found['trip_max']:.0f} |" if 'trip' in found else ' - |') + (
        f" {found['gain_near']:.2f}x ({found['rounds_near']} of {len(times['micrograd-c'])}) |"
        if 'gain_near' in found else ' - |')
    return (f"| {model} | {dtype} | {name} | {found['rate']:.1f} | {found['peak']:.1f} | **{found['share']:.0%}** | "
            f"{share_goal} | {gains}{trips}")


def _installed(system):
    import importlib.util
    return importlib.util.find_spec({'pytorch': 'torch', 'jax': 'jax'}[system]) is not None


if __name__ == '__main__':
    sys.exit(main())
