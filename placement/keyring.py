"""The binding key ring, adoption records, and what a bound pod's signature proves.

The binder signs every Binding (placement/annotations.py); the slot cache counts a bound pod's GPUs
by what its signature proves. The ring lives in one Secret (controller/bindingkey.py) that only the
controller's identity may write; its newest key signs, every key verifies, and each signature names
its key (`v2:<key id>:<mac>`). A key id is derived from the key's bytes, so a corrupted key is
another key, never the same id with other bytes.

What a bound pod's gpuplace.io/* annotations prove, and what it holds (`judge`):

| the pod's signature                                   | trust        | holds its GPUs |
|-------------------------------------------------------|--------------|----------------|
| names a key of the ring and verifies                  | Verified     | yes            |
| names a key of the ring and does not verify           | Forged       | no             |
| names a key the ring no longer holds (key lost)       | Unverifiable | yes, reported  |
|   ... and an adoption record signed by the ring names it | Adopted   | yes            |
| `v1` (before the ring) and verifies under a ring key  | Verified     | yes            |
| `v1` and verifies under none                          | Unverifiable | yes, reported  |
| none, pod created before signing began                | PreSigning   | yes            |
| none (or malformed), pod created after                | Forged       | no             |

A lost key cannot be told from a forgery that names an unknown key, so both fail closed: the GPUs
stay blocked (nothing else is placed on them) until an administrator re-adopts the pod or deletes
it. Forging such a binding at all needs an identity that may bind pods and bypass the chart's
admission policy; a forgery under a key the ring holds is caught and holds nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from placement.annotations import (
    SIGNATURE_ANNOTATION,
    SIGNATURE_V1,
    binding_digest,
    has_binding_annotations,
    signature_of,
    verify_signature,
)

KEYRING_FIELD = "keyring.json"
ADOPTIONS_FIELD = "adoptions.json"
#: The one key of the releases before the ring (`data.key`); read once and carried into the ring.
LEGACY_KEY_FIELD = "key"
MIN_KEY_BYTES = 16
KEY_BYTES = 32
RING_FORMAT = 1


class RingError(ValueError):
    """The Secret's ring or adoption records cannot be read; the message says where and what."""


