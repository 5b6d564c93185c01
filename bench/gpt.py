"""microgpt (gpt/) in `make bench`: the compiled step on each compiler beside its peers, each
system in its own process, microgpt's default configuration on the census first names, one
document a step (float64), every peer from the port's start (the same parameters, the same
document order):

- the compiled port, per compiler: the graph built in Python (the cyclic collector paused, as the
  app does), codegen (the graph read, lowered, C written) and the build (the module runtime, which
  every model links, compiled before it, once a machine: its time beside; both make an empty
  cache's build), each the median of 3 and its peak compiler memory, a cache hit (the graph read, the build found by its structure, loaded), microgpt's 1,000 steps (the losses every
  peer is checked against), and the step: the median of 5 runs of 200 steps (one document a step,
  Adam inside, microgpt's learning rate schedule) as the app trains them, 100 steps a train() call
  (lr as one rate a step: Python runs between calls, as JAX's scan runs its steps without it),
  and (in the ratios) a train() call a step, as microgpt's loop is written;
- the interpreted port: microgpt's own loop, its first 5 steps;
- the hand-written C (bench/c/microgpt.c, a scalar tape rebuilt every step, gcc -O2): microgpt's
  1,000 steps and 20 samples, 3 runs, the median;
- JAX (bench/gpt_peers.py, float64, XLA's default threads), when installed (`make jax`): the jitted step
  called from a Python loop, and all 1,000 steps in one lax.scan, 3 runs each, the median;
- PyTorch (when installed, `make torch`): the same model as tensors, one document a step,
  torch.optim.Adam with microgpt's learning rate set each step: microgpt's 1,000 steps, once.

Then the issue's ratios (compiled step / JAX's scanned step, compiled step / the hand-written C's)
with their targets; the compiled steps (gcc, clang) and JAX's scan again, 30 windows of each
(1,000 steps) taken in turn from processes kept running, the median of each window's ratio to the
next JAX window (this machine's speed changes for seconds to minutes at a time, which rows run one
after another straddle); and issue 36's rows, each also against JAX's scan in 10 windows taken in
turn: B = 16 and 64 documents a step, float64 and float32 (the
batched program, gcc, beside JAX's scan of the same batches and PyTorch on all cores), 50 steps, a
document's time; and the bigger configuration (n_embd 64, 4 heads, 2 layers, block 32, float32,
B = 32, on windows of the data's text: every position used): its build, a
document's time against the peers, its share of the cores' multiply-add peak (bench/c/bandwidth.c,
`make roofline`'s program, on this CPU) and 2 threads against 1, both also in the windows taken in
turn with JAX's, beside the peak served in the same rounds (bench/peak.py). A peer whose losses leave the
port's by more than 1e-9 (relative; float32 rows: 1e-4 over their first 10 steps) fails the run.

    python -m bench --only gpt [--quick]
"""

import itertools
import json
import os
import pathlib
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import measure, peak, windows

COMPILERS = ("tcc", "gcc", "clang")
STEPS, RUNS = 200, 5
BUILD_RUNS = 3  # codegen and the build, each from the graph into a cache of the runtime only: medians
BATCHES, BATCH_STEPS = (16, 64), 50  # documents a step, steps timed (issue 36's rows)
BATCH_DTYPES = ("float64", "float32")
# issue 36's bigger configuration (python -m gpt's options), its batch and dtype
CONFIGS = {"default": (), "big": ("--n-embd", "64", "--n-head", "4", "--n-layer", "2", "--block-size", "32",
                                  "--windows")}
BIG_BATCH, BIG_DTYPE = 32, "float32"
PORT_STEPS, PEER_RUNS = 1000, 3  # microgpt's run: the losses checked, the peers' timed steps
WINDOW = "window"                # the one run a served system times (bench/windows.py)
ONE_THREAD = "ours 1 thread"     # the bigger configuration's windows on one thread (its threads' gain)
PAIR_ROUNDS = 30                 # _pairs: windows of the compiled steps and JAX's scan, taken in turn
BATCH_ROUNDS = 10                # _batches: the same for a batch row (a window: BATCH_STEPS batches)
TOLERANCE = 1e-9                 # the largest relative difference of a peer's losses from the port's
# (bound, steps compared) of a batch row's peer: float32's rounding differs from the first step and
# training amplifies it (JAX in float32 against float64, the bigger configuration: 3e-8 at step 1,
# 2e-6 by step 10, 2e-2 by step 50; JAX and PyTorch in float64 agree within 1e-14 over all 50).
# In float32 the peers' own losses differ by up to 1.4e-4 over the 10 steps (PyTorch against
# JAX, the bigger configuration, Intel Xeon, 2026-11-28; ours against JAX 5.8e-6 that hour)
BATCH_AGREEMENT = {"float64": (TOLERANCE, BATCH_STEPS), "float32": (5e-4, 10)}
SCANNED = "JAX's scanned step"
TARGETS = {SCANNED: 0.35, "the hand-written C's step": 0.05}  # issue 33's, compiled / peer


