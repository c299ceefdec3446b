"""``evalq tasks``: language tasks written as YAML, registered under a name (``add``, admin;
audited) and listed (``list``), as datasets are: a caller names a task, never sends one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from evalq.producer.clients.api import open_api
from evalq.shared.cli import JsonFlag, out, print_json
from evalq.shared.errors import InputError

__all__ = ["tasks_app"]

tasks_app = typer.Typer(help="Language tasks (YAML): a prompt template, a target and a scorer.")


@tasks_app.command("add")
def tasks_add(
    name: Annotated[str, typer.Argument(help="Task name (what evalq submit NAME names).")],
    file: Annotated[Path, typer.Option("--file", help="The task's YAML file.")],
    dataset: Annotated[
        str | None,
        typer.Option(help="A registered dataset whose --split the task is checked against."),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(help="The split: its columns feed the prompt, its targets the scorer."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Register the task in FILE under NAME (or replace it; runs keep the task they began
    with); audited. Its scorer and options are checked where it is registered (the gateway,
    or here in direct mode); with --dataset and --split, also every row of that split: the
    prompt's and choices' fields, and each target against the scorer (a number for
    numeric). A submit checks the same on the split it runs on, before charging anything."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read task file {file}: {exc}") from None
    added = open_api().add_task(name, text, dataset=dataset, split=split)
    if as_json:
        print_json(added.model_dump(mode="json"))
        return
    kind = "multiple choice" if added.spec.choices is not None else "generation"
    out.print(f"registered task {added.name}: {kind}, scorer {added.spec.scorer}", highlight=False)


@tasks_app.command("list")
def tasks_list(as_json: JsonFlag = False) -> None:
    """List registered tasks."""
    found = open_api().tasks()
    if as_json:
        print_json([task.model_dump(mode="json") for task in found])
        return
    table = Table("task", "kind", "scorer", "target", "few-shot", "digest")
    for task in found:
        spec = task.spec
        kind = "choices" if spec.choices is not None else "generate"
        shots = f"{spec.fewshot.n} from {spec.fewshot.split}" if spec.fewshot else "-"
        table.add_row(task.name, kind, spec.scorer, spec.target, shots, task.digest[:12])
    out.print(table)
