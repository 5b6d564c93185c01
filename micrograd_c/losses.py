"""Losses over lists of Values, built from the engine's ops (so they compile like any graph)."""

from .engine import Value


def _as_value(x):
    return x if isinstance(x, Value) else Value(x)


def log_softmax(logits):
    """log(softmax(logits)), shifted by the max logit so that exp never overflows."""
    logits = [_as_value(z) for z in logits]
    top = logits[0]
    for z in logits[1:]:
        top = top.max(z)
    shifted = [z - top for z in logits]
    log_sum = sum((z.exp() for z in shifted[1:]), shifted[0].exp()).log()
    return [z - log_sum for z in shifted]


def cross_entropy(logits, target):
    """Softmax cross-entropy. `target` is a class index (int), or one weight per logit
    (a one-hot list of numbers or Values, e.g. compiled inputs)."""
    log_probs = log_softmax(logits)
    if isinstance(target, int):
        if not 0 <= target < len(log_probs):
            raise ValueError(f"target class {target} out of range for {len(log_probs)} logits")
        return -log_probs[target]
    if len(target) != len(log_probs):
        raise ValueError(f"target has {len(target)} weights for {len(log_probs)} logits")
    return -sum((t * lp for t, lp in zip(target[1:], log_probs[1:])), target[0] * log_probs[0])


def mse(predictions, targets):
    """Mean squared error."""
    if len(predictions) != len(targets):
        raise ValueError(f"{len(predictions)} predictions for {len(targets)} targets")
    return sum((p - t) ** 2 for p, t in zip(predictions, targets)) * (1.0 / len(predictions))
