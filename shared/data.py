"""Reading splits with Hugging Face ``datasets``: from ``--data`` to a spec, and from a spec
back to rows.

``--data`` is a local file (its split is the file's stem, so ``test.jsonl`` holds ``test``), a
local folder whose files are named after splits (``validation.jsonl``,
``validation-00001.parquet``), or a Hub dataset id.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from shared.errors import DataError, SourceUnreachableError, SpecError, SplitNotFoundError
from shared.spec import DatasetSpec, HubSource, LocalFile, LocalFormat, LocalSource

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["build_spec", "load_rows"]

_FORMATS: dict[str, LocalFormat] = {
    ".parquet": "parquet",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".arrow": "arrow",
}


def _split_of(path: Path) -> str:
    return path.name.removesuffix(path.suffix)


def _data_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root] if root.suffix in _FORMATS else []
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix in _FORMATS)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _local_source(root: Path, split: str) -> LocalSource:
    files = _data_files(root)
    if not files:
        raise DataError(f"{root} holds no parquet, jsonl, json, csv or arrow file")
    chosen = [p for p in files if _split_of(p) == split or _split_of(p).startswith(f"{split}-")]
    if not chosen:
        have = sorted({_split_of(p).split("-")[0] for p in files})
        raise SplitNotFoundError(f"split '{split}' not found in {root} (splits: {', '.join(have)})")
    formats = {_FORMATS[p.suffix] for p in chosen}
    if len(formats) > 1:
        raise DataError(f"split '{split}' in {root} mixes formats: {', '.join(sorted(formats))}")
    return LocalSource(
        format=formats.pop(),
        files=tuple(LocalFile(path=str(p.resolve()), sha256=_sha256(p)) for p in chosen),
    )


def _looks_like_path(data: str) -> bool:
    return data.startswith((".", "/", "~")) or Path(data).suffix in _FORMATS


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    import datasets

    datasets.disable_progress_bars()
    previous = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(previous)


def _load(source: LocalSource | HubSource, split: str) -> Dataset:
    import datasets

    with _quiet_datasets():
        try:
            if isinstance(source, LocalSource):
                files = [f.path for f in source.files]
                return datasets.load_dataset(source.format, data_files={split: files}, split=split)
            return datasets.load_dataset(
                source.repo_id, name=source.config, revision=source.revision, split=split
            )
        except ValueError as exc:
            if "split" in str(exc).lower():
                raise SplitNotFoundError(f"split '{split}' not found: {_first_line(exc)}") from exc
            raise DataError(f"cannot read the dataset: {_first_line(exc)}") from exc
        except (ConnectionError, OSError) as exc:
            where = source.repo_id if isinstance(source, HubSource) else "local files"
            raise SourceUnreachableError(f"cannot reach {where}: {_first_line(exc)}") from exc
        except Exception as exc:
            raise DataError(f"cannot read the dataset: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def build_spec(
    data: str, split: str, revision: str | None = None, config: str | None = None
) -> tuple[DatasetSpec, Dataset]:
    """Resolve ``--data`` and ``--split`` into a spec, loading the split once to count rows."""
    root = Path(data).expanduser()
    source: LocalSource | HubSource
    if root.exists():
        if revision is not None:
            raise DataError("--revision applies to Hub datasets, not to local files")
        source = _local_source(root, split)
    elif _looks_like_path(data):
        raise DataError(f"no such file or folder: {data}")
    else:
        source = HubSource(repo_id=data, revision=revision, config=config)
    dataset = _load(source, split)
    return DatasetSpec(source=source, split=split, n_rows=len(dataset)), dataset


def load_rows(spec: DatasetSpec) -> Dataset:
    """Rebuild a spec's split, checking local files against their pinned digests."""
    if isinstance(spec.source, LocalSource):
        for pinned in spec.source.files:
            path = Path(pinned.path)
            if not path.is_file():
                raise SpecError(f"data file {pinned.path} is missing on this worker")
            if _sha256(path) != pinned.sha256:
                raise SpecError(f"data file {pinned.path} differs from the one the spec pins")
    dataset = _load(spec.source, spec.split)
    if len(dataset) != spec.n_rows:
        raise SpecError(f"spec expects {spec.n_rows} rows, the source now has {len(dataset)}")
    return dataset