class _Clock:
    """Wall and CPU seconds (this process's, every thread) since it was made: the CPU time is what
    a busy machine's sharing does not inflate, or much less."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self):
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def _threads_cpu():
    """{thread id: its CPU ns} of this process's threads (Linux's schedstat), {} elsewhere."""
    times = {}
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                times[tid] = int(f.read().split()[0])
    except OSError:
        return {}
    return times


def _per_step(runs, steps):
    """{'step_us', 'cpu_us'}: the median over runs of (wall, CPU) seconds, a step."""
    return {"step_us": statistics.median(w for w, _ in runs) / steps * 1e6,
            "cpu_us": statistics.median(c for _, c in runs) / steps * 1e6}


def _inputs_and_targets(docs, tokenizer, block, count):
    """train()'s X and Y for the first `count` documents (cycling), as the port takes them."""
    from gpt import data
    rows = np.stack([data.row(tokenizer.encode(docs[k % len(docs)]), block) for k in range(count)])
    return np.ascontiguousarray(rows[:, :2 * block]), np.ascontiguousarray(rows[:, 2 * block:])


def _setup(config_args=()):
    """The port's start (gpt.train.setup) for microgpt's 1,000 steps (its learning rate decays over them)."""
    from gpt import train
    args = train.parse_args(["--steps", str(PORT_STEPS), *config_args])
    docs, tokenizer, state, params = train.setup(args)
    return args, docs, tokenizer, state, params


def child_compiled(compiler):
    import codegen
    from gpt import model, train
    from micrograd_c import engine
    args, docs, tokenizer, state, params = _setup(["--compiler", compiler])
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MICROGRAD_C_CACHE"] = cache
        runtime_s = measure.build_module_runtime(compiler)  # once a machine (gcc, clang, zig; None: tcc's is every build's)
        t0 = time.perf_counter()
        with engine.no_gc(survivors=True):  # as the app builds it (gpt/train.py)
            doc = model.document(state, args.config)
        tg = time.perf_counter()
        options = dict(inputs=doc.inputs, params=params, outputs=doc.outputs, batch=1,
                       optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS))
        built = dict(tiered=False)  # (the optimised build is what it times)
        sources = codegen.generate(doc.loss, **options)
        t1 = time.perf_counter()
        net = codegen.compile(doc.loss, **options, **built, compiler=compiler, sources=sources, measure_memory=True)
        t2 = time.perf_counter()
        codegen.compile(doc.loss, **options, **built, compiler=compiler)
        t3 = time.perf_counter()
        codegen_s, build_s = [t1 - tg], [t2 - t1]
        for _ in range(BUILD_RUNS - 1):  # again from the graph, each build into a cache of the runtime only
            with tempfile.TemporaryDirectory() as again:
                for part in pathlib.Path(cache).glob("runtime_*"):
                    shutil.copy2(part, again)
                t4 = time.perf_counter()
                sources = codegen.generate(doc.loss, **options)
                t5 = time.perf_counter()
                codegen.compile(doc.loss, **options, **built, compiler=compiler, sources=sources, cache=again)
                codegen_s.append(t5 - t4)
                build_s.append(time.perf_counter() - t5)
    losses = list(train.train_compiled(net, docs, tokenizer, args, _NoBar()))  # microgpt's 1,000 steps
    return {"graph_s": tg - t0, "codegen_s": statistics.median(codegen_s), "build_s": statistics.median(build_s),
            "runtime_s": runtime_s, "hit_s": t3 - t2, **_step_times(net, docs, tokenizer, args),
            "peak_rss": net.build.peak_rss, "first_loss": losses[0], "losses": losses}


def _step_times(net, docs, tokenizer, args):
    """The step of a compiled port: the median of RUNS runs of STEPS steps as the app trains
    (_as_the_app_trains: microgpt's schedule, train.CALL_STEPS documents a train() call), and
    (document_call_*) of the same steps a train() call each, as microgpt's loop is written."""
    X, Y = _inputs_and_targets(docs, tokenizer, args.config.block_size, STEPS)
    rates = _rates(args, STEPS)
    times, a_call_each = [], []
    for _ in range(RUNS):
        clock = _Clock()
        _as_the_app_trains(net, X, Y, rates)
        times.append(clock.read())
        clock = _Clock()
        _a_document_a_call(net, X, Y, rates)
        a_call_each.append(clock.read())
    each = _per_step(a_call_each, STEPS)
    return {**_per_step(times, STEPS), "document_call_us": each["step_us"], "document_call_cpu_us": each["cpu_us"]}


