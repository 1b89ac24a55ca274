"""gcp-storage-emulator with its multipart uploads read byte for byte: run as the emulator's own
command line (`python gcs_emulator.py start --port N ...`).

gcsfs uploads a file under 5 MiB as one `multipart/related` request, each part's body ended by a
bare LF before the next boundary ("...<data>\\n--==0==--"). The emulator parses that body with
Python's email parser, which reads a CR before that LF as part of the line break: a file whose
last byte is "\\r" is stored one byte short (about one checkpoint file in 256; the flaky
"holds 113 bytes, and .fitjax-complete lists 114" of a store test). Here each part is cut where
the client put its boundary, with the line break the client uses (LF or CRLF, read from its
first header line), so the emulator stores exactly the bytes sent, as a real store does.
"""

from __future__ import annotations

import json
import re

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main

_emulators_read = server._read_data


def _related_parts(raw: bytes, content_type: str) -> list[tuple[str, bytes]]:
    """The parts of a `multipart/related` body: (their Content-Type, their exact bytes)."""
    boundary = re.search(r'boundary="?([^";]+)"?', content_type).group(1).encode()
    parts = []
    for chunk in raw.split(b"--" + boundary)[1:]:
        if chunk.startswith(b"--"):
            break  # the closing delimiter
        eol = b"\r\n" if chunk.startswith(b"\r\n") else b"\n"
        head, _, body = chunk[len(eol):].partition(eol + eol)
        body = body[:-len(eol)] if body.endswith(eol) else body  # the break before the next boundary
        fields = dict(line.split(b":", 1) for line in head.split(eol) if b":" in line)
        kind = {k.strip().lower(): v.strip() for k, v in fields.items()}.get(b"content-type", b"")
        parts.append((kind.decode().split(";")[0], body))
    return parts


def _read_data(request_handler, query):
    content_type = request_handler.headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/related"):
        return _emulators_read(request_handler, query)
    raw = server._decode_raw_data(server._read_raw_data(request_handler), request_handler)
    (_, meta), (kind, content) = _related_parts(raw, content_type)[:2]
    return {"meta": json.loads(meta), "content": content, "content-type": kind}


server._read_data = _read_data

# The emulator serves one request at a time on http.server's HTTPServer, whose listen backlog is 5,
# and answers in HTTP/1.0 (a new connection per request); gcsfs sends a checkpoint's files
# concurrently, so a burst of connections overflowed the backlog (the kernel logged SYN cookies
# for its port) and clients waited on retransmitted handshakes. Queued connections wait their turn.
server.server.HTTPServer.request_queue_size = 128

if __name__ == "__main__":
    main()
