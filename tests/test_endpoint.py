"""Endpoint models end to end: a registered task run with ``--model openai/NAME`` against a real
OpenAI-compatible server (``tests/openai_server.py`` on uvicorn, in its own process), through
real workers and Redis: outputs and the API's usage recorded, the key sent and kept out of
Redis and logs, the fleet's rate limit held across two workers while the server answers 429s,
a token budget never overshot by two workers and no token held for ever by a killed one, and
each failure path (stall, 5xx, malformed answers, a server that is gone) ending every sample
once with its reason."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from evalq.producer.clients.remote import RemoteClient
from evalq.producer.service.client import Client
from evalq.producer.service.policy_file import PolicyFile
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.budget import Budget
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Role
from evalq.shared.errors import InputError, LabelRefusedError, TierRefusedError
from evalq.shared.keys import HOLDS, RUNS
from evalq.shared.models import RunMeta, RunStatus
from tests.conftest import Stack, shared_stack
from tests.helpers import (
    NOWHERE,
    REPO,
    Server,
    assert_settled_once,
    cli_env,
    gateway,
    list_splits,
    wait_ended,
    wait_for,
    write_rows,
)
from tests.openai_server import echoed

pytestmark = pytest.mark.integration

KEY = "sk-evalq-test-4f1d2c9a8b7e"
KEYED = {"api_key_env": "OPENAI_API_KEY"}
"""A policy entry whose requests carry the worker's OPENAI_API_KEY (named: there is no
default)."""
SUM = """
prompt: "What is {a} plus {b}? Answer with only the number."
chat: CHAT
target: answer
generate: {max_new_tokens: 8, stop: ["\\n"]}
scorer: exact_match
"""


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The stack of the tests that only add runs, each against servers and on data of its
    own: one worker holding ``OPENAI_API_KEY`` (sent only to the entries that name it)."""
    with shared_stack(tmp_path_factory.mktemp("keyed"), OPENAI_API_KEY=KEY) as stack:
        yield stack


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "server.log", KEY)
    yield running
    running.stop()


def _place(stack: Stack, folder: Path, n: int, endpoints: dict[str, Any]) -> tuple[Client, str]:
    """An admin who registered the tasks and applied ``endpoints``; a user; a dataset of ``n``
    sums (viewable), its rows marked with the test's folder (one content is one registered
    split, and tests share a stack)."""
    rows = [
        {"a": i, "b": 2 * i, "answer": str(3 * i), "case": folder.parent.name} for i in range(n)
    ]
    write_rows(folder, "validation", rows)
    name = list_splits(stack.client, folder, "validation")
    admin = Client(stack.settings.model_copy(update={"principal": "ops"}), admin=True)
    admin.add_task("sum-chat", SUM.replace("CHAT", "true"))
    admin.add_task("sum-text", SUM.replace("CHAT", "false"))
    admin.add_task(
        "sum-pick", 'prompt: "{a} plus {b}?"\nchoices: options\ntarget: answer\nscorer: accuracy\n'
    )
    admin.apply_policy(PolicyFile.model_validate({"endpoints": endpoints}))
    admin.close()
    return Client(stack.settings.model_copy(update={"principal": "agent"})), name


def _submit(
    user: Client,
    dataset: str,
    url: str,
    *,
    task: str = "sum-chat",
    model: str = "served",
    cache: bool = False,
    **args: str,
) -> RunMeta:
    request = SubmitRequest.model_validate(
        {
            "eval": task, "dataset": dataset, "split": "validation", "cache": cache,
            "model": f"openai/{model}", "model_args": {"base_url": url, **args},
        }
    )  # fmt: skip
    return user.submit(request)


def _ended(stack: Stack, meta: RunMeta, timeout: float = 120) -> RunStatus:
    """How the run ended, once each of its samples settled exactly once."""
    status = wait_ended(stack.client, meta.run_id, timeout)
    assert_settled_once(stack.client, meta.run_id, meta.n, status)
    return status


def _secret_nowhere(stack: Stack) -> None:
    """The key is in no Redis value (every write is in the append-only file) and no log."""
    stack.client.bgrewriteaof()
    files = [p for p in stack.log_dir.rglob("*") if p.is_file()]
    assert files
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path


def test_an_endpoint_model_answers_with_its_usage_and_the_key_stays_secret(
    keyed: Stack, server: Server, tmp_path: Path
) -> None:
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 24, {server.base: KEYED})
    chat = _submit(user, dataset, server.base)
    text = _submit(user, dataset, server.base, task="sum-text", model="wrong-model")
    assert _ended(stack, chat) is RunStatus.COMPLETED
    assert _ended(stack, text) is RunStatus.COMPLETED
    results = sorted(user.results(chat.run_id), key=lambda r: r.sample_id)
    assert [r.output for r in results] == [str(3 * i) for i in range(24)]
    assert all(r.scores == {"exact_match": 1.0} for r in results)
    # the server's usage: words of the chat message, one word answered
    assert [r.usage.completion_tokens for r in results if r.usage] == [1] * 24
    assert results[0].usage is not None
    assert results[0].usage.prompt_tokens == 10
    wrong = user.status(text.run_id).stats
    assert wrong is not None
    assert wrong["exact_match"].mean == 0.0  # another model, another answer
    assert user.status(chat.run_id).meta.model == "openai/served"
    seen = server.stats()
    assert seen["keys"] == [KEY]
    assert sorted(set(seen["models"])) == ["served", "wrong-model"]
    assert seen["answers"] == {"ok": 48}
    _secret_nowhere(stack)
    user.close()


