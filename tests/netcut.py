"""A TCP relay in front of a loopback server that can go silent, for outage tests.

A server that is stopped refuses connections at once; a network that is cut does not: packets are dropped,
connections stay open and say nothing, and new ones hang in their handshake. ``cut(seconds)`` does that
here: nothing is carried either way and new connections wait, then everything flows again, what was sent
during the cut arriving late as TCP's retransmissions would bring it. Clients point at ``port``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

CHUNK = 65_536


class NetCut:
    def __init__(self, upstream_port: int, *, host: str = "127.0.0.1") -> None:
        self.host, self.upstream_port = host, upstream_port
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="netcut", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> NetCut:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        relays = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    def cut(self, seconds: float) -> None:
        """Nothing carried, new connections held, for ``seconds``."""
        def begin() -> None:
            assert self._flowing is not None
            self._flowing.clear()
            self._loop.call_later(seconds, self._flowing.set)
        self._loop.call_soon_threadsafe(begin)

    @property
    def url_host(self) -> str:
        return f"{self.host}:{self.port}"

    async def _serve(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._relay, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _relay(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self.connections += 1
        await self._flowing.wait()  # a handshake during a cut hangs until the network is back
        try:
            server_in, server_out = await asyncio.open_connection(self.host, self.upstream_port)
        except OSError:
            client_out.close()
            return
        await asyncio.gather(self._pump(client_in, server_out), self._pump(server_in, client_out))

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while data := await source.read(CHUNK):
                await self._flowing.wait()
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                sink.close()
