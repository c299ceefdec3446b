"""Output that fits (#44, findings 8 and 10): ``runs`` and ``compare`` at 80 columns and into a
pipe, and ``--follow``'s live bar and plain lines, show every number whole; a CSV cell holds a
string output as its text. (What ``evalq --help``, a usage error and a read through the gateway
import is ``tests/test_layout.py``'s, which needs no Redis.)"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys

import pytest
from rich.console import Console

from evalq.producer.reports.follow import RunBar, follow
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.models import Progress, RunMeta, RunStatus
from tests.conftest import Stack
from tests.helpers import (
    REPO,
    cli_env,
    evalq_in_process,
    labelled_rows,
    list_splits,
    wait_completed,
    write_rows,
)
from tests.plugins import WORDS, predict

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def board(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    """Three completed runs on one split, newest last: the spy, and the worded evaluation
    twice, with params and tags as a sweep's runs carry them."""
    folder = tmp_path_factory.mktemp("fit")
    write_rows(folder, "validation", labelled_rows(120))
    name = list_splits(stack.client, str(folder), "validation")
    client = Client(stack.settings)
    requests = [
        SubmitRequest(eval="worded", dataset=name, split="validation"),
        SubmitRequest(
            eval="worded", dataset=name, split="validation", tags=("sweep-a", "nightly"),
            params={"prompt": "few-shot-with-reasons", "temperature": "0.7"},
        ),
        SubmitRequest(eval="worded", dataset=name, split="validation", limit=100,
                      params={"prompt": "zero-shot"}),
    ]  # fmt: skip
    run_ids = []
    for request in requests:
        run_ids.append(client.submit(request).run_id)
        wait_completed(stack.client, run_ids[-1])
    return name, run_ids


