"""The local cloud as a Provider: instances are real processes; launches are idempotent;
interruptions, terminations and exits end them with the right reason; faults are injected."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from optimizer.clock import ManualClock, SteadyClock
from optimizer.common.procs import proc_start_ticks
from optimizer.model import Market, Offer
from providers.base import (
    CapacityError,
    EndReason,
    InstanceState,
    LaunchSpec,
    Provider,
    QuotaError,
)
from providers.local import LocalCloud
from providers.local.procs import marked_pids
from tests.helpers import T0, local_cloud, wait_until


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[LocalCloud]:
    with local_cloud(tmp_path / "cloud", tick_s=0.05, grace_s=30, terminate_grace_s=5) as local:
        yield local


@pytest.fixture
def clocked_cloud(tmp_path: Path) -> Iterator[tuple[LocalCloud, ManualClock]]:
    """A local cloud whose clock moves only when the test moves it."""
    clock = ManualClock(T0)
    with local_cloud(tmp_path / "cloud", tick_s=0.05, clock=lambda: clock().timestamp()) as local:
        yield local, clock


def offer(cloud: LocalCloud, instance_type: str = "g5.xlarge", market=Market.SPOT) -> Offer:
    return next(
        o
        for o in cloud.fetch_offers(["eu-west-1"])
        if o.instance_type == instance_type and o.market is market
    )


def spec(bootstrap: str = "sleep 60") -> LaunchSpec:
    return LaunchSpec(job="j", attempt=1, bootstrap=bootstrap)


def processes(cloud: LocalCloud, ref) -> list[int]:
    """The live processes that carry the instance's mark (its own and its children's)."""
    record = cloud.state.load(ref.instance_id)
    assert record is not None and record.mark
    return marked_pids(record.mark)


def ended(cloud: LocalCloud, ref):
    return wait_until(
        lambda: (s := cloud.describe([ref])[0]).state is InstanceState.TERMINATED and s,
        what=f"{ref.instance_id} to end",
    )


def test_the_local_cloud_is_a_provider(cloud: LocalCloud) -> None:
    assert isinstance(cloud, Provider) and cloud.name == "local"


def test_a_launch_runs_the_bootstrap_as_a_process_with_its_metadata_url(
    cloud: LocalCloud,
) -> None:
    script = (
        'echo "$GPUOPT_CLOUD $GPUOPT_METADATA_URL ${GPUOPT_CLOCK_OFFSET_S-unset}"; '
        'echo "$HOME"; echo "$TMPDIR"; python -c "import tempfile; print(tempfile.gettempdir())"; '
        "sleep 60"
    )
    ref = cloud.launch(offer(cloud), spec(script), "j/1")
    assert (ref.provider, ref.region, ref.zone) == ("local", "eu-west-1", "eu-west-1-a")
    status = cloud.describe([ref])[0]
    assert status.state is InstanceState.RUNNING and status.end_reason is None
    disk = cloud.state.disk(ref.instance_id)
    console = disk / "console.log"
    lines = wait_until(
        lambda: len(out := console.read_text().splitlines()) >= 4 and out,
        what="the console output",
    )
    # on the wall clock: no offset for the machine's clock
    assert lines[0] == f"local {cloud.metadata_url(ref.instance_id)} unset"
    # a home and a temporary folder on its own disk, shared with no other instance
    assert lines[1:] == [str(disk / "home"), str(disk / "tmp"), str(disk / "tmp")]
    assert (disk / "home").is_dir() and (disk / "tmp").is_dir()
    record = cloud.state.load(ref.instance_id)
    assert record is not None and record.pid is not None
    assert os.getpgid(record.pid) == record.pid  # a session of its own


def test_the_instances_of_a_cloud_on_a_clock_of_its_own_keep_its_time(tmp_path: Path) -> None:
    clock = SteadyClock(T0)
    print_now = "from optimizer.clock import machine_now; print(machine_now().isoformat())"
    script = f"{sys.executable} -c '{print_now}'; sleep 60"
    with local_cloud(tmp_path / "cloud", tick_s=0.05, clock=clock.epoch) as cloud:
        ref = cloud.launch(offer(cloud), spec(script), "j/1")
        console = cloud.state.disk(ref.instance_id) / "console.log"
        line = wait_until(lambda: console.read_text().strip(), what="the machine's time")
        seen = datetime.fromisoformat(line)
        # the cloud's time when the machine read it, to the offset's millisecond
        assert T0 - timedelta(seconds=0.01) <= seen <= clock() + timedelta(seconds=0.01)


def test_launching_twice_with_one_key_gives_one_instance(cloud: LocalCloud) -> None:
    refs = []
    threads = [
        threading.Thread(target=lambda: refs.append(cloud.launch(offer(cloud), spec(), "j/1")))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({r.instance_id for r in refs}) == 1
    assert len(cloud.state.all()) == 1
    leaders = [p for p in processes(cloud, refs[0]) if os.getpgid(p) == p]
    assert len(leaders) == 1  # one instance process (its shell may have a child)
    other = cloud.launch(offer(cloud), spec(), "j/2")
    assert other.instance_id != refs[0].instance_id


def test_an_injected_capacity_error_fails_the_next_matching_launch_only(cloud: LocalCloud) -> None:
    cloud.fail_next("g5.xlarge", CapacityError)
    cloud.fail_next("eu-west-1", "quota")
    with pytest.raises(CapacityError) as caught:
        cloud.launch(offer(cloud), spec(), "j/1")
    assert caught.value.code == "InsufficientInstanceCapacity"
    assert caught.value.zone == "eu-west-1-a" and caught.value.provider == "local"
    with pytest.raises(QuotaError):
        cloud.launch(offer(cloud, "g4dn.xlarge"), spec(), "j/1")
    ref = cloud.launch(offer(cloud), spec(), "j/1")  # the key was not used up by the failures
    assert cloud.describe([ref])[0].state is InstanceState.RUNNING
    assert cloud.state.faults() == []


def test_a_pool_can_be_failed_exactly(cloud: LocalCloud) -> None:
    spot = offer(cloud)
    cloud.fail_next(spot.pool, "capacity", times=2)
    on_demand = offer(cloud, market=Market.ON_DEMAND)
    cloud.launch(on_demand, spec(), "od/1")  # another pool: unaffected
    for key in ("j/1", "j/2"):
        with pytest.raises(CapacityError):
            cloud.launch(spot, spec(), key)
    cloud.launch(spot, spec(), "j/3")


def test_an_interruption_posts_the_notice_at_once_and_powers_off_after_the_grace(
    clocked_cloud: tuple[LocalCloud, ManualClock],
) -> None:
    cloud, clock = clocked_cloud  # the notice stays out until the clock passes the grace
    # The instance starts a child in a session of its own, as the agent does with the job.
    script = "setsid sleep 60 & sleep 60"
    ref = cloud.launch(offer(cloud), spec(script), "j/1")
    wait_until(lambda: len(processes(cloud, ref)) >= 2, what="both processes")
    cloud.interrupt(ref.instance_id, grace_s=0.5)
    url = cloud.metadata_url(ref.instance_id)
    token = httpx.put(
        f"{url}/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    ).text
    notice = httpx.get(
        f"{url}/latest/meta-data/spot/instance-action",
        headers={"X-aws-ec2-metadata-token": token},
    )
    assert notice.status_code == 200 and notice.json()["action"] == "terminate"
    marked = cloud.describe([ref])[0]  # AWS's marked-for-termination, meanwhile
    assert (marked.state, marked.end_reason) == (InstanceState.RUNNING, EndReason.PREEMPTED)
    assert marked.detail.startswith("marked-for-termination")
    clock.advance(seconds=0.5)
    status = ended(cloud, ref)
    assert status.end_reason is EndReason.PREEMPTED
    wait_until(lambda: processes(cloud, ref) == [], what="every process to be gone")


def test_two_local_clouds_on_one_host_never_touch_each_others_processes(
    tmp_path: Path,
) -> None:
    """Both number their instances from i-local-0001: powering one cloud's instance off (an
    interruption, then kill_all at teardown) must leave the other's processes running."""
    script = "setsid sleep 60 & sleep 60"  # a child in a session of its own, as the job is
    with (
        local_cloud(tmp_path / "one", tick_s=0.05) as one,
        local_cloud(tmp_path / "two", tick_s=0.05) as two,
    ):
        ref_one = one.launch(offer(one), spec(script), "j/1")
        ref_two = two.launch(offer(two), spec(script), "j/1")
        assert ref_one.instance_id == ref_two.instance_id == "i-local-0001"
        pids_one = wait_until(lambda: len(p := processes(one, ref_one)) >= 2 and p, what="one")
        pids_two = wait_until(lambda: len(p := processes(two, ref_two)) >= 2 and p, what="two")
        assert not set(pids_one) & set(pids_two)  # neither cloud sees the other's as its own

        one.interrupt(ref_one.instance_id, grace_s=0)
        assert ended(one, ref_one).end_reason is EndReason.PREEMPTED
        one.kill_all()
        wait_until(lambda: processes(one, ref_one) == [], what="cloud one's processes to go")
        assert all(proc_start_ticks(pid) is not None for pid in pids_two)
        assert set(pids_two) <= set(processes(two, ref_two))
        assert two.describe([ref_two])[0].state is InstanceState.RUNNING

        two.terminate(ref_two)  # and cloud two still powers off its own, all of them
        assert ended(two, ref_two).end_reason is EndReason.USER
        wait_until(lambda: processes(two, ref_two) == [], what="cloud two's processes to go")
        assert all(proc_start_ticks(pid) is None for pid in pids_two)


