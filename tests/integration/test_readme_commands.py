"""Every shell command the READMEs and the user guide show works as written.

The commands are read out of the ```sh blocks of README.md, examples/README.md and the user guide's
pages under docs/ (`GUIDE`: what moved out of the README; the generated references, the
architecture, the local cluster and the performance pages are not run), and out of
inline code that starts with `gpuplace`, `make`, `helm`, `kubectl` or `--set`. Each is checked in
one of these ways (a command no rule covers fails the test, so a new one gets a check):

- run verbatim by bash, with `gpuplace` (this checkout's), `kubectl` (the pinned one) and `helm`
  on PATH and KUBECONFIG naming the local cluster:
  - in the checkout: `gpuplace validate examples/gitops`, the namespaces and the `gpuplace render
    ... | kubectl apply -f -` pipeline, `kubectl apply -f examples/workloads/` (what they
    create is deleted afterwards);
  - in a GitOps repository made from examples/gitops (commits on `main`, a remote-tracking
    `origin/main` one change behind, as in a pull request): `gpuplace validate clusters/`, both
    `gpuplace diff` forms;
- `helm install ...`: verbatim plus `--dry-run=server --take-ownership` (a real install would
  register webhooks with failurePolicy Fail for every test after this one, and the namespaces
  other tests created carry no helm annotations), and what it renders through `kubectl apply
  --dry-run=server`, so the apiserver judges every object; `--set KEY=VALUE` switches shown inline:
  `helm template` of the chart with that switch, so its values.schema.json judges the key;
- the uninstall commands (what removes what `helm uninstall` keeps): run verbatim by
  test_chart_keyring.py, after a real install and uninstall on a cluster of its own;
- `make <target>`: the target exists in the Makefile. `make test` would run this test again, and
  `make demo` is what tests/e2e runs; neither is run here;
- inline `gpuplace <command> [--flags]`: the command exists and `--help` lists every flag shown.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import git
import pytest

from gpuplace_dev.localcluster import LocalCluster
from tests.chartkit import helm
from tests.integration import shellkit
from tests.integration.shellkit import UNINSTALL, sh

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: The user guide's pages, whose commands a user copies.
GUIDE = (
    "tutorial",
    "reviewing",
    "placementmap",
    "install",
    "trust",
    "enforcement",
    "observability",
    "migrating",
    "troubleshooting",
)
DOCS = ("README.md", "examples/README.md", *(f"docs/{page}.md" for page in GUIDE))
CHART = REPO / "charts" / "gpuplace"

IN_CHECKOUT = {
    "gpuplace validate examples/gitops",
    "kubectl apply -f examples/gitops/clusters/dev/namespaces.yaml",
    "gpuplace render examples/gitops/clusters/dev | kubectl apply -f -",
    "kubectl apply -f examples/workloads/",
}
IN_GITOPS_REPO = {
    "gpuplace validate clusters/",
    "gpuplace diff origin/main HEAD --repo . --path clusters/prod",
    "gpuplace diff origin/main --path clusters/dev",
}
HELM_INSTALL = (
    "helm install gpuplace charts/gpuplace --namespace gpuplace-system --create-namespace"
)
MAKE_TARGETS = {"make demo", "make test"}


def fenced_commands(text: str) -> list[str]:
    """The command lines of ```sh / ```bash blocks, without trailing comments."""
    out: list[str] = []
    for block in re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#"):
                out.append(command)
    return out


def inline_commands(text: str) -> list[str]:
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    return [s for s in spans if re.match(r"(gpuplace|make|helm|kubectl) |--set ", s)]


def documented() -> tuple[list[str], list[str]]:
    fenced: list[str] = []
    inline: list[str] = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        fenced += fenced_commands(text)
        inline += inline_commands(text)
    return fenced, inline


def test_every_fenced_command_has_a_check() -> None:
    fenced, _ = documented()
    known = IN_CHECKOUT | IN_GITOPS_REPO | MAKE_TARGETS | {HELM_INSTALL} | set(UNINSTALL)
    assert set(fenced) == known, "commands in the docs without a check (or checks for none)"


@pytest.fixture(scope="module")
def shell_env(cluster: LocalCluster) -> dict[str, str]:
    return shellkit.shell_env(cluster)


@pytest.fixture
def gitops_repo(tmp_path: Path) -> Iterator[Path]:
    """examples/gitops as its own repository; origin/main is one reviewed change behind HEAD."""
    root = tmp_path / "gitops"
    shutil.copytree(REPO / "examples" / "gitops", root)
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as config:
        config.set_value("user", "name", "gpuplace test")
        config.set_value("user", "email", "test@gpuplace.invalid")
    repo.git.add(A=True)
    base = repo.index.commit("maps as merged")
    repo.git.update_ref("refs/remotes/origin/main", base.hexsha)
    for cluster_dir in ("dev", "prod"):
        maps = sorted((root / "clusters" / cluster_dir / "maps").glob("*.yaml"))
        text = maps[0].read_text()
        maps[0].write_text(text.replace("devices: [0, 1]", "devices: [1, 0]", 1))
    repo.git.add(A=True)
    repo.index.commit("a change under review")
    yield root
    repo.close()


def test_commands_run_in_the_checkout(cluster: LocalCluster, shell_env: dict[str, str]) -> None:
    ordered = [c for c in documented()[0] if c in IN_CHECKOUT]
    assert len(ordered) == len(IN_CHECKOUT)
    try:
        outputs = {command: sh(command, REPO, shell_env) for command in ordered}
    finally:
        cleanup = [
            "kubectl delete -f examples/workloads/ --ignore-not-found --wait=false",
            "gpuplace render examples/gitops/clusters/dev | kubectl delete --ignore-not-found -f -",
            "kubectl delete -f examples/gitops/clusters/dev/namespaces.yaml --ignore-not-found "
            "--wait=false",
        ]
        for command in cleanup:
            subprocess.run(["bash", "-c", command], cwd=REPO, env=shell_env, check=False)
    assert outputs["gpuplace validate examples/gitops"].stdout.startswith("OK: ")
    applied = outputs["gpuplace render examples/gitops/clusters/dev | kubectl apply -f -"].stdout
    assert "configmap/webhook-test created" in applied
    assert "pod/webhook-test-0 created" in outputs["kubectl apply -f examples/workloads/"].stdout


def test_commands_run_in_a_gitops_repository(gitops_repo: Path, shell_env: dict[str, str]) -> None:
    for command in sorted(IN_GITOPS_REPO):
        result = sh(command, gitops_repo, shell_env)
        if " diff " in f" {command} ":
            assert result.stdout.strip(), f"{command!r} printed no plan"
    validate = sh("gpuplace validate clusters/", gitops_repo, shell_env)
    assert validate.stdout.startswith("OK: ")


def test_helm_install_as_shown_renders_objects_the_apiserver_accepts(
    cluster: LocalCluster, shell_env: dict[str, str]
) -> None:
    # As in a session where other tests ran: the namespaces exist, without helm's annotations
    # (hence --take-ownership). They must exist anyway for the server dry run below, which
    # creates nothing.
    for namespace in ("gpuplace-system", "gpuplace-inventory"):
        cluster.create_namespace(namespace)
    result = sh(f"{HELM_INSTALL} --dry-run=server --take-ownership", REPO, shell_env)
    assert "kind: Deployment" in result.stdout
    # What it would install, each object judged by the apiserver.
    template = HELM_INSTALL.replace("helm install", "helm template").replace(
        " --create-namespace", ""
    )
    applied = sh(f"{template} | kubectl apply --dry-run=server -f -", REPO, shell_env)
    assert "deployment.apps/gpuplace-controller created (server dry run)" in applied.stdout


def test_inline_helm_switches_are_keys_of_the_chart() -> None:
    switches = [s for s in documented()[1] if s.startswith("--set ")]
    assert switches, "docs/install.md shows the cert-manager switch"
    for switch in switches:
        out = helm("template", "gpuplace", str(CHART), *switch.split()).stdout
        if "certManager" in switch:
            assert "cert-manager.io/inject-ca-from" in out


def test_make_targets_exist() -> None:
    makefile = (REPO / "Makefile").read_text()
    _, inline = documented()
    targets = {c.split()[1] for c in MAKE_TARGETS | {s for s in inline if s.startswith("make ")}}
    for target in targets:
        assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), target


def test_inline_gpuplace_commands_and_flags_exist() -> None:
    _, inline = documented()
    commands = [s.split() for s in inline if s.startswith("gpuplace ")]
    assert commands
    flags: dict[str, set[str]] = {}
    for words in commands:
        shown = {w.strip("[]|") for w in words[2:]}
        flags.setdefault(words[1], set()).update(f for f in shown if f.startswith("--"))
    for command, wanted in sorted(flags.items()):  # one --help per command: each costs an import
        result = subprocess.run(
            [sys.executable, "-m", "gpuplace", command, "--help"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"gpuplace {command}: {result.stderr}"
        for flag in sorted(wanted):
            assert flag in result.stdout, f"gpuplace {command}: {flag} is not an option"
