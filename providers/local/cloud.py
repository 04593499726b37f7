"""The local cloud: gpuopt's embedded default provider, instances as local processes.

`launch` runs the attempt's bootstrap script with `/bin/sh -c` in a session of its own, with
`GPUOPT_METADATA_URL` pointing at the instance's own prefix of the metadata endpoint and
`GPUOPT_CLOUD=local`. Interruptions come from `interrupt()` (also `gpuopt local interrupt`,
from any process) or from a seeded random rate: the notice shows on the metadata endpoint at
once, and the instance is powered off `grace_s` later (30 s by default, GCP's spot window).

The cloud that launched the instances runs a ticker thread next to the metadata server: it
enforces power-off deadlines, notices ended processes and draws random interruptions. The
ticker polls the state directory (every `tick_s`), which is how requests written by other
processes (an interruption from the CLI) take effect; the metadata server reads the same
files on every request, so a notice never waits for a tick.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from optimizer.clock import CLOCK_OFFSET_ENV
from optimizer.common.environ import basic_env
from optimizer.common.files import append_private, private_dir
from optimizer.common.procs import proc_start_ticks, signal_group
from optimizer.model import Offer
from providers.base import (
    CapacityError,
    EndReason,
    InstanceRef,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    ProviderError,
)
from providers.local import market
from providers.local.faults import add_fault, take_fault
from providers.local.metadata import MetadataServer, iso
from providers.local.prices import SpotWalk, local_offers, zones_of
from providers.local.procs import MARK_ENV, alive, instance_mark, power_off
from providers.local.state import InstanceRecord, Interruption, StateDir
from providers.local.trace import CapacityTrace

log = logging.getLogger(__name__)

LAUNCHER_WAIT_S = 2.0  # how long another process waits for the launcher to record an end


def _pool_name(record: InstanceRecord) -> str:
    """The market controls' name of an instance's pool (market.pool_name's spelling)."""
    where = record.zone if record.market == "spot" else record.region
    return f"{record.instance_type}@{where}"


def _utc(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


TELEMETRY = "telemetry"  # InstanceRecord.extra key of the injected GPU readings
GPUS = "gpus"  # InstanceRecord.extra key: the type's GPU count and GiB each, from its offer


class LocalCloud:
    """A Provider whose instances are processes on this machine (see the module docstring)."""

    name = "local"
    problems: tuple[str, ...] = ()  # simulated offers: nothing goes wrong short of failing

    def __init__(
        self,
        state_dir: Path | str,
        *,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        interruption_rate_per_hour: float = 0.0,
        spot_discount: tuple[float, float] = (0.3, 0.7),
        grace_s: float = 30.0,
        terminate_grace_s: float = 10.0,
        tick_s: float = 0.2,
        snapshot: Sequence[Offer] | None = None,
    ) -> None:
        self.state = StateDir(Path(state_dir))
        self.clock = clock or time.time
        self.rate_per_hour = interruption_rate_per_hour
        self.walk = SpotWalk(seed, spot_discount)
        self.grace_s = grace_s
        self.terminate_grace_s = terminate_grace_s
        self.tick_s = tick_s
        self._snapshot = list(snapshot) if snapshot is not None else None
        self._rng = random.Random(f"interruptions|{seed}")
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.RLock()
        self._server: MetadataServer | None = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._last_tick: float | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> LocalCloud:
        """Start the metadata endpoint and the ticker (idempotent; launch/describe call it).

        The endpoint takes the port recorded by an earlier run when it is free, so instances
        that outlived a daemon restart keep reaching their metadata.
        """
        with self._lock:
            if self._server is not None:
                return self
            self.state.ensure()
            port = int(self.state.settings().get("metadata_port") or 0)
            self._server = MetadataServer(self.state, clock=self.clock, port=port).start()
            self.state.save_settings(
                {"metadata_port": self._server.port, "grace_s": self.grace_s, "pid": os.getpid()}
            )
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick_loop, name="local-cloud", daemon=True)
            self._ticker.start()
        return self

    def resume(self) -> None:
        """Start the endpoint and the ticker when an instance is still running (one that
        outlived the daemon that launched it: a leader killed, a restart); else nothing, and
        the first launch starts them."""
        if self._server is None and any(not record.ended for record in self.state.all()):
            self.start()

    def close(self) -> None:
        """Stop the endpoint and ticker; instances keep running (as across a daemon restart)."""
        # Join the ticker without holding the lock: a tick in progress needs it to finish.
        self._stop.set()
        ticker = self._ticker
        if ticker is not None and ticker is not threading.current_thread():
            ticker.join()
        with self._lock:
            self._ticker = None
            if self._server is not None:
                self._server.close()
                self._server = None

    def __enter__(self) -> LocalCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def metadata(self) -> MetadataServer:
        self.start()
        assert self._server is not None
        return self._server

    def metadata_url(self, instance_id: str) -> str:
        return self.metadata.instance_url(instance_id)

    # --- Provider ----------------------------------------------------------------------

    def offers_at(self, t: float) -> list[Offer]:
        """Every region's offers as they were at epoch time `t` (no pins: a price history,
        `providers/local/history.py`)."""
        return local_offers(self._load_snapshot(), self.walk, t)

    def _load_snapshot(self) -> list[Offer]:
        if self._snapshot is None:
            from providers.snapshot import load_snapshot

            self._snapshot = load_snapshot()
        return self._snapshot

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        snapshot = self._load_snapshot()
        now = self.clock()
        if self._server is not None:  # the running cloud starts pins' clocks
            market.stamp(self.state, now)
        pins = market.load(self.state).prices(now)
        return local_offers(snapshot, self.walk, now, regions, pins)

    def launch(self, offer: Offer, spec: LaunchSpec, idempotency_key: str) -> InstanceRef:
        if offer.provider != self.name:
            raise ProviderError(
                f"not a local offer: {offer.provider}", provider=self.name, code="InvalidOffer"
            )
        url = self.metadata.url
        with self._lock, self.state.locked():
            existing = self.state.by_key(idempotency_key)
            if existing is not None:
                return self._ref(existing)
            self._capacity(offer)
            take_fault(self.state, offer)
            record = InstanceRecord(
                id=self.state.next_id(),
                key=idempotency_key,
                region=offer.region,
                zone=offer.zone or zones_of(offer.region)[0],
                instance_type=offer.instance_type,
                market=offer.market.value,
                usd_per_hour=offer.usd_per_hour,
                launched_at=self.clock(),
                job=spec.job,
                attempt=spec.attempt,
            )
            # The type's GPUs, which injected telemetry reports unless told otherwise.
            record.extra[GPUS] = {"count": offer.gpu_count, "memory_gib": offer.gpu_memory_gib}
            if spec.gang is not None:
                # One host: a gang's nodes share the zone, and its placement is only a name.
                record.extra["placement"] = spec.gang.placement
                record.extra["node_rank"] = spec.gang.rank
            self.state.save(record)  # the key is taken before anything starts
            self._spawn(record, spec.bootstrap, f"{url}/{record.id}")
            return self._ref(record)

    def describe(self, refs: Iterable[InstanceRef]) -> list[InstanceStatus]:
        self.start()
        out = []
        for ref in refs:
            record = self._refresh(ref.instance_id)
            if record is None:
                out.append(
                    InstanceStatus(ref, InstanceState.TERMINATED, EndReason.USER, "not found")
                )
            else:
                out.append(self._status(ref, record))
        return out

    def terminate(self, ref: InstanceRef) -> None:
        """SIGTERM to the instance's process group now, power-off `terminate_grace_s` later."""
        self.start()
        with self._lock, self.state.locked():
            record = self.state.load(ref.instance_id)
            if record is None or record.ended:
                return
            if record.stop_at is None:
                now = self.clock()
                record.stop_requested_at = now
                record.stop_at = now + self.terminate_grace_s
                record.state = InstanceState.STOPPING.value
                self.state.save(record)
            if alive(record):
                signal_group(record.pid, signal.SIGTERM)
        self._refresh(ref.instance_id)

    # --- the local cloud's own controls ----------------------------------------------

    def interrupt(
        self, instance_id: str, *, grace_s: float | None = None, action: str = "terminate"
    ) -> InstanceRecord:
        """Post a spot interruption notice now; power the instance off `grace_s` later."""
        if grace_s is None:
            grace_s = self.grace_s if self._server else self.state.settings().get("grace_s")
            grace_s = self.grace_s if grace_s is None else float(grace_s)
        with self._lock, self.state.locked():
            record = self.state.load(instance_id)
            if record is None:
                raise KeyError(f"no local instance {instance_id!r}")
            if record.ended:
                raise ValueError(f"{instance_id} has already ended ({record.detail})")
            if record.interruption is None:
                now = self.clock()
                record.interruption = Interruption(now, now + grace_s, action)
                self.state.save(record)
            return record

    def inject_telemetry(
        self,
        instance_id: str,
        *,
        util: float | None,
        memory: float = 0.0,
        gpus: int | None = None,
        memory_gib: float | None = None,
        interval_s: float = 10.0,
    ) -> InstanceRecord:
        """Make the instance's agent read these simulated GPU figures (fractions 0..1) every
        `interval_s` from now on, labelled simulated; `util=None` ends the injection. The
        metadata endpoint serves them at `<instance>/gpuopt/v1/telemetry`. `gpus` and
        `memory_gib` default to the instance type's GPUs (its offer's count and memory)."""
        if util is not None:
            for name, value in (("util", util), ("memory", memory)):
                if not 0.0 <= value <= 1.0:
                    raise ValueError(f"--{name} must be a fraction between 0 and 1, got {value}")
            if (gpus is not None and gpus < 1) or (memory_gib is not None and memory_gib <= 0):
                raise ValueError("gpus and memory_gib must be positive")
            if interval_s <= 0:
                raise ValueError("interval_s must be positive")
        with self._lock, self.state.locked():
            record = self.state.load(instance_id)
            if record is None:
                raise KeyError(f"no local instance {instance_id!r}")
            if record.ended:
                raise ValueError(f"{instance_id} has already ended ({record.detail})")
            if util is not None and (gpus is None or memory_gib is None):
                count, each = self._gpus_of(record)
                gpus, memory_gib = gpus or count, memory_gib or each
            if util is None:
                record.extra.pop(TELEMETRY, None)
            else:
                record.extra[TELEMETRY] = {
                    "util": util,
                    "memory": memory,
                    "gpus": gpus,
                    "memory_gib": memory_gib,
                    "interval_s": interval_s,
                    "simulated": True,
                }
            self.state.save(record)
            return record

    def _gpus_of(self, record: InstanceRecord) -> tuple[int, float]:
        """(GPUs, GiB each) of an instance's type: recorded at its launch, else its offer's."""
        known = record.extra.get(GPUS)
        if isinstance(known, dict):
            return int(known["count"]), float(known["memory_gib"])
        for offer in self.fetch_offers([record.region]):
            if offer.instance_type == record.instance_type:
                return offer.gpu_count, offer.gpu_memory_gib
        raise ValueError(
            f"{record.id}: {record.instance_type} has no GPU figures here; give --gpus and "
            "--memory-gib"
        )

    def pin_price(self, pool: str, usd: float | None, *, for_s: float | None = None) -> None:
        """Hold a pool's price (`type@zone` spot, `type@region` on-demand) at `usd` from now,
        for `for_s` seconds of this cloud's clock or for good; `usd=None` unpins it."""
        market.pin(
            self.state,
            market.check_pool(pool, self.fetch_offers()),
            usd,
            for_s=for_s,
            now=self.clock(),
        )

    def set_capacity(self, pool: str, *, available: bool) -> None:
        """Take a pool's capacity away (its launches fail with InsufficientInstanceCapacity,
        its price stays listed) or give it back."""
        market.set_capacity(
            self.state, market.check_pool(pool, self.fetch_offers()), available=available
        )

    def follow_trace(self, trace: CapacityTrace | None, pool: str = market.EVERY_SPOT_POOL) -> None:
        """Make a spot pool's capacity (every spot pool's by default) follow `trace` from now
        on (None: stop following one); see trace.py."""
        name = pool
        if pool != market.EVERY_SPOT_POOL:
            name = market.check_pool(pool, self.fetch_offers())
        market.follow_trace(self.state, name, trace, now=self.clock())

    def fail_next(
        self,
        match: str | tuple[str | None, ...] = "*",
        error: type[ProviderError] | str = CapacityError,
        *,
        times: int = 1,
        after: int = 0,
    ) -> None:
        """Make the next `times` launches on a matching offer fail with `error`, once `after`
        matching launches have succeeded (`after=1`: a gang's second node fails).

        `match` is an instance type, a region, a zone, `*`, or a whole offer pool
        (provider, region, zone, type, market). Kept in the state directory, so another
        process can inject it.
        """
        add_fault(self.state, match, error, times, after)

    def instances(self) -> list[InstanceRecord]:
        """Every instance record, ended ones included, each brought up to date."""
        out = []
        for record in self.state.all():
            fresh = self._refresh(record.id)
            out.append(fresh or record)
        return out

    def kill_all(self) -> None:
        """Power off every instance at once (test teardown, `gpuopt local` clean-up)."""
        for record in self.state.all():
            if not record.ended:
                with self._lock, self.state.locked():
                    fresh = self.state.load(record.id)
                    if fresh is None or fresh.ended:
                        continue
                    now = self.clock()
                    if fresh.stop_at is None:  # as a terminate whose grace is over at once
                        fresh.stop_requested_at = now
                    fresh.stop_at = now
                    self.state.save(fresh)
                power_off(record)
                proc = self._procs.get(record.id)
                if proc is not None:
                    proc.wait()
                self._refresh(record.id)

    # --- internals ---------------------------------------------------------------------

    def _capacity(self, offer: Offer) -> None:
        """Refuse a launch in a pool marked unavailable, or in a spot pool whose traced
        capacity the running instances already fill (call under the state lock)."""
        name = market.pool_name(offer)
        controls = market.load(self.state)
        why = f"pool {name} marked unavailable" if name in controls.unavailable else None
        trace = controls.trace(name) if offer.market.value == "spot" else None
        if why is None and trace is not None:
            count = trace.capacity(self.clock())
            running = sum(
                1
                for r in self.state.all()
                if not r.ended
                and r.market == "spot"
                and r.interruption is None
                and _pool_name(r) == name
            )
            if running >= count:
                why = f"trace {trace.source}: {count} spot instance(s) obtainable in {name} now"
        if why is not None:
            raise CapacityError(
                f"no capacity for {offer.instance_type} in {offer.zone or offer.region} ({why})",
                provider=self.name,
                code="InsufficientInstanceCapacity",
                zone=offer.zone,
            )

    def _ref(self, record: InstanceRecord) -> InstanceRef:
        return InstanceRef(self.name, record.region, record.zone, record.id)

    def clock_env(self) -> dict[str, str]:
        """What a process on this host needs to keep this cloud's time: GPUOPT_CLOCK_OFFSET_S,
        the cloud's clock's lead over the wall clock (nothing when the cloud is on the wall
        clock). Its machines get it, and a `gpuopt local` command run beside a test's cloud."""
        offset = round(self.clock() - time.time(), 3)
        return {CLOCK_OFFSET_ENV: str(offset)} if offset else {}

    def _spawn(self, record: InstanceRecord, bootstrap: str, metadata_url: str) -> None:
        disk = self.state.disk(record.id)
        private_dir(disk)
        record.mark = instance_mark(self.state.root, record.id)
        # A fresh machine: only the basics of the daemon's environment (no secret of the
        # daemon's, no gpuopt setting) reach it; the agent gets the rest from its bootstrap.
        env = basic_env(os.environ)
        # The machine image has gpuopt's own Python first on its PATH (`python`, `gpuopt`).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        # Its own disk, as a real machine's: a home and a temporary folder of its own, so
        # nothing the instance writes by default lands where other instances would see it.
        env.update(
            HOME=str(private_dir(disk / "home")),
            TMPDIR=str(private_dir(disk / "tmp")),
            GPUOPT_METADATA_URL=metadata_url,
            GPUOPT_CLOUD=self.name,
            GPUOPT_AGENT_DIR=str(disk / "agent"),
            **{MARK_ENV: record.mark},
        )
        env.update(self.clock_env())  # its machines keep the cloud's time
        try:
            with append_private(disk / "console.log") as console:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", bootstrap],
                    stdin=subprocess.DEVNULL,
                    stdout=console,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=disk,
                    start_new_session=True,
                )
        except OSError as exc:
            self._end(record, EndReason.FAILED, f"could not start: {exc}")
            raise ProviderError(str(exc), provider=self.name, code="LaunchFailed") from exc
        self._procs[record.id] = proc
        record.pid, record.start_ticks = proc.pid, proc_start_ticks(proc.pid)
        record.extra["launcher"] = [os.getpid(), proc_start_ticks(os.getpid())]
        record.state = InstanceState.RUNNING.value
        self.state.save(record)

    def _end(
        self,
        record: InstanceRecord,
        reason: EndReason,
        detail: str,
        terminated_at: float | None = None,
    ) -> None:
        now = self.clock()
        record.state = InstanceState.TERMINATED.value
        record.end_reason, record.detail, record.ended_at = reason.value, detail, now
        record.terminated_at = now if terminated_at is None else terminated_at
        self.state.save(record)

    def _refresh(self, instance_id: str) -> InstanceRecord | None:
        """Bring one record up to date: enforce its deadlines, notice its end."""
        with self._lock, self.state.locked():
            record = self.state.load(instance_id)
            if record is None or record.ended:
                return record
            now = self.clock()
            proc = self._procs.get(record.id)
            running = proc.poll() is None if proc is not None else alive(record)
            due = [
                t
                for t in (record.stop_at, record.interruption and record.interruption.kill_at)
                if t
            ]
            if running and due and now >= min(due):
                power_off(record)
                if proc is not None:
                    proc.wait()
                running = False
            if running:
                return record
            if self._idle(record, now):
                # The guest's processes ended during an interruption notice (the agent exits
                # once its job has): a VM would stay up, idle, until the cloud powers it
                # off, and so does this one.
                if proc is not None and record.exit_code is None:
                    record.exit_code = proc.returncode
                record.extra.setdefault("idle_since", now)
                self.state.save(record)
                return record
            if proc is None and self._launcher_elsewhere(record):
                # The process that launched it holds its exit status and records the end
                # within a tick; step in only if it does not.
                seen = record.extra.setdefault("gone_seen_at", time.time())
                if time.time() - seen < LAUNCHER_WAIT_S:
                    self.state.save(record)
                    return record
            power_off(record)  # the machine is gone: so is anything it left running
            if proc is not None:
                record.exit_code = proc.returncode
            reason, detail, terminated_at = self._why(record, record.exit_code, now)
            self._end(record, reason, detail, terminated_at)
            self._procs.pop(record.id, None)
            return record

    @staticmethod
    def _launcher_elsewhere(record: InstanceRecord) -> bool:
        launcher = record.extra.get("launcher")
        if not launcher or launcher[0] == os.getpid():
            return False
        return proc_start_ticks(launcher[0]) == launcher[1]

    @staticmethod
    def _user_ended(record: InstanceRecord) -> bool:
        """Whether a terminate call ended the instance (before any interruption's power-off)."""
        asked = record.stop_requested_at
        if asked is None and record.stop_at is not None:  # a record from an older version
            asked = record.stop_at
        if asked is None:
            return False
        return record.interruption is None or asked < record.interruption.kill_at

    @staticmethod
    def _idle(record: InstanceRecord, now: float) -> bool:
        """Whether the instance stays up with nothing running: an interruption is announced
        for later and nobody asked to terminate it."""
        notice = record.interruption
        return (
            notice is not None
            and now < notice.kill_at
            and record.stop_at is None
            and record.pid is not None
        )

    def _why(
        self, record: InstanceRecord, exit_code: int | None, now: float
    ) -> tuple[EndReason, str, float]:
        """Why the instance ended, in words, and when billing stopped (see `terminated_at`)."""
        if self._user_ended(record):
            # Only terminate() sets stop_at, and only gpuopt calls it (the daemon ending an
            # attempt; kill_all at clean-up); a person ends an instance with an interruption.
            asked = record.stop_requested_at or record.stop_at or now
            return EndReason.USER, "terminated by gpuopt", min(asked, now)
        if record.interruption is not None:
            notice = record.interruption
            detail = f"spot {notice.action} at {iso(notice.kill_at)}"
            return EndReason.PREEMPTED, detail, min(notice.kill_at, now)
        if record.pid is None:
            return EndReason.FAILED, "the instance process never started", now
        if exit_code == 0:
            return EndReason.USER, "the instance shut itself down (exit status 0)", now
        if exit_code is None:
            return EndReason.FAILED, "the instance process ended (exit status unknown here)", now
        if exit_code < 0:
            detail = f"the instance process was killed by signal {-exit_code}"
            return EndReason.FAILED, detail, now
        return EndReason.FAILED, f"the instance process exited with status {exit_code}", now

    def _status(self, ref: InstanceRef, record: InstanceRecord) -> InstanceStatus:
        state = InstanceState(record.state)
        launched = _utc(record.launched_at)
        if state is InstanceState.TERMINATED:
            reason = EndReason(record.end_reason) if record.end_reason else None
            ended = _utc(record.terminated_at if record.terminated_at else record.ended_at)
            return InstanceStatus(ref, state, reason, record.detail, launched, ended)
        if state is InstanceState.STOPPING and self._user_ended(record):
            return InstanceStatus(ref, state, EndReason.USER, "terminating", launched)
        if record.interruption is not None:  # AWS shows marked-for-termination meanwhile
            notice = record.interruption
            detail = f"marked-for-termination: spot {notice.action} at {iso(notice.kill_at)}"
            return InstanceStatus(ref, state, EndReason.PREEMPTED, detail, launched)
        if state is InstanceState.STOPPING:
            return InstanceStatus(ref, state, EndReason.USER, "terminating", launched)
        return InstanceStatus(ref, state, launched_at=launched)

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self._tick()
            except Exception:  # the ticker must outlive one bad record
                log.exception("local cloud tick failed")

    def _tick(self) -> None:
        now = self.clock()
        market.stamp(self.state, now)
        elapsed = 0.0 if self._last_tick is None else max(now - self._last_tick, 0.0)
        self._last_tick = now
        chance = 1 - math.exp(-self.rate_per_hour * elapsed / 3600) if self.rate_per_hour else 0
        live: list[InstanceRecord] = []
        for record in self.state.all():
            if record.ended:
                continue
            fresh = self._refresh(record.id)
            if fresh is None or fresh.ended or fresh.market != "spot" or fresh.interruption:
                continue
            if chance and self._rng.random() < chance:
                log.info("local cloud: random interruption of %s", fresh.id)
                self.interrupt(fresh.id)
            else:
                live.append(fresh)
        self._follow_traces(live, now)

    def _follow_traces(self, live: list[InstanceRecord], now: float) -> None:
        """Interrupt the newest spot instances of each pool whose traced capacity dropped
        below the instances running there (each gets the normal notice)."""
        traced = market.load(self.state)
        if not traced.traces:
            return
        by_pool: dict[str, list[InstanceRecord]] = {}
        for record in live:
            by_pool.setdefault(_pool_name(record), []).append(record)
        for name, records in by_pool.items():
            trace = traced.trace(name)
            if trace is None:
                continue
            over = len(records) - trace.capacity(now)
            if over <= 0:
                continue
            for record in sorted(records, key=lambda r: r.launched_at, reverse=True)[:over]:
                log.info(
                    "local cloud: %s's capacity is %d (trace %s): interrupting %s",
                    name,
                    trace.capacity(now),
                    trace.source,
                    record.id,
                )
                self.interrupt(record.id)
