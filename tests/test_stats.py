"""Error bars and paired comparison: the numbers against a direct computation (numpy, scipy,
the binomial sum by hand) on the same per-sample scores, then end to end: ``status --json``
stats of a run whose exact accuracy is known, ``compare`` listing exactly the samples a
candidate flipped, refusing runs that do not pair (exit 2) and a non_viewable split's pairs
to a user (exit 3)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from evalq.producer.reports.charts import aggregates_chart
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.producer.service.sweep import grid, parse_sweeps, read_sweep_file
from evalq.shared.access.ladder import Mechanism, ReleaseRule, released_stats
from evalq.shared.errors import InputError
from evalq.shared.models import RunStatus
from evalq.shared.queue.backlog import Backlog
from evalq.shared.settings import Settings
from evalq.shared.stats import Z95, Stat, describe, holm, paired
from tests.conftest import Stack
from tests.helpers import (
    ended_view,
    evalq,
    evalq_in_process,
    labelled_rows,
    list_splits,
    record_run,
    wait_completed,
    wait_for,
    write_rows,
)
from tests.plugins import Guess, predict


def _scores(values: Sequence[float], name: str = "acc") -> dict[int, dict[str, float]]:
    return {i: {name: float(v)} for i, v in enumerate(values)}


def test_a_mean_has_the_analytic_standard_error_and_interval() -> None:
    values = [1, 0, 1, 1, 0.5, 1, 1, 1, 0, 1, 1, 0]  # not 0/1: the normal interval
    stat = describe(_scores(values))["acc"]
    stderr = np.std(values, ddof=1) / math.sqrt(len(values))
    mean = float(np.mean(values))
    assert stat.mean == pytest.approx(mean)
    assert (stat.n, stat.method) == (12, "analytic")
    assert stat.stderr == pytest.approx(stderr)
    assert stat.ci95 == pytest.approx((mean - Z95 * stderr, mean + Z95 * stderr))
    assert pytest.approx(scipy_stats.norm.ppf(0.975)) == Z95
    assert describe(_scores([1]))["acc"].stderr is None  # one sample: no spread to estimate


def test_equal_values_have_no_spread_and_huge_ones_still_have_a_finite_one() -> None:
    """The standard error is numpy's, about the exact mean: equal values give exactly 0 (a
    mean from numpy's sum would not), and values whose squares overflow float64 fall back to
    ``statistics``' exact sums (an infinite one would leave the run without error bars)."""
    equal = describe(_scores([0.1] * 7))["acc"]
    assert (equal.stderr, equal.ci95) == (0.0, (0.1, 0.1))
    huge = describe(_scores([1e200, -1e200, 0.0]))["acc"]
    assert huge.stderr == pytest.approx(1e200 / math.sqrt(3))


def test_clustered_samples_get_the_cluster_robust_standard_error() -> None:
    """Samples of one cluster move together: the Liang-Zeger standard error (small-sample
    factor G/(G-1)), computed here directly, is wider than the independent one."""
    values = [1, 1, 1, 0, 0, 0, 1, 1, 0, 1, 1, 1]
    clusters = ["a", "a", "a", "b", "b", "b", "c", "c", "c", "d", "d", "d"]
    stat = describe(_scores(values), clusters=dict(enumerate(clusters)))["acc"]
    x, mean, groups = np.array(values, float), float(np.mean(values)), sorted(set(clusters))
    sums = [sum(x[i] - mean for i, c in enumerate(clusters) if c == g) for g in groups]
    g = len(groups)
    direct = math.sqrt(sum(s * s for s in sums) * g / (g - 1)) / len(values)
    assert stat.stderr == pytest.approx(direct)
    assert stat.method == "clustered (4 clusters)"
    assert stat.stderr > describe(_scores(values))["acc"].stderr  # type: ignore[operator]


def test_a_custom_aggregate_is_bootstrapped_with_a_fixed_seed() -> None:
    def median(scores: list[dict[str, float]]) -> dict[str, float]:
        return {"median": float(np.median([s["acc"] for s in scores]))}

    values = list(np.random.default_rng(3).normal(0.5, 0.2, 300))
    first = describe(_scores(values), median)["median"]
    assert first == describe(_scores(values), median)["median"]  # same scores, same numbers
    assert first.method == "bootstrap (1000 resamples)"
    assert first.mean == pytest.approx(float(np.median(values)))
    assert first.ci95 is not None
    assert first.ci95[0] < first.mean < first.ci95[1]
    # the median's standard error is about 1.25 times the mean's
    assert first.stderr == pytest.approx(1.25 * 0.2 / math.sqrt(300), rel=0.3)