def test_terminate_sends_sigterm_then_ends_the_instance_as_gpuopts_doing(cloud: LocalCloud) -> None:
    script = "trap 'echo got-term; exit 0' TERM; echo trapped; sleep 60 & wait"
    ref = cloud.launch(offer(cloud), spec(script), "j/1")
    console = cloud.state.disk(ref.instance_id) / "console.log"
    # A SIGTERM that lands before the shell has set its trap would kill it silently.
    wait_until(lambda: "trapped" in console.read_text(), what="the trap to be set")
    cloud.terminate(ref)
    status = ended(cloud, ref)
    assert status.end_reason is EndReason.USER and status.detail == "terminated by gpuopt"
    assert "got-term" in console.read_text()
    cloud.terminate(ref)  # terminating again is harmless


def test_exit_statuses_tell_a_shutdown_from_a_failure(cloud: LocalCloud) -> None:
    done = cloud.launch(offer(cloud), spec("exit 0"), "j/1")
    failed = cloud.launch(offer(cloud), spec("exit 3"), "j/2")
    assert ended(cloud, done).end_reason is EndReason.USER
    status = ended(cloud, failed)
    assert status.end_reason is EndReason.FAILED and "status 3" in status.detail
    unknown = cloud.describe([dataclasses.replace(done, instance_id="i-local-0099")])[0]
    assert unknown.state is InstanceState.TERMINATED