def test_what_a_caller_may_not_name_is_refused_in_one_line(
    keyed: Stack, server: Server, tmp_path: Path
) -> None:
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 4, {server.base: KEYED})
    with pytest.raises(TierRefusedError, match="not listed in the policy's endpoints"):
        _submit(user, dataset, "http://169.254.169.254/v1")
    with pytest.raises(TierRefusedError, match="takes its key from OPENAI_API_KEY"):
        _submit(user, dataset, server.base, api_key_env="EVALQ_ACL_WORKER_PASSWORD")
    with pytest.raises(InputError, match="'api_key' is never accepted"):
        _submit(user, dataset, server.base, api_key=KEY)
    with pytest.raises(InputError, match="--cache is for endpoint models"):
        user.submit(
            SubmitRequest(
                eval="sum-chat", dataset=dataset, split="validation", model="hf/org/model",
                cache=True,
            )
        )  # fmt: skip
    with pytest.raises(InputError, match="needs --model-arg base_url"):
        user.submit(
            SubmitRequest(eval="sum-chat", dataset=dataset, split="validation", model="openai/x")
        )
    with pytest.raises(InputError, match="model arg tokenizer is for lm-eval tasks"):
        _submit(user, dataset, server.base, tokenizer="/models/tok")  # was: accepted, ignored
    with pytest.raises(InputError, match="a YAML task reads log-likelihoods from local models"):
        user.submit(
            SubmitRequest(
                eval="sum-pick", dataset=dataset, split="validation", model="openai/x",
                model_args={"base_url": server.base},
            )
        )  # fmt: skip
    assert server.stats()["arrivals"] == []
    user.close()


def test_a_key_goes_only_to_a_server_whose_entry_names_it(keyed: Stack, tmp_path: Path) -> None:
    """Issue #50 (4): the operator lists a user's own server beside the provider, its entry
    naming no ``api_key_env``, and the workers hold ``OPENAI_API_KEY``. Was: the entry
    defaulted to ``OPENAI_API_KEY`` and the user's server got ``Authorization: Bearer <key>``
    on 5 of 5 requests; a user naming ``api_key_env=OPENAI_API_KEY`` was admitted."""
    stack = keyed
    own = Server(tmp_path / "own.log", key=None)  # the user's: answers whoever asks
    try:
        listing = {own.base: {}, "https://api.openai.com/v1": KEYED}
        user, dataset = _place(stack, tmp_path / "data", 5, listing)
        with pytest.raises(TierRefusedError, match="sends no key"):
            _submit(user, dataset, own.base, api_key_env="OPENAI_API_KEY")
        meta = _submit(user, dataset, own.base)
        assert _ended(stack, meta) is RunStatus.COMPLETED
        seen = own.stats()
        assert len(seen["arrivals"]) == 5
        assert seen["keys"] == [""]  # not one request with an Authorization header
        user.close()
    finally:
        own.stop()


ECHO_KEY = "sk-Proj-Echo-7Q2wX9zK4mR1vT"
"""A key with upper-case letters, so that lower-casing it is a transform."""


