"""The JSON client authenticates the way the kubeconfig says (token or client certificate)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kubeio.client import ClientSettings, Kube, json_lines


def write_kubeconfig(path: Path, user: dict[str, str]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {
                        "name": "k",
                        "cluster": {
                            "server": "https://127.0.0.1:6443",
                            "insecure-skip-tls-verify": True,
                        },
                    }
                ],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    return path


def test_bearer_token_from_kubeconfig_is_sent(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", {"token": "s3cret"})
    kube = Kube.connect(ClientSettings(kubeconfig=str(config)))
    assert kube._headers(None)["Authorization"] == "Bearer s3cret"
    assert kube.host == "https://127.0.0.1:6443"


def test_no_token_no_authorization_header(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", {"username": "a", "password": "b"})
    kube = Kube.connect(ClientSettings(kubeconfig=str(config)))
    assert kube._headers("application/json")["Content-Type"] == "application/json"
    assert "Bearer" not in kube._headers(None).get("Authorization", "")


def test_json_lines_reassembles_events_across_any_chunking() -> None:
    events = [{"type": "ADDED", "object": {"metadata": {"name": f"p{i}"}}} for i in range(5)]
    stream = b"".join(json.dumps(e).encode() + b"\n" for e in events) + b"\n"
    for size in (1, 7, 64, len(stream)):
        chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert list(json_lines(chunks)) == events, size


def test_json_lines_drops_an_unfinished_last_event() -> None:
    chunks = [b'{"type": "ADDED"}\n{"type": "MOD', b"IFIED", b'"}\n{"type": "DEL']
    assert list(json_lines(chunks)) == [{"type": "ADDED"}, {"type": "MODIFIED"}]
