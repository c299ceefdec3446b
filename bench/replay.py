"""Replay: the same CLI invocations, in direct and gateway mode, recorded and compared.

``record`` starts a real stack on free ports in a temporary folder (a ``redis-server``, one
Celery worker, the gateway on uvicorn, as the tests start them: :mod:`tests.helpers`), and
drives ``evalq`` subprocesses against it: a setup (datasets, tiers, budgets, tokens) in direct
mode, then one script of invocations per door -- ``direct`` (no ``EVALQ_API_URL``, the
operator), ``user`` and ``admin`` (``EVALQ_API_URL`` and a token of that role) -- covering
every command with good and bad input. Per invocation it records the door, the arguments, the
exit status, stdout, stderr and the audit entries it added, each with its volatile parts
(run ids, tokens, times, durations, ports, temporary paths, host names, pids) replaced by
stable placeholders. It records too the gateway's OpenAPI schema and the ``--help`` of every
command and subcommand. ``compare`` lists what differs between two recordings (exit 1 if any).

    python -m bench.replay record OUT.json
    python -m bench.replay compare OLD.json NEW.json

A run is waited for by polling ``evalq status RUN --json`` (not recorded) until it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer.main
from rich.console import Console

from evalq.producer.operations.demo_data import write_demo_dataset
from evalq.producer.operations.redis_server import RedisServer
from evalq.producer.operations.workers import LocalWorkers
from evalq.producer.service.client import Client
from evalq.shared.cli import create_cli
from evalq.shared.connection import connect
from evalq.shared.evals.arithmetic import arithmetic_rows
from evalq.shared.settings import Settings
from tests.helpers import REPO, cli_env, gateway, labelled_rows, write_rows

console = Console(stderr=True)

DOORS = ("direct", "user", "admin")
"""``direct``: the CLI on Redis (an operator); ``user``/``admin``: the CLI on the gateway with
a token of that role."""
GATEWAY_DOORS = ("user", "admin")
NOWHERE = "redis://must-not-be-read.invalid:1/0"
"""The Redis URL a gateway door's CLI gets: it must not read it."""
COLUMNS = "200"
"""Terminal width of every invocation, so that rich wraps and truncates alike."""
AUDIT = "evalq:audit"
ENDED = {"completed", "failed", "cancelled"}
RELEASED = "released"
"""The audit action of a held-out run's release (compared per recording, not per invocation)."""
RELEASE_KEYS = ("action", "run", "dataset", "split", "who", "mechanism")
"""What two recordings' releases are compared by (not the metrics released)."""
ARCHIVE_WAIT = 20.0
"""Seconds a run that ended is waited for to be archived (its status shows when it was)."""
MISSING = "nosuchrun0000000"
"""The id of a run the script names but did not make (a refused submit's)."""
WAIT = 120.0
"""Seconds a run may take to end."""

_ISO = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d:?\d\d)?")
_STREAM_ID = re.compile(r"\b1[6-9]\d{11}-\d+\b")
_SHORT_ID = re.compile(r"\b(?=[0-9]*[a-f])[0-9a-f]{12}\b")
_EPOCH = re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b")
_CLOCK = re.compile(r"\b\d\d:\d\d:\d\d\b")
_DURATION = re.compile(r"\b\d+(\.\d+)?( ?(ms|s|sec|seconds|m|min|h)\b|/s\b| samples/s| per s)")
_ELAPSED = re.compile(r"\b\d+:\d\d(:\d\d)?\b")
_SHA = re.compile(r"\b[0-9a-f]{64}\b")
_RUN = re.compile(r"\b[0-9a-f]{16}\b")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_TOKEN = re.compile(r"\bevalq_[A-Za-z0-9_-]{16,}\b")
_PROGRESS = re.compile(r": \d+/\d+ settled \(\d+%\)")
"""A followed run's progress line (:func:`normalised` keeps its last)."""
_PID = re.compile(r"\b(pid|PID)[ =:]+\d+")
_HEX_ID = re.compile(r"\b[0-9a-f]{12}\b")
EPOCHS = (1.6e9, 2.0e9)
"""A number in this range is a clock reading (seconds since 1970: 2020 to 2033)."""
_VOLATILE_KEYS = frozenset(
    {"created", "started", "ended", "finished", "updated", "time", "at", "ts", "when",
     "seconds", "elapsed", "duration", "throughput", "eta_seconds", "samples_per_second",
     "submitted", "last_seen", "heartbeat", "age", "expires", "wall", "took"}
)  # fmt: skip
"""JSON keys whose values are clock readings or durations."""


