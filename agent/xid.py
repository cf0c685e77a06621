"""XID errors: which ones take a GPU out of service, and how to name them in a health reason."""

from __future__ import annotations

#: XIDs caused by the application running on the GPU, not by the GPU. The NVIDIA device plugin
#: ignores the same set by default: a crashing CUDA program must not drain a healthy GPU.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

_DESCRIPTIONS: dict[int, str] = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


def describe(xid: int) -> str:
    """The health reason for a critical XID, e.g. "XID 79 (GPU has fallen off the bus)"."""
    what = _DESCRIPTIONS.get(xid)
    return f"XID {xid} ({what})" if what else f"XID {xid}"
