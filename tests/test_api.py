"""The one client of the gateway's routes (:class:`evalq.producer.clients.remote.RemoteClient`):
through a gateway's URL it loads no Celery, kombu, Redis or pyarrow, and refuses a URL holding a
password. No Redis needed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from evalq.producer.clients.remote import RemoteClient
from evalq.shared.errors import InputError
from tests.helpers import REPO

HEAVY = ("celery", "kombu", "redis", "pyarrow")
"""What the HTTP client must not load: the broker's and the store's libraries."""


@pytest.mark.integration
def test_the_http_client_loads_no_broker_store_or_arrow_library() -> None:
    code = (
        "import sys, producer.clients.remote, producer.clients.api, producer.service.views; "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    loaded = done.stdout.strip()
    assert loaded == "", f"importing producer.clients.remote loaded {loaded}"


@pytest.mark.integration
def test_a_gateway_url_with_a_password_is_refused_without_showing_it() -> None:
    """``EVALQ_API_URL=http://u:SECRETPW@host`` was echoed whole in the unreachable-gateway
    error, and its user and password (sent as basic auth) replaced the token's header."""
    with pytest.raises(InputError) as refused:
        RemoteClient("http://u:SECRETPW@127.0.0.1:1", "evalq_x")
    assert "SECRETPW" not in str(refused.value)
    assert "EVALQ_API_URL holds a user or password" in str(refused.value)
