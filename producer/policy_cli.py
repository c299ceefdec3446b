"""The operator's policy commands of ``evalq``: ``tiers``, ``budget`` and ``policy``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from producer.client import Client
from shared.cli import JsonFlag, err, out, print_json
from shared.ledger import Budget
from shared.policy import Tier
from shared.settings import get_settings

__all__ = ["register"]


def _client() -> Client:
    return Client(get_settings())


tiers_app = typer.Typer(help="Split tiers: viewable, non_viewable (aggregates only), no_access.")
budget_app = typer.Typer(help="Per-split budgets of runs and samples.")
policy_app = typer.Typer(help="Tiers and budgets from a file.")


@tiers_app.command("set")
def tiers_set(
    dataset: Annotated[str, typer.Argument()],
    split: Annotated[str, typer.Argument()],
    tier: Annotated[Tier, typer.Argument(case_sensitive=False)],
) -> None:
    """Set a split's tier (audited)."""
    before = _client().set_tier(dataset, split, tier)
    out.print(f"{dataset}/{split}: {before or 'unlisted'} -> {tier}")


@tiers_app.command("list")
def tiers_list(as_json: JsonFlag = False) -> None:
    """List every listed split's tier (unlisted splits are no_access)."""
    listed = _client().tiers()
    if as_json:
        print_json({d: {s: t.value for s, t in splits.items()} for d, splits in listed.items()})
        return
    table = Table("dataset", "split", "tier")
    for dataset, splits in listed.items():
        for split, tier in sorted(splits.items()):
            table.add_row(dataset, split, tier)
    out.print(table)


@budget_app.command("set")
def budget_set(
    dataset: Annotated[str, typer.Argument()],
    split: Annotated[str, typer.Argument()],
    runs_total: Annotated[int | None, typer.Option("--runs", min=0, help="Runs in all.")] = None,
    samples: Annotated[int | None, typer.Option(min=0, help="Samples in all.")] = None,
    max_samples_per_run: Annotated[
        int | None, typer.Option(min=1, help="Most samples in one run.")
    ] = None,
) -> None:
    """Set a split's budget totals (unset = unlimited); what was used is kept (audited)."""
    budget = _client().set_budget(
        dataset, split, runs=runs_total, samples=samples, max_samples_per_run=max_samples_per_run
    )
    out.print(f"{dataset}/{split}: " + _budget_line(budget))


def _budget_line(budget: Budget) -> str:
    def part(name: str, left: int | None, total: int | None) -> str:
        return f"{name} unlimited" if total is None else f"{name} {left}/{total} left"

    cap = budget.max_samples_per_run
    return ", ".join(
        [
            part("runs", budget.runs_left, budget.runs_total),
            part("samples", budget.samples_left, budget.samples_total),
            f"max per run {cap if cap is not None else 'unlimited'}",
        ]
    )


@budget_app.command("show")
def budget_show(as_json: JsonFlag = False) -> None:
    """Show every budget: totals, used and left."""
    budgets = _client().budgets()
    if as_json:
        print_json([b.summary() for b in budgets])
        return
    table = Table("dataset", "split", "budget")
    for budget in budgets:
        table.add_row(budget.dataset, budget.split, _budget_line(budget))
    out.print(table)


@policy_app.command("apply")
def policy_apply(path: Annotated[Path, typer.Argument(metavar="FILE")]) -> None:
    """Apply tiers and budgets from a YAML or JSON file (checked whole before anything is set)."""
    from producer.policy_file import load_policy

    policy = load_policy(path)
    for warning in _client().apply_policy(policy):
        err.print(Text.assemble(("warning:", "yellow"), " ", warning), highlight=False)
    splits = sum(len(s) for s in policy.datasets.values())
    out.print(f"applied {path}: {splits} splits")


def register(app: typer.Typer) -> None:
    """Add ``tiers``, ``budget`` and ``policy`` to the ``evalq`` app."""
    app.add_typer(tiers_app, name="tiers")
    app.add_typer(budget_app, name="budget")
    app.add_typer(policy_app, name="policy")