def test_a_seeded_random_rate_interrupts_spot_instances_only(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    local = LocalCloud(
        tmp_path / "cloud",
        clock=lambda: now[0],
        interruption_rate_per_hour=50.0,
        tick_s=0.02,
        grace_s=30,
    )
    local.start()
    try:
        spot = local.launch(offer(local), spec(), "spot/1")
        on_demand = local.launch(offer(local, market=Market.ON_DEMAND), spec(), "od/1")
        wait_until(lambda: local._last_tick is not None, what="a first tick")
        now[0] += 3600  # an hour at 50 per hour: certain
        wait_until(
            lambda: local.describe([spot])[0].end_reason is EndReason.PREEMPTED,
            what="a random interruption",
        )
        now[0] += 31  # past the grace: powered off
        assert ended(local, spot).end_reason is EndReason.PREEMPTED
        assert local.describe([on_demand])[0].state is InstanceState.RUNNING
    finally:
        local.kill_all()
        local.close()


def test_a_new_cloud_on_the_same_state_takes_over_the_instances_and_port(tmp_path: Path) -> None:
    first = LocalCloud(tmp_path / "cloud", tick_s=0.05)
    ref = first.launch(offer(first), spec(), "j/1")
    port = first.metadata.port
    first.close()  # the daemon stops; the instance runs on
    second = LocalCloud(tmp_path / "cloud", tick_s=0.05)
    try:
        assert second.describe([ref])[0].state is InstanceState.RUNNING
        assert second.metadata.port == port  # the instance's metadata URL still works
        assert second.launch(offer(second), spec(), "j/1") == ref
        second.interrupt(ref.instance_id, grace_s=0.2)
        status = ended(second, ref)
        # Launched by another process: the exit status is unknown, the reason is not.
        assert status.end_reason is EndReason.PREEMPTED
    finally:
        second.kill_all()
        second.close()


def gpuopt(*args: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUOPT_DATA_DIR": str(data_dir), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_gpuopt_local_commands_reach_the_running_cloud(tmp_path: Path) -> None:
    local = LocalCloud(tmp_path / "local-cloud", tick_s=0.05, grace_s=0.5)
    try:
        ref = local.launch(offer(local), spec(), "train/1")
        listed = gpuopt("local", "list", data_dir=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert ref.instance_id in listed.stdout and "sim" in listed.stdout

        done = gpuopt("local", "interrupt", ref.instance_id, data_dir=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "power-off at" in done.stdout
        # The running cloud sees it: the notice at once, the power-off after its 0.5 s grace.
        assert local.describe([ref])[0].end_reason is EndReason.PREEMPTED
        assert ended(local, ref).end_reason is EndReason.PREEMPTED

        failing = gpuopt("local", "fail-next", "g5.xlarge", "--times", "1", data_dir=tmp_path)
        assert failing.returncode == 0, failing.stderr
        with pytest.raises(CapacityError):
            local.launch(offer(local), spec(), "train/2")

        missing = gpuopt("local", "interrupt", "i-local-0042", data_dir=tmp_path)
        assert missing.returncode == 2 and "no local instance" in missing.stderr
        again = gpuopt("local", "interrupt", ref.instance_id, data_dir=tmp_path)
        assert again.returncode == 2 and "already ended" in again.stderr
    finally:
        local.kill_all()
        local.close()


def test_another_process_leaves_the_end_to_the_launcher_that_knows_the_status(
    tmp_path: Path,
) -> None:
    local = LocalCloud(tmp_path / "local-cloud", tick_s=3600)  # no ticks: refreshes on demand
    try:
        ref = local.launch(offer(local), spec("exit 3"), "j/1")
        record = local.state.load(ref.instance_id)
        assert record is not None and record.pid is not None
        wait_until(lambda: proc_start_ticks(record.pid) is None, what="the process to exit")
        listed = gpuopt("local", "list", "--all", "--json", data_dir=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert '"state": "running"' in listed.stdout  # not finalised with an unknown status
        status = local.describe([ref])[0]
        assert status.end_reason is EndReason.FAILED and "status 3" in status.detail
    finally:
        local.kill_all()
        local.close()


# --- billing facts: launch and termination times, and who ended the instance -----------------


def test_describe_reports_the_launch_and_the_interruptions_power_off_time(
    clocked_cloud: tuple[LocalCloud, ManualClock], tmp_path: Path
) -> None:
    """An AWS spot VM whose agent exits after a notice idles until EC2 powers it off; so does
    a local instance, which then ends at the notice's power-off time exactly."""
    cloud, clock = clocked_cloud
    ref = cloud.launch(offer(cloud), spec("sleep 60"), "j/1")
    running = cloud.describe([ref])[0]
    assert running.launched_at == T0 and running.terminated_at is None
    clock.advance(seconds=10)
    cloud.interrupt(ref.instance_id, grace_s=120)
    record = cloud.state.load(ref.instance_id)
    assert record is not None and record.pid is not None
    os.kill(record.pid, 15)  # the guest's own process ends: the agent exiting after its job
    wait_until(lambda: proc_start_ticks(record.pid) is None, what="the process to exit")
    clock.advance(seconds=60)  # still before the power-off
    idle = cloud.describe([ref])[0]
    assert (idle.state, idle.end_reason) == (InstanceState.RUNNING, EndReason.PREEMPTED)
    assert idle.detail.startswith("marked-for-termination")
    clock.advance(seconds=61)  # 1 s past it
    status = ended(cloud, ref)
    assert status.end_reason is EndReason.PREEMPTED
    power_off = T0 + timedelta(seconds=130)
    assert (status.launched_at, status.terminated_at) == (T0, power_off)
    final = cloud.state.load(ref.instance_id)
    assert final is not None and final.exit_code == -15  # what the guest's process ended with

    listed = gpuopt(
        "local",
        "list",
        "--all",
        "--json",
        "--state-dir",
        str(tmp_path / "cloud"),
        data_dir=tmp_path,
    )
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["launched_at"] == T0.timestamp()
    assert row["terminated_at"] == power_off.timestamp()
    assert row["end_reason"] == "preempted"


def test_a_terminate_during_a_notice_is_the_users_and_ends_billing_at_the_call(
    clocked_cloud: tuple[LocalCloud, ManualClock],
) -> None:
    cloud, clock = clocked_cloud
    ref = cloud.launch(offer(cloud), spec("sleep 60"), "j/1")
    clock.advance(seconds=20)
    cloud.interrupt(ref.instance_id, grace_s=120)
    clock.advance(seconds=5)
    cloud.terminate(ref)  # before the power-off: the user ends it, and pays for it
    status = ended(cloud, ref)  # sleep dies of the SIGTERM at once
    assert status.end_reason is EndReason.USER and status.detail == "terminated by gpuopt"
    assert status.launched_at == T0
    assert status.terminated_at == T0 + timedelta(seconds=25)


def test_a_plain_terminate_and_an_exit_report_their_own_times(
    clocked_cloud: tuple[LocalCloud, ManualClock],
) -> None:
    cloud, clock = clocked_cloud
    kept = cloud.launch(offer(cloud), spec("sleep 60"), "j/1")
    clock.advance(seconds=3)
    done = cloud.launch(offer(cloud), spec("exit 0"), "j/2")
    clock.advance(seconds=4)
    cloud.terminate(kept)
    clock.advance(seconds=2)
    stopped = ended(cloud, kept)
    assert (stopped.launched_at, stopped.terminated_at) == (T0, T0 + timedelta(seconds=7))
    exited = ended(cloud, done)
    assert exited.launched_at == T0 + timedelta(seconds=3)
    # an instance that shut itself down ended when the cloud saw its process gone
    record = cloud.state.load(done.instance_id)
    assert record is not None and record.ended_at is not None
    assert exited.terminated_at == datetime.fromtimestamp(record.ended_at, UTC)
    assert T0 + timedelta(seconds=3) <= exited.terminated_at <= T0 + timedelta(seconds=9)


def test_injected_telemetry_defaults_to_the_instance_types_gpus(cloud: LocalCloud) -> None:
    """`gpuopt local telemetry` without --gpus/--memory-gib reports the instance's own GPUs
    (a g5.12xlarge: 4 x A10G of its offer's memory), not one 80 GiB GPU."""
    big = offer(cloud, "g5.12xlarge")
    assert (big.gpu_count, big.gpu_memory_gib) != (1, 80.0)
    ref = cloud.launch(big, spec(), "k-telemetry")
    record = cloud.inject_telemetry(ref.instance_id, util=0.5, memory=0.1, interval_s=1)
    shown = record.extra["telemetry"]
    assert (shown["gpus"], shown["memory_gib"]) == (big.gpu_count, big.gpu_memory_gib)
    # Told otherwise, it reports what it is told; an instance recorded before its launch kept
    # its GPUs finds them in its type's offer.
    record = cloud.inject_telemetry(ref.instance_id, util=0.5, gpus=1, memory_gib=16.0)
    assert (record.extra["telemetry"]["gpus"], record.extra["telemetry"]["memory_gib"]) == (1, 16.0)
    with cloud.state.locked():
        old = cloud.state.load(ref.instance_id)
        assert old is not None
        old.extra.pop("gpus")
        cloud.state.save(old)
    record = cloud.inject_telemetry(ref.instance_id, util=0.5)
    shown = record.extra["telemetry"]
    assert (shown["gpus"], shown["memory_gib"]) == (big.gpu_count, big.gpu_memory_gib)
    cloud.terminate(ref)