def test_a_key_a_server_echoes_transformed_reaches_no_error_line_status_or_result(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """Issue #50 (4): a server given the key answers with it transformed (base64, reversed,
    split, lower-cased, JSON-escaped in a 401's body; reversed where a token count should
    be). Was: each transform in its sample's error line, which cut out only the key as sent.
    Error lines now hold the status and evalq's own words, nothing of the server's."""
    stack = fresh_stack
    stack.start_workers(OPENAI_API_KEY=ECHO_KEY)
    echo = Server(tmp_path / "echo.log", key=None)
    try:
        echo.control(echo_key=True)
        user, dataset = _place(stack, tmp_path / "data", 12, {echo.base: KEYED})
        meta = _submit(user, dataset, echo.base, max_retries="0")
        assert _ended(stack, meta) is RunStatus.FAILED
        assert echo.stats()["keys"] == [ECHO_KEY]  # its entry names the key: it was sent
        results = list(user.results(meta.run_id))
        assert len(results) == 12
        lines = [r.error.message for r in results if r.error is not None]
        refused = re.escape(f"{echo.base} answered 401 Unauthorized")
        unreadable = re.escape(f"{echo.base}: an unreadable answer (a token count that is not")
        fixed = re.compile(rf"{refused}|{unreadable} a count\) \(after 1 tries\)")
        assert len(lines) == 12
        assert all(fixed.fullmatch(line) for line in lines), lines
        shown = [r.model_dump_json() for r in results]
        shown.append(user.status(meta.run_id).model_dump_json())
        for text in echoed(ECHO_KEY):
            assert not any(text in line for line in shown), text
        user.close()
    finally:
        echo.stop()


RATE = """
prompt: "What was asked: {a} plus {b}. What was answered: {answer}. How hard, 1 to 5?"
chat: true
target: difficulty
generate: {max_new_tokens: 32}
scorer: exact_match
"""
"""Issue #50 (5)'s second task: its prompt shows ``sum-chat``'s target."""


def test_a_task_that_shows_another_task_s_label_is_refused_before_anything_is_sent(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """Issue #50 (5): with ``sum-chat`` (target ``answer``) and ``rate`` (its prompt shows
    ``{answer}``, target ``difficulty``) registered, a user token ran ``rate`` on a
    ``non_viewable`` split against its own listed server, which answered each prompt back:
    100 of 100 answers read. Was: only the running task's label fields were scrubbed. Now the
    submit is refused through the gateway (exit 3, one line), before any run or charge, and
    the server is asked nothing; an admin is refused too (the workers would scrub it)."""
    stack = fresh_stack
    stack.start_workers()
    own = Server(tmp_path / "own.log", key=None)
    try:
        own.control(echo_prompt=True)
        _place(stack, tmp_path / "data", 1, {own.base: {}})
        rows = [
            {"a": i, "b": 2 * i, "answer": str(3 * i), "difficulty": str(i % 5 + 1)}
            for i in range(100)
        ]
        write_rows(tmp_path / "held", "validation", rows)
        held = list_splits(stack.client, tmp_path / "held", "validation", tier="non_viewable")
        admin = Client(stack.settings.model_copy(update={"principal": "ops"}), admin=True)
        admin.add_task("rate", RATE)
        token = admin.create_token("agent", Role.USER)
        submit = [
            "submit", "rate", "--dataset", held, "--split", "validation",
            "--model", "openai/served", "--model-arg", f"base_url={own.base}", "--json",
        ]  # fmt: skip
        with gateway(stack.server.url, tmp_path / "gw.log") as (api, _):
            env = cli_env(NOWHERE, EVALQ_API_URL=api)
            done = subprocess.run(
                [sys.executable, "-c", "from evalq.shared.cli import main; main()", *submit],
                env={**env, "EVALQ_TOKEN": token}, cwd=REPO, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip
        assert done.returncode == 3, done.stderr
        said = done.stderr.strip()
        assert "'rate' shows the model field 'answer'" in said
        assert len(said.splitlines()) == 1
        with pytest.raises(LabelRefusedError, match="field 'answer'"):
            _submit(admin, held, own.base, task="rate")
        admin.close()
        assert stack.client.zcard(RUNS) == 0  # no run recorded, nothing charged
        assert own.stats()["arrivals"] == []
    finally:
        own.stop()


def test_the_response_cache_answers_a_rerun_and_never_another_model(
    keyed: Stack, server: Server, tmp_path: Path
) -> None:
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 24, {server.base: KEYED})

    def requests() -> int:
        return len(server.stats()["arrivals"])

    first = _submit(user, dataset, server.base, cache=True)
    assert _ended(stack, first) is RunStatus.COMPLETED
    assert requests() == 24
    again = _submit(user, dataset, server.base, cache=True)
    assert _ended(stack, again) is RunStatus.COMPLETED
    assert requests() == 24  # every answer from the cache
    before = sorted(user.results(first.run_id), key=lambda r: r.sample_id)
    after = sorted(user.results(again.run_id), key=lambda r: r.sample_id)
    assert [r.output for r in after] == [r.output for r in before]
    assert all(r.usage is not None and r.usage.cached for r in after)
    assert not any(r.usage is not None and r.usage.cached for r in before)
    progress = user.status(again.run_id).progress
    assert (progress.cached, progress.prompt_tokens, progress.completion_tokens) == (24, 0, 0)
    other = _submit(user, dataset, server.base, model="wrong-model", cache=True)
    assert _ended(stack, other) is RunStatus.COMPLETED
    assert requests() == 48  # another model: no hit
    uncached = _submit(user, dataset, server.base)
    assert _ended(stack, uncached) is RunStatus.COMPLETED
    assert requests() == 72  # not asked for: every request made
    server.control(version="2")  # other weights served under the same name
    reloaded = _submit(user, dataset, server.base, cache=True)
    assert _ended(stack, reloaded) is RunStatus.COMPLETED
    assert requests() == 96  # no answer of the old weights
    user.close()


def test_the_response_cache_tells_no_user_which_prompts_another_asked(
    keyed: Stack, server: Server, tmp_path: Path
) -> None:
    """Issue #50 (7): another user's rerun with ``--cache`` read ``usage.cached`` on exactly
    the 30 ids a first user had chosen. Each principal's requests use a cache of their own."""
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 60, {server.base: KEYED})
    chosen = tuple(range(0, 60, 2))
    first = user.submit(
        SubmitRequest.model_validate(
            {
                "eval": "sum-chat", "dataset": dataset, "split": "validation", "cache": True,
                "model": "openai/served", "model_args": {"base_url": server.base},
                "ids": chosen,
            }
        )
    )  # fmt: skip
    assert _ended(stack, first) is RunStatus.COMPLETED
    prober = Client(stack.settings.model_copy(update={"principal": "mallory"}))
    probe = _submit(prober, dataset, server.base, cache=True)
    assert _ended(stack, probe) is RunStatus.COMPLETED
    hits = sorted(r.sample_id for r in prober.results(probe.run_id) if r.usage and r.usage.cached)
    assert hits == []  # was: the first user's 30 ids
    assert len(server.stats()["arrivals"]) == 30 + 60
    again = _submit(prober, dataset, server.base, cache=True)  # its own cache still answers
    assert _ended(stack, again) is RunStatus.COMPLETED
    assert prober.status(again.run_id).progress.cached == 60
    assert len(server.stats()["arrivals"]) == 30 + 60
    prober.close()
    user.close()


def test_identical_requests_in_flight_share_one_call(
    keyed: Stack, server: Server, tmp_path: Path
) -> None:
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 1, {server.base: KEYED})
    rows = [{"a": 4, "b": 5, "answer": "9"}] * 16  # one prompt, sixteen times
    write_rows(tmp_path / "same", "validation", rows)
    same = list_splits(stack.client, tmp_path / "same", "validation")
    server.control(delay=0.5)  # all sixteen are asked while the first is answered
    meta = _submit(user, same, server.base, cache=True)
    assert _ended(stack, meta) is RunStatus.COMPLETED
    assert len(server.stats()["arrivals"]) == 1
    results = list(user.results(meta.run_id))
    assert [r.output for r in results] == ["9"] * 16
    assert sum(1 for r in results if r.usage is not None and r.usage.cached) == 15
    assert dataset
    user.close()


