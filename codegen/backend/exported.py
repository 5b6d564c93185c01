"""Builds copied out of the cache into a directory of one's own (a shared object, its C files and
a record of its keys), and found there again by either key (mnist's `make` keeps its module so)."""
from __future__ import annotations

import json
import os
import pathlib
from dataclasses import dataclass

from .builds import BuildResult, check_identifier, unit_file_name, write_atomically


EXPORT_RECORD_FORMAT = 1


@dataclass(frozen=True)
class ExportedBuild:
    path: pathlib.Path       # the shared object, <directory>/<name><suffix>
    record: dict             # what export_build wrote in <directory>/<name>.json (key, files, extras)


def export_build(build: BuildResult, directory: str | os.PathLike, name: str,
                 record: dict | None = None) -> ExportedBuild:
    """Copy a build out of the cache into directory as `name`: the shared object (name + its
    suffix: an extension module keeps the name it was built as), its C files (name.c, name.1.c...)
    and name.json, a record of the build's cache key (see build_key) and structure key if it has one
    (structure_build_key) plus `record`'s entries. find_build(directory, name, key) finds it again
    by either key. The record is written last."""
    if build.key is None or not build.c_files:
        raise ValueError('only a build of build_extension or build_library can be exported (it has no cache key)')
    check_identifier(name)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = build.c_files[0].name[:-len('.c')]
    _record_path(directory, name).unlink(missing_ok=True)  # no record describes a half-copied build
    c_names = []
    for index, c_file in enumerate(build.c_files):
        c_names.append(unit_file_name(name, index))
        write_atomically(directory / c_names[-1], c_file.read_bytes())
    target = directory / (name + build.path.name[len(stem):])
    write_atomically(target, build.path.read_bytes())
    written = {**(record or {}), 'format': EXPORT_RECORD_FORMAT, 'key': build.key, 'file': target.name,
               'sources': c_names, 'command': list(build.command), 'compile_seconds': build.seconds,
               'cached': build.cached, **({'structure': build.structure_key} if build.structure_key else {})}
    write_atomically(_record_path(directory, name), json.dumps(written, indent=1))
    return ExportedBuild(target, written)


def find_build(directory: str | os.PathLike, name: str, key: str) -> ExportedBuild | None:
    """The build export_build wrote in directory as `name`, if its record holds this cache key
    (build_key of the sources, compiler and flags wanted, or structure_build_key of the graph's
    structural key) and its files are there; else None."""
    directory = pathlib.Path(directory)
    record = export_record(directory, name)
    if record is None or key not in (record.get('key'), record.get('structure')):
        return None
    files = [record.get('file'), *(record.get('sources') or [None])]
    if not all(isinstance(f, str) and '/' not in f and (directory / f).is_file() for f in files):
        return None
    return ExportedBuild(directory / record['file'], record)


def export_record(directory: str | os.PathLike, name: str) -> dict | None:
    """The record export_build wrote in directory for `name`; None if there is none (or not one of
    its records). Cheap: a caller can skip computing a cache key when there is nothing to compare."""
    try:
        record = json.loads(_record_path(pathlib.Path(directory), name).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get('format') == EXPORT_RECORD_FORMAT else None


def _record_path(directory: pathlib.Path, name: str) -> pathlib.Path:
    return directory / f'{name}.json'
