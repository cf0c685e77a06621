"""The real node's pod network (gpuplace_dev.localcluster.network): what it adds while the cluster runs,
that nothing routes pod traffic off the machine, and that stopping the cluster removes all of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuplace_dev.localcluster import LocalCluster, network
from gpuplace_dev.localcluster.cluster import KUBERNETES_SERVICE_IP, SERVICE_CIDR
from gpuplace_dev.localcluster.realnode import BRIDGE, POD_GATEWAY


def nat_rules() -> list[str]:
    out = subprocess.run(
        ["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.splitlines() if network.COMMENT in line]


def test_the_pod_network_is_removed_with_the_cluster(tmp_path: Path) -> None:
    route_localnet = Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet")
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    cluster = LocalCluster(tmp_path / "net", real_nodes=1, pod_network=True, policies=False)
    try:
        cluster.start()
        port = cluster.server.rsplit(":", 1)[1]
        rules = nat_rules()
        assert len(rules) == 2, rules
        assert all(f"--to-destination 127.0.0.1:{port}" in r for r in rules)
        assert all(f"-d {KUBERNETES_SERVICE_IP}/32" in r and "--dport 443" in r for r in rules)
        assert not [r for r in rules if "MASQUERADE" in r or "SNAT" in r]
        assert route_localnet.read_text().strip() == "1"
        addresses = subprocess.run(
            ["ip", "-4", "addr", "show", BRIDGE], capture_output=True, text=True, check=True
        ).stdout
        assert POD_GATEWAY in addresses
        # Pods get one route besides their subnet, the Service range; no default route.
        conf = (cluster.real_node.layout.cni_conf_dir / "10-gpuplace.conflist").read_text()
        assert f'"dst": "{SERVICE_CIDR}"' in conf and "0.0.0.0/0" not in conf
        assert '"isDefaultGateway": false' in conf and '"ipMasq": false' in conf
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forwarding
    finally:
        cluster.stop()
    assert nat_rules() == []
    assert network.leftovers() == []
    assert not Path(f"/sys/class/net/{BRIDGE}").exists()
    assert not (tmp_path / "net" / "node" / "network.json").exists()
