"""The code's shape: every package is in the wheel, the public import path is shared's own
objects, and no product module outgrows one sitting."""

from __future__ import annotations

import importlib
import tomllib

from setuptools import find_packages

import shared.evaluation
import shared.failures
from tests.helpers import REPO


def test_every_package_is_listed_for_the_wheel() -> None:
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = find_packages(str(REPO), include=["shared*", "producer*", "worker*"])
    assert sorted(listed["packages"]) == sorted([*found, "evalq"])


def test_plugins_import_evalqs_own_objects_from_evalq() -> None:
    evalq = importlib.import_module("evalq")  # installed from shared/public (package-dir)
    assert evalq.Evaluation is shared.evaluation.Evaluation
    assert evalq.register is shared.evaluation.register
    assert evalq.FailurePolicy is shared.failures.FailurePolicy
    assert set(evalq.__all__) <= set(dir(evalq))


def test_no_product_module_is_over_500_lines() -> None:
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for package in ("shared", "producer", "worker")
        for path in (REPO / package).rglob("*.py")
    }
    assert {path: n for path, n in sizes.items() if n > 500} == {}
