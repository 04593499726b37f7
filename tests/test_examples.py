"""Each example policy (one per scenario of the selection guide) does what its scenario says."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from optimizer import hardware
from optimizer.model import Interconnect
from policies import regions
from policies.engine import Ranking, evaluate
from policies.loader import load_policy
from providers.snapshot import load_snapshot

EXAMPLES = Path(__file__).resolve().parents[1] / "policies" / "examples"
NOW = datetime(2026, 11, 30, tzinfo=UTC)
MODELINE = "# yaml-language-server: $schema=../policy.schema.json"


def rank(name: str, offers=None) -> Ranking:
    return evaluate(load_policy(EXAMPLES / f"{name}.yaml"), offers or load_snapshot(), NOW)


def best_gpu(ranking: Ranking) -> hardware.GpuSpec:
    assert ranking.best is not None, ranking.rejections_by_rule().keys()
    return hardware.get(ranking.best.offer.gpu_model)


def test_every_example_is_valid_and_editor_checked() -> None:
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert len(files) == 10
    names = set()
    for path in files:
        assert path.read_text().splitlines()[0] == MODELINE
        policy = load_policy(path)
        assert policy.name == path.stem
        names.add(policy.name)
    assert len(names) == 10


def test_resnet50_lands_on_a_16_gb_class_gpu() -> None:
    ranking = rank("resnet50-training")
    assert 14.4 <= ranking.best.offer.gpu_memory_gib < 32  # 8-16 GB band plus headroom
    assert best_gpu(ranking).name == "T4"


def test_bert_large_needs_more_than_24_gb_cards() -> None:
    ranking = rank("bert-large-training")
    assert ranking.best.offer.gpu_memory_gib >= 28.8
    rejected_small = {r.offer.gpu_model for r in ranking.rejections_by_rule()["gpu_memory"]}
    assert {"L4", "A10G", "T4"} <= rejected_small


def test_llm_training_takes_an_8_gpu_nvlink_80_gb_node() -> None:
    ranking = rank("llm-training-8x80gb")
    for c in ranking.candidates:
        assert c.offer.gpu_count >= 8 and c.offer.interconnect is Interconnect.NVLINK
        assert c.offer.gpu_memory_gib >= 76.8 and c.offer.ram_gib >= 1024
    assert best_gpu(ranking).name in {"A100-80GB", "H100-80GB", "H200-141GB"}
    # price_per_tflop ranks by $/TFLOP: the best is no worse than any other candidate
    assert ranking.best.usd_per_tflop_hour == min(c.usd_per_tflop_hour for c in ranking.candidates)


def test_speech_inference_serves_from_one_t4_on_demand() -> None:
    ranking = rank("speech-inference-t4")
    assert ranking.best.offer.gpu_count == 1 and best_gpu(ranking).name == "T4"
    assert {c.offer.market.value for c in ranking.candidates} == {"on_demand"}


def test_video_analytics_gets_8_gpus_with_v100_class_fp16() -> None:
    ranking = rank("video-analytics-32-streams")
    offer = ranking.best.offer
    assert offer.gpu_count >= 8
    assert offer.gpu_count * best_gpu(ranking).tflops_for("fp16") >= 960


def test_molecular_dynamics_gets_real_fp64_units() -> None:
    ranking = rank("molecular-dynamics-fp64")
    assert all(hardware.get(c.offer.gpu_model).has_fp64_units for c in ranking.candidates)
    assert best_gpu(ranking).name in {
        "A100-40GB",
        "A100-80GB",
        "H100-80GB",
        "H200-141GB",
        "V100-16GB",
        "V100-32GB",
        "MI250X",
    }
    fp64 = ranking.rejections_by_rule()["fp64"]
    assert {"L4", "L40S", "A10G"} & {r.offer.gpu_model for r in fp64}


def test_blender_rendering_needs_more_than_24_gb() -> None:
    ranking = rank("blender-rendering")
    assert ranking.best.offer.gpu_memory_gib > 24
    assert best_gpu(ranking).name == "L40S"


def test_cfd_gets_two_or_more_80_gb_gpus_and_a_terabyte() -> None:
    ranking = rank("cfd-2x-a100-80gb")
    offer = ranking.best.offer
    assert offer.gpu_count >= 2 and offer.gpu_memory_gib >= 72 and offer.ram_gib >= 1024
    assert best_gpu(ranking).has_fp64_units


def test_startup_stays_within_five_thousand_a_month() -> None:
    # From the first of November, a node launched now runs 720 h this month.
    policy = load_policy(EXAMPLES / "startup-5k-budget.yaml")
    ranking = evaluate(policy, load_snapshot(), datetime(2026, 11, 1, tzinfo=UTC))
    assert ranking.candidates
    assert all(c.offer.usd_per_hour * 720 <= 5000 for c in ranking.candidates)
    assert "budget" in ranking.rejections_by_rule()


def test_gdpr_training_stays_in_the_eu() -> None:
    ranking = rank("eu-gdpr-training")
    assert ranking.candidates
    for c in ranking.candidates:
        region = regions.lookup(c.offer.provider, c.offer.region)
        assert region is not None and region.eea
    london = [
        r
        for r in ranking.rejections_by_rule()["compliance"]
        if r.offer.region in ("eu-west-2", "europe-west2")
    ]
    assert london and "outside" in london[0].reason


@pytest.mark.catalog
def test_gdpr_training_on_real_spot_rows_respects_the_spot_cap(shared_catalog_dir) -> None:
    from providers.skypilot_catalog import read_directory

    offers = read_directory(shared_catalog_dir, NOW)
    ranking = rank("eu-gdpr-training", offers)
    spot = [c for c in ranking.candidates if c.offer.market.value == "spot"]
    assert spot
    for c in spot:
        assert c.offer.usd_per_hour <= 0.6 * c.on_demand_usd_per_hour + 1e-9
        assert regions.lookup(c.offer.provider, c.offer.region).eea