def key_id(secret: bytes) -> str:
    """The id a signature names its key by: derived from the key, so a changed key is a new id."""
    return hashlib.sha256(b"gpuplace.io/binding-key\0" + secret).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class RingKey:
    secret: bytes = field(repr=False)
    created: str  # RFC 3339, UTC
    #: `key_id(secret)`, derived once: every signature made and checked names it.
    id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", key_id(self.secret))


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Oldest key first; the last one signs. `signing_since`: pods created before it may carry no
    signature (bound by a release that signed nothing yet) and still hold their GPUs."""

    keys: tuple[RingKey, ...]
    signing_since: str

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a key ring holds at least one key")

    @property
    def signer(self) -> RingKey:
        return self.keys[-1]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(k.id for k in self.keys)

    def get(self, kid: str) -> RingKey | None:
        return next((k for k in self.keys if k.id == kid), None)

    def rotated(self, secret: bytes, now: str, in_use: Iterable[str]) -> Rotation:
        """A new key signs from now on. Kept: the key that signed until now (a Binding may be
        in flight under it) and every key a bound pod's signature or an adoption record still
        names; the others are retired."""
        used = set(in_use) | {self.signer.id}
        new = RingKey(secret, now)
        if new.id in self.ids:
            raise ValueError("the new key is already in the ring")
        kept = tuple(k for k in self.keys if k.id in used)
        retired = tuple(k.id for k in self.keys if k.id not in used)
        return Rotation(KeyRing((*kept, new), self.signing_since), new.id, retired)


@dataclass(frozen=True, slots=True)
class Rotation:
    ring: KeyRing
    added: str
    retired: tuple[str, ...]


def new_ring(secret: bytes, now: str, signing_since: str | None = None) -> KeyRing:
    return KeyRing((RingKey(secret, now),), signing_since or now)


def _b64(value: str, where: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RingError(f"{where}: not base64 ({exc})") from None


def _json(data: Mapping[str, str], name: str, where: str) -> Any:
    text = _b64(data[name], f"{where} data.{name}")
    try:
        return json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RingError(f"{where} data.{name}: not JSON ({exc})") from None


def _key(entry: object, where: str) -> RingKey:
    if not isinstance(entry, dict):
        raise RingError(f"{where}: expected an object with `secret` and `created`")
    secret = entry.get("secret")
    created = entry.get("created")
    if not isinstance(secret, str) or not isinstance(created, str):
        raise RingError(f"{where}: `secret` and `created` must be strings")
    raw = _b64(secret, f"{where}.secret")
    if len(raw) < MIN_KEY_BYTES:
        raise RingError(f"{where}.secret: {len(raw)} bytes; a key needs at least {MIN_KEY_BYTES}")
    return RingKey(raw, created)


def parse_ring(data: Mapping[str, str], where: str, legacy_since: str = "") -> KeyRing | None:
    """The ring in a Secret's `data` (values base64, as the API returns them); None when the
    Secret holds no key yet. A Secret of the releases before the ring (`data.key` only) reads as a
    ring of that one key, signing since `legacy_since`. Raises RingError, with `where`."""
    if data.get(KEYRING_FIELD):
        doc = _json(data, KEYRING_FIELD, where)
        here = f"{where} data.{KEYRING_FIELD}"
        if not isinstance(doc, dict) or doc.get("format") != RING_FORMAT:
            raise RingError(f"{here}: expected an object with format {RING_FORMAT}")
        entries = doc.get("keys")
        since = doc.get("signingSince")
        if not isinstance(entries, list) or not entries:
            raise RingError(f"{here}: `keys` must be a non-empty list")
        if not isinstance(since, str):
            raise RingError(f"{here}: `signingSince` must be a string")
        keys = tuple(_key(e, f"{here} keys[{i}]") for i, e in enumerate(entries))
        if len({k.id for k in keys}) != len(keys):
            raise RingError(f"{here}: the same key is listed twice")
        return KeyRing(keys, since)
    if data.get(LEGACY_KEY_FIELD):
        raw = _b64(data[LEGACY_KEY_FIELD], f"{where} data.{LEGACY_KEY_FIELD}")
        if len(raw) < MIN_KEY_BYTES:
            raise RingError(
                f"{where} data.{LEGACY_KEY_FIELD}: {len(raw)} bytes; a key needs at least "
                f"{MIN_KEY_BYTES}"
            )
        return KeyRing((RingKey(raw, legacy_since),), legacy_since)
    return None


def ring_data(ring: KeyRing) -> dict[str, str]:
    """The Secret's `data` entry for the ring (base64, as the API takes it)."""
    doc = {
        "format": RING_FORMAT,
        "signingSince": ring.signing_since,
        "keys": [
            {"id": k.id, "created": k.created, "secret": base64.b64encode(k.secret).decode()}
            for k in ring.keys
        ],
    }
    return {KEYRING_FIELD: _encode(doc)}


def _encode(doc: object) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return base64.b64encode(text.encode()).decode()


