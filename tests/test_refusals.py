"""Refusals in one line that say no more than they must: what the attack review of the gateway
found (a run id with a newline printed on two lines, a masked path that ate the message's
closing parenthesis, an OS error that told a user which folders exist outside the model roots).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evalq.producer.gateway.errors import _PATH
from evalq.shared.access.policy import admit_model
from evalq.shared.errors import TierRefusedError, UnknownRunError
from evalq.shared.lm.spec import ModelSpec, canonical
from evalq.shared.names import check_run_id


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
