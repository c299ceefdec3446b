"""Evaluations declare their parameters: an undeclared name, or a value of the wrong type, is
refused with the list of the declared ones (exit 2) before anything is charged, through both
doors (Redis directly, and the gateway)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalq.producer.service.client import Client
from evalq.shared.access.ledger import Ledger
from evalq.shared.errors import ParamError
from evalq.shared.evaluation import create, load_plugins
from evalq.shared.keys import RUNS
from tests.conftest import Door, Stack
from tests.helpers import labelled_rows, list_splits, write_rows

pytestmark = pytest.mark.integration

GUESS = "base (int, default 0), flip (str, default ''), use_cue (bool, default False)"


def test_params_are_typed_with_defaults() -> None:
    load_plugins(["tests.plugins"])
    assert create("guess", {"base": "1", "use_cue": "true"}).args.model_dump() == {
        "base": 1, "flip": "", "use_cue": True,
    }  # fmt: skip
    with pytest.raises(ParamError, match="evaluation 'null' takes no parameters, got 'x'"):
        create("null", {"x": "1"})
    with pytest.raises(ParamError, match="needs parameter 'calls'"):
        create("spy_close", {})
    assert create("arithmetic", {"tolerance": "0.5"}).args.model_dump() == {"tolerance": 0.5}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--param", "bse=1"],
            f"error: evaluation 'guess' has no parameter 'bse' (its parameters: {GUESS})",
        ),
        (
            ["--sweep", "Base=0,1"],
            f"error: evaluation 'guess' has no parameter 'Base' (its parameters: {GUESS})",
        ),
        (  # a later point's value: refused before the first point is submitted
            ["--sweep", "base=0,1,one"],
            "error: evaluation 'guess' parameter 'base' = 'one': Input should be a valid "
            f"integer, unable to parse string as an integer (its parameters: {GUESS})",
        ),
        (
            ["--param", "base=one"],
            "error: evaluation 'guess' parameter 'base' = 'one': Input should be a valid "
            f"integer, unable to parse string as an integer (its parameters: {GUESS})",
        ),
    ],
)
def test_an_undeclared_or_mistyped_param_is_refused_before_any_charge(
    stack: Stack, door: Door, tmp_path: Path, options: list[str], message: str
) -> None:
    folder = tmp_path / "data"
    write_rows(folder, "validation", labelled_rows(5))
    name = list_splits(stack.client, folder, "validation")
    Client(stack.settings).set_budget(
        name, "validation", runs=10, samples=100, max_samples_per_run=None
    )
    before = stack.client.zcard(RUNS)
    refused = door.run("submit", "guess", "--dataset", name, "--split", "validation", *options)
    assert (refused.returncode, refused.stderr.strip()) == (2, message)
    assert stack.client.zcard(RUNS) == before
    (budget,) = [b for b in Ledger(stack.client).all() if b.dataset == name]
    assert (budget.runs_used, budget.samples_used) == (0, 0)
