"""A real S3-compatible server for the object-store tests: moto's standalone server in its own
process on a free loopback port, and the environment that points a process's fsspec (s3fs,
botocore) at it with test credentials."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from evalq.producer.operations.redis_server import free_port
from tests.helpers import wait_for

__all__ = ["S3Server"]

KEY = "evalq-test-key"
SECRET = "evalq-test-secret-2d81f0"


class S3Server:
    """``python -m moto.server`` on 127.0.0.1, up once it answers an S3 request."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for(self._up, 60, "the S3 server")

    @property
    def env(self) -> dict[str, str]:
        """What a process needs in its environment to reach the server (credentials never
        appear anywhere else)."""
        return {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": self.url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def fs(self) -> Any:
        """An s3fs file system on the server, for a test to put and change objects."""
        import s3fs

        return s3fs.S3FileSystem(
            key=KEY, secret=SECRET, endpoint_url=self.url, skip_instance_cache=True,
            use_listings_cache=False,
        )  # fmt: skip

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the S3 server exited with {self.process.returncode}")
        try:
            return httpx.get(self.url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self._log.close()
