"""The code's shape: every package is in the wheel under the one top-level name ``evalq``, the
public import path is shared's own objects, no product module outgrows one sitting, and the
CLI's quick answers (``--help``, a usage error, a read through the gateway) import only what
they use."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from setuptools import find_packages

from evalq import shared as evalq_shared
from tests.helpers import REPO, cli_env


def _setuptools() -> dict[str, Any]:
    setuptools: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]
    return setuptools


def test_every_package_is_listed_for_the_wheel_under_evalq() -> None:
    """Each folder's packages are installed under ``evalq.`` (``shared/access`` as
    ``evalq.shared.access``); ``shared/public`` is ``evalq`` itself."""
    found = find_packages(str(REPO), include=["shared*", "producer*", "worker*"])
    expected = ["evalq", *(f"evalq.{name}" for name in found if name != "shared.public")]
    assert sorted(_setuptools()["packages"]) == sorted(expected)


def test_evalq_is_the_only_top_level_name_installed() -> None:
    """Nothing named ``shared``, ``producer`` or ``worker`` lands on a user's path: every
    package is under ``evalq``, each folder mapped there by ``package-dir``, and the entry
    points name ``evalq.`` modules only."""
    setuptools = _setuptools()
    assert {name.split(".")[0] for name in setuptools["packages"]} == {"evalq"}
    assert setuptools["package-dir"] == {
        "evalq": "shared/public",
        "evalq.shared": "shared",
        "evalq.producer": "producer",
        "evalq.worker": "worker",
    }
    for entry in (*entry_points(group="console_scripts", name="evalq"),
                  *entry_points(group="evalq.commands")):  # fmt: skip
        assert entry.value.startswith("evalq."), entry
    probe = "import importlib.util as u; print([n for n in NAMES if u.find_spec(n)])"
    found = subprocess.run(
        [sys.executable, "-P", "-c", probe.replace("NAMES", '("shared", "producer", "worker")')],
        cwd="/", capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert found.stdout.strip() == "[]", "importable outside the repository"


def test_plugins_import_evalqs_own_objects_from_evalq() -> None:
    evalq = importlib.import_module("evalq")  # installed from shared/public (package-dir)
    assert evalq.Evaluation is evalq_shared.evaluation.Evaluation
    assert evalq.register is evalq_shared.evaluation.register
    assert evalq.FailurePolicy is evalq_shared.failures.FailurePolicy
    assert set(evalq.__all__) <= set(dir(evalq))


@pytest.mark.integration
def test_modules_named_like_the_repositorys_folders_never_stand_in(tmp_path: Path) -> None:
    """A user's ``worker.py``, ``shared.py`` and ``producer.py`` first on ``sys.path`` (each
    fails loudly if imported): evalq imports its own packages, which are ``evalq.*``."""
    for name in ("shared", "producer", "worker"):
        (tmp_path / f"{name}.py").write_text(f"raise SystemExit('the decoy {name} was imported')\n")
    script = "import sys; sys.path.insert(0, sys.argv.pop(1)); from evalq.shared.cli import main; "
    script += "main()"
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "submit" in result.stdout


@pytest.mark.integration
def test_the_wheel_builds_without_warnings_and_holds_every_data_file(tmp_path: Path) -> None:
    """``pip install .`` printed a "Package ... is absent from the `packages` configuration"
    block for each folder of data files (lua/, web/); the wheel now builds without one and holds
    each of those files, the arithmetic task's scorer script among them."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("shared", "producer", "worker"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "-v", "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert "absent from the `packages` configuration" not in built.stdout + built.stderr
    (wheel,) = (tmp_path / "wheel").glob("evalq-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {
        f"evalq/{path.relative_to(REPO)}"
        for package in ("shared", "producer", "worker")
        for path in (REPO / package).rglob("*")
        if path.is_file() and (path.suffix not in (".py", ".pyc") or path.parent.name == "scripts")
    }
    data = {name.replace("evalq/shared/public/", "evalq/") for name in data}
    assert data, "no data files found"
    assert data <= names, sorted(data - names)