def test_the_paired_bootstrap_and_mcnemar_match_scipy() -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2, 400)
    b = np.where(rng.random(400) < 0.15, 1 - a, a)
    b[:12] = 1  # the candidate gets a few more right
    delta = paired(dict(enumerate(a.tolist())), dict(enumerate(b.tolist())))
    assert delta is not None
    assert delta.delta == pytest.approx(float((b - a).mean()))
    assert delta.n_paired == 400
    reference = scipy_stats.bootstrap(
        (b - a,), np.mean, n_resamples=9999, method="percentile", rng=np.random.default_rng(1)
    ).confidence_interval
    assert delta.ci95 is not None
    assert delta.ci95 == pytest.approx((reference.low, reference.high), abs=0.006)
    up, down = int(np.sum((a == 0) & (b == 1))), int(np.sum((a == 1) & (b == 0)))
    assert delta.flips == (up, down)
    n, k = up + down, min(up, down)
    by_hand = min(1.0, 2 * sum(math.comb(n, j) for j in range(k + 1)) / 2**n)
    assert delta.p_value == pytest.approx(by_hand)
    assert delta.p_value == pytest.approx(scipy_stats.binomtest(up, n, 0.5).pvalue)
    assert paired({0: 1.0}, {1: 1.0}) is None  # nothing pairs


def test_a_resample_that_breaks_one_metric_costs_only_its_error_bar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A custom aggregate whose ``precision`` is NaN (no positive answer) on some resamples,
    and one that raises on some: each metric keeps the resamples it can use; a run too large
    for the bootstrap's budget gets no error bar, said so, not a finalizer running for minutes."""

    def odd(scores: list[dict[str, float]]) -> dict[str, float]:
        said = [s for s in scores if s["said"] == 1]
        precision = sum(s["acc"] for s in said) / len(said) if said else float("nan")
        return {"precision": precision, "acc": sum(s["acc"] for s in scores) / len(scores)}

    values = {i: {"said": float(i == 0), "acc": float(i % 2)} for i in range(12)}
    stats = describe(values, odd)
    assert stats["acc"].stderr is not None  # one resample in ~3 has no positive: acc unharmed
    assert stats["precision"].stderr is None or stats["precision"].method.startswith("bootstrap")

    def fussy(scores: list[dict[str, float]]) -> dict[str, float]:
        if scores[0]["acc"] == 1:
            raise ZeroDivisionError("a resample this aggregate cannot take")
        return {"acc": sum(s["acc"] for s in scores) / len(scores)}

    assert describe(values, fussy)["acc"].method.startswith("bootstrap (")
    monkeypatch.setattr("evalq.shared.stats.BOOTSTRAP_WORK", 100 * 12)  # 100 rounds, half usable
    half = describe(values, fussy)["acc"]
    assert half.method == "bootstrap: 47 usable resamples of 100, no error bar"
    monkeypatch.setattr("evalq.shared.stats.BOOTSTRAP_WORK", 10 * 12)  # under the 50-round floor
    large = describe(values, fussy)["acc"]
    assert (large.stderr, large.method) == (
        None,
        "bootstrap: 0 usable resamples of 0, no error bar",
    )


def test_a_large_paired_comparison_uses_the_normal_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("evalq.shared.stats.PAIRED_BOOTSTRAP_MAX", 100)
    a = {i: float(i % 2) for i in range(400)}
    b = {i: float(i % 3 == 0) for i in range(400)}
    delta = paired(a, b)
    assert delta is not None
    differences = np.array([b[i] - a[i] for i in range(400)])
    stderr = differences.std(ddof=1) / math.sqrt(400)
    assert delta.method == "normal"
    assert delta.ci95 == pytest.approx((delta.delta - Z95 * stderr, delta.delta + Z95 * stderr))


def test_released_error_bars_carry_the_runs_count_not_a_metrics_own() -> None:
    """A metric that ``score()`` gives only on rows of one label counts that label: under a
    rounded release, every metric shows the run's scored count."""
    stats = {
        "accuracy": describe(_scores([1, 0] * 20), None)["acc"],
        "recall": describe(_scores([1] * 8), None)["acc"],
    }
    released = released_stats(stats, ReleaseRule(), {"accuracy": 0.5, "recall": 1.0}, 40)
    assert {name: (s.n, s.stderr, s.ci95) for name, s in released.items()} == {
        "accuracy": (40, None, None),
        "recall": (40, None, None),
    }
    assert released_stats(stats, ReleaseRule(Mechanism.EXACT), {}, 40) == stats


