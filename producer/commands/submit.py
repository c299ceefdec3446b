"""``evalq submit``: an evaluation, or a sweep's grid of them (each point checked before any is
submitted)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from evalq.producer.clients.api import open_api
from evalq.producer.commands.outcome import follow_and_report
from evalq.shared.choices import MAX_SPEC_SHARDS, Priority, RoutingKind
from evalq.shared.cli import AdminFlag, JsonFlag, err, out, print_json
from evalq.shared.errors import EvalqError, InputError

if TYPE_CHECKING:
    from evalq.producer.clients.remote import RemoteClient
    from evalq.producer.service.submit import SubmitRequest

__all__ = ["submit_command"]


def submit_command(  # noqa: PLR0913, PLR0917 - a typer command: its options are its parameters
    eval_name: Annotated[str, typer.Argument(metavar="EVAL", help="Registered evaluation.")],
    split: Annotated[str, typer.Option(help="Split to evaluate.")],
    dataset: Annotated[
        str | None, typer.Option(help="Registered dataset (evalq datasets list).")
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(help="Unregistered local file/folder, URL or Hub id (operators and admins)."),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Evaluate the first N samples.")] = None,
    ids: Annotated[str | None, typer.Option(help="Comma-separated sample ids.")] = None,
    num_fewshot: Annotated[
        int | None,
        typer.Option(
            min=0, help="Few-shot examples per prompt (lm-eval tasks; default: its config's)."
        ),
    ] = None,
    param: Annotated[
        list[str] | None, typer.Option(help="Eval parameter k=v (repeatable).")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="The model a registered task runs on: hf/<folder or Hub id>[@rev] or "
            "openai/<name> (with --model-arg base_url=…)."
        ),
    ] = None,
    model_arg: Annotated[
        list[str] | None,
        typer.Option(
            help="Model argument k=v (repeatable): dtype, batch_size (hf/); base_url, "
            "api_key_env, concurrency, timeout, max_retries (openai/)."
        ),
    ] = None,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache", help="Answer from the fleet's response cache where it can (openai/ models)."
        ),
    ] = False,
    revision: Annotated[str | None, typer.Option(help="Hub revision of --data.")] = None,
    config: Annotated[str | None, typer.Option(help="Hub configuration of --data.")] = None,
    shards: Annotated[
        int, typer.Option(min=1, max=MAX_SPEC_SHARDS, help="Shards to cut the split into.")
    ] = 1,
    routing: Annotated[
        RoutingKind, typer.Option(help="Which shard each row goes to.")
    ] = RoutingKind.CONTIGUOUS,
    route_field: Annotated[str, typer.Option(help="Text field kmeans routes by.")] = "text",
    router_sample: Annotated[
        int, typer.Option(min=1, help="Texts the kmeans fit reads (bounds its memory).")
    ] = 1000,
    router_seed: Annotated[
        int, typer.Option(min=0, help="Seed of the kmeans featurizer and initialisation.")
    ] = 0,
    priority: Annotated[
        Priority | None,
        typer.Option(help="Share of the workers against your other runs (default: the policy's)."),
    ] = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(help="Sweep a parameter: k=v1,v2 (repeatable; submits the grid)."),
    ] = None,
    sweep_file: Annotated[
        Path | None, typer.Option(help="YAML mapping of parameter -> values to sweep.")
    ] = None,
    tag: Annotated[list[str] | None, typer.Option(help="Label the run(s) (repeatable).")] = None,
    follow_run: Annotated[bool, typer.Option("--follow", help="Show progress until done.")] = False,
    admin: AdminFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Submit an evaluation (or a sweep's grid of them); prints the run id(s)."""
    from evalq.producer.service.submit import SubmitRequest, parse_ids, parse_params
    from evalq.producer.service.sweep import grid, new_sweep_id, parse_sweeps, read_sweep_file
    from evalq.shared.data.loading import Sharding
    from evalq.shared.models import Progress

    sweeps = parse_sweeps(sweep or [])
    if sweep_file is not None:
        for key, values in read_sweep_file(sweep_file).items():
            if key in sweeps:
                raise InputError(f"--sweep {key} is also in {sweep_file}")
            sweeps[key] = values
    request = SubmitRequest(
        eval=eval_name,
        dataset=dataset,
        data=data,
        split=split,
        limit=limit,
        num_fewshot=num_fewshot,
        ids=tuple(parse_ids(ids)) if ids is not None else None,
        params=parse_params(param or []),
        model=model,
        model_args=parse_params(model_arg or [], "--model-arg"),
        cache=cache,
        revision=revision,
        config=config,
        sharding=Sharding(
            shards=shards,
            routing=routing,
            route_field=route_field,
            sample_size=router_sample,
            seed=router_seed,
        ),
        priority=priority,
        tags=tuple(tag or ()),
    )
    client = open_api(admin=admin)
    if sweeps:
        if follow_run:
            raise InputError(
                "--follow follows one run; watch a sweep with evalq runs --sweep ID or "
                "evalq watch RUN"
            )
        sweep_id = new_sweep_id()
        points = [
            point(request, params, sweep_id, models="model" in sweeps)
            for params in grid(request.params, sweeps)
        ]
        _submit_sweep(client, points, as_json)
        return
    meta = client.submit(request)
    if as_json:
        print_json({"run_id": meta.run_id})
    else:
        out.print(meta.run_id, highlight=False)
    view = client.status(meta.run_id)
    if view.stale_code:
        err.print(f"warning: {view.stale_code}", highlight=False, soft_wrap=True)
    waiting = client.stalled(meta, Progress())
    if waiting:
        err.print(f"warning: {waiting}; the run waits until one does", highlight=False)
    if follow_run:
        follow_and_report(client, meta.run_id, as_json)


def point(
    request: SubmitRequest, params: dict[str, str], sweep: str, *, models: bool
) -> SubmitRequest:
    """One point of a sweep: ``params``; with ``models`` (``--sweep model=…``: a sweep over
    checkpoints) their ``model`` is the point's ``--model``, not a parameter."""
    fields = {**request.model_dump(), "params": dict(params), "sweep": sweep}
    if models:
        fields["model"] = fields["params"].pop("model")
    return type(request).model_validate(fields)


def _submit_sweep(client: RemoteClient, points: list[SubmitRequest], as_json: bool) -> None:
    """Submit one run per point of a sweep's grid (they share the sweep id). Every point is
    checked before any is submitted; a refusal midway stops the sweep there, and the runs
    submitted before it stand: listed on stdout (``--json``: with the error) before the
    error."""
    client.check_params(points)
    sweep = str(points[0].sweep)
    submitted: list[str] = []
    try:
        for each in points:
            submitted.append(client.submit(each).run_id)
    except EvalqError as exc:
        if as_json:
            print_json({"sweep": sweep, "run_ids": submitted, "error": str(exc)})
        elif submitted:
            _print_sweep(sweep, submitted, points, f" of {len(points)} before this refusal")
        raise
    if as_json:
        print_json({"sweep": sweep, "run_ids": submitted})
        return
    _print_sweep(sweep, submitted, points)


def _print_sweep(
    sweep: str, submitted: list[str], points: list[SubmitRequest], note: str = ""
) -> None:
    out.print(f"sweep {sweep}: {len(submitted)} runs{note}", highlight=False)
    for run_id, each in zip(submitted, points, strict=False):
        shown = {**each.params, **({"model": each.model} if each.model is not None else {})}
        text = " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        out.print(f"{run_id}  {text}", highlight=False)
