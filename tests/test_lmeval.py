"""lm-evaluation-harness tasks on the fleet, with lm-eval's own numbers: a task registered from
lm-eval (``tasks add NAME --lm-eval TASK --include-path DIR``), its requests built once at
submit, answered by real workers on SmolLM2-135M, and scored and aggregated by lm-eval's code.
The parity tests run lm-eval 0.4.13 single-process in the same test, on the same model and the
same documents (an include folder's YAML points lm-eval's own arc_easy and gsm8k configs at the
local files), and compare its metrics, standard errors and logged ``arguments`` with evalq's.
The fast tests check registration, pinning and the refusals without Redis."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.service.client import Client
from evalq.producer.service.submit import SubmitRequest
from evalq.producer.service.views import SampleQuery
from evalq.shared.access.ledger import Ledger
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Role
from evalq.shared.access.tiers import TierRegistry
from evalq.shared.connection import connect
from evalq.shared.errors import InputError, PermanentError, TierRefusedError
from evalq.shared.evals.harness import HarnessTask, WarmHarness
from evalq.shared.lm import lmeval
from evalq.shared.lm.harness import HarnessRequest, HarnessRun, HarnessSpec
from evalq.shared.lm.limits import EndpointLimits
from evalq.shared.lm.local import smollm2
from evalq.shared.lm.spec import ModelSpec
from evalq.shared.models import RunStatus
from evalq.shared.services import Services
from evalq.shared.settings import Settings
from evalq.shared.store.endpoints import EndpointRegistry
from evalq.shared.store.requests import RequestStore
from evalq.shared.store.runs import RunStore
from tests.conftest import Stack
from tests.helpers import (
    NOWHERE,
    Server,
    cli_env,
    cli_in_process,
    gateway,
    list_splits,
    wait_ended,
    write_rows,
)

LM_EVAL_TASKS = Path(lmeval.lm_eval_package().__file__ or "").parent / "tasks"

ARC = [
    ("Which gas do plants take in from the air?",
     ["carbon dioxide", "helium", "neon", "argon"], "ABCD", "A"),
    ("What is the boiling point of water at sea level?",
     ["50 degrees Celsius", "100 degrees Celsius", "150 degrees Celsius"], "ABC", "B"),
    ("Which planet is closest to the Sun?", ["Venus", "Mars", "Mercury", "Jupiter"], "1234", "3"),
    ("What do bees make?", ["cow milk", "honey", "spider silk", "sheep wool"], "ABCD", "B"),
    ("Which tool measures temperature?",
     ["a ruler", "a kitchen scale", "a thermometer", "a clock"], "ABCD", "C"),
    ("What is frozen water called?", ["steam", "ice", "fog", "morning dew"], "ABCD", "B"),
]  # fmt: skip
GSM = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7", 7),
    ("A box holds 6 eggs. How many eggs are in 2 boxes?", "2 * 6 = 12", 12),
    ("Sara had 10 pencils and gave away 3. How many are left?", "10 - 3 = 7", 7),
    ("A car travels 20 miles each hour. How far does it go in 3 hours?", "20 * 3 = 60", 60),
    ("There are 5 birds and 2 fly away. How many remain?", "5 - 2 = 3", 3),
    ("Each pack has 8 cards. How many cards are in 3 packs?", "3 * 8 = 24", 24),
    ("Mia reads 5 pages a day. How many pages does she read in 4 days?", "5 * 4 = 20", 20),
    ("A farmer has 12 cows and sells 5. How many cows are left?", "12 - 5 = 7", 7),
]
HELLASWAG = [
    ("Baking cookies", "A woman puts dough on a tray.", "she",
     ["slides the tray into the oven.", "throws the tray [title] out the window.",
      "paints the dough blue.", "sings to the tray loudly."], "0"),
    ("Washing a car", "A man sprays the car with a hose.", "he",
     ["eats the hose.", "scrubs the car with a sponge.", "drives the hose home.",
      "reads a book to the car."], "1"),
    ("Playing guitar", "A boy holds a guitar on his lap.", "he",
     ["bakes the guitar.", "mails the guitar to the moon.", "strums the strings and sings.",
      "plants the guitar in the garden."], "2"),
    ("Brushing teeth", "A girl puts toothpaste on a brush.", "she",
     ["brushes the dog's fur with it.", "puts it in the fridge.", "writes a letter.",
      "brushes her teeth in front of the mirror."], "3"),
    ("Walking a dog", "A man clips a leash to a dog.", "they",
     ["walk down the street together.", "fly over the house.", "swim in the soup.",
      "paint the leash [header] red."], "0"),
]  # fmt: skip
"""Documents in hellaswag's columns (``process_docs`` makes ``query``, ``choices``, ``gold``)."""
WIKI = [
    " = Robert Boulter = \n Robert Boulter is an English film , television and theatre actor . "
    "He had a guest @-@ starring role on the television series The Bill in 2000 . \n",
    " = Tropical Storm Ana = \n Tropical Storm Ana was the first named storm of the 1 @,@ 200 "
    "season . It formed near the Bahamas ; it moved north @-@ east and weakened . \n",
    ' = Kiss You = \n " Kiss You " is a song recorded by the boy band . It was released on '
    "7 January 2013 , and it reached number 9 in the charts ( in the United Kingdom ) . \n",
]
"""Documents in wikitext_document_level's column (``page``, wikitext's tokenized text)."""
BATCH = 4
"""Requests per forward pass, evalq's (``--model-arg batch_size``) and lm-eval's alike."""


