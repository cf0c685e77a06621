"""gpuplace cluster up|down: a local control plane that stays up between commands.

'up' starts etcd, kube-apiserver, kube-controller-manager and kwok in the background, creates fake
GPU nodes, records the processes in <dir>/state.json and prints 'export KUBECONFIG=...' on stdout,
so that eval "$(gpuplace cluster up)" works. 'down' stops what that file records and removes the
directory.

With --real-node, containerd and a kubelet run on this machine too (built by hack/build-node.sh
the first time, a few minutes; then about 1.3 seconds to a Ready node): Node 'localhost', where pods
really run (image gpuplace.local/gpu-probe:dev prints the GPU environment it got). It needs root;
one real node runs per machine at a time. 'down' stops its containers and removes what it wrote.

With --chart (implies --real-node and --scheduler), gpuplace itself is installed as a platform team
installs it: the image is built from the Dockerfile (`make image`) and imported into the real node,
and `helm install` of charts/gpuplace runs the controller (2 replicas), the webhook (2) and the
agent DaemonSet as pods on 'localhost', the agent reading a fake NVML library of --real-node-gpus
GPUs through the chart's agent.nvml mount. The pods reach the apiserver through the `kubernetes`
Service and the apiserver reaches the webhook through its Service: one DNAT rule and the bridge's
address on this machine, removed by 'down'. The local copies of the chart's admission policies
are not installed (the chart owns them).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

from gpuplace.commands._args import documented_command
from gpuplace_dev.localcluster import (
    REAL_NODE_NAME,
    BinariesError,
    ClusterError,
    ClusterLayout,
    LocalCluster,
    cache_root,
    chart,
    fake_gpu_nodes,
)
from gpuplace_dev.localcluster.chart import ChartError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = documented_command(
        subparsers,
        "cluster",
        "start or stop a local control plane (etcd, kube-apiserver, controllers, kwok)",
        __doc__,
    )
    commands = parser.add_subparsers(dest="cluster_command", required=True, metavar="up|down")

    up = commands.add_parser("up", help="start a local cluster in the background")
    _add_dir(up)
    up.add_argument("--nodes", type=int, default=3, help="fake GPU nodes to create (default 3)")
    up.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    up.add_argument(
        "--node-prefix", default="gpu-node-", help="node name prefix (default gpu-node-)"
    )
    up.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NAME",
        help="namespace to create (repeatable)",
    )
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also run a real node, 'localhost' (containerd and a kubelet on this machine; root)",
    )
    up.add_argument(
        "--real-node-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="label of the real node (repeatable), e.g. gpu-node-name=node5",
    )
    up.add_argument(
        "--scheduler",
        action="store_true",
        help="also run kube-scheduler (for pods that use the default scheduler)",
    )
    up.add_argument(
        "--chart",
        action="store_true",
        help="install gpuplace's chart from the image built here, as pods on the real node",
    )
    up.add_argument(
        "--real-node-gpus",
        type=int,
        default=4,
        help="GPUs the real node's fake NVML reports with --chart (default 4)",
    )
    up.set_defaults(handler=_up)

    down = commands.add_parser("down", help="stop the local cluster and remove its directory")
    _add_dir(down)
    down.add_argument(
        "--keep-dir", action="store_true", help="keep the directory (logs, certificates)"
    )
    down.set_defaults(handler=_down)


def _install_chart(cluster: LocalCluster, gpus: int) -> None:
    print("building the image (make image)...", file=sys.stderr)
    image = chart.build_image()
    print(f"image {image.name} {image.digest}; installing the chart...", file=sys.stderr)
    chart.import_image(cluster, image)
    nvml = chart.nvml_directory(cluster, chart.fake_nvml(gpus))
    chart.install(cluster, image, nvml)
    for pod in chart.component_pods(cluster):
        print(
            f"  {pod['metadata']['name']}: {pod['status'].get('phase')} on "
            f"{pod['spec'].get('nodeName')}",
            file=sys.stderr,
        )


def _add_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="cluster directory (default $GPUPLACE_CACHE/cluster, i.e. ~/.cache/gpuplace/cluster)",
    )


def _directory(args: argparse.Namespace) -> Path:
    chosen: Path | None = args.dir
    return (chosen if chosen is not None else cache_root() / "cluster").expanduser().absolute()


def _up(args: argparse.Namespace) -> int:
    directory = _directory(args)
    if args.nodes < 0 or args.gpus < 0:
        print("gpuplace cluster up: --nodes and --gpus must not be negative", file=sys.stderr)
        return 2
    status = _prepare_directory(directory)
    if status is not None:
        return status
    try:
        labels = _real_node_labels(args.real_node_label)
    except ValueError as error:
        print(f"gpuplace cluster up: {error}", file=sys.stderr)
        return 2
    cluster = LocalCluster(
        directory,
        detach=True,
        scheduler=args.scheduler or args.chart,
        namespaces=args.namespace,
        real_nodes=1 if args.real_node or args.chart else 0,
        real_node_labels=labels,
        pod_network=args.chart,
        policies=not args.chart,
    )
    try:
        cluster.start()
        nodes = cluster.create_nodes(
            fake_gpu_nodes(args.nodes, gpus=args.gpus, prefix=args.node_prefix)
        )
        if args.chart:
            _install_chart(cluster, args.real_node_gpus)
    except (ClusterError, BinariesError, ChartError) as error:
        cluster.stop(keep_directory=True)
        print(f"gpuplace cluster up: {error}", file=sys.stderr)
        return 1
    except BaseException:
        cluster.stop(keep_directory=True)
        raise
    real = f" and real node {REAL_NODE_NAME}" if args.real_node or args.chart else ""
    if args.chart:
        real += " running gpuplace's chart"
    print(
        f"cluster up in {cluster.startup_seconds:.1f}s: {cluster.server}, "
        f"{len(nodes)} node(s) with {args.gpus} GPU(s) each{real}; logs in {cluster.logs_dir}\n"
        "stop it with: gpuplace cluster down"
        + (f" --dir {shlex.quote(str(directory))}" if args.dir is not None else ""),
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={shlex.quote(str(cluster.kubeconfig))}")
    return 0


def _prepare_directory(directory: Path) -> int | None:
    """Clears what a stopped or failed cluster left in `directory`. None when a new cluster can
    start there; else the exit status of `up`: 0 when one already runs there (its KUBECONFIG is
    printed), 1 when the directory holds something else."""
    layout = ClusterLayout(directory)
    if layout.state_file.is_file():
        existing = LocalCluster.attach(directory)
        if existing.running():
            print(
                f"a cluster is already running in {directory} ({existing.server})", file=sys.stderr
            )
            print(f"export KUBECONFIG={shlex.quote(str(existing.kubeconfig))}")
            return 0
        print(f"{directory}: cleaning up a cluster that is no longer running", file=sys.stderr)
        existing.stop()
        shutil.rmtree(directory)
    elif layout.marker.is_file():
        print(f"{directory}: removing what a failed start left behind", file=sys.stderr)
        shutil.rmtree(directory)
    elif directory.exists() and any(directory.iterdir()):
        print(
            f"{directory}: exists, is not empty and holds no cluster state; choose another --dir "
            "or remove it",
            file=sys.stderr,
        )
        return 1
    return None


def _real_node_labels(items: list[str]) -> dict[str, str]:
    """`--real-node-label KEY=VALUE` flags as labels; ValueError names a malformed one."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--real-node-label {item!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def _down(args: argparse.Namespace) -> int:
    directory = _directory(args)
    layout = ClusterLayout(directory)
    if not layout.state_file.is_file():
        if layout.marker.is_file() and not args.keep_dir:
            shutil.rmtree(directory, ignore_errors=True)
            print(f"no cluster running in {directory}; removed its leftovers", file=sys.stderr)
        else:
            print(f"no cluster in {directory}; nothing to stop", file=sys.stderr)
        return 0
    try:
        cluster = LocalCluster.attach(directory)
    except ClusterError as error:
        print(f"gpuplace cluster down: {error}", file=sys.stderr)
        return 1
    cluster.stop()
    if not args.keep_dir:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"cluster in {directory} stopped", file=sys.stderr)
    return 0
