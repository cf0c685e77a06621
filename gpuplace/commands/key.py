"""`gpuplace key list|rotate|adopt`: the binding key ring, as an administrator manages it.

Run with an identity that may read and write the ring's Secret (cluster-admin, or a Role naming
it): the controller's Role is the only other one that can. Every write is guarded by the Secret's
resourceVersion and planned again when the controller or another administrator wrote first.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from collections.abc import Callable

from controller.bindingkey import KeySecret, StoredRing, fetch, write
from gpuplace import inspect, keys
from gpuplace.commands._env import EnvFlags, add_cluster_flags, connect
from kubeio.client import Kube
from kubeio.errors import APIConflictError, APIError
from kubeio.paths import PODS
from kubeio.retry import on_conflict
from kubeio.times import now_time
from placement.keyring import KEY_BYTES, Adoption, KeyRing, RingError, Trust, TrustView

Writer = Callable[[StoredRing, list[keys.BoundPod]], tuple[KeyRing, tuple[Adoption, ...]] | None]


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "key",
        help="the binding key ring: list keys and unverifiable pods, rotate, re-adopt",
        description=(
            "The binder signs every Binding with the newest key of the ring in Secret "
            "gpuplace-binding-key; every key of the ring verifies. A pod signed with a key the "
            "ring no longer holds keeps its GPUs blocked for everyone until it is re-adopted."
        ),
        epilog="adopt [NAMESPACE/POD ...] [--dry-run]: `gpuplace key adopt --help` for more.",
    )
    flags = EnvFlags(p)
    add_cluster_flags(flags)
    flags.string(
        "--namespace", "GPUPLACE_NAMESPACE", "gpuplace-system", help="the controller's namespace"
    )
    p.add_argument("--secret", default="gpuplace-binding-key", help="the key ring's Secret")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    verbs.add_parser("list", help="the ring's keys, the pods each signs, unverifiable pods")
    verbs.add_parser(
        "rotate",
        help="add a new signing key; retire the keys no bound pod uses (the previous one stays)",
    )
    adopt = verbs.add_parser(
        "adopt",
        help="re-adopt pods whose binding names a lost key (all of them, or those named)",
    )
    adopt.add_argument("pods", nargs="*", metavar="NAMESPACE/POD")
    adopt.add_argument("--dry-run", action="store_true", help="say what would be adopted")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    kube = connect(args)
    where = KeySecret(args.namespace, args.secret)
    try:
        match args.verb:
            case "list":
                return _list(kube, where)
            case "rotate":
                return _update(kube, where, _rotate)
            case _:
                return _update(kube, where, _adopter(args.pods, args.dry_run))
    except (RingError, LookupError, APIError) as exc:
        print(f"gpuplace key: {exc}", file=sys.stderr)
        return 1


def _read(kube: Kube, where: KeySecret) -> tuple[StoredRing, list[keys.BoundPod]]:
    stored = fetch(kube, where)
    if stored.ring is None:
        raise LookupError(
            f"{where} holds no key ring yet: the controller makes one when it first leads"
        )
    pods = kube.get(PODS.collection())["items"]
    return stored, keys.judge_all(pods, stored.view)


def _list(kube: Kube, where: KeySecret) -> int:
    stored, bound = _read(kube, where)
    view = stored.view
    used = keys.keys_in_use(bound)
    rows = [
        (k.id, k.created, "yes" if k is view.ring.signer else "", str(used.get(k.id, 0)))
        for k in view.ring.keys
    ]
    print(f"Key ring in {where} (signing since {view.ring.signing_since})")
    print(inspect.table(("KEY ID", "CREATED", "SIGNS", "BOUND PODS"), rows))
    print(f"\n{len(view.adoptions)} adoption record(s)")
    lost = [b for b in bound if b.verdict.trust is Trust.UNVERIFIABLE]
    print(f"\nUnverifiable bindings (key not in the ring; GPUs blocked): {len(lost) or 'none'}")
    for b in lost:
        print(f"  {b.name}: {_holds(b)}, signed with {b.verdict.key_id or 'a v1 key'}")
    return 0


def _holds(b: keys.BoundPod) -> str:
    if b.holding is None:
        return "no binding"
    return f"node {b.holding.node} GPUs {','.join(b.holding.gpus) or '-'}"


def _update(kube: Kube, where: KeySecret, plan: Writer) -> int:
    def attempt() -> int:
        stored, bound = _read(kube, where)
        planned = plan(stored, bound)
        if planned is None:
            return 0
        ring, records = planned
        write(kube, where, stored, ring, records)
        print(f"wrote {where}: {len(ring.keys)} key(s), {len(records)} adoption record(s)")
        return 0

    def retrying() -> None:
        print("the key ring changed while planning; planning again", file=sys.stderr)

    try:
        return on_conflict(attempt, str(where), retrying=retrying)
    except APIConflictError:
        print(f"gpuplace key: {where} kept changing; nothing written", file=sys.stderr)
        return 1


def _rotate(
    stored: StoredRing, bound: list[keys.BoundPod]
) -> tuple[KeyRing, tuple[Adoption, ...]] | None:
    view = stored.view
    used = keys.keys_in_use(bound)
    rotation = view.ring.rotated(secrets.token_bytes(KEY_BYTES), now_time(), used)
    kept = keys.live_adoptions(view.adoptions.values(), bound)
    records = keys.adoption_records(rotation.ring, kept, (), now_time())
    print(f"new signing key {rotation.added}")
    for k in rotation.ring.keys[:-1]:
        print(f"kept {k.id}: {used.get(k.id, 0)} bound pod(s) signed with it")
    for kid in rotation.retired:
        print(f"retired {kid}: no bound pod uses it")
    return rotation.ring, records


def _adopter(wanted: list[str], dry_run: bool) -> Writer:
    def plan(
        stored: StoredRing, bound: list[keys.BoundPod]
    ) -> tuple[KeyRing, tuple[Adoption, ...]] | None:
        view: TrustView = stored.view
        chosen = keys.plan_adoption(bound, wanted)
        for b, why in chosen.refused:
            print(f"not adopted {b.name}: {why}", file=sys.stderr)
        for b in chosen.adopt:
            verb = "would adopt" if dry_run else "adopting"
            print(f"{verb} {b.name}: {_holds(b)}")
        if not chosen.adopt:
            print("no unverifiable binding to adopt")
            return None
        if dry_run:
            return None
        kept = keys.live_adoptions(view.adoptions.values(), bound)
        return view.ring, keys.adoption_records(view.ring, kept, chosen.adopt, now_time())

    return plan