def _arc_rows(chosen: list[tuple[str, list[str], str, str]]) -> list[dict[str, object]]:
    return [
        {"id": f"q{i}", "question": q, "choices": {"text": texts, "label": list(labels)},
         "answerKey": key}
        for i, (q, texts, labels, key) in enumerate(chosen)
    ]  # fmt: skip


def _gsm_rows(chosen: list[tuple[str, str, int]]) -> list[dict[str, object]]:
    return [{"question": q, "answer": f"{work}\n#### {n}"} for q, work, n in chosen]


def _task_yaml(name: str, base: str, data: Path, extra: str = "") -> str:
    """An include folder's task: lm-eval's own config ``base`` read from the local ``data``
    (its ``test`` and ``train`` files; evalq replaces the dataset with a registered one)."""
    return (
        f"include: {LM_EVAL_TASKS / base}\ntask: {name}\ndataset_path: json\n"
        f"dataset_name: null\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data / 'test.jsonl'}\n    train: {data / 'train.jsonl'}\n{extra}"
    )


GSM_EXTRA = """num_fewshot: 3
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>"]
  do_sample: false
  temperature: 0.0
  max_gen_toks: 24
"""
"""gsm8k's own config, its generations cut at 24 tokens (a CPU's test)."""


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Data in the benchmarks' own columns (arc: ``test``/``train``; gsm8k: ``test``,
    ``train``, and a ``held`` copy of ``train``) and an include folder with ``arc_local``
    (lm-eval's arc_easy) and ``gsm_local`` (lm-eval's gsm8k, 3-shot from ``train``)."""
    root = tmp_path_factory.mktemp("lmeval")
    write_rows(root / "arc", "test", _arc_rows(ARC))
    write_rows(root / "arc", "train", _arc_rows(ARC[:3]))
    write_rows(root / "gsm", "test", _gsm_rows(GSM[:5]))
    write_rows(root / "gsm", "train", _gsm_rows(GSM[5:] + GSM[:2]))
    write_rows(root / "gsm", "held", _gsm_rows(GSM[4:]))
    swag: list[dict[str, object]] = [
        {"activity_label": a, "ctx_a": ctx_a, "ctx_b": ctx_b, "endings": e, "label": label}
        for a, ctx_a, ctx_b, e, label in HELLASWAG
    ]
    write_rows(root / "swag", "validation", swag)
    write_rows(root / "wiki", "test", [{"page": page} for page in WIKI])
    folder = root / "tasks"
    folder.mkdir()
    (folder / "arc_local.yaml").write_text(
        _task_yaml("arc_local", "arc/arc_easy.yaml", root / "arc", "validation_split: null\n")
    )
    (folder / "gsm_local.yaml").write_text(
        _task_yaml("gsm_local", "gsm8k/gsm8k.yaml", root / "gsm", GSM_EXTRA)
    )
    (folder / "swag_local.yaml").write_text(
        f"include: {LM_EVAL_TASKS / 'hellaswag/hellaswag.yaml'}\ntask: swag_local\n"
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    validation: {root / 'swag' / 'validation.jsonl'}\ntraining_split: null\n"
    )
    (folder / "wiki_local.yaml").write_text(
        f"include: {LM_EVAL_TASKS / 'wikitext/wikitext.yaml'}\ntask: wiki_local\n"
        f"dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n"
        f"    test: {root / 'wiki' / 'test.jsonl'}\ntraining_split: null\n"
        "validation_split: null\n"
    )
    return folder


@pytest.fixture(scope="module")
def model() -> Path:
    """SmolLM2-135M as a transformers folder (converted once from the shipped GGUF file)."""
    return smollm2(Settings().models)


@functools.cache
def _lm_eval_model(model: Path) -> Any:
    """lm-eval's ``hf`` model on SmolLM2, loaded once per process (it keeps no state between
    evaluations)."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(model), device="cpu", dtype="float32", batch_size=BATCH)


