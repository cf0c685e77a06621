"""Posts the plan as one comment on a pull request (GitHub) or merge request (GitLab), editing the
earlier one in place: the comment is found by its hidden marker line (planreport.MARKER).

Run by the composite action (action.yml) and the GitLab CI template:

    python -m gpuplace.prcomment github --repository OWNER/NAME --number 12 --body-file plan.md
    python -m gpuplace.prcomment gitlab --project 42 --number 7 --body-file plan.md

The token comes from the environment: GITHUB_TOKEN (pull-requests: write), or GPUPLACE_GITLAB_TOKEN
(a project access token with the api scope; a job token cannot write notes). --api-url defaults
to GITHUB_API_URL / CI_API_V4_URL, so GitHub Enterprise and self-managed GitLab work unchanged.
Standard library only (urllib): nothing but the gpuplace package needs installing in the job.

Requests are built without I/O (`Forge`); `post_plan` sends them through a `Send` function.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

#: The hidden line that marks the plan's comment, so that a later run edits it in place.
MARKER = "<!-- gpuplace-plan -->"
PER_PAGE = 100
#: Pages of comments read before giving up the search (10,000 comments).
MAX_PAGES = 100
TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None


Send = Callable[[Request], Any]


class APIError(Exception):
    """The forge's API refused a request; the message names it and the status."""


@dataclass(frozen=True, slots=True)
class Forge:
    """One pull or merge request's comments on GitHub or GitLab."""

    kind: str  # github | gitlab
    api_url: str
    target: str  # GitHub: owner/name; GitLab: project id or path
    number: int
    token: str

    @property
    def headers(self) -> dict[str, str]:
        if self.kind == "github":
            return {
                "Accept": "application/vnd.github+json",
                "Authorization": f"Bearer {self.token}",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "gpuplace-plan",
            }
        return {"PRIVATE-TOKEN": self.token, "User-Agent": "gpuplace-plan"}

    @property
    def _comments(self) -> str:
        base = self.api_url.rstrip("/")
        if self.kind == "github":
            return f"{base}/repos/{self.target}/issues/{self.number}/comments"
        project = quote(self.target, safe="")
        return f"{base}/projects/{project}/merge_requests/{self.number}/notes"

    def list(self, page: int) -> Request:
        query = f"?per_page={PER_PAGE}&page={page}"
        if self.kind == "gitlab":
            query += "&sort=asc&order_by=created_at"
        return Request("GET", self._comments + query, self.headers)

    def create(self, body: str) -> Request:
        return Request("POST", self._comments, self.headers, {"body": body})

    def update(self, comment_id: int, body: str) -> Request:
        if self.kind == "github":
            base = self.api_url.rstrip("/")
            url = f"{base}/repos/{self.target}/issues/comments/{comment_id}"
            return Request("PATCH", url, self.headers, {"body": body})
        return Request("PUT", f"{self._comments}/{comment_id}", self.headers, {"body": body})


def find_marked(forge: Forge, send: Send, marker: str = MARKER) -> int | None:
    """The id of the first comment that carries `marker`, reading page after page."""
    for page in range(1, MAX_PAGES + 1):
        comments = send(forge.list(page))
        if not isinstance(comments, list):
            raise APIError(f"listing comments: expected a list, got {type(comments).__name__}")
        for comment in comments:
            if marker in str(comment.get("body") or ""):
                return int(comment["id"])
        if len(comments) < PER_PAGE:
            return None
    return None


def post_plan(forge: Forge, body: str, send: Send, marker: str = MARKER) -> tuple[str, int]:
    """Edits the marked comment to `body`, or creates it: ("updated" | "created", its id)."""
    if marker not in body:
        body = f"{marker}\n{body}"
    found = find_marked(forge, send, marker)
    if found is not None:
        send(forge.update(found, body))
        return "updated", found
    created = send(forge.create(body))
    return "created", int(created["id"])


def send_http(request: Request) -> Any:
    """Sends `request` with urllib; the decoded JSON answer."""
    data = None if request.body is None else json.dumps(request.body).encode()
    headers = dict(request.headers)
    if data is not None:
        headers["Content-Type"] = "application/json"
    if not request.url.startswith(("https://", "http://")):
        raise APIError(f"{request.url}: not an http(s) URL")
    http = urllib.request.Request(request.url, data, headers, method=request.method)  # noqa: S310
    try:
        with urllib.request.urlopen(http, timeout=TIMEOUT_SECONDS) as answer:  # noqa: S310
            raw = answer.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:500].decode("utf-8", errors="replace")
        raise APIError(
            f"{request.method} {request.url}: {exc.code} {exc.reason}: {detail}"
        ) from exc
    except urllib.error.URLError as exc:
        raise APIError(f"{request.method} {request.url}: {exc.reason}") from exc
    return json.loads(raw) if raw.strip() else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpuplace.prcomment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("forge", choices=("github", "gitlab"))
    parser.add_argument("--repository", help="GitHub: OWNER/NAME (default $GITHUB_REPOSITORY)")
    parser.add_argument("--project", help="GitLab: project id or path (default $CI_PROJECT_ID)")
    parser.add_argument("--number", type=int, help="pull request number / merge request IID")
    parser.add_argument("--body-file", required=True, type=Path, help="the comment (Markdown)")
    parser.add_argument("--api-url", help="API root (default $GITHUB_API_URL / $CI_API_V4_URL)")
    return parser


def forge_of(args: argparse.Namespace, env: dict[str, str]) -> Forge:
    if args.forge == "github":
        target = args.repository or env.get("GITHUB_REPOSITORY", "")
        api = args.api_url or env.get("GITHUB_API_URL", "https://api.github.com")
        token = env.get("GITHUB_TOKEN", "")
        number = args.number
    else:
        target = args.project or env.get("CI_PROJECT_ID", "")
        api = args.api_url or env.get("CI_API_V4_URL", "")
        token = env.get("GPUPLACE_GITLAB_TOKEN", "")
        number = args.number or int(env.get("CI_MERGE_REQUEST_IID", "0") or 0)
    missing = [
        what
        for what, value in (("repository/project", target), ("API URL", api), ("token", token))
        if not value
    ]
    if not number:
        missing.append("request number")
    if missing:
        raise APIError(f"missing {', '.join(missing)} (see --help)")
    return Forge(args.forge, api, target, int(number), token)


def main(argv: Sequence[str] | None = None, send: Send = send_http) -> int:
    args = _parser().parse_args(argv)
    try:
        forge = forge_of(args, dict(os.environ))
        body = args.body_file.read_text(encoding="utf-8")
        outcome, comment = post_plan(forge, body, send)
    except (APIError, OSError, ValueError, KeyError) as exc:
        print(f"gpuplace prcomment: error: {exc}", file=sys.stderr)
        return 1
    print(f"{outcome} comment {comment}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
