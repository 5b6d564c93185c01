"""Documents (one per line of a text file, e.g. names, or windows cut from one long text), microgpt's
character tokenizer, a held-out split, and the rows that set a Document graph's inputs
(model.Document) for one document."""

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


def _read(path):
    path = pathlib.Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: a directory, not a text file") from None
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error})") from None


def load_docs(path):
    """The file's non-empty lines, stripped, as microgpt reads input.txt."""
    docs = [line.strip() for line in _read(path).splitlines() if line.strip()]
    if not docs:
        raise DataError(f"{path}: no documents (no non-empty line)")
    return docs


def load_windows(path, block_size):
    """One long text (Shakespeare-like corpora) cut into windows of block_size + 1 characters,
    newlines included, each starting where the last one's targets end (window k covers
    characters k*block_size .. (k+1)*block_size), so that every character but the first is a
    target once. A window's positions predict its next characters (Tokenizer(framed=False))."""
    text = _read(path)
    windows = [text[start:start + block_size + 1] for start in range(0, len(text) - 1, block_size)]
    if not windows:
        raise DataError(f"{path}: no windows (the text needs at least 2 characters)")
    return windows


def split(docs, held_out):
    """(training documents, held-out documents): the last round(held_out * len(docs)) of them
    held out (after microgpt's shuffle; with 0, microgpt's run is unchanged)."""
    if not 0 <= held_out < 1:
        raise DataError(f"the held-out fraction must be in [0, 1), not {held_out}")
    count = round(held_out * len(docs))
    if held_out and not 0 < count < len(docs):
        raise DataError(f"a held-out fraction of {held_out} leaves {len(docs) - count} of {len(docs)} "
                        f"documents to train on and {count} held out: both need at least one")
    return docs[:len(docs) - count], docs[len(docs) - count:]


class Tokenizer:
    """microgpt's: the sorted unique characters are tokens 0..n-1, BOS is n. `framed`: documents
    are framed by BOS (microgpt's names); False for windows of a long text, which are their
    characters only (and samples then start from a newline, else from the smallest character)."""

    def __init__(self, docs, framed=True):
        self.chars = sorted(set("".join(docs)))
        self.bos = len(self.chars)
        self.framed = framed
        self._ids = {c: i for i, c in enumerate(self.chars)}
        self.start = self.bos if framed else self._ids.get("\n", 0)

    @property
    def vocab_size(self):
        return len(self.chars) + 1

    def encode(self, doc):
        """BOS, the characters' ids, BOS (framed; else the characters' ids)."""
        ids = [self._ids[c] for c in doc]
        return [self.bos] + ids + [self.bos] if self.framed else ids

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
