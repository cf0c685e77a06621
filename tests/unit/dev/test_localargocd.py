"""Reading ArgoCD Applications and pointing argocd/ at the demo's repository (no ArgoCD needed)."""

from __future__ import annotations

from typing import Any

from gpuplace_dev.demo.argocd import applicationset, argocd_settings, project
from gpuplace_dev.localargocd.apps import AppState
from gpuplace_dev.localargocd.binaries import ArgoCDBinaries, argocd_version


def application(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "gpuplace-maps-dev", "namespace": "argocd"}, "status": status}


FAILED_RETRYING = application(
    sync={"status": "OutOfSync", "revision": "d32cc4319eb4aa"},
    health={"status": "Healthy"},
    operationState={
        "phase": "Running",
        "message": "one or more objects failed to apply, reason: admission webhook denied the "
        "request: placement.yaml:15:20: error. Retrying attempt #1 at 1:42AM.",
        "syncResult": {
            "revision": "d32cc4319eb4aa",
            "resources": [
                {"kind": "Namespace", "namespace": "", "name": "inference", "status": "Synced"},
                {"kind": "ConfigMap", "namespace": "inference", "name": "llm-serving",
                 "status": "SyncFailed", "message": "denied: placement.yaml:15:20"},
            ],
        },
    },
    resources=[
        {"kind": "ConfigMap", "namespace": "inference", "name": "llm-serving", "status": "OutOfSync",
         "health": {"status": "Healthy"}},
        {"kind": "Namespace", "name": "inference", "status": "Synced"},
    ],
)  # fmt: skip


def test_a_failed_attempt_that_argocd_will_retry_counts_as_failed_and_ended() -> None:
    state = AppState.from_object(FAILED_RETRYING)
    assert state.attempt_failed and state.attempt_ended
    assert state.operation_revision == "d32cc4319eb4aa"
    assert state.resource_health("ConfigMap", "inference/llm-serving") == "Healthy"
    assert state.resource_sync("ConfigMap", "inference/llm-serving") == "OutOfSync"
    assert state.resource_health("Namespace", "inference") == ""
    assert state.line() == (
        "Application gpuplace-maps-dev: sync OutOfSync @ d32cc43, health Healthy, "
        "last sync Failed, retrying @ d32cc43"
    )
    assert "placement.yaml:15:20" in state.describe()
    assert state.unsynced == ("ConfigMap inference/llm-serving: denied: placement.yaml:15:20",)


def test_an_operation_still_applying_has_not_ended() -> None:
    state = AppState.from_object(application(operationState={"phase": "Running", "message": ""}))
    assert not state.attempt_ended and not state.attempt_failed
    done = AppState.from_object(application(operationState={"phase": "Succeeded"}))
    assert done.attempt_ended and not done.attempt_failed


def test_an_application_without_status_reads_as_empty() -> None:
    state = AppState.from_object({"metadata": {"name": "x"}})
    assert (state.sync, state.health, state.operation, state.resources) == ("", "", "", ())
    assert state.line() == "Application x: sync - @ -, health -"


def test_the_applicationset_is_pointed_at_the_repository_and_skips_unregistered_clusters() -> None:
    url = "file:///tmp/repo"
    appset = applicationset(url, "clusters", skip=("prod",))
    git = appset["spec"]["generators"][0]["git"]
    assert git["repoURL"] == url
    assert git["directories"] == [
        {"path": "clusters/*"},
        {"path": "clusters/prod", "exclude": True},
    ]
    template = appset["spec"]["template"]["spec"]
    assert template["source"]["repoURL"] == url
    # Everything else is argocd/ as shipped: the retry that picks up fixes, the ignored status.
    assert template["syncPolicy"]["retry"]["refresh"] is True
    assert template["destination"] == {"name": "{{ .path.basename }}"}
    assert project(url)["spec"]["sourceRepos"] == [url]


def test_argocd_settings_carry_the_lua_health_check() -> None:
    settings = argocd_settings()
    assert settings["resource.customizations.useOpenLibs.ConfigMap"] == "true"
    assert "gpuplace.io/status" in settings["resource.customizations.health.ConfigMap"]


def test_the_pinned_release_names_its_cache_directory(tmp_path: Any) -> None:
    version = argocd_version()
    assert version.startswith("v3.")
    binaries = ArgoCDBinaries(tmp_path / f"argocd-{version}", version)
    assert not binaries.complete()
    assert binaries.component("argocd-repo-server") == binaries.bin_dir / "argocd-repo-server"
