"""Tests for mnist.data: IDX parsing, loading checks, downloading (no network), the real files."""
import gzip
import hashlib
import os
import pathlib
import struct
import urllib.error

import numpy as np
import pytest

from mnist import data
from mnist.data import DataError, download, load_mnist, read_idx, verify

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TYPE_CODES = {dtype: code for code, dtype in data.IDX_DTYPES.items()}


def idx_bytes(array, type_code=None) -> bytes:
    """Encode an array as an IDX file; type_code defaults to the one matching its dtype."""
    dtype = np.dtype(array.dtype).newbyteorder('>')
    code = TYPE_CODES[dtype] if type_code is None else type_code
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f'>{array.ndim}I', *array.shape)
    return header + array.astype(dtype).tobytes()


def write(path, payload: bytes, compress=False) -> pathlib.Path:
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def fake_split(n, seed):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, n, dtype=np.uint8)
    return images, labels


def fake_payloads():
    """Small but valid gzipped contents for the four MNIST files, keyed by name."""
    train_images, train_labels = fake_split(5, seed=0)
    test_images, test_labels = fake_split(3, seed=1)
    arrays = [train_images, train_labels, test_images, test_labels]
    return {name: gzip.compress(idx_bytes(array)) for name, array in zip(data.FILES, arrays)}


def write_dataset(directory, payloads):
    for name, payload in payloads.items():
        (directory / name).write_bytes(payload)


# --- read_idx ---------------------------------------------------------------

