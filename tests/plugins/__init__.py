"""Evaluations used by the tests: fakes at the outer edge (the model), nothing else."""

from __future__ import annotations

import gc
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from evalq.shared.evaluation import Evaluation, Parameters, register
from evalq.shared.failures import FailurePolicy
from evalq.shared.scorer import ScriptCall, ScriptScorer

LABELS = ("label", "secret")


def predict(text: str) -> int:
    """The spy's deterministic 'model': a rule the tests can recompute directly."""
    return len(text) % 3


@register("spy")
class Spy(Evaluation):
    """Reports which fields reached ``infer()``; predicts ``len(text) % 3``."""

    label_fields = LABELS
    output_kind = "spy-prediction"

    def load(self, device: str) -> Any:
        return {"device": device}

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        return [{"fields": sorted(row), "pred": predict(row["text"])} for row in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {
            "correct": float(output["pred"] == row["label"]),
            "saw_label": float("label" in row),
        }


@register("flaky")
class Flaky(Evaluation):
    """Fails inference on texts containing 'boom' and scoring on texts containing 'bust'."""

    label_fields = ("label",)

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        if any("boom" in row["text"] for row in rows):
            raise RuntimeError("boom in the batch")
        return [{"pred": predict(row["text"])} for row in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        if "bust" in row["text"]:
            raise ValueError("cannot score a bust")
        return {"correct": float(output["pred"] == row["label"])}


WORDS = ("zero", "one", "two")


@register("worded")
class Worded(Evaluation):
    """The spy's prediction as a word: an output that is a string (``"two"``), scored
    ``exact_match`` (its params change nothing: they are what a listing shows)."""

    label_fields = LABELS

    class Params(Parameters):
        prompt: str = "plain"
        temperature: float = 0.0

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        return [WORDS[predict(row["text"])] for row in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"exact_match": float(output == WORDS[row["label"]])}


@register("spy_close")
class SpyClose(Spy):
    """Scores the spy's outputs more leniently (within one of the label); its ``infer()``
    appends a line to the file named by param ``calls``, so a test can see it never ran."""

    class Params(Parameters):
        calls: str

    args: Params

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        with open(self.args.calls, "a", encoding="utf-8") as calls:
            calls.write(f"{len(rows)}\n")
        return super().infer(model, rows)

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"close": float(abs(output["pred"] - row["label"]) <= 1)}


@register("slow")
class Slow(Spy):
    """The spy with a model that takes 5 ms per row. With params ``gate`` (a file path) and
    ``open_until`` (a sample number), samples numbered from ``open_until`` on wait until the
    gate file exists, so a test can interrupt a run at a known point."""

    class Params(Parameters):
        gate: str = ""
        open_until: int = 0

    args: Params

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        gate, limit = self.args.gate, self.args.open_until
        if gate and any(int(row["text"].split()[1]) >= limit for row in rows):
            while not Path(gate).exists():
                time.sleep(0.05)
        time.sleep(0.005 * len(rows))
        return super().infer(model, rows)


@register("slow_score")
class SlowScore(Spy):
    """The spy with a scorer that takes ``score_ms`` (param, default 5) milliseconds per
    sample: scoring, not inference, is what a worker waits on. Its outputs are the spy's
    (same ``output_kind``), so a spy run can be rescored with it."""

    class Params(Parameters):
        score_ms: float = 5

    args: Params

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        time.sleep(self.args.score_ms / 1000)
        return super().score(row, output)


@register("killer")
class Killer(Spy):
    """Kills its own worker process on a row whose text contains 'kill'; never returns on one
    that contains 'hang'."""

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        if any("kill" in row["text"] for row in rows):
            os._exit(1)
        if any("hang" in row["text"] for row in rows):
            time.sleep(3600)
        return super().infer(model, rows)


@register("score_killer")
class ScoreKiller(Spy):
    """Kills its own worker process while scoring a row whose text contains 'kill'."""

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        if "kill" in row["text"]:
            os._exit(1)
        return super().score(row, output)


@register("dies_aggregating")
class DiesAggregating(Spy):
    """The spy whose ``aggregate()`` kills its process the first time, when the ``marker`` file
    param does not exist yet (it creates the file first), and works after that."""

    class Params(Parameters):
        marker: str

    args: Params

    def aggregate(self, scores: list[dict[str, float]]) -> dict[str, float]:
        marker = Path(self.args.marker)
        if not marker.exists():
            marker.touch()
            os._exit(1)
        return super().aggregate(scores)


def _note(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


@register("sized")
class Sized(Evaluation):
    """A small torch model per ``name`` param; appends ``load PID NAME`` to the ``log`` file when
    a worker loads it and ``free PID NAME`` when the model object is actually freed."""

    class Params(Parameters):
        name: str
        log: str

    args: Params
    label_fields = ("label",)

    def load(self, device: str) -> Any:
        import weakref

        import torch

        model = torch.nn.Linear(8, 2)
        name, log = self.args.name, self.args.log
        _note(log, f"load {os.getpid()} {name}")
        weakref.finalize(model, _note, log, f"free {os.getpid()} {name}")
        return model

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        return [model.out_features for _ in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"ok": float(output == 2)}


def heap_churn(mib: int) -> int:
    """Minor page faults while ``mib`` MiB of small C-heap blocks are allocated, touched and
    freed, as a batch's tensors are (measured on the second of two such batches).

    The block pointers live in an anonymous mmap, not in a Python list: a list's buffer is
    itself malloc'd, and where glibc puts it (the heap top, or an mmap, by thresholds that
    whatever the process imported before may have moved) would decide whether the freed heap
    can shrink at all."""
    import ctypes
    import mmap
    import resource

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    count = mib * 1024
    pages = mmap.mmap(-1, count * ctypes.sizeof(ctypes.c_void_p))
    blocks = (ctypes.c_void_p * count).from_buffer(pages)

    def batch(blocks: Any) -> None:
        for i in range(count):
            blocks[i] = libc.malloc(1024)
        for i in range(count):
            libc.memset(blocks[i], 1, 1024)
        for i in range(count):
            libc.free(blocks[i])

    batch(blocks)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    batch(blocks)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del blocks
    pages.close()
    return faults


@register("churn")
class Churn(Evaluation):
    """Reports, as every row's output, the page faults of a 160 MiB heap churn (see
    :func:`heap_churn`) in the worker process that ran the batch."""

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        faults = heap_churn(CHURN_MIB)
        return [{"faults": faults} for _ in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"faults": float(output["faults"])}


CHURN_MIB = 160
"""Above the highest trim threshold glibc ever picks by itself (64 MiB), so a process without
evalq's heap settings gives the freed memory back whatever it did before."""


@register("guess")
class Guess(Evaluation):
    """A binary candidate an optimisation loop controls through its params: it answers
    ``base`` (0 or 1) on every row, or the row's visible ``cue`` with ``use_cue=1``, and the
    other answer on the rows whose first word is named in ``flip`` (comma-separated)."""

    class Params(Parameters):
        base: int = 0
        flip: str = ""
        use_cue: bool = False

    args: Params
    label_fields = ("label",)
    output_kind = "guess-label"

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        flips = set(filter(None, self.args.flip.split(",")))
        base = self.args.base
        answers = []
        for row in rows:
            answer = int(row["cue"]) if self.args.use_cue else base
            answers.append(1 - answer if row["text"].split()[0] in flips else answer)
        return answers

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"accuracy": float(output == row["label"])}


@register("fumble")
class Fumble(Guess):
    """The guess candidate whose ``infer()`` raises ``RuntimeError`` on a batch holding a row
    whose first word is named in ``fail`` (comma-separated): a model that crashes on chosen
    rows."""

    class Params(Guess.Params):
        fail: str = ""

    args: Params

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        fails = set(filter(None, self.args.fail.split(",")))
        if any(row["text"].split()[0] in fails for row in rows):
            raise RuntimeError("fumbled")
        return super().infer(model, rows)


@register("fumble_skip")
class FumbleSkip(Fumble):
    """The same candidate, whose evaluation leaves failed samples out of its metrics."""

    on_failure = FailurePolicy.SKIP


def _labels_in_memory(texts: set[str]) -> dict[str, Any]:
    """What a candidate's code can find by walking the stack and the heap: the label of every
    row (a dict, or a row of a ``datasets.Dataset``) whose text is one of ``texts``."""
    found: dict[str, Any] = {}

    def look(obj: Any) -> None:
        text = obj.get("text") if type(obj) is dict and "label" in obj else None
        if isinstance(text, str) and text in texts:
            found[text] = obj["label"]

    frame: FrameType | None = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            look(value)
        frame = frame.f_back
    for obj in gc.get_objects():
        look(obj)
        if type(obj) in (list, tuple):
            for item in obj:
                look(item)
        elif type(obj).__name__ == "Dataset" and "label" in obj.column_names:
            for row in obj:
                look(row)
    return found


@register("snoop")
class Snoop(Evaluation):
    """A candidate that goes looking for labels: its ``infer()`` walks ``sys._getframe()`` and
    ``gc.get_objects()`` for rows holding a label and answers the label it found (or None)."""

    label_fields = ("label",)

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        found = _labels_in_memory({row["text"] for row in rows})
        return [found.get(row["text"]) for row in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"leaked": float(output == row["label"])}


@register("snoop_isolated")
class IsolatedSnoop(Snoop):
    """The same candidate, with its inference isolated."""

    isolated = True


def _opened(pids: list[str]) -> list[str]:
    """Which ``/proc/<pid>/environ`` and ``/proc/<pid>/mem`` of ``pids`` this process opens."""
    opened = []
    for pid in pids:
        for name in ("environ", "mem"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as file:
                    file.read(1)
                opened.append(f"{pid}/{name}")
            except OSError:
                pass
    return opened


def _ancestors_read() -> list[str]:
    """Which of the parent's and grandparent's ``/proc`` environment and memory files this
    process opens (the worker's hold its Redis password), and which a program it executes
    opens (``exec:`` ...: a process of uid 0 regains its capabilities at ``execve`` unless
    prevented)."""
    pids = [str(os.getppid())]
    try:
        stat = Path(f"/proc/{pids[0]}/stat").read_text()
        pids.append(stat.rsplit(")", 1)[1].split()[1])
    except OSError:
        pass  # a sandboxed host cannot read its parent's /proc files at all
    script = "import sys, tests.plugins as p; print(','.join(p._opened(sys.argv[1:])))"
    child = subprocess.run(
        [sys.executable, "-c", script, *pids], capture_output=True, text=True, check=False
    )
    return _opened(pids) + [f"exec:{item}" for item in child.stdout.strip().split(",") if item]


def _dumpable() -> int:
    """``prctl(PR_GET_DUMPABLE)``: 0 when no other process of this user may read this one's
    ``/proc/<pid>/environ`` or memory."""
    import ctypes

    return int(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))


@register("probe")
class Probe(Evaluation):
    """Where ``infer()`` runs: its process id, the ``EVALQ_`` variables it sees, whether the
    worker's modules are loaded; ``fail`` = ``raise``, ``exit`` or ``nonjson`` misbehaves."""

    class Params(Parameters):
        fail: str = ""

    args: Params
    label_fields = ("label",)
    isolated = True

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        fail = self.args.fail
        if fail == "raise":
            raise RuntimeError("the probe failed")
        if fail == "exit":
            os._exit(3)
        if fail == "nonjson":
            return [object() for _ in rows]
        seen = {
            "pid": os.getpid(),
            "ancestors_read": _ancestors_read(),
            "evalq_env": sorted(k for k in os.environ if k.startswith("EVALQ_")),
            "dumpable": _dumpable(),
            "worker_loaded": "evalq.worker.shard_cache" in sys.modules,
            "fields": sorted({field for row in rows for field in row}),
        }
        return [seen for _ in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"ok": 1.0}


@register("script_scored")
class ScriptScored(Evaluation):
    """Scored in the worker's warm scorer processes by ``tests/scripts/probe.py``: each
    sample's ``scorer_pid`` is the process id of the scorer process that scored it."""

    label_fields = LABELS
    scorer = ScriptScorer(path=str(Path(__file__).parents[1] / "scripts" / "probe.py"))

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        return [row["text"] for row in rows]

    def script_call(self, row: dict[str, Any], output: Any) -> ScriptCall:
        return ScriptCall(argv=["pid"])

    def script_score(self, answer: str) -> dict[str, float]:
        return {"scorer_pid": float(answer)}


def _attempt(action: Any) -> str:
    """``allowed``, or ``denied: <the OSError's class>`` (the file or the port is the same
    either way: only what the sandbox lets through differs)."""
    try:
        action()
    except OSError as exc:
        return f"denied: {type(exc).__name__}"
    return "allowed"


def _read(path: str) -> None:
    with open(path, "rb") as file:
        file.read(1)


def _connect(port: int) -> None:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()


def _credentials_in_proc(pids: list[str], needle: str) -> dict[str, Any]:
    """Each ``/proc/<pid>/environ`` and ``cmdline`` this process reads — every process's it
    can list, and those of ``pids`` — and which of them hold an ``EVALQ_`` variable or
    ``needle`` (the Redis password)."""
    try:
        listed = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        listed = []
    readable, found = [], []
    for pid in sorted({*listed, *pids}, key=int):
        for name in ("environ", "cmdline"):
            try:
                content = Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace")
            except OSError:
                continue
            readable.append(f"{pid}/{name}")
            hits = sorted(set(re.findall(r"EVALQ_\w+", content)))
            if needle and needle in content:
                hits.append("the password")
            if hits:
                found.append(f"{pid}/{name}: {', '.join(hits)}")
    return {"listed": len(listed), "readable": readable, "found": found}


FORGED = "FORGED-BY-THE-SANDBOXED-HOST"
"""What the walker writes to its stderr, dressed as a line of its worker's log."""


@register("walker")
class Walker(Evaluation):
    """An isolated candidate that goes looking for what its sandbox should keep from it: the
    credentials in every ``/proc/*/environ`` and ``cmdline`` (params ``pids``, comma-separated,
    are tried even when ``/proc`` cannot be listed; ``needle`` is the password to look for),
    the files and folders named by params ``data``, ``archive``, ``archive_file``, ``hf`` and
    ``hf_file``, and a TCP connection to ``127.0.0.1:port``; it also writes a line dressed
    as its worker's own to its stderr (:data:`FORGED`)."""

    class Params(Parameters):
        pids: str
        needle: str
        data: str
        archive: str
        archive_file: str
        hf: str
        hf_file: str
        port: int

    args: Params
    label_fields = ("label",)
    isolated = True

    def infer(self, model: Any, rows: list[dict[str, Any]]) -> list[Any]:
        p = self.args
        sys.stderr.write(f"[2026-01-01 00:00:00,000: ERROR/MainProcess] {FORGED}\n")
        sys.stderr.flush()
        seen = _credentials_in_proc(list(filter(None, p.pids.split(","))), p.needle)
        seen["access"] = {
            "data": _attempt(lambda: _read(p.data)),
            "archive": _attempt(lambda: os.listdir(p.archive)),
            "archive_file": _attempt(lambda: _read(p.archive_file)),
            "hf": _attempt(lambda: os.listdir(p.hf)),
            "hf_file": _attempt(lambda: _read(p.hf_file)),
            "redis": _attempt(lambda: _connect(p.port)),
        }
        return [seen for _ in rows]

    def score(self, row: dict[str, Any], output: Any) -> dict[str, float]:
        return {"ok": 1.0}


class DyingFileSystem(LocalFileSystem):  # type: ignore[misc]
    """``dying://PATH``: the local file system, except that the first time an archive
    manifest is written under PATH (with ``PATH/../die-once`` absent) it kills the worker's
    main process and then its own, at that worst moment: parts written, no seal."""

    protocol = ("dying",)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        return super()._strip_protocol(str(path).removeprefix("dying://"))

    def open(self, path: Any, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        marker = Path(path).parents[3] / "die-once"
        if path.endswith("/manifest.json") and "w" in mode and not marker.exists():
            marker.touch()
            os.kill(os.getppid(), signal.SIGKILL)
            os._exit(1)
        return super().open(path, mode, *args, **kwargs)


fsspec.register_implementation("dying", DyingFileSystem, clobber=True)
