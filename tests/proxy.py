"""A TCP proxy for fault tests: put it between workers and Redis, then cut, stall and restore
the connections that pass through it."""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

from evalq.producer.operations.redis_server import free_port

__all__ = ["Proxy"]

_HOST = "127.0.0.1"


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a partition's peer would see it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target``.

    ``cut()`` resets every connection and refuses new ones (a partition that clients notice at
    once); ``stall()`` keeps connections open but forwards nothing (a partition that drops
    packets); ``restore()`` lets traffic through again.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._listener = socket.create_server((_HOST, self.port))
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._refusing = False
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://{_HOST}:{self.port}/0"

    def cut(self) -> None:
        with self._lock:
            self._refusing = True
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _reset(sock)

    def stall(self) -> None:
        self._flowing.clear()

    def restore(self) -> None:
        with self._lock:
            self._refusing = False
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self.cut()
        self._flowing.set()
        self._listener.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refusing = self._refusing
            if refusing:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection((_HOST, self.target))
            except OSError:
                _reset(client)
                continue
            with self._lock:
                refusing = self._refusing  # a cut() while this connection was being made
                if not refusing:
                    self._sockets.update((client, upstream))
            if refusing:
                _reset(client)
                _reset(upstream)
                continue
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                with self._lock:
                    if sink not in self._sockets:
                        break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(sink)
            _reset(source)
            _reset(sink)