def _rates(args, steps):
    """microgpt's learning rate of each of the first `steps` steps."""
    from gpt import train
    return [train.learning_rate(args, step) for step in range(steps)]


def _as_the_app_trains(net, X, Y, rates):
    """train() on the rows of X, Y, one document a step at its rate, train.CALL_STEPS steps a call,
    as the app trains (gpt/train.py's train_compiled: Python between calls, not between steps)."""
    from gpt import train
    losses = np.empty(len(X))
    for first in range(0, len(X), train.CALL_STEPS):
        last = first + train.CALL_STEPS
        net.train(X[first:last], Y[first:last], rates[first:last], losses=losses[first:last])


def _a_document_a_call(net, X, Y, rates):
    """train() on each row of X, Y in turn at its rate, a call each (microgpt's loop as written)."""
    for i in range(len(X)):
        net.train(X[i:i + 1], Y[i:i + 1], rates[i])


def _port(args, state, params, compiler, batch, dtype, cache=None):
    """The compiled port (untiered; Adam with microgpt's betas): (module, graph s, compile() s)."""
    import codegen
    from gpt import model, train
    from micrograd_c import engine
    t0 = time.perf_counter()
    with engine.no_gc(survivors=True):  # as the app builds it (gpt/train.py)
        doc = model.document(state, args.config)
    t1 = time.perf_counter()
    net = codegen.compile(doc.loss, inputs=doc.inputs, params=params, outputs=doc.outputs, batch=batch, dtype=dtype,
                          optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS), compiler=compiler, tiered=False,
                          cache=cache)
    return net, t1 - t0, time.perf_counter() - t1


def child_serve(system, cache, batch="1", dtype="float64", config="default", threads=""):
    """A system kept running for _windows (bench/windows.py's served end): one window, its us a
    document, for each line it reads. A compiled port (built into
    `cache`; on `threads` threads when given, else every core): PORT_STEPS steps of a document as
    the app trains them, or (batch > 1) BATCH_STEPS batches in one train() call; "jax": the same
    steps in one lax.scan."""
    batch = int(batch)
    options = ["--batch-size", str(batch), "--dtype", dtype, *CONFIGS[config]]
    args, docs, tokenizer, state, params = _setup((["--compiler", system] if system != "jax" else []) + options)
    steps = PORT_STEPS if batch == 1 else BATCH_STEPS
    if system == "jax":
        from . import gpt_peers
        peer = gpt_peers.JaxPeer(args, docs, tokenizer, gpt_peers.initial(state), steps, batch=batch,
                                 schedule=PORT_STEPS, dtype=dtype)
        peer.run_scan()  # (the first run compiles)

        def window():
            return peer.run_scan()[1] / (steps * batch)
    else:
        net = _port(args, state, params, system, batch, dtype, cache)[0]
        if threads:
            net.set_threads(int(threads))
        X, Y = _inputs_and_targets(docs, tokenizer, args.config.block_size, steps * batch)
        rates = _rates(args, steps)

        def window():
            started = time.perf_counter()
            if batch == 1:
                _as_the_app_trains(net, X, Y, rates)
            else:
                net.train(X, Y, 0.01, batch_size=batch)
            return (time.perf_counter() - started) / (steps * batch)
        window()
    windows.serve({WINDOW: lambda: window() * 1e6})


