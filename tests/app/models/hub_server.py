"""A Hugging Face Hub on loopback, in the hub's URL layout, for huggingface_hub to talk to
(HF_ENDPOINT points at it). It serves what huggingface_hub reads:

- GET /api/models/{repo}/revision/{rev}?blobs=true: the repo's files (`siblings`) with
  size, blobId and, for LFS files, lfs.{sha256,size,pointerSize};
- HEAD/GET /{repo}/resolve/{rev}/{file}: an LFS file answers 302 to a CDN address on
  another host name (localhost, where the hub is 127.0.0.1, so huggingface_hub stops at
  the redirect as with the real CDN) with ETag, X-Linked-Etag (the sha256),
  X-Linked-Size and X-Repo-Commit; a git file answers 200 with its blob id as ETag;
- GET /cdn/{repo}/{file} with Range support (206, Content-Range).

Faults a test can switch on: `corrupt` (serve bytes that differ from the sha256 it
reports), `drop_after` (send that many bytes of the body, then close the connection)
and `hold_after` (send that many, then wait for an event: a download in progress).
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, dict[str, bytes]]
    lfs_min_bytes: int = 64  # files this large are LFS files, as on the hub
    corrupt: set[str] = field(default_factory=set)  # file names served with a flipped byte
    drop_after: dict[str, int] = field(default_factory=dict)  # file -> bytes sent, then cut
    # file -> (bytes sent, event): the rest of the body waits for the event
    hold_after: dict[str, tuple[int, threading.Event]] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # verb, path, Range
    auth: list[tuple[str, str, str | None]] = field(default_factory=list)  # verb, path, token
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def is_lfs(self, data: bytes) -> bool:
        return len(data) >= self.lfs_min_bytes

    def siblings(self, repo: str) -> list[dict]:
        out = []
        for name, data in self.repos[repo].items():
            entry: dict = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
            if self.is_lfs(data):
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
                entry["size"] = len(data)
            out.append(entry)
        return out


def serve(hub: FakeHub) -> tuple[ThreadingHTTPServer, threading.Thread]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args) -> None:
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        def _route(self, head: bool) -> None:
            url = urlparse(self.path)
            path = unquote(url.path)
            hub.requests.append(("HEAD" if head else "GET", path, self.headers.get("Range")))
            hub.auth.append(("HEAD" if head else "GET", path, self.headers.get("Authorization")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and "revision" in parts:
                at = parts.index("revision")
                repo = "/".join(parts[2:at])
                if repo not in hub.repos:
                    return self._error(404, "RepoNotFound", "Repository not found")
                body = {"id": repo, "sha": COMMIT, "siblings": hub.siblings(repo)}
                return self._json(body)
            if len(parts) >= 5 and parts[2] == "resolve":
                return self._resolve("/".join(parts[:2]), "/".join(parts[4:]), head)
            if parts[:1] == ["cdn"] and len(parts) >= 4:
                return self._file("/".join(parts[1:3]), "/".join(parts[3:]), head)
            return self._error(404, "EntryNotFound", "no such path")

        def _resolve(self, repo: str, name: str, head: bool) -> None:
            if repo not in hub.repos:
                return self._error(404, "RepoNotFound", "Repository not found")
            data = hub.repos[repo].get(name)
            if data is None:
                return self._error(404, "EntryNotFound", "Entry not found")
            if not hub.is_lfs(data):
                self.send_response(200)
                self.send_header("ETag", f'"{git_blob_id(data)}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not head:
                    self.wfile.write(data)
                return None
            sha = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{hub.port}/cdn/{repo}/{name}")
            self.send_header("ETag", f'"{git_blob_id(data)}"')
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None

        def _file(self, repo: str, name: str, head: bool) -> None:
            data = hub.repos.get(repo, {}).get(name)
            if data is None:
                return self._error(404, "EntryNotFound", "Entry not found")
            if name in hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            ranged = self.headers.get("Range")
            if ranged and ranged.startswith("bytes="):
                start = int(ranged[6:].split("-")[0])
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(data) - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if head:
                return None
            body = data[start:]
            cut = hub.drop_after.get(name)
            if cut is not None and start < cut:
                self.wfile.write(body[: cut - start])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # the body ends short of Content-Length
                return None
            held = hub.hold_after.get(name)
            if held is not None:
                self.wfile.write(body[: held[0]])
                self.wfile.flush()
                held[1].wait(10)
                body = body[held[0] :]
            self.wfile.write(body)
            return None

        def _json(self, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _error(self, status: int, code: str, message: str) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    class Server(ThreadingHTTPServer):
        def handle_error(self, request, client_address) -> None:
            pass  # a client gone mid-body (the drop tests) is expected, not news

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hub.port = server.server_address[1]
    thread = threading.Thread(
        target=server.serve_forever, args=(0.05,), name="fake-hub", daemon=True
    )
    thread.start()
    return server, thread
