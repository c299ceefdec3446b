"""The admin commands of ``evalq``: ``datasets``, ``tiers``, ``budget``, ``policy``, ``tokens``
and ``audit``; through the gateway (``EVALQ_API_URL``) they need an admin token, in direct mode
(the Redis URL) they are the operator's."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from evalq.producer.clients.api import open_api
from evalq.shared.choices import Role, Tier
from evalq.shared.cli import JsonFlag, err, out, print_json
from evalq.shared.names import NAME_RULE

if TYPE_CHECKING:
    from evalq.shared.access.budget import Budget

__all__ = ["register"]


tiers_app = typer.Typer(help="Split tiers: viewable, non_viewable (aggregates only), no_access.")
budget_app = typer.Typer(help="Per-split budgets of runs, samples and tokens.")
policy_app = typer.Typer(help="Tiers and budgets from a file.")
datasets_app = typer.Typer(help="Registered datasets: tiers and budgets attach to their names.")
tokens_app = typer.Typer(help="API tokens of the gateway (evalq serve).")


@datasets_app.command("add")
def datasets_add(
    name: Annotated[str, typer.Argument(help=f"Dataset name ({NAME_RULE}).")],
    data: Annotated[
        str, typer.Option(help="Local file/folder, URL (s3://bucket/prefix/) or Hub dataset id.")
    ],
    revision: Annotated[str | None, typer.Option(help="Hub revision to pin.")] = None,
    config: Annotated[str | None, typer.Option(help="Hub dataset configuration.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Register a dataset under NAME, each split pinned (file sha256s, object ETags and sha256s,
    Hub commit); audited."""
    added = open_api().add_dataset(name, data, revision=revision, config=config)
    if as_json:
        print_json(added.model_dump(mode="json"))
        return
    out.print(f"registered {added.name}: {', '.join(added.splits)} (from {added.data})")


@datasets_app.command("list")
def datasets_list(as_json: JsonFlag = False) -> None:
    """List registered datasets, their splits and each split's tier."""
    client = open_api()
    found, tiers = client.datasets(), client.tiers()
    if as_json:
        print_json([d.model_dump(mode="json") for d in found])
        return
    table = Table("dataset", "split", "tier", "source")
    for dataset in found:
        for split in dataset.splits:
            tier = tiers.get(dataset.name, {}).get(split, Tier.NO_ACCESS)
            table.add_row(dataset.name, split, tier, dataset.data or "(admins only)")
    out.print(table)


@tokens_app.command("create")
def tokens_create(
    principal: Annotated[str, typer.Argument(help=f"Who the token stands for ({NAME_RULE}).")],
    role: Annotated[Role, typer.Option(case_sensitive=False, help="admin or user.")],
    as_json: JsonFlag = False,
) -> None:
    """Create a token and print it once (only its sha256 is stored); audited."""
    token = open_api().create_token(principal, role)
    if as_json:
        print_json({"principal": principal, "role": role.value, "token": token})
        return
    out.print(token, highlight=False)


@tokens_app.command("list")
def tokens_list(as_json: JsonFlag = False) -> None:
    """List live tokens' principals and roles (never the tokens)."""
    records = open_api().tokens()
    if as_json:
        print_json([r.model_dump(mode="json") for r in records])
        return
    table = Table("principal", "role", "created", "by")
    for record in records:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.created))
        table.add_row(record.principal, record.role, created, record.who)
    out.print(table)


@tokens_app.command("revoke")
def tokens_revoke(principal: Annotated[str, typer.Argument()], as_json: JsonFlag = False) -> None:
    """Revoke every token of PRINCIPAL; audited."""
    revoked = open_api().revoke_tokens(principal)
    if as_json:
        print_json({"principal": principal, "revoked": revoked})
        return
    out.print(f"revoked {revoked} token(s) of {principal}")