def test_a_batch_s_requests_go_out_together_beyond_the_workers_batch_size(
    fresh_stack: Stack, server: Server, tmp_path: Path
) -> None:
    stack = fresh_stack
    stack.start_workers(OPENAI_API_KEY=KEY, EVALQ_MAX_BATCH="4")
    user, dataset = _place(stack, tmp_path / "data", 16, {server.base: KEYED})
    server.control(delay=0.5)
    meta = _submit(user, dataset, server.base, concurrency="8")
    assert _ended(stack, meta) is RunStatus.COMPLETED
    # one call for the message's 16 rows, 8 in flight (was: calls of 4 rows, 4 in flight)
    assert server.stats()["most_inflight"] == 8
    user.close()


def test_two_workers_keep_the_fleet_rate_limit_while_the_server_answers_429(
    fresh_stack: Stack, server: Server, tmp_path: Path
) -> None:
    stack = fresh_stack
    rpm = 600  # one request every 100 ms, for the whole fleet
    for _ in range(2):
        stack.start_workers(OPENAI_API_KEY=KEY, EVALQ_MAX_BATCH="16")
    user, dataset = _place(
        stack, tmp_path / "data", 90, {server.base: {**KEYED, "requests_per_minute": rpm}}
    )
    # Retry-After: 0, so that the fleet's limit is what holds the requests back (a pause
    # after each 429 would hold them back by itself)
    server.control(rate_limit_share=0.2, retry_after=0)
    meta = _submit(user, dataset, server.base, max_retries="10")
    assert _ended(stack, meta, timeout=180) is RunStatus.COMPLETED
    view = user.status(meta.run_id)
    assert (view.progress.scored, view.progress.failed) == (90, 0)
    seen = server.stats()
    assert seen["answers"]["429"] > 0
    counted = view.endpoint
    assert counted is not None
    assert counted.url == server.base
    # what status shows of the last minute (the run may have begun earlier: at most all)
    assert 0 < counted.requests <= len(seen["arrivals"])
    assert 0 < counted.rate_limited <= seen["answers"]["429"]
    # the fleet's traffic is an admin's or operator's to read: a gateway user's view of the
    # same run shows none (it counted other users' work, and their held-out runs' progress)
    agent = Client(stack.settings, principal="agent", sees_sources=False)
    assert agent.status(meta.run_id).endpoint is None
    agent.close()
    assert counted.tokens > 0
    arrivals = sorted(seen["arrivals"])
    assert len(arrivals) == seen["answers"]["429"] + 90
    # in any 5 s, no more than the limit allows (+1 for the window's edge, +1 for the
    # difference between Redis's clock, which admits, and the server's, which counts)
    window, allowed = 5.0, rpm / 60 * 5.0 + 2
    busiest = max(
        sum(1 for t in arrivals[i:] if t < start + window) for i, start in enumerate(arrivals)
    )
    assert busiest <= allowed, f"{busiest} requests in {window}s (limit {allowed})"
    user.close()


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ({"stall": True}, "endpoint/Timeout"),
        ({"error_share": 1.0}, "endpoint/ServerError"),
        ({"malformed_share": 1.0}, "endpoint/BadResponse"),
        ("gone", "endpoint/Unreachable"),
    ],
)
def test_an_endpoint_that_fails_ends_each_sample_once_with_its_reason(
    keyed: Stack, server: Server, tmp_path: Path, fault: Any, kind: str
) -> None:
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 12, {server.base: KEYED})
    if fault == "gone":
        server.stop()
    else:
        server.control(**fault, retry_after=0)
    started = time.monotonic()
    meta = _submit(user, dataset, server.base, timeout="1", max_retries="1")
    assert _ended(stack, meta) is RunStatus.FAILED
    view = user.status(meta.run_id)
    assert view.errors == {kind: 12}
    assert time.monotonic() - started < 120
    (first, *_) = [r for r in user.results(meta.run_id) if r.error is not None]
    assert first.error is not None
    assert first.error.message.endswith("(after 2 tries)")  # was: then "(attempt 1 of 3)"
    assert KEY not in first.error.message
    if fault != "gone":
        server.control(stall=False)
    user.close()