def _multiply_adds(config, vocab, lengths):
    """A training step's multiply-adds for documents of these lengths: the forward's products
    (q, k, v, the output projection, the MLP, the head) and attention (query-key dots, weighted
    sums) a position, times 3 (the backward's two products for each of the forward's)."""
    c, per_doc = config, 0
    for n in lengths:
        projections = c.n_layer * (4 * c.n_embd * c.n_embd + 2 * 4 * c.n_embd * c.n_embd) + vocab * c.n_embd
        attention = c.n_layer * 2 * c.n_embd * (n * (n + 1) // 2)  # (position t: t + 1 keys, every head's dims)
        per_doc += n * projections + attention
    return 3 * per_doc


def child_batches(compiler, batch, dtype, config):
    """The compiled port on `batch` documents a step (train(batch_size=...), its batched program):
    BATCH_STEPS steps' losses (microgpt's learning rate decaying over PORT_STEPS), then the time a
    document, the median of RUNS passes of train() over BATCH_STEPS batches in one call; for the
    bigger configuration also its build and 1 thread against 2 (alternating)."""
    from gpt import train
    args, docs, tokenizer, state, params = _setup(["--compiler", compiler, "--batch-size", str(batch),
                                                   "--dtype", dtype, *CONFIGS[config]])
    built = {}
    if config == "default":
        net, graph_s, compile_s = _port(args, state, params, compiler, batch, dtype)
    else:  # (issue 36's build targets: from an empty cache, then from the cache it filled)
        with tempfile.TemporaryDirectory() as cache:
            net, graph_s, compile_s = _port(args, state, params, compiler, batch, dtype, cache=cache)
            _, hit_graph_s, hit_compile_s = _port(args, state, params, compiler, batch, dtype, cache=cache)
        built = {"hit_s": hit_graph_s + hit_compile_s, "hit_graph_s": hit_graph_s}
    losses = list(itertools.islice(train.train_compiled(net, docs, tokenizer, args, _NoBar()), BATCH_STEPS))
    X, Y = _inputs_and_targets(docs, tokenizer, args.config.block_size, BATCH_STEPS * batch)
    times, by_threads, busiest = [], {1: [], 2: []}, {1: [], 2: []}
    for _ in range(RUNS):
        clock = _Clock()
        net.train(X, Y, 0.01, batch_size=batch)
        times.append(clock.read())
        if config != "default":
            for threads, runs in by_threads.items():
                before, clock = _threads_cpu(), _Clock()
                net.train(X, Y, 0.01, batch_size=batch, threads=threads)
                runs.append(clock.read())
                after = _threads_cpu()  # (the busiest thread's CPU: what the step takes on free cores)
                busiest[threads].append(max((ns - before.get(tid, 0) for tid, ns in after.items()), default=0))
    result = {**_per_step(times, len(X)), "first_loss": losses[0], "losses": losses,
              "graph_s": graph_s, "compile_s": compile_s, "threads": net.threads(), **built,
              "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "multiply_adds": _multiply_adds(args.config, tokenizer.vocab_size,
                                              [int(np.count_nonzero(y)) for y in Y]) / len(X)}
    if config != "default":
        result.update({f"threads_{t}": _per_step(runs, len(X)) for t, runs in by_threads.items()})
        result["round_ratios"] = [one[0] / two[0] for one, two in zip(by_threads[1], by_threads[2])]
        if all(busiest[2]):
            result["busiest_ratios"] = [one / two for one, two in zip(busiest[1], busiest[2])]
    return result


def child_jax_batches(batch, dtype, config):
    from . import gpt_peers
    args, docs, tokenizer, state, _ = _setup(CONFIGS[config])
    peer = gpt_peers.JaxPeer(args, docs, tokenizer, gpt_peers.initial(state), BATCH_STEPS, batch=batch,
                             schedule=PORT_STEPS, dtype=dtype)  # (the rate decays as the port's over its 1,000 steps)
    losses, first_s, _ = peer.run_scan()  # the first run compiles
    times = [peer.run_scan()[1:] for _ in range(PEER_RUNS)]
    return {"compile_s": first_s - statistics.median(w for w, _ in times), **_per_step(times, BATCH_STEPS * batch),
            "first_loss": float(losses[0]), "losses": losses.tolist()}


def child_torch_batches(batch, dtype, config):
    """The same model in PyTorch (all cores: torch's default threads), `batch` documents a step
    padded to block_size (weights 0 past each document, as JAX's), torch.optim.Adam with the
    port's rate: BATCH_STEPS steps, their losses and the median of PEER_RUNS runs' times."""
    import torch
    from gpt import train
    args, docs, tokenizer, state, _ = _setup(CONFIGS[config])
    c, block = args.config, args.config.block_size
    torch_dtype = getattr(torch, dtype)
    X, Y = _inputs_and_targets(docs, tokenizer, block, BATCH_STEPS * batch)
    tokens, targets = (torch.tensor(X[:, i * block:(i + 1) * block].astype(np.int64)) for i in (0, 1))
    weights = torch.tensor(Y, dtype=torch_dtype)
    mask = torch.full((block, block), float("-inf"), dtype=torch_dtype).triu(1)

    def rmsnorm(x):
        return x * (x.pow(2).mean(-1, keepdim=True) + 1e-5) ** -0.5

    def loss_of(p, idx, tgt, w):
        B = idx.shape[0]
        x = rmsnorm(p["wte"][idx] + p["wpe"])
        for li in range(c.n_layer):
            h = rmsnorm(x)
            q, k, v = ((h @ p[f"layer{li}.attn_{n}"].T).view(B, block, c.n_head, c.head_dim).transpose(1, 2)
                       for n in ("wq", "wk", "wv"))
            att = torch.softmax(q @ k.transpose(-1, -2) / c.head_dim ** 0.5 + mask, dim=-1)
            x = x + (att @ v).transpose(1, 2).reshape(B, block, c.n_embd) @ p[f"layer{li}.attn_wo"].T
            x = x + torch.relu(rmsnorm(x) @ p[f"layer{li}.mlp_fc1"].T) @ p[f"layer{li}.mlp_fc2"].T
        logp = torch.log_softmax(x @ p["lm_head"].T, dim=-1)
        return -(w * logp.gather(-1, tgt[..., None])[..., 0]).sum(-1).mean()

    def run():
        p = {name: torch.tensor([[v.data for v in row] for row in mat], dtype=torch_dtype, requires_grad=True)
             for name, mat in state.items()}
        opt = torch.optim.Adam(p.values(), lr=0.01, betas=train.BETAS, eps=train.EPS)
        losses, clock = [], _Clock()
        for step in range(BATCH_STEPS):
            opt.param_groups[0]["lr"] = args.lr * (1 - step / PORT_STEPS)
            opt.zero_grad()
            picked = slice(step * batch, (step + 1) * batch)
            loss = loss_of(p, tokens[picked], targets[picked], weights[picked])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, clock.read()
    losses, _ = run()  # (warm)
    times = [run()[1] for _ in range(PEER_RUNS)]
    return {**_per_step(times, BATCH_STEPS * batch), "first_loss": losses[0], "losses": losses}


