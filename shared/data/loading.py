"""Reading splits with Hugging Face ``datasets``: from ``--data`` to a spec, and from a spec
back to rows and shards.

``--data`` is a local file (its split is the file's stem, so ``test.jsonl`` holds ``test``), a
local folder whose files are named after splits (``validation.jsonl``,
``validation-00001.parquet``), an object or prefix on object storage named the same way
(``s3://bucket/prefix/``, see :mod:`evalq.shared.data.remote`: read through the caller's
:class:`~evalq.shared.data.remote.DataCache`, which nothing else needs), or a Hub dataset id. A
k-means routing is fitted on a stream of the split that is read no further than the fit's
sample, so memory follows the sample size.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from evalq.shared.data.files import FORMATS, by_split, format_of, split_of
from evalq.shared.data.remote import (
    DataCache,
    check_remote,
    is_remote,
    materialize,
    needed_cache,
    remote_source,
)
from evalq.shared.data.routing import (
    Contiguous,
    Featurizer,
    KMeans,
    KMeansFit,
    RoundRobin,
    RoutingKind,
    assign,
    fit_kmeans,
)
from evalq.shared.data.spec import (
    MAX_SPEC_SHARDS,
    DatasetSpec,
    HubSource,
    LocalFile,
    LocalSource,
    RemoteSource,
    Source,
)
from evalq.shared.errors import (
    DataError,
    SourceUnreachableError,
    SpecError,
    SplitNotFoundError,
    first_line,
)

if TYPE_CHECKING:
    import numpy as np
    from datasets import Dataset, IterableDataset

__all__ = [
    "Sharding",
    "build_spec",
    "check_pinned",
    "load_rows",
    "local_root",
    "local_splits",
    "refit_routing",
    "resolve_source",
    "shard_of_rows",
    "shard_order",
    "spec_of",
    "stream_texts",
]


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Sharding:
    """How a split is to be cut into shards (``--shards``, ``--routing`` and the router knobs);
    validated when made, since a gateway caller sends it."""

    shards: Annotated[int, Field(ge=1, le=MAX_SPEC_SHARDS)] = 1
    routing: RoutingKind = RoutingKind.CONTIGUOUS
    route_field: Annotated[str, Field(min_length=1, max_length=200)] = "text"
    """Text field read by ``kmeans``."""
    sample_size: Annotated[int, Field(ge=1, le=1_000_000)] = 1000
    """``--router-sample``: texts the k-means fit reads."""
    seed: Annotated[int, Field(ge=0, lt=2**32)] = 0
    """``--router-seed``: seeds the featurizer's hash and the k-means initialisation."""
    dim: Annotated[int, Field(ge=1, le=4096)] = 128
    """Featurizer buckets."""
    iterations: Annotated[int, Field(ge=1, le=1000)] = 50
    """Most Lloyd iterations."""


def _data_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root] if root.suffix in FORMATS else []
    if not root.is_dir():
        raise DataError(f"{root} is neither a regular file nor a folder")
    return sorted(p for p in root.iterdir() if p.is_file() and p.suffix in FORMATS)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_splits(root: Path) -> dict[str, LocalSource]:
    """Every split of a local file or folder, each pinned by its files' digests."""
    files = _data_files(root)
    if not files:
        raise DataError(f"{root} holds no parquet, jsonl, json, csv or arrow file")
    return {split: _pinned(root, split, chosen) for split, chosen in by_split(files).items()}


def _pinned(root: Path, split: str, chosen: list[Path]) -> LocalSource:
    return LocalSource(
        format=format_of(str(root), split, chosen),
        files=tuple(LocalFile(path=str(p.resolve()), sha256=_sha256(p)) for p in chosen),
    )


def _local_source(root: Path, split: str) -> LocalSource:
    files = _data_files(root)
    if not files:
        raise DataError(f"{root} holds no parquet, jsonl, json, csv or arrow file")
    chosen = [p for p in files if split_of(p) == split]
    if not chosen:
        have = sorted({split_of(p) for p in files})
        raise SplitNotFoundError(f"split '{split}' not found in {root} (splits: {', '.join(have)})")
    return _pinned(root, split, chosen)


def check_pinned(source: Source) -> None:
    """Local files must still hold the bytes their digests pin, and objects the stamps theirs
    do (a Hub source is pinned by its revision); :class:`SpecError` otherwise."""
    if isinstance(source, RemoteSource):
        check_remote(source)
    if not isinstance(source, LocalSource):
        return
    for pinned in source.files:
        path = Path(pinned.path)
        if not path.is_file():
            raise SpecError(f"data file {pinned.path} is missing on this machine")
        if _sha256(path) != pinned.sha256:
            raise SpecError(f"data file {pinned.path} differs from the one pinned for it")


