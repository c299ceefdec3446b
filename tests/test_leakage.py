"""Label leakage to an adaptive caller, end to end through the gateway: a ``user`` token, a
``non_viewable`` split of 200 binary labels (balanced), a budget of 200 runs, and two attacks
that recover every label when aggregates are exact: differencing runs over chosen ids
(Denning, Denning & Schwartz 1979) and a candidate that flips its answer on one input at a
time (Whitehill 2016). Under the default policy (the server draws samples, the Ladder
releases aggregates) each infers labels no better than chance; an honest loop still sees a
better candidate score higher."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis

from evalq.producer.clients.remote import RemoteClient
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.producer.service.policy_file import PolicyFile
from evalq.producer.service.submit import SubmitRequest
from evalq.shared.access.policy import Tier
from evalq.shared.access.roles import Role
from evalq.shared.connection import connect
from evalq.shared.errors import RemoteError, TierRefusedError
from evalq.shared.models import RunStatus
from evalq.shared.queue.celery_app import create_app
from evalq.shared.settings import Settings
from tests.helpers import REPO, audit_entries, gateway, wait_for, wilson, write_rows

pytestmark = pytest.mark.integration

N = 200
DATASET = "board"


def _labels() -> list[int]:
    labels = [0] * (N // 2) + [1] * (N // 2)
    random.Random(16).shuffle(labels)
    return labels


LABELS = _labels()


def _rows() -> list[dict[str, object]]:
    """Item names the attacker knows, labels it must not learn, and a visible cue that equals
    the label on 9 rows of 10 (what an honest candidate can learn to use)."""
    tag = uuid.uuid4().hex[:8]
    return [
        {"text": f"item-{i} {tag}", "cue": label if i % 10 else 1 - label, "label": label}
        for i, label in enumerate(LABELS)
    ]


@dataclass
class Board:
    api: str
    tokens: dict[str, str]
    operator: Client
    store: redis.Redis
    callers: list[RemoteClient]

    def caller(self, principal: str, admin: bool = False) -> RemoteClient:
        """A client of the gateway holding ``principal``'s token (closed with the board)."""
        self.callers.append(RemoteClient(self.api, self.tokens[principal], admin))
        return self.callers[-1]


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Board]:
    root = tmp_path_factory.mktemp("board")
    server = RedisServer(root / "redis").start()
    archive = str(root / "archive")  # the runs' archives stay in the test's folder
    settings = Settings(
        redis_url=server.url, plugins=("tests.plugins",), principal="op", archive_url=archive
    )
    operator = Client(settings, admin=True)
    for split in ("heldout", "exact"):
        write_rows(root / "data", split, _rows())
    operator.add_dataset(DATASET, str(root / "data"))
    limits = {"runs": N, "samples": None, "max_samples_per_run": None}
    policy = {
        split: {"tier": "non_viewable", "principals": {p: limits for p in ("mallory", "honest")}}
        for split in ("heldout", "exact")
    }
    policy["exact"]["release"] = "exact"
    operator.apply_policy(PolicyFile.model_validate({"datasets": {DATASET: policy}}))
    tokens = {p: operator.create_token(p, Role.USER) for p in ("mallory", "honest")}
    tokens["root"] = operator.create_token("root", Role.ADMIN)
    # Each flip candidate has its own params, hence its own warm model in the worker: with the
    # default EVALQ_MAX_MODELS (2) the runs the dispatcher interleaves evicted each other about
    # three times a run, each eviction a full garbage collection (~0.17 s with torch imported),
    # 100 of a flip attack's 138 s. The guess "model" is None: keeping all ~200 costs nothing.
    workers = LocalWorkers(
        server.url,
        env={
            "EVALQ_PLUGINS": "tests.plugins",
            "PYTHONPATH": str(REPO),
            "EVALQ_MAX_BATCH": "256",
            "EVALQ_MAX_MODELS": "1000",
            "EVALQ_ARCHIVE_URL": archive,
        },
        log_dir=root,
    )
    workers.start(create_app(settings))
    try:
        # The user's request rate (20/s by default, tests/test_gateway_limits.py tests it) only
        # paces the attacker: a flip attack's ~420 requests took 20 s of waiting. What a run
        # releases is the Ladder's to decide, and it does not depend on the pace.
        with gateway(
            server.url, root / "gateway.log", EVALQ_GATEWAY_RATE="1000", EVALQ_ARCHIVE_URL=archive
        ) as (api, _):
            board = Board(api, tokens, operator, connect(server.url), [])
            yield board
            for caller in board.callers:
                caller.close()
            board.store.close()
    finally:
        workers.stop()
        operator.close()
        server.stop()


def _accuracies(caller: RemoteClient, run_ids: list[str]) -> list[float | None]:
    """Each run's released accuracy (None if withheld), read in submission order once all
    have ended (waiting reads counts only, which release nothing)."""
    waiting = list(run_ids)

    def ended() -> bool:
        while waiting and not caller.progress(waiting[0])[0].status.active:
            waiting.pop(0)
        return not waiting

    wait_for(ended, 300, f"{len(run_ids)} runs to end")
    views = [caller.status(r) for r in run_ids]
    assert all(v.meta.status is RunStatus.COMPLETED for v in views)
    return [None if v.aggregate is None else v.aggregate["accuracy"] for v in views]


