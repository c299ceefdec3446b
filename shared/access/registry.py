"""The dataset registry: named datasets pinned to their source, in ``evalq:datasets``.

A registered dataset is a name (see :mod:`evalq.shared.names`), the source it was added from, and
each of its splits pinned: a local split by its files' sha256 digests, a split on object
storage by each object's ETag (or version id) and sha256, a Hub split by the commit its
revision resolved to. Tiers, budgets and audit entries attach to the name, and a
gateway caller can only evaluate registered datasets, never a path. One file content has one
owner split: registering a copy or a link of a file another split holds is refused, so no
second name can give a held-out split's rows another tier.
"""

from __future__ import annotations

import difflib
import time

import redis

from evalq.shared.access.dataset import RegisteredDataset
from evalq.shared.data.loading import local_root, local_splits
from evalq.shared.data.remote import DataCache, is_remote, needed_cache, remote_splits
from evalq.shared.data.spec import HubSource, Source
from evalq.shared.errors import (
    DataError,
    SourceUnreachableError,
    UnknownDatasetError,
    first_line,
)
from evalq.shared.keys import AUDIT, DATASET_FILES, DATASETS
from evalq.shared.names import check_name, is_name
from evalq.shared.store.scripts import register

__all__ = ["DatasetRegistry"]


def _hub_splits(repo: str, revision: str | None, config: str | None) -> dict[str, Source]:
    """A Hub dataset's splits, pinned to the commit ``revision`` (default: main) is now."""
    try:
        from datasets import get_dataset_split_names
        from huggingface_hub import HfApi

        commit = HfApi().dataset_info(repo, revision=revision).sha
        names = get_dataset_split_names(repo, config_name=config, revision=commit)
    except Exception as exc:
        raise SourceUnreachableError(f"cannot reach {repo} on the Hub: {first_line(exc)}") from exc
    return {str(split): HubSource(repo_id=repo, revision=commit, config=config) for split in names}


def _owners(name: str, splits: dict[str, Source]) -> dict[str, str]:
    """sha256 -> ``name/split`` of every local file and object; two splits holding one content
    (a link or a copy of the other's file) is a :class:`DataError`."""
    owners: dict[str, str] = {}
    for split, source in splits.items():
        for pinned in () if isinstance(source, HubSource) else source.files:
            owner = owners.setdefault(pinned.sha256, f"{name}/{split}")
            if owner != f"{name}/{split}":
                raise DataError(
                    f"splits {owner} and {name}/{split} hold files of the same content: "
                    "one content, one registered split"
                )
    return owners


def _pairs(owners: dict[str, str]) -> list[str]:
    return [part for digest, owner in owners.items() for part in (digest, owner)]


class DatasetRegistry:
    """Registered datasets in ``evalq:datasets``; owns ``add_dataset.lua``."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._add = register(client, "evalq.shared.access", "add_dataset", confirmed=True)

    def add(
        self,
        name: str,
        data: str,
        *,
        who: str,
        revision: str | None = None,
        config: str | None = None,
        data_cache: DataCache | None = None,
    ) -> tuple[RegisteredDataset, RegisteredDataset | None]:
        """Register ``data`` as ``name`` (or re-pin it), audited; return the record and the
        one it replaced (``data_cache``: where an object-store source's copies are kept). Every
        split name must follow the name rule."""
        check_name("dataset name", name)
        root = local_root(data, revision, config)
        splits: dict[str, Source]
        if root is not None:
            splits = dict(local_splits(root))
        elif is_remote(data):
            splits = dict(remote_splits(data, needed_cache(data_cache)))
        else:
            splits = _hub_splits(data, revision, config)
        for split in splits:
            check_name("split", split)
        record = RegisteredDataset(name=name, data=data, splits=splits, who=who, added=time.time())
        owners = _owners(name, splits)
        reply = self._add(
            keys=[DATASETS, DATASET_FILES, AUDIT],
            args=[name, record.model_dump_json(), who, time.time(), *_pairs(owners)],
        )
        if reply[0] == "taken":
            raise DataError(
                f"a file of {owners.get(reply[1], name)} has the same content as {reply[2]}: "
                "one content, one registered split (a copy under another name would get "
                "another tier)"
            )
        before = RegisteredDataset.model_validate_json(reply[1]) if reply[1] else None
        return record, before

    def get(self, name: str) -> RegisteredDataset | None:
        """The record of ``name``, or None when no dataset of that name is registered."""
        raw = self._client.hget(DATASETS, name)
        return None if raw is None else RegisteredDataset.model_validate_json(raw)

    def named(self, name: str, *, suggest: bool = False) -> RegisteredDataset:
        """The record of ``name``; :class:`UnknownDatasetError` (exit 2) when none is registered,
        with the closest registered name when ``suggest`` (an admin's or an operator's error:
        :func:`evalq.shared.access.policy.suggests_datasets`)."""
        record = self.get(name) if is_name(name) else None
        if record is None:
            hint = ""
            if suggest:
                close = difflib.get_close_matches(name, self.names(), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else " (evalq datasets list)"
            raise UnknownDatasetError(f"unknown dataset '{name}'{hint}")
        return record

    def check_split(self, name: str, split: str, *, suggest: bool = False) -> None:
        """Refuse (exit 2, one line) a dataset or a split nobody registered: tiers, budgets and
        policies attach only to registered splits."""
        self.named(name, suggest=suggest).source(split)  # one line naming its splits

    def names(self) -> list[str]:
        """Every registered dataset's name."""
        return sorted(str(name) for name in self._client.hkeys(DATASETS))

    def all(self) -> list[RegisteredDataset]:
        """Every registered dataset, by name."""
        raw = self._client.hgetall(DATASETS)
        return [RegisteredDataset.model_validate_json(raw[name]) for name in sorted(raw)]
