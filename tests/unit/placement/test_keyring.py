"""The binding key ring: its Secret format, rotation, adoption records, and what a bound pod's
signature proves (placement/keyring.py's table, one test a row)."""

from __future__ import annotations

import base64
import json

import pytest

from placement.annotations import (
    SIGNATURE_ANNOTATION,
    BindingDecision,
    encode_binding,
    signed_binding,
)
from placement.keyring import (
    ADOPTIONS_FIELD,
    KEYRING_FIELD,
    LEGACY_KEY_FIELD,
    KeyRing,
    RingError,
    RingKey,
    Trust,
    TrustView,
    adoption,
    adoptions_data,
    key_id,
    new_ring,
    parse_adoptions,
    parse_ring,
    ring_data,
)
from tests.unit.placement.test_signature import DECISION, sign_v1

OLD = b"o" * 32
NEW = b"n" * 32
LOST = b"l" * 32
T0 = "2026-01-01T00:00:00Z"
WHERE = "Secret gpuplace-system/gpuplace-binding-key"


def ring(*secrets: bytes, since: str = T0) -> KeyRing:
    return KeyRing(tuple(RingKey(s, T0) for s in secrets), since)


def signed(
    secret: bytes, uid: str = "uid-1", decision: BindingDecision = DECISION
) -> dict[str, str]:
    return signed_binding(secret, key_id(secret), uid, "team", decision)


def judge(
    view: TrustView, annotations: dict[str, str], created: str = "2026-06-01T00:00:00Z"
) -> Trust:
    return view.judge("uid-1", "team", created, annotations).trust


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- what a signature proves --------------------------------------------------------------------


def test_a_signature_of_a_ring_key_verifies_whichever_key_signs_now() -> None:
    view = TrustView.of(ring(OLD, NEW))
    assert judge(view, signed(OLD)) is Trust.VERIFIED
    assert judge(view, signed(NEW)) is Trust.VERIFIED
    assert view.judge("uid-1", "team", "", signed(OLD)).key_id == key_id(OLD)


def test_a_signature_naming_a_ring_key_that_does_not_verify_is_a_forgery() -> None:
    view = TrustView.of(ring(OLD))
    forged = signed(OLD, uid="uid-2")  # copied from another pod
    assert judge(view, forged) is Trust.FORGED
    rewritten = {**signed(OLD), "gpuplace.io/devices": "GPU-other"}
    assert judge(view, rewritten) is Trust.FORGED
    assert not Trust.FORGED.holds


def test_a_signature_naming_a_key_the_ring_lost_fails_closed() -> None:
    view = TrustView.of(ring(NEW))
    verdict = view.judge("uid-1", "team", T0, signed(LOST))
    assert verdict.trust is Trust.UNVERIFIABLE and verdict.trust.holds
    assert verdict.key_id == key_id(LOST)
    why = verdict.why("team/web-0")
    assert f"key {key_id(LOST)}" in why and "gpuplace key adopt" in why


def test_v1_signatures_verify_under_any_ring_key_and_otherwise_fail_closed() -> None:
    v1 = sign_v1(OLD, "uid-1", "team")
    assert judge(TrustView.of(ring(OLD, NEW)), v1) is Trust.VERIFIED
    # A v1 signature names no key: one that verifies under none may be the lost key's.
    assert judge(TrustView.of(ring(NEW)), v1) is Trust.UNVERIFIABLE


def test_unsigned_bindings_hold_only_on_pods_older_than_signing() -> None:
    view = TrustView.of(ring(NEW, since="2026-03-01T00:00:00Z"))
    unsigned = encode_binding(DECISION)
    assert judge(view, unsigned, created="2026-02-01T00:00:00Z") is Trust.PRESIGNING
    assert judge(view, unsigned, created="2026-04-01T00:00:00Z") is Trust.FORGED
    assert judge(view, unsigned, created="") is Trust.FORGED
    malformed = {**unsigned, SIGNATURE_ANNOTATION: "garbage"}
    assert judge(view, malformed, created="2026-02-01T00:00:00Z") is Trust.FORGED


def test_a_pod_without_gpuplace_annotations_is_no_binding() -> None:
    assert judge(TrustView.of(ring(NEW)), {"team/owner": "me"}) is Trust.NONE


# -- adoption -----------------------------------------------------------------------------------


def test_an_adoption_record_makes_a_lost_keys_binding_held_as_adopted() -> None:
    keys = ring(NEW)
    lost = signed(LOST)
    record = adoption(keys, "uid-1", "team/web-0", lost, T0)
    assert record.key_id == key_id(NEW) and record.verifies(keys)
    view = TrustView.of(keys, [record])
    assert judge(view, lost) is Trust.ADOPTED
    # The record covers exactly that binding and that pod.
    assert view.judge("uid-2", "team", T0, signed(LOST, uid="uid-2")).trust is Trust.UNVERIFIABLE
    other = signed(LOST, decision=BindingDecision(**{**_fields(DECISION), "index": 9}))
    assert judge(view, other) is Trust.UNVERIFIABLE


def test_an_adoption_record_not_signed_by_the_ring_adopts_nothing() -> None:
    lost = signed(LOST)
    forged = adoption(ring(LOST), "uid-1", "team/web-0", lost, T0)  # signed by another key
    assert judge(TrustView.of(ring(NEW), [forged]), lost) is Trust.UNVERIFIABLE
    tampered = adoption(ring(NEW), "uid-1", "team/web-0", lost, T0)
    tampered = type(tampered)(
        tampered.uid,
        "team/other",
        tampered.binding,
        tampered.adopted,
        tampered.key_id,
        tampered.mac,
    )
    assert not tampered.verifies(ring(NEW))