def _budget(stack: Stack, dataset: str) -> Budget:
    operator = Client(stack.settings)
    found = [b for b in operator.budgets() if b.dataset == dataset and b.caller is None]
    operator.close()
    (budget,) = found
    return budget


def _set_tokens(stack: Stack, dataset: str, tokens: int, samples: int | None = None) -> None:
    operator = Client(stack.settings)
    operator.set_budget(
        dataset, "validation", runs=None, samples=samples, max_samples_per_run=None,
        tokens=tokens,
    )  # fmt: skip
    operator.close()


def _holders(stack: Stack) -> list[int]:
    """The processes holding tokens now (a hold's record names its worker as ``pid@host``;
    a charged one, kept for retries, names none)."""
    records = [json.loads(r) for r in stack.client.hvals(HOLDS) if r != "charged"]
    return [int(record["worker"].split("@")[0]) for record in records]


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _recorded(user: Client, meta: RunMeta) -> int:
    """The tokens of every usage the run recorded."""
    usages = [r.usage for r in user.results(meta.run_id) if r.usage is not None]
    return sum(u.prompt_tokens + u.completion_tokens for u in usages)


def test_a_token_budget_that_runs_out_midway_is_never_overshot_by_two_workers(
    fresh_stack: Stack, server: Server, tmp_path: Path
) -> None:
    stack = fresh_stack
    for _ in range(2):
        stack.start_workers(OPENAI_API_KEY=KEY)
    user, dataset = _place(stack, tmp_path / "data", 1000, {server.base: KEYED})
    total = 5000  # each sample uses 11 tokens (10 words asked, 1 answered): about 450 fit
    _set_tokens(stack, dataset, total, samples=3000)
    meta = _submit(user, dataset, server.base)
    assert _ended(stack, meta, timeout=240) is RunStatus.COMPLETED
    view = user.status(meta.run_id)
    unsent = view.errors.get("budget/TokensExhausted", 0)
    assert view.errors == {"budget/TokensExhausted": unsent}
    assert 300 < unsent < 700, unsent
    sent = 1000 - unsent
    assert view.meta.reason is not None
    assert "token budget ran out" in view.meta.reason
    assert view.stats is not None
    assert view.stats["exact_match"].n == sent  # the numbers count what was sent
    assert view.stats["exact_match"].mean == 1.0
    # the server saw no request for an unsent sample
    assert len(server.stats()["arrivals"]) == sent
    budget = _budget(stack, dataset)
    assert budget.tokens_used == _recorded(user, meta) == 11 * sent
    assert budget.tokens_used <= total
    assert budget.tokens_reserved == 0
    assert budget.samples_used == sent  # the unsent given back, once
    assert _budget(stack, dataset).samples_used == sent
    user.close()


def test_a_worker_killed_mid_request_leaves_no_token_held_and_the_cache_recomputes_little(
    fresh_stack: Stack, server: Server, tmp_path: Path
) -> None:
    stack = fresh_stack
    stack.crashes_expected = True
    fast = {"OPENAI_API_KEY": KEY, "EVALQ_STALL_AFTER": "8"}
    victim = stack.start_workers(**fast)
    user, dataset = _place(stack, tmp_path / "data", 96, {server.base: KEYED})
    _set_tokens(stack, dataset, 100_000)
    server.control(delay=1.0)
    concurrency = 4
    meta = _submit(
        user, dataset, server.base, cache=True, timeout="3", max_retries="0",
        concurrency=str(concurrency),
    )  # fmt: skip

    (group,) = [process.pid for process in victim.processes]

    def holders() -> list[int]:
        """The processes of the victim holding tokens (pool processes share its group)."""
        return [pid for pid in _holders(stack) if _group(pid) == group]

    def unstored() -> int:
        """Requests the server received whose outputs are not stored yet (the arrivals read
        first: an output stored in between makes the count smaller, never larger)."""
        arrivals = len(server.stats()["arrivals"])
        return arrivals - user.status(meta.run_id).progress.inferred

    # Killed mid-request with more than 2 * concurrency requests asked since its last stored
    # outputs: at most `concurrency` are in flight, so at least concurrency + 1 were answered
    # and only the response cache holds them. The kill used to wait for 24 samples scored,
    # which a worker reaches between batches: it then died in its batch's first requests,
    # with nothing answered there, and the bound on arrivals below held without a cache.
    wait_for(
        lambda: unstored() > 2 * concurrency and holders(), 60,
        "the victim mid-request with answers only the cache holds",
    )  # fmt: skip
    dying = set(holders())
    os.killpg(group, signal.SIGKILL)  # main process and pool child, mid-request
    victim.processes[0].wait(60)
    in_flight = sum(1 for pid in _holders(stack) if pid in dying)
    assert 1 <= in_flight <= concurrency
    # The delay kept requests in flight for the kill; the takeover's need none (the samples
    # given back go again one message each: at 1 s a request, 32 s of waiting).
    server.control(delay=0.0)
    stack.start_workers(**fast)  # to take over (the victim alone asked what was counted above)
    assert _ended(stack, meta, timeout=240) is RunStatus.COMPLETED
    wait_for(lambda: _budget(stack, dataset).tokens_reserved == 0, 60, "the held tokens freed")
    assert not _holders(stack)  # every hold charged: none left to lapse
    budget = _budget(stack, dataset)
    recorded = _recorded(user, meta)
    # the victim's requests in flight may have been served: each charged its worst case (at
    # most 200 tokens), and nothing else beyond what was recorded
    assert recorded < budget.tokens_used <= recorded + 200 * concurrency
    # the cache answered what the victim had asked before it died: only what it had in flight
    # was asked again (without the cache: at least 96 + 1 + (concurrency + 1) arrivals)
    assert len(server.stats()["arrivals"]) <= 96 + concurrency
    user.close()


