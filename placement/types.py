"""Small precise types shared by the whole domain."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import NewType

NodeName = NewType("NodeName", str)
GpuUuid = NewType("GpuUuid", str)

API_GROUP = "gpuplace.io"
API_VERSION = "gpuplace.io/v1alpha1"
KIND = "PlacementMap"
#: The custom resource forms (CRDs) of a map and of the cluster's placement policy.
PLACEMENT_MAPS_PLURAL = "placementmaps"
PLACEMENT_MAPS_SHORT = "pm"
POLICY_KIND = "PlacementPolicy"
PLACEMENT_POLICIES_PLURAL = "placementpolicies"
#: Most placements one map may list: more than a 1 MiB ConfigMap can hold (an entry takes at
#: least 30 bytes), so the bound refuses no map of the ConfigMap form, and as a custom resource's
#: list keyed on `index` with this `maxItems` it needs no CEL uniqueness rule over the items
#: (which the CRD cost budget would refuse).
MAX_PLACEMENTS = 40_000
#: The most a ConfigMap holds, all its data together (1 MiB): the legacy `map` text of a custom
#: resource may be no longer, so the apiserver refuses a longer one before anyone parses it.
MAX_MAP_TEXT = 1024 * 1024

#: Largest slot index a map may declare; StatefulSets this large are already unusual.
MAX_INDEX = 99_999
#: Largest `count` one entry may ask for (NVSwitch systems top out at 16 GPUs a node).
MAX_COUNT = 64
#: NVML numbers devices from 0; no machine has anywhere near this many GPUs.
MAX_DEVICE_INDEX = 255

GPU_UUID_RE = re.compile(
    r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
#: A GPU's PCI bus ID, domain:bus:device.function, the domain in 4 or 8 hex digits (NVML writes
#: `00000000:18:00.0`, lspci `0000:18:00.0`): the GPU's physical slot, stable while the card
#: stays in it, whatever NVML's enumeration order.
PCI_BUS_ID_RE = re.compile(
    r"^([0-9a-fA-F]{4}|[0-9a-fA-F]{8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$"
)
#: A device a map names by text: a GPU UUID or a PCI bus ID (one pattern, for schemas).
DEVICE_NAME_RE = re.compile(f"^(?:{GPU_UUID_RE.pattern[1:-1]}|{PCI_BUS_ID_RE.pattern[1:-1]})$")


def pci_bus_id(text: str) -> str | None:
    """`text` as NVML writes a PCI bus ID (8-digit domain, upper-case hex), or None when it is
    not one: the one form inventories and maps are compared in."""
    found = PCI_BUS_ID_RE.match(text.strip())
    if found is None:
        return None
    domain, bus, device, function = found.groups()
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function}"


# RFC 1123 subdomain (node names) and label (namespaces, map names).
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A label value (<= 63 characters): what a logical node name resolved via a node label may be.
LABEL_VALUE_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
#: What `is_node_ref` accepts (up to 253 characters), as one pattern for schemas.
NODE_REF_PATTERN = f"^(?:{DNS_SUBDOMAIN_RE.pattern[1:-1]}|{LABEL_VALUE_RE.pattern[1:-1]})$"
#: A label name, as a taint key is: an optional DNS-subdomain prefix and `/`, then a name part.
TAINT_KEY_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
#: The longest taint key (a 253-character prefix, '/', a 63-character name).
MAX_TAINT_KEY = 316


def is_node_ref(text: str) -> bool:
    """Whether a map may name a node so: a node name (RFC 1123 subdomain) or a label value."""
    if len(text) > 253:
        return False
    return bool(DNS_SUBDOMAIN_RE.match(text) or LABEL_VALUE_RE.match(text))


#: A device as a map names it: an NVML index or a GPU UUID.
DeviceRef = int | GpuUuid


class Sharing(StrEnum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"


class Indexing(StrEnum):
    AUTO = "auto"
    ORDINAL = "ordinal"
    LABEL = "label"
    ALLOCATE = "allocate"


class RolloutStrategy(StrEnum):
    """What happens to pods whose slot a new version of their map moved or removed."""

    MANUAL = "manual"  # nothing moves by itself; the pods show as Drifted
    EVICT = "evict"  # drifted pods are evicted (Eviction API) and re-placed on their new slots


class EnvMode(StrEnum):
    INDEX = "index"
    UUID = "uuid"


@dataclass(frozen=True, order=True, slots=True)
class MapKey:
    """Identifies a placement map: the namespace of the pods it governs and its name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> MapKey:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name:
            raise ValueError(f"expected '<namespace>/<name>', got {text!r}")
        return cls(namespace, name)


@dataclass(frozen=True, order=True, slots=True)
class SlotKey:
    """One slot: a map and an index in it."""

    map: MapKey
    index: int

    def __str__(self) -> str:
        return f"{self.map}[{self.index}]"


def format_device(ref: DeviceRef) -> str:
    return str(ref)
