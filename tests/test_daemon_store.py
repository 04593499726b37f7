"""The daemon's records in the store, on SQLite and PostgreSQL: jobs submitted and cancelled
with their events, policy versions, price-signal state and poll status."""

from __future__ import annotations

from datetime import timedelta

import pytest

from optimizer.lifecycle import LIVE_JOB_STATES, TERMINAL_JOB_STATES, JobState
from optimizer.store import (
    DuplicateJobError,
    JobNotEndedError,
    NewEvent,
    PolicyVersionRecord,
    PollStatusRecord,
    Store,
)
from tests.helpers import T0, make_offer

pytestmark = pytest.mark.usefixtures("daemon_env")


def version(path: str, name: str | None, sha: str, outcome: str, text: str | None = None):
    return PolicyVersionRecord(0, path, name, sha, outcome, text, [], T0)


def test_a_job_and_its_event_are_one_transaction(store: Store) -> None:
    event = NewEvent("job.submitted", "submitted", alerts=("ops",))
    job_id = store.jobs.add_job("train", "small", {"run": "x"}, event=event, at=T0)
    job = store.jobs.get_job("train")
    assert job is not None and job.id == job_id
    assert (job.state, job.spec, job.created_at) == ("pending", {"run": "x"}, T0)
    [recorded] = store.events.list_events()
    assert recorded.job_id == job.id and recorded.kind == "job.submitted"
    with pytest.raises(DuplicateJobError):
        store.jobs.add_job("train", "small", {"run": "y"}, event=event, at=T0)
    assert len(store.events.list_events()) == 1  # the refused submit left no event
    assert [a.job_name for a in store.events.due_alerts(T0)] == ["train"]


def test_a_cancel_is_a_request_recorded_once_on_a_job_that_has_not_ended(store: Store) -> None:
    a = store.jobs.add_job("a", "small", {}, at=T0)
    store.jobs.add_job("b", "other", {}, at=T0)
    at = T0 + timedelta(minutes=1)
    job, changed = store.jobs.request_cancel("a", at=at)
    assert changed and job is not None
    assert (job.state, job.cancel_requested_at, job.updated_at) == ("pending", at, at)
    assert store.jobs.request_cancel("a") == (job, False)  # already asked
    assert store.jobs.request_cancel("nope") == (None, False)
    assert store.events.list_events() == []  # the reconciler records `job.cancelled`
    # The reconciler decides the request; only then is the job cancelled.
    cancelled = store.jobs.transition_job(
        a, expected="pending", state="cancelled", reason="cancelled by request", at=at
    )
    assert cancelled is not None and cancelled.state == "cancelled"
    assert [j.name for j in store.jobs.live_jobs()] == ["b"]
    assert store.jobs.policies_in_use() == {"other"}
    assert store.jobs.job_counts() == {"cancelled": 1, "pending": 1}
    assert [j.name for j in store.jobs.jobs_page(limit=1)] == ["b"]
    assert [j.name for j in store.jobs.jobs_page(state="cancelled")] == ["a"]


def test_removing_an_ended_job_frees_its_name_and_keeps_its_row_and_events(
    store: Store,
) -> None:
    first = store.jobs.add_job("train", "small", {"run": "x"}, at=T0)
    with pytest.raises(DuplicateJobError) as taken:
        store.jobs.add_job("train", "small", {}, at=T0)
    assert taken.value.state == "pending" and "(pending)" in str(taken.value)
    event = NewEvent("job.removed", "train removed", alerts=("ops",))
    # Not ended: refused with its state, nothing written.
    with pytest.raises(JobNotEndedError) as live:
        store.jobs.remove_job("train", event=event, at=T0)
    assert live.value.state == "pending"
    assert store.jobs.get_job("train") is not None and store.events.list_events() == []
    store.jobs.transition_job(first, expected="pending", state="failed", reason="x", at=T0)

    at = T0 + timedelta(minutes=5)
    removed = store.jobs.remove_job("train", event=event, at=at)
    assert removed is not None and removed.id == first
    assert (removed.removed_at, removed.state, removed.given_name) == (at, "failed", "train")
    assert removed.name == f"train~removed~{first}"
    assert store.jobs.remove_job("train", event=event) is None  # gone from the names
    assert store.jobs.get_job("train") is None
    assert store.jobs.get_job_by_id(first) == removed  # the row stays, under its id
    assert store.jobs.list_jobs() == [] and store.jobs.jobs_page() == []
    assert store.jobs.job_counts() == {}
    [recorded] = store.events.list_events()
    assert (recorded.kind, recorded.job_id) == ("job.removed", first)
    assert [a.job_name for a in store.events.due_alerts(at)] == ["train"]  # not the row's name

    # The name is free: a re-run is a new job with a new id; the old one keeps its events.
    second = store.jobs.add_job("train", "small", {"run": "y"}, at=at)
    assert second != first
    assert [j.id for j in store.jobs.list_jobs()] == [second]
    assert [e.job_id for e in store.events.list_events(job_id=first)] == [first]


