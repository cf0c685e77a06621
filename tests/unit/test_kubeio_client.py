"""The JSON client authenticates the way the kubeconfig says (token or client certificate)."""

from __future__ import annotations

from pathlib import Path

import yaml

from kubeio.client import ClientSettings, Kube


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
