"""`mig` entries in validation: the xor with devices/count, the profile's form, the profiles of a
known product, whole-GPU and MIG entries of one GPU, and the profile table itself."""

from __future__ import annotations

import textwrap

import pytest

from placement.conflicts import find_conflicts
from placement.maps import MigRequest
from placement.migprofiles import base_profile, product_problem, product_profiles
from placement.types import GpuUuid
from placement.validate import load_maps, parse_map
from tests.unit.webhook_builders import map_header

HEADER = map_header()  # the spec body starts on line 7


def problems(spec: str) -> list[tuple[int, int, str, str]]:
    result = load_maps(HEADER + textwrap.indent(textwrap.dedent(spec), "  "), "m.yaml")
    assert not result.maps
    return [
        (d.location.line, d.location.column, d.location.path, d.message) for d in result.diagnostics
    ]


def test_a_mig_entry_is_read_with_its_parent_by_index_or_uuid() -> None:
    pmap = parse_map(
        HEADER
        + """\
  placements:
    - index: 0
      node: n1
      mig: {gpu: 0, profile: 3g.40gb}
    - index: 1
      node: n1
      mig: {gpu: GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00, profile: 1g.10gb+me}
""",
        "m.yaml",
    )
    assert pmap.slots[0].mig == MigRequest(0, "3g.40gb")
    parent = GpuUuid("GPU-5c1d0c3e-0b7a-4c2e-9f61-3a1b2c3d4e00")
    assert pmap.slots[1].mig == MigRequest(parent, "1g.10gb+me")
    assert pmap.slots[0].devices == () and pmap.slots[0].count is None


@pytest.mark.parametrize("other", ["devices: [0]", "count: 1"])
def test_mig_with_devices_or_count_points_at_mig(other: str) -> None:
    name = other.split(":", maxsplit=1)[0]
    assert problems(f"""\
      placements:
        - index: 0
          node: n1
          {other}
          mig: {{gpu: 0, profile: 3g.40gb}}
    """) == [(11, 7, "spec.placements[0].mig", f"'mig' and '{name}' are mutually exclusive")]


@pytest.mark.parametrize(
    "profile", ["3g40gb", "3g.40GB", "0g.5gb", "3g.40gb+foo", "8g", "3g.40gb "]
)
def test_a_malformed_profile_points_at_the_profile(profile: str) -> None:
    found = problems(f"""\
      placements:
        - index: 0
          node: n1
          mig: {{gpu: 0, profile: "{profile}"}}
    """)
    assert len(found) == 1
    line, _, path, message = found[0]
    assert (line, path) == (10, "spec.placements[0].mig.profile")
    assert message.startswith(f"{profile!r} is not a MIG profile")


def test_a_bad_parent_points_at_gpu() -> None:
    found = problems("""\
      placements:
        - index: 0
          node: n1
          mig: {gpu: gpu0, profile: 3g.40gb}
    """)
    assert [(p, m) for _, _, p, m in found] == [
        (
            "spec.placements[0].mig.gpu",
            "device 'gpu0' is neither an NVML index, a GPU UUID nor a PCI bus ID",
        )
    ]


def test_the_profile_is_checked_against_a_required_product() -> None:
    found = problems("""\
      placements:
        - index: 0
          node: n1
          mig: {gpu: 0, profile: 3g.40gb}
          require: {product: NVIDIA H200}
    """)
    assert [(p, m) for _, _, p, m in found] == [
        (
            "spec.placements[0].mig.profile",
            "NVIDIA H200 has no MIG profile 3g.40gb (it offers 1g.18gb, 1g.35gb, 2g.35gb, "
            "3g.71gb, 4g.71gb, 7g.141gb)",
        )
    ]


def test_a_whole_gpu_entry_and_a_mig_entry_of_one_gpu_are_refused_even_when_shared() -> None:
    found = problems("""\
      sharing: shared
      placements:
        - index: 0
          node: n1
          mig: {gpu: 0, profile: 3g.40gb}
        - index: 1
          node: n1
          devices: [1, 0]
    """)
    assert len(found) == 1
    line, _, _, message = found[0]
    assert line == 12
    assert message.startswith(
        "GPU 0 on node n1 is given whole to index 1 and as a MIG instance (gpu 0 / 3g.40gb) to "
        "index 0 (line 9)"
    )


