"""`python -m bench._podwatch`: when each pod of a namespace was seen created and bound.

Runs in a process of its own, so that the threads creating pods in the benchmark process do not
delay it on the GIL: a late observation would read as binder latency. Times are
`time.monotonic()`, which on Linux is CLOCK_MONOTONIC and so comparable across processes.

Protocol: prints ``ready`` once the watch stream is open (everything created after that is seen),
then exits when ``--count`` pods are bound (or on SIGTERM / ``--timeout``) after printing one JSON
object: {"added": {name: t}, "bound": {name: t}, "listed": n, "events": n, "restarts": n,
"cpu": seconds} ("cpu": what the process used after it printed ``ready``, which is what a run
that starts measuring once the watcher is ready saw it use). A watch the apiserver ends is resumed
from the last event, as informers do.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from kubeio.client import Kube
from kubeio.errors import APIGoneError, APITransportError, status_error
from kubeio.paths import PODS, RESOURCE_CLAIMS


@dataclass
class Seen:
    added: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    listed: int = 0
    events: int = 0
    restarts: int = 0
    #: Watching ResourceClaims instead of pods: "bound" is when a claim was first seen allocated.
    claims: bool = False
    cpu_at_ready: float = 0.0

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
                "cpu": time.process_time() - self.cpu_at_ready,
            }
        )


class _Stopped(Exception):  # noqa: N818 - a signal, not an error
    pass


def _on_term(_signum: int, _frame: FrameType | None) -> None:
    raise _Stopped


def _list(kube: Kube, path: str, seen: Seen) -> str:
    """Observes every object listed; returns the list's resourceVersion."""
    listing = kube.get(path)
    now = time.monotonic()
    for obj in listing["items"]:
        seen.observe(obj, now)
    seen.listed += len(listing["items"])
    return str(listing["metadata"]["resourceVersion"])


def watch(args: argparse.Namespace, seen: Seen) -> None:
    kube = Kube.with_client_certificate(args.server, Path(args.ca), Path(args.cert), Path(args.key))
    path = (RESOURCE_CLAIMS if args.claims else PODS).collection(args.namespace)
    rv = _list(kube, path, seen)
    deadline = time.monotonic() + args.timeout
    ready = False
    while len(seen.bound) < args.count and time.monotonic() < deadline:
        query = {"resourceVersion": rv, "timeoutSeconds": int(args.timeout) + 60}
        try:
            events = kube.stream(path, query, timeout=args.timeout + 90)
        except APIGoneError:  # expired: list again (these are seen late, not lost)
            rv = _list(kube, path, seen)
            continue
        if not ready:
            seen.cpu_at_ready = time.process_time()
            print("ready", flush=True)
            ready = True
        try:
            rv = _follow(events, rv, args.count, deadline, seen)
        except APIGoneError:
            rv = _list(kube, path, seen)
        except APITransportError:
            pass  # cut under load: resume from the last event, as an informer does
        if len(seen.bound) < args.count:
            # The apiserver ends watches (timeouts, a watcher that fell behind under load).
            seen.restarts += 1


def _follow(
    events: Iterator[dict[str, Any]], rv: str, count: int, deadline: float, seen: Seen
) -> str:
    """Observes the events until `count` are bound, the deadline or the stream's end; returns
    the last resourceVersion seen."""
    for event in events:
        now = time.monotonic()
        seen.events += 1
        kind = event.get("type")
        obj = event.get("object", {})
        if kind == "ERROR":
            raise status_error(obj)
        rv = obj.get("metadata", {}).get("resourceVersion", rv)
        if kind in ("ADDED", "MODIFIED"):
            seen.observe(obj, now)
        if len(seen.bound) >= count or now >= deadline:
            break
    return rv


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