def _looks_like_path(data: str) -> bool:
    return data.startswith((".", "/", "~")) or Path(data).suffix in FORMATS


@contextmanager
def _quiet_datasets() -> Iterator[None]:
    import datasets
    from datasets.utils.tqdm import tqdm

    datasets.disable_progress_bars()
    # a lock kept on the class: tqdm's thread_map (which datasets uses to read files) makes one
    # when the class has none and deletes it after, and two reads at once in a process's
    # threads raced on that delete (a burst of submits: "type object 'tqdm' has no attribute
    # '_lock'", one run in six under two CPU burners)
    tqdm.get_lock()
    previous = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(previous)


STREAMED_JSON = {"chunksize": 1 << 20}
"""How a streamed JSON split is read: a MiB at a time. ``datasets``' default, 10 MiB, is split
into lines and parsed whole, so a stream held 37.5 MB at once whatever it read (a tracemalloc
snapshot of a k-means fit)."""


def _load(source: Source, split: str, cache: DataCache | None, streaming: bool = False) -> Any:
    import datasets

    files: list[str] = []
    if isinstance(source, RemoteSource):
        # local copies, their sha256 checked
        files = [str(copy) for copy in materialize(source, needed_cache(cache))]
    elif isinstance(source, LocalSource):
        files = [f.path for f in source.files]
    with _quiet_datasets():
        try:
            if not isinstance(source, HubSource):
                # the files were chosen by their split already; ``datasets`` only needs a key
                # for them, and refuses split names such as ``test-hard`` as keys
                return datasets.load_dataset(
                    source.format,
                    data_files={"rows": files},
                    split="rows",
                    streaming=streaming,
                    **(STREAMED_JSON if streaming and source.format == "json" else {}),
                )
            return datasets.load_dataset(
                source.repo_id,
                name=source.config,
                revision=source.revision,
                split=split,
                streaming=streaming,
            )
        except ValueError as exc:
            if "split" in str(exc).lower():
                raise SplitNotFoundError(f"split '{split}' not found: {first_line(exc)}") from exc
            raise DataError(f"cannot read the dataset: {first_line(exc)}") from exc
        except (ConnectionError, OSError) as exc:
            where = source.repo_id if isinstance(source, HubSource) else "local files"
            raise SourceUnreachableError(f"cannot reach {where}: {first_line(exc)}") from exc
        except Exception as exc:
            raise DataError(f"cannot read the dataset: {first_line(exc)}") from exc


def _column(names: list[str] | None, field: str) -> None:
    if names is not None and field not in names:
        raise DataError(f"route field '{field}' is not a column of the split ({', '.join(names)})")


def stream_texts(
    source: Source, split: str, field: str, cache: DataCache | None = None
) -> Iterator[str]:
    """The split's ``field`` row by row, streamed: only what the caller consumes is read
    (``cache``: where an object-store source's copies are kept)."""
    stream: IterableDataset = _load(source, split, cache, streaming=True)
    _column(stream.column_names, field)
    with _quiet_datasets():
        for row in stream.select_columns([field]):
            yield str(row[field])


def _split_texts(dataset: Dataset, field: str) -> Iterator[list[str]]:
    _column(dataset.column_names, field)
    for batch in dataset.select_columns([field]).iter(batch_size=4096):
        yield [str(text) for text in batch[field]]


def _fit(
    source: Source, split: str, sharding: Sharding, cache: DataCache | None
) -> Contiguous | RoundRobin | KMeans:
    if sharding.routing is RoutingKind.CONTIGUOUS:
        return Contiguous()
    if sharding.routing is RoutingKind.ROUND_ROBIN:
        return RoundRobin()
    fit = KMeansFit(
        sample_size=sharding.sample_size, seed=sharding.seed, iterations=sharding.iterations
    )
    featurizer = Featurizer(seed=sharding.seed, dim=sharding.dim)
    return _fit_kmeans(
        source,
        split,
        field=sharding.route_field,
        shards=sharding.shards,
        featurizer=featurizer,
        fit=fit,
        cache=cache,
    )


def _fit_kmeans(
    source: Source,
    split: str,
    *,
    field: str,
    shards: int,
    featurizer: Featurizer,
    fit: KMeansFit,
    cache: DataCache | None,
) -> KMeans | RoundRobin:
    return fit_kmeans(stream_texts(source, split, field, cache), shards, featurizer, fit)


