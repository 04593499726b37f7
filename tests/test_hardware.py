"""The hardware table: figures, name mapping from every cloud spelling, and the loader's checks."""

from __future__ import annotations

import ast
import csv
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer import hardware
from optimizer.hardware import (
    DTYPES,
    GpuTableError,
    UnknownDtypeError,
    all_gpus,
    from_aws,
    from_gcp,
    get,
    instance_interconnect,
    load_table,
    lookup,
    unknown,
)
from optimizer.model import Interconnect

REQUIRED = (
    "T4", "L4", "A10G", "A10", "L40S", "V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB",
    "H100-80GB", "H100-80GB-PCIe", "H200-141GB", "B200", "MI300X", "MI250X",
    "P100", "P4", "Radeon-Pro-V520",
)  # fmt: skip
CANONICAL = {spec.name for spec in all_gpus()}


# --- the table itself ------------------------------------------------------------------------


@pytest.mark.parametrize("name", REQUIRED)
def test_every_required_model_is_in_the_table_with_a_source(name: str) -> None:
    spec = get(name)
    assert spec.known and spec.name == name
    assert spec.source.strip(), f"{name} has no source"
    assert spec.memory_gib > 0


def test_every_row_cites_a_source_and_names_are_unique() -> None:
    specs = all_gpus()
    assert all(spec.source for spec in specs)
    assert len({spec.name for spec in specs}) == len(specs)


@pytest.mark.parametrize("name", ["T4", "V100-16GB", "V100-32GB"])
def test_t4_and_v100_have_no_bf16_or_tf32_units(name: str) -> None:
    spec = get(name)
    assert spec.tflops_for("bf16") is None
    assert spec.tflops_for("tf32") is None
    assert spec.tflops_for("fp16") is not None  # the tensor cores do fp16


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("H100-80GB", "bf16", 989),
        ("H100-80GB", "tf32", 494.5),
        ("H100-80GB", "fp8", 1979),
        ("H100-80GB", "fp64", 34),
        ("H100-80GB", "fp64_tensor", 67),
        ("H100-80GB-PCIe", "bf16", 756),
        ("H100-80GB-PCIe", "fp8", 1513),
        ("H200-141GB", "bf16", 989),
        ("A100-40GB", "bf16", 312),
        ("A100-80GB", "tf32", 156),
        ("A100-80GB", "fp64", 9.7),
        ("A100-80GB", "fp64_tensor", 19.5),
        ("L4", "bf16", 121),
        ("L4", "fp8", 242),
        ("L40S", "fp16", 362),
        ("T4", "fp16", 65),
        ("T4", "int8", 130),
        ("V100-16GB", "fp32", 15.7),
        ("A10", "bf16", 125),
        ("B200", "bf16", 2250),
        ("MI250X", "bf16", 383),
    ],
)
def test_figures_match_reference_section_4_1(name: str, dtype: str, expected: float) -> None:
    assert get(name).tflops_for(dtype) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "bandwidth", "memory_gib"),
    [
        ("H100-80GB", 3350, 80),
        ("H200-141GB", 4800, 141),
        ("A100-40GB", 1555, 40),
        ("A100-80GB", 2039, 80),
        ("L4", 300, 22.35),  # AWS reports 22888 MiB, not the marketing 24 GB
        ("L40S", 864, 44.7),
    ],
)
def test_memory_figures_are_the_cloud_reported_ones(
    name: str, bandwidth: float, memory_gib: float
) -> None:
    spec = get(name)
    assert spec.memory_bandwidth_gbs == bandwidth
    assert spec.memory_gib == pytest.approx(memory_gib, abs=0.01)


def test_a10g_throughput_is_unstated_because_nvidia_publishes_no_datasheet() -> None:
    assert all(get("A10G").tflops_for(d) is None for d in DTYPES)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("A100-40GB", True), ("H100-80GB", True), ("V100-16GB", True), ("MI300X", True),
     ("T4", False), ("L4", False), ("L40S", False), ("A10G", False), ("P100", False)],
)  # fmt: skip
def test_real_fp64_units_means_at_least_5_tflops(name: str, expected: bool) -> None:
    assert get(name).has_fp64_units is expected


