"""A throwaway ``redis-server`` for the Redis-based peers (Debian's ``redis-server``).

Started on a free port with its files in a temporary directory, stopped and removed
afterwards; standard library only (the PING is spoken on a plain socket).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

#: Redis as most teams run it: no persistence at all.
VOLATILE = ("--appendonly", "no")
#: Durable: every write in the append-only file, fsynced before the reply.
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")


class RedisUnavailable(Exception):
    """No ``redis-server`` here, or it would not start."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")
    return False


@contextlib.contextmanager
def redis_server(settings: Sequence[str] = VOLATILE, timeout: float = 10.0) -> Iterator[str]:
    """Yield the URL of a new ``redis-server`` run with ``settings``; stop it after."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisUnavailable("redis-server not found (apt-get install redis-server)")
    port = _free_port()
    directory = tempfile.mkdtemp(prefix="pgqueue-bench-redis-")
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    process = subprocess.Popen(
        [*command, "--dir", directory, *settings],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while not _ping(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RedisUnavailable(f"redis-server did not start (status {process.poll()})")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)