def test_whole_and_mig_entries_of_one_gpu_in_two_maps_conflict() -> None:
    first = parse_map(
        HEADER + "  placements:\n    - {index: 0, node: n1, mig: {gpu: 0, profile: 3g.40gb}}\n",
        "a.yaml",
    )
    second = parse_map(
        map_header(name="other") + "  placements:\n    - {index: 0, node: n1, devices: [0]}\n",
        "b.yaml",
    )
    mig_only = parse_map(
        map_header(name="third")
        + "  placements:\n    - {index: 0, node: n1, mig: {gpu: 0, profile: 3g.40gb}}\n",
        "c.yaml",
    )
    conflicts = find_conflicts([first, second, mig_only])
    # Two MIG entries of one GPU do not conflict: each gets its own instance at compile time.
    assert [(c.first.map.name, c.second.map.name) for c in conflicts] == [
        ("llm", "other"),
        ("other", "third"),
    ]
    diagnostic = conflicts[0].diagnostic()
    assert diagnostic.message.startswith(
        "GPU 0 on node n1 of exclusive map inference/other index 0"
    )
    assert "a GPU in MIG mode serves its MIG instances only" in diagnostic.message
    assert diagnostic.location.source == "b.yaml"


# -- the profile table --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("product", "profile"),
    [
        ("NVIDIA H100 80GB HBM3", "3g.40gb"),
        ("NVIDIA H100 PCIe", "7g.80gb"),
        ("NVIDIA H100 NVL", "3g.47gb"),
        ("NVIDIA H200", "3g.71gb"),
        ("NVIDIA H200", "1g.18gb+me"),
        ("NVIDIA A100-SXM4-40GB", "1g.5gb"),
        ("NVIDIA A100-SXM4-80GB", "4g.40gb"),
        ("NVIDIA A100 80GB PCIe", "1g.10gb"),
        ("NVIDIA B200", "7g.180gb"),
        ("Tesla T4", "3g.40gb"),  # no table: nothing to check
    ],
)
def test_profiles_a_product_offers(product: str, profile: str) -> None:
    assert product_problem(profile, product) is None


@pytest.mark.parametrize(
    ("product", "profile"),
    [
        ("NVIDIA H100 80GB HBM3", "3g.71gb"),
        ("NVIDIA H100 NVL", "3g.40gb"),
        ("NVIDIA H200", "3g.40gb"),
        ("NVIDIA A100-SXM4-40GB", "3g.40gb"),
        ("NVIDIA B200", "3g.71gb"),
    ],
)
def test_profiles_a_product_does_not_offer(product: str, profile: str) -> None:
    assert product_problem(profile, product) is not None


def test_suffixes_are_dropped_for_the_table_and_unknown_products_have_none() -> None:
    assert base_profile("1g.10gb+me.all") == "1g.10gb"
    assert base_profile("1g.10gb-me") == "1g.10gb"
    assert base_profile("1g.10gb+gfx") == "1g.10gb"
    assert product_profiles("Tesla V100") is None


@pytest.mark.parametrize("product", ["NVIDIA GH200 480GB", "NVIDIA GB200", "NVIDIA H20"])
def test_products_whose_names_contain_a_known_one_are_not_taken_for_it(product: str) -> None:
    assert product_profiles(product) is None
    assert product_problem("1g.12gb", product) is None  # unknown: nothing is checked


def test_known_products_are_found_by_whole_words() -> None:
    assert product_profiles("NVIDIA A100-SXM4-80GB") == product_profiles("NVIDIA H100 80GB HBM3")
    assert "3g.71gb" in (product_profiles("NVIDIA H200 NVL") or ())
    assert "3g.47gb" in (product_profiles("NVIDIA H100 NVL") or ())