def test_adoption_records_round_trip_and_survive_re_signing() -> None:
    records = [adoption(ring(OLD), "uid-1", "team/web-0", signed(LOST), T0)]
    data = adoptions_data(records)
    assert parse_adoptions(data, WHERE) == tuple(records)
    rotated = ring(OLD).rotated(NEW, T0, ()).ring
    resigned = records[0].signed(rotated)
    assert resigned.key_id == key_id(NEW) and resigned.verifies(rotated)


def _fields(decision: BindingDecision) -> dict[str, object]:
    return {
        "map": decision.map,
        "index": decision.index,
        "node": decision.node,
        "devices": decision.devices,
        "cuda_visible_devices": decision.cuda_visible_devices,
        "model_generation": decision.model_generation,
    }


# -- rotation -----------------------------------------------------------------------------------


def test_rotation_signs_with_the_new_key_and_retires_only_unused_keys() -> None:
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    rotation = ring(a, b, c).rotated(NEW, "2026-07-01T00:00:00Z", in_use=[key_id(a)])
    assert rotation.ring.signer.id == key_id(NEW) == rotation.added
    # a: a bound pod uses it; c: signed until now (a Binding may be in flight); b: retired.
    assert rotation.ring.ids == (key_id(a), key_id(c), key_id(NEW))
    assert rotation.retired == (key_id(b),)
    assert rotation.ring.signing_since == T0
    with pytest.raises(ValueError, match="already in the ring"):
        rotation.ring.rotated(NEW, T0, ())


def test_every_pod_a_rotation_keeps_verified_stays_verified() -> None:
    before = ring(OLD)
    pods = [signed(OLD)]
    after = before.rotated(NEW, T0, [key_id(OLD)]).ring
    assert all(judge(TrustView.of(after), p) is Trust.VERIFIED for p in pods)
    assert judge(TrustView.of(after), signed(NEW)) is Trust.VERIFIED


# -- the Secret's format ------------------------------------------------------------------------


def test_the_ring_round_trips_through_the_secret_data() -> None:
    keys = ring(OLD, NEW, since="2026-02-02T00:00:00Z")
    assert parse_ring(ring_data(keys), WHERE) == keys
    assert parse_ring({}, WHERE) is None


def test_a_secret_of_the_releases_before_the_ring_reads_as_a_ring_of_its_key() -> None:
    data = {LEGACY_KEY_FIELD: base64.b64encode(OLD).decode()}
    keys = parse_ring(data, WHERE, legacy_since="2025-12-01T00:00:00Z")
    assert keys is not None and keys.ids == (key_id(OLD),)
    assert keys.signing_since == "2025-12-01T00:00:00Z"


def test_key_ids_come_from_the_keys_so_a_changed_key_is_a_new_id() -> None:
    doc = json.loads(base64.b64decode(ring_data(ring(OLD))[KEYRING_FIELD]))
    doc["keys"][0]["secret"] = base64.b64encode(LOST).decode()  # bytes replaced, id left as it was
    keys = parse_ring({KEYRING_FIELD: b64(json.dumps(doc))}, WHERE)
    assert keys is not None and keys.ids == (key_id(LOST),)
    assert judge(TrustView.of(keys), signed(OLD)) is Trust.UNVERIFIABLE


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({KEYRING_FIELD: "%%%"}, f"{WHERE} data.keyring.json: not base64"),
        ({KEYRING_FIELD: b64("{not json")}, f"{WHERE} data.keyring.json: not JSON"),
        ({KEYRING_FIELD: b64("[]")}, "expected an object with format 1"),
        ({KEYRING_FIELD: b64('{"format": 1, "keys": [], "signingSince": ""}')}, "non-empty"),
        (
            {
                KEYRING_FIELD: b64(
                    '{"format": 1, "keys": [{"secret": "YQ==", "created": ""}], "signingSince": ""}'
                )
            },
            "keys[0].secret: 1 bytes; a key needs at least 16",
        ),
        (
            {KEYRING_FIELD: b64('{"format": 1, "keys": [{"secret": 3}], "signingSince": ""}')},
            "keys[0]: `secret` and `created` must be strings",
        ),
        ({LEGACY_KEY_FIELD: base64.b64encode(b"short").decode()}, "data.key: 5 bytes"),
        ({ADOPTIONS_FIELD: b64('{"pods": [{"uid": "x"}]}')}, "pods[0]: needs the strings"),
    ],
)
def test_an_unreadable_secret_is_refused_with_where_and_what(
    data: dict[str, str], message: str
) -> None:
    with pytest.raises(RingError) as caught:
        parse_ring(data, WHERE)
        parse_adoptions(data, WHERE)
    assert message in str(caught.value)


def test_a_duplicated_key_is_refused() -> None:
    doc = json.loads(base64.b64decode(ring_data(ring(OLD))[KEYRING_FIELD]))
    doc["keys"].append(doc["keys"][0])
    with pytest.raises(RingError, match="the same key is listed twice"):
        parse_ring({KEYRING_FIELD: b64(json.dumps(doc))}, WHERE)


def test_a_new_ring_signs_with_its_one_key() -> None:
    keys = new_ring(NEW, T0)
    assert keys.signer.id == key_id(NEW) and keys.signing_since == T0
    with pytest.raises(ValueError, match="at least one key"):
        KeyRing((), T0)
