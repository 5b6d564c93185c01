"""microgpt (gpt/) in `make bench`: the compiled step on each compiler beside the interpreted
port and PyTorch, each system in its own process, microgpt's default configuration on the
census first names, one document a step (float64).

For each compiler: codegen (the graph read, lowered, C written), the build on an empty cache
and its peak compiler memory, a cache hit, and the step: the median of 5 runs of 200 steps
(train() on one document, Adam inside). The interpreted port: microgpt's own loop, 5 steps.
PyTorch (when installed, `make torch`): the same model as tensors, one document a step,
torch.optim.Adam, 200 steps, 5 runs.

    python -m bench --only gpt [--quick]
"""

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

COMPILERS = ("tcc", "gcc", "clang")
STEPS, RUNS = 200, 5


def _setup(config_args=()):
    from gpt import train
    args = train.parse_args(list(config_args))
    docs, tokenizer, state, params = train.setup(args)
    return args, docs, tokenizer, state, params


def child_compiled(compiler):
    import codegen
    from gpt import data, model, train
    args, docs, tokenizer, state, params = _setup(["--compiler", compiler])
    with tempfile.TemporaryDirectory() as cache:
        os.environ["MICROGRAD_C_CACHE"] = cache
        t0 = time.perf_counter()
        doc = model.document(state, args.config)
        options = dict(inputs=doc.inputs, params=params, outputs=doc.outputs, batch=1,
                       optimizer=codegen.Adam(betas=train.BETAS, eps=train.EPS))
        sources = codegen.generate(doc.loss, **options)
        t1 = time.perf_counter()
        net = codegen.compile(doc.loss, **options, compiler=compiler, sources=sources, measure_memory=True)
        t2 = time.perf_counter()
        codegen.compile(doc.loss, **options, compiler=compiler)
        t3 = time.perf_counter()
    rows = np.stack([data.row(tokenizer.encode(d), args.config.block_size) for d in docs[:STEPS]])
    block = args.config.block_size
    X, Y = np.ascontiguousarray(rows[:, :2 * block]), np.ascontiguousarray(rows[:, 2 * block:])
    times, first = [], None
    for _ in range(RUNS):
        start = time.perf_counter()
        for i in range(STEPS):
            loss = net.train(X[i:i + 1], Y[i:i + 1], 0.01)
            first = loss if first is None else first
        times.append((time.perf_counter() - start) / STEPS)
    return {"codegen_s": t1 - t0, "build_s": t2 - t1, "hit_s": t3 - t2, "step_us": statistics.median(times) * 1e6,
            "peak_rss": net.build.peak_rss, "first_loss": first}


def child_interpreted():
    from gpt import train
    args, docs, tokenizer, state, params = _setup(["--steps", "5", "--interpret"])
    start = time.perf_counter()
    losses = list(train.train_interpreted(state, params, docs, tokenizer, args, _NoBar()))
    return {"step_us": (time.perf_counter() - start) / 5 * 1e6, "first_loss": losses[0]}


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

    encoded = [tokenizer.encode(d) for d in docs[:STEPS]]
    times, first = [], None
    for _ in range(RUNS):
        start = time.perf_counter()
        for tokens in encoded:
            opt.zero_grad()
            loss = loss_of(tokens)
            loss.backward()
            opt.step()
            first = loss.item() if first is None else first
        times.append((time.perf_counter() - start) / STEPS)
    return {"step_us": statistics.median(times) * 1e6, "first_loss": first}


class _NoBar:
    def update(self, n):
        pass


def _in_process(*argv):
    run = subprocess.run([sys.executable, "-m", "bench.gpt", *argv], capture_output=True, text=True)
    if run.returncode:
        return {"error": (run.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(run.stdout.strip().splitlines()[-1])


def run(args):
    quick = getattr(args, "quick", False)
    systems = {f"micrograd-c, {c}": ("compiled", c) for c in (COMPILERS[:1] if quick else COMPILERS)}
    systems["the interpreted port"] = ("interpreted",)
    systems["PyTorch (1 thread)"] = ("torch",)
    results = {name: _in_process(*argv) for name, argv in systems.items()}
    best = min((r["step_us"] for name, r in results.items() if "step_us" in r and "micrograd" not in name),
               default=None)
    print("| system | first loss | codegen s | build s (empty cache) | compiler peak MB | cache hit s | step us "
          "| step / best peer |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | - | - | - | - | - | {r['error']} | - |")
            continue
        ratio = f"{r['step_us'] / best:.3f}x" if best else "-"
        rss = f"{r['peak_rss'] / 1e6:.0f}" if r.get("peak_rss") else "-"
        built = (f"{r['codegen_s']:.2f} | {r['build_s']:.2f} | {rss} | {r['hit_s']:.2f}" if "build_s" in r
                 else "- | - | - | -")
        print(f"| {name} | {r['first_loss']:.4f} | {built} | {r['step_us']:.1f} | {ratio} |")
    return 0


def main(argv):
    kind = argv[0]
    result = {"compiled": lambda: child_compiled(argv[1]), "interpreted": child_interpreted,
              "torch": child_torch}[kind]()
    print(json.dumps(result))


if __name__ == "__main__":
    random.seed(0)
    main(sys.argv[1:])
