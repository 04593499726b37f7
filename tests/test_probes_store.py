"""Probe results in the store, on SQLite and PostgreSQL: every `probe_result` an agent reports is
stored once (a retried batch too), with the figures the ranking reads; per (provider, type) the
median of the last N usable results, and the failures among the last N."""

from __future__ import annotations

from datetime import timedelta

from optimizer.store import Store
from tests.helpers import T0
from tests.helpers.probes import attempt_of, probe_json, report


def test_a_probe_result_is_stored_once_with_its_figures_even_when_sent_again(
    store: Store,
) -> None:
    a = attempt_of(store, "train")
    assert report(store, a, "e1", "pass", probe_json(700.0), T0) == ["e1"]
    assert report(store, a, "e1", "pass", probe_json(700.0), T0) == ["e1"]  # a retried batch
    [stored] = store.probes.page()
    assert (stored.job, stored.attempt_id, stored.provider, stored.instance_type) == (
        "train",
        a.id,
        "aws",
        "p5.48xlarge",
    )
    assert (stored.region, stored.zone, stored.status, stored.simulated) == (
        "us-east-1",
        "us-east-1a",
        "pass",
        False,
    )
    assert (stored.gpu_model, stored.gpu_count, stored.tflops) == ("H100-80GB", 2, {"bf16": 700.0})
    assert (stored.copy_gbps, stored.host_link_gbps, stored.allreduce_busbw_gbps) == (
        4000.0,
        54.0,
        330.0,
    )
    assert stored.at == T0
    assert store.probes.result_json(stored.id) == probe_json(700.0)
    assert store.jobs.attempt(a.key).probe_status == "pass"  # type: ignore[union-attr]


def test_results_without_a_gpu_are_simulated_on_the_host_host_and_neither_is_the_types(
    store: Store,
) -> None:
    cpu = attempt_of(store, "cpu")
    report(store, cpu, "c1", "warn", probe_json(0.4, backend="cpu", gpus=1), T0)
    host = attempt_of(store, "host", provider="local", kind="p4d.24xlarge")
    event = {
        "id": "h1",
        "kind": "probe_result",
        "data": {"status": "pass", "result": probe_json(700.0)},
    }
    store.jobs.record_agent_events(host.key, [event], T0, on_host=True)
    crashed = attempt_of(store, "crashed", kind="g5.xlarge")
    report(store, crashed, "x1", "fail", {"error": "probe crashed"}, T0)
    by_job = {p.job: p for p in store.probes.page()}
    # A real GPU on the daemon's host is measured on the host, not simulated...
    assert {j: (p.source, p.simulated) for j, p in by_job.items()} == {
        "cpu": ("simulated", True),
        "host": ("host", False),
        "crashed": ("simulated", True),
    }
    assert by_job["host"].to_dict()["source"] == "host" and by_job["host"].kind == "quick"
    assert by_job["cpu"].tflops == {"bf16": 0.4} and by_job["cpu"].gpu_count is None
    assert by_job["crashed"].tflops == {} and by_job["crashed"].copy_gbps is None
    # ...but neither it nor a simulated one is taken as the cloud type's figures.
    assert store.probes.figures() == {}
    # A failure counts against its type all the same.
    assert set(store.probes.streaks()) == {("aws", "g5.xlarge")}


def test_figures_are_medians_of_the_last_n_usable_results_per_provider_and_type(
    store: Store,
) -> None:
    a = attempt_of(store, "train")
    bf16 = [500.0, 600.0, 650.0, 700.0, 800.0, 900.0]
    for i, value in enumerate(bf16):
        report(
            store, a, f"p{i}", "pass", probe_json(value, copy=value * 5), T0 + timedelta(hours=i)
        )
    report(store, a, "f", "fail", probe_json(10.0), T0 + timedelta(hours=7))
    report(store, a, "w", "warn", probe_json(1000.0), T0 + timedelta(hours=8))
    other = attempt_of(store, "other", kind="p4d.24xlarge")
    report(store, other, "o", "pass", probe_json(300.0), T0)
    gcp = attempt_of(store, "gcp", provider="gcp", kind="p5.48xlarge")
    report(store, gcp, "g", "pass", probe_json(100.0), T0)

    figures = store.probes.figures(last=5)
    assert set(figures) == {("aws", "p5.48xlarge"), ("aws", "p4d.24xlarge"), ("gcp", "p5.48xlarge")}
    p5 = figures[("aws", "p5.48xlarge")]
    # The newest five usable: 1000 (warn), 900, 800, 700, 650; the failure is left out.
    assert (p5.n, p5.tflops, p5.copy_gbps) == (5, {"bf16": 800.0}, 4000.0)
    assert (p5.newest_at, p5.oldest_at) == (T0 + timedelta(hours=8), T0 + timedelta(hours=2))
    assert p5.gpu_model == "H100-80GB" and p5.allreduce_busbw_gbps == 330.0
    assert figures[("gcp", "p5.48xlarge")].tflops == {"bf16": 100.0}
    assert store.probes.figures(last=1)[("aws", "p5.48xlarge")].tflops == {"bf16": 1000.0}