def _flip_attack(caller: RemoteClient, split: str) -> list[int]:
    """A constant-0 candidate, then one run per item 0..N-2 flipping its answer on that item
    only: the accuracy going up says the item's label is 1, down says 0; the last label is
    what the baseline's count leaves. Unknown labels are guessed 0."""
    candidates = [{"base": "0"}] + [{"base": "0", "flip": f"item-{i}"} for i in range(N - 1)]
    run_ids = [
        caller.submit(SubmitRequest(eval="guess", dataset=DATASET, split=split, params=p)).run_id
        for p in candidates
    ]
    baseline, *flipped = _accuracies(caller, run_ids)
    assert baseline is not None
    guesses = []
    for value in flipped:
        assert value is not None
        guesses.append(1 if value > baseline else 0)
    ones_left = round((1 - baseline) * N) - sum(guesses)
    return [*guesses, 1 if ones_left == 1 else 0]


def _differencing_attack(caller: RemoteClient, split: str) -> list[int]:
    """Runs of five chosen ids of the constant-0 candidate (accuracy x 5 = the zeros among
    them): the six leave-one-out sets of ids 0..5, then {0, 1, 2, 3, i} for every other i.
    Refused runs teach nothing: every label is then guessed 0."""
    sets = [[j for j in range(6) if j != k] for k in range(6)]
    sets += [[0, 1, 2, 3, i] for i in range(6, N)]
    run_ids, refusals = [], set()
    for ids in sets:
        request = SubmitRequest(eval="guess", dataset=DATASET, split=split, ids=tuple(ids))
        try:
            run_ids.append(caller.submit(request).run_id)
        except RemoteError as exc:
            refusals.add(exc.exit_code)
    assert refusals <= {TierRefusedError.exit_code}  # refused for the tier, nothing else
    accuracies = _accuracies(caller, run_ids)
    if len(run_ids) < len(sets) or None in accuracies:
        return [0] * N
    counts = [round(5 * a) for a in accuracies if a is not None]
    total = sum(counts[:6]) / 5
    first = [round(total - c) for c in counts[:6]]
    rest = [counts[6 + k] - sum(first[:4]) for k in range(N - 6)]
    return [1 - zero for zero in first + rest]


def _right(guesses: list[int]) -> tuple[float, float, float]:
    """The fraction of labels guessed right, with its 95% Wilson interval."""
    return wilson(sum(g == y for g, y in zip(guesses, LABELS, strict=True)), len(LABELS))


def _report(name: str, guesses: list[int]) -> tuple[float, float, float]:
    right = _right(guesses)
    print(f"{name}: {right[0]:.3f} of {N} labels right (95% CI {right[1]:.3f}-{right[2]:.3f})")
    return right


def test_the_flip_attack_learns_nothing_under_the_default_ladder(board: Board) -> None:
    fraction, low, high = _report("flip, default", _flip_attack(board.caller("mallory"), "heldout"))
    assert low <= 0.5 <= high  # no better than chance
    assert fraction <= 0.5
    # the Ladder never moved: every flip read back the baseline's value
    released = [
        e
        for e in audit_entries(board.store)
        if (e["action"], e["who"], e["split"]) == ("released", "mallory", "heldout")
    ]
    assert len(released) == N
    assert sum('"first run"' in e["after"] for e in released) == 1


def test_the_flip_attack_recovers_every_label_when_released_exactly(board: Board) -> None:
    fraction, *_ = _report("flip, release: exact", _flip_attack(board.caller("mallory"), "exact"))
    assert fraction == 1.0


def test_the_differencing_attack_is_refused_to_a_user_and_works_for_an_admin(
    board: Board,
) -> None:
    guesses = _differencing_attack(board.caller("mallory"), "heldout")
    mallory = _report("differencing, user", guesses)
    assert mallory[1] <= 0.5 <= mallory[2]
    root = board.caller("root", admin=True)
    assert _report("differencing, admin", _differencing_attack(root, "heldout"))[0] == 1.0


def test_an_honest_loop_sees_a_better_candidate_score_higher(board: Board) -> None:
    honest = board.caller("honest")
    runs = [
        honest.submit(SubmitRequest(eval="guess", dataset=DATASET, split="heldout", params=p))
        for p in ({"base": "0"}, {"use_cue": "1"})
    ]
    constant, cued = _accuracies(honest, [r.run_id for r in runs])
    assert constant is not None
    assert cued is not None
    assert (constant, cued) == (0.5, 0.9)  # exact 0.5 and 0.9 on the grid of 0.1
    exact = [board.operator.status(r.run_id).aggregate for r in runs]
    assert exact == [{"accuracy": 0.5}, {"accuracy": 0.9}]
    assert board.operator.status(runs[1].run_id).release is None  # admins see exact values
    view = honest.status(runs[1].run_id)
    assert view.release is not None
    assert view.release.rule == "ladder, eta 0.1"
    assert Tier(view.tier) is Tier.NON_VIEWABLE
