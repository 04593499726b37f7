"""The billing facts the reconciler records on each attempt (the provider's launch and
termination times, who ended the instance, the root volume), and who ends an interrupted
spot instance: the cloud, when its own end costs less than gpuopt's terminate.

The reconciler runs here one pass at a time against a fake cloud on a ManualClock; the cloud
keeps its own record of each instance's launch and end, as a real one does."""

from __future__ import annotations

from datetime import timedelta

from optimizer.store import Store
from providers.base import InstanceRef
from tests.helpers.billing_world import BOOT, NOW, World


def test_the_launch_records_the_root_volume_and_describe_the_providers_launch_time(
    store: Store,
) -> None:
    w = World(store)
    w.run()  # launches attempt 1
    first = w.attempt(1)
    assert first.disk_gib == 200  # LaunchSpec's root volume, GiB
    assert first.launched_at is None  # not described yet
    w.clock.advance(5)
    w.run()
    cloud_says = w.cloud.instances[f"i-{first.key}"].launched_at
    assert w.attempt(1).launched_at == cloud_says == NOW + BOOT
    # a later describe that says another time, or none, changes nothing: the first stays
    w.cloud.instances[f"i-{first.key}"].launched_at = NOW + timedelta(hours=1)
    w.run()
    w.cloud.hide_launch = True
    w.run()
    assert w.attempt(1).launched_at == NOW + BOOT


def test_an_instance_gpuopt_terminates_is_gpuopts_with_the_clouds_time(store: Store) -> None:
    w = World(store)
    w.running()
    w.clock.advance(600)
    w.report(1, "job_exited", exit_code=0)
    w.run()  # succeeded: gpuopt terminates the instance
    key = w.attempt(1).key
    assert w.cloud.terminated == [f"i-{key}"]
    done = w.attempt(1)
    assert (done.terminated_by, done.terminated_at, done.instance_gone) == ("gpuopt", None, False)
    w.clock.advance(3)
    w.run()  # describe sees it gone, at the time the cloud says
    gone = w.attempt(1)
    assert gone.instance_gone and not gone.preempted
    assert (gone.terminated_by, gone.terminated_at) == ("gpuopt", NOW + timedelta(seconds=630))
    assert gone.launched_at == NOW + BOOT


def test_an_interrupted_spot_instance_in_its_first_hour_is_left_for_the_cloud_to_end(
    store: Store,
) -> None:
    w = World(store)
    w.running()
    w.clock.advance(20 * 60)
    off = w.interrupt()
    w.run()  # attempt 1 ends; attempt 2 launches; the old job keeps running meanwhile
    old = w.attempt(1)
    assert old.ended and w.attempt(2).instance_id is not None
    w.clock.advance(100)
    w.run()  # the power-off is within the job's checkpoint allowance (20 s): stop it
    assert w.attempt(1).stop_sent_at is not None
    w.clock.advance(5)
    w.report(1, "job_exited", exit_code=143, stopped=True)
    for _ in range(3):  # passes while the cloud has not powered it off yet
        w.run()
        w.clock.advance(4)
    instance = f"i-{old.key}"
    assert instance not in w.cloud.terminated  # gpuopt left it to the cloud
    (event,) = w.left()  # said once, however many passes
    assert event.data is not None and event.data["attempt_key"] == old.key
    assert event.data["power_off_at"] == off.isoformat()
    assert "costs nothing" in event.message and event.policy == "p"

    w.clock.set(off)
    w.cloud.silent.add(instance)  # EC2 names no time for its reclaim
    w.cloud.reclaim(instance)
    w.clock.advance(4)
    w.run()
    gone = w.attempt(1)
    assert gone.instance_gone and gone.preempted
    # the notice's action time, not when gpuopt happened to look
    assert (gone.terminated_by, gone.terminated_at) == ("cloud", off)
    assert instance not in w.cloud.terminated and len(w.left()) == 1


