"""``evalq tasks``: language tasks written as YAML, and lm-evaluation-harness tasks,
registered under a name (``add``, admin; audited) and listed (``list``), as datasets are: a
caller names a task, never sends one."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from evalq.producer.clients.api import open_api
from evalq.shared.cli import JsonFlag, out, print_json
from evalq.shared.errors import InputError

__all__ = ["tasks_app"]

tasks_app = typer.Typer(
    help="Registered tasks: YAML language tasks (a prompt template, a target and a scorer) "
    "and lm-evaluation-harness tasks."
)


@tasks_app.command("add")
def tasks_add(  # noqa: PLR0917 - a typer command: its options are its parameters
    name: Annotated[str, typer.Argument(help="Task name (what evalq submit NAME names).")],
    file: Annotated[Path | None, typer.Option("--file", help="The task's YAML file.")] = None,
    lm_eval: Annotated[
        str | None,
        typer.Option(
            "--lm-eval",
            help="An lm-evaluation-harness task (its name in lm-eval, or in --include-path).",
        ),
    ] = None,
    include_path: Annotated[
        Path | None,
        typer.Option(help="A folder of lm-eval task YAML (and !function modules), searched first."),
    ] = None,
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
    """Register the task in FILE, or lm-eval's task --lm-eval TASK, under NAME (or replace
    it; runs keep the task they began with); audited. A YAML task's scorer and options are
    checked where it is registered (the gateway, or here in direct mode); with --dataset and
    --split, also every row of that split: the prompt's and choices' fields, and each target
    against the scorer (a number for numeric). A submit checks the same on the split it runs
    on, before charging anything. An lm-eval task is resolved by lm-eval's own TaskManager
    where it is registered (needs pip install 'evalq[lm-eval]' there), and its config and every
    file it is made of are pinned by sha256: a file changed since is refused where it is
    loaded."""
    if (file is None) == (lm_eval is None):
        raise InputError("give --file (a YAML task) or --lm-eval TASK, not both or neither")
    if lm_eval is not None:
        if dataset is not None or split is not None:
            raise InputError("an lm-eval task is checked against its split at submit")
        folder = None if include_path is None else str(include_path.resolve())
        added = open_api().add_lm_eval_task(name, lm_eval, include_path=folder)
    else:
        if include_path is not None:
            raise InputError("--include-path is for --lm-eval tasks")
        assert file is not None
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read task file {file}: {exc}") from None
        added = open_api().add_task(name, text, dataset=dataset, split=split)
    if as_json:
        print_json(added.model_dump(mode="json"))
        return
    from evalq.shared.lm.harness import HarnessSpec

    spec = added.spec
    if isinstance(spec, HarnessSpec):
        described = f"lm-eval {spec.lm_eval}, {spec.output_type}, metrics {', '.join(spec.metrics)}"
    else:
        kind = "multiple choice" if spec.choices is not None else "generation"
        described = f"{kind}, scorer {spec.scorer}"
    out.print(f"registered task {added.name}: {described}", highlight=False)


@tasks_app.command("list")
def tasks_list(as_json: JsonFlag = False) -> None:
    """List registered tasks: each one's kind, output type, metrics (scorer) and few-shot
    (``--json``: each one's whole spec, its target too)."""
    found = open_api().tasks()
    if as_json:
        print_json([task.model_dump(mode="json") for task in found])
        return
    from evalq.shared.lm.harness import HarnessSpec

    table = Table("task", "kind", "output", "metrics", "few-shot", "digest")
    for column in table.columns:  # a narrow terminal folds a long name, never cuts it
        column.overflow = "fold"
    for task in found:
        spec = task.spec
        if isinstance(spec, HarnessSpec):
            output, metrics = spec.output_type, ", ".join(spec.metrics)
            shots = f"{spec.num_fewshot or 0} from {spec.fewshot_split or '-'}"
        else:
            output = "choices" if spec.choices is not None else "generate"
            metrics = spec.scorer
            shots = f"{spec.fewshot.n} from {spec.fewshot.split}" if spec.fewshot else "-"
        table.add_row(task.name, task.kind, output, metrics, shots, task.digest[:12])
    out.print(table)
