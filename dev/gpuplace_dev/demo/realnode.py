"""The demo's real node: a map committed to git places gpu-probe pods on it, and the demo shows
what each container printed next to the binder's table."""

from __future__ import annotations

from gpuplace_dev.localcluster import GPU_PROBE_IMAGE, REAL_NODE_NAME

#: The real node's agent reports GPUs with UUIDs demo_uuid(REAL_NODE_NUMBER, index).
REAL_NODE_NUMBER = 5
#: Its gpu-node-name label, as the legacy maps name nodes.
REAL_NODE_ALIAS = "node5"
NAMESPACE = "inference"
MAP_NAME = "gpu-probe"
MAP_FILE = f"maps/{MAP_NAME}.yaml"

MAP_YAML = f"""\
# gpu-probe pods on the real node ({REAL_NODE_NAME}): their containers print what they got.
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: {MAP_NAME}
  namespace: {NAMESPACE}
spec:
  placements:
    - index: 0
      node: {REAL_NODE_NAME}
      devices: [0, 1]
    - index: 1
      node: {REAL_NODE_NAME}
      devices: [3]
"""

KUSTOMIZE_ENTRY = f"""\
  - name: {MAP_NAME}
    namespace: {NAMESPACE}
    files:
      - placement.yaml={MAP_FILE}
    options:
      annotations:
        gpuplace.io/source-file: {MAP_FILE}
"""

#: What the demo declares for each probe pod: CUDA_VISIBLE_DEVICES.
DECLARED = {"gpu-probe-0": "0,1", "gpu-probe-1": "3"}

STATEFULSET_YAML = f"""\
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: gpu-probe
  namespace: {NAMESPACE}
spec:
  replicas: 2
  serviceName: gpu-probe
  podManagementPolicy: Parallel
  selector:
    matchLabels: {{app: gpu-probe}}
  template:
    metadata:
      labels: {{app: gpu-probe, gpuplace.io/map: {MAP_NAME}}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: probe
          image: {GPU_PROBE_IMAGE}
"""


def printed(log: str) -> dict[str, str]:
    """The NAME=value lines gpu-probe printed (its own status lines start with 'gpu-probe:')."""
    found = {}
    for line in log.splitlines():
        if "=" in line and not line.startswith("gpu-probe:"):
            name, _, value = line.partition("=")
            found[name] = value
    return found


#: dra enforcement at the end of the demo: a map for the real node's last free GPU.
DRA_MAP_NAME = "dra-probe"
DRA_DEVICE = 2
DRA_MAP_YAML = f"""\
apiVersion: gpuplace.io/v1alpha1
kind: PlacementMap
metadata:
  name: {DRA_MAP_NAME}
  namespace: {NAMESPACE}
spec:
  placements:
    - index: 0
      node: {REAL_NODE_NAME}
      devices: [{DRA_DEVICE}]
"""

DRA_POD_YAML = f"""\
apiVersion: v1
kind: Pod
metadata:
  name: {DRA_MAP_NAME}-0
  namespace: {NAMESPACE}
  labels: {{gpuplace.io/map: {DRA_MAP_NAME}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: probe
      image: {GPU_PROBE_IMAGE}
"""