def test_a_sample_without_the_cluster_field_is_its_own_cluster() -> None:
    class Passages(Guess):
        cluster_field = "passage"

    rows = {0: {"passage": "p1"}, 1: {"passage": "p1"}, 2: {}}
    assert Passages().clusters(rows) == {0: "p1", 1: "p1", 2: "#2"}
    assert Guess().clusters(rows) is None


def test_an_interval_that_excludes_its_estimate_is_still_drawn() -> None:
    """A bootstrap interval need not contain the estimate (a coverage aggregate: 1.0 with an
    interval of 0.55 to 0.725): the report draws it instead of failing."""
    stat = Stat(mean=1.0, stderr=0.05, ci95=(0.55, 0.725), n=40, method="bootstrap")
    assert "<svg" in aggregates_chart({"coverage": 1.0}, {"coverage": stat})


def test_holm_multiplies_by_rank_keeps_order_and_caps_at_one() -> None:
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert holm([0.5, 0.9]) == [1.0, 1.0]


N = 60


def _board(stack: Stack, folder: Path, tier: str = "viewable") -> str:
    labels = [(i * 5) % 3 % 2 for i in range(N)]
    rows = [{"text": f"item-{i} {folder.name}", "cue": 0, "label": y} for i, y in enumerate(labels)]
    write_rows(folder, "validation", rows)
    write_rows(folder, "test", rows[:30])
    return list_splits(stack.client, folder, "validation", "test", tier=tier)


def _run(client: Client, dataset: str, split: str = "validation", **params: str) -> str:
    request = SubmitRequest(eval="guess", dataset=dataset, split=split, params=params)
    return client.submit(request).run_id


@pytest.mark.integration
def test_status_stats_and_compare_end_to_end(stack: Stack, tmp_path: Path) -> None:
    dataset = _board(stack, tmp_path)
    labels = [(i * 5) % 3 % 2 for i in range(N)]
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="dev"
        )
    )
    flipped = [3, 4, 10, 17]
    runs = [
        _run(client, dataset, base="0"),
        _run(client, dataset, base="0", flip=",".join(f"item-{i}" for i in flipped)),
        _run(client, dataset, split="test", base="0"),
    ]
    for run_id in runs:
        wait_completed(stack.client, run_id)

    shown = evalq_in_process(stack.server.url, "status", runs[0], "--json")
    assert shown.returncode == 0, shown.stderr
    stat = json.loads(shown.stdout)["stats"]["accuracy"]
    p = labels.count(0) / N  # base 0 is right where the label is 0
    assert stat["mean"] == pytest.approx(p)
    assert stat["stderr"] == pytest.approx(math.sqrt(p * (1 - p) / (N - 1)))
    assert stat["n"] == N
    human = evalq_in_process(stack.server.url, "status", runs[0])
    assert f"{p:.4f} ± " in human.stdout
    assert "95% CI" in human.stdout

    compared = evalq_in_process(stack.server.url, "compare", runs[0], runs[1], "--json")
    assert compared.returncode == 0, compared.stderr
    found = json.loads(compared.stdout)
    assert found["baseline"] == runs[0]
    delta = found["metrics"]["accuracy"][runs[1]]
    fixed = [i for i in flipped if labels[i] == 1]
    broken = [i for i in flipped if labels[i] == 0]
    assert delta["delta"] == pytest.approx((len(fixed) - len(broken)) / N)
    assert delta["n_paired"] == N
    assert found["flips"]["accuracy"][runs[1]] == {"fixed": fixed, "broken": broken}

    exported = evalq_in_process(stack.server.url, "results", runs[1], "--with-input")
    assert exported.returncode == 0, exported.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert [r["input"]["label"] for r in lines] == labels  # viewable: labels included
    assert all(r["input"]["text"].startswith(f"item-{r['sample_id']} ") for r in lines)

    other_split = evalq_in_process(stack.server.url, "compare", runs[0], runs[2])
    assert other_split.returncode == 2
    assert "do not pair" in other_split.stderr