def child_interpreted():
    from gpt import train
    args, docs, tokenizer, state, params = _setup(["--interpret"])
    clock = _Clock()
    losses = list(itertools.islice(train.train_interpreted(state, params, docs, tokenizer, args, _NoBar()), 5))
    return {**_per_step([clock.read()], 5), "first_loss": losses[0], "losses": losses}


def child_c():
    from . import gpt_peers
    with tempfile.TemporaryDirectory() as tmp:
        run_path, _ = gpt_peers.prepare_run(tmp, ["--steps", str(PORT_STEPS)])
        t0 = time.perf_counter()
        exe, command = gpt_peers.build_c(tmp)
        build_s = time.perf_counter() - t0
        runs = [gpt_peers.run_c(exe, run_path, PORT_STEPS) for _ in range(PEER_RUNS)]
    return {"build_s": build_s, **_per_step([(r["train_s"], r["train_cpu_s"]) for r in runs], PORT_STEPS),
            "first_loss": runs[0]["losses"][0], "losses": runs[0]["losses"].tolist(),
            "command": " ".join(command[:2])}


def child_jax(kind):
    # XLA's default threads: its one-thread flags (--xla_cpu_multi_thread_eigen=false
    # intra_op_parallelism_threads=1) made the scanned step slower, in CPU time too (1.7x here)
    from . import gpt_peers
    args, docs, tokenizer, state, _ = _setup()
    peer = gpt_peers.JaxPeer(args, docs, tokenizer, gpt_peers.initial(state), PORT_STEPS)
    run = peer.run_scan if kind == "scan" else peer.run_jit
    losses, first_s, _ = run()  # the first run compiles
    times = [run()[1:] for _ in range(PEER_RUNS)]
    return {"compile_s": first_s - statistics.median(w for w, _ in times), **_per_step(times, PORT_STEPS),
            "first_loss": float(losses[0]), "losses": losses.tolist()}


def child_torch():
    import torch
    from gpt import train
    torch.set_num_threads(1)
    args, docs, tokenizer, state, params = _setup()
    c = args.config
    tensors = {name: torch.tensor([[v.data for v in row] for row in mat], dtype=torch.float64, requires_grad=True)
               for name, mat in state.items()}
    opt = torch.optim.Adam(tensors.values(), lr=0.01, betas=train.BETAS, eps=train.EPS)

    def rmsnorm(x):
        return x * (x.pow(2).mean(-1, keepdim=True) + 1e-5) ** -0.5

    def loss_of(tokens):
        n = min(c.block_size, len(tokens) - 1)
        idx, targets = torch.tensor(tokens[:n]), torch.tensor(tokens[1:n + 1])
        x = rmsnorm(tensors["wte"][idx] + tensors["wpe"][:n])
        mask = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
        for li in range(c.n_layer):
            h = rmsnorm(x)
            q, k, v = (h @ tensors[f"layer{li}.attn_{w}"].T for w in ("wq", "wk", "wv"))
            q, k, v = (t.view(n, c.n_head, c.head_dim).transpose(0, 1) for t in (q, k, v))
            att = torch.softmax(q @ k.transpose(1, 2) / c.head_dim ** 0.5 + mask, dim=-1)
            x = x + (att @ v).transpose(0, 1).reshape(n, c.n_embd) @ tensors[f"layer{li}.attn_wo"].T
            h = torch.relu(rmsnorm(x) @ tensors[f"layer{li}.mlp_fc1"].T)
            x = x + h @ tensors[f"layer{li}.mlp_fc2"].T
        logits = x @ tensors["lm_head"].T
        return torch.nn.functional.cross_entropy(logits, targets)

    encoded = [tokenizer.encode(docs[k % len(docs)]) for k in range(PORT_STEPS)]
    losses = []
    clock = _Clock()
    for step, tokens in enumerate(encoded):  # microgpt's 1,000 steps, its learning rate decaying
        opt.param_groups[0]["lr"] = train.learning_rate(args, step)
        opt.zero_grad()
        loss = loss_of(tokens)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {**_per_step([clock.read()], PORT_STEPS), "first_loss": losses[0], "losses": losses}