def _layout_names() -> dict[str, set[str]]:
    """The modules ``docs/architecture.md``'s layout block names, by folder (``shared/store``,
    ``producer/gateway``, ...): a line starting a folder (``worker/``, ``  store/`` under
    ``shared/``, two spaces a level) opens it, and every ``name.py`` up to the next folder is
    in it."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text[text.index("```\nshared/") + 4 :]
    block = block[: block.index("```")]
    named: dict[str, set[str]] = {}
    folders: list[str] = []
    for line in block.splitlines():
        head = re.match(r"^( *)([a-z_]+)/\s", line)
        if head is not None:
            depth = len(head.group(1)) // 2
            folders = [*folders[:depth], head.group(2)]
        folder = "/".join(folders)
        for name in re.findall(r"\b([a-z_0-9]+)\.py\b", line):
            named.setdefault(folder, set()).add(name)
    return named


def test_the_architecture_layout_names_every_product_module() -> None:
    """Every module of ``shared/``, ``producer/`` and ``worker/`` (and their sub-packages)
    is named in the layout of ``docs/architecture.md`` under its folder, and nothing is named
    there that does not exist."""
    named = _layout_names()
    present: dict[str, set[str]] = {}
    for top in ("shared", "producer", "worker"):
        for path in (REPO / top).rglob("*.py"):
            if path.name == "__init__.py" or "web" in path.parts:
                continue
            folder = str(path.parent.relative_to(REPO))
            present.setdefault(folder, set()).add(path.stem)
    missing = {f: sorted(m - named.get(f, set())) for f, m in present.items()}
    assert {f: m for f, m in missing.items() if m} == {}
    stale = {f: sorted(n - present.get(f, set())) for f, n in named.items()}
    assert {f: n for f, n in stale.items() if n} == {}


HEAVY = (
    "torch", "datasets", "celery", "pyarrow", "numpy", "scipy", "redis", "transformers", "yaml",
    "evalq.shared.lm.task", "evalq.shared.lm.spec", "evalq.shared.data.spec",
    "evalq.shared.access.dataset",
)  # fmt: skip
"""What none of the CLI's quick answers imports: the heavy libraries, and evalq's models of
language tasks and dataset specs (dozens of pydantic models, built as they are imported)."""
LOCAL = ("pydantic_settings", "evalq.shared.settings", "evalq.shared.models")
"""What an answer that asks no gateway imports neither: the settings (pydantic-settings, which
imports asyncio) and the run models. The options' choices are :mod:`evalq.shared.choices`'."""
GATEWAY = {"EVALQ_API_URL": "http://127.0.0.1:1", "EVALQ_TOKEN": "not-a-token"}
"""A gateway nothing listens on: the read fails only once the command has asked it."""


@pytest.mark.parametrize(
    ("args", "env", "absent"),
    [
        (["--help"], {}, (*LOCAL, "pydantic")),
        (["submit", "--help"], {}, LOCAL),
        (["status", "not a run!"], {}, LOCAL),
        (["compare", "--bad"], {}, LOCAL),
        (["status", "0123456789abcdef"], GATEWAY, ()),
        (["runs"], GATEWAY, ()),
        (["compare", "0123", "4567"], GATEWAY, ()),
    ],
)
@pytest.mark.integration
def test_help_usage_errors_and_gateway_reads_import_no_heavy_library(
    args: list[str], env: dict[str, str], absent: tuple[str, ...]
) -> None:
    """``evalq --help``, a usage error and a read through the gateway load none of torch,
    datasets, Celery, pyarrow, numpy, scipy, redis or yaml, nor the language task and dataset
    spec models (each imported by the commands, or the functions, that use it); without a
    gateway, none of the settings or the run models either, and ``evalq --help`` no pydantic at
    all (typer imports it to convert a command's options; the app's own help converts none).
    The gateway reads ask one nothing listens on, and say so."""
    script = (
        "import sys; from evalq.shared.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print(sorted(m for m in {(*HEAVY, *absent)!r} if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *args], env=cli_env("redis://127.0.0.1:1/0", **env),
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
    if env:
        assert "cannot reach the gateway at http://127.0.0.1:1" in done.stderr, done.stderr


def test_no_lua_script_spells_a_run_status_or_a_fair_dispatcher_function_outside_its_room() -> None:
    """Run statuses reach the scripts as ``STATUS`` (generated from ``RunStatus``): no
    script's code spells one; and the fair dispatcher's functions live in the queue package's
    prelude, not in the store's, which every script carries."""
    from evalq.shared.choices import RunStatus

    for path in REPO.glob("shared/*/lua/*.lua"):
        code = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        for status in RunStatus:
            assert f"'{status.value}'" not in code or status is RunStatus.FAILED, (path, status)
        assert "'queued'" not in code, path
    store = (REPO / "shared/store/lua/prelude.lua").read_text()
    assert "local function fair_" not in store
    assert "local function fair_dispatch" in (REPO / "shared/queue/lua/prelude.lua").read_text()