def refit_routing(spec: DatasetSpec, cache: DataCache | None = None) -> KMeans | RoundRobin | None:
    """Fit a ``kmeans`` spec's routing again from its own source, featurizer and fit seeds
    (``cache``: where an object-store source's copies are kept).

    ``None`` when the spec cannot be verified this way (not ``kmeans``, or no fit metadata).
    """
    routing = spec.routing
    if not isinstance(routing, KMeans) or routing.fit is None or spec.route_field is None:
        return None
    return _fit_kmeans(
        spec.source,
        spec.split,
        field=spec.route_field,
        shards=spec.shards,
        featurizer=routing.featurizer,
        fit=routing.fit,
        cache=cache,
    )


def shard_of_rows(spec: DatasetSpec, dataset: Dataset | None) -> np.ndarray:
    """The shard of every row of the spec's split (``dataset`` is that split; only a
    ``kmeans`` routing on a field reads it)."""
    texts = None
    if isinstance(spec.routing, KMeans) and spec.route_field is not None:
        if dataset is None:
            raise ValueError("a kmeans routing on a field needs the split's rows")
        texts = _split_texts(dataset, spec.route_field)
    return assign(spec.routing, spec.shards, spec.n_rows, texts)


def shard_order(spec: DatasetSpec, dataset: Dataset, sample_ids: list[int]) -> list[int]:
    """``sample_ids`` shard by shard (stable within a shard): the order runs are enqueued in,
    so each message, and so each worker batch, draws on as few shards as possible."""
    import numpy as np

    ids = np.asarray(sample_ids, dtype=np.int64)
    return list(ids[np.argsort(shard_of_rows(spec, dataset)[ids], kind="stable")].tolist())


def resolve_source(
    data: str,
    split: str,
    revision: str | None = None,
    config: str | None = None,
    cache: DataCache | None = None,
) -> Source:
    """What ``--data`` names: a local file or folder (its split's files pinned by digest), an
    object or prefix on object storage (its split's objects pinned by stamp and digest, their
    copies left in ``cache``) or a Hub dataset."""
    root = local_root(data, revision, config)
    if root is not None:
        return _local_source(root, split)
    if is_remote(data):
        return remote_source(data, split, needed_cache(cache))
    return HubSource(repo_id=data, revision=revision, config=config)


def local_root(data: str, revision: str | None = None, config: str | None = None) -> Path | None:
    """The local file or folder ``data`` names, or None when it names an object-store URL or
    a Hub dataset; a path that does not exist, and Hub options given for a local file or a URL,
    are refused."""
    hub_options = revision is not None or config is not None
    if is_remote(data):
        if hub_options:
            raise DataError("--revision and --config apply to Hub datasets, not object storage")
        return None
    root = Path(data).expanduser()
    if root.exists():
        if hub_options:
            raise DataError("--revision and --config apply to Hub datasets, not local files")
        return root
    if _looks_like_path(data):
        raise DataError(f"no such file or folder: {data}")
    return None


def build_spec(
    data: str,
    split: str,
    revision: str | None = None,
    config: str | None = None,
    *,
    sharding: Sharding | None = None,
    cache: DataCache | None = None,
) -> tuple[DatasetSpec, Dataset]:
    """A spec of ``--data``'s ``split``; see :func:`spec_of`."""
    return spec_of(resolve_source(data, split, revision, config, cache), split, sharding, cache)


def spec_of(
    source: Source,
    split: str,
    sharding: Sharding | None = None,
    cache: DataCache | None = None,
) -> tuple[DatasetSpec, Dataset]:
    """A spec of ``split`` of ``source`` cut by ``sharding`` (fitting a k-means routing on a
    bounded stream), loading the split once to count rows (``cache``: where an object-store
    source's copies are kept)."""
    check_pinned(source)
    sharding = sharding or Sharding()
    dataset: Dataset = _load(source, split, cache)
    spec = DatasetSpec(
        source=source,
        split=split,
        n_rows=len(dataset),
        shards=sharding.shards,
        routing=_fit(source, split, sharding, cache),
        route_field=sharding.route_field if sharding.routing is RoutingKind.KMEANS else None,
    )
    return spec, dataset


def load_rows(spec: DatasetSpec, cache: DataCache | None = None) -> Dataset:
    """Rebuild a spec's split, checking local files against their pinned digests and objects
    against their stamps (``cache``: where an object-store source's copies are kept)."""
    check_pinned(spec.source)
    dataset: Dataset = _load(spec.source, spec.split, cache)
    if len(dataset) != spec.n_rows:
        raise SpecError(f"spec expects {spec.n_rows} rows, the source now has {len(dataset)}")
    return dataset