def test_past_its_first_hour_gpuopt_terminates_it_once_the_job_has_exited(store: Store) -> None:
    w = World(store)
    w.running()
    w.clock.advance(59 * 60)  # the power-off two minutes on is past the launch's hour
    w.interrupt()
    w.run()
    w.clock.advance(100)
    w.run()
    w.report(1, "job_exited", exit_code=143, stopped=True)
    w.run()
    old = w.attempt(1)
    assert w.cloud.terminated == [f"i-{old.key}"] and old.terminated_by == "gpuopt"
    assert w.left() == []
    w.clock.advance(2)
    w.run()
    w.run()
    gone = w.attempt(1)
    assert gone.instance_gone and gone.terminated_at == w.cloud.instances[f"i-{old.key}"].ended_at
    assert w.cloud.terminated == [f"i-{old.key}"]  # asked once


def test_an_instance_the_cloud_does_not_end_is_terminated_after_the_margin(
    store: Store,
) -> None:
    w = World(store)
    w.running()
    off = w.interrupt()
    w.run()
    w.clock.advance(100)
    w.report(1, "job_exited", exit_code=143, stopped=True)
    instance = f"i-{w.attempt(1).key}"
    while w.clock() < off + timedelta(minutes=2):
        w.run()
        assert instance not in w.cloud.terminated
        w.clock.advance(10)
    w.run()  # two minutes past the power-off and still running: nothing may leak
    assert w.cloud.terminated == [instance] and w.attempt(1).terminated_by == "gpuopt"


def test_a_gcp_preemption_is_left_to_gcp(store: Store) -> None:
    w = World(store, provider="gcp")
    w.running()
    w.clock.advance(3600)  # long past GCP's first minute
    seen = w.clock()
    w.report(1, "interruption_notice", action="preempted", time=seen.isoformat())
    w.run()
    w.clock.advance(1)
    w.run()  # within the allowance of the 30 s: stopped at once
    w.report(1, "job_exited", exit_code=143, stopped=True)
    w.run()
    instance = f"i-{w.attempt(1).key}"
    assert instance not in w.cloud.terminated
    (event,) = w.left()
    assert "already ending it" in event.message
    w.clock.set(seen + timedelta(seconds=30))
    w.cloud.reclaim(instance)
    w.run()
    gone = w.attempt(1)
    assert (gone.terminated_by, gone.terminated_at) == ("cloud", seen + timedelta(seconds=30))


def test_an_instance_gone_without_a_time_or_a_notice_ended_when_gpuopt_saw_it(
    store: Store,
) -> None:
    w = World(store)
    w.running()
    instance = f"i-{w.attempt(1).key}"
    w.clock.advance(300)
    w.cloud.silent.add(instance)
    w.cloud.terminate(InstanceRef("aws", "us-east-1", "use1-az1", instance))  # someone else
    w.cloud.terminated.clear()
    w.clock.advance(8)
    w.run()
    gone = w.attempt(1)
    assert gone.instance_gone and gone.terminated_at == NOW + timedelta(seconds=338)
    assert gone.terminated_by is None  # neither the cloud's interruption nor gpuopt's call


def test_a_terminate_call_that_fails_is_asked_again_next_pass(store: Store) -> None:
    from providers.base import ThrottledError

    w = World(store)
    w.running()
    instance = f"i-{w.attempt(1).key}"
    calls: list[str] = []
    terminate = w.cloud.terminate

    def throttled(ref: InstanceRef) -> None:  # the API refuses the first two calls
        calls.append(ref.instance_id)
        if len(calls) <= 2:
            raise ThrottledError("slow down", provider="aws", code="RequestLimitExceeded")
        terminate(ref)

    w.cloud.terminate = throttled  # type: ignore[method-assign]
    w.report(1, "job_exited", exit_code=0)
    w.run()  # succeeded; the terminate call fails, and so does the leftover sweep's
    assert calls == [instance] * 2 and w.attempt(1).terminated_by is None
    w.run()  # asked again, and recorded
    assert calls == [instance] * 3 and w.attempt(1).terminated_by == "gpuopt"
    w.run()
    w.run()  # gone: asked no more
    assert calls == [instance] * 3 and w.attempt(1).instance_gone
