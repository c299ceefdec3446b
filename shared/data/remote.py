"""Splits on object storage: any fsspec URL ``datasets`` can read (``s3://bucket/prefix/``,
``gs://…``, ``hf://…``), named by the same rules as a local folder's files.

Each object is pinned by its stamp (its ETag, and its version id where the store keeps
versions) and by the sha256 of its bytes. Reading a split checks every stamp against the store,
then reads the objects' local copies in a bounded cache (a :class:`DataCache`, which each
process makes once from its settings, ``EVALQ_DATA_CACHE`` and ``EVALQ_DATA_CACHE_BYTES``, and
hands down), each named by its sha256 and kept only when the bytes read hash to the pinned
digest; so what is evaluated is what was pinned, or nothing. Credentials come from each
process's own environment, never from the URL: one that carries some is refused without being
repeated.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from evalq.shared.data.files import FORMATS, by_split, format_of, split_of
from evalq.shared.data.spec import RemoteFile, RemoteSource
from evalq.shared.errors import (
    DataError,
    EvalqError,
    InputError,
    SourceUnreachableError,
    SpecError,
    SplitNotFoundError,
    first_line,
)
from evalq.shared.settings import Settings

__all__ = [
    "DataCache",
    "check_remote",
    "is_remote",
    "materialize",
    "needed_cache",
    "remote_source",
    "remote_splits",
]

_BLOCK = 1 << 20


@dataclass(frozen=True)
class DataCache:
    """Where a process keeps its local copies of objects, and the bytes they may hold: past
    them, the copies used least recently are removed (never those being read)."""

    folder: Path
    max_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> DataCache:
        """The cache ``settings`` name (``data_cache``, or its default, and
        ``data_cache_bytes``)."""
        return cls(folder=settings.data_cache_dir, max_bytes=settings.data_cache_bytes)

    def open(self) -> Path:
        """The folder, made (mode 700) when missing; :class:`DataError` when it cannot be."""
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            where = f"the data cache {self.folder} (EVALQ_DATA_CACHE)"
            raise DataError(f"cannot use {where}: {exc.strerror}") from exc
        return self.folder


def needed_cache(cache: DataCache | None) -> DataCache:
    """``cache``, which reading an object-store source needs (a local one needs none)."""
    if cache is None:
        raise ValueError("an object-store source is read through a data cache: none was given")
    return cache


def is_remote(data: str) -> bool:
    """Whether ``data`` is a URL (``s3://…``) rather than a local path or a Hub id."""
    return "://" in data


def _refuse_credentials(url: str) -> None:
    try:
        parts = urlsplit(url)
        carries = parts.username is not None or parts.password is not None or bool(parts.query)
    except ValueError:
        carries = True
    if carries:
        raise InputError(
            "a data URL may carry no credentials (user:secret@) and no query: each process "
            "reads its own from its environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, …)"
        )


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path in it; listings never come from a cache
    (a stamp read from one could be stale)."""
    import fsspec

    _refuse_credentials(url)
    try:
        return fsspec.core.url_to_fs(url, use_listings_cache=False)  # type: ignore[no-any-return]
    except (ImportError, ValueError) as exc:
        raise DataError(f"cannot read {url}: {first_line(exc)}") from exc


@contextmanager
def _reaching(url: str, missing: EvalqError) -> Iterator[None]:
    """Errors of the store in one line: ``missing`` for an object or bucket that is not there,
    :class:`SourceUnreachableError` for the rest (no access, no answer)."""
    try:
        yield
    except EvalqError:
        raise
    except FileNotFoundError as exc:
        raise missing from exc
    except Exception as exc:
        raise SourceUnreachableError(f"cannot reach {url}: {first_line(exc)}") from exc


def _objects(url: str) -> tuple[Any, list[PurePosixPath]]:
    """The data objects ``url`` names: itself, or those directly under it."""
    fs, root = _filesystem(url)
    with _reaching(url, DataError(f"no such object, folder or bucket: {url}")):
        if fs.info(root)["type"] == "file":
            found = [root]
        else:
            found = sorted(e["name"] for e in fs.ls(root, detail=True) if e["type"] == "file")
    files = [PurePosixPath(name) for name in found if PurePosixPath(name).suffix in FORMATS]
    if not files:
        raise DataError(f"{url} holds no parquet, jsonl, json, csv or arrow file")
    return fs, files


def _stamp(fs: Any, path: str) -> tuple[str, str | None]:
    """The object's ETag (or, from a store without one, fsspec's key of its details) and its
    version id (None unless the store versions it)."""
    info = fs.info(path)
    etag = info.get("ETag") or info.get("etag")
    version = info.get("VersionId") or info.get("generation")
    return (
        str(etag).strip('"') if etag else str(fs.ukey(path)),
        str(version) if version else None,
    )


def _fetch(fs: Any, path: str, cache: Path) -> tuple[str, Path]:
    """Read the object into ``cache`` under the sha256 of the bytes read; that digest, and the
    copy."""
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=cache, prefix=".part-", delete=False) as out:
        try:
            with fs.open(path, "rb") as source:
                for block in iter(lambda: source.read(_BLOCK), b""):
                    digest.update(block)
                    out.write(block)
        except BaseException:
            os.unlink(out.name)
            raise
    copy = cache / f"{digest.hexdigest()}{PurePosixPath(path).suffix}"
    os.replace(out.name, copy)
    return digest.hexdigest(), copy


def _trim(cache: Path, limit: int, keep: set[Path]) -> None:
    """Remove the copies used least recently until ``cache`` holds at most ``limit`` bytes,
    never one of ``keep`` (another process may remove what this one lists: that is fine)."""
    found: list[tuple[float, int, Path]] = []
    for entry in os.scandir(cache):
        with suppress(FileNotFoundError):
            if entry.is_file() and not entry.name.startswith("."):
                stat = entry.stat()
                found.append((stat.st_atime, stat.st_size, Path(entry.path)))
    total = sum(size for _, size, _ in found)
    for _, size, path in sorted(found):
        if total <= limit:
            return
        if path not in keep:
            path.unlink(missing_ok=True)
            total -= size


def _copy(cache: Path, pinned: RemoteFile) -> Path:
    """Where the cache keeps the copy of ``pinned``: named by its sha256."""
    return cache / f"{pinned.sha256}{PurePosixPath(pinned.url).suffix}"


def _pin(fs: Any, path: str, cache: Path) -> RemoteFile:
    url = fs.unstrip_protocol(path)
    with _reaching(url, DataError(f"no such object: {url}")):
        etag, version = _stamp(fs, path)
        sha256, _ = _fetch(fs, path, cache)
    return RemoteFile(url=url, etag=etag, version=version, sha256=sha256)


def _pinned(
    fs: Any, url: str, split: str, chosen: list[PurePosixPath], cache: DataCache
) -> RemoteSource:
    folder = cache.open()
    files = tuple(_pin(fs, str(path), folder) for path in chosen)
    _trim(folder, cache.max_bytes, {_copy(folder, f) for f in files})
    return RemoteSource(format=format_of(url, split, chosen), files=files)


def remote_splits(url: str, cache: DataCache) -> dict[str, RemoteSource]:
    """Every split of the object or prefix ``url``, each object pinned (and left in
    ``cache``)."""
    fs, files = _objects(url)
    return {
        split: _pinned(fs, url, split, chosen, cache) for split, chosen in by_split(files).items()
    }


def remote_source(url: str, split: str, cache: DataCache) -> RemoteSource:
    """``split`` of the object or prefix ``url``, its objects pinned (and left in
    ``cache``)."""
    fs, files = _objects(url)
    chosen = [path for path in files if split_of(path) == split]
    if not chosen:
        have = sorted({split_of(path) for path in files})
        raise SplitNotFoundError(f"split '{split}' not found in {url} (splits: {', '.join(have)})")
    return _pinned(fs, url, split, chosen, cache)


def check_remote(source: RemoteSource) -> None:
    """Every object must still carry the stamp pinned for it; :class:`SpecError` naming the
    first that is missing or changed."""
    for pinned in source.files:
        fs, path = _filesystem(pinned.url)
        with _reaching(pinned.url, SpecError(f"object {pinned.url} is missing")):
            etag, version = _stamp(fs, path)
        if etag != pinned.etag or (pinned.version is not None and version != pinned.version):
            raise SpecError(
                f"object {pinned.url} differs from the one pinned for it (its ETag or version "
                "changed)"
            )


def _touch(copy: Path) -> bool:
    """Mark ``copy`` used now (its access time; its modification time, which ``datasets``
    keys its own cache by, stays); False when the cache lacks it."""
    try:
        os.utime(copy, ns=(time.time_ns(), copy.stat().st_mtime_ns))
    except FileNotFoundError:
        return False
    return True


def _fetch_pinned(pinned: RemoteFile, cache: Path) -> None:
    fs, path = _filesystem(pinned.url)
    with _reaching(pinned.url, SpecError(f"object {pinned.url} is missing")):
        sha256, fetched = _fetch(fs, path, cache)
    if sha256 != pinned.sha256:
        fetched.unlink(missing_ok=True)
        raise SpecError(
            f"object {pinned.url} differs from the one pinned for it (sha256 {sha256[:12]}, "
            f"pinned {pinned.sha256[:12]})"
        )


def materialize(source: RemoteSource, cache: DataCache) -> list[Path]:
    """Local copies of the source's objects in ``cache``, in order: each read from the store
    only when the cache lacks it, and kept only when its bytes hash to the pinned sha256 (else
    :class:`SpecError`)."""
    folder = cache.open()
    copies = [_copy(folder, pinned) for pinned in source.files]
    for pinned, copy in zip(source.files, copies, strict=True):
        if not _touch(copy):
            _fetch_pinned(pinned, folder)
    _trim(folder, cache.max_bytes, set(copies))
    return copies