def _cli(url: str, *args: str, **env: str) -> str:
    """The real ``evalq`` in a subprocess, its stdout a pipe (no ``COLUMNS`` unless given)."""
    environment = cli_env(url, **env)
    if "COLUMNS" not in env:
        environment.pop("COLUMNS", None)
    done = subprocess.run(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()", *args],
        env=environment, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


NUMBER = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?(?:e[+-]\d+)?(?![\w])")


def _numbers(text: str, *known: str) -> list[str]:
    """Every number printed in ``text``, once the ``known`` strings (ids, names) are out."""
    for word in sorted(known, key=len, reverse=True):
        text = text.replace(word, " ")
    return NUMBER.findall(text.replace("95%", " "))


def test_runs_and_compare_show_every_number_whole(stack: Stack, board: tuple[str, list[str]]):
    """At ``COLUMNS=80`` and into a pipe: no cell cut with an ellipsis, and every number
    printed is one of the JSON output's, whole; the ids and the numbers that matter most (done
    and n, each metric's value, mean, delta, p) are all there."""
    url = stack.server.url
    name, run_ids = board
    listed = json.loads(evalq_in_process(url, "runs", "--limit", "3", "--json").stdout)
    assert [r["run_id"] for r in listed] == run_ids[::-1]
    params = {str(v) for r in listed for v in r["params"].values() if NUMBER.fullmatch(str(v))}
    runs_numbers = set(params)
    for r in listed:
        runs_numbers |= {str(r["n"]), str(r["progress"]["inferred"])}
        runs_numbers |= {f"{v:.4f}" for v in r["aggregate"].values()}
    compared = json.loads(evalq_in_process(url, "compare", *run_ids, "--json").stdout)
    compare_numbers = set(params)
    essential: set[str] = set()
    for metric, runs in compared["stats"].items():
        for stat in runs.values():
            essential.add(f"{stat['mean']:.4f}")
            compare_numbers |= {f"{stat['mean']:.4f}", str(stat["n"])}
            compare_numbers |= {f"{x:.4f}" for x in stat.get("ci95") or ()}
        for delta in compared["metrics"][metric].values():
            essential |= {f"{delta['delta']:+.4f}", f"{delta['p_value']:.3g}"}
            compare_numbers |= {f"{delta['delta']:+.4f}", f"{delta['p_value']:.3g}"}
            compare_numbers |= {f"{x:+.4f}" for x in delta["ci95"] or ()}
            compare_numbers |= {str(delta["n_paired"]), f"+{delta['flips'][0]}"}
            compare_numbers.add(f"-{delta['flips'][1]}")
    known = [*run_ids, name, "worded", "exact_match", "sweep-a", "nightly", "few-shot-with-reasons"]
    known += ["zero-shot"]
    for env in ({"COLUMNS": "80"}, {}):
        shown = _cli(url, "runs", "--limit", "3", **env)
        assert "…" not in shown, shown
        lines = shown.splitlines()
        for r in listed:  # each run's id, status, counts and metric on its first line
            (line,) = [line for line in lines if line.startswith(r["run_id"])]
            assert f"{r['progress']['inferred']}/{r['n']}" in line.split(), shown
        printed = _numbers(shown, *known)
        assert set(printed) <= runs_numbers, (printed, runs_numbers, shown)
        assert {f"{r['aggregate']['exact_match']:.4f}" for r in listed} <= set(printed), shown

        shown = _cli(url, "compare", *run_ids, **env)
        assert "…" not in shown, shown
        printed = _numbers(shown, *known)
        assert set(printed) <= compare_numbers, (printed, compare_numbers, shown)
        assert essential <= set(printed), (essential, shown)
        if not env:  # a pipe without COLUMNS: one line a row, nothing left out
            assert len(shown.splitlines()) == 2 + 3 + 2, shown  # title, header, rows, params
            assert compare_numbers <= set(printed), shown
        else:
            assert max(len(line) for line in shown.splitlines()) <= 80, shown


@pytest.mark.parametrize("width", [80, 60, 40])
@pytest.mark.parametrize("stalled", [None, "no live worker for 12 s"])
def test_the_live_bar_shows_every_number_whole(width: int, stalled: str | None) -> None:
    """``--follow``'s bar on a terminal of ``width`` columns, for a run of 1000/1000 with
    failures and a rate: the counts, inferred, failed and the rate each whole (no ellipsis, no
    line past the width); what does not fit (the bar's graphic first) is left out, not cut."""
    meta = RunMeta(
        run_id="0123abcd", eval="worded", spec="spec", dataset_id="data", split="validation",
        n=1000, status=RunStatus.RUNNING, created=1_000_000.0,
    )  # fmt: skip
    console = Console(width=width, file=io.StringIO(), force_terminal=True, record=True)
    bar = RunBar(meta, console)
    bar.show(meta, Progress(inferred=1000, scored=963, failed=37), stalled, now=meta.created + 0.8)
    console.print(bar.get_renderable())
    shown = console.export_text()
    assert "…" not in shown, shown
    assert max(len(line) for line in shown.splitlines()) <= width, shown
    words = shown.split()
    for number in ("1000/1000", "1000", "37", "1,250.0"):  # 1000 in 0.8 s: 1,250.0 samples/s
        assert number in words, (number, shown)
    if stalled:
        assert f"stalled: {stalled}" in " ".join(words), shown


def test_the_plain_progress_lines_are_never_cut(stack: Stack, board: tuple[str, list[str]]):
    """Into a file or a pipe, ``--follow`` prints its plain line whole however narrow the
    console: one line, every number in it."""
    _, run_ids = board
    client = Client(stack.settings)
    view = client.status(run_ids[0])
    n, counts = view.meta.n, view.progress
    for width in (40, 80):
        console = Console(width=width, file=io.StringIO())
        follow(client, run_ids[0], console)
        shown = console.file.getvalue()  # type: ignore[attr-defined]
        assert "…" not in shown, shown
        (line,) = shown.splitlines()
        assert re.fullmatch(
            rf"{run_ids[0]} worded validation: {counts.done}/{n} settled \(100%\), "
            rf"inferred {counts.inferred}, failed {counts.failed}, [\d,]+\.\d samples/s, "
            "completed",
            line,
        ), line


def test_a_csv_cell_holds_a_string_output_as_its_text(stack: Stack, board: tuple[str, list[str]]):
    """A string output is its text in CSV (``two``, where it came out ``\"\"\"two\"\"\"``),
    from the store's tables and from the results with their inputs alike."""
    url = stack.server.url
    run_id = board[1][0]
    lines = evalq_in_process(url, "results", run_id).stdout.splitlines()
    outputs = {str(line["sample_id"]): line["output"] for line in map(json.loads, lines)}
    assert len(outputs) == 120
    assert set(outputs.values()) <= set(WORDS)
    for flags in ((), ("--with-input",)):
        text = _cli(url, "results", run_id, "--format", "csv", *flags)
        assert '"' not in text, text[:300]
        rows = list(csv.DictReader(io.StringIO(text)))
        assert {row["sample_id"]: row["output"] for row in rows} == outputs
        if flags:
            assert all(row["output"] == WORDS[predict(row["input.text"])] for row in rows)


def test_a_csv_cell_keeps_other_outputs_as_json_text() -> None:
    from evalq.producer.reports.export import csv_output

    assert csv_output('"two"') == "two"
    assert csv_output('"[1, 2]"') == "[1, 2]"  # a string that reads as JSON reads as such
    assert csv_output('"say \\"hi\\"\\n"') == 'say "hi"\n'
    for text in ('{"b":1,"a":2}', "[1,2]", "3", "0.5", "true", "null"):
        assert csv_output(text) == text
    assert csv_output(None) is None
