"""The client interface: the direct client (Redis) and the HTTP client (the gateway) have the
same public methods with the same signatures as the :class:`evalq.producer.api.Api` protocol, and
the HTTP client loads no Celery, kombu, Redis or pyarrow. No Redis needed."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

from evalq.producer.api import Api
from evalq.producer.client import Client
from evalq.producer.remote import RemoteClient
from evalq.shared.errors import InputError
from tests.helpers import REPO

HEAVY = ("celery", "kombu", "redis", "pyarrow")
"""What the HTTP client must not load: the broker's and the store's libraries."""


def _methods(cls: type) -> dict[str, inspect.Signature]:
    """Each public method of ``cls`` and its signature (annotations as written: all three
    modules postpone them, so a type spelt differently is a difference)."""
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@pytest.mark.parametrize("cls", [Client, RemoteClient])
def test_each_client_has_the_interfaces_methods_with_its_signatures(cls: type) -> None:
    interface, found = _methods(Api), _methods(cls)
    assert sorted(found) == sorted(interface), f"{cls.__name__} is not the interface"
    differ = {n: (str(found[n]), str(s)) for n, s in interface.items() if found[n] != s}
    assert not differ, f"{cls.__name__} differs from Api: {differ}"


def test_both_clients_have_the_same_public_methods_and_signatures() -> None:
    direct, remote = _methods(Client), _methods(RemoteClient)
    assert sorted(direct) == sorted(remote)
    assert {n: str(s) for n, s in direct.items()} == {n: str(s) for n, s in remote.items()}


def test_the_interface_is_an_admin_flag_and_methods() -> None:
    assert inspect.get_annotations(Api) == {"admin": "bool"}
    assert _methods(Api)  # the comparisons above compare something


@pytest.mark.integration
def test_the_http_client_loads_no_broker_store_or_arrow_library() -> None:
    code = (
        "import sys, producer.remote, producer.api, producer.views; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "", f"importing producer.remote loaded {done.stdout.strip()}"


@pytest.mark.integration
def test_a_gateway_url_with_a_password_is_refused_without_showing_it() -> None:
    """``EVALQ_API_URL=http://u:SECRETPW@host`` was echoed whole in the unreachable-gateway
    error, and its user and password (sent as basic auth) replaced the token's header."""
    with pytest.raises(InputError) as refused:
        RemoteClient("http://u:SECRETPW@127.0.0.1:1", "evalq_x")
    assert "SECRETPW" not in str(refused.value)
    assert "EVALQ_API_URL holds a user or password" in str(refused.value)
