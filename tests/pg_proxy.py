"""A TCP proxy in front of the PostgreSQL server that can hold a COMMIT's reply on the wire.

It stands for a slow network: the server has committed, the client has not heard yet. While
the reply is held, the test runs whatever it wants against the server through a direct
connection, then releases it. The proxy reads the server's messages (type byte, 4-byte
length) to find the reply to ``COMMIT``, so the client must not use TLS (``sslmode=disable``).
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

__all__ = ["CommitHoldingProxy"]

#: The server's CommandComplete message for a COMMIT.
_COMMIT_DONE = b"C" + (4 + 7).to_bytes(4, "big") + b"COMMIT\x00"


class CommitHoldingProxy:
    """Forwards connections to ``dsn``'s server; holds the next COMMIT's reply when armed."""

    def __init__(self, dsn: str) -> None:
        parts = urlsplit(dsn)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._dsn = parts
        self._server: asyncio.Server | None = None
        self._armed = False
        #: Set when a COMMIT's reply is being held (the server has committed).
        self.held = asyncio.Event()
        self._gates: list[asyncio.Event] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        """Listen on a free local port; return the DSN that connects through the proxy."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = f"{self._dsn.username}@127.0.0.1:{port}"
        query = "&".join(q for q in (self._dsn.query, "sslmode=disable") if q)
        return urlunsplit(self._dsn._replace(netloc=netloc, query=query))

    def hold_next_commit(self) -> None:
        """Hold the reply to the next COMMIT any proxied connection sends (and what follows)."""
        self.held = asyncio.Event()
        self._armed = True

    def release(self) -> None:
        """Let the replies held so far (and everything after them) through."""
        for gate in self._gates:
            gate.set()
        self._gates.clear()

    async def close(self) -> None:
        """Stop listening and cut every proxied connection."""
        self.release()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        for pump in (self._forward(reader, up_writer), self._replies(up_reader, writer)):
            task = asyncio.ensure_future(pump)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _forward(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()

    async def _replies(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        buffer = b""
        try:
            while data := await src.read(65536):
                buffer += data
                while len(buffer) >= 5:
                    size = 1 + int.from_bytes(buffer[1:5], "big")
                    if len(buffer) < size:
                        break
                    message, buffer = buffer[:size], buffer[size:]
                    if self._armed and message == _COMMIT_DONE:
                        self._armed = False
                        gate = asyncio.Event()
                        self._gates.append(gate)
                        self.held.set()
                        await gate.wait()
                    dst.write(message)
                await dst.drain()
        finally:
            dst.close()
