"""The code's shape: every package is in the wheel, the public import path is shared's own
objects, and no product module outgrows one sitting."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

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


def test_a_module_named_like_evalqs_own_is_refused_in_one_line(tmp_path: Path) -> None:
    """A user's ``worker.py`` earlier on the path than evalq's ``worker`` package: the command
    line says so in one line (exit 1) instead of half-starting on the wrong code."""
    (tmp_path / "worker.py").write_text("raise SystemExit('the decoy was imported')\n")
    script = "import sys; sys.path.insert(0, sys.argv[1]); from shared.cli import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: the module 'worker' at {tmp_path / 'worker.py'} is not evalq's own (evalq's is "
        f"under {REPO}): rename yours or run evalq from another directory"
    )
    assert not result.stdout
