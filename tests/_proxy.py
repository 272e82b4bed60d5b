"""A TCP proxy for tests, in front of a shared server: the honest "connection cut" and "server
away" without stopping the server that other tests use.

``cut()`` closes every connection through the proxy (both sides, as a network failure or a
server restart would); ``pause()`` refuses new connections (the listening socket is closed, so
a client gets "connection refused") until ``resume()``; ``cut_after(n)`` cuts once clients have
sent ``n`` more bytes, to land a cut in the middle of what a client is sending. Each connection
is two threads copying bytes, one per direction.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

from tests._ports import free_ports

ACCEPT_POLL_SECONDS = 0.1
"""How often the accepting thread looks whether it was told to stop listening."""

CHUNK = 65536


class Proxy:
    """Forwards ``listen_host:port`` (``127.0.0.1`` unless told) to ``upstream`` until closed."""

    def __init__(
        self, upstream_host: str, upstream_port: int, *, listen_host: str = "127.0.0.1"
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listen_host = listen_host
        self.port = free_ports()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._accepting: threading.Thread | None = None
        self._stop_accepting = threading.Event()
        self._armed: tuple[int, bool] | None = None
        self.connections = 0
        """How many connections the proxy has accepted in all."""
        self.cuts: list[int] = []
        """How many client connections each cut closed, in order."""

    def __enter__(self) -> Proxy:
        self.resume()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def open_connections(self) -> int:
        """How many client connections are open through the proxy now."""
        with self._lock:
            return len(self._sockets) // 2

    def resume(self) -> None:
        """Accept new connections (again)."""
        if self._accepting is not None:
            return
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.listen_host, self.port))
        listener.listen(64)
        listener.settimeout(ACCEPT_POLL_SECONDS)
        self._stop_accepting = threading.Event()
        accepting = threading.Thread(
            target=self._accept,
            args=(listener, self._stop_accepting),
            name="proxy-accept",
            daemon=True,
        )
        with self._lock:
            self._listener, self._accepting = listener, accepting
        accepting.start()

    def pause(self) -> None:
        """Refuse new connections (open ones go on: :meth:`cut` ends them)."""
        with self._lock:
            accepting, self._accepting = self._accepting, None
            listener, self._listener = self._listener, None
        if accepting is None or listener is None:
            return
        self._stop_accepting.set()
        # Closed at once, not at the accepting thread's next look: refused from now on.
        _close(listener)
        if accepting is not threading.current_thread():
            accepting.join()

    def cut(self) -> int:
        """Close every open connection, both sides; how many client connections were cut."""
        with self._lock:
            cut = list(self._sockets)
            self._sockets.clear()
            self.cuts.append(len(cut) // 2)
        for sock in cut:
            _close(sock)
        return len(cut) // 2

    def cut_after(self, sent: int, *, pause: bool = False) -> None:
        """Cut every connection (and refuse new ones, with ``pause``) once clients have sent
        ``sent`` more bytes through the proxy."""
        with self._lock:
            self._armed = (sent, pause)

    @property
    def armed(self) -> bool:
        """Whether a :meth:`cut_after` is still to happen."""
        with self._lock:
            return self._armed is not None

    def close(self) -> None:
        """Stop listening and cut every connection."""
        self.pause()
        self.cut()

    def _accept(self, listener: socket.socket, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                _close(client)
                continue
            client.settimeout(None)
            server.settimeout(None)
            with self._lock:
                # Paused between the accept and now: this one is refused too.
                refused = stop.is_set()
                if not refused:
                    self._sockets.update((client, server))
                    self.connections += 1
            if refused:
                _close(client)
                _close(server)
                return
            for source, target, upstream in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump,
                    args=(source, target, upstream),
                    name="proxy-pump",
                    daemon=True,
                ).start()

    def _pump(self, source: socket.socket, target: socket.socket, upstream: bool) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(CHUNK):
                if upstream and self._count(len(chunk)):
                    return
                target.sendall(chunk)
        # One side ended: end the other, as a dropped connection does.
        with self._lock:
            self._sockets.discard(source)
            self._sockets.discard(target)
        _close(source)
        _close(target)

    def _count(self, sent: int) -> bool:
        """Count bytes a client sent; True when that fires an armed cut (the bytes are lost)."""
        with self._lock:
            if self._armed is None:
                return False
            left, pause = self._armed
            if left > sent:
                self._armed = (left - sent, pause)
                return False
            self._armed = None
        if pause:
            self.pause()
        self.cut()
        return True


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
