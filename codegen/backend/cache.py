"""The build cache: entries committed by a record, checked before loading, bounded in size.

An entry is one build's files in the cache directory, all named by its stem `<name>_<16 hex>`:
the shared object, its C sources (`stem.c`, `stem.1.c`...) and the record `stem.build.json`,
written last (temporary file, then rename): the commit point. The record holds the shared
object's size and SHA-256 and what the build was (model name, compiler, flags), and its
modification time is the entry's last use. A shared object without a valid record is incomplete
(an interrupted build) and is rebuilt; one whose bytes differ from its record (truncated by a
full disk, a killed copy) is removed and rebuilt with a CacheWarning, never handed to dlopen,
which would kill the process with SIGBUS.

Locks (flock, advisory): a build holds the exclusive lock file `.stem.lock` while it compiles and
commits, so that concurrent builders of one model compile it once; a process that loaded an
entry holds a shared lock on its shared object for as long as it lives (an extension module is
never unloaded). Eviction, after a build when the directory exceeds $MICROGRAD_C_CACHE_MAX_MB
(default 1024), removes least-recently-used entries, skipping any whose locks it cannot take
without waiting: an entry being built or in use by a process is never evicted.

    python -m codegen.backend.cache list            # entries: last used, size, compiler, flags, model
    python -m codegen.backend.cache clear [--older-than DAYS]
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

DEFAULT_MAX_MB = 1024
RECORD_SUFFIX = '.build.json'
RECORD_FORMAT = 1
# <name>_<16 hex digits> then a dot: the shared object, C files, record, and (with a leading
# dot) the build lock and temporaries.
_STEM = re.compile(r'\.?([A-Za-z_][A-Za-z0-9_]*_[0-9a-f]{16})\.')


class CacheWarning(UserWarning):
    """A damaged cache entry was found and is being rebuilt."""


# statuses of open_entry
VALID, INCOMPLETE, DAMAGED = 'valid', 'incomplete', 'damaged'


def cache_dir() -> pathlib.Path:
    """$MICROGRAD_C_CACHE, else $XDG_CACHE_HOME/micrograd_c, else ~/.cache/micrograd_c; created on demand."""
    if os.environ.get('MICROGRAD_C_CACHE'):
        path = pathlib.Path(os.environ['MICROGRAD_C_CACHE'])
    else:
        path = pathlib.Path(os.environ.get('XDG_CACHE_HOME') or pathlib.Path.home() / '.cache') / 'micrograd_c'
    path.mkdir(parents=True, exist_ok=True)
    return path


def stem_of(path: str | os.PathLike) -> str | None:
    match = _STEM.match(pathlib.Path(path).name)
    return match.group(1) if match else None


def record_path(so_path: str | os.PathLike) -> pathlib.Path:
    so_path = pathlib.Path(so_path)
    return so_path.with_name(so_path.name.split('.', 1)[0] + RECORD_SUFFIX)


def max_bytes() -> int:
    """The size cap from $MICROGRAD_C_CACHE_MAX_MB (megabytes, 10^6 bytes), default 1024 MB."""
    text = os.environ.get('MICROGRAD_C_CACHE_MAX_MB', '').strip()
    if not text:
        return DEFAULT_MAX_MB * 10**6
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0 or megabytes == float('inf'):
        raise ValueError(f'MICROGRAD_C_CACHE_MAX_MB must be a number of megabytes >= 0, not {text!r}')
    return int(megabytes * 10**6)


# ---- validation and the shared "in use" lock ---------------------------------------------------
_lock = threading.Lock()
_held: dict[tuple[int, int], int] = {}                     # (dev, inode) -> fd holding LOCK_SH
_checked: dict[tuple[int, int], tuple[int, int, str]] = {}  # (dev, inode) -> (size, mtime_ns, sha256)


def _sha256_of_fd(fd: int) -> str:
    digest = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while chunk := os.read(fd, 1 << 20):
        digest.update(chunk)
    return digest.hexdigest()


def read_record(so_path: str | os.PathLike) -> dict | None:
    """The entry's record; None if there is none; ValueError if it is unreadable or malformed."""
    try:
        text = record_path(so_path).read_text()
    except FileNotFoundError:
        return None
    return _parse_record(text, pathlib.Path(so_path).name)


