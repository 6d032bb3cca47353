"""Running an app with uvicorn: in the foreground (the CLI) or in a background thread
(tests, benchmarks, an audit's fixture server).

The listening socket is bound before uvicorn starts, so port 0 gives an ephemeral port
whose number is known at once (`bind`), and a port already in use fails with a clear
error before any model is loaded.

Two things uvicorn does not do are added here:

* a header read timeout: a connection that has not completed a request's headers
  within the read timeout (after connecting, or after its last response) is closed,
  so clients that open connections and send nothing (or a byte at a time) cannot hold
  them forever; the body's own time limit is `guard.Guard`'s;
* a graceful shutdown that answers everyone: before uvicorn stops, the server's
  `ServeState.drain` refuses new requests, answers the queued ones with a 503 in
  OpenAI's error shape and gives the one decoding `graceful_seconds` to finish (a
  stream that must stop early still gets its final chunk and ``[DONE]``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one.

    Raises:
        OSError: naming the address when it cannot be bound (port in use, bad host).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    """http://host:port of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _timed_protocol(read_timeout: float) -> type:
    """uvicorn's h11 protocol, closing connections whose request headers do not arrive
    within `read_timeout` seconds (see the module docstring)."""

    class TimedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            cycle = self.cycle          # a new request replaces it once its headers are in
            self.loop.call_later(read_timeout, self._header_timeout, cycle)

        def _header_timeout(self, cycle) -> None:
            waiting = cycle is None or cycle.response_complete     # for headers, not for the app
            if self.cycle is cycle and waiting and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol


class _Server(uvicorn.Server):
    """uvicorn's server with `drain` run before its own shutdown (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[float], None] | None, grace: float) -> None:
        super().__init__(config)
        self.drain, self.grace = drain, grace

    async def shutdown(self, sockets=None) -> None:
        if self.drain is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.drain, self.grace)
        await super().shutdown(sockets)


def make_server(app, *, log_level: str = "warning", graceful_seconds: float = 10.0) -> uvicorn.Server:
    """A uvicorn server for `app`.

    At shutdown the request decoding gets `graceful_seconds` to finish and queued ones
    are answered with a 503 (when `app` is a verispec app); connections must send their
    request headers within the app's read timeout (`guard.Limits.read_timeout`, 30 s
    for other apps); idle keep-alive connections close after 5 s.
    """
    state = getattr(getattr(app, "state", None), "verispec", None)
    read_timeout = state.limits.read_timeout if state is not None else 30.0
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_seconds,
                            access_log=False, http=_timed_protocol(read_timeout), timeout_keep_alive=5)
    return _Server(config, state.drain if state is not None else None, graceful_seconds)


class BackgroundServer:
    """Serve `app` on 127.0.0.1 in a daemon thread (a context manager).

        with BackgroundServer(create_app(decoder)) as url:
            openai.OpenAI(base_url=url + "/v1", api_key="-")...

    Args:
        app: the ASGI app.
        host, port: where to listen (port 0: a free port).
        startup_timeout: seconds to wait for uvicorn to start.
        graceful_seconds: at exit, what the request decoding gets to finish (`make_server`).

    Raises:
        RuntimeError: if uvicorn does not start in time.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0,
                 graceful_seconds: float = 5.0) -> None:
        self.app, self.host, self.port, self.startup_timeout = app, host, port, startup_timeout
        self.graceful_seconds = graceful_seconds
        self.server: uvicorn.Server | None = None
        self.url = ""

    def __enter__(self) -> str:
        sock = bind(self.host, self.port)
        self.url = url_of(sock)
        self.server = make_server(self.app, graceful_seconds=self.graceful_seconds)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                        name="verispec-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self.url

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.should_exit = True
            self._thread.join(30)
