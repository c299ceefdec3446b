"""Refusals in one line that say no more than they must: what the attack review of the gateway
found (a run id with a newline printed on two lines, a masked path that ate the message's
closing parenthesis, an OS error that told a user which folders exist outside the model roots).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from evalq.producer.gateway.errors import _PATH
from evalq.producer.service.views import SampleQuery
from evalq.shared.access.policy import admit_model
from evalq.shared.errors import InputError, TierRefusedError, UnknownRunError
from evalq.shared.lm.spec import ModelSpec, canonical
from evalq.shared.names import check_run_id
from evalq.shared.store.archive import Chunk
from evalq.shared.store.pages import PAGE_BYTES, PAGE_STEP, _capped


@pytest.mark.parametrize("run_id", ["0123abcd\n", "0123\nabcd", "0123abcd\r\n", "x" * 3])
def test_a_run_id_that_is_no_run_is_refused_in_one_line(run_id: str) -> None:
    with pytest.raises(UnknownRunError) as refused:
        check_run_id(run_id)
    message = str(refused.value)
    assert message.startswith("no run '")
    assert "\n" not in message
    assert "\r" not in message


def test_a_masked_path_keeps_the_punctuation_of_its_message() -> None:
    message = "model refused: /a/b is not inside a model root (EVALQ_MODEL_ROOTS: /models, /m2)."
    assert _PATH.sub("<path>", message) == (
        "model refused: <path> is not inside a model root (EVALQ_MODEL_ROOTS: <path>, <path>)."
    )


def test_a_folder_whose_links_cannot_be_followed_is_refused_as_any_outside_the_roots(
    tmp_path: Path,
) -> None:
    """A link loop (or a folder the gateway may not enter) is named by its path as written and
    judged by the policy (exit 3, like every folder outside the roots), never answered with
    the OS's error (exit 2), which told what exists where."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    spec = canonical(ModelSpec.parse(f"hf/{tmp_path}/loop/model"))
    assert spec.name == f"{tmp_path}/loop/model"
    roots = [tmp_path / "models"]
    with pytest.raises(TierRefusedError, match="is not inside a model root"):
        admit_model(spec.name, admin=False, roots=roots)


def test_a_page_of_huge_outputs_is_cut_short_and_read_no_further() -> None:
    """The viewer's attack review: a page of 500 outputs of megabytes was read, held and sent
    whole (one page of 60 MB took the gateway 400 MB). A page stops at PAGE_BYTES of stored
    text (never before its first sample), and the steps after it are not read."""
    asked: list[list[int]] = []

    def read(keys: list[int]) -> Chunk:
        asked.append(keys)
        big = "x" * (3 << 20)
        return Chunk(keys, [big] * len(keys), ['{"ok": 1.0}'] * len(keys), [None] * len(keys))

    page = _capped(read, list(range(500)))
    assert page is not None
    assert page.sample_ids == [0, 1]  # 3 MB + 3 MB under 8 MB; a third would pass it
    assert asked == [list(range(PAGE_STEP))]
    huge = _capped(lambda keys: Chunk(keys, ["y" * (9 << 20)] * 2, [None] * 2, [None] * 2), [7, 8])
    assert huge is not None
    assert huge.sample_ids == [7]  # the first sample always comes, whatever its size
    assert PAGE_BYTES == 8 << 20


@pytest.mark.parametrize("ids", [[2**63], [-1]])
def test_a_sample_id_beyond_what_a_page_reads_is_bad_input(ids: list[int]) -> None:
    """``ids=9223372036854775808`` was an OverflowError and a 500."""
    with pytest.raises(ValidationError, match="ids"):
        SampleQuery(ids=ids)


@pytest.mark.parametrize("mark", ["\u202e", "\u2066", "\u200b", "\x85"])
def test_a_model_name_with_a_formatting_character_is_refused(mark: str) -> None:
    """``openai/gpt\\u202e4-ipa`` was accepted and listed as ``openai/gptapi-4``."""
    with pytest.raises(InputError, match="control or formatting characters"):
        ModelSpec.parse(f"openai/gpt{mark}4-ipa", {})


def test_a_home_that_cannot_be_expanded_is_judged_as_a_path() -> None:
    spec = canonical(ModelSpec.parse("hf/~nosuchuser-evalq/x", {}))
    assert spec.name.endswith("/~nosuchuser-evalq/x")
    with pytest.raises(TierRefusedError, match="is not inside a model root"):
        admit_model(spec.name, admin=False, roots=[Path("/models")])