@dataclass
class Normaliser:
    """Replaces what differs between two recordings of the same code by placeholders: run ids
    (numbered in the order the script learnt them), tokens (by principal), the temporary folder,
    the gateway's and Redis's addresses and ports, the host's name, times, durations, digests.
    A recording keeps the raw output and what its normaliser knew (:meth:`state`), so that
    ``compare`` normalises both sides with the same, current rules."""

    tmp: str
    host: str
    addresses: dict[str, str] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    shorts: dict[str, str] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        return {"tmp": self.tmp, "host": self.host, "addresses": self.addresses,
                "runs": list(self.runs), "tokens": self.tokens}  # fmt: skip

    @classmethod
    def of(cls, state: dict[str, Any]) -> Normaliser:
        made = cls(state["tmp"], state["host"], dict(state["addresses"]), {}, dict(state["tokens"]))
        for run_id in state["runs"]:
            made.run(run_id)
        return made

    def run(self, run_id: str) -> str:
        return self.runs.setdefault(run_id, f"<run{len(self.runs) + 1}>")

    def short(self, found: str) -> str:
        """A 12-digit hex id (a sweep's, a spec's prefix), numbered in order of appearance."""
        return self.shorts.setdefault(found, f"<id{len(self.shorts) + 1}>")

    def text(self, text: str) -> str:
        for token, who in self.tokens.items():
            text = text.replace(token, f"<token:{who}>")
        for address, name in sorted(self.addresses.items(), key=lambda a: -len(a[0])):
            text = re.sub(rf"(?<![\w.]){re.escape(address)}(?![\w])", name, text)
        text = text.replace(os.path.realpath(self.tmp), "<tmp>").replace(self.tmp, "<tmp>")
        text = text.replace(self.host, "<host>")
        text = _UUID.sub("<uuid>", text)
        text = _SHA.sub("<sha256>", text)
        text = _RUN.sub(lambda m: self.runs.get(m.group(), m.group()), text)
        text = _SHORT_ID.sub(lambda m: self.short(m.group()), text)
        text = _STREAM_ID.sub("<stream-id>", text)
        text = _TOKEN.sub("<token>", text)
        text = _ISO.sub("<time>", text)
        text = _EPOCH.sub("<epoch>", text)
        text = _CLOCK.sub("<clock>", text)
        text = _DURATION.sub("<duration>", text)
        text = _ELAPSED.sub("<elapsed>", text)
        return _PID.sub(r"\1 <pid>", text)

    def value(self, value: Any, key: str = "") -> Any:
        if key in _VOLATILE_KEYS and value is not None and not isinstance(value, (dict, list)):
            return "<volatile>"
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v, key) for v in value]
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, (int, float)) and EPOCHS[0] <= value < EPOCHS[1]:
            return "<epoch>"
        return value

    def output(self, text: str) -> str:
        """Each line that is JSON normalised value by value, the others as text."""
        lines = []
        for line in text.splitlines():
            try:
                parsed = json.loads(line)
            except ValueError:  # rich pads a table's cells: a placeholder's length is not
                lines.append(self.text(line).rstrip())  # the value's
                continue
            lines.append(json.dumps(self.value(parsed), sort_keys=True))
        return "\n".join(lines)

    def call(self, call: dict[str, Any]) -> dict[str, Any]:
        """A recorded invocation, normalised."""
        return {
            "door": call["door"],
            "argv": [self.text(a) for a in call["argv"]],
            "code": call["code"],
            "stdout": self.output(call["stdout"]),
            "stderr": self.output(call["stderr"]),
            "audit": [self.value(e) for e in call["audit"]],
        }

    def learn_runs(self, text: str) -> None:
        """Number the run ids ``text`` names (a submit's answer), in order."""
        for found in _RUN.findall(text):
            self.run(found)


@dataclass
class Call:
    """One recorded invocation."""

    door: str
    argv: list[str]
    code: int
    stdout: str
    stderr: str
    audit: list[dict[str, Any]]


PRELOAD = (
    "evalq.producer.service.client",
    "evalq.producer.clients.remote",
    "evalq.producer.service.direct",
    "evalq.producer.service.report",
    "evalq.producer.service.comparison",
    "evalq.producer.reports.export",
    "evalq.producer.reports.follow",
    "evalq.producer.service.policy_file",
    "httpx",
    "redis",
    "pyarrow.parquet",
)
"""Modules the forking launcher imports before its first fork (a name the code under test
lacks is skipped): each invocation then starts in milliseconds, not the seconds an
interpreter's imports take on a loaded machine."""