@functools.cache
def _lm_eval_reference(tasks: Path, model: Path, task: str) -> tuple[dict[str, Any], list[Any]]:
    """lm-eval 0.4.13 itself, single process, on the same model and documents: its results
    for ``task`` and its logged samples (``--log_samples``), run once per task in a process
    (the tests that compare with it only read it)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    out = simple_evaluate(
        model=_lm_eval_model(model), tasks=[task], task_manager=manager, log_samples=True
    )
    assert out is not None
    return out["results"][task], out["samples"][task]


@pytest.fixture
def place(stack: Stack, model: Path, tasks: Path) -> Iterator[tuple[Client, Client, str, str]]:
    """A user and an admin (model root: SmolLM2's folder's parent), and the two datasets:
    arc (``test``, ``train`` viewable) and gsm (``test``, ``train`` viewable, ``held``
    non_viewable)."""
    data = tasks.parent
    arc = list_splits(stack.client, data / "arc", "test", "train")
    gsm = list_splits(stack.client, data / "gsm", "test", "train")
    TierRegistry(stack.client).set(gsm, "held", Tier.NON_VIEWABLE, who="tests")
    settings = stack.settings.model_copy(update={"model_roots": (model.parent,)})
    user = Client(settings.model_copy(update={"principal": "lmeval-user"}))
    admin = Client(settings.model_copy(update={"principal": "lmeval-admin"}), admin=True)
    yield user, admin, arc, gsm
    user.close()
    admin.close()


@contextmanager
def _admin(stack: Stack, model: Path, principal: str) -> Iterator[Client]:
    """An admin of ``stack`` as ``principal``, its model root SmolLM2's folder's parent."""
    update = {"model_roots": (model.parent,), "principal": principal}
    admin = Client(stack.settings.model_copy(update=update), admin=True)
    try:
        yield admin
    finally:
        admin.close()


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _flat(value: Any) -> list[Any]:
    """The leaves of nested lists, in order (a response's log-likelihoods, greedy flags, and
    texts), as JSON has them."""
    if isinstance(value, list | tuple):
        return [leaf for item in value for leaf in _flat(item)]
    return [_plain(value)]


def _run(
    stack: Stack,
    user: Client,
    name: str,
    dataset: str,
    model: Path | str,
    *,
    split: str = "test",
    model_args: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any], dict[int, Any]]:
    """Submit ``name`` on ``dataset/split`` and wait: its id, stats and results by sample.
    ``model``: a folder (``hf/``, :data:`BATCH` a forward pass), or a spec and its
    ``model_args``."""
    spec = f"hf/{model}" if isinstance(model, Path) else model
    fields = {"eval": name, "dataset": dataset, "split": split, "model": spec}
    args = {"batch_size": str(BATCH)} if model_args is None else model_args
    request = SubmitRequest.model_validate({**fields, "model_args": args})
    meta = user.submit(request)
    assert wait_ended(stack.client, meta.run_id, timeout=500) is RunStatus.COMPLETED
    view = user.status(meta.run_id)
    assert view.stats is not None
    stats = {k: v.model_dump(mode="json") for k, v in view.stats.items()}
    return meta.run_id, stats, {r.sample_id: r for r in user.results(meta.run_id)}


def _assert_parity(
    stats: dict[str, Any],
    results: dict[int, Any],
    reference: dict[str, Any],
    logged: list[Any],
    *,
    rel: float = 0.0,
) -> None:
    """evalq's metrics and standard errors are lm-eval's (``metric,filter`` keys; the ``none``
    filter's bare), and each document's prompts, raw responses and per-document metrics are
    those it logged. Raw log-likelihoods are equal, or within ``rel`` of lm-eval's where the
    model was called with the documents batched otherwise (a batch's padding changes the
    floats' last digits: a run whose worker died is retried a document per call)."""
    compared = 0
    for key, value in reference.items():
        metric, _, filter_name = key.partition(",")
        if not filter_name or metric.endswith("_stderr"):
            continue
        compared += 1
        ours = metric if filter_name == "none" else key
        assert stats[ours]["mean"] == value, key
        assert stats[ours]["stderr"] == reference[f"{metric}_stderr,{filter_name}"], key
    assert compared == len(stats)
    assert sorted(results) == sorted({s["doc_id"] for s in logged})
    for sample in logged:
        mine = results[sample["doc_id"]]
        assert [r["arguments"] for r in mine.output["requests"]] == _plain(sample["arguments"])
        answered, logged_resps = _flat(mine.output["resps"]), _flat(sample["resps"])
        assert len(answered) == len(logged_resps)
        for got, want in zip(answered, logged_resps, strict=True):
            close = rel and isinstance(want, float)
            assert got == (pytest.approx(want, rel=rel, abs=0) if close else want)
        filtered = "" if sample["filter"] == "none" else f",{sample['filter']}"
        for metric in sample["metrics"]:
            assert mine.scores[metric + filtered] == float(sample[metric]), metric


@pytest.mark.timeout(600)  # SmolLM2 on a CPU, run by evalq and by lm-eval
def test_multiple_choice_with_multi_token_choices_equals_lm_eval(
    stack: Stack, place: tuple[Client, Client, str, str], tasks: Path, model: Path
) -> None:
    user, admin, arc, _ = place
    added = admin.add_lm_eval_task("arc-lm", "arc_local", include_path=str(tasks))
    assert isinstance(added.spec, HarnessSpec)
    assert (added.spec.output_type, added.spec.metrics) == ("multiple_choice", ("acc", "acc_norm"))
    _, stats, results = _run(stack, user, "arc-lm", arc, model)
    reference, logged = _lm_eval_reference(tasks, model, "arc_local")
    _assert_parity(stats, results, reference, logged)
    assert len(logged) == len(ARC)
    assert {len(r.output["requests"]) for r in results.values()} == {3, 4}


@pytest.mark.timeout(600)  # SmolLM2 on a CPU, run by evalq and by lm-eval
def test_a_worker_sigkilled_mid_run_changes_no_number_and_scores_each_document_once(
    fresh_stack: Stack, tasks: Path, model: Path
) -> None:
    """The worker (main process and pool) is SIGKILLed while its model answers the run's
    requests (the run is one message, its outputs written when all are answered); a new worker
    takes the message back after the visibility timeout. The run's numbers are lm-eval's, as
    the uninterrupted run's are, and each document is inferred and scored once."""
    stack = fresh_stack
    arc = list_splits(stack.client, tasks.parent / "arc", "test", "train")
    with _admin(stack, model, "kill-admin") as admin:
        admin.add_lm_eval_task("arc-kill", "arc_local", include_path=str(tasks))
        victim = stack.start_workers(EVALQ_VISIBILITY_TIMEOUT="5")
        fields = {"eval": "arc-kill", "dataset": arc, "split": "test", "model": f"hf/{model}"}
        request = SubmitRequest.model_validate({**fields, "model_args": {"batch_size": str(BATCH)}})
        meta = admin.submit(request)
        stack.wait_logged("Running loglikelihood requests:", timeout=300)  # lm-eval's bar
        for process in victim.processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(60)
        assert admin.status(meta.run_id).progress.inferred == 0  # killed mid-message
        stack.start_workers(EVALQ_VISIBILITY_TIMEOUT="5")
        assert wait_ended(stack.client, meta.run_id, timeout=500) is RunStatus.COMPLETED
        view = admin.status(meta.run_id)
        progress = view.progress
        assert (progress.inferred, progress.scored, progress.failed) == (len(ARC), len(ARC), 0)
        assert view.stats is not None
        stats = {k: v.model_dump(mode="json") for k, v in view.stats.items()}
        results = {r.sample_id: r for r in admin.results(meta.run_id)}
    _assert_parity(stats, results, *_lm_eval_reference(tasks, model, "arc_local"), rel=1e-5)


@pytest.mark.timeout(600)  # SmolLM2 on a CPU, run by evalq and by lm-eval
def test_generation_with_few_shot_and_two_regex_filters_equals_lm_eval(
    stack: Stack, place: tuple[Client, Client, str, str], tasks: Path, model: Path
) -> None:
    user, admin, _, gsm = place
    added = admin.add_lm_eval_task("gsm-lm", "gsm_local", include_path=str(tasks))
    assert isinstance(added.spec, HarnessSpec)
    metrics = ("exact_match,strict-match", "exact_match,flexible-extract")
    assert (added.spec.metrics, added.spec.num_fewshot, added.spec.fewshot_split) == (
        metrics, 3, "train",
    )  # fmt: skip
    run_id, stats, results = _run(stack, user, "gsm-lm", gsm, model)
    reference, logged = _lm_eval_reference(tasks, model, "gsm_local")
    _assert_parity(stats, results, reference, logged)
    assert len(logged) == 2 * len(results)  # one logged sample per document and filter
    page = user.samples.page(run_id, SampleQuery(with_input=True))
    for shown in page.samples:  # a sample's page: its prompt, row and target
        assert shown.prompt == results[shown.sample_id].output["requests"][0]["arguments"][0]
        assert shown.input is not None
        assert shown.target == shown.input["answer"]
    by_id = {shown.sample_id: shown.logged for shown in page.samples}
    for sample in logged:  # and what --log_samples logs: filtered responses, target
        mine = by_id[sample["doc_id"]]
        assert mine is not None
        assert mine["filtered_resps"][sample["filter"]] == _plain(sample["filtered_resps"])
        assert mine["target"] == sample["target"]
    for result in results.values():  # three examples from train, with their answers
        context = result.output["requests"][0]["arguments"][0]
        assert context.count("Question:") == 4
        assert context.count("####") == 3


@pytest.mark.timeout(600)  # SmolLM2 on a CPU, run by evalq and by lm-eval
def test_multiple_choice_with_process_docs_as_a_function_equals_lm_eval(
    stack: Stack, tasks: Path, model: Path
) -> None:
    swag = list_splits(stack.client, tasks.parent / "swag", "validation")
    with _admin(stack, model, "swag-admin") as admin:
        added = admin.add_lm_eval_task("swag-lm", "swag_local", include_path=str(tasks))
        assert isinstance(added.spec, HarnessSpec)
        assert [f.path for f in added.spec.files][1:] == [
            "tasks/hellaswag/hellaswag.yaml", "tasks/hellaswag/utils.py",
        ]  # fmt: skip
        assert added.spec.labels == ("label",)
        _, stats, results = _run(stack, admin, "swag-lm", swag, model, split="validation")
    reference, logged = _lm_eval_reference(tasks, model, "swag_local")
    _assert_parity(stats, results, reference, logged)
    first = results[0].output["requests"][0]["arguments"]
    assert first == [
        "Baking cookies: A woman puts dough on a tray. She",
        " slides the tray into the oven.",
    ]


@pytest.mark.timeout(600)  # SmolLM2 on a CPU, run by evalq and by lm-eval
def test_perplexity_over_rolling_windows_with_a_process_results_function_equals_lm_eval(
    stack: Stack, tasks: Path, model: Path
) -> None:
    """wikitext's config: ``loglikelihood_rolling`` requests, ``process_results`` as a
    ``!function`` giving ``(loglikelihood, words)`` and ``(loglikelihood, bytes)`` tuples, and
    lm-eval's corpus-level aggregations over them (``weighted_perplexity``,
    ``bits_per_byte``)."""
    wiki = list_splits(stack.client, tasks.parent / "wiki", "test")
    with _admin(stack, model, "wiki-admin") as admin:
        added = admin.add_lm_eval_task("wiki-lm", "wiki_local", include_path=str(tasks))
        assert isinstance(added.spec, HarnessSpec)
        assert added.spec.output_type == "loglikelihood_rolling"
        assert added.spec.metrics == ("word_perplexity", "byte_perplexity", "bits_per_byte")
        _, stats, results = _run(stack, admin, "wiki-lm", wiki, model)
    reference, logged = _lm_eval_reference(tasks, model, "wiki_local")
    assert sorted(stats) == sorted(added.spec.metrics)
    for metric in added.spec.metrics:
        assert stats[metric]["mean"] == pytest.approx(reference[f"{metric},none"], rel=1e-4)
        assert stats[metric]["n"] == len(WIKI)
    assert sorted(results) == sorted(s["doc_id"] for s in logged) == list(range(len(WIKI)))
    for sample in logged:
        mine = results[sample["doc_id"]]
        assert [r["arguments"] for r in mine.output["requests"]] == _plain(sample["arguments"])
        (got,), (want,) = _flat(mine.output["resps"]), _flat(sample["resps"])
        assert got == pytest.approx(want, rel=1e-4)
        for metric in added.spec.metrics:
            loglikelihood, count = sample[metric]
            assert mine.scores[f"{metric}[0]"] == pytest.approx(loglikelihood, rel=1e-4)
            assert mine.scores[f"{metric}[1]"] == count


@pytest.mark.timeout(600)  # SmolLM2 on a CPU, served and loaded locally
def test_multiple_choice_on_an_openai_compatible_server_equals_the_local_model(
    stack: Stack, place: tuple[Client, Client, str, str], tasks: Path, model: Path, tmp_path: Path
) -> None:
    """arc (multi-token choices) on SmolLM2 served by the test server (``/v1/completions``
    with ``echo`` and ``logprobs``, as vLLM answers it) and on SmolLM2 loaded by a worker:
    each choice's log-likelihood within 1e-4, the same greedy flags and the same metrics. A
    server that answers no log-likelihoods, and a model without its tokenizer, are refused
    at submit in one line, before anything is charged."""
    user, admin, arc, _ = place
    admin.add_lm_eval_task("arc-served", "arc_local", include_path=str(tasks))
    served = Server(tmp_path / "served.log", key=None, model_dir=model)
    plain = Server(tmp_path / "plain.log", key=None)  # the fake: it answers no log-likelihoods
    try:
        for server in (served, plain):
            EndpointRegistry(stack.client).set(server.base, EndpointLimits(), who="tests")
        args = {"base_url": served.base, "tokenizer": str(model)}
        request = {"eval": "arc-served", "dataset": arc, "split": "test", "model": "openai/served"}
        before = Ledger(stack.client).get(arc, "test")
        with pytest.raises(InputError, match=r"did not answer \(/completions with echo"):
            user.submit(
                SubmitRequest.model_validate(
                    {**request, "model_args": {**args, "base_url": plain.base}}
                )
            )
        with pytest.raises(InputError, match=r"needs its tokenizer \(--model-arg tokenizer="):
            user.submit(
                SubmitRequest.model_validate({**request, "model_args": {"base_url": served.base}})
            )
        assert Ledger(stack.client).get(arc, "test") == before
        _, stats, results = _run(stack, user, "arc-served", arc, "openai/served", model_args=args)
        scored = served.stats()["answers"]["scored"]
        # perplexity over rolling windows too (was: lm-eval's borrowed method, NameError)
        admin.add_lm_eval_task("wiki-served", "wiki_local", include_path=str(tasks))
        wiki = list_splits(stack.client, tasks.parent / "wiki", "test")
        _, perplexity, _ = _run(stack, user, "wiki-served", wiki, "openai/served", model_args=args)
    finally:
        served.stop()
        plain.stop()
    _, local_stats, local = _run(stack, user, "arc-served", arc, model)
    assert stats == local_stats
    assert sorted(results) == sorted(local) == list(range(len(ARC)))
    requests = 0
    for sample_id, result in results.items():
        mine, theirs = result.output, local[sample_id].output
        assert mine["requests"] == theirs["requests"]
        requests += len(mine["requests"])
        for got, want in zip(_flat(mine["resps"]), _flat(theirs["resps"]), strict=True):
            if isinstance(want, float):
                assert got == pytest.approx(want, abs=1e-4)
            else:
                assert got == want
    assert scored == requests + 1  # each choice once, and the submit's one question
    reference, _ = _lm_eval_reference(tasks, model, "wiki_local")
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert perplexity[metric]["mean"] == pytest.approx(reference[f"{metric},none"], rel=1e-4)


def test_few_shot_from_a_held_out_split_is_refused_before_any_charge(
    stack: Stack, place: tuple[Client, Client, str, str], tasks: Path, model: Path, tmp_path: Path
) -> None:
    user, admin, _, gsm = place
    held = tmp_path / "tasks"
    held.mkdir()
    (held / "gsm_held.yaml").write_text(
        (tasks / "gsm_local.yaml").read_text().replace("task: gsm_local", "task: gsm_held")
        + "fewshot_split: held\n"
    )
    same = held / "gsm_same.yaml"
    same.write_text(
        (tasks / "gsm_local.yaml").read_text().replace("task: gsm_local", "task: gsm_same")
        + "fewshot_split: test\n"
    )
    admin.add_lm_eval_task("gsm-held", "gsm_held", include_path=str(held))
    admin.add_lm_eval_task("gsm-same", "gsm_same", include_path=str(held))
    runs = RunStore(stack.client)
    before = len(runs.recent(10_000))
    fields = {"dataset": gsm, "split": "test", "model": f"hf/{model}"}
    for name, said in (("gsm-held", "is non_viewable"), ("gsm-same", "the evaluated split")):
        with pytest.raises(TierRefusedError) as refused:
            user.submit(SubmitRequest.model_validate({"eval": name, **fields}))
        assert refused.value.exit_code == 3
        assert said in str(refused.value)
        assert "\n" not in str(refused.value)
    assert len(runs.recent(10_000)) == before  # nothing recorded, so nothing charged


def test_registration_pins_every_file_and_refuses_a_changed_one(
    tasks: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "tasks"
    shutil.copytree(tasks, folder)
    spec = lmeval.resolve("gsm_local", folder)
    assert [(f.root, f.path) for f in spec.files] == [
        ("include", "gsm_local.yaml"),
        ("lm_eval", "tasks/gsm8k/gsm8k.yaml"),
    ]
    assert spec.labels == ("answer",)
    assert spec.config["num_fewshot"] == 3
    assert lmeval.verify(spec) == folder / "gsm_local.yaml"
    yaml_file = folder / "gsm_local.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("max_gen_toks: 24", "max_gen_toks: 25"))
    with pytest.raises(InputError, match="changed since it was registered") as changed:
        lmeval.verify(spec)
    assert "\n" not in str(changed.value)
    run = HarnessRun(harness=spec, model=ModelSpec.parse("hf/x"), num_fewshot=0, split="test")
    with pytest.raises(InputError, match="changed since it was registered"):
        lmeval.config_of(run.harness)


def test_a_function_module_is_pinned_with_the_yaml(tmp_path: Path) -> None:
    (tmp_path / "utils.py").write_text("def docs(dataset):\n    return dataset\n")
    (tmp_path / "fn_task.yaml").write_text(
        "task: fn_task\ndataset_path: json\noutput_type: multiple_choice\ntest_split: test\n"
        "process_docs: !function utils.docs\ndoc_to_text: '{{q}}'\ndoc_to_target: gold\n"
        "doc_to_choice: '{{options}}'\nmetric_list:\n  - metric: acc\n"
    )
    spec = lmeval.resolve("fn_task", tmp_path)
    assert [f.path for f in spec.files] == ["fn_task.yaml", "utils.py"]
    assert spec.config["process_docs"] == "!function utils.docs"
    assert spec.labels == ("gold",)
    (tmp_path / "utils.py").write_text("def docs(dataset):\n    return dataset.select([])\n")
    with pytest.raises(InputError, match=r"utils\.py changed since it was registered"):
        lmeval.verify(spec)


def test_unknown_tasks_groups_and_a_missing_lm_eval_are_one_line(
    tasks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(
        InputError, match=r"lm-eval has no task 'arc_locl' \(did you mean 'arc_local'\?\)"
    ):
        lmeval.resolve("arc_locl", tasks)
    group = tasks.parent / "group"
    group.mkdir(exist_ok=True)
    (group / "both.yaml").write_text("group: both\ntask:\n  - arc_local\n  - gsm_local\n")
    shutil.copy(tasks / "arc_local.yaml", group)
    shutil.copy(tasks / "gsm_local.yaml", group)
    with pytest.raises(InputError, match="'both' is an lm-eval group: groups are not supported"):
        lmeval.resolve("both", group)
    corpus = tasks.parent / "corpus"
    corpus.mkdir(exist_ok=True)
    (corpus / "bleu_local.yaml").write_text(
        "task: bleu_local\ndataset_path: json\ntest_split: test\noutput_type: generate_until\n"
        "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list: [{metric: bleu}, {metric: exact_match}]\n"
    )
    with pytest.raises(
        InputError, match=r"aggregates bleu \(bleu\): corpus-level metrics over texts, and"
    ):
        lmeval.resolve("bleu_local", corpus)  # refused where it is registered, not at scoring
    (corpus / "agg.py").write_text("def rouge1_agg(items):\n    return 0.0\n")
    (corpus / "own_local.yaml").write_text(
        "task: own_local\ndataset_path: json\ntest_split: test\noutput_type: generate_until\n"
        "doc_to_text: '{{question}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list: [{metric: !function agg.rouge1_agg, aggregation: !function agg.rouge1_agg}]\n"
    )
    with pytest.raises(InputError, match=r"\(rouge1_agg\): corpus-level metrics over texts, and a"):
        lmeval.resolve("own_local", corpus)  # was: registered, every document failed at scoring
    (corpus / "needs.py").write_text("import evalq_no_such_module\n")
    (corpus / "needs_local.yaml").write_text(
        "task: needs_local\ndataset_path: json\ntest_split: test\noutput_type: generate_until\n"
        "process_docs: !function needs.process\ndoc_to_text: '{{question}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list: [{metric: exact_match}]\n"
    )
    with pytest.raises(InputError, match="lm-eval cannot read task 'needs_local': No module"):
        lmeval.resolve("needs_local", corpus)
    monkeypatch.setitem(__import__("sys").modules, "lm_eval", None)
    with pytest.raises(InputError) as missing:
        lmeval.resolve("arc_local", tasks)
    assert str(missing.value) == ("lm-eval tasks need lm-eval 0.4.13: pip install 'evalq[lm-eval]'")


@pytest.mark.timeout(600)  # SmolLM2 on a CPU, run by evalq and by lm-eval
def test_the_cli_registers_lists_and_runs_an_lm_eval_task_through_the_gateway(
    stack: Stack, place: tuple[Client, Client, str, str], tasks: Path, model: Path, tmp_path: Path
) -> None:
    """``tasks add NAME --lm-eval TASK --include-path DIR`` is an admin's (a user's is refused,
    exit 3); ``tasks list`` shows its kind, output type, metrics and few-shot; ``submit
    --num-fewshot`` runs it and ``status --json`` names its metrics as lm-eval does."""
    _, operator, arc, _ = place
    admin_token = operator.create_token("lmeval-root", Role.ADMIN)
    user_token = operator.create_token("lmeval-cli", Role.USER)
    roots = str(model.parent)
    with gateway(stack.server.url, tmp_path / "gw.log", EVALQ_MODEL_ROOTS=roots) as (api, _):

        def cli(token: str, *args: str) -> subprocess.CompletedProcess[str]:
            env = cli_env(NOWHERE, EVALQ_API_URL=api)
            env["COLUMNS"] = "200"  # a table's row on one line
            return cli_in_process({**env, "EVALQ_TOKEN": token}, *args)

        add = ("tasks", "add", "arc-cli", "--lm-eval", "arc_local", "--include-path", str(tasks))
        refused = cli(user_token, *add)
        assert refused.returncode == 3, refused.stderr
        added = cli(admin_token, *add)
        assert added.returncode == 0, added.stderr
        assert added.stdout.strip() == (
            "registered task arc-cli: lm-eval arc_local, multiple_choice, metrics acc, acc_norm"
        )
        table = cli(user_token, "tasks", "list")
        line = next(x for x in table.stdout.splitlines() if "arc-cli" in x)
        for shown in ("lm-eval", "multiple_choice", "acc, acc_norm", "0 from train"):
            assert shown in line
        listed = {
            t["name"]: t for t in json.loads(cli(user_token, "tasks", "list", "--json").stdout)
        }
        assert listed["arc-cli"]["spec"]["lm_eval"] == "arc_local"
        submitted = cli(
            user_token, "submit", "arc-cli", "--dataset", arc, "--split", "test", "--model",
            f"hf/{model}", "--model-arg", f"batch_size={BATCH}", "--num-fewshot", "0",
            "--follow", "--json",
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        run_id = json.loads(submitted.stdout.splitlines()[0])["run_id"]
        status = json.loads(cli(user_token, "status", run_id, "--json").stdout)
        assert sorted(status["stats"]) == ["acc", "acc_norm"]
        assert {s["method"] for s in status["stats"].values()} == {"lm-eval"}


class _SpyLM:
    """lm-eval's model API, recording every request it is asked (the model: the outer edge)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def loglikelihood(self, requests: list[Any]) -> list[tuple[float, bool]]:
        self.seen.extend(requests)
        return [(-float(len(r.args[1])), False) for r in requests]


def test_the_model_sees_request_arguments_only(redis_only: RedisServer, tasks: Path) -> None:
    """A worker's model is asked each sample's stored requests, by run and id: no document,
    no label, even though the worker holds the (label-free) row."""
    client = redis.Redis.from_url(redis_only.url)
    spec = lmeval.resolve("arc_local", tasks)
    run = HarnessRun(harness=spec, model=ModelSpec.parse("hf/x"), num_fewshot=0, split="test")
    asked = [("Q?", " yes"), ("Q?", " no")]
    built = {
        7: [
            HarnessRequest(request_type="loglikelihood", arguments=list(pair), idx=i)
            for i, pair in enumerate(asked)
        ]
    }
    fields, _ = RequestStore.encoded(built)
    RequestStore(client).put("r1", fields)
    services = Services(Settings(), client)
    spy = _SpyLM()
    row = {"id": "secret-id", "question": "secret question", "choices": {"text": ["a"]}}
    [output] = HarnessTask("arc-lm", run, services=services).infer_samples(
        WarmHarness(None, spy), [row], [("r1", 7)]
    )
    assert [(r.doc, r.args) for r in spy.seen] == [({}, pair) for pair in asked]
    assert output == {
        "requests": [r.model_dump(mode="json") for r in built[7]],
        "resps": [[[-4.0, False]], [[-3.0, False]]],
    }
    with pytest.raises(PermanentError, match="no lm-eval requests for sample 8"):
        HarnessTask("arc-lm", run, services=services).infer_samples(
            WarmHarness(None, spy), [row], [("r1", 8)]
        )


def test_held_out_labels_reach_no_request_by_few_shot_fallback_or_another_task(
    redis_only: RedisServer, model: Path, tmp_path: Path
) -> None:
    """The attack review's two leaks, as a user on a ``non_viewable`` split: a task naming only
    ``test_split`` drew its few-shot examples, by lm-eval's own fallback, from the evaluated
    split (a sample's own answer in its prompt); an lm-eval prompt showed a column another
    registered task calls its label. Neither label reaches a stored request now."""
    server = connect(redis_only.url)
    settings = Settings(redis_url=redis_only.url, model_roots=(model.parent,))
    user = Client(settings.model_copy(update={"principal": "lmeval-user"}))
    admin = Client(settings.model_copy(update={"principal": "lmeval-admin"}), admin=True)
    rows: list[dict[str, object]] = [
        {"question": f"held question {i}", "answer": f"SECRET{i}"} for i in range(6)
    ]
    write_rows(tmp_path / "data", "heldout", rows)
    public: list[dict[str, object]] = [
        {"question": f"public question {i} {'x' * 300}", "answer": f"pub{i}"} for i in range(6)
    ]
    write_rows(tmp_path / "data", "test", public)
    name = list_splits(server, tmp_path / "data", "test")
    TierRegistry(server).set(name, "heldout", Tier.NON_VIEWABLE, who="tests")
    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "qa.yaml").write_text(
        "task: qa\ndataset_path: json\ntest_split: test\noutput_type: generate_until\n"
        "doc_to_text: 'Q: {{question}}\\nA:'\ndoc_to_target: '{{answer}}'\n"
        "generation_kwargs: {until: ['\\n'], max_gen_toks: 4}\n"
        "metric_list: [{metric: exact_match}]\n"
    )
    (folder / "rate.yaml").write_text(
        "task: rate\ndataset_path: json\ntest_split: test\noutput_type: multiple_choice\n"
        "doc_to_text: 'Q: {{question}} Proposed: {{answer}}. Correct?'\ndoc_to_target: 0\n"
        "doc_to_choice: ['yes', 'no']\nmetric_list: [{metric: acc}]\n"
    )
    admin.add_lm_eval_task("qa", "qa", include_path=str(folder))
    admin.add_lm_eval_task("rate", "rate", include_path=str(folder))
    hf = f"hf/{model}"
    meta = user.submit(
        SubmitRequest(eval="qa", dataset=name, split="heldout", model=hf, num_fewshot=2)
    )
    contexts = [r[0].arguments[0] for r in RequestStore(server).get(meta.run_id, range(6))]
    assert all("public question" in c for c in contexts), contexts
    assert not any("SECRET" in c for c in contexts), contexts
    # 'answer' is the label of qa: its rows reach rate's prompt without it, and lm-eval says so
    with pytest.raises(InputError, match="'answer' is undefined"):
        user.submit(SubmitRequest(eval="rate", dataset=name, split="heldout", model=hf))
    assert len(RunStore(server).recent(10)) == 1  # nothing recorded nor charged for it
    small = Client(
        settings.model_copy(update={"principal": "lmeval-user", "max_output_bytes": 1024})
    )
    with pytest.raises(InputError, match=r"requests take [\d,]+ bytes, over the 1,024 its output"):
        small.submit(
            SubmitRequest(eval="qa", dataset=name, split="heldout", model=hf, num_fewshot=3)
        )
    assert len(RunStore(server).recent(10)) == 1
    small.close()
    user.close()
    admin.close()
