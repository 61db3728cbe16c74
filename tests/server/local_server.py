"""The one local HTTP server of the server tests: on 127.0.0.1, in a thread, stopped on leaving
its ``with`` block."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from typing import Self

#: seconds between the serving loop's looks for a stop, which ``shutdown`` waits for: the
#: standard library's 0.5 s made each of about 70 tests half a second longer
POLL_SECONDS = 0.01


class LocalServer:
    """Serves ``handler`` (its own threads: ``threaded``) until the ``with`` block ends."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, threaded: bool = True) -> None:
        self.httpd = (ThreadingHTTPServer if threaded else HTTPServer)(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": POLL_SECONDS}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