def test_a_run_that_can_send_nothing_is_given_back_cancelled_or_ended(
    keyed: Stack, server: Server, tmp_path: Path
) -> None:
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 1500, {server.base: KEYED})
    _set_tokens(stack, dataset, 0, samples=100_000)
    meta = _submit(user, dataset, server.base)
    wait_for(
        lambda: user.status(meta.run_id).errors.get("budget/TokensExhausted", 0) > 0, 60,
        "the first samples unsent",
    )  # fmt: skip
    user.cancel(meta.run_id)
    # was: the unsent ones kept their charge (the cancel counted only what produced nothing)
    assert _budget(stack, dataset).samples_used == 0
    ended = _submit(user, dataset, server.base)
    assert _ended(stack, ended) is RunStatus.FAILED  # nothing to count
    view = user.status(ended.run_id)
    assert view.meta.reason is not None
    assert "none of its 1500 samples was sent" in view.meta.reason
    budget = _budget(stack, dataset)
    # the ended run given back whole; the cancelled one keeps its run (a cancel's rule)
    assert (budget.samples_used, budget.runs_used, budget.tokens_used) == (0, 1, 0)
    assert server.stats()["arrivals"] == []
    user.close()


GRADED = SUM.replace("CHAT", "true").replace(
    "scorer: exact_match",
    'scorer: model_graded\ngrader: {model: openai/judge, model_args: {base_url: "URL"}}',
)


def test_a_grader_model_grades_each_output_and_its_tokens_count_apart(
    keyed: Stack, server: Server, tmp_path: Path
) -> None:
    stack = keyed
    user, dataset = _place(stack, tmp_path / "data", 12, {server.base: KEYED})
    admin = Client(stack.settings.model_copy(update={"principal": "ops"}), admin=True)
    admin.add_task("sum-graded", GRADED.replace("URL", server.base))
    admin.add_task("sum-graded-elsewhere", GRADED.replace("URL", "http://10.0.0.1:9/v1"))
    admin.close()
    _set_tokens(stack, dataset, 100_000)
    with pytest.raises(TierRefusedError, match="not listed in the policy's endpoints"):
        _submit(user, dataset, server.base, task="sum-graded-elsewhere")
    right = _submit(user, dataset, server.base, task="sum-graded")
    wrong = _submit(user, dataset, server.base, task="sum-graded", model="wrong-model")
    assert _ended(stack, right) is RunStatus.COMPLETED
    assert _ended(stack, wrong) is RunStatus.COMPLETED
    means = [user.status(m.run_id).stats for m in (right, wrong)]
    assert [s["model_graded"].mean for s in means if s is not None] == [1.0, 0.0]
    (first, *_) = sorted(user.results(right.run_id), key=lambda r: r.sample_id)
    assert first.grade is not None
    assert (first.grade.grader, first.grade.verdict) == ("openai/judge", "GRADE: C")
    assert "[Expert answer]: 0\n[Submission]: 0" in first.grade.prompt
    assert first.grade.usage.completion_tokens == 2  # "GRADE: C": two words
    progress = user.status(right.run_id).progress
    graded = sum(r.grade.usage.prompt_tokens for r in user.results(right.run_id) if r.grade)
    assert progress.grader_prompt_tokens == graded > progress.prompt_tokens == 12 * 10
    assert progress.grader_completion_tokens == 24
    models = [m for m in server.stats()["models"]]
    assert models.count("judge") == 24  # one grading request per sample of both runs
    # the grader's tokens are charged to the same budget as the model's
    recorded = sum(
        _recorded(user, m) + user.status(m.run_id).progress.grader_prompt_tokens
        + user.status(m.run_id).progress.grader_completion_tokens
        for m in (right, wrong)
    )  # fmt: skip
    assert _budget(stack, dataset).tokens_used == recorded
    line = json.loads(
        next(line for line in _result_lines(stack, right.run_id) if '"sample_id":0' in line)
    )
    assert line["grade"]["verdict"] == "GRADE: C"
    assert line["scores"] == {"model_graded": 1.0}
    # a cached verdict asked nothing: no grader tokens (was: counted as if asked)
    # (one after the other: two runs at once share the asking, each request asked once by
    # whichever of them comes first)
    first_cached = _submit(user, dataset, server.base, task="sum-graded", cache=True)
    assert _ended(stack, first_cached) is RunStatus.COMPLETED
    again = _submit(user, dataset, server.base, task="sum-graded", cache=True)
    assert _ended(stack, again) is RunStatus.COMPLETED
    assert user.status(first_cached.run_id).progress.grader_prompt_tokens > 0
    assert user.status(again.run_id).progress.grader_prompt_tokens == 0
    # a grader reads each target: on a split that is not viewable only an admin runs one
    operator = Client(stack.settings)
    operator.set_tier(dataset, "validation", Tier.NON_VIEWABLE)
    operator.close()
    with pytest.raises(TierRefusedError, match="model_graded task's grader tokens follow"):
        _submit(user, dataset, server.base, task="sum-graded")
    user.close()


