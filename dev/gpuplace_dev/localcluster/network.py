"""The real node's pod network in both directions, as on any cluster, with nothing leaving this
machine: what an installed chart needs (`LocalCluster(pod_network=True)`).

- Pods -> apiserver: pods use the in-cluster configuration, `https://<kubernetes Service IP>:443`
  (KUBERNETES_SERVICE_HOST, set by the kubelet). Their only route besides the pod subnet is the
  Service range, through the bridge's address (CNI: `isGateway`, one route, no default route, no
  masquerading). On the host, one DNAT rule turns the `kubernetes` Service into the apiserver's
  loopback port, the job kube-proxy does on a cluster: nat PREROUTING for pods on the bridge, nat
  OUTPUT for host-network pods. The bridge accepts loopback destinations (`route_localnet`), so
  the apiserver keeps listening on 127.0.0.1 only.
- Apiserver -> webhook: the apiserver resolves a webhook Service to its endpoints
  (`--enable-aggregator-routing`) and dials the pod's address on the bridge, which the host owns.
- Host -> pods as a tenant: the bridge holds more addresses of the pod subnet, ones no pod gets
  (`realnode.TENANT_ADDRESSES`). A test's client bound to one reaches a pod as another pod
  would, from an address of its own, not the apiserver's (the gateway's).

Nothing is forwarded off the machine: `ip_forward` is left as it is, the pods have no default
route, and no rule masquerades. Every rule carries the comment `gpuplace-local` and is recorded in
the node's directory; `remove` (run by `cluster down`) deletes them, restores the sysctl and
leaves `leftovers` empty.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

COMMENT = "gpuplace-local"
KUBELET_CHAINS = ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-FIREWALL")


class NetworkError(RuntimeError):
    pass


@dataclass(frozen=True)
class Routing:
    """What `install` changed, as recorded for `remove`."""

    bridge: str
    gateway: str  # the bridge's address, CIDR form
    rules: tuple[tuple[str, ...], ...]  # iptables arguments after the table, with -A
    route_localnet_before: str


ENSURE_APT = Path(__file__).resolve().parents[3] / "hack" / "ensure-apt.sh"


def iptables() -> str:
    found = shutil.which("iptables")
    if found is None and ENSURE_APT.is_file():
        subprocess.run([str(ENSURE_APT), "iptables"], check=False, timeout=600)
        found = shutil.which("iptables")
    if found is None:
        raise NetworkError(
            "iptables not found: the pod network of an installed chart needs it "
            "(Debian/Ubuntu: apt-get install iptables; `make node` installs it as root)"
        )
    return found


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


def _sysctl_path(bridge: str) -> Path:
    return Path(f"/proc/sys/net/ipv4/conf/{bridge}/route_localnet")


def service_rules(service_ip: str, apiserver_port: int, bridge: str) -> tuple[tuple[str, ...], ...]:
    to = f"127.0.0.1:{apiserver_port}"
    common = ("-d", f"{service_ip}/32", "-p", "tcp", "--dport", "443")
    tag = ("-m", "comment", "--comment", COMMENT)
    return (
        ("-A", "PREROUTING", "-i", bridge, *common, *tag, "-j", "DNAT", "--to-destination", to),
        ("-A", "OUTPUT", *common, *tag, "-j", "DNAT", "--to-destination", to),
    )


def install(
    record: Path,
    *,
    bridge: str,
    gateway: str,
    tenants: tuple[str, ...],
    service_ip: str,
    apiserver_port: int,
) -> Routing:
    """Creates the bridge with its addresses, `gateway` and `tenants` (before the kubelet's first
    pod, so the sysctl can be set on it), sets `route_localnet` there and adds the DNAT rules;
    records all of it first (the addresses go with the bridge, which the node deletes)."""
    binary = iptables()
    if not Path(f"/sys/class/net/{bridge}").exists():
        _run("ip", "link", "add", bridge, "type", "bridge")
    _run("ip", "addr", "replace", gateway, "dev", bridge)
    for tenant in tenants:
        _run("ip", "addr", "replace", f"{tenant}/32", "dev", bridge)
    _run("ip", "link", "set", bridge, "up")
    sysctl = _sysctl_path(bridge)
    routing = Routing(
        bridge,
        gateway,
        service_rules(service_ip, apiserver_port, bridge),
        sysctl.read_text().strip(),
    )
    record.write_text(json.dumps(asdict(routing)))
    sysctl.write_text("1\n")
    for rule in routing.rules:
        _run(binary, "-w", "-t", "nat", *rule)
    return routing


def remove(record: Path) -> list[str]:
    """Undoes what `install` recorded, and the chains the kubelet adds when iptables exists;
    returns what could not be removed."""
    problems: list[str] = []
    if record.is_file():
        data = json.loads(record.read_text())
        routing = Routing(
            data["bridge"],
            data["gateway"],
            tuple(tuple(r) for r in data["rules"]),
            data["route_localnet_before"],
        )
        binary = shutil.which("iptables")
        for rule in routing.rules:
            if binary is None:
                problems.append("iptables not found: rules left in place")
                break
            deleted = ("-D", *rule[1:])
            result = _run(binary, "-w", "-t", "nat", *deleted, check=False)
            if result.returncode != 0 and "does a matching rule exist" not in result.stderr:
                problems.append(f"iptables -t nat {' '.join(deleted)}: {result.stderr.strip()}")
        sysctl = _sysctl_path(routing.bridge)
        if sysctl.exists():
            sysctl.write_text(routing.route_localnet_before + "\n")
        record.unlink()
    problems += _remove_kubelet_chains()
    return problems


TABLES = ("mangle", "nat", "filter")


def _listings() -> dict[str, list[str]]:
    """`iptables -S` of each table (none when iptables is not installed)."""
    binary = shutil.which("iptables")
    if binary is None:
        return {}
    return {t: _run(binary, "-w", "-t", t, "-S", check=False).stdout.splitlines() for t in TABLES}


def _remove_kubelet_chains() -> list[str]:
    """The kubelet creates canary chains in every table when it finds iptables: not ours, but
    the node's, so they go with it."""
    problems = []
    for table, listed in _listings().items():
        for chain in KUBELET_CHAINS:
            if f"-N {chain}" not in listed:
                continue
            for line in listed:
                if line.startswith("-A ") and f"-j {chain}" in line:
                    _run("iptables", "-w", "-t", table, "-D", *line.split()[1:], check=False)
            _run("iptables", "-w", "-t", table, "-F", chain, check=False)
            result = _run("iptables", "-w", "-t", table, "-X", chain, check=False)
            if result.returncode != 0:
                problems.append(f"iptables -t {table} -X {chain}: {result.stderr.strip()}")
    return problems


def leftovers() -> list[str]:
    """Rules of this module, and the kubelet's chains, still in place (none after `remove`)."""
    return [
        f"{table}: {line}"
        for table, lines in _listings().items()
        for line in lines
        if COMMENT in line or any(line == f"-N {c}" for c in KUBELET_CHAINS)
    ]