def test_dtype_names_are_checked_and_torch_names_accepted() -> None:
    spec = get("H100-80GB")
    assert spec.tflops_for("bfloat16") == spec.tflops_for("BF16") == 989
    with pytest.raises(UnknownDtypeError, match="fp4"):
        spec.tflops_for("fp4")


def test_links_are_structured() -> None:
    h100 = get("H100-80GB")
    assert h100.gpu_link is not None and h100.gpu_link.kind == "nvlink4"
    assert h100.gpu_link.gbps == 900
    assert h100.host_link is not None and h100.host_link.kind == "pcie5"
    assert get("L4").gpu_link is None


# --- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("t4", "T4"),
        ("T4g", "T4"),
        ("nvidia-tesla-t4", "T4"),
        ("Tesla T4", "T4"),
        ("  l40s ", "L40S"),
        ("a100_80gb", "A100-80GB"),
        ("A100 80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("A100", "A100-40GB"),
        ("V100", "V100-16GB"),
        ("H100", "H100-80GB"),
        ("H100-MEGA", "H100-80GB"),
        ("nvidia-h100-mega-80gb", "H100-80GB"),
        ("H100 PCIe", "H100-80GB-PCIe"),
        ("nvidia-h200-141gb", "H200-141GB"),
        ("Radeon Pro V520", "Radeon-Pro-V520"),
        ("radeon_pro_v520", "Radeon-Pro-V520"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_aliases_resolve_to_the_canonical_model(spelling: str, canonical: str) -> None:
    assert get(spelling).name == canonical
    assert lookup(spelling) is get(spelling)


@pytest.mark.parametrize("name", ["K80", "A100-12GB", "H100X", "", "T 4", "Gaudi2"])
def test_unknown_names_stay_unknown_and_keep_the_raw_text(name: str) -> None:
    spec = get(name)
    assert not spec.known
    assert spec.name == f"unknown:{name}"
    assert spec.raw_name == name
    assert spec.memory_gib == 0
    assert all(spec.tflops_for(d) is None for d in DTYPES)
    assert not spec.has_fp64_units
    assert lookup(name) is None


def test_an_unknown_name_round_trips_through_get() -> None:
    stored = from_aws("A100", 12000).name
    assert get(stored).name == stored == "unknown:A100/12000MiB"
    assert get("unknown:T4").known is False  # never becomes the GPU it mentions


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_get_never_raises_and_never_invents_a_model(text: str) -> None:
    spec = get(text)
    if spec.known:
        assert spec.name in CANONICAL
        assert lookup(text) is spec
    else:
        raw = text.removeprefix("unknown:")
        assert spec.name == f"unknown:{raw}"
        assert spec.raw_name == raw


_ALL_SPELLINGS = sorted({(a, s.name) for s in all_gpus() for a in (s.name, *s.aliases)})


@given(
    st.sampled_from(_ALL_SPELLINGS),
    st.sampled_from([str.upper, str.lower, lambda s: s.replace("-", "_"), lambda s: f" {s} "]),
)
def test_every_alias_survives_case_and_separator_changes(
    pair: tuple[str, str], change: Callable[[str], str]
) -> None:
    spelling, canonical = pair
    assert get(change(spelling)).name == canonical


# --- AWS -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        ("A100", 40960, "A100-40GB"),  # p4d
        ("A100", 81920, "A100-80GB"),  # p4de
        ("A100", 40536, "A100-40GB"),  # a driver-style figure, within 7%
        ("A100-80GB", 81920, "A100-80GB"),  # SkyPilot's rewritten name
        ("V100", 16384, "V100-16GB"),
        ("V100", 32768, "V100-32GB"),
        ("H100", 81920, "H100-80GB"),
        ("H200", 144384, "H200-141GB"),
        ("L4", 22888, "L4"),
        ("A10G", 22888, "A10G"),
        ("L40S", 45776, "L40S"),
        ("B200", 183359, "B200"),
        ("T4", 16384, "T4"),
        ("T4g", 16384, "T4"),
        ("NVIDIA", 144384, "H200-141GB"),  # the p5e quirk, skypilot#4652
        ("Radeon Pro V520", 8192, "Radeon-Pro-V520"),
    ],
)
def test_from_aws_maps_name_and_memory(name: str, memory_mib: int, expected: str) -> None:
    assert from_aws(name, memory_mib).name == expected