class _NoBar:
    def update(self, n):
        pass


def _in_process(*argv):
    run = subprocess.run([sys.executable, "-m", "bench.gpt", *argv], capture_output=True, text=True)
    if run.returncode:
        return {"error": (run.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def _agreement(losses, reference):
    """The largest relative difference of a peer's losses from the port's, over the steps both ran."""
    n = min(len(losses), len(reference))
    return float(np.max(np.abs(np.subtract(losses[:n], reference[:n])) / np.abs(reference[:n]))), n


def run(args):
    quick = getattr(args, "quick", False)
    systems = {f"micrograd-c, {c}": ("compiled", c) for c in (COMPILERS[:1] if quick else COMPILERS)}
    systems["the interpreted port"] = ("interpreted",)
    systems["hand-written C (gcc -O2)"] = ("c",)
    systems["JAX jit, a Python loop"] = ("jax", "jit")
    systems["JAX lax.scan over the steps"] = ("jax", "scan")
    systems["PyTorch (1 thread)"] = ("torch",)
    load_before = os.getloadavg()[0]
    results = {name: _in_process(*argv) for name, argv in systems.items()}
    print(f"load average (1 min): {load_before:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; wall "
          "times grow with the sharing of the cores, CPU times (the process's own) much less\n")
    reference = next((r["losses"] for name, r in results.items() if "micrograd" in name and "losses" in r), None)
    best = min((r["step_us"] for name, r in results.items() if "step_us" in r and "micrograd" not in name),
               default=None)
    print("| system | first loss | loss at step 1,000 | losses vs the port (max rel. diff, steps) | graph s | codegen s "
          "| build s (runtime cached) | runtime build s (once a machine) | compiler peak MB | cache hit s | step us "
          "| step us (CPU) | step / best peer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    status = 0
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | - | - | - | - | - | - | - | - | {r['error']} | - | - |")
            continue
        losses = r.get("losses", [])
        last = f"{losses[PORT_STEPS - 1]:.4f}" if len(losses) >= PORT_STEPS else "-"
        agreement = "-"
        if reference is not None and losses and losses is not reference:
            diff, n = _agreement(losses, reference)
            agreement = f"{diff:.1e} ({n})" + (f" **over {TOLERANCE:g}**" if not diff <= TOLERANCE else "")
            status |= not diff <= TOLERANCE
        elif losses is reference:
            agreement = "the reference"
        ratio = f"{r['step_us'] / best:.3f}x" if best else "-"
        rss = f"{r['peak_rss'] / 1e6:.0f}" if r.get("peak_rss") else "-"
        if "hit_s" in r:
            runtime = "-" if r["runtime_s"] is None else f"{r['runtime_s']:.2f}"  # (tcc's: every build's)
            built = (f"{r['graph_s']:.2f} | {r['codegen_s']:.2f} | {r['build_s']:.2f} | {runtime} | {rss} "
                     f"| {r['hit_s']:.2f}")
        elif "build_s" in r or "compile_s" in r:
            built = f"- | - | {r.get('build_s', r.get('compile_s')):.2f} | - | - | -"
        else:
            built = "- | - | - | - | - | -"
        print(f"| {name} | {r['first_loss']:.4f} | {last} | {agreement} | {built} | {r['step_us']:.1f} "
              f"| {r['cpu_us']:.1f} | {ratio} |")
    _print_ratios(results)
    if not quick:
        _pairs()
    return status | (0 if quick else _batches())


def _windows(systems, cache, rounds=PAIR_ROUNDS, peak_of=None):
    """{system: [us a document of each window]} of child_serve processes kept running, one for
    each (name, child_serve's arguments after the cache), with peak_of ((bandwidth.c, dtype) or
    None) the cores' peak and round trip served around them (bench/peak.py's around), their
    windows taken in turn (bench/windows.py); or a str: why a system did not start."""
    commands = {name: [sys.executable, "-m", "bench.gpt", "serve", argv[0], cache, *argv[1:]]
                for name, argv in systems.items()}
    times = windows.in_turn(peak.around(*peak_of, commands) if peak_of else commands, [WINDOW], rounds)
    return times if isinstance(times, str) else {name: runs[WINDOW] for name, runs in times.items()}


def _window_ratio(times, ours, peer):
    """The median over rounds of ours' window over the peer's window of the same round."""
    return windows.ratio(times[ours], times[peer])


def _pairs():
    """The compiled steps (gcc, clang) and JAX's scanned step in PAIR_ROUNDS windows taken in turn
    (_windows): issue 33's ratio held in the same tenth of a second."""
    compilers = [compiler for compiler in COMPILERS if compiler != "tcc"]
    with tempfile.TemporaryDirectory() as cache:
        times = _windows({**{compiler: (compiler,) for compiler in compilers}, "jax": ("jax",)}, cache)
    if isinstance(times, str):
        print(f"\n(the windows taken in turn: {times})")
        return
    print(f"\n| compiled step / {SCANNED}, {PAIR_ROUNDS} windows of each in turn | ours us (median) "
          "| JAX us (median) | median of the windows' ratios | target |")
    print("|---|---|---|---|---|")
    for compiler in compilers:
        print(f"| {compiler} | {statistics.median(times[compiler]):.1f} | {statistics.median(times['jax']):.1f} "
              f"| {_window_ratio(times, compiler, 'jax'):.3f}x | <= {TARGETS[SCANNED]}x |")


def _batches():
    """Issue 36's rows: microgpt on B documents a step, the compiled batched program (gcc) beside
    JAX's scan of the same batches (vmap over the documents) and PyTorch's (all cores),
    BATCH_STEPS steps each: a document's time, and the runs' losses checked against each other;
    the bigger configuration's too, its share of the multiply-add peak and its threads."""
    print("\n| model | documents a step | dtype | system | losses vs the port (max rel. diff, steps) | us a document "
          "| us a document (CPU) | compiled / faster peer (wall, CPU; JAX's scan in windows taken in turn) | target |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = [("default", batch, dtype) for dtype in BATCH_DTYPES for batch in BATCHES]
    rows += [("big", BIG_BATCH, BIG_DTYPE)]
    status, bigs = 0, []
    with tempfile.TemporaryDirectory() as cache, peak.built() as exe:
        for config, batch, dtype in rows:
            ours = _in_process("batches", "gcc", str(batch), dtype, config)
            peers = {"JAX lax.scan": _in_process("jax-batches", str(batch), dtype, config),
                     "PyTorch (all cores)": _in_process("torch-batches", str(batch), dtype, config)}
            timed = [r for r in peers.values() if "step_us" in r]
            faster = min(timed, key=lambda r: r["step_us"]) if timed else None
            ratio = (f"{ours['step_us'] / faster['step_us']:.3f}x, {ours['cpu_us'] / faster['cpu_us']:.3f}x"
                     if faster and "step_us" in ours else "-")
            if "step_us" in ours and "step_us" in peers["JAX lax.scan"]:
                argv = (str(batch), dtype, config)
                systems, peak_of = {"ours": ("gcc", *argv), "jax": ("jax", *argv)}, None
                if config != "default" and exe is not None:  # (its share of the peak, its threads: the same rounds)
                    systems[ONE_THREAD], peak_of = ("gcc", *argv, "1"), (exe, dtype)
                windows = _windows(systems, cache, BATCH_ROUNDS, peak_of)
                if not isinstance(windows, str):
                    ratio += f"; {_window_ratio(windows, 'ours', 'jax'):.3f}x"
                    ours["in_rounds"] = peak.in_rounds(windows, ours["multiply_adds"], "ours", ONE_THREAD)
            target = "<= 0.5x" if config == "default" else "<= 0.8x"
            for name, r in (("micrograd-c, gcc", ours), *peers.items()):
                agreement = "the reference" if r is ours else "-"
                if r is not ours and "losses" in r and "losses" in ours:
                    bound, steps = BATCH_AGREEMENT[dtype]
                    diff, n = _agreement(r["losses"][:steps], ours["losses"][:steps])
                    agreement = f"{diff:.1e} ({n})" + (f" **over {bound:g}**" if not diff <= bound else "")
                    status |= not diff <= bound
                times = f"{r['step_us']:.1f} | {r['cpu_us']:.1f}" if "error" not in r else f"{r['error']} | -"
                print(f"| {config} | {batch} | {dtype} | {name} | {agreement} | {times} "
                      f"| {ratio if r is ours else ''} | {target if r is ours else ''} |")
            if config != "default" and "error" not in ours:
                bigs.append((config, batch, dtype, ours))
    for config, batch, dtype, ours in bigs:
        _print_big(config, batch, dtype, ours)
    return status


def _print_big(config, batch, dtype, ours):
    """The bigger configuration's build, its share of the multiply-add peak and its threads."""
    tops = peak.rates()
    print(f"\n{config} configuration ({' '.join(CONFIGS[config])}), B = {batch}, {dtype}: from an empty cache, "
          f"graph {ours['graph_s']:.1f} s + compile() {ours['compile_s']:.1f} s (gcc -O2, the runtime too) = "
          f"{ours['graph_s'] + ours['compile_s']:.1f} s (target 20 s); on a hit {ours['hit_s']:.2f} s (the graph "
          f"{ours['hit_graph_s']:.2f} s; target 2 s); peak memory {ours['peak_rss'] / 2**30:.2f} GB (the process, "
          f"training included; target 2.5 GB); {ours['multiply_adds'] / 1e6:.2f} M multiply-adds a document (counted "
          "from the model's shapes)\n")
    print("| threads | us a document | us a document (CPU) | G multiply-adds/s | the cores' peak (bandwidth.c) "
          "| share | target |")
    print("|---|---|---|---|---|---|---|")
    for threads in (1, 2):
        r = ours[f"threads_{threads}"]
        rate = ours["multiply_adds"] / r["step_us"] / 1e3
        top = tops.get((dtype, threads))
        share = f"{rate / top:.0%}" if top else "-"
        print(f"| {threads} | {r['step_us']:.1f} | {r['cpu_us']:.1f} | {rate:.1f} | {top or '-'} | {share} "
              f"| {'>= 50%' if threads == ours['threads'] else ''} |")
    one, two = ours["threads_1"]["step_us"], ours["threads_2"]["step_us"]
    print(f"\n2 threads / 1 thread: {one / two:.2f}x faster (target >= 1.7x); the median of the rounds' ratios "
          f"{statistics.median(ours['round_ratios']):.2f}x")
    if "busiest_ratios" in ours:  # (a wall ratio needs both cores free: another busy process leaves one)
        print(f"each thread's work: the busiest thread's CPU, 1 thread / 2 threads, "
              f"{statistics.median(ours['busiest_ratios']):.2f}x (median of the rounds; the wall's ratio on two free "
              "cores)")
    found = ours.get("in_rounds")
    if found:  # (bench/peak.py: the peak served in windows taken in turn with ours and JAX's)
        print(f"\nIn the {BATCH_ROUNDS} windows taken in turn with JAX's (and the cores' peak served, bench/peak.py; "
              f"medians over the rounds of each round's figures): {found['rate']:.1f} G multiply-adds/s against the "
              f"round's peak of {found['peak']:.1f} on {peak.cores()} cores: **{found['share']:.0%}** (target >= 50%)")
        if "gain" in found:
            print(f"threads' gain in those rounds {found['gain']:.2f}x (target >= 1.7x) where the machine's own (its "
                  f"peak on {peak.cores()} cores over one thread's) was {found['machine_gain']:.2f}x: ours "
                  f"**{found['of_machine']:.0%}** of the machine's"
                  + (f"; a cache line's round trip between two threads {found['trip']:.0f} ns (the largest of the "
                     f"rounds {found['trip_max']:.0f}; our threads' gain {found['gain_near']:.2f}x in the "
                     f"{found['rounds_near']} rounds within 2x of the fastest round trip)" if "trip" in found else ""))


def _print_ratios(results):
    """Issue 33's ratios: each compiled step over JAX's scanned step and over the hand-written C's."""
    peers = {"JAX's scanned step": results["JAX lax.scan over the steps"],
             "the hand-written C's step": results["hand-written C (gcc -O2)"]}
    print("\n| compiled step / peer step | measured (wall) | measured (CPU) | target |")
    print("|---|---|---|---|")
    for name, r in results.items():
        if "micrograd" not in name or "step_us" not in r:
            continue
        for peer, p in peers.items():
            measured = (f"{r['step_us'] / p['step_us']:.3f}x | {r['cpu_us'] / p['cpu_us']:.3f}x" if "step_us" in p
                        else f"{p['error']} | -")
            print(f"| {name.split(', ')[1]} / {peer} | {measured} | <= {TARGETS[peer]}x |")
        scan, peer = peers["JAX's scanned step"], "JAX's scanned step"
        if "step_us" in scan:
            print(f"| {name.split(', ')[1]}, a train() call a document / {peer} "
                  f"| {r['document_call_us'] / scan['step_us']:.3f}x "
                  f"| {r['document_call_cpu_us'] / scan['cpu_us']:.3f}x | (microgpt's loop as written) |")


def main(argv):
    kind = argv[0]
    if kind == "serve":
        child_serve(*argv[1:])
        return
    result = {"compiled": lambda: child_compiled(argv[1]), "interpreted": child_interpreted,
              "c": child_c, "jax": lambda: child_jax(argv[1]), "torch": child_torch,
              "batches": lambda: child_batches(argv[1], int(argv[2]), argv[3], argv[4]),
              "jax-batches": lambda: child_jax_batches(int(argv[1]), argv[2], argv[3]),
              "torch-batches": lambda: child_torch_batches(int(argv[1]), argv[2], argv[3])}[kind]()
    print(json.dumps(result))


if __name__ == "__main__":
    random.seed(0)
    main(sys.argv[1:])