def _parse_record(text: str, so_name: str | None = None) -> dict:
    try:
        record = json.loads(text)
    except ValueError as error:
        raise ValueError(f'unreadable record ({error})') from None
    if (not isinstance(record, dict) or record.get('format') != RECORD_FORMAT or not isinstance(record.get('file'), str)
            or (so_name is not None and record['file'] != so_name) or not isinstance(record.get('size'), int)
            or not isinstance(record.get('sha256'), str)):
        raise ValueError('malformed record')
    return record


def open_entry(so_path: str | os.PathLike) -> tuple[str, str, int | None]:
    """Check the entry of so_path under a shared lock: (status, why, fd).

    VALID: fd is open on the shared object and holds the shared lock (pass it to hold() or
    os.close() it), and the record's last-use time is updated. INCOMPLETE (no shared object or no
    record) and DAMAGED (the bytes differ from the record, or the record is malformed): fd is None.
    """
    so_path = pathlib.Path(so_path)
    for _ in range(8):  # each retry follows a concurrent rebuild or eviction of this entry
        try:
            fd = os.open(so_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return INCOMPLETE, 'no shared object', None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an evictor removes it
            opened = os.fstat(fd)
            try:
                current = os.stat(so_path)
            except FileNotFoundError:
                current = None
            if current is None or (current.st_dev, current.st_ino) != (opened.st_dev, opened.st_ino):
                os.close(fd)
                continue  # evicted or replaced before we locked it: look again
            try:
                record = read_record(so_path)
            except ValueError as error:
                os.close(fd)
                return DAMAGED, str(error), None
            if record is None:
                os.close(fd)
                return INCOMPLETE, 'no record (an interrupted build)', None
            key = (opened.st_dev, opened.st_ino)
            with _lock:
                known = _checked.get(key)
            if known is None or known[:2] != (opened.st_size, opened.st_mtime_ns):
                known = (opened.st_size, opened.st_mtime_ns, _sha256_of_fd(fd))
                with _lock:
                    _checked[key] = known
            if known[0] != record['size'] or known[2] != record['sha256']:
                os.close(fd)
                why = (f'{known[0]} bytes where its record says {record["size"]}' if known[0] != record['size']
                       else 'its SHA-256 differs from its record')
                return DAMAGED, why, None
            with contextlib.suppress(OSError):  # the last use, for LRU eviction (a read-only cache: skip)
                os.utime(record_path(so_path))
            return VALID, '', fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    return INCOMPLETE, 'changed concurrently too often', None


def hold(fd: int) -> None:
    """Keep fd's shared lock for the rest of the process (its module is loaded): never evicted."""
    stat = os.fstat(fd)
    key = (stat.st_dev, stat.st_ino)
    with _lock:
        if key not in _held:
            _held[key] = fd
            return
    os.close(fd)  # already held through another descriptor


# ---- building: the exclusive build lock and the commit ---------------------------------------
@contextlib.contextmanager
def build_lock(directory: pathlib.Path, stem: str, blocking: bool = True):
    """The exclusive lock file `.stem.lock`, removed when released; yields whether it was taken."""
    path = pathlib.Path(directory) / f'.{stem}.lock'
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            yield False
            return
        except BaseException:
            os.close(fd)
            raise
        try:  # the previous holder removed the file it locked: lock the one at the path now
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # while still locked: waiters see the file change and retry
        os.close(fd)


def commit(so_path: pathlib.Path, **metadata) -> None:
    """Write the record of a complete shared object (under the build lock): the entry exists."""
    fd = os.open(so_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        stat, sha = os.fstat(fd), _sha256_of_fd(fd)
    finally:
        os.close(fd)
    with _lock:
        _checked[(stat.st_dev, stat.st_ino)] = (stat.st_size, stat.st_mtime_ns, sha)
    record = {'format': RECORD_FORMAT, 'file': so_path.name, 'size': stat.st_size, 'sha256': sha,
              'built': time.time(), **metadata}
    target = record_path(so_path)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f'.{target.name}.', suffix='.tmp')
    with os.fdopen(fd, 'w') as file:
        json.dump(record, file, indent=1)
    os.replace(temp, target)


def entry_files(directory: pathlib.Path, stem: str) -> list[pathlib.Path]:
    """Every file of the entry: record first (removing it first un-commits the entry)."""
    directory = pathlib.Path(directory)
    files = [p for p in _listdir(directory) if stem_of(p) == stem and not p.name.endswith('.lock')]
    return sorted(files, key=lambda p: (not p.name.endswith(RECORD_SUFFIX), p.name))


def remove_entry(so_path: str | os.PathLike) -> None:
    """Delete an entry's files, record first. For a damaged entry: the caller rebuilds it."""
    so_path = pathlib.Path(so_path)
    for path in entry_files(so_path.parent, stem_of(so_path) or so_path.name):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _listdir(directory: pathlib.Path) -> list[pathlib.Path]:
    try:
        return [p for p in directory.iterdir() if p.is_file() and not p.is_symlink()]
    except FileNotFoundError:
        return []


# ---- the index by graph structure ---------------------------------------------------------------
# A second way into the entries: compile() finds a graph's build by the graph's structural key
# (codegen/lower/graph.py) without generating its C. An index record names an entry; the entry is
# checked as ever (open_entry), so a record whose entry is gone or damaged is simply not used,
# and the build it falls back to writes it anew. Records are small files in a subdirectory,
# which listing and eviction (files of the directory itself) do not see.
INDEX_DIR = 'structures'


def _index_path(directory: pathlib.Path, key: str) -> pathlib.Path:
    return pathlib.Path(directory) / INDEX_DIR / f'{key}.json'


def read_index(directory: str | os.PathLike, key: str) -> dict | None:
    """The index record under key, or None (none, or unreadable: the caller rebuilds)."""
    try:
        record = json.loads(_index_path(directory, key).read_text())
    except (OSError, ValueError):
        return None
    if (not isinstance(record, dict) or record.get('format') != RECORD_FORMAT
            or not all(isinstance(record.get(k), str) for k in ('file', 'key'))
            or not isinstance(record.get('c_files'), list) or not record['c_files']
            or not isinstance(record.get('command'), list) or stem_of(record['file']) is None):
        return None
    return record


def write_index(directory: str | os.PathLike, key: str, record: dict) -> None:
    """Record (atomically) that key's build is the entry record['file']."""
    path = _index_path(directory, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.', suffix='.tmp')
    with os.fdopen(fd, 'w') as file:
        json.dump({'format': RECORD_FORMAT, **record}, file)
    os.replace(temp, path)


def prune_index(directory: str | os.PathLike) -> int:
    """Remove the index records whose entry is gone (evicted, cleared); returns how many."""
    removed = 0
    for path in (pathlib.Path(directory) / INDEX_DIR).glob('*.json'):
        record = read_index(directory, path.stem)
        if record is None or not (pathlib.Path(directory) / record['file']).exists():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed


# ---- listing and eviction --------------------------------------------------------------------
@dataclass
class Entry:
    stem: str
    files: list[pathlib.Path]
    size: int                    # bytes of all its files
    last_used: float             # the record's mtime (else the newest file's)
    record: dict | None = field(default=None)  # None: incomplete (an interrupted or failed build)

    @property
    def shared_object(self) -> pathlib.Path | None:
        return self.files[0].with_name(self.record['file']) if self.record else None


def entries(directory: str | os.PathLike) -> list[Entry]:
    """The cache's entries, least recently used first. Files that are not the cache's are ignored."""
    groups: dict[str, list[pathlib.Path]] = {}
    for path in _listdir(pathlib.Path(directory)):
        stem = stem_of(path)
        if stem and not path.name.endswith('.lock'):
            groups.setdefault(stem, []).append(path)
    found = []
    for stem, files in groups.items():
        stats = {}
        for path in files:
            with contextlib.suppress(FileNotFoundError):
                stats[path] = path.stat()
        if not stats:
            continue
        record_file = pathlib.Path(directory) / (stem + RECORD_SUFFIX)
        record = None
        if record_file in stats:
            with contextlib.suppress(ValueError, OSError):
                record = _parse_record(record_file.read_text())
        last_used = (stats[record_file].st_mtime if record_file in stats
                     else max(s.st_mtime for s in stats.values()))
        found.append(Entry(stem, sorted(stats, key=lambda p: (not p.name.endswith(RECORD_SUFFIX), p.name)),
                           sum(s.st_size for s in stats.values()), last_used, record))
    return sorted(found, key=lambda e: (e.last_used, e.stem))


def total_size(directory: str | os.PathLike) -> int:
    return sum(entry.size for entry in entries(directory))


def try_remove(directory: str | os.PathLike, entry: Entry) -> bool:
    """Remove the entry unless it is being built or some process uses it (locks not free)."""
    directory = pathlib.Path(directory)
    with build_lock(directory, entry.stem, blocking=False) as locked:
        if not locked:
            return False
        so_path = entry.shared_object
        fd = None
        if so_path is not None:
            try:
                fd = os.open(so_path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                pass
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False  # loaded by a process
            for path in entry_files(directory, entry.stem):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            return True
        finally:
            if fd is not None:
                os.close(fd)


def evict(directory: str | os.PathLike, limit: int | None = None, keep: tuple[str, ...] = ()) -> list[Entry]:
    """Remove least-recently-used entries (never `keep`'s stems, nor locked ones) until the
    directory's entries fit in `limit` bytes (default: max_bytes()). Returns those removed."""
    limit = max_bytes() if limit is None else limit
    found = entries(directory)
    total = sum(entry.size for entry in found)
    removed = []
    for entry in found:
        if total <= limit:
            break
        if entry.stem not in keep and try_remove(directory, entry):
            total -= entry.size
            removed.append(entry)
    return removed


# ---- command line ------------------------------------------------------------------------------
def _describe(entry: Entry) -> tuple[str, str, str]:
    record = entry.record or {}
    compiler = record.get('compiler', '?')
    flags = ' '.join(f for f in record.get('flags', ()) if f not in ('-shared', '-fPIC') and not f.startswith('-I'))
    name = record.get('name', entry.stem.rsplit('_', 1)[0]) + ('' if entry.record else ' (incomplete)')
    return name, compiler, flags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m codegen.backend.cache', description=(
        'List or clear the build cache ($MICROGRAD_C_CACHE, else ~/.cache/micrograd_c).'))
    parser.add_argument('--dir', type=pathlib.Path, help='the cache directory (default: the one builds use)')
    commands = parser.add_subparsers(dest='command')
    commands.add_parser('list', help='list the entries, least recently used first (the default)')
    clear = commands.add_parser('clear', help='remove the entries no process is using')
    clear.add_argument('--older-than', type=float, metavar='DAYS', default=0.0,
                       help='only those last used more than DAYS days ago')
    args = parser.parse_args(argv)
    directory = args.dir or cache_dir()
    found = entries(directory)
    if args.command == 'clear':
        cutoff = time.time() - args.older_than * 86400
        removed = [e for e in found if e.last_used <= cutoff and try_remove(directory, e)]
        in_use = sum(1 for e in found if e.last_used <= cutoff) - len(removed)
        prune_index(directory)
        print(f'removed {len(removed)} entries ({sum(e.size for e in removed) / 1e6:.2f} MB) from {directory}'
              + (f'; {in_use} in use or being built, kept' if in_use else ''))
        return 0
    rows = [('last used', 'size', 'compiler', 'flags', 'model', 'entry')]
    for entry in found:
        name, compiler, flags = _describe(entry)
        rows.append((time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(entry.last_used)),
                     f'{entry.size / 1e3:,.0f} kB', compiler, flags, name, entry.stem))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print('  '.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    total = sum(e.size for e in found)
    print(f'{len(found)} entries, {total / 1e6:.2f} MB in {directory}; cap {max_bytes() / 1e6:g} MB '
          '($MICROGRAD_C_CACHE_MAX_MB)')
    return 0


if __name__ == '__main__':
    sys.exit(main())
