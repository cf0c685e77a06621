"""API paths of the resources gpuplace reads and writes, built without I/O.

`PODS.item("web-0", "ml", "binding")` rather than an f-string at the call site: one place knows each
resource's group, version and scope, and escapes what goes into a path.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


def _segment(value: str) -> str:
    if not value or value in (".", ".."):
        raise ValueError(f"{value!r}: an empty or dot name or namespace has no path")
    return quote(value, safe="")


@dataclass(frozen=True, slots=True)
class Resource:
    group: str  # "" for the core group
    version: str
    plural: str
    namespaced: bool = True

    @property
    def prefix(self) -> str:
        return f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"

    def collection(self, namespace: str | None = None) -> str:
        """The collection, in `namespace`, or across all namespaces when None (list and watch)."""
        if namespace is None:
            return f"{self.prefix}/{self.plural}"
        if not self.namespaced:
            raise ValueError(f"{self.plural} are cluster-scoped: no namespace")
        return f"{self.prefix}/namespaces/{_segment(namespace)}/{self.plural}"

    def item(self, name: str, namespace: str | None = None, subresource: str = "") -> str:
        if self.namespaced and namespace is None:
            raise ValueError(f"{self.plural} are namespaced: {name!r} needs a namespace")
        path = f"{self.collection(namespace)}/{_segment(name)}"
        return f"{path}/{subresource}" if subresource else path


PODS = Resource("", "v1", "pods")
CONFIGMAPS = Resource("", "v1", "configmaps")
SECRETS = Resource("", "v1", "secrets")
EVENTS = Resource("", "v1", "events")
NODES = Resource("", "v1", "nodes", namespaced=False)
LEASES = Resource("coordination.k8s.io", "v1", "leases")
RESOURCE_CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims")
RESOURCE_CLAIM_TEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates")
RESOURCE_SLICES = Resource("resource.k8s.io", "v1", "resourceslices", namespaced=False)
#: Alpha in Kubernetes 1.35 (gate DRADeviceTaintRules, API resource.k8s.io/v1alpha3): watched
#: where served, read as none where not.
DEVICE_TAINT_RULES = Resource("resource.k8s.io", "v1alpha3", "devicetaintrules", namespaced=False)
MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", namespaced=False
)
VALIDATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", namespaced=False
)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts")
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
CUSTOM_RESOURCE_DEFINITIONS = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False
)
FLOW_SCHEMAS = Resource("flowcontrol.apiserver.k8s.io", "v1", "flowschemas", namespaced=False)
VALIDATING_ADMISSION_POLICIES = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", namespaced=False
)
VALIDATING_ADMISSION_POLICY_BINDINGS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings", namespaced=False
)
#: gpuplace's own custom resources (CRDs placementmaps.gpuplace.io, placementpolicies.gpuplace.io).
PLACEMENT_MAPS = Resource("gpuplace.io", "v1alpha1", "placementmaps")
PLACEMENT_POLICIES = Resource("gpuplace.io", "v1alpha1", "placementpolicies", namespaced=False)
