"""Running an app with uvicorn: in the foreground (the CLI) or in a background thread
(tests, benchmarks, an audit's fixture server).

The listening socket is bound before uvicorn starts, so port 0 gives an ephemeral port
whose number is known at once (`bind`), and a port already in use fails with a clear
error before any model is loaded.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


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


def make_server(app, *, log_level: str = "warning", graceful_seconds: float = 10.0) -> uvicorn.Server:
    """A uvicorn server for `app`; in-flight requests get `graceful_seconds` at shutdown
    before they are cancelled."""
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=graceful_seconds,
                            access_log=False)
    return uvicorn.Server(config)


class BackgroundServer:
    """Serve `app` on 127.0.0.1 in a daemon thread (a context manager).

        with BackgroundServer(create_app(decoder)) as url:
            openai.OpenAI(base_url=url + "/v1", api_key="-")...

    Args:
        app: the ASGI app.
        host, port: where to listen (port 0: a free port).
        startup_timeout: seconds to wait for uvicorn to start.

    Raises:
        RuntimeError: if uvicorn does not start in time.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 30.0) -> None:
        self.app, self.host, self.port, self.startup_timeout = app, host, port, startup_timeout
        self.server: uvicorn.Server | None = None
        self.url = ""

    def __enter__(self) -> str:
        sock = bind(self.host, self.port)
        self.url = url_of(sock)
        self.server = make_server(self.app, graceful_seconds=5.0)
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
