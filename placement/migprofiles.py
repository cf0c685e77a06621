"""MIG profile names: their form, and the profiles each GPU product offers.

A profile is `<n>g.<m>gb` (compute slices, memory in GB) with an optional NVIDIA suffix for the
media engines and graphics: `+me`, `+me.all`, `-me`, `+gfx`. The product table lists the base
profiles of NVIDIA's MIG user guide ("Supported MIG Profiles"); a suffix is accepted on any base
profile of the product, as the driver decides which slices may carry it.
"""

from __future__ import annotations

import re

#: How a MIG device's UUID starts (a whole GPU's starts with GPU-).
MIG_PREFIX = "MIG-"

PROFILE_RE = re.compile(r"([1-9])g\.([1-9][0-9]{0,3})gb(\+me|\+me\.all|-me|\+gfx)?")

_A100_40GB = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
_A100_80GB = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_H100_NVL = ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")
_H200 = ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
_B200 = ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")

#: (words the product name holds, lower case; its profiles), the first match wins: H100 NVL
#: before the 80 GB H100s (SXM5 HBM3 and PCIe), A100 80GB before A100 40GB.
_PRODUCTS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("h100", "nvl"), _H100_NVL),
    (("h100",), _A100_80GB),
    (("h200",), _H200),
    (("a100", "80gb"), _A100_80GB),
    (("a100",), _A100_40GB),
    (("b200",), _B200),
)


def profile_form_problem(profile: str) -> str | None:
    """Why `profile` is not a MIG profile name; None if it is one."""
    if PROFILE_RE.fullmatch(profile):
        return None
    return (
        f"{profile!r} is not a MIG profile: expected <slices>g.<memory>gb with an optional "
        "+me, +me.all, -me or +gfx suffix, e.g. 3g.40gb or 1g.10gb+me"
    )


def base_profile(profile: str) -> str:
    """The profile without its media/graphics suffix: 1g.10gb+me -> 1g.10gb."""
    match = PROFILE_RE.fullmatch(profile)
    return f"{match.group(1)}g.{match.group(2)}gb" if match else profile


def product_profiles(product: str) -> tuple[str, ...] | None:
    """The base MIG profiles of a GPU product as NVML names it (e.g. "NVIDIA H100 80GB HBM3");
    None for a product this table does not know (nothing is checked then)."""
    # Whole words: "NVIDIA GH200 480GB" and "NVIDIA GB200" hold "h200" and "b200" as substrings
    # but are other GPUs with profiles of their own.
    words_of = set(re.split(r"[^a-z0-9]+", product.lower()))
    for words, profiles in _PRODUCTS:
        if all(w in words_of for w in words):
            return profiles
    return None


def product_problem(profile: str, product: str) -> str | None:
    """Why `product` offers no MIG profile `profile`; None if it does or the product is unknown."""
    profiles = product_profiles(product)
    if profiles is None or base_profile(profile) in profiles:
        return None
    return f"{product} has no MIG profile {profile} (it offers {', '.join(profiles)})"
