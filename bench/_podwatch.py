"""`python -m bench._podwatch`: when each pod of a namespace was seen created and bound.

Runs in a process of its own, so that the threads creating pods in the benchmark process do not
delay it on the GIL: a late observation would read as binder latency. Times are
`time.monotonic()`, which on Linux is CLOCK_MONOTONIC and so comparable across processes.

Protocol: prints ``ready`` once the watch stream is open (everything created after that is seen),
then exits when ``--count`` pods are bound (or on SIGTERM / ``--timeout``) after printing one JSON
object: {"added": {name: t}, "bound": {name: t}, "listed": n, "events": n, "restarts": n,
"cpu": seconds}. A watch the apiserver ends is resumed from the last event, as informers do.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import signal
import ssl
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any


@dataclass
class Seen:
    added: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    listed: int = 0
    events: int = 0
    restarts: int = 0
    #: Watching ResourceClaims instead of pods: "bound" is when a claim was first seen allocated.
    claims: bool = False

    def observe(self, obj: dict[str, Any], now: float) -> None:
        name = str(obj["metadata"]["name"])
        self.added.setdefault(name, now)
        if self.claims:
            done = bool((obj.get("status") or {}).get("allocation"))
        else:
            done = bool(obj.get("spec", {}).get("nodeName"))
        if done:
            self.bound.setdefault(name, now)

    def to_json(self) -> str:
        return json.dumps(
            {
                "added": self.added,
                "bound": self.bound,
                "listed": self.listed,
                "events": self.events,
                "restarts": self.restarts,
                "cpu": time.process_time(),
            }
        )


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    pass


def _on_term(_signum: int, _frame: FrameType | None) -> None:
    raise _Stopped


def _connect(args: argparse.Namespace) -> http.client.HTTPSConnection:
    context = ssl.create_default_context(cafile=args.ca)
    context.load_cert_chain(args.cert, args.key)
    host, port = args.server.removeprefix("https://").rsplit(":", 1)
    return http.client.HTTPSConnection(host, int(port), context=context, timeout=args.timeout)


def _list(connection: http.client.HTTPSConnection, path: str, seen: Seen) -> str:
    """Observes every pod listed; returns the list's resourceVersion."""
    connection.request("GET", path, headers={"Accept": "application/json"})
    response = connection.getresponse()
    listing = json.loads(response.read())
    if response.status != 200:
        raise SystemExit(f"listing pods: HTTP {response.status}: {listing}")
    now = time.monotonic()
    for pod in listing["items"]:
        seen.observe(pod, now)
    seen.listed += len(listing["items"])
    return str(listing["metadata"]["resourceVersion"])


def watch(args: argparse.Namespace, seen: Seen) -> None:
    base = (
        f"/apis/resource.k8s.io/v1/namespaces/{args.namespace}/resourceclaims"
        if args.claims
        else f"/api/v1/namespaces/{args.namespace}/pods"
    )
    connection = _connect(args)
    rv = _list(connection, base, seen)
    deadline = time.monotonic() + args.timeout
    ready = False
    while len(seen.bound) < args.count and time.monotonic() < deadline:
        query = f"watch=true&resourceVersion={rv}&timeoutSeconds={int(args.timeout) + 60}"
        connection.request("GET", f"{base}?{query}", headers={"Accept": "application/json"})
        stream = connection.getresponse()
        if stream.status == 410:  # expired: list again (these pods are seen late, not lost)
            stream.read()
            rv = _list(connection, base, seen)
            continue
        if stream.status != 200:
            raise SystemExit(f"watching pods: HTTP {stream.status}: {stream.read()!r}")
        if not ready:
            print("ready", flush=True)
            ready = True
        while len(seen.bound) < args.count and time.monotonic() < deadline:
            line = stream.readline()
            if not line:
                # The apiserver ends watches (timeouts, a watcher that fell behind under load):
                # resume from the last event seen, as an informer does.
                seen.restarts += 1
                connection.close()
                connection = _connect(args)
                break
            now = time.monotonic()
            event = json.loads(line)
            seen.events += 1
            kind = event.get("type")
            obj = event.get("object", {})
            if kind == "ERROR":
                if obj.get("code") == 410:
                    connection.close()
                    connection = _connect(args)
                    rv = _list(connection, base, seen)
                    break
                raise SystemExit(f"watch error: {obj}")
            rv = obj.get("metadata", {}).get("resourceVersion", rv)
            if kind in ("ADDED", "MODIFIED"):
                seen.observe(obj, now)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._podwatch")
    parser.add_argument("--server", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--count", type=int, required=True, help="exit once this many are bound")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--claims", action="store_true", help="watch ResourceClaims: done once allocated"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    seen = Seen(claims=args.claims)
    with contextlib.suppress(_Stopped):
        watch(args, seen)
    print(seen.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