def _result_lines(stack: Stack, run_id: str) -> list[str]:
    shown = subprocess.run(
        [sys.executable, "-c", "from evalq.shared.cli import main; main()", "results", run_id],
        env=cli_env(stack.server.url), cwd=REPO, capture_output=True, text=True, timeout=120,
        check=True,
    )  # fmt: skip
    return shown.stdout.splitlines()


def test_one_caller_s_huge_outputs_crowd_neither_redis_nor_another_caller(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """The attack review's endpoint answered each request with about 4 MB of text claiming one
    token, and every output was stored whole in Redis: another user's submits were answered
    503 and their 20-sample runs took up to 60 s. An answer longer than an output may be
    (``EVALQ_MAX_OUTPUT_BYTES``) is read no further and ends its sample ``endpoint/TooLarge``,
    untried again; an output over it, whatever made it, ``infer/OutputTooLarge``: neither is
    stored."""
    stack = fresh_stack
    noisy, quiet = Server(tmp_path / "noisy.log", key=None), Server(tmp_path / "quiet.log", None)
    try:
        noisy.control(pad=4_000_000)
        stack.start_workers()
        listed: dict[str, Any] = {noisy.base: {}, quiet.base: {}}
        agent, dataset = _place(stack, tmp_path / "data", 20, listed)
        token = Client(stack.settings).create_token("bob", Role.USER)
        before = int(stack.client.info("memory")["used_memory"])
        flood = [_submit(agent, dataset, noisy.base) for _ in range(3)]
        with gateway(stack.server.url, tmp_path / "gateway.log") as (api, _):
            bob = RemoteClient(api, token)
            took = []
            for _ in range(5):  # RemoteClient raises on any 503
                started = time.monotonic()
                meta = _submit(bob, dataset, quiet.base)  # type: ignore[arg-type]
                assert wait_ended(stack.client, meta.run_id, 120) is RunStatus.COMPLETED
                took.append(time.monotonic() - started)
            bob.close()
        for meta in flood:
            assert _ended(stack, meta) is RunStatus.FAILED
            errors = Client(stack.settings, admin=True).status(meta.run_id).errors
            assert errors == {"endpoint/TooLarge": 20}  # read no further than 320 KiB
        peak = int(stack.client.info("memory")["used_memory_peak"]) - before
        print(f"another caller's runs took {sorted(took)} s; Redis grew {peak / 2**20:.1f} MiB")
        assert noisy.stats()["answers"]["ok"] == 60  # every answer came, 4 MB each
        assert peak < 64 * 2**20  # 60 outputs of 4 MB would be 240 MB
    finally:
        noisy.stop()
        quiet.stop()


def test_stalled_endpoints_of_three_callers_hold_no_worker_a_fourth_caller_needs(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """The attack review's server held every request (answering after 120 s): the user's
    runs on it held every worker process, and another user's 5-sample run took 120.0 s
    instead of 0.6 s. A worker runs endpoint models' messages in its endpoint lane (threads,
    not its pool processes), where one principal runs at most half of the lane and a second
    message only while less than half the lane is taken; the reviews of that lane filled it
    with two stalled principals, then (each flooding in turn) three, and starved the next.
    Now a fourth caller's runs complete while every request of the three is still held by
    their server."""
    stack = fresh_stack
    stalled, quiet = Server(tmp_path / "stalled.log", key=None), Server(tmp_path / "q.log", None)
    try:
        stalled.control(stall=True)
        stack.start_workers()
        listed: dict[str, Any] = {stalled.base: {}, quiet.base: {}}
        agent, dataset = _place(stack, tmp_path / "data", 20, listed)
        carol, dave = (
            Client(stack.settings.model_copy(update={"principal": name}))
            for name in ("carol", "dave")
        )
        flood = []
        for flooding, caller in enumerate((agent, carol, dave), 1):  # each floods in turn
            flood += [_submit(caller, dataset, stalled.base) for _ in range(4)]

            def arrived(n: int = 8 * flooding) -> bool:  # each one's 8 (concurrency) held
                return len(stalled.stats()["arrivals"]) >= n

            wait_for(arrived, 60, "the flood")
        bob = Client(stack.settings.model_copy(update={"principal": "bob"}))
        for _ in range(3):
            meta = _submit(bob, dataset, quiet.base)
            assert _ended(stack, meta) is RunStatus.COMPLETED
        bob.close()
        carol.close()
        dave.close()
        assert stalled.stats()["answers"] == {}  # every request of the floods still held
        stalled.control(stall=False)
        for meta in flood:
            assert _ended(stack, meta) is RunStatus.COMPLETED
    finally:
        stalled.stop()
        quiet.stop()


def test_a_caller_s_runs_on_one_endpoint_keep_within_the_highest_concurrency_together(
    keyed: Stack, tmp_path: Path
) -> None:
    """The lane's review submitted two runs asking ``concurrency`` 4 and 3 of an endpoint whose
    ``max_concurrency`` is 4: the two ran at once in one worker and held 7 requests in flight.
    A worker process keeps one principal's requests to one endpoint within the highest
    ``concurrency`` its runs there ask (one gate per endpoint and principal)."""
    stack = keyed
    slow = Server(tmp_path / "slow.log", key=None)
    try:
        slow.control(delay=1.0)
        user, dataset = _place(stack, tmp_path / "data", 12, {slow.base: {"max_concurrency": 4}})
        runs = [_submit(user, dataset, slow.base, concurrency=c) for c in ("4", "3")]
        for meta in runs:
            assert _ended(stack, meta) is RunStatus.COMPLETED
        assert 3 <= slow.stats()["most_inflight"] <= 4
    finally:
        slow.stop()


def test_a_warm_shutdown_lets_the_endpoint_lane_s_jobs_end_and_asks_nothing_twice(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """The lane's review: lane threads were daemons nobody waited for, so a warm shutdown cut
    their requests, whose messages came back and were asked again (paid twice). As the
    consumer shuts down, the lane takes nothing more and its running jobs end first."""
    stack = fresh_stack
    slow = Server(tmp_path / "slow.log", key=None)
    try:
        slow.control(delay=3.0)
        workers = stack.start_workers()
        user, dataset = _place(stack, tmp_path / "data", 8, {slow.base: {}})
        meta = _submit(user, dataset, slow.base)
        wait_for(lambda: len(slow.stats()["arrivals"]) == 8, 60, "every request in flight")
        workers.stop(timeout=60)  # SIGTERM: a warm shutdown
        stack.workers.remove(workers)
        assert slow.stats()["answers"] == {"ok": 8}
        stack.start_workers()
        assert _ended(stack, meta) is RunStatus.COMPLETED
        assert len(slow.stats()["arrivals"]) == 8  # none asked again
    finally:
        slow.stop()


def _peak_rss(pid: int) -> int:
    """A process's peak resident memory so far, in bytes (``VmHWM``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])


def test_unread_results_streams_of_large_outputs_hold_little_of_the_gateway(
    keyed: Stack, tmp_path: Path
) -> None:
    """The attack review opened 8 results streams (a user's cap) on a run of ~4 MB outputs and
    read none: the gateway went from 247 MB to a 9,728 MB peak, reading 10,000 results at a
    time and joining 1,000 lines into one chunk. A stream now reads about
    :data:`evalq.producer.service.views.READ_BYTES` at a time, and holds one such chunk unread."""
    stack = keyed
    big = Server(tmp_path / "big.log", key=None)
    try:
        big.control(pad=250_000)  # under EVALQ_MAX_OUTPUT_BYTES: stored, 50 MB in all
        agent, dataset = _place(stack, tmp_path / "data", 200, {big.base: {}})
        meta = _submit(agent, dataset, big.base)
        assert _ended(stack, meta) is RunStatus.COMPLETED
        token = Client(stack.settings).create_token("agent", Role.USER)
        with gateway(stack.server.url, tmp_path / "gateway.log") as (api, process):
            url = f"{api}/v1/runs/{meta.run_id}/results"
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(timeout=60) as http:
                # one stream read whole first: what a read imports and caches is not growth
                whole = http.get(url, headers=headers)
                assert len(whole.text.splitlines()) == 200
                assert "date" not in whole.headers  # no answer carries the gateway's clock
                before = _peak_rss(process.pid)
                streams = [http.stream("GET", url, headers=headers) for _ in range(8)]
                opened = [stream.__enter__() for stream in streams]
                for answer in opened:  # each stream made its first chunk; none read further
                    assert answer.status_code == 200
                    assert next(answer.iter_raw(1))
                grown = (_peak_rss(process.pid) - before) / 1024
                print(f"8 unread streams: the gateway's peak grew {grown:.0f} MiB")
                # bounded by the reads' sizes, not the run's: each stream held less than one
                # copy of the run's 50 MB (it read all of it at once, then joined it: 2.4 GB)
                assert grown < 8 * 48
                for stream in streams:
                    stream.__exit__(None, None, None)
    finally:
        big.stop()


def test_a_run_holds_no_more_of_redis_than_the_run_bytes_cap(
    fresh_stack: Stack, tmp_path: Path
) -> None:
    """Outputs each under ``EVALQ_MAX_OUTPUT_BYTES`` still add up: a run of 20 answers of
    200 KB holds 4 MB. Over ``EVALQ_MAX_RUN_BYTES`` (here 1 MiB) a batch's outputs are stored
    nowhere and end ``infer/RunTooLarge``; a run within it completes."""
    stack = fresh_stack
    big = Server(tmp_path / "big.log", key=None)
    try:
        big.control(pad=200_000)
        stack.start_workers(EVALQ_MAX_RUN_BYTES=str(2**20))
        agent, dataset = _place(stack, tmp_path / "data", 20, {big.base: {}})
        meta = _submit(agent, dataset, big.base)
        assert _ended(stack, meta) is RunStatus.FAILED
        admin = Client(stack.settings, admin=True)
        assert admin.status(meta.run_id).errors == {"infer/RunTooLarge": 20}
        big.control(pad=20_000)  # 400 KB in all
        small = _submit(agent, dataset, big.base)
        assert _ended(stack, small) is RunStatus.COMPLETED
        admin.close()
    finally:
        big.stop()