def serve_forks() -> None:
    """The forking launcher's process: reads one JSON request a line on stdin (``argv``,
    ``env``, ``out``, ``err``: files for stdout and stderr), forks a child that runs
    ``evalq.shared.cli.main(argv)`` with ``env`` as its whole environment and its output in
    those files, and answers the child's exit status as a line on stdout."""
    import importlib

    from evalq.shared.cli import create_cli, main

    create_cli()  # the entry points' modules
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
    answers = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(main, request)
        _, status = os.waitpid(pid, 0)
        answers.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
        answers.flush()


def _child(main: Callable[[list[str]], None], request: dict[str, Any]) -> None:
    """In the forked child: the environment, the output files, then ``main``; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        sys.argv = ["evalq", *request["argv"]]
        from evalq.shared.settings import get_settings

        get_settings.cache_clear()
        try:
            main(request["argv"])
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    except BaseException:  # the child reports a traceback as a process would
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


@dataclass
class Done:
    """An invocation's exit status and output."""

    returncode: int
    stdout: str
    stderr: str


class Launcher:
    """Runs ``evalq ARGV`` with an environment: a fresh interpreter each time (``exec``:
    ``[sys.executable, "-c", "from evalq.shared.cli import main; main()", *argv]``) or a
    child forked from one that imported evalq once (:func:`serve_forks`)."""

    def __init__(self, tmp: Path, *, fork: bool) -> None:
        self.tmp = tmp
        self.fork = fork
        self._server: subprocess.Popen[str] | None = None
        if fork:
            self._server = subprocess.Popen(
                [sys.executable, "-c", "from bench.replay import serve_forks; serve_forks()"],
                env={**cli_env(NOWHERE), "COLUMNS": COLUMNS}, cwd=REPO, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True,
            )  # fmt: skip

    def __call__(self, argv: Sequence[str], env: dict[str, str]) -> Done:
        if self._server is None:
            done = subprocess.run(
                [sys.executable, "-c", "from evalq.shared.cli import main; main()", *argv],
                env=env, cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
            return Done(done.returncode, done.stdout, done.stderr)
        out, err = self.tmp / "launch.out", self.tmp / "launch.err"
        request = {"argv": list(argv), "env": env, "cwd": str(REPO), "out": str(out),
                   "err": str(err)}  # fmt: skip
        assert self._server.stdin is not None
        assert self._server.stdout is not None
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        answer = self._server.stdout.readline()
        if not answer:
            raise RuntimeError("the forking launcher exited")
        return Done(int(json.loads(answer)), out.read_text(), err.read_text())

    def close(self) -> None:
        if self._server is not None:
            assert self._server.stdin is not None
            self._server.stdin.close()
            self._server.wait(30)


@dataclass
class Replay:
    """The live stack and what the scripts have learnt: run ids by name, tokens by door."""

    tmp: Path
    redis_url: str
    api: str
    client: Any
    norm: Normaliser
    launch: Launcher
    env: dict[str, dict[str, str]] = field(default_factory=dict)
    named: dict[str, str] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    releases: list[dict[str, str]] = field(default_factory=list)
    """Release entries written while no invocation ran (the unrecorded reads of :meth:`wait`)."""
    last_audit: str = "0-0"

    def cli(self, door: str, *argv: str) -> Done:
        """Run ``evalq argv`` through ``door``, recorded."""
        args = [self.resolve(a) for a in argv]
        done = self.launch(args, self.env[door])
        self.norm.learn_runs(done.stdout if args[:1] in (["submit"], ["rescore"]) else "")
        self.calls.append(
            Call(door, args, done.returncode, done.stdout, done.stderr, self.new_audit())
        )
        if len(self.calls) % 50 == 0:
            console.print(f"{len(self.calls)} invocations", style="dim")
        return done

    def resolve(self, arg: str) -> str:
        """``{run:NAME}`` → that run's id, ``{tmp}`` → the temporary folder."""
        arg = arg.replace("{tmp}", str(self.tmp))
        return re.sub(r"\{run:([\w-]+)\}", lambda m: self.named.get(m.group(1), MISSING), arg)

    def new_audit(self) -> list[dict[str, str]]:
        raw = self.client.xrange(AUDIT, f"({self.last_audit}") or []
        if raw:
            self.last_audit = raw[-1][0]
        return [dict(fields) for _, fields in raw]

    def submit(self, door: str, name: str, *argv: str, wait: bool = True) -> None:
        """``evalq submit argv`` through ``door``; the run id it printed named ``name``; waits
        for it to end unless told not to."""
        done = self.cli(door, "submit", *argv)
        found = _RUN.findall(done.stdout)
        if not found:
            return
        self.named[name] = found[0]
        if wait:
            for run_id in found:
                self.wait(door, run_id)

    def wait(self, door: str, run_id: str) -> None:
        """Until ``evalq status RUN --json`` through ``door`` says it ended and was archived (at
        most :data:`ARCHIVE_WAIT` seconds after it ended; not recorded)."""
        deadline, ended = time.monotonic() + WAIT, 0.0
        while time.monotonic() < deadline:
            admin = ["--admin"] if door == "admin" else []
            done = self.launch(["status", run_id, "--json", *admin], self.env[door])
            try:
                view = json.loads(done.stdout)
            except ValueError:
                view = {}
            if view.get("status") in ENDED:
                ended = ended or time.monotonic()
                if view.get("archived") is not None or time.monotonic() > ended + ARCHIVE_WAIT:
                    self.settle()
                    return
            time.sleep(0.2)
        raise RuntimeError(f"run {run_id} did not end in {WAIT}s")

    def settle(self) -> None:
        """Audit entries written after a run ended (by a worker or the gateway) are not the next
        invocation's: read them off under no invocation."""
        time.sleep(0.3)
        self.releases += [e for e in self.new_audit() if e.get("action") == RELEASED]


def _write_data(root: Path) -> dict[str, Path]:
    """Each door's datasets (one content registers as one split only, so each its own)."""
    folders: dict[str, Path] = {}
    for index, door in enumerate(DOORS):
        folders[f"demo-{door}"] = write_demo_dataset(root / f"demo-{door}", 40, seed=index)
        write_rows(root / f"arith-{door}", "test", arithmetic_rows(12, seed=index))  # type: ignore[arg-type]
        write_rows(root / f"arith-{door}", "dev", arithmetic_rows(6, seed=100 + index))  # type: ignore[arg-type]
        folders[f"arith-{door}"] = root / f"arith-{door}"
        for split in ("open", "held", "closed", "metered"):
            write_rows(root / f"spy-{door}", split, labelled_rows(20, salt=f"{door}{split}"))
        write_rows(root / f"spy-{door}", "gate", _gate_rows(door))
        folders[f"spy-{door}"] = root / f"spy-{door}"
    (root / "policy.yaml").write_text(
        "datasets:\n"
        + "".join(
            f"  spy-{door}:\n    metered:\n      tier: non_viewable\n"
            f"      budget: {{runs: 2, samples: 30, max_samples_per_run: 20}}\n"
            for door in DOORS
        )
    )
    (root / "bad-policy.yaml").write_text("datasets: {spy-direct: {open: {tier: secret}}}\n")
    (root / "broken.yaml").write_text("datasets: [\n")
    (root / "task.yaml").write_text(
        'prompt: "What is {question}? Answer with only the number."\n'
        "target: answer\ngenerate: {max_new_tokens: 8}\nscorer: exact_match\n"
    )
    (root / "bad-task.yaml").write_text("prompt: [\n")
    return folders


def _gate_rows(door: str) -> list[dict[str, object]]:
    """Rows the ``slow`` eval reads a sample number from (its second word), its own per door."""
    return [{"text": f"sample {i} {door}gate", "label": i % 3, "secret": f"s{i}"} for i in range(6)]


def setup(r: Replay, folders: dict[str, Path]) -> None:
    """Datasets, tiers, budgets, tokens: operator commands in direct mode."""
    for name, folder in folders.items():
        r.cli("direct", "datasets", "add", name, "--data", str(folder))
    for door in DOORS:
        r.cli("direct", "tiers", "set", f"demo-{door}", "train", "viewable")
        r.cli("direct", "tiers", "set", f"demo-{door}", "validation", "non_viewable")
        r.cli("direct", "tiers", "set", f"demo-{door}", "test", "no_access")
        r.cli("direct", "tiers", "set", f"arith-{door}", "test", "viewable")
        r.cli("direct", "tiers", "set", f"spy-{door}", "open", "viewable")
        r.cli("direct", "tiers", "set", f"spy-{door}", "held", "non_viewable")
        r.cli("direct", "tiers", "set", f"spy-{door}", "gate", "viewable")
        r.cli("direct", "budget", "set", f"spy-{door}", "open", "--runs", "100", "--samples",
              "100000")  # fmt: skip
        r.cli("direct", "budget", "set", f"spy-{door}", "held", "--runs", "100", "--samples",
              "100000", "--principal", "replay-user")  # fmt: skip
    r.cli("direct", "policy", "apply", "{tmp}/policy.yaml")
    for who, role in (("replay-user", "user"), ("replay-admin", "admin")):
        made = r.cli("direct", "tokens", "create", who, "--role", role, "--json")
        token = json.loads(made.stdout)["token"]
        r.norm.tokens[token] = who
        door = role
        r.env[door] = cli_env(NOWHERE, EVALQ_API_URL=r.api, EVALQ_TOKEN=token, COLUMNS=COLUMNS)
    r.cli("direct", "tokens", "create", "replay-gone", "--role", "user")
    r.cli("direct", "tokens", "revoke", "replay-gone")


def script(r: Replay, door: str) -> None:  # noqa: PLR0915
    """One door's invocations: every command, good and bad input."""
    admin = ["--admin"] if door == "admin" else []

    def d(kind: str) -> str:
        return f"{kind}-{door}"

    def c(*argv: str) -> None:
        r.cli(door, *argv)

    # listings before any run
    for argv in (["runs"], ["runs", "--json"], ["datasets", "list"], ["datasets", "list", "--json"],
                 ["tiers", "list"], ["tiers", "list", "--json"], ["budget", "show"],
                 ["budget", "show", "--json"], ["tokens", "list"], ["tokens", "list", "--json"],
                 ["tasks", "list"], ["tasks", "list", "--json"]):  # fmt: skip
        c(*argv)
    # good submits
    r.submit(door, "null", "null", "--dataset", d("demo"), "--split", "train", "--limit", "10",
             "--tag", "replay")  # fmt: skip
    r.submit(door, "null-json", "null", "--dataset", d("demo"), "--split", "train", "--limit",
             "8", "--json")  # fmt: skip
    r.submit(door, "arith", "arithmetic", "--dataset", d("arith"), "--split", "test",
             "--param", "tolerance=0.01", "--tag", "math")  # fmt: skip
    r.submit(door, "spy", "spy", "--dataset", d("spy"), "--split", "open", "--limit", "12")
    r.submit(door, "spy2", "spy", "--dataset", d("spy"), "--split", "open",
             "--ids", "0,1,2,3,4,5,6,7,8,9,10,11")  # fmt: skip
    r.submit(door, "held", "spy", "--dataset", d("spy"), "--split", "held", "--limit", "10",
             *admin)  # fmt: skip
    r.submit(door, "held-admin", "spy", "--dataset", d("spy"), "--split", "held", "--limit",
             "6", *admin)  # fmt: skip
    r.submit(door, "sweep", "arithmetic", "--dataset", d("arith"), "--split", "test",
             "--sweep", "tolerance=0.1,0.001", "--json")  # fmt: skip
    r.submit(door, "followed", "null", "--dataset", d("demo"), "--split", "train", "--limit",
             "5", "--follow")  # fmt: skip
    r.submit(door, "metered1", "spy", "--dataset", d("spy"), "--split", "metered", "--limit", "20")
    r.submit(door, "prio", "null", "--dataset", d("demo"), "--split", "train", "--limit", "4",
             "--priority", "high", "--shards", "2", "--routing", "round_robin")  # fmt: skip
    # refused submits
    for argv in (
        ["null", "--dataset", d("demo"), "--split", "test", "--limit", "3"],
        ["null", "--dataset", d("demo"), "--split", "test", "--limit", "3", *admin],
        ["spy", "--dataset", d("spy"), "--split", "metered", "--limit", "20"],
        ["spy", "--dataset", d("spy"), "--split", "metered", "--limit", "5"],
        ["spy", "--dataset", d("spy"), "--split", "metered", "--limit", "5"],
        ["spy", "--dataset", d("spy"), "--split", "closed", "--limit", "5"],
        ["spy", "--dataset", d("spy"), "--split", "held", "--ids", "1,2"],
        ["nosuch", "--dataset", d("demo"), "--split", "train"],
        ["null", "--dataset", "nosuch", "--split", "train"],
        ["null", "--dataset", d("demo"), "--split", "nosuch"],
        ["arithmetic", "--dataset", d("arith"), "--split", "test", "--param", "tolerance=abc"],
        ["arithmetic", "--dataset", d("arith"), "--split", "test", "--param", "nosuch=1"],
        ["arithmetic", "--dataset", d("arith"), "--split", "test", "--param", "noequals"],
        ["null", "--dataset", d("demo"), "--split", "train", "--limit", "0"],
        ["null", "--dataset", d("demo"), "--split", "train", "--limit", "-3"],
        ["null", "--dataset", d("demo"), "--split", "train", "--ids", "a,b"],
        ["null", "--dataset", d("demo"), "--split", "train", "--ids", "999999"],
        ["null", "--dataset", d("demo"), "--split", "train", "--limit", "2", "--ids", "1"],
        ["null", "--split", "train"],
        ["null", "--dataset", d("demo")],
        ["null", "--dataset", d("demo"), "--split", "train", "--priority", "urgent"],
        ["null", "--dataset", d("demo"), "--split", "train", "--shards", "0"],
        ["null", "--dataset", d("demo"), "--split", "train", "--data", "{tmp}/demo-direct"],
        ["null", "--data", "{tmp}/nowhere", "--split", "train"],
        ["null", "--dataset", d("demo"), "--split", "train", "--sweep", "x"],
        ["null", "--dataset", d("demo"), "--split", "train", "--model", "nosuch/x"],
        ["arith-task", "--dataset", d("arith"), "--split", "test"],
    ):
        r.submit(door, "refused", *argv)
    r.submit(door, "data", "null", "--data", f"{{tmp}}/demo-{door}", "--split", "validation",
             "--limit", "4")  # fmt: skip
    # reading runs
    for name in ("null", "arith", "spy", "held", "held-admin", "metered1", "followed"):
        c("status", f"{{run:{name}}}")
        c("status", f"{{run:{name}}}", "--json", *admin)
    c("status", "nosuchrun0000000")
    c("status", "not a run!")
    c("status")
    for argv in (["--eval", "null"], ["--dataset", d("spy")], ["--tag", "math"],
                 ["--status", "completed"], ["--status", "bogus"], ["--split", "held"],
                 ["--principal", "replay-user"], ["--limit", "3", "--json"], ["--limit", "0"],
                 ["--model", "nosuch"], ["--sweep", "nosuch"]):  # fmt: skip
        c("runs", *argv)
    for name in ("null", "arith", "spy", "held", "metered1"):
        c("results", f"{{run:{name}}}")
        c("results", f"{{run:{name}}}", *admin)
    c("results", "{run:spy}", "--with-input")
    c("results", "{run:spy}", "--format", "csv")
    c("results", "{run:spy}", "--format", "parquet")
    c("results", "{run:spy}", "--format", "parquet", "--out", f"{{tmp}}/{door}-spy.parquet")
    c("results", "{run:spy}", "--format", "xml")
    c("results", "{run:null}", "--follow")
    c("results", "{run:held}", "--follow")
    c("results", "nosuchrun0000000")
    c("watch", "{run:null}")
    c("watch", "{run:held}", "--json")
    c("watch", "nosuchrun0000000")
    c("compare", "{run:spy}", "{run:spy2}")
    c("compare", "{run:spy}", "{run:spy2}", "--json")
    c("compare", "{run:spy}", "{run:spy2}", "--flips", "3", "--json")
    c("compare", "{run:null}", "{run:spy}")
    c("compare", "{run:held}", "{run:held-admin}", "--json", *admin)
    c("compare", "--sweep", "nosuch")
    c("compare", "{run:spy}")
    c("compare")
    c("report", "{run:spy}", "--out", f"{{tmp}}/{door}-r1.html")
    c("report", "{run:held}", "--out", f"{{tmp}}/{door}-r2.html", "--json")
    c("report", "{run:spy}", "{run:spy2}", "--out", f"{{tmp}}/{door}-r3.html")
    c("report", "nosuchrun0000000", "--out", f"{{tmp}}/{door}-r4.html")
    # rescore, resume, cancel
    r.cli(door, "rescore", "{run:spy}", "--eval", "slow_score", "--json")
    c("rescore", "{run:spy}", "--eval", "nosuch")
    c("rescore", "{run:null}", "--eval", "spy")
    c("rescore", "nosuchrun0000000", "--eval", "spy")
    c("rescore", "{run:spy}", "--eval", "slow_score", "--param", "bogus=1")
    c("resume", "{run:spy}")
    c("resume", "{run:spy}", "--json")
    c("resume", "nosuchrun0000000")
    gate = r.tmp / f"gate-{door}"
    r.submit(door, "gated", "slow", "--dataset", d("spy"), "--split", "gate", "--limit", "6",
             "--param", f"gate={gate}", wait=False)  # fmt: skip
    c("cancel", "{run:gated}", "--json")
    c("cancel", "{run:gated}")
    c("resume", "{run:gated}")
    gate.touch()
    r.wait(door, r.named["gated"])
    c("status", "{run:gated}", "--json")
    c("cancel", "{run:null}")
    c("cancel", "nosuchrun0000000")
    # admin commands
    c("datasets", "add", f"extra-{door}", "--data", f"{{tmp}}/demo-{door}")
    c("datasets", "add", "bad name!", "--data", "{tmp}/nowhere")
    c("datasets", "add", f"gone-{door}", "--data", "{tmp}/nowhere")
    c("tiers", "set", d("spy"), "closed", "non_viewable")
    c("tiers", "set", d("spy"), "closed", "secret")
    c("tiers", "set", "nosuch", "x", "viewable")
    c("tiers", "set", d("spy"), "closed", "no_access")
    c("budget", "set", d("spy"), "open", "--runs", "100", "--samples", "100000")
    c("budget", "set", d("spy"), "open", "--runs", "-1")
    c("budget", "set", "nosuch", "open", "--runs", "1")
    c("policy", "apply", "{tmp}/bad-policy.yaml")
    c("policy", "apply", "{tmp}/broken.yaml")
    c("policy", "apply", "{tmp}/nowhere.yaml")
    c("tasks", "add", f"t-{door}", "--file", "{tmp}/task.yaml", "--json")
    c("tasks", "add", f"t-{door}", "--file", "{tmp}/bad-task.yaml")
    c("tasks", "add", f"t-{door}", "--file", "{tmp}/nowhere.yaml")
    c("tokens", "create", f"made-{door}", "--role", "user")
    c("tokens", "create", f"made-{door}", "--role", "superuser")
    c("tokens", "revoke", "nobody-at-all")
    c("audit", "--limit", "5", "--json")
    c("audit", "--limit", "0")
    c("purge", "--run", "{run:null-json}", "--json")
    c("purge", "--run", "nosuchrun0000000")
    c("purge", "--older-than", "soon")
    c("purge")
    c("retention", "--json")
    # usage errors
    for argv in (["nosuch-command"], ["submit"], ["status", "a", "b"], ["runs", "--bogus"],
                 ["tiers"], ["tiers", "nosuch"], ["budget", "set"], ["tokens", "create", "x"],
                 ["results", "--format"], ["report"], []):  # fmt: skip
        c(*argv)
    # what the door sees at the end
    for argv in (["runs", "--json"], ["budget", "show", "--json"], ["tiers", "list"],
                 ["datasets", "list"], ["tasks", "list"], ["tokens", "list"]):  # fmt: skip
        c(*argv)


def command_paths() -> list[list[str]]:
    """Every command and subcommand of ``evalq``, as the arguments that name it (a group's
    ``commands``, walked)."""
    paths: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(create_cli()), [])
    return paths


