"""A TCP proxy between workers and PostgreSQL that can go silent: it stops carrying
bytes in both directions without closing either side, as a network partition or a
load balancer that forgot a flow leaves a connection half-open."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


class SilentProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``, in a thread of its own.

    ``partition()`` stops every connection, new ones included (their handshake waits),
    until ``heal()``; ``forget_connections()`` stops the connections open now for good,
    while new ones are carried (a NAT that dropped its flows: only reconnecting helps).
    """

    def __init__(self, database_url: str) -> None:
        #: Where the server listens: (host, port), or the path of its Unix socket.
        self._target = _server_address(database_url)
        self._database_url = database_url
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.AbstractServer | None = None
        self._links: set[_Link] = set()
        self.port = 0

    def url(self) -> str:
        """The database URL given, through this proxy."""
        parts = urlsplit(self._database_url)
        query = [(key, value) for key, value in parse_qsl(parts.query) if key != "host"]
        user = parts.username or "postgres"
        if parts.password:
            user = f"{user}:{parts.password}"
        netloc = f"{user}@127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))

    def start(self) -> SilentProxy:
        self._thread.start()
        self.port = self._call(self._start())
        return self

    async def _start(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def partition(self) -> None:
        self._call(self._set_flowing(False))

    def heal(self) -> None:
        self._call(self._set_flowing(True))

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    def forget_connections(self) -> int:
        """Stop the connections open now for good; return how many."""
        return self._call(self._forget())

    async def _forget(self) -> int:
        forgotten = [link for link in self._links if not link.forgotten]
        for link in forgotten:
            link.forgotten = True
        return len(forgotten)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.close()

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        await self._flowing.wait()  # a partition swallows the handshake too
        try:
            if isinstance(self._target, str):
                upstream_reader, upstream_writer = await asyncio.open_unix_connection(self._target)
            else:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        link = _Link(writer, upstream_writer)
        self._links.add(link)
        try:
            await asyncio.gather(
                self._pump(reader, upstream_writer, link),
                self._pump(upstream_reader, writer, link),
            )
        finally:
            self._links.discard(link)
            link.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link
    ) -> None:
        assert self._flowing is not None
        while True:
            try:
                data = await reader.read(65536)
            except OSError:
                data = b""
            while link.forgotten or not self._flowing.is_set():
                if link.forgotten:
                    await asyncio.Event().wait()  # until the proxy stops
                await self._flowing.wait()
            if not data:
                link.close()
                return
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                link.close()
                return


def _server_address(database_url: str) -> tuple[str, int] | str:
    parts = urlsplit(database_url)
    port = parts.port or 5432
    socket_dir = dict(parse_qsl(parts.query)).get("host") or (
        None if parts.hostname else "/var/run/postgresql"
    )
    if socket_dir and socket_dir.startswith("/"):
        return f"{socket_dir}/.s.PGSQL.{port}"
    return (parts.hostname or socket_dir or "127.0.0.1", port)


class _Link:
    """One proxied connection: the client's side and the server's."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.forgotten = False

    def close(self) -> None:
        for writer in (self.client, self.server):
            if not writer.is_closing():
                writer.close()
