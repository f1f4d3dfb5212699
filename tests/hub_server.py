"""A local HTTP server that answers the Hugging Face Hub endpoints huggingface_hub calls.

The scripts under test reach it through HF_ENDPOINT=http://127.0.0.1:PORT, so huggingface_hub's own
client code runs: HEAD/GET /{repo}/resolve/{rev}/{file} (with Range), GET /api/models/{repo}[/revision/{rev}],
and the error headers the client maps to exceptions (X-Error-Code: GatedRepo, RepoNotFound,
RevisionNotFound, EntryNotFound). Special repos misbehave: err/server-error answers 500,
err/hang never answers within the client's timeout.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "0" * 40
    gated: bool = False
    allowed_tokens: set[str] = field(default_factory=set)
    branches: set[str] = field(default_factory=set)  # names besides main that resolve to the same commit


class Hub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None, str | None]] = []  # (method, path, auth, range)
        self.hang_seconds = 60.0
        self._server: ThreadingHTTPServer | None = None

    def add_folder(self, repo_id: str, folder: Path, **kw) -> Repo:
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        commit = hashlib.sha1(repo_id.encode()).hexdigest()
        self.repos[repo_id] = Repo(files, commit, **kw)
        return self.repos[repo_id]

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Hub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # keep test output clean
                pass

            def do_HEAD(self):
                hub._handle(self, head=True)

            def do_GET(self):
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()

    # ---- request handling

    def _send(self, h, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False):
        h.send_response(status)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def _error(self, h, status: int, code: str | None, message: str, head: bool):
        headers = {"X-Error-Message": message, "Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        self._send(h, status, json.dumps({"error": message}).encode(), headers, head)

    def _access(self, h, repo_id: str, head: bool) -> Repo | None:
        if repo_id == "err/server-error":
            self._error(h, 500, None, "Internal Error", head)
            return None
        if repo_id == "err/hang":
            time.sleep(self.hang_seconds)
            return None
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 404, "RepoNotFound", "Repository not found", head)
            return None
        if repo.gated:
            auth = h.headers.get("Authorization", "")
            token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
            if token is None:
                self._error(
                    h,
                    401,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted. "
                    "You must have access to it and be authenticated to access it. Please log in.",
                    head,
                )
                return None
            if token not in repo.allowed_tokens:
                self._error(
                    h,
                    403,
                    "GatedRepo",
                    f"Access to model {repo_id} is restricted and you are not in "
                    "the authorized list. Visit the model page to ask for access.",
                    head,
                )
                return None
        return repo

    def _handle(self, h, head: bool):
        path = h.path.split("?", 1)[0]
        self.requests.append((h.command, path, h.headers.get("Authorization"), h.headers.get("Range")))
        m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$", path)
        if m:
            repo = self._access(h, m.group(1), head)
            if repo is None:
                return
            if m.group(2) not in (None, "main", repo.commit, *repo.branches):
                return self._error(h, 404, "RevisionNotFound", "Invalid rev id", head)
            info = {
                "id": m.group(1),
                "modelId": m.group(1),
                "sha": repo.commit,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "tags": [],
                "siblings": [{"rfilename": n, "size": len(b)} for n, b in sorted(repo.files.items())],
            }
            return self._send(h, 200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
        m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if not m:
            return self._error(h, 404, None, "Not found", head)
        repo = self._access(h, m.group(1), head)
        if repo is None:
            return
        if m.group(2) not in ("main", repo.commit, *repo.branches):
            return self._error(h, 404, "RevisionNotFound", "Invalid rev id", head)
        body = repo.files.get(m.group(3))
        if body is None:
            return self._error(h, 404, "EntryNotFound", "Entry not found", head)
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{hashlib.sha256(body).hexdigest()}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        rng = re.match(r"bytes=(\d+)-(\d*)", h.headers.get("Range", ""))
        if rng and not head:
            start = int(rng.group(1))
            end = min(int(rng.group(2)) if rng.group(2) else len(body) - 1, len(body) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(body)}"
            return self._send(h, 206, body[start : end + 1], headers)
        return self._send(h, 200, body, headers, head)