@pytest.mark.integration
def test_a_non_viewable_split_releases_no_exact_error_bar_and_no_pairs(
    stack: Stack, tmp_path: Path
) -> None:
    dataset = _board(stack, tmp_path, tier="non_viewable")
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="loop"
        )
    )
    runs = [_run(client, dataset, base="0"), _run(client, dataset, base="1")]
    for run_id in runs:
        wait_completed(stack.client, run_id)
    view = ended_view(client, runs[0])
    assert view.stats is not None
    stat = view.stats["accuracy"]
    assert view.aggregate is not None
    assert (stat.mean, stat.stderr, stat.ci95) == (view.aggregate["accuracy"], None, None)
    assert stat.method.startswith("released (ladder")
    refused = evalq_in_process(stack.server.url, "compare", *runs)
    assert refused.returncode == 3
    assert "tier refused" in refused.stderr
    admin = evalq_in_process(stack.server.url, "compare", *runs, "--admin", "--json")
    assert admin.returncode == 0, admin.stderr


def test_a_sweep_is_the_grid_of_its_values_and_bad_sweeps_are_one_line_errors(
    tmp_path: Path,
) -> None:
    sweeps = parse_sweeps(["base=0,1", "flip=item-1, item-2"])
    assert sweeps == {"base": ["0", "1"], "flip": ["item-1", "item-2"]}
    assert grid({"seed": "3", "base": "9"}, sweeps) == [
        {"seed": "3", "base": "0", "flip": "item-1"},
        {"seed": "3", "base": "0", "flip": "item-2"},
        {"seed": "3", "base": "1", "flip": "item-1"},
        {"seed": "3", "base": "1", "flip": "item-2"},
    ]
    for bad in (["base"], ["base=0,,1"], ["=1,2"], ["base=0", "base=1"]):
        with pytest.raises(InputError):
            parse_sweeps(bad)
    with pytest.raises(InputError, match="at most"):
        grid({}, {"a": [str(i) for i in range(20)], "b": [str(i) for i in range(20)]})
    good, bad_file = tmp_path / "sweep.yaml", tmp_path / "bad.yaml"
    good.write_text("lr: [0.1, 0.01]\nseed: 3\n")
    bad_file.write_text("- just\n- a list\n")
    assert read_sweep_file(good) == {"lr": ["0.1", "0.01"], "seed": ["3"]}
    literal = tmp_path / "literal.yaml"
    literal.write_text("seed: [007, 010]\nat: 12:30\nflag: [off, null, 1.50]\n")
    assert read_sweep_file(literal) == {  # every value as written, none cast by YAML
        "seed": ["007", "010"], "at": ["12:30"], "flag": ["off", "null", "1.50"],
    }  # fmt: skip
    with pytest.raises(InputError, match="expected a mapping"):
        read_sweep_file(bad_file)


@pytest.mark.integration
def test_a_swept_grid_is_listed_and_compared_as_one_sweep(stack: Stack, tmp_path: Path) -> None:
    dataset = _board(stack, tmp_path)
    labels = [(i * 5) % 3 % 2 for i in range(N)]
    submitted = evalq_in_process(
        stack.server.url, "submit", "guess", "--dataset", dataset, "--split", "validation",
        "--sweep", "base=0,1", "--sweep", "flip=item-1,item-2", "--tag", "nightly", "--json",
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    found = json.loads(submitted.stdout)
    assert len(found["run_ids"]) == 4
    for run_id in found["run_ids"]:
        wait_completed(stack.client, run_id)
    listed = evalq_in_process(stack.server.url, "runs", "--sweep", found["sweep"], "--json")
    views = json.loads(listed.stdout)
    assert {v["run_id"] for v in views} == set(found["run_ids"])
    assert all(v["sweep"] == found["sweep"] and v["tags"] == ["nightly"] for v in views)
    for view in views:
        base, flipped = int(view["params"]["base"]), int(view["params"]["flip"].split("-")[1])
        right = sum((base if i != flipped else 1 - base) == y for i, y in enumerate(labels))
        assert view["stats"]["accuracy"]["mean"] == pytest.approx(right / N)
    # The tables need their width: a subprocess, whose console reads COLUMNS at start (in an
    # xdist worker COLUMNS=80 and LINES=24 are set when the CLI's console is made in process,
    # and fix its size)
    table = evalq(
        stack.server.url, "runs", "--sweep", found["sweep"], "--tag", "nightly", COLUMNS="250"
    )
    assert "base=0 flip=item-1" in table.stdout
    assert "accuracy" in table.stdout
    other_tag = evalq_in_process(
        stack.server.url, "runs", "--sweep", found["sweep"], "--tag", "x", "--json"
    )
    assert json.loads(other_tag.stdout) == []
    compared = evalq_in_process(stack.server.url, "compare", "--sweep", found["sweep"], "--json")
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout)
    assert result["baseline"] == found["run_ids"][0]
    assert set(result["metrics"]["accuracy"]) == set(found["run_ids"][1:])
    # each run's own mean and interval beside its delta, the baseline's too, as status has them
    own = {v["run_id"]: v["stats"]["accuracy"] for v in views}
    assert result["stats"]["accuracy"] == own
    text = evalq(stack.server.url, "compare", "--sweep", found["sweep"], COLUMNS="250").stdout
    for run_id, stat in own.items():
        low, high = stat["ci95"]
        mean = f"{stat['mean']:.4f}"
        (line,) = [row for row in text.splitlines() if run_id in row and mean in row]
        assert f"{low:.4f} to {high:.4f}, n {N}" in line
    page = tmp_path / "sweep.html"
    reported = evalq_in_process(stack.server.url, "report", *found["run_ids"], "--out", str(page))
    assert reported.returncode == 0, reported.stderr
    html = page.read_text()
    for stat in own.values():
        assert f"{stat['mean']:.4f} {stat['ci95'][0]:.4f} to {stat['ci95'][1]:.4f}, n {N}" in html