def test_streaks_count_failures_among_each_types_last_n_results(store: Store) -> None:
    a = attempt_of(store, "train", kind="g5.xlarge")
    outcomes = ["fail", "fail", "pass", "fail", "warn", "fail"]  # oldest first
    for i, status in enumerate(outcomes):
        report(store, a, f"s{i}", status, probe_json(100.0), T0 + timedelta(minutes=i))
    streak = store.probes.streaks(last=5)[("aws", "g5.xlarge")]
    # The last five: fail, pass, fail, warn, fail.
    assert (streak.failed, streak.of) == (3, 5)
    assert streak.since == T0 + timedelta(minutes=1)
    assert streak.latest_at == T0 + timedelta(minutes=5)
    assert store.probes.streaks(last=2)[("aws", "g5.xlarge")].failed == 1


def test_the_history_pages_newest_first_and_filters_by_type_and_provider(store: Store) -> None:
    a = attempt_of(store, "train")
    b = attempt_of(store, "other", kind="g5.xlarge")
    for i in range(3):
        report(store, a, f"a{i}", "pass", probe_json(700.0), T0 + timedelta(minutes=i))
    report(store, b, "b0", "fail", probe_json(1.0), T0)
    every = store.probes.page()
    assert [p.instance_type for p in every] == [
        "g5.xlarge",
        "p5.48xlarge",
        "p5.48xlarge",
        "p5.48xlarge",
    ]
    first = store.probes.page(instance_type="p5.48xlarge", limit=2)
    rest = store.probes.page(instance_type="p5.48xlarge", before_id=first[-1].id)
    assert [p.at for p in first + rest] == [T0 + timedelta(minutes=m) for m in (2, 1, 0)]
    assert store.probes.page(provider="gcp") == []
    assert every[0].to_dict()["at"] == "2026-01-15T12:00:00Z"


def test_a_handover_stores_no_tflops_and_the_types_tflops_come_from_its_full_results(
    store: Store,
) -> None:
    a = attempt_of(store, "train")
    report(store, a, "q1", "pass", probe_json(650.0, copy=4000.0), T0)
    report(store, a, "q2", "pass", probe_json(660.0, copy=4100.0), T0 + timedelta(hours=1))
    for i in range(3):  # burst bf16 figures far above the sustained ones
        late = T0 + timedelta(hours=2 + i)
        report(store, a, f"h{i}", "pass", probe_json(800.0, copy=4300.0, kind="handover"), late)
    newest = store.probes.page()[0]
    assert (newest.kind, newest.tflops, newest.copy_gbps) == ("handover", {}, 4300.0)
    p5 = store.probes.figures(last=3)[("aws", "p5.48xlarge")]
    # Bandwidths over the last three usable results; TFLOPS over the last three with TFLOPS.
    assert (p5.n, p5.copy_gbps, p5.tflops) == (3, 4300.0, {"bf16": 655.0})
    assert p5.newest_at == T0 + timedelta(hours=4)


def test_a_type_is_probed_in_full_by_a_usable_quick_or_deep_result_measured_on_a_gpu(
    store: Store,
) -> None:
    probed = store.probes.probed_in_full
    a = attempt_of(store, "train")
    assert not probed("aws", "p5.48xlarge", any_source=False)  # first boot
    report(store, a, "f", "fail", probe_json(650.0), T0)
    report(store, a, "h", "pass", probe_json(800.0, kind="handover"), T0)
    assert not probed("aws", "p5.48xlarge", any_source=False)  # a failure, a handover
    report(store, a, "d", "warn", probe_json(650.0, kind="deep"), T0)
    assert probed("aws", "p5.48xlarge", any_source=False)
    assert not probed("gcp", "p5.48xlarge", any_source=False)  # per provider
    cpu = attempt_of(store, "cpu", kind="g5.xlarge")
    report(store, cpu, "c", "warn", probe_json(0.4, backend="cpu", gpus=1), T0)
    # No GPU measured: a cloud type is not probed by it; the local cloud's (this host) is.
    assert not probed("aws", "g5.xlarge", any_source=False)
    assert probed("aws", "g5.xlarge", any_source=True)