@pytest.mark.parametrize(
    ("name", "memory_mib", "expected"),
    [
        ("A100", 12000, "unknown:A100/12000MiB"),  # far from 40 and 80 GB
        ("A100", 81920 * 1.08, "unknown:A100/88473.6MiB"),  # just past the 7% snap
        ("A100", None, "unknown:A100"),  # two candidates and nothing to choose by
        ("V100", None, "unknown:V100"),
        ("A100-80GB", 40960, "unknown:A100-80GB/40960MiB"),  # name and memory disagree
        ("NVIDIA", 81920, "unknown:NVIDIA/81920MiB"),  # the bare name is only ever H200
        ("NVIDIA", None, "unknown:NVIDIA"),
        ("L4", 2861, "unknown:L4/2861MiB"),  # a fractional g6f slice is not an L4
        ("K80", 12288, "unknown:K80/12288MiB"),
        ("A100", -1, "unknown:A100/-1MiB"),
        ("A100", float("nan"), "unknown:A100/nanMiB"),
    ],
)
def test_from_aws_never_guesses(name: str, memory_mib: float | None, expected: str) -> None:
    spec = from_aws(name, memory_mib)
    assert not spec.known
    assert spec.name == expected


def test_from_aws_without_memory_takes_an_unambiguous_name() -> None:
    assert from_aws("H100", None).name == "H100-80GB"


def test_from_aws_rejects_a_manufacturer_that_contradicts_the_model() -> None:
    assert from_aws("T4", 16384, "NVIDIA").name == "T4"
    assert from_aws("Radeon Pro V520", 8192, "AMD").name == "Radeon-Pro-V520"
    spec = from_aws("T4", 16384, "AMD")
    assert not spec.known and spec.name == "unknown:AMD T4/16384MiB"


# --- GCP -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "expected"),
    [
        ("nvidia-tesla-t4", "T4"),
        ("nvidia-tesla-t4-vws", "T4"),
        ("nvidia-l4", "L4"),
        ("nvidia-l4-vws", "L4"),
        ("nvidia-tesla-a100", "A100-40GB"),
        ("nvidia-a100-80gb", "A100-80GB"),
        ("nvidia-h100-80gb", "H100-80GB"),
        ("nvidia-h100-mega-80gb", "H100-80GB"),
        ("nvidia-h200-141gb", "H200-141GB"),
        ("nvidia-b200", "B200"),
        ("nvidia-tesla-v100", "V100-16GB"),
        ("nvidia-tesla-p100", "P100"),
        ("nvidia-tesla-p100-vws", "P100"),
        ("nvidia-tesla-p4", "P4"),
        ("nvidia-tesla-p4-vws", "P4"),
        ("nvidia-rtx-pro-6000", "RTX-PRO-6000"),
        ("A100", "A100-40GB"),
        ("A100-80GB", "A100-80GB"),
        ("B200", "B200"),
        ("H100", "H100-80GB"),
        ("H100-MEGA", "H100-80GB"),
        ("H200", "H200-141GB"),
        ("L4", "L4"),
        ("P100", "P100"),
        ("P4", "P4"),
        ("T4", "T4"),
        ("V100", "V100-16GB"),
    ],
)
def test_from_gcp_maps_accelerator_types_and_skypilot_names(
    accelerator: str, expected: str
) -> None:
    assert from_gcp(accelerator).name == expected


@pytest.mark.parametrize("accelerator", ["nvidia-tesla-k80", "ct5lp-hightpu-4t", "-vws"])
def test_from_gcp_leaves_unknown_types_unknown(accelerator: str) -> None:
    spec = from_gcp(accelerator)
    assert not spec.known and spec.name == f"unknown:{accelerator}"


