"""Read, download and check the MNIST data set (IDX files, gzipped or raw)."""
from __future__ import annotations

import gzip
import hashlib
import http.client
import math
import os
import pathlib
import urllib.request
import zlib

import numpy as np

from codegen.backend.toolchain import write_atomically


class DataError(ValueError):
    """A data file is missing, corrupt or inconsistent; the message names the file."""


# The canonical gzipped files and their SHA256, in the order load_mnist returns them.
FILES = {
    'train-images-idx3-ubyte.gz': '440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609',
    'train-labels-idx1-ubyte.gz': '3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c',
    't10k-images-idx3-ubyte.gz': '8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6',
    't10k-labels-idx1-ubyte.gz': 'f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6',
}
TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS = FILES

MIRRORS = [
    'https://ossci-datasets.s3.amazonaws.com/mnist/',
    'https://storage.googleapis.com/cvdf-datasets/mnist/',
    'http://yann.lecun.com/exdb/mnist/',
]

IMAGE_SIDE = 28
NUM_CLASSES = 10

# IDX type code (third magic byte) -> dtype; IDX stores multi-byte values big-endian.
IDX_DTYPES = {
    0x08: np.dtype('>u1'),
    0x09: np.dtype('>i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}
GZIP_MAGIC = b'\x1f\x8b'
FETCH_TIMEOUT_SECONDS = 60
# What a failing mirror can raise: URLError/HTTPError/timeouts are OSErrors,
# a malformed URL is a ValueError, a dropped connection an HTTPException.
FETCH_ERRORS = (OSError, ValueError, http.client.HTTPException)


def read_idx(path) -> np.ndarray:
    """The array stored in an IDX file (gzipped or raw), as a read-only view."""
    path = pathlib.Path(path)
    data = _read_maybe_gzipped(path)
    if len(data) < 4 or data[:2] != b'\0\0':
        raise DataError(f'{path}: not an IDX file: bad magic number {data[:4].hex() or "(empty)"}')
    type_code, ndim = data[2], data[3]
    if type_code not in IDX_DTYPES:
        raise DataError(f'{path}: unsupported IDX type code 0x{type_code:02x}')
    if ndim == 0:
        raise DataError(f'{path}: IDX header declares 0 dimensions')
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DataError(f'{path}: truncated header: expected {header_size} bytes, found {len(data)}')
    shape = tuple(int(size) for size in np.frombuffer(data, '>u4', ndim, offset=4))
    dtype = IDX_DTYPES[type_code]
    expected = math.prod(shape) * dtype.itemsize
    found = len(data) - header_size
    if found < expected:
        raise DataError(f'{path}: truncated: expected {expected} bytes of data, found {found}')
    if found > expected:
        raise DataError(f'{path}: {found - expected} unexpected trailing bytes after {expected} bytes of data')
    return np.frombuffer(data, dtype, offset=header_size).reshape(shape)


def _read_maybe_gzipped(path: pathlib.Path) -> bytes:
    """The file's bytes, decompressed if they start with the gzip magic (names may lie)."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DataError(f'{path}: cannot read: {error}') from error
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise DataError(f'{path}: corrupt gzip data: {error}') from error


def default_data_dir() -> pathlib.Path:
    """$MNIST_DIR if set, else micrograd_c/mnist in the user's cache directory."""
    if os.environ.get('MNIST_DIR'):
        return pathlib.Path(os.environ['MNIST_DIR']).expanduser()
    cache = os.environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache'
    return pathlib.Path(cache) / 'micrograd_c' / 'mnist'


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fetch_url(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_SECONDS) as response:
        return response.read()


def download(data_dir, mirrors=MIRRORS, fetch=None, quiet=False) -> pathlib.Path:
    """Fetch each file that is missing or has a bad checksum, trying the mirrors in order."""
    data_dir = pathlib.Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    fetch = fetch or _fetch_url
    for name, expected_sha in FILES.items():
        target = data_dir / name
        if target.is_file() and _sha256(target) == expected_sha:
            _report(quiet, f'{name}: already present')
            continue
        errors = []
        for mirror in mirrors:
            url = mirror + name
            try:
                payload = fetch(url)
            except FETCH_ERRORS as error:
                errors.append(f'{url}: {error}')
                continue
            found_sha = hashlib.sha256(payload).hexdigest()
            if found_sha != expected_sha:
                errors.append(f'{url}: SHA256 mismatch: expected {expected_sha}, found {found_sha}')
                continue
            write_atomically(target, payload)  # an interrupted write never leaves a partial target
            _report(quiet, f'{name}: downloaded from {mirror}')
            break
        else:
            raise DataError(f'{target}: could not download from any mirror:\n  ' + '\n  '.join(errors))
    return data_dir


def _report(quiet: bool, message: str) -> None:
    if not quiet:
        print(message)


def verify(data_dir) -> None:
    """Check the SHA256 of the four canonical gzipped files in data_dir."""
    data_dir = pathlib.Path(data_dir)
    for name, expected_sha in FILES.items():
        path = data_dir / name
        if not path.is_file():
            raise DataError(f'{path}: missing')
        found_sha = _sha256(path)
        if found_sha != expected_sha:
            raise DataError(f'{path}: SHA256 mismatch: expected {expected_sha}, found {found_sha}')


def load_mnist(data_dir=None, download_missing=True):
    """(train_images, train_labels, test_images, test_labels), images flattened to (n, 784) uint8.

    Checksums are only enforced on download: existing files may legitimately be
    decompressed or re-compressed copies.
    """
    data_dir = default_data_dir() if data_dir is None else pathlib.Path(data_dir)
    if download_missing and _missing_files(data_dir):
        download(data_dir)
    missing = _missing_files(data_dir)
    if missing:
        raise DataError(
            f'{data_dir}: MNIST files not found: {", ".join(missing)} (with or without .gz). '
            'Point MNIST_DIR or --data-dir at a directory holding them, or allow downloading.')
    return (*_load_split(data_dir, TRAIN_IMAGES, TRAIN_LABELS),
            *_load_split(data_dir, TEST_IMAGES, TEST_LABELS))


def _find(data_dir: pathlib.Path, name: str) -> pathlib.Path | None:
    """The file as downloaded (.gz) or decompressed (same name without .gz), if present."""
    for path in (data_dir / name, data_dir / name.removesuffix('.gz')):
        if path.is_file():
            return path
    return None


def _missing_files(data_dir: pathlib.Path) -> list[str]:
    return [name for name in FILES if _find(data_dir, name) is None]


def _load_split(data_dir: pathlib.Path, images_name: str, labels_name: str):
    """Read one images/labels pair, check they fit together, flatten the images."""
    images_path, labels_path = _find(data_dir, images_name), _find(data_dir, labels_name)
    images, labels = read_idx(images_path), read_idx(labels_path)
    for path, array in ((images_path, images), (labels_path, labels)):
        if array.dtype != np.uint8:
            raise DataError(f'{path}: expected unsigned bytes (IDX type 0x08), found {array.dtype}')
    if images.ndim != 3 or images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise DataError(f'{images_path}: expected images of shape (n, {IMAGE_SIDE}, {IMAGE_SIDE}), '
                        f'found {images.shape}')
    if labels.ndim != 1:
        raise DataError(f'{labels_path}: expected 1-D labels, found shape {labels.shape}')
    if len(images) != len(labels):
        raise DataError(f'{images_path} holds {len(images)} images but '
                        f'{labels_path} holds {len(labels)} labels')
    if labels.size and labels.max() >= NUM_CLASSES:
        raise DataError(f'{labels_path}: label {labels.max()} out of range 0..{NUM_CLASSES - 1}')
    return images.reshape(len(images), IMAGE_SIDE * IMAGE_SIDE), labels