def test_the_store_ends_the_job_states_the_vocabulary_calls_terminal(store: Store) -> None:
    for state in JobState:
        job_id = store.jobs.add_job(state.value, "small", {}, at=T0)
        store.jobs.transition_job(job_id, expected="pending", state=state, reason="", at=T0)
    live = {s.value for s in LIVE_JOB_STATES}
    assert live == {"pending", "provisioning", "probing", "running", "interrupted"}
    assert {job.name for job in store.jobs.live_jobs()} == live
    assert {job.state for job in store.jobs.list_jobs()} == {s.value for s in JobState}
    assert {name for name in live if store.jobs.request_cancel(name)[1]} == live
    assert not any(store.jobs.request_cancel(name)[1] for name in TERMINAL_JOB_STATES)


def test_a_state_write_is_compare_and_set_on_the_state_its_writer_read(store: Store) -> None:
    job_id = store.jobs.add_job("a", "small", {}, at=T0)
    event = NewEvent("job.state_changed", "pending -> provisioning")
    moved = store.jobs.transition_job(
        job_id, expected="pending", state="provisioning", reason="launched", events=[event], at=T0
    )
    assert moved is not None and moved.state == "provisioning"
    # A writer that read `pending` before that write lost the race: nothing is written.
    stale = store.jobs.transition_job(
        job_id, expected="pending", state="failed", reason="stale", events=[event], at=T0
    )
    assert stale is None
    job = store.jobs.get_job("a")
    assert job is not None and (job.state, job.reason) == ("provisioning", "launched")
    assert len(store.events.list_events()) == 1  # the lost write recorded no event


def test_policy_versions_say_what_is_in_force(store: Store) -> None:
    store.policies.record_policy_changes(
        [
            version("/p/a.yaml", "a", "1", "loaded", "text-1"),
            version("/p/b.yaml", "b", "2", "loaded", "text-2"),
        ],
        [NewEvent("policy.loaded", "a loaded")],
    )
    store.policies.record_policy_changes([version("/p/a.yaml", None, "3", "rejected")])
    store.policies.record_policy_changes([version("/p/b.yaml", "b", "2", "removed")])
    assert {p: v.outcome for p, v in store.policies.latest_policy_versions().items()} == {
        "/p/a.yaml": "rejected",
        "/p/b.yaml": "removed",
    }
    assert store.policies.last_loaded_version("/p/a.yaml").text == "text-1"
    assert list(store.policies.policies_in_force()) == ["a"]
    assert [v.outcome for v in store.policies.policy_versions("b")] == ["removed", "loaded"]
    assert [e.kind for e in store.events.list_events()] == ["policy.loaded"]


def test_price_signal_state_is_replaced_whole_with_its_events(store: Store) -> None:
    store.policies.save_price_signal("small", {"best_usd": 1.0}, at=T0)
    store.policies.save_price_signal(
        "small", {"best_usd": 0.7}, [NewEvent("price.dropped", "m")], at=T0
    )
    assert store.policies.price_signals() == {"small": {"best_usd": 0.7}}
    store.policies.save_price_signal("small", None)
    assert store.policies.price_signals() == {}
    assert [e.kind for e in store.events.list_events()] == ["price.dropped"]


def test_poll_status_is_upserted_per_provider_region_and_market(store: Store) -> None:
    failing = PollStatusRecord("aws", "us-east-1", "spot", T0, None, 1.5, 0, 1, "AuthError: x")
    store.policies.save_poll_status(failing, [NewEvent("poll.failed", "m", alerts=("ops",))])
    ok = PollStatusRecord(
        "aws", "us-east-1", "spot", T0 + timedelta(minutes=10), T0, 0.2, 9, 0, None
    )
    store.policies.save_poll_status(ok)
    store.policies.save_poll_status(
        PollStatusRecord("aws", "*", "on_demand", T0, T0, 3.0, 4, 0, None)
    )
    assert store.policies.poll_statuses() == [
        PollStatusRecord("aws", "*", "on_demand", T0, T0, 3.0, 4, 0, None),
        ok,
    ]
    assert len(store.events.due_alerts(T0)) == 1


def test_offer_counts_by_provider_and_market(store: Store) -> None:
    store.prices.record_offers(
        [make_offer(), make_offer(zone="use1-az2"), make_offer(provider="gcp", zone=None)]
    )
    assert store.prices.offer_counts() == {("aws", "spot"): 2, ("gcp", "spot"): 1}
