"""The plan's comment poster against a local fake of the GitHub and GitLab REST APIs: one comment
per request, created once and edited in place afterwards, found by its marker past a first page."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpuplace import prcomment
from gpuplace.prcomment import MARKER


@dataclass
class FakeForge:
    """Comments of one pull request, served as GitHub (or GitLab) pages them."""

    token_header: str
    token: str
    comments: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    next_id: int = 1000

    def answer(self, method: str, url: str, headers: Any, body: Any) -> tuple[int, Any]:
        self.calls.append((method, urlsplit(url).path))
        expected = self.token if self.token_header == "PRIVATE-TOKEN" else f"Bearer {self.token}"
        if headers.get(self.token_header) != expected:
            return 401, {"message": "Bad credentials"}
        parts = urlsplit(url)
        path = parts.path
        if method == "GET" and path.endswith(("/comments", "/notes")):
            query = parse_qs(parts.query)
            page, per_page = int(query["page"][0]), int(query["per_page"][0])
            return 200, self.comments[(page - 1) * per_page : page * per_page]
        if method == "POST" and path.endswith(("/comments", "/notes")):
            self.next_id += 1
            self.comments.append({"id": self.next_id, "body": body["body"]})
            return 201, self.comments[-1]
        if method in ("PATCH", "PUT"):
            wanted = int(path.rsplit("/", 1)[1])
            for comment in self.comments:
                if comment["id"] == wanted:
                    comment["body"] = body["body"]
                    return 200, comment
            return 404, {"message": "Not Found"}
        return 404, {"message": "Not Found"}


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, FakeForge]]]:
    forges: dict[str, FakeForge] = {}

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            kind = "gitlab" if "/api/v4/" in self.path else "github"
            status, data = forges[kind].answer(self.command, self.path, self.headers, body)
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_PATCH = do_PUT = _handle  # noqa: N815  http.server names

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", forges
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_github_creates_one_comment_then_edits_it_past_the_first_page(
    server: tuple[str, dict[str, FakeForge]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, forges = server
    forge = forges["github"] = FakeForge("Authorization", "ghs_secret")
    # Someone else's 150 comments first: the marked one is found on the second page.
    forge.comments = [{"id": i, "body": f"comment {i}"} for i in range(150)]
    monkeypatch.setenv("GITHUB_TOKEN", "ghs_secret")
    body = tmp_path / "plan.md"
    argv = ["github", "--repository", "o/maps", "--number", "12", "--api-url", url]

    body.write_text(f"{MARKER}\nfirst plan\n")
    assert prcomment.main([*argv, "--body-file", str(body)]) == 0
    assert "created comment 1001" in capsys.readouterr().out
    assert ("POST", "/repos/o/maps/issues/12/comments") in forge.calls

    body.write_text(f"{MARKER}\nsecond plan\n")
    forge.calls.clear()
    assert prcomment.main([*argv, "--body-file", str(body)]) == 0
    assert "updated comment 1001" in capsys.readouterr().out
    assert ("PATCH", "/repos/o/maps/issues/comments/1001") in forge.calls
    assert not any(method == "POST" for method, _ in forge.calls)
    marked = [c for c in forge.comments if MARKER in c["body"]]
    assert marked == [{"id": 1001, "body": f"{MARKER}\nsecond plan\n"}]


def test_gitlab_edits_the_merge_request_note_in_place(
    server: tuple[str, dict[str, FakeForge]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, forges = server
    forge = forges["gitlab"] = FakeForge("PRIVATE-TOKEN", "glpat-secret")
    forge.comments = [{"id": 7, "body": "LGTM"}, {"id": 8, "body": f"{MARKER}\nold plan"}]
    monkeypatch.setenv("GPUPLACE_GITLAB_TOKEN", "glpat-secret")
    monkeypatch.setenv("CI_API_V4_URL", f"{url}/api/v4")
    monkeypatch.setenv("CI_PROJECT_ID", "group/maps")
    monkeypatch.setenv("CI_MERGE_REQUEST_IID", "3")
    body = tmp_path / "plan.md"
    body.write_text("new plan\n")  # the marker is added when the body lacks it
    assert prcomment.main(["gitlab", "--body-file", str(body)]) == 0
    assert ("PUT", "/api/v4/projects/group%2Fmaps/merge_requests/3/notes/8") in forge.calls
    assert forge.comments[1] == {"id": 8, "body": f"{MARKER}\nnew plan\n"}
    assert len(forge.comments) == 2


def test_a_refused_token_fails_with_the_api_message(
    server: tuple[str, dict[str, FakeForge]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, forges = server
    forges["github"] = FakeForge("Authorization", "right")
    monkeypatch.setenv("GITHUB_TOKEN", "wrong")
    body = tmp_path / "plan.md"
    body.write_text("plan\n")
    argv = ["github", "--repository", "o/m", "--number", "1", "--api-url", url]
    assert prcomment.main([*argv, "--body-file", str(body)]) == 1
    assert "401" in capsys.readouterr().err
    monkeypatch.delenv("GITHUB_TOKEN")
    assert prcomment.main([*argv, "--body-file", str(body)]) == 1
    assert "missing token" in capsys.readouterr().err