@pytest.mark.parametrize('dtype', [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize('compress', [False, True])
def test_read_idx_round_trips_every_type(tmp_path, dtype, compress):
    array = (np.arange(24) - 5).reshape(2, 3, 4).astype(dtype)
    result = read_idx(write(tmp_path / 'a.idx', idx_bytes(array), compress))
    assert result.shape == (2, 3, 4)
    assert result.dtype == np.dtype(dtype).newbyteorder('>')  # IDX stores big-endian
    np.testing.assert_array_equal(result, array)


def test_read_idx_detects_gzip_by_content_not_name(tmp_path):
    array = np.arange(6, dtype=np.uint8)
    gzipped_without_suffix = write(tmp_path / 'labels', idx_bytes(array), compress=True)
    raw_with_gz_suffix = write(tmp_path / 'labels.gz', idx_bytes(array))
    np.testing.assert_array_equal(read_idx(gzipped_without_suffix), array)
    np.testing.assert_array_equal(read_idx(raw_with_gz_suffix), array)


def test_read_idx_truncated_data(tmp_path):
    payload = idx_bytes(np.zeros((2, 3), np.int16))  # 12 bytes of data
    path = write(tmp_path / 'short.idx', payload[:-5])
    with pytest.raises(DataError, match='truncated: expected 12 bytes of data, found 7') as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_truncated_header(tmp_path):
    path = write(tmp_path / 'short.idx', idx_bytes(np.zeros((2, 3), np.uint8))[:9])
    with pytest.raises(DataError, match='truncated header'):
        read_idx(path)


def test_read_idx_trailing_bytes(tmp_path):
    path = write(tmp_path / 'long.idx', idx_bytes(np.zeros(4, np.uint8)) + b'xyz')
    with pytest.raises(DataError, match='3 unexpected trailing bytes'):
        read_idx(path)


@pytest.mark.parametrize('payload', [b'', b'\x00', b'\x01\x00\x08\x01', b'PK\x03\x04rest'])
def test_read_idx_wrong_magic(tmp_path, payload):
    path = write(tmp_path / 'bad.idx', payload)
    with pytest.raises(DataError, match='not an IDX file') as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_read_idx_unsupported_type_code(tmp_path):
    path = write(tmp_path / 'bad.idx', idx_bytes(np.zeros(4, np.uint8), type_code=0x0A))
    with pytest.raises(DataError, match='unsupported IDX type code 0x0a'):
        read_idx(path)


def test_read_idx_zero_dimensions(tmp_path):
    path = write(tmp_path / 'bad.idx', b'\x00\x00\x08\x00\x07')
    with pytest.raises(DataError, match='0 dimensions'):
        read_idx(path)


def corrupt_middle(gzipped: bytes) -> bytes:
    middle = len(gzipped) // 2
    return gzipped[:middle] + bytes(b ^ 0xFF for b in gzipped[middle:middle + 8]) + gzipped[middle + 8:]


@pytest.mark.parametrize('damage', [
    lambda gz: gz[:len(gz) // 2],   # cut short: EOFError
    corrupt_middle,                 # flipped bits: zlib.error or CRC mismatch
    lambda gz: gz[:3] + b'\xff' + gz[4:],  # reserved flag bits: BadGzipFile
], ids=['cut-short', 'flipped-bits', 'bad-header'])
def test_read_idx_corrupt_gzip(tmp_path, damage):
    gzipped = gzip.compress(idx_bytes(np.arange(1000, dtype=np.int32)))
    path = write(tmp_path / 'bad.gz', damage(gzipped))
    with pytest.raises(DataError, match='corrupt gzip') as info:
        read_idx(path)
    assert str(path) in str(info.value)


# --- load_mnist -------------------------------------------------------------

def test_load_mnist_gz_and_raw_files(tmp_path):
    payloads = fake_payloads()
    write_dataset(tmp_path, payloads)
    # One file decompressed under the name without .gz: both forms are accepted.
    raw_name = data.TEST_LABELS.removesuffix('.gz')
    (tmp_path / raw_name).write_bytes(gzip.decompress(payloads[data.TEST_LABELS]))
    (tmp_path / data.TEST_LABELS).unlink()

    train_images, train_labels, test_images, test_labels = load_mnist(tmp_path, download_missing=False)
    expected_images, expected_labels = fake_split(3, seed=1)
    assert train_images.shape == (5, 784) and train_labels.shape == (5,)
    assert test_images.dtype == np.uint8 and test_labels.dtype == np.uint8
    np.testing.assert_array_equal(test_images, expected_images.reshape(3, 784))
    np.testing.assert_array_equal(test_labels, expected_labels)


def replace_file(directory, name, array):
    (directory / name).write_bytes(gzip.compress(idx_bytes(array)))


def test_load_mnist_count_mismatch_names_both_files(tmp_path):
    write_dataset(tmp_path, fake_payloads())
    replace_file(tmp_path, data.TRAIN_LABELS, np.zeros(4, np.uint8))
    with pytest.raises(DataError, match='5 images but .* 4 labels') as info:
        load_mnist(tmp_path, download_missing=False)
    assert data.TRAIN_IMAGES in str(info.value) and data.TRAIN_LABELS in str(info.value)


@pytest.mark.parametrize('name, array, message', [
    (data.TEST_LABELS, np.array([0, 10, 3], np.uint8), 'label 10 out of range'),
    (data.TEST_LABELS, np.zeros((3, 1), np.uint8), 'expected 1-D labels'),
    (data.TEST_LABELS, np.zeros(3, np.int32), 'expected unsigned bytes'),
    (data.TEST_IMAGES, np.zeros((3, 28, 27), np.uint8), r'expected images of shape \(n, 28, 28\)'),
    (data.TEST_IMAGES, np.zeros((3, 784), np.uint8), r'expected images of shape'),
])
def test_load_mnist_rejects_inconsistent_files(tmp_path, name, array, message):
    write_dataset(tmp_path, fake_payloads())
    replace_file(tmp_path, name, array)
    with pytest.raises(DataError, match=message) as info:
        load_mnist(tmp_path, download_missing=False)
    assert name in str(info.value)


def test_load_mnist_missing_files_without_download(tmp_path):
    payloads = fake_payloads()
    del payloads[data.TRAIN_IMAGES]
    write_dataset(tmp_path, payloads)
    with pytest.raises(DataError, match='MNIST_DIR') as info:
        load_mnist(tmp_path, download_missing=False)
    message = str(info.value)
    assert str(tmp_path) in message and data.TRAIN_IMAGES in message
    assert data.TEST_IMAGES not in message


def test_load_mnist_downloads_missing_files_into_default_dir(tmp_path, monkeypatch):
    monkeypatch.setenv('MNIST_DIR', str(tmp_path))
    calls = []

    def fake_download(data_dir):
        calls.append(data_dir)
        write_dataset(data_dir, fake_payloads())

    monkeypatch.setattr(data, 'download', fake_download)
    assert load_mnist()[0].shape == (5, 784)
    assert calls == [tmp_path]
    load_mnist()  # everything present now: no second download
    assert len(calls) == 1


# --- default_data_dir -------------------------------------------------------

def test_default_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv('MNIST_DIR', raising=False)
    monkeypatch.delenv('XDG_CACHE_HOME', raising=False)
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert data.default_data_dir() == tmp_path / 'home' / '.cache' / 'micrograd_c' / 'mnist'
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    assert data.default_data_dir() == tmp_path / 'cache' / 'micrograd_c' / 'mnist'
    monkeypatch.setenv('MNIST_DIR', str(tmp_path / 'mnist'))
    assert data.default_data_dir() == tmp_path / 'mnist'


# --- download and verify ----------------------------------------------------

@pytest.fixture
def served(monkeypatch):
    """Fake MNIST payloads, with FILES patched to their checksums."""
    payloads = fake_payloads()
    checksums = {name: hashlib.sha256(payload).hexdigest() for name, payload in payloads.items()}
    monkeypatch.setattr(data, 'FILES', checksums)
    return payloads


def serve_from(mirrors):
    """A fake fetch: mirrors maps a mirror prefix to a dict of payloads or an exception."""
    calls = []

    def fetch(url):
        calls.append(url)
        for prefix, content in mirrors.items():
            if url.startswith(prefix):
                if isinstance(content, Exception):
                    raise content
                return content[url[len(prefix):]]
        raise AssertionError(f'unexpected url {url}')

    fetch.calls = calls
    return fetch


def assert_only_files(directory, names):
    assert sorted(os.listdir(directory)) == sorted(names)


def test_download_success_then_nothing_to_do(tmp_path, served, capsys):
    target = tmp_path / 'new' / 'dir'
    assert download(target, mirrors=['m1/'], fetch=serve_from({'m1/': served})) == target
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert_only_files(target, served)
    verify(target)
    assert load_mnist(target, download_missing=False)[2].shape == (3, 784)

    download(target, mirrors=['m1/'], fetch=serve_from({}), quiet=True)  # would fail if it fetched
    assert capsys.readouterr().out == ''


def test_download_falls_through_bad_checksum_and_network_error(tmp_path, served):
    junk = {name: b'not mnist' for name in served}
    fetch = serve_from({'bad/': junk, 'down/': urllib.error.URLError('no route'), 'good/': served})
    download(tmp_path, mirrors=['bad/', 'down/', 'good/'], fetch=fetch, quiet=True)
    verify(tmp_path)
    assert_only_files(tmp_path, served)
    assert len(fetch.calls) == 3 * len(served)


def test_download_replaces_file_with_bad_checksum(tmp_path, served):
    (tmp_path / data.TRAIN_IMAGES).write_bytes(b'stale')
    download(tmp_path, mirrors=['m1/'], fetch=serve_from({'m1/': served}), quiet=True)
    verify(tmp_path)


def test_download_all_mirrors_fail(tmp_path, served):
    truncated = {name: payload[:-1] for name, payload in served.items()}
    fetch = serve_from({'http://a/': OSError('connection refused'), 'http://b/': truncated})
    with pytest.raises(DataError) as info:
        download(tmp_path, mirrors=['http://a/', 'http://b/'], fetch=fetch, quiet=True)
    message = str(info.value)
    assert data.TRAIN_IMAGES in message
    assert f'http://a/{data.TRAIN_IMAGES}: connection refused' in message
    assert f'http://b/{data.TRAIN_IMAGES}: SHA256 mismatch' in message
    assert_only_files(tmp_path, [])  # no partial or temporary file left behind


def test_download_leaves_no_temp_file_when_writing_fails(tmp_path, served, monkeypatch):
    def failing_replace(source, destination):
        raise OSError('disk full')

    monkeypatch.setattr(data.os, 'replace', failing_replace)
    with pytest.raises(OSError, match='disk full'):
        download(tmp_path, mirrors=['m1/'], fetch=serve_from({'m1/': served}), quiet=True)
    assert_only_files(tmp_path, [])


def test_download_default_fetch_with_file_urls(tmp_path, served):
    mirror = tmp_path / 'mirror'
    mirror.mkdir()
    write_dataset(mirror, served)
    missing_mirror = (tmp_path / 'nowhere').as_uri() + '/'
    target = tmp_path / 'data'
    download(target, mirrors=[missing_mirror, mirror.as_uri() + '/'], quiet=True)
    verify(target)


def test_verify_names_missing_and_mismatched_files(tmp_path, served):
    write_dataset(tmp_path, served)
    verify(tmp_path)
    (tmp_path / data.TEST_IMAGES).write_bytes(b'tampered')
    with pytest.raises(DataError, match=f'{data.TEST_IMAGES}: SHA256 mismatch'):
        verify(tmp_path)
    (tmp_path / data.TEST_IMAGES).unlink()
    with pytest.raises(DataError, match=f'{data.TEST_IMAGES}: missing'):
        verify(tmp_path)


# --- the real data set ------------------------------------------------------

def real_data_dir():
    """$MNIST_DIR or ../shared/mnist next to the repo, if it holds the canonical files."""
    candidates = [os.environ.get('MNIST_DIR'), REPO_ROOT.parent / 'shared' / 'mnist']
    for candidate in filter(None, candidates):
        if all((pathlib.Path(candidate) / name).is_file() for name in data.FILES):
            return pathlib.Path(candidate)
    return None


def test_real_mnist():
    data_dir = real_data_dir()
    if data_dir is None:
        message = 'real MNIST files not found in $MNIST_DIR or ../shared/mnist'
        if os.environ.get('CI'):
            pytest.fail(message + ' (required on CI)')
        pytest.skip(message)
    verify(data_dir)
    train_images, train_labels, test_images, test_labels = load_mnist(data_dir, download_missing=False)
    assert train_images.shape == (60000, 784) and train_labels.shape == (60000,)
    assert test_images.shape == (10000, 784) and test_labels.shape == (10000,)
    for array in (train_images, train_labels, test_images, test_labels):
        assert array.dtype == np.uint8
    for labels in (train_labels, test_labels):
        assert set(np.unique(labels)) == set(range(10))
    assert train_images.max() == 255 and train_images.min() == 0