# --- interconnect ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "instance_type", "count", "expected"),
    [
        ("aws", "p5.4xlarge", 1, Interconnect.NONE),
        ("aws", "p3.2xlarge", 1, Interconnect.NONE),
        ("aws", "p3.8xlarge", 4, Interconnect.NVLINK),
        ("aws", "p3dn.24xlarge", 8, Interconnect.NVLINK),
        ("aws", "p4d.24xlarge", 8, Interconnect.NVLINK),
        ("aws", "p4de.24xlarge", 8, Interconnect.NVLINK),
        ("aws", "p5.48xlarge", 8, Interconnect.NVLINK),
        ("aws", "p5en.48xlarge", 8, Interconnect.NVLINK),
        ("aws", "p6-b200.48xlarge", 8, Interconnect.NVLINK),
        ("AWS", "g5.48xlarge", 8, Interconnect.PCIE),
        ("aws", "g4dn.12xlarge", 4, Interconnect.PCIE),
        ("aws", "g6e.12xlarge", 4, Interconnect.PCIE),
        ("aws", "g4ad.16xlarge", 4, Interconnect.PCIE),
        ("gcp", "a2-highgpu-8g", 8, Interconnect.NVLINK),
        ("gcp", "a3-megagpu-8g", 8, Interconnect.NVLINK),
        ("gcp", "a4-highgpu-8g", 8, Interconnect.NVLINK),
        ("gcp", "g2-standard-48", 4, Interconnect.PCIE),
        ("gcp", "n1-standard-16", 4, Interconnect.PCIE),
        ("gcp", "a2-highgpu-1g", 1, Interconnect.NONE),
        ("local", "p4d.24xlarge", 8, Interconnect.PCIE),  # the family rule is per cloud
    ],
)
def test_instance_interconnect(
    provider: str, instance_type: str, count: int, expected: Interconnect
) -> None:
    assert instance_interconnect(provider, instance_type, count) is expected


# --- the loader rejects a broken table -------------------------------------------------------

GOOD_ROW = """\
  - name: {name}
    vendor: nvidia
    memory_gib: {memory}
    tflops: {{fp64: 1, fp32: 2, tf32: null, bf16: null, fp16: 4, {extra}fp8: null, int8: null}}
    source: {source}
"""


def _table(*rows: str) -> str:
    return "gpus:\n" + "".join(rows)


def _row(name: str = "X1", memory: str = "8", extra: str = "", source: str = "a datasheet") -> str:
    return GOOD_ROW.format(name=name, memory=memory, extra=extra, source=source)


def test_loader_accepts_a_well_formed_table() -> None:
    (spec,) = load_table(text=_table(_row()))
    assert spec.name == "X1" and spec.tflops_for("fp16") == 4


def test_the_packaged_table_is_what_all_gpus_serves() -> None:
    assert [s.name for s in load_table()] == [s.name for s in all_gpus()]


@pytest.mark.parametrize(
    ("second_row", "message"),
    [
        (_row(name="BAD", source="''"), r"gpus-test.yaml:7: row 2 \(BAD\): source is required"),
        (_row(name="BAD", extra="fp4: 9, "), r"row 2 \(BAD\): tflops has unknown dtype fp4"),
        (_row(name="BAD", memory="-8"), r"row 2 \(BAD\): memory_gib must be a finite number >= 0"),
        (_row(name="BAD", extra="fp64_tensor: -1, "), r"row 2 \(BAD\): tflops.fp64_tensor"),
        (_row(name="x1"), r"row 2 \(x1\): name or alias 'x1' is already X1"),
        ("  - vendor: nvidia\n    source: s\n", r"gpus-test.yaml:7: row 2: name is required"),
        (_row(name="BAD").replace("vendor", "vendr"), r"row 2 \(BAD\): unknown field vendr"),
    ],
)
def test_loader_rejects_a_broken_row_naming_it(second_row: str, message: str) -> None:
    with pytest.raises(GpuTableError, match=message):
        load_table("gpus-test.yaml", text=_table(_row(), second_row))


