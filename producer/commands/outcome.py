"""How the producer's commands show a run's outcome: follow it to its end (``watch``, ``submit
--follow``, ``rescore --follow``), then its status and each metric with its interval, failures
and how it was released."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evalq.shared.cli import err, out, print_json
from evalq.shared.errors import DetachedError

if TYPE_CHECKING:  # the views load numpy and scipy (their intervals): only a command that shows one
    from evalq.producer.clients.remote import RemoteClient
    from evalq.producer.service.views import RunView

__all__ = ["follow_and_report", "metric_text"]


def follow_and_report(client: RemoteClient, run_id: str, as_json: bool) -> None:
    """Follow the run to its end and print its outcome; exit code 4 (``RunNotCompletedError``)
    when it ended failed or cancelled."""
    from evalq.producer.reports.follow import follow

    try:
        follow(client, run_id, err if as_json else out)
    except KeyboardInterrupt:
        raise DetachedError(run_id) from None
    view = client.status(run_id)
    if as_json:
        print_json(
            {
                "run_id": run_id,
                "status": view.meta.status,
                "aggregate": view.aggregate,
                "withheld": view.withheld,
                "release": None if view.release is None else view.release.model_dump(),
                "stats": {k: v.model_dump(mode="json") for k, v in (view.stats or {}).items()}
                or None,
            }
        )
        client.ended(run_id)
        return
    out.print(f"{run_id} {view.meta.status}")
    for name, value in sorted((view.aggregate or {}).items()):
        out.print(f"  {name}: {metric_text(view, name, value)}")
    if view.withheld:
        out.print(f"  aggregate withheld: {view.withheld}")
    client.ended(run_id)


def metric_text(view: RunView, name: str, value: float) -> str:
    """``0.8520 ± 0.0159 (95% CI 0.8190-0.8800, n 500, 24 failed: infer/RuntimeError)``, as
    far as the view has them (``skipped`` instead of ``failed`` when the evaluation leaves
    failed samples out), then how it was released when not exactly."""
    text = f"{value:.4f}"
    stat = (view.stats or {}).get(name)
    notes: list[str] = []
    if stat is not None:
        if stat.stderr is not None:
            text += f" ± {stat.stderr:.4f}"
        if stat.ci95 is not None:
            notes.append(f"95% CI {stat.ci95[0]:.4f}-{stat.ci95[1]:.4f}")
        if notes or stat.failed:
            notes.append(f"n {stat.n}")
        if stat.failed:
            notes.append(_failures(stat.failed, "skipped" if stat.skipped else "failed"))
    if notes:
        text += f" ({', '.join(notes)})"
    return text + _released(view, name)


def _failures(failed: dict[str, int], verb: str) -> str:
    """``24 failed: infer/RuntimeError``, or ``24 failed: 20 infer/RuntimeError, 4 score``."""
    total = sum(failed.values())
    if len(failed) == 1:
        return f"{total} {verb}: {next(iter(failed))}"
    return f"{total} {verb}: " + ", ".join(f"{count} {kind}" for kind, count in failed.items())


def _released(view: RunView, metric: str) -> str:
    """`` (released by <rule>: <why>)`` after a metric that is not shown exactly."""
    if view.release is None:
        return ""
    return f" (released by {view.release.rule}: {view.release.why.get(metric, '')})"
