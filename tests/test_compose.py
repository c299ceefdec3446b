"""compose.yaml and the Dockerfile, validated without a Docker engine (none runs here): the
structure operators rely on, every command and entry point they name, health checks, and no
secret written into the file."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from evalq.shared.cli import create_cli
from tests.helpers import REPO

COMPOSE: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
INTERPOLATION = re.compile(r"^\$\{[A-Z_][A-Z0-9_]*(:?[-?][^}]*)?\}$")


def _words(value: str | list[str]) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def test_the_services_operators_expect() -> None:
    assert set(SERVICES) == {
        "acl", "redis", "gateway", "worker-gpu", "worker-cpu", "flower", "producer", "metrics",
        *REDIS_GROUP,
    }  # fmt: skip
    for name, service in SERVICES.items():
        if name in REDIS_GROUP:
            continue
        if name != "redis":
            assert service["build"] == "."  # one image, from the project's Dockerfile
            assert service["image"] == "evalq:latest"
        if name not in {"redis", "acl"}:
            assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        if name not in {"producer", "acl"}:
            assert service["healthcheck"]["test"], name
    assert SERVICES["producer"]["profiles"] == ["tools"]  # one-shot, `docker compose run`


REDIS_GROUP = {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}


def test_redis_is_a_sentinel_group_that_writes_only_with_a_replica_in_step() -> None:
    """A replica of the first master, both needing a replica in step to write and both
    loading the ACL file (its users exist on whichever node is promoted); three sentinels
    that watch the master by name with their own user; every evalq process names the
    sentinels and the master."""
    first, replica = (
        _words(SERVICES["redis"]["command"]),
        _words(SERVICES["redis-replica"]["command"]),
    )
    assert replica[-3:] == ["--replicaof", "redis", "6379"]
    for command in (first, replica[:-3]):
        options = dict(zip(command[1::2], command[2::2], strict=True))
        assert options["--min-replicas-to-write"] == "1"
        assert options["--aclfile"] == "/acl/users.acl"
        assert options["--masteruser"] == "replica"
    for name in ("sentinel-1", "sentinel-2", "sentinel-3"):
        script = " ".join(_words(SERVICES[name]["command"]))
        assert "sentinel monitor evalq redis 6379 2" in script
        assert "sentinel auth-user evalq sentinel" in script
    for name, service in SERVICES.items():
        environment = service.get("environment", {})
        if "EVALQ_REDIS_URL" in environment:
            assert environment["EVALQ_REDIS_URL"].count("sentinel://") == 3, name
            assert environment["EVALQ_REDIS_SENTINEL_MASTER"] == "evalq", name


def test_redis_is_durable_private_and_never_evicts() -> None:
    redis = SERVICES["redis"]
    command = _words(redis["command"])
    assert command[0] == "redis-server"
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "always"
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--aclfile"] == "/acl/users.acl"
    assert "--requirepass" not in options  # the ACL file's users, not one shared password
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "redis-data" in COMPOSE["volumes"]
    assert _words(redis["healthcheck"]["test"])[1:] == ["redis-cli", "--user", "monitor", "ping"]


def test_redis_runs_the_acl_file_and_each_service_holds_its_own_user() -> None:
    acl, redis = SERVICES["acl"], SERVICES["redis"]
    assert _words(acl["command"]) == ["acl", "--out", "/acl/users.acl"]
    for role in ("GATEWAY", "WORKER", "MONITOR", "REPLICA", "SENTINEL"):
        assert INTERPOLATION.match(acl["environment"][f"EVALQ_ACL_{role}_PASSWORD"])
    assert redis["depends_on"]["acl"]["condition"] == "service_completed_successfully"
    assert "redis-acl:/acl:ro" in redis["volumes"]
    assert "redis-acl:/acl" in acl["volumes"]
    users = {
        name: re.match(r"sentinel://(\w+):", service["environment"]["EVALQ_REDIS_URL"])
        for name, service in SERVICES.items()
        if "EVALQ_REDIS_URL" in service.get("environment", {})
    }
    assert {name: m.group(1) for name, m in users.items() if m} == {
        "gateway": "gateway", "producer": "gateway", "worker-gpu": "worker",
        "worker-cpu": "worker", "flower": "monitor", "metrics": "monitor",
    }  # fmt: skip


def test_the_gateway_serves_and_metrics_stay_on_the_hosts_loopback() -> None:
    gateway = SERVICES["gateway"]
    assert _words(gateway["command"]) == ["serve", "--host", "0.0.0.0", "--port", "8700"]
    assert gateway["ports"] == ["8700:8700"]
    assert "8700/openapi.json" in " ".join(_words(gateway["healthcheck"]["test"]))
    assert SERVICES["metrics"]["ports"] == ["127.0.0.1:9808:9808"]


def test_workers_split_inference_and_scoring() -> None:
    gpu, cpu = SERVICES["worker-gpu"], SERVICES["worker-cpu"]
    assert _words(gpu["command"]) == ["worker", "--queues", "infer", "--concurrency", "1"]
    assert _words(cpu["command"])[:3] == ["worker", "--queues", "score"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert device["count"] == 1  # one process per GPU: scale containers with --scale
    assert "container_name" not in gpu  # a fixed name would forbid --scale
    assert gpu["environment"]["EVALQ_DEVICE"] == "auto"


def test_flower_has_auth_from_the_environment_and_no_persistent_state() -> None:
    flower = SERVICES["flower"]
    assert flower["entrypoint"] == ["celery", "-A", "evalq.worker.celery"]
    options = dict(arg.split("=", 1) for arg in _words(flower["command"])[1:])
    pair = re.fullmatch(r"(\$\{[^}]+\}):(\$\{[^}]+\})", options["--basic-auth"])
    assert pair is not None
    assert all(INTERPOLATION.match(part) for part in pair.groups())
    assert options["--persistent"] == "False"
    assert options["--port"] == "5555"
    assert flower["ports"] == ["5555:5555"]


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [s for i, v in enumerate(node) for s in _strings(v, f"{path}[{i}]")]
    return [(path, str(node))]


def test_no_secret_is_written_into_the_file() -> None:
    for path, value in _strings(COMPOSE):
        for secret in re.findall(r"://[^:/@]*:([^@]+)@", value):  # passwords inside URLs
            assert INTERPOLATION.match(secret), (path, value)
        if re.search(r"(PASSWORD|SECRET|TOKEN|_AUTH)$", path.rsplit(".", 1)[-1]):
            assert INTERPOLATION.match(value), (path, value)
        if value.startswith(("--basic-auth=", "--requirepass=")):
            assert "${" in value, (path, value)


def _evalq_command(argv: list[str]) -> None:
    """Parse ``evalq ARGV`` with the real CLI (options and types checked, nothing run)."""
    group = typer.main.get_command(create_cli())
    name, *rest = argv
    command = group.commands[name]  # type: ignore[attr-defined]
    command.make_context(name, list(rest))


@pytest.mark.parametrize(
    "service", ["acl", "gateway", "worker-gpu", "worker-cpu", "producer", "metrics"]
)
@pytest.mark.integration
def test_every_evalq_command_exists_with_its_options(service: str) -> None:
    _evalq_command(_words(SERVICES[service]["command"]))


@pytest.mark.integration
def test_the_flower_entry_point_and_options_exist() -> None:
    from flower.options import options

    assert importlib.util.find_spec("evalq.worker.celery") is not None
    assert "flower" in {e.name for e in entry_points(group="celery.commands")}
    for arg in _words(SERVICES["flower"]["command"])[1:]:
        assert arg.split("=", 1)[0].removeprefix("--").replace("-", "_") in options


def test_the_dockerfile_builds_what_compose_runs() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (REPO / source).exists(), source
    assert 'ENTRYPOINT ["evalq"]' in dockerfile
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["evalq"] == "evalq.shared.cli:main"
    assert isinstance(project["license"], str)  # an SPDX string: setuptools warns on a table
    assert "torch==" in dockerfile  # pinned first, so pip never picks another build
    assert Path(REPO / ".dockerignore").exists()
