"""A fault proxy on 127.0.0.1 in front of the S3 server: each request is forwarded, delayed,
dropped (the connection closed unanswered), left unanswered (a store that accepts connections and
never answers) or forwarded with the uploaded file's last byte cut (a store keeping a file short),
as `rule(method, path)` says. Loopback only; every wait is bounded."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Union

Rule = Callable[[str, str], Union[str, float]]  # "pass", "drop", "dead", "truncate", or a delay in seconds
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        self._upstream = (parsed.hostname, parsed.port)
        self.rule: Rule = lambda method, path: "pass"
        self.seen: list[tuple[str, str, str]] = []  # (method, unquoted path, what the rule said)
        self._released = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def release(self) -> None:
        """Ends the requests left hanging (their connections closed unanswered)."""
        self._released.set()

    def kill_child(self, command: list[str] | Callable[[], Any], env: dict[str, str] | None,
                   counted: Callable[[str, str], str | None], when: Callable[[list[str]], bool],
                   timeout: float = 300) -> tuple[str, int, list[str]]:
        """Runs `command` and SIGKILLs it as it sends the request that makes `when(sent)` true,
        before the store gets it (the request is dropped): a real kill at a real point of a real
        exchange. `sent` lists `counted(method, path)` of each request it counts (None: not
        counted). `command` is a command line (run with `env`) or a function that starts the
        process and returns it (as `subprocess.Popen` does: its `pid`, `communicate`,
        `returncode`; tests/storage/preloaded.py's forks). Returns the child's output, its pid and
        `sent`; the child must have been killed."""
        box, sent = [], []

        def rule(method, path):
            name = counted(method, path)
            if name is not None:
                sent.append(name)
                if when(sent):
                    os.kill(box[0].pid, signal.SIGKILL)
                    return "drop"
            return "pass"

        self.rule = rule
        box.append(command() if callable(command) else
                   subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
        out = box[0].communicate(timeout=timeout)[0]
        self.rule = lambda method, path: "pass"
        assert box[0].returncode == -signal.SIGKILL, f"{sent}\n{out[-3000:]}"
        return out, box[0].pid, sent

    def close(self) -> None:
        """Releases the requests left hanging, then stops listening."""
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                    self.rfile.readline()
                    return b"".join(parts)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self) -> None:
                body = self._body()
                path = urllib.parse.unquote(self.path)
                what = proxy.rule(self.command, path)
                proxy.seen.append((self.command, path, str(what)))
                if what == "dead":
                    proxy._released.wait(timeout=300)
                if what in ("dead", "drop"):
                    self.close_connection = True
                    return
                if isinstance(what, (int, float)):
                    time.sleep(what)
                if what == "truncate":
                    body = _cut_last_byte(body, self.headers.get("Content-Type", ""))
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                upstream.request(self.command, self.path, body=body or None, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP:
                        self.send_header(key, value)
                length = answer.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                upstream.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        return Handler


def _cut_last_byte(body: bytes, content_type: str) -> bytes:
    """`body` with the uploaded file's last byte gone: in a multipart upload (gcsfs's, each part
    ended by a line break before the boundary), the byte before the closing boundary."""
    if content_type.startswith("multipart/"):
        end = body.rindex(b"\n--")
        return body[:end - 1] + body[end:]
    return body[:-1]
