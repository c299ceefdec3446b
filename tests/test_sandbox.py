"""The isolated model host's sandbox, layer by layer, each applied in a fresh interpreter (it
cannot be undone in the process that applies it): what it still lets the host do, and what it
refuses. Layers this machine does not allow are skipped, saying why."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evalq.shared.isolation import landlock
from tests.helpers import REPO

PROBE = """
import json, os, socket, sys

def attempt(action):
    try:
        action()
    except OSError as exc:
        return type(exc).__name__
    return "allowed"

def read(path):
    with open(path, "rb") as file:
        file.read(1)

def write(path):
    with open(path, "w") as file:
        file.write("x")

def connect(port):
    socket.create_connection(("127.0.0.1", port), timeout=5).close()

def pair():
    a, b = socket.socketpair()
    a.close(), b.close()

target, port, home = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from evalq.shared.isolation import landlock
from evalq.shared.isolation import sandbox
from evalq.shared.isolation import seccomp
from evalq.shared.isolation.privilege import drop_capabilities
drop_capabilities()
report = None
SETUP
import sympy  # a package imported after the sandbox is up: site-packages stay readable
print(json.dumps({
    "report": report,
    "data": attempt(lambda: read(target)),
    "folder": attempt(lambda: os.listdir(os.path.dirname(target))),
    "tcp": attempt(lambda: connect(port)),
    "socketpair": attempt(pair),
    "proc_other": attempt(lambda: read(f"/proc/{os.getppid()}/environ")),
    "proc_list": attempt(lambda: os.listdir("/proc")),
    "proc_self": attempt(lambda: read("/proc/self/status")),
    "home": attempt(lambda: write(os.path.join(home, "written"))),
    "null": attempt(lambda: write("/dev/null")),
    "python": attempt(lambda: read(sys.executable)),
}))
"""


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def _run(setup: str, tmp_path: Path, port: int) -> dict[str, Any]:
    target = tmp_path / "data" / "rows.jsonl"
    target.parent.mkdir()
    target.write_text('{"text": "a", "label": 1}\n')
    home = tmp_path / "home"
    home.mkdir()
    code = PROBE.replace("SETUP", setup)
    done = subprocess.run(
        [sys.executable, "-c", code, str(target), str(port), str(home)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


@pytest.mark.integration
def test_nothing_applied_everything_is_reachable(tmp_path: Path, listener: int) -> None:
    seen = _run("", tmp_path, listener)
    assert (seen["data"], seen["folder"], seen["tcp"]) == ("allowed",) * 3


@pytest.mark.integration
@pytest.mark.skipif(landlock.abi() < 6, reason="needs Landlock ABI 6 (Linux 6.12+)")
def test_the_sandbox_keeps_python_and_its_own_folder_and_nothing_else(
    tmp_path: Path, listener: int
) -> None:
    seen = _run("report = sandbox.confine(home=home)", tmp_path, listener)
    assert seen.pop("report") == {
        "applied": ["seccomp", "landlock", "landlock-tcp", "landlock-scope"],
        "missing": {},
    }
    assert seen == {
        "data": "PermissionError",
        "folder": "PermissionError",
        "tcp": "PermissionError",
        "socketpair": "allowed",
        "proc_other": "PermissionError",
        "proc_list": "PermissionError",
        "proc_self": "allowed",
        "home": "allowed",
        "null": "allowed",
        "python": "allowed",
    }


@pytest.mark.integration
def test_seccomp_alone_takes_every_socket_but_keeps_socketpairs(
    tmp_path: Path, listener: int
) -> None:
    seen = _run("seccomp.deny_sockets()", tmp_path, listener)
    assert (seen["tcp"], seen["socketpair"]) == ("PermissionError", "allowed")
    assert seen["data"] == "allowed"


@pytest.mark.integration
@pytest.mark.skipif(landlock.abi() < 4, reason="needs Landlock ABI 4 (Linux 6.7+)")
def test_landlock_alone_refuses_files_and_tcp(tmp_path: Path, listener: int) -> None:
    setup = (
        "paths = [*sandbox.python_paths(), '/usr', '/lib', '/lib64', '/etc/ld.so.cache']\n"
        "report = landlock.restrict([(p, landlock.READ) for p in paths], version=4)"
    )
    seen = _run(setup, tmp_path, listener)
    assert seen["report"] == ["tcp"]
    assert (seen["data"], seen["folder"], seen["tcp"]) == ("PermissionError",) * 3
    assert (seen["python"], seen["socketpair"]) == ("allowed", "allowed")


def _user_namespaces() -> bool:
    """Whether a process without capabilities may make a user namespace here."""
    code = (
        "import ctypes, sys; from evalq.shared.isolation.privilege import drop_capabilities; "
        "drop_capabilities(); sys.exit(ctypes.CDLL(None).unshare(0x10000000 | 0x40000000))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


@pytest.mark.integration
@pytest.mark.skipif(not _user_namespaces(), reason="needs unprivileged user namespaces")
def test_the_namespace_fallback_leaves_only_a_loopback_that_is_down(
    tmp_path: Path, listener: int
) -> None:
    seen = _run("sandbox._network_namespace()", tmp_path, listener)
    assert seen["tcp"] == "OSError"  # ENETUNREACH: no route, not even to 127.0.0.1
    assert (seen["home"], seen["data"]) == ("allowed", "allowed")
