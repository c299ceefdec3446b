"""Honest numbers: a failed sample counts (as the metric's worst value, unless the evaluation
declares ``skip``), the summary says how many failed and why, the Ladder and ``compare`` use
the same rule, and intervals stay inside the metric's range (Wilson's for 0/1 metrics)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats as scipy_stats

from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.ladder import Mechanism, Release
from evalq.shared.access.release import ReleaseStore
from evalq.shared.errors import PermanentError
from evalq.shared.evaluation import checked_scores
from evalq.shared.failures import FailurePolicy, FailureRule, metric_samples
from evalq.shared.settings import Settings
from evalq.shared.stats import Z95, describe, paired
from tests.conftest import Stack
from tests.helpers import ended_view, evalq, list_splits, wait_completed, write_rows


def test_a_failed_sample_scores_each_metrics_worst_value_unless_skipped() -> None:
    scores = {
        0: {"acc": 1.0, "loss": 0.2, "bleu": 30.0, "f": 0.5},
        1: {"acc": 1.0, "loss": 0.4, "bleu": 20.0, "f": 0.7},
    }
    failures = {2: "infer/RuntimeError", 3: "infer/RuntimeError", 4: "score/ValueError"}
    ranges = {"loss": (0.0, 5.0), "f": (0.0, 1.0)}
    rule = FailureRule(ranges=ranges, lower_is_better=frozenset({"loss"}))
    counted = metric_samples(scores, failures, rule)
    # a 0/1 metric: 0 (even when every scored sample was right); a declared range: its bad
    # end (a loss: the top); an undeclared non-0/1 metric: the worst value the run scored
    assert counted.worst == {"acc": 0.0, "loss": 5.0, "bleu": 20.0, "f": 0.0}
    assert counted.scores[3] == counted.worst
    assert sorted(counted.scores) == [0, 1, 2, 3, 4]
    assert counted.failed == {"infer/RuntimeError": 2, "score/ValueError": 1}
    assert (counted.scored, counted.ranges["acc"], counted.ranges["loss"]) == (
        2,
        (0.0, 1.0),
        (0.0, 5.0),
    )
    assert "bleu" not in counted.ranges

    skipped = metric_samples(scores, failures, FailureRule(FailurePolicy.SKIP))
    assert (sorted(skipped.scores), skipped.worst, skipped.policy) == ([0, 1], {}, "skip")
    assert skipped.failed == counted.failed
    stat = skipped.noted(describe(skipped.scores))["acc"]
    assert (stat.n, stat.skipped, stat.on_failure) == (2, 3, "skip")


def test_nine_of_ten_has_a_wilson_interval_inside_zero_to_one() -> None:
    """The normal interval of 9/10 reaches 1.0960 (what ``--limit 10`` printed)."""
    stat = describe({i: {"accuracy": float(i != 0)} for i in range(10)})["accuracy"]
    assert stat.stderr is not None
    assert stat.mean + Z95 * stat.stderr > 1  # what the normal interval gave
    assert stat.interval is not None
    reference = scipy_stats.binomtest(9, 10).proportion_ci(method="wilson")
    assert stat.interval.method == "wilson"
    assert (stat.interval.low, stat.interval.high) == pytest.approx((reference.low, reference.high))
    assert stat.ci95 == (stat.interval.low, stat.interval.high)
    assert 0 <= stat.interval.low < stat.mean < stat.interval.high <= 1


def test_other_intervals_are_clipped_to_the_metrics_range() -> None:
    scores = {i: {"f": 0.99 if i else 0.5} for i in range(8)}
    normal = describe(scores)["f"]
    assert normal.interval is not None
    assert (normal.interval.method, normal.interval.high > 1) == ("normal", True)
    clipped = describe(scores, ranges={"f": (0.0, 1.0)})["f"]
    assert clipped.interval is not None
    assert clipped.interval.method == "normal, clipped to [0, 1]"
    assert (clipped.interval.low, clipped.interval.high) == (normal.interval.low, 1.0)
    right = {i: {"acc": float(i % 5 != 0)} for i in range(10)}
    clustered = describe(right, clusters={i: str(i % 5 == 0) for i in range(10)})["acc"]
    assert clustered.ci95 is not None
    assert 0 <= clustered.ci95[0] <= clustered.ci95[1] <= 1


@pytest.mark.parametrize("value", [1.5, -0.01, float("nan"), float("inf")])
def test_a_score_outside_its_declared_range_fails_the_sample(value: float) -> None:
    ranges = {"f": (0.0, 1.0)}
    assert checked_scores({"f": 1, "g": 7.5}, ranges) == {"f": 1.0, "g": 7.5}
    with pytest.raises(PermanentError, match="score\\(\\) metric 'f' is"):
        checked_scores({"f": value}, ranges)


def test_a_paired_difference_of_0_1_metrics_stays_within_minus_one_to_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("evalq.shared.stats.PAIRED_BOOTSTRAP_MAX", 100)
    delta = paired({i: 0.0 for i in range(101)}, {i: float(i != 0) for i in range(101)})
    assert delta is not None
    assert delta.method == "normal"
    assert delta.ci95 is not None
    assert delta.ci95[1] == 1.0


def _dataset(stack: Stack, folder: Path, labels: list[int], tier: str = "viewable") -> str:
    rows = [{"text": f"item-{i} {folder.name}", "cue": 0, "label": y} for i, y in enumerate(labels)]
    write_rows(folder, "validation", rows)
    return list_splits(stack.client, folder, "validation", tier=tier)


def _client(stack: Stack, principal: str) -> Client:
    settings = Settings(
        redis_url=stack.server.url, archive_url=stack.settings.archive_url, principal=principal
    )
    return Client(settings)


def _submit(client: Client, eval_name: str, dataset: str, **params: str) -> str:
    request = SubmitRequest(eval=eval_name, dataset=dataset, split="validation", params=params)
    return client.submit(request).run_id


def _words(labels: list[int], label: int) -> str:
    return ",".join(f"item-{i}" for i, y in enumerate(labels) if y == label)


@pytest.mark.integration
def test_failed_samples_count_as_wrong_and_the_summary_names_them(
    stack: Stack, tmp_path: Path
) -> None:
    """A candidate answering 0 that crashes on the 5 rows labelled 1 (its hard rows) scores
    15/20, not 15/15; an evaluation that declares ``skip`` shows 15/15 and says 5 skipped."""
    labels = [int(i % 4 == 0) for i in range(20)]
    dataset = _dataset(stack, tmp_path, labels)
    client = _client(stack, "dev")
    hard = _words(labels, 1)
    worst = _submit(client, "fumble", dataset, base="0", fail=hard)
    skip = _submit(client, "fumble_skip", dataset, base="0", fail=hard)
    for run_id in (worst, skip):
        wait_completed(stack.client, run_id)

    shown = evalq(stack.server.url, "status", worst, "--json")
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert view["aggregate"] == {"accuracy": pytest.approx(15 / 20)}
    stat = view["stats"]["accuracy"]
    assert (stat["mean"], stat["n"]) == (pytest.approx(0.75), 20)
    assert (stat["failed"], stat["on_failure"], stat["skipped"]) == (
        {"infer/RuntimeError": 5},
        "worst",
        0,
    )
    human = evalq(stack.server.url, "status", worst, COLUMNS="250")
    assert "n 20, 5 failed: infer/RuntimeError)" in human.stdout
    watched = evalq(stack.server.url, "watch", worst, COLUMNS="250")  # --follow's last lines
    assert watched.returncode == 0, watched.stderr
    assert "accuracy: 0.7500 ± " in watched.stdout
    assert "n 20, 5 failed: infer/RuntimeError)" in watched.stdout

    skipped = json.loads(evalq(stack.server.url, "status", skip, "--json").stdout)
    assert skipped["aggregate"] == {"accuracy": 1.0}
    stat = skipped["stats"]["accuracy"]
    assert (stat["n"], stat["on_failure"], stat["skipped"]) == (15, "skip", 5)
    assert (
        "n 15, 5 skipped: infer/RuntimeError)"
        in evalq(stack.server.url, "status", skip, COLUMNS="250").stdout
    )

    # a rescore of the run keeps the samples it crashed on, failed as they were: not 15/15
    done = evalq(stack.server.url, "rescore", worst, "--eval", "guess", "--json")
    assert done.returncode == 0, done.stderr
    rescored = json.loads(done.stdout)["run_id"]
    wait_completed(stack.client, rescored)
    stat = json.loads(evalq(stack.server.url, "status", rescored, "--json").stdout)["stats"]
    assert (stat["accuracy"]["mean"], stat["accuracy"]["n"]) == (pytest.approx(0.75), 20)
    assert stat["accuracy"]["failed"] == {"infer/RuntimeError": 5}


@pytest.mark.integration
def test_ten_samples_nine_right_show_a_wilson_interval_inside_zero_to_one(
    stack: Stack, tmp_path: Path
) -> None:
    dataset = _dataset(stack, tmp_path, [1] + [0] * 9)
    run_id = _submit(_client(stack, "dev"), "guess", dataset, base="0")
    wait_completed(stack.client, run_id)
    shown = evalq(stack.server.url, "status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    stat = json.loads(shown.stdout)["stats"]["accuracy"]
    low, high = scipy_stats.binomtest(9, 10).proportion_ci(method="wilson")
    assert stat["interval"] == {
        "method": "wilson",
        "low": pytest.approx(low),
        "high": pytest.approx(high),
    }
    assert stat["ci95"] == [stat["interval"]["low"], stat["interval"]["high"]]
    assert stat["ci95"][0] >= 0
    assert stat["ci95"][1] <= 1
    human = evalq(stack.server.url, "status", run_id, COLUMNS="250").stdout
    assert f"(95% CI {low:.4f}-{high:.4f}, n 10)" in human


@pytest.mark.integration
def test_on_a_non_viewable_split_failing_chosen_samples_chooses_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    """A loop's first run answers 0 (40 of 60 right: the Ladder, eta 0.1, releases 0.7); its
    second answers 1 and fails on purpose every row where 1 would be wrong. Counted as wrong,
    those rows give 20/60, not 20/20 = 1.0: the Ladder stays where it was, and ``compare``
    pairs all 60 samples (the failed ones at 0), not only the 20 the candidate chose."""
    labels = [int(i % 3 == 0) for i in range(60)]
    dataset = _dataset(stack, tmp_path, labels, tier="non_viewable")
    ladder = Release(mechanism=Mechanism.LADDER, eta=0.1)
    ReleaseStore(stack.client).set_rule(dataset, "validation", ladder, who="test")
    loop = _client(stack, "loop")
    honest = _submit(loop, "fumble", dataset, base="0")
    chooser = _submit(loop, "fumble", dataset, base="1", fail=_words(labels, 0))
    for run_id in (honest, chooser):
        wait_completed(stack.client, run_id)

    first = ended_view(loop, honest).aggregate
    assert first is not None
    assert first["accuracy"] == pytest.approx(0.7)
    second = ended_view(loop, chooser)
    assert second.release is not None
    assert second.aggregate == first
    assert second.release.why == {"accuracy": "not better than the best so far"}
    assert second.stats is not None
    stat = second.stats["accuracy"]
    assert (stat.n, stat.failed, stat.on_failure) == (60, {"infer": 40}, "worst")
    admin = Client(_client(stack, "loop").settings, admin=True)
    exact = admin.status(chooser).aggregate
    assert exact is not None
    assert exact["accuracy"] == pytest.approx(20 / 60)

    compared = evalq(stack.server.url, "compare", honest, chooser, "--admin", "--json")
    assert compared.returncode == 0, compared.stderr
    delta = json.loads(compared.stdout)["metrics"]["accuracy"][chooser]
    assert delta["n_paired"] == 60
    assert delta["delta"] == pytest.approx((20 - 40) / 60)