# -- adoption records ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Adoption:
    """An administrator's statement, signed by a key of the ring, that pod `uid` keeps the binding
    whose gpuplace.io/* annotations have `binding` as their digest."""

    uid: str
    pod: str  # namespace/name, for people
    binding: str
    adopted: str  # RFC 3339, UTC
    key_id: str
    mac: str

    def _text(self) -> bytes:
        return "\n".join(
            ("adopt", self.key_id, self.uid, self.pod, self.binding, self.adopted)
        ).encode()

    def verifies(self, ring: KeyRing) -> bool:
        key = ring.get(self.key_id)
        if key is None:
            return False
        expected = hmac.new(key.secret, self._text(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(self.mac, expected)

    def signed(self, ring: KeyRing) -> Adoption:
        """The same record signed with the ring's signing key."""
        unsigned = Adoption(self.uid, self.pod, self.binding, self.adopted, ring.signer.id, "")
        mac = hmac.new(ring.signer.secret, unsigned._text(), hashlib.sha256).hexdigest()
        return Adoption(self.uid, self.pod, self.binding, self.adopted, ring.signer.id, mac)


def adoption(
    ring: KeyRing, uid: str, pod: str, annotations: Mapping[str, str], now: str
) -> Adoption:
    return Adoption(uid, pod, binding_digest(annotations), now, "", "").signed(ring)


def parse_adoptions(data: Mapping[str, str], where: str) -> tuple[Adoption, ...]:
    if not data.get(ADOPTIONS_FIELD):
        return ()
    doc = _json(data, ADOPTIONS_FIELD, where)
    here = f"{where} data.{ADOPTIONS_FIELD}"
    pods = doc.get("pods") if isinstance(doc, dict) else None
    if not isinstance(pods, list):
        raise RingError(f"{here}: expected an object with a `pods` list")
    out = []
    names = ("uid", "pod", "binding", "adopted", "key", "mac")
    for i, entry in enumerate(pods):
        values = [entry.get(n) if isinstance(entry, dict) else None for n in names]
        if not all(isinstance(v, str) and v for v in values):
            raise RingError(f"{here} pods[{i}]: needs the strings {', '.join(names)}")
        out.append(Adoption(*(str(v) for v in values)))
    return tuple(out)


def adoptions_data(records: Iterable[Adoption]) -> dict[str, str]:
    pods = [
        {
            "uid": a.uid,
            "pod": a.pod,
            "binding": a.binding,
            "adopted": a.adopted,
            "key": a.key_id,
            "mac": a.mac,
        }
        for a in sorted(records, key=lambda a: (a.pod, a.uid))
    ]
    return {ADOPTIONS_FIELD: _encode({"format": RING_FORMAT, "pods": pods})}


# -- what a bound pod's annotations prove ------------------------------------------------------


class Trust(StrEnum):
    VERIFIED = "Verified"
    ADOPTED = "Adopted"
    PRESIGNING = "PreSigning"
    UNVERIFIABLE = "Unverifiable"
    FORGED = "Forged"
    NONE = "None"  # no gpuplace.io/* annotations: not a gpuplace binding at all

    @property
    def holds(self) -> bool:
        """Whether the pod's binding counts in the slot cache."""
        return self not in (Trust.FORGED, Trust.NONE)


@dataclass(frozen=True, slots=True)
class Verdict:
    trust: Trust
    key_id: str = ""  # the key the signature names (v2), or the ring key a v1 signature verified
    signature_version: str = ""

    def why(self, pod: str) -> str:
        """The verdict for people: what the pod holds and, when it is not verified, what to do."""
        key = f"key {self.key_id}" if self.key_id else "the key of the release before the key ring"
        match self.trust:
            case Trust.UNVERIFIABLE:
                return (
                    f"pod {pod} is bound with a signature of {key}, which the binding key ring no "
                    "longer holds (the key was lost or replaced): its GPUs stay blocked for every "
                    "other pod; run `gpuplace key adopt` to re-adopt it, or delete the pod"
                )
            case Trust.FORGED:
                return (
                    f"the gpuplace.io/* annotations of pod {pod} were not written by the gpuplace "
                    "binder (signature missing or wrong): the pod holds no GPU and no slot"
                )
            case _:
                return f"pod {pod}: binding {self.trust.value.lower()}"


@dataclass(frozen=True, slots=True)
class TrustView:
    """The ring and adoption records as one immutable value; swapped whole when the Secret
    changes. `version` identifies it (the Secret's resourceVersion) for caches of verdicts."""

    ring: KeyRing
    adoptions: Mapping[str, Adoption] = field(default_factory=dict)  # by pod uid
    version: str = ""

    @classmethod
    def of(cls, ring: KeyRing, adoptions: Iterable[Adoption] = (), version: str = "") -> TrustView:
        return cls(ring, {a.uid: a for a in adoptions}, version)

    def judge(
        self, uid: str, namespace: str, created: str, annotations: Mapping[str, str]
    ) -> Verdict:
        if not has_binding_annotations(annotations):
            return Verdict(Trust.NONE)
        signature = signature_of(annotations)
        if signature is None:
            if (
                SIGNATURE_ANNOTATION not in annotations
                and created
                and created < self.ring.signing_since
            ):
                return Verdict(Trust.PRESIGNING)
            return Verdict(Trust.FORGED)
        if signature.version == SIGNATURE_V1:
            for key in self.ring.keys:
                if verify_signature(key.secret, signature, uid, namespace, annotations):
                    return Verdict(Trust.VERIFIED, key.id, SIGNATURE_V1)
        else:
            named = self.ring.get(signature.key_id)
            if named is not None:
                ok = verify_signature(named.secret, signature, uid, namespace, annotations)
                return Verdict(Trust.VERIFIED if ok else Trust.FORGED, named.id, signature.version)
        record = self.adoptions.get(uid)
        if (
            record is not None
            and record.binding == binding_digest(annotations)
            and record.verifies(self.ring)
        ):
            return Verdict(Trust.ADOPTED, signature.key_id, signature.version)
        return Verdict(Trust.UNVERIFIABLE, signature.key_id, signature.version)