@pytest.mark.integration
def test_rescore_scores_stored_outputs_without_inference(stack: Stack, tmp_path: Path) -> None:
    rows = labelled_rows(60)
    write_rows(tmp_path, "validation", rows)
    dataset = list_splits(stack.client, tmp_path, "validation")
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="dev"
        )
    )
    source = client.submit(SubmitRequest(eval="spy", dataset=dataset, split="validation"))
    calls = tmp_path / "infer-calls"
    wait_completed(stack.client, source.run_id)

    done = evalq_in_process(stack.server.url, "rescore", source.run_id, "--eval", "spy_close",
                 "--param", f"calls={calls}", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rescored = json.loads(done.stdout)["run_id"]
    wait_completed(stack.client, rescored)
    assert not calls.exists()  # not one infer() call
    view = client.status(rescored)
    assert view.meta.rescored_from == source.run_id
    assert view.progress.inferred == view.progress.scored == 60
    close = [float(abs(predict(str(r["text"])) - int(str(r["label"]))) <= 1) for r in rows]
    assert view.aggregate == pytest.approx({"close": sum(close) / len(close)})

    other_kind = evalq_in_process(stack.server.url, "rescore", source.run_id, "--eval", "guess")
    assert other_kind.returncode == 2
    assert "output kinds" in other_kind.stderr


@pytest.mark.integration
def test_a_rescored_run_whose_outputs_were_not_copied_never_runs_inference(
    stack: Stack, tmp_path: Path
) -> None:
    """The producer died mid-copy (or a message is forged): the janitor or ``resume`` sends
    the uncopied samples to inference, where a rescored run's end as terminal errors instead
    of another model's outputs."""
    rows = labelled_rows(20)
    write_rows(tmp_path, "validation", rows)
    dataset = list_splits(stack.client, tmp_path, "validation")
    client = Client(
        Settings(
            redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal="dev"
        )
    )
    source = client.submit(SubmitRequest(eval="spy", dataset=dataset, split="validation"))
    wait_completed(stack.client, source.run_id)
    calls = tmp_path / "infer-calls"
    meta = source.model_copy(
        update={"run_id": "feed" + source.run_id[4:], "eval": "spy_close",
                "params": {"calls": str(calls)}, "rescored_from": source.run_id,
                "status": RunStatus.QUEUED}
    )  # fmt: skip
    record_run(stack.client, meta, list(range(20)), stack.settings.archive_url)
    Backlog(stack.client).enqueue(stack.app, meta, list(range(20)))  # as the janitor would
    wait_for(lambda: not client.progress(meta.run_id)[0].status.active, 60, "the run to end")
    view = client.status(meta.run_id)
    assert (view.meta.status, view.progress.failed, view.progress.inferred) == (
        RunStatus.FAILED,
        20,
        0,
    )
    assert not calls.exists()