def help_texts(launch: Launcher, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``evalq PATH --help`` of every command and subcommand: exit status and output."""
    texts: dict[str, dict[str, Any]] = {}
    for path in command_paths():
        done = launch([*path, "--help"], env)
        texts[" ".join(["evalq", *path])] = {
            "code": done.returncode, "stdout": done.stdout, "stderr": done.stderr,
        }  # fmt: skip
    return texts


@contextmanager
def stack(tmp: Path) -> Iterator[tuple[str, str, Any]]:
    """redis-server, one worker and the gateway on free ports; yields Redis's URL, the
    gateway's and a Redis client."""
    server = RedisServer(tmp / "redis", appendonly=True).start()
    settings = Settings(redis_url=server.url, plugins=("tests.plugins",),
                        archive_url=str(tmp / "archive"))  # fmt: skip
    client = Client(settings)
    workers = LocalWorkers(
        server.url,
        env={
            **cli_env(server.url),
            "EVALQ_ARCHIVE_URL": settings.archive_url,
            "EVALQ_MAX_BATCH": "16",
        },
        log_dir=tmp / "workers",
    )
    (tmp / "workers").mkdir()
    try:
        workers.start(client.app)
        with gateway(server.url, tmp / "gw" / "gateway.log") as (api, _):
            yield server.url, api, connect(server.url)
    finally:
        workers.stop()
        client.close()
        server.stop()


def _stop(_signal: int, _frame: object) -> None:
    raise KeyboardInterrupt


def record(out: Path, *, fork: bool) -> None:
    signal.signal(signal.SIGTERM, _stop)  # the stack's processes stopped on SIGTERM too
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="evalq-replay-") as name:
        tmp = Path(name)
        (tmp / "gw").mkdir()
        folders = _write_data(tmp)
        with stack(tmp) as (redis_url, api, client):
            norm = Normaliser(str(tmp), socket.gethostname(), {api: "<api>", redis_url: "<redis>"})
            norm.addresses[api.rsplit(":", 1)[1]] = "<port>"
            norm.addresses[redis_url.rsplit(":", 1)[1].split("/")[0]] = "<port>"
            schema = json.loads(client_get(api + "/openapi.json"))
            launch = Launcher(tmp, fork=fork)
            r = Replay(tmp, redis_url, api, client, norm, launch)
            r.env["direct"] = cli_env(
                redis_url, COLUMNS=COLUMNS, EVALQ_ARCHIVE_URL=str(tmp / "archive")
            )
            console.print(f"stack up in {time.monotonic() - started:.1f}s")
            helps = {door: help_texts(launch, r.env["direct"]) for door in ("direct",)}
            setup(r, folders)
            helps["user"] = help_texts(launch, r.env["user"])
            for door in DOORS:
                script(r, door)
                console.print(f"{door}: {sum(c.door == door for c in r.calls)} invocations, "
                              f"{time.monotonic() - started:.0f}s")  # fmt: skip
            launch.close()
    counts = {door: sum(c.door == door for c in r.calls) for door in DOORS}
    recording = {
        "counts": {**counts, "gateway": counts["user"] + counts["admin"]},
        "launcher": "fork" if fork else "exec",
        "normaliser": norm.state(),
        "openapi": schema,
        "help": helps,
        "calls": [vars(c) for c in r.calls],
        "releases": r.releases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
    console.print(f"recorded {len(r.calls)} invocations {counts} in "
                  f"{time.monotonic() - started:.0f}s to {out}")  # fmt: skip


def client_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return str(response.read().decode())


def _short(value: Any, width: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= width else text[:width] + f"... ({len(text)} chars)"


def normalised(recording: dict[str, Any]) -> dict[str, Any]:
    """A recording with its volatile parts replaced by placeholders (by the current rules)."""
    norm = Normaliser.of(recording["normaliser"])
    helps = {
        door: {path: {k: norm.output(v) if isinstance(v, str) else v for k, v in text.items()}
               for path, text in texts.items()}
        for door, texts in recording["help"].items()
    }  # fmt: skip
    calls = [norm.call(c) for c in recording["calls"]]
    for call in calls:  # how many progress lines a followed run prints depends on its pace
        if "--follow" in call["argv"]:
            lines = call["stdout"].splitlines()
            progress = [i for i, line in enumerate(lines) if _PROGRESS.search(line)]
            call["stdout"] = "\n".join(
                line for i, line in enumerate(lines) if i not in progress[:-1]
            )
    releases = [norm.value(e) for e in recording.get("releases", [])]
    for call in calls:  # a release is written by the first read after its run ends, whichever
        releases += [e for e in call["audit"] if e.get("action") == RELEASED]  # invocation
        call["audit"] = [e for e in call["audit"] if e.get("action") != RELEASED]  # that is
    # what a held-out run scored depends on the samples the gateway drew for it at random
    releases = [{k: e.get(k) for k in RELEASE_KEYS} for e in releases]
    return {
        "counts": recording["counts"],
        "openapi": norm.value(recording["openapi"]),
        "help": helps,
        "calls": calls,
        "releases": sorted(releases, key=lambda e: json.dumps(e, sort_keys=True)),
    }


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One entry per difference between two normalised recordings."""
    found: list[str] = []
    if old["openapi"] != new["openapi"]:
        found.append("openapi.json differs")
    for door in sorted(set(old["help"]) | set(new["help"])):
        before, now = old["help"].get(door, {}), new["help"].get(door, {})
        for path in sorted(set(before) | set(now)):
            if before.get(path) != now.get(path):
                found.append(f"{path} --help [{door}]:\n  old: {_short(before.get(path))}\n"
                             f"  new: {_short(now.get(path))}")  # fmt: skip
    if old["releases"] != new["releases"]:
        found.append(
            f"releases:\n  old: {_short(old['releases'])}\n  new: {_short(new['releases'])}"
        )
    olds, news = old["calls"], new["calls"]
    if len(olds) != len(news):
        found.append(f"{len(olds)} invocations before, {len(news)} now")
    for index, (a, b) in enumerate(zip(olds, news, strict=False)):
        for key in ("door", "argv", "code", "stdout", "stderr", "audit"):
            if a[key] != b[key]:
                found.append(f"#{index} [{a['door']}] evalq {' '.join(a['argv'])}: {key}\n"
                             f"  old: {_short(a[key])}\n  new: {_short(b[key])}")  # fmt: skip
    return found


def compare(old_path: Path, new_path: Path) -> int:
    old, new = (normalised(json.loads(p.read_text())) for p in (old_path, new_path))
    found = differences(old, new)
    for line in found:
        print(line)
    print(f"{len(found)} difference(s); invocations: {old['counts']} before, {new['counts']} now")
    return 1 if found else 0


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="start a stack, replay the invocations, write OUT")
    rec.add_argument("out", type=Path)
    rec.add_argument("--exec", action="store_true",
                     help="a fresh interpreter per invocation (default: forked from one that "
                     "imported evalq once)")  # fmt: skip
    cmp_ = sub.add_parser("compare", help="list what differs; exit 1 if anything does")
    cmp_.add_argument("old", type=Path)
    cmp_.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, fork=not args.exec)
    else:
        raise SystemExit(compare(args.old, args.new))


if __name__ == "__main__":
    main()
