"""The gate in a worker's main process (``evalq.worker.intake.admit``), in-process: every hostile
shape of message is refused with a one-line reason, before anything is decoded that is not
JSON; a real payload passes with its ids as strict ints."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from kombu.message import Message
from kombu.utils.json import dumps

from evalq.shared.errors import PayloadError
from evalq.shared.models import MAX_MESSAGE_SAMPLES, MAX_SAMPLE_ID
from evalq.worker.intake import MAX_BODY_BYTES, admit

FP = "a" * 64
GOOD: dict[str, Any] = {"run_id": "r1", "eval": "spy", "spec": FP, "sample_ids": [3, 4]}


def _message(body: Any, content_type: str = "application/json", **headers: Any) -> Message:
    raw: Any = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Message(
        body=raw,  # bytes, as transports pass it (kombu's annotation says str)
        content_type=content_type,
        content_encoding="utf-8" if content_type == "application/json" else "binary",
        headers={"task": "evalq.infer", "id": "t1", **headers},
        accept=["application/json"],
    )


def test_a_real_payload_passes() -> None:
    task = admit(_message([[], GOOD, {"callbacks": None, "chain": None}]))
    assert task.sample_ids == [3, 4]
    assert task.run_id == "r1"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"not": "a list"}, "body is not [args, kwargs, embed]"),
        ([1], "body is not [args, kwargs, embed]"),
        ("string", "body is not [args, kwargs, embed]"),
        (None, "body is not [args, kwargs, embed]"),
        ([[], {}, {}, {}], "body is not [args, kwargs, embed]"),
        ([["x"], GOOD, {}], "positional arguments are not accepted"),
        ([[], GOOD, []], "callbacks and workflows are not accepted"),
        ([[], GOOD, {"chain": [{"task": "evalq.score"}]}], "callbacks and workflows"),
        ([[], {**GOOD, "sample_ids": ["3"]}, {}], "not an evalq payload: sample_ids.0"),
        ([[], {**GOOD, "sample_ids": [True]}, {}], "not an evalq payload: sample_ids.0"),
        ([[], {**GOOD, "sample_ids": [3.0]}, {}], "not an evalq payload: sample_ids.0"),
        ([[], {**GOOD, "sample_ids": [-1]}, {}], "not an evalq payload: sample_ids.0"),
        ([[], {**GOOD, "sample_ids": [10**30]}, {}], "not an evalq payload: sample_ids.0"),
        ([[], {**GOOD, "solo": 1}, {}], "not an evalq payload: solo"),
        ([[], {**GOOD, "run_id": 5}, {}], "not an evalq payload: run_id"),
        ([[], {**GOOD, "extra": 1}, {}], "not an evalq payload: extra"),
        ([[], [1, 2], {}], "not an evalq payload"),
    ],
)
def test_every_malformed_body_is_refused_in_one_line(body: Any, reason: str) -> None:
    with pytest.raises(PayloadError, match=None) as refused:
        admit(_message(body))
    assert str(refused.value).startswith(reason)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({"id": None}, "no task id header"),
        ({"id": 7}, "no task id header"),
        ({"eta": "2999-01-01T00:00:00"}, "header 'eta' is not accepted"),
        ({"expires": "2999-01-01T00:00:00"}, "header 'expires' is not accepted"),
        ({"compression": "application/x-gzip"}, "header 'compression' is not accepted"),
    ],
)
def test_headers_evalq_never_sends_are_refused(headers: dict[str, Any], reason: str) -> None:
    with pytest.raises(PayloadError) as refused:
        admit(_message([[], GOOD, {}], **headers))
    assert str(refused.value) == reason


def test_other_content_types_are_refused_without_being_decoded(tmp_path: Path) -> None:
    class Trap:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (tmp_path / "unpickled",))

    payloads = [
        (pickle.dumps(Trap()), "application/x-python-serialize"),
        (
            f"!!python/object/apply:os.system ['touch {tmp_path}/yaml']".encode(),
            "application/x-yaml",
        ),
        (b"plain", "text/plain"),
    ]
    for payload, content_type in payloads:
        with pytest.raises(PayloadError, match="is not application/json"):
            admit(_message(payload, content_type))
    assert list(tmp_path.iterdir()) == []


def test_the_largest_payload_a_producer_sends_fits_the_body_limit() -> None:
    """A message of the most ids a message may carry, each as large as an id may be, as the
    producer encodes it (Celery's task protocol through kombu's JSON), passes the gate."""
    ids = list(range(MAX_SAMPLE_ID - MAX_MESSAGE_SAMPLES, MAX_SAMPLE_ID))
    kwargs = {"run_id": "r" * 64, "eval": "e" * 64, "spec": FP, "sample_ids": ids}
    body = dumps([[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    assert admit(_message(body.encode())).sample_ids == ids


def test_a_huge_or_undecodable_body_is_refused() -> None:
    with pytest.raises(PayloadError, match="larger than"):
        admit(_message([[], {**GOOD, "run_id": "x" * MAX_BODY_BYTES}, {}]))
    with pytest.raises(PayloadError, match="cannot be decoded"):
        admit(_message(b"{not json"))
