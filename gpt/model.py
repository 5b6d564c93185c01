"""microgpt's model, written as microgpt writes it (lists of scalar Values), with micrograd_c's
Value: token and position embeddings, RMSNorm, multi-head causal attention over a KV cache, a ReLU
MLP, a language-model head. What differs from microgpt.py, and why (docs/gpt.md has the lines):

- the matrices are `Table`s, so that `wte[token]` with `token` an input Value is an embedding
  lookup read at run time (a gather), not a row baked in at build time;
- softmax takes its max with `Value.max` in the graph instead of `max(v.data ...)`, which compiled
  would be a constant frozen from one document (the same bits: a max is exact);
- the target's probability is `gather(probs, target)` instead of `probs[target_id]`;
- `linear`'s sums are `dot(wo, x)` (engine.Dot: the chain `sum(wi * xi ...)` builds, the same
  values, holding its operands instead of two Values a weight, made only if backward() reads them);
- one graph covers every document length up to block_size (`document`): the loss weighs
  position t by an input, 1/n for the document's n positions and 0 past its end. Causality makes
  the first n positions exactly the document's own, a weight of 0 sends no gradient back from
  the others, and the compiled training pass stops at the document's end
  (codegen/lower/positions.py).
"""

import functools
import random
from dataclasses import dataclass

from micrograd_c import Table, Value, dot, gather


@dataclass(frozen=True)
class Config:
    """microgpt's hyperparameters (its defaults)."""
    n_embd: int = 16
    n_head: int = 4
    n_layer: int = 1
    block_size: int = 16
    std: float = 0.08

    def __post_init__(self):
        for name in ("n_embd", "n_head", "n_layer", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")

    @property
    def head_dim(self):
        return self.n_embd // self.n_head


def init_state(config, vocab_size):
    """The parameters as microgpt makes them: random.gauss(0, std) in its order (wte, wpe,
    lm_head, then per layer attn_wq, attn_wk, attn_wv, attn_wo, mlp_fc1, mlp_fc2), each matrix a
    Table of rows. Returns (state_dict, the flat list of params in that order)."""
    def matrix(nout, nin):
        return Table([[Value(random.gauss(0, config.std)) for _ in range(nin)] for _ in range(nout)])
    n = config.n_embd
    state = {"wte": matrix(vocab_size, n), "wpe": matrix(config.block_size, n), "lm_head": matrix(vocab_size, n)}
    for i in range(config.n_layer):
        for name, shape in (("attn_wq", (n, n)), ("attn_wk", (n, n)), ("attn_wv", (n, n)), ("attn_wo", (n, n)),
                            ("mlp_fc1", (4 * n, n)), ("mlp_fc2", (n, 4 * n))):
            state[f"layer{i}.{name}"] = matrix(*shape)
    params = [p for mat in state.values() for row in mat for p in row]
    return state, params


def linear(x, w):
    return [dot(wo, x) for wo in w]  # microgpt: sum(wi * xi for wi, xi in zip(wo, x)), recorded compactly


def softmax(logits):
    top = functools.reduce(Value.max, logits)  # microgpt: max(val.data for val in logits)
    exps = [(val - top).exp() for val in logits]
    total = sum(exps)
    return [e / total for e in exps]


def rmsnorm(x):
    ms = sum(xi * xi for xi in x) / len(x)
    scale = (ms + 1e-5) ** -0.5
    return [xi * scale for xi in x]


def gpt(state, config, token, pos_id, keys, values):
    """The logits of the next token after `token` (a Value, or an int) at position pos_id, given
    the keys and values of the positions before it (appended to, as microgpt's KV cache)."""
    x = [t + p for t, p in zip(state["wte"][token], state["wpe"][pos_id])]
    x = rmsnorm(x)
    hd = config.head_dim
    for li in range(config.n_layer):
        x_residual = x
        x = rmsnorm(x)
        q = linear(x, state[f"layer{li}.attn_wq"])
        k = linear(x, state[f"layer{li}.attn_wk"])
        v = linear(x, state[f"layer{li}.attn_wv"])
        keys[li].append(k)
        values[li].append(v)
        x_attn = []
        for h in range(config.n_head):
            hs = h * hd
            q_h = q[hs:hs + hd]
            k_h = [ki[hs:hs + hd] for ki in keys[li]]
            v_h = [vi[hs:hs + hd] for vi in values[li]]
            attn_logits = [sum(q_h[j] * k_h[t][j] for j in range(hd)) / hd ** 0.5 for t in range(len(k_h))]
            attn_weights = softmax(attn_logits)
            head_out = [sum(attn_weights[t] * v_h[t][j] for t in range(len(v_h))) for j in range(hd)]
            x_attn.extend(head_out)
        x = linear(x_attn, state[f"layer{li}.attn_wo"])
        x = [a + b for a, b in zip(x, x_residual)]
        x_residual = x
        x = rmsnorm(x)
        x = linear(x, state[f"layer{li}.mlp_fc1"])
        x = [xi.relu() for xi in x]
        x = linear(x, state[f"layer{li}.mlp_fc2"])
        x = [a + b for a, b in zip(x, x_residual)]
    return linear(x, state["lm_head"])


@dataclass
class Document:
    """One graph for every document up to block_size positions. Inputs, in this order (a
    module's set_input row, see data.row): tokens[t], targets[t], weights[t] for t < block_size.
    loss = sum(weights[t] * -log p(targets[t])); logits[t]: the logits at position t (outputs)."""
    loss: Value
    logits: list
    tokens: list
    targets: list
    weights: list

    @property
    def inputs(self):
        return self.tokens + self.targets + self.weights

    @property
    def outputs(self):
        return [v for position in self.logits for v in position]


def document(state, config):
    """The Document graph (see Document), with placeholder inputs (token 0, weight 0)."""
    tokens = [Value(0) for _ in range(config.block_size)]
    targets = [Value(0) for _ in range(config.block_size)]
    weights = [Value(0.0) for _ in range(config.block_size)]
    keys, values = [[] for _ in range(config.n_layer)], [[] for _ in range(config.n_layer)]
    logits, losses = [], []
    for pos_id in range(config.block_size):
        logits.append(gpt(state, config, tokens[pos_id], pos_id, keys, values))
        probs = softmax(logits[-1])
        losses.append(-gather(probs, targets[pos_id]).log())  # microgpt: -probs[target_id].log()
    loss = sum(w * loss_t for w, loss_t in zip(weights, losses))  # microgpt: (1 / n) * sum(losses)
    return Document(loss, logits, tokens, targets, weights)


def interpreted_loss(state, config, tokens):
    """microgpt's own loss of one document (tokens: BOS, its characters' ids, BOS), by its graph
    of n positions: the interpreter's reference for the compiled Document."""
    n = min(config.block_size, len(tokens) - 1)
    keys, values = [[] for _ in range(config.n_layer)], [[] for _ in range(config.n_layer)]
    losses = []
    for pos_id in range(n):
        logits = gpt(state, config, tokens[pos_id], pos_id, keys, values)
        probs = softmax(logits)
        losses.append(-probs[tokens[pos_id + 1]].log())
    return (1 / n) * sum(losses)