def audit(
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="Newest entries to show.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Show the newest audit entries: reservations, refunds, tier, budget, dataset and token
    changes, admin bypasses and refusals."""
    entries = open_api().audit(limit)
    if as_json:
        print_json(entries)
        return
    table = Table("at", "action", "who", "dataset", "split", "run", "after", box=None)
    for entry in entries:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(entry.get("at", 0))))
        table.add_row(
            at,
            entry.get("action", ""),
            entry.get("who", ""),
            entry.get("dataset", ""),
            entry.get("split", ""),
            entry.get("run", ""),
            entry.get("after", ""),
        )
    out.print(table)


@tiers_app.command("set")
def tiers_set(
    dataset: Annotated[str, typer.Argument()],
    split: Annotated[str, typer.Argument()],
    tier: Annotated[Tier, typer.Argument(case_sensitive=False)],
) -> None:
    """Set a registered split's tier (audited); a dataset or split nobody registered is
    refused."""
    from evalq.shared.access.policy import stored_tier

    before = open_api().set_tier(dataset, split, tier)
    out.print(f"{dataset}/{split}: {stored_tier(before)} -> {tier}")


@tiers_app.command("list")
def tiers_list(as_json: JsonFlag = False) -> None:
    """List every registered split's tier (no_access until one is set)."""
    listed = open_api().tiers()
    if as_json:
        print_json({d: {s: t.value for s, t in splits.items()} for d, splits in listed.items()})
        return
    table = Table("dataset", "split", "tier")
    for dataset, splits in listed.items():
        for split, tier in sorted(splits.items()):
            table.add_row(dataset, split, tier)
    out.print(table)


@budget_app.command("set")
def budget_set(  # noqa: PLR0917 - a typer command: its options are its parameters
    dataset: Annotated[str, typer.Argument()],
    split: Annotated[str, typer.Argument()],
    runs_total: Annotated[int | None, typer.Option("--runs", min=0, help="Runs in all.")] = None,
    samples: Annotated[int | None, typer.Option(min=0, help="Samples in all.")] = None,
    max_samples_per_run: Annotated[
        int | None, typer.Option(min=1, help="Most samples in one run.")
    ] = None,
    tokens: Annotated[
        int | None,
        typer.Option(min=0, help="Tokens of endpoint models' requests in all (prompt + output)."),
    ] = None,
    principal: Annotated[
        str | None, typer.Option(help="Meter this caller on the split, apart from the others.")
    ] = None,
) -> None:
    """Set a split's budget totals, or one principal's own on it (unset = unlimited); what was
    used is kept (audited)."""
    budget = open_api().set_budget(
        dataset,
        split,
        runs=runs_total,
        samples=samples,
        max_samples_per_run=max_samples_per_run,
        caller=principal,
        tokens=tokens,
    )
    out.print(f"{_where(budget)}: " + _budget_line(budget))


def _where(budget: Budget) -> str:
    where = f"{budget.dataset}/{budget.split}"
    return where if budget.caller is None else f"{where} for {budget.caller}"


def _budget_line(budget: Budget) -> str:
    def part(name: str, left: int | None, total: int | None) -> str:
        return f"{name} unlimited" if total is None else f"{name} {left}/{total} left"

    cap = budget.max_samples_per_run
    parts = [
        part("runs", budget.runs_left, budget.runs_total),
        part("samples", budget.samples_left, budget.samples_total),
    ]
    if budget.tokens_total is not None or budget.tokens_used:  # a budget that meters tokens
        used = f" ({budget.tokens_used} used)" if budget.tokens_used else ""
        parts.append(part("tokens", budget.tokens_left, budget.tokens_total) + used)
    return ", ".join([*parts, f"max per run {cap if cap is not None else 'unlimited'}"])


@budget_app.command("show")
def budget_show(as_json: JsonFlag = False) -> None:
    """Show every budget: totals, used and left."""
    budgets = open_api().budgets()
    if as_json:
        print_json([b.summary() for b in budgets])
        return
    table = Table("dataset", "split", "principal", "budget")
    for budget in budgets:
        table.add_row(budget.dataset, budget.split, budget.caller or "(all)", _budget_line(budget))
    out.print(table)


@policy_app.command("apply")
def policy_apply(path: Annotated[Path, typer.Argument(metavar="FILE")]) -> None:
    """Apply tiers and budgets from a YAML or JSON file (checked whole before anything is set)."""
    from evalq.producer.service.policy_file import load_policy

    policy = load_policy(path)
    for warning in open_api().apply_policy(policy):
        err.print(Text.assemble(("warning:", "yellow"), " ", warning), highlight=False)
    splits = sum(len(s) for s in policy.datasets.values())
    out.print(f"applied {path}: {splits} splits")


def register(app: typer.Typer) -> None:
    """Add the admin commands to the ``evalq`` app."""
    app.add_typer(tiers_app, name="tiers")
    app.add_typer(budget_app, name="budget")
    app.add_typer(policy_app, name="policy")
    app.add_typer(datasets_app, name="datasets")
    app.add_typer(tokens_app, name="tokens")
    app.command()(audit)
