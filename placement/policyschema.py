"""The PlacementPolicy document as a pydantic model: the source of the CRD's schema.

`placement.grants.parse_policy` stays the reader (its errors carry lines and columns); this model
accepts exactly what that reader accepts, which tests/unit/placement/test_policy_schema.py checks on every
example policy.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from placement.types import (
    API_VERSION,
    DNS_LABEL_RE,
    GPU_UUID_RE,
    MAX_DEVICE_INDEX,
    MAX_TAINT_KEY,
    NODE_REF_PATTERN,
    POLICY_KIND,
    TAINT_KEY_RE,
)


class _Strict(BaseModel):
    """Unknown fields and explicit nulls are errors, as they are to the reader (the apiserver
    drops the nulls of a custom resource before it validates)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            nulls = sorted(str(k) for k, v in data.items() if v is None)
            if nulls:
                raise ValueError(f"{', '.join(nulls)}: null is not a value here; omit the field")
        return data


NamespaceName = Annotated[StrictStr, Field(min_length=1, pattern=DNS_LABEL_RE.pattern)]
NodeRef = Annotated[StrictStr, Field(min_length=1, max_length=253, pattern=NODE_REF_PATTERN)]
LabelText = Annotated[StrictStr, Field(min_length=1)]


def _device(value: int | str) -> int | str:
    if isinstance(value, int):
        if not 0 <= value <= MAX_DEVICE_INDEX:
            raise ValueError(f"device index {value} is not in 0..{MAX_DEVICE_INDEX}")
    elif not GPU_UUID_RE.match(value):
        raise ValueError(f"device {value!r} is neither an NVML index nor a GPU UUID")
    return value


Device = Annotated[StrictInt | StrictStr, AfterValidator(_device)]


class SelectorRequirement(_Strict):
    """A label requirement, as in a Kubernetes label selector."""

    key: StrictStr = Field(description="Node label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn, Exists or DoesNotExist."
    )
    values: list[LabelText] | None = Field(default=None, description="Label values (In, NotIn).")


class GrantNodeSelector(_Strict):
    """Nodes by their labels; every label and requirement must match."""

    match_labels: dict[StrictStr, StrictStr] | None = Field(
        default=None, alias="matchLabels", description="Labels a node must carry, exactly."
    )
    match_expressions: list[SelectorRequirement] | None = Field(
        default=None, alias="matchExpressions", description="Requirements a node must meet."
    )


TaintKey = Annotated[
    StrictStr, Field(min_length=1, max_length=MAX_TAINT_KEY, pattern=TAINT_KEY_RE.pattern)
]


class TolerationGrantSpec(_Strict):
    """DRA device taints the grant's namespaces may tolerate on its nodes (a map's
    `tolerations`): one key, or every key."""

    key: TaintKey | None = Field(
        default=None, description="Taint key whose taints may be tolerated."
    )
    any_key: Literal[True] | None = Field(
        default=None,
        alias="anyKey",
        description="true: taints of every key may be tolerated (what a toleration without a "
        "key, operator Exists, needs). Give either key or anyKey.",
    )
    effects: list[Literal["NoSchedule", "NoExecute"]] | None = Field(
        default=None,
        min_length=1,
        description="Only taints of these effects. Omitted: every effect (what a toleration "
        "without an effect needs).",
    )

    @field_validator("any_key", mode="before")
    @classmethod
    def _a_boolean(cls, value: Any) -> Any:
        if not isinstance(value, bool):
            raise ValueError("anyKey is true or omitted")  # Literal[True] alone would take 1
        return value

    @model_validator(mode="after")
    def _one_key(self) -> TolerationGrantSpec:
        if (self.key is None) == (self.any_key is None):
            raise ValueError("a toleration grant needs exactly one of 'key' and 'anyKey: true'")
        return self


class GrantSpec(_Strict):
    """Namespaces that may place on some nodes (and GPUs of them)."""

    namespaces: list[NamespaceName] = Field(description="Namespaces this grant applies to.")
    nodes: list[NodeRef] | None = Field(
        default=None,
        description="Node names, or logical names resolved through the node alias label.",
    )
    node_selector: GrantNodeSelector | None = Field(
        default=None, alias="nodeSelector", description="Nodes by label (with or besides nodes)."
    )
    devices: list[Device] | None = Field(
        default=None,
        min_length=1,
        description="Only these GPUs of those nodes: NVML indices or GPU UUIDs (GPU-...). "
        "Omitted: every GPU.",
    )
    tolerations: list[TolerationGrantSpec] | None = Field(
        default=None,
        description="DRA device taints the namespaces' maps may tolerate on these nodes. "
        "Omitted: none (a map's toleration is refused unless a grant lists its key).",
    )

    @model_validator(mode="after")
    def _names_nodes(self) -> GrantSpec:
        if not self.nodes and self.node_selector is None:
            raise ValueError("a grant needs 'nodes', 'nodeSelector' or both")
        return self


class PolicySpec(_Strict):
    """Which namespaces may place on which nodes and GPUs."""

    grants: list[GrantSpec] = Field(
        default_factory=list,
        description="The grants. A namespace named in none may place anywhere, or nowhere "
        "when grants deny by default (--grants-default=deny).",
    )


class PolicyDocument(BaseModel):
    """A whole PlacementPolicy document, as committed to git."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: StrictStr = Field(alias="apiVersion")
    kind: StrictStr
    metadata: Any = None
    spec: PolicySpec = Field(default_factory=PolicySpec)

    @model_validator(mode="after")
    def _is_a_policy(self) -> PolicyDocument:
        if self.api_version != API_VERSION or self.kind != POLICY_KIND:
            raise ValueError(f"expected apiVersion {API_VERSION} and kind {POLICY_KIND}")
        return self