def test_loader_rejects_a_missing_dtype(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(_table(_row().replace("int8: null", "")), encoding="utf-8")
    with pytest.raises(GpuTableError, match=rf"{path.name}:2: row 1 \(X1\): tflops lacks int8"):
        load_table(path)


@pytest.mark.parametrize("text", ["", "gpus: []\n", "- name: T4\n", "gpus: [\n"])
def test_loader_rejects_a_table_of_the_wrong_shape(text: str) -> None:
    with pytest.raises(GpuTableError):
        load_table(text=text)


def test_the_table_is_loaded_once() -> None:
    assert hardware._default_table() is hardware._default_table()
    assert unknown("x") == unknown("x")


# --- every GPU the shared price data names ---------------------------------------------------


def _catalog_rows(directory: Path, filename: str) -> list[dict[str, str]]:
    with (directory / filename).open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# (GpuInfo name, SizeInMiB) -> canonical model, for every pair in aws_gpu_vms.csv.
AWS_EXPECTED = {
    ("A100", 40960): "A100-40GB",  # p4d
    ("A100", 81920): "A100-80GB",  # p4de
    ("A100-80GB", 81920): "A100-80GB",  # p4de rows SkyPilot rewrote
    ("A10G", 22888): "A10G",
    ("H100", 81920): "H100-80GB",
    ("H200", 144384): "H200-141GB",
    ("L4", 22888): "L4",
    ("L40S", 45776): "L40S",
    ("Radeon Pro V520", 8192): "Radeon-Pro-V520",
    ("T4", 16384): "T4",
    ("T4g", 16384): "T4",
    ("V100", 16384): "V100-16GB",  # p3
    ("V100", 32768): "V100-32GB",  # p3dn
}
GCP_EXPECTED = {
    "A100": "A100-40GB", "A100-80GB": "A100-80GB", "B200": "B200", "H100": "H100-80GB",
    "H100-MEGA": "H100-80GB", "H200": "H200-141GB", "L4": "L4", "P100": "P100", "P4": "P4",
    "T4": "T4", "V100": "V100-16GB",
}  # fmt: skip


@pytest.mark.catalog
def test_every_aws_gpu_in_the_shared_prices_maps_to_the_expected_model(
    shared_catalog_dir: Path,
) -> None:
    seen: set[tuple[str, int, str]] = set()
    for row in _catalog_rows(shared_catalog_dir, "aws_gpu_vms.csv"):
        gpu = ast.literal_eval(row["GpuInfo"])["Gpus"][0]
        seen.add((gpu["Name"], gpu["MemoryInfo"]["SizeInMiB"], gpu.get("Manufacturer", "")))
    assert seen
    for name, memory_mib, manufacturer in sorted(seen):
        assert (name, memory_mib) in AWS_EXPECTED, f"new AWS GPU {name}/{memory_mib}MiB"
        spec = from_aws(name, memory_mib, manufacturer)
        assert spec.known, f"{name}/{memory_mib}MiB is unknown"
        assert spec.name == AWS_EXPECTED[(name, memory_mib)]


@pytest.mark.catalog
def test_every_gcp_gpu_in_the_shared_prices_maps_to_the_expected_model(
    shared_catalog_dir: Path,
) -> None:
    names = {
        row["AcceleratorName"] for row in _catalog_rows(shared_catalog_dir, "gcp_gpu_vms.csv")
    } - {""}
    assert names == set(GCP_EXPECTED), "the GCP price data names a GPU this test does not expect"
    for name in sorted(names):
        assert from_gcp(name).name == GCP_EXPECTED[name]


@pytest.mark.catalog
def test_aws_priced_instances_get_nvlink_exactly_in_multi_gpu_p_families(
    shared_catalog_dir: Path,
) -> None:
    for row in _catalog_rows(shared_catalog_dir, "aws_gpu_vms.csv"):
        count = int(float(row["AcceleratorCount"]))
        link = instance_interconnect("aws", row["InstanceType"], count)
        if count <= 1:
            assert link is Interconnect.NONE, row["InstanceType"]
        elif row["InstanceType"].startswith("p"):
            assert link is Interconnect.NVLINK, row["InstanceType"]
        else:
            assert link is Interconnect.PCIE, row["InstanceType"]
