"""Documents (one per line of a text file, e.g. names), microgpt's character tokenizer, and the
rows that set a Document graph's inputs (model.Document) for one document."""

import os
import pathlib

import numpy as np

# Offline, the app trains on these (../shared/names/ beside the checkout): US census first names.
SHARED_NAMES = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "names" / "first.txt"


class DataError(ValueError):
    """A data file that cannot be used: missing, empty, or not text."""


def default_path():
    """$GPT_DATA, else the census first names in ../shared/names/."""
    env = os.environ.get("GPT_DATA")
    if env:
        return pathlib.Path(env)
    if SHARED_NAMES.exists():
        return SHARED_NAMES
    raise DataError(f"no data file: pass --data FILE (one document per line), set GPT_DATA, "
                    f"or put the names in {SHARED_NAMES}")


def load_docs(path):
    """The file's non-empty lines, stripped, as microgpt reads input.txt."""
    path = pathlib.Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error})") from None
    docs = [line.strip() for line in text.splitlines() if line.strip()]
    if not docs:
        raise DataError(f"{path}: no documents (no non-empty line)")
    return docs


class Tokenizer:
    """microgpt's: the sorted unique characters are tokens 0..n-1, BOS is n."""

    def __init__(self, docs):
        self.chars = sorted(set("".join(docs)))
        self.bos = len(self.chars)
        self._ids = {c: i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self):
        return len(self.chars) + 1

    def encode(self, doc):
        """BOS, the characters' ids, BOS."""
        return [self.bos] + [self._ids[c] for c in doc] + [self.bos]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


def row(tokens, block_size, dtype=np.float64):
    """The Document graph's inputs for one encoded document: tokens[t] and targets[t] = tokens[t + 1]
    for its n = min(block_size, len(tokens) - 1) positions, weight 1/n there; past n, token and
    target BOS (any valid token: their weight is 0) and weight 0."""
    n = min(block_size, len(tokens) - 1)
    bos = tokens[0]
    out = np.full(3 * block_size, bos, dtype=dtype)
    out[:n] = tokens[:n]
    out[block_size:block_size + n] = tokens[1:n + 1]
    out[2 * block_size:] = 0
    out[2 * block_size:2 * block_size + n] = 1 / n
    return out
