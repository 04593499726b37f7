"""Owned GPU machines as a provider: offers priced by their TCO, instances started over SSH.

An instance here is an allocation on one machine: GPUs given to one attempt (by index, set as
`CUDA_VISIBLE_DEVICES` for its agent and job), a folder of its own under the machine's
`work_dir`, and the agent started there by the same bootstrap the clouds run, in its own
session (`setsid`). Every process of the instance inherits a mark in its environment (as on
the local cloud), so terminating it ends the agent, the job (in a session of its own) and
anything they started.

Offers: one per machine shape and GPU count a free share of it allows (1, 2, 4 … up to the
most GPUs free on one machine of the shape), market `owned`, priced per GPU-hour from the
machine's TCO (`optimizer.costs.owned`: the formulas and defaults of `gpuopt tco`'s
on-premises option, overridable per machine). A machine that failed its last check, or is
being drained, offers nothing.

Taking a machine back (`drain`) is an interruption notice: a notice file is written into each
of its instances' folders (the agent's `owned-file` watcher reads it), with the power-off
time; the daemon's hot handover moves the job as it moves one off a reclaimed spot instance,
and at the power-off what is left there is ended. `undrain` gives the machine back to the
offers.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from optimizer.clock import utc_text
from optimizer.common.environ import MACHINE_MARK_ENV
from optimizer.model import Interconnect, Market, Offer
from providers.base import (
    CapacityError,
    EndReason,
    InstanceRef,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    ProviderError,
)
from providers.ssh.inventory import (
    Check,
    Drain,
    Instance,
    MachineSpec,
    SshConfig,
    State,
    StateFile,
)

log = logging.getLogger(__name__)

NAME = "ssh"
SOURCE = "owned-tco"
UTILIZATION_S = 30 * 86_400.0  # the window a machine's measured utilization covers
RECHECK_S = 300.0  # a machine that passed is checked again this often; one that failed, each poll
CHECK_WORKERS = 16  # machines checked at once
RETRY_S = 30.0  # describe tries an unreachable machine again at most this often
STOP_GRACE_S = 5.0  # SIGTERM to SIGKILL when an instance is terminated
NOTICE_FILE = "notice.json"


def _mark(instance_id: str, folder: str) -> str:
    """The value of MACHINE_MARK_ENV that every process of the instance inherits (the agent,
    the job, whatever they start, in whichever session): its id and its folder, which no other
    instance on the machine shares."""
    return f"{instance_id}@{folder}"


def _stop_script(pid: int, mark: str) -> str:
    """A shell script that stops an instance the way a machine's power-off would: SIGTERM to
    the agent's session (the agent forwards it to the job, which may checkpoint), then, after
    STOP_GRACE_S, SIGKILL to every process still carrying the instance's mark. The job runs
    in a session of its own, so the mark is what finds it; `grep -z` reads each process's
    environment as NUL-separated lines (only this user's processes are readable)."""
    needle = shlex.quote(f"{MACHINE_MARK_ENV}={mark}")
    marked = f"grep -lzxF -- {needle} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3"
    tries = int(STOP_GRACE_S * 10)
    return (
        f"kill -TERM -{pid} 2>/dev/null; "
        f'i=0; while [ -n "$({marked})" ] && [ $i -lt {tries} ]; do sleep 0.1; i=$((i+1)); done; '
        f"left=$({marked}); "
        '[ -z "$left" ] || kill -KILL $left 2>/dev/null; true'
    )


class MachineError(ProviderError):
    """A machine that cannot be added or used (names the machine and the problem)."""

    def __init__(self, message: str, *, code: str = "MachineError") -> None:
        super().__init__(message, provider=NAME, code=code)


def instance_type(gpus: int, model: str) -> str:
    """The offer's type name: `owned-2xT4`."""
    return f"owned-{gpus}x{model}"


def shares(most: int) -> list[int]:
    """The GPU counts offered from a machine with `most` GPUs free: the powers of two below
    it and `most` itself (a job asks for 1, 2, 4 or 8 GPUs; a 6-GPU machine offers 6 too)."""
    out, n = [], 1
    while n < most:
        out.append(n)
        n *= 2
    out.append(most)
    return out


@dataclass(frozen=True, slots=True)
class MachineView:
    """One machine as `gpuopt machines list` shows it."""

    spec: MachineSpec
    origin: str  # config | added
    check: Check | None
    drain: Drain | None
    used: tuple[int, ...]
    usd_per_gpu_hour: float | None
    instances: tuple[str, ...]
    utilization: float | None = None  # GPU-hours held / GPU-hours it had, over UTILIZATION_S

    def to_dict(self) -> dict[str, Any]:
        s = self.spec
        return {
            "name": s.name,
            "host": s.host,
            "user": s.user,
            "port": s.port,
            "region": s.region,
            "site": s.zone,
            "gpu_model": s.gpu_model,
            "gpus": s.gpus,
            "gpus_used": len(self.used),
            "gpus_free": 0 if self.drain else s.gpus - len(self.used),
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "origin": self.origin,
            "state": self.state,
            "checked_at": None if self.check is None else utc_text(_dt(self.check.at)),
            "check": None if self.check is None else self.check.detail,
            "simulated": bool(self.check and self.check.simulated),
            "disk_free_gib": None if self.check is None else self.check.disk_free_gib,
            "draining_until": None
            if self.drain is None
            else utc_text(_dt(self.drain.power_off_at)),
            "instances": list(self.instances),
            "utilization": self.utilization,
        }

    @property
    def state(self) -> str:
        if self.drain is not None:
            return "draining"
        if self.check is None:
            return "unchecked"
        return "ready" if self.check.ok else "failed"


def _dt(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


Rate = Callable[[MachineSpec], float]
Connect = Callable[..., Any]  # transport.connect's shape (tests inject nothing: the real one)


class SshProvider:
    """The `ssh` provider (registry entry in providers/ssh/__init__.py)."""

    name = NAME

    def __init__(
        self,
        config: SshConfig,
        state_dir: Path,
        *,
        rate: Rate,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from providers.ssh.transport import Pool  # paramiko: only where owned machines are

        self.config = config
        self.state_dir = state_dir
        self.state = StateFile(state_dir / "state.json")
        self.known_hosts = (
            Path(config.known_hosts) if config.known_hosts else state_dir / "known_hosts"
        )
        self.pool = Pool(self.known_hosts, timeout=config.connect_timeout_s)
        self.rate = rate
        self.clock = clock
        self._problems: list[str] = []
        self._check_lock = threading.Lock()
        # Set by the daemon: called when this provider's offers changed (a launch took GPUs,
        # an instance's end freed them), so they are polled again now.
        self.offers_changed: Callable[[bool], None] = lambda freed: None
        # describe's last try of each machine, and why an unreachable one failed
        self._tried: dict[str, float] = {}
        self._why: dict[str, str] = {}

    # -- the inventory -------------------------------------------------------------------------

    def machines(self) -> list[MachineSpec]:
        """The config's machines, then those added at run time."""
        added = self.state.read().added
        out = list(self.config.machines)
        out += [MachineSpec.model_validate(v) for k, v in sorted(added.items())]
        return out

    def parse(self, raw: dict[str, Any]) -> MachineSpec:
        """A machine as the API was given it; pydantic's ValidationError names each field."""
        return MachineSpec.model_validate(raw)

    def machine(self, name: str) -> MachineSpec:
        for m in self.machines():
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.machines()) or "none"
        raise MachineError(f"no machine named {name!r} (machines: {known})", code="UnknownMachine")

    def target(self, m: MachineSpec) -> Any:
        from providers.ssh.transport import Target

        key = Path(m.key_file).expanduser() if m.key_file else None
        return Target(m.host, m.user, m.port, key)

    def views(self) -> list[MachineView]:
        state = self.state.read()
        config_names = {m.name for m in self.config.machines}
        now = self.clock()
        out = []
        for m in self.machines():
            live = state.live(m.name)
            out.append(
                MachineView(
                    m,
                    "config" if m.name in config_names else "added",
                    state.checks.get(m.name),
                    state.drains.get(m.name),
                    tuple(sorted(state.used_gpus(m.name))),
                    self._rate(m),
                    tuple(i.id for i in live),
                    utilization(state, m, now),
                )
            )
        return out

    def _rate(self, m: MachineSpec) -> float | None:
        try:
            return self.rate(m)
        except ValueError:
            return None

    def add(self, spec: MachineSpec, *, trust_new: bool = False) -> MachineView:
        """Check a machine now (reachable, its host key, its GPUs as the inventory says, its
        disk) and keep it; MachineError (or the transport's error) naming what is wrong, and
        nothing kept."""
        if any(m.name == spec.name for m in self.machines()):
            raise MachineError(f"a machine named {spec.name!r} exists already", code="Duplicate")
        for m in self.machines():
            if (m.host, m.port) == (spec.host, spec.port):
                raise MachineError(
                    f"{spec.host}:{spec.port} is machine {m.name!r} already", code="Duplicate"
                )
        try:
            self.rate(spec)
        except ValueError as exc:
            raise MachineError(f"machine {spec.name}: {exc}", code="BadTco") from exc
        check = self._check(spec, trust_new=trust_new)
        if not check.ok:
            raise MachineError(
                f"machine {spec.name} ({spec.label}): {check.detail}", code="CheckFailed"
            )
        with self.state.edit() as state:
            state.added[spec.name] = spec.model_dump(mode="json")
            state.checks[spec.name] = check
            state.first_seen.setdefault(spec.name, check.at)
        self.offers_changed(True)  # new GPUs
        return next(v for v in self.views() if v.spec.name == spec.name)

    def remove(self, name: str) -> None:
        """Forget a machine added at run time (one of the config's is edited there); refused
        while instances run on it."""
        m = self.machine(name)
        with self.state.edit() as state:
            if name not in state.added:
                raise MachineError(
                    f"machine {name} is in the daemon config: remove it there", code="InConfig"
                )
            live = state.live(name)
            if live:
                ids = ", ".join(i.id for i in live)
                raise MachineError(
                    f"machine {name} runs {ids}: drain it first (gpuopt machines drain {m.name})",
                    code="Busy",
                )
            state.added.pop(name, None)
            state.checks.pop(name, None)
            state.drains.pop(name, None)

    def check(self, name: str) -> Check:
        """Check the machine now and record what was found; one that cannot be reached or
        refuses us (its host key changed, our key refused) is recorded as failed, so it
        offers nothing, and the error names the machine."""
        from providers.ssh.transport import SshError

        m = self.machine(name)
        try:
            check = self._check(m)
        except SshError as exc:
            with self.state.edit() as state:
                state.checks[name] = Check(self.clock(), False, str(exc))
            raise MachineError(f"machine {name}: {exc}", code=type(exc).__name__) from exc
        with self.state.edit() as state:
            state.checks[name] = check
        return check

    def _check(self, m: MachineSpec, *, trust_new: bool = False) -> Check:
        """Reach the machine and read its inventory (raises the transport's errors where the
        host key is unknown or changed, or the key is refused, when `trust_new` is asked:
        an add; a poll's check records them instead)."""
        from providers.ssh.transport import connect

        now = self.clock()
        env = f"GPUOPT_SIMULATED_GPUS={m.gpus}x{m.gpu_model} " if m.simulate_gpus else ""
        command = (
            f"mkdir -p {_q(m.work_dir)} && {env}{m.python} -m optimizer.agent.inventory "
            f"--dir {_q(m.work_dir)}"
        )
        with connect(
            self.target(m),
            known_hosts=self.known_hosts,
            trust_new=trust_new or self.config.trust_new_hosts,
            timeout=self.config.connect_timeout_s,
        ) as session:
            result = session.run(command, timeout=60.0)
            self._reached(m.name, session)
        if result.rc != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            return Check(now, False, f"the inventory failed (exit {result.rc}): {last}")
        try:
            found = json.loads(result.stdout)
        except ValueError:
            return Check(now, False, "the inventory printed no JSON (is gpuopt installed there?)")
        return judge(m, found, now)

    def _recheck(self) -> None:
        """Check the machines due (never checked, failed, or not for RECHECK_S); a machine
        that cannot be reached or refuses us is recorded as failed, with why."""
        from providers.ssh.transport import SshError

        # One pass at a time; a caller that finds one under way waits for it and then sees
        # its checks (never "not checked" because another poll got there first).
        with self._check_lock:
            state = self.state.read()
            now = self.clock()
            due = [
                m
                for m in self.machines()
                if (c := state.checks.get(m.name)) is None or not c.ok or now - c.at >= RECHECK_S
            ]

            def check(m: MachineSpec) -> Check:
                try:
                    return self._check(m)
                except SshError as exc:
                    return Check(now, False, str(exc))

            if not due:
                return
            # Machines are checked side by side: each is a few round trips and a Python
            # start on the far side, and a site may have hundreds.
            with ThreadPoolExecutor(min(CHECK_WORKERS, len(due))) as pool:
                found = list(pool.map(check, due))
            with self.state.edit() as edit:
                for m, done in zip(due, found, strict=True):
                    edit.checks[m.name] = done
                    if done.ok:
                        edit.first_seen.setdefault(m.name, done.at)

    # -- offers --------------------------------------------------------------------------------

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        self._recheck()
        state = self.state.read()
        problems: list[str] = []
        now = _dt(self.clock())
        groups: dict[tuple[str, str, str, float], list[tuple[MachineSpec, int, float]]] = {}
        for m in self.machines():
            if regions and m.region not in regions:
                continue
            check = state.checks.get(m.name)
            if check is None or not check.ok:
                problems.append(f"machine {m.name}: {check.detail if check else 'not checked'}")
                continue
            if m.name in state.drains:
                continue
            free = m.gpus - len(state.used_gpus(m.name))
            rate = self._rate(m)
            if rate is None:
                problems.append(f"machine {m.name}: no TCO rate (give tco.capex_usd)")
                continue
            if free > 0:
                key = (m.region, m.zone, m.gpu_model, m.gpu_memory_gib)
                groups.setdefault(key, []).append((m, free, rate))
        self._problems = problems
        offers = []
        for (region, zone, model, memory), members in sorted(groups.items()):
            most = max(free for _, free, _ in members)
            for k in shares(most):
                m, _, rate = min((x for x in members if x[1] >= k), key=lambda x: x[2])
                offers.append(
                    Offer(
                        provider=NAME,
                        region=region,
                        zone=zone,
                        instance_type=instance_type(k, model),
                        gpu_model=model,
                        gpu_count=k,
                        gpu_memory_gib=memory,
                        vcpus=max(1, m.vcpus * k // m.gpus),
                        ram_gib=round(m.ram_gib * k / m.gpus, 2),
                        interconnect=Interconnect.NONE if k == 1 else Interconnect.PCIE,
                        market=Market.OWNED,
                        usd_per_hour=round(rate * k, 6),
                        observed_at=now,
                        source=SOURCE,
                    )
                )
        return offers

    @property
    def problems(self) -> Sequence[str]:
        return tuple(self._problems)

    # -- instances -----------------------------------------------------------------------------

    def launch(self, offer: Offer, spec: LaunchSpec, idempotency_key: str) -> InstanceRef:
        if offer.provider != NAME:
            raise ProviderError(
                f"not an owned offer: {offer.provider}", provider=NAME, code="InvalidOffer"
            )
        k = offer.gpu_count
        with self.state.edit() as state:
            existing = state.by_key(idempotency_key)
            if existing is not None:
                return self._ref(existing)
            fits = []
            for m in self.machines():
                check = state.checks.get(m.name)
                if (
                    (m.region, m.zone, m.gpu_model) != (offer.region, offer.zone, offer.gpu_model)
                    or m.name in state.drains
                    or check is None
                    or not check.ok
                ):
                    continue
                free = [g for g in range(m.gpus) if g not in state.used_gpus(m.name)]
                if len(free) >= k:
                    fits.append((self._rate(m) or 0.0, len(free), m, free))
            if not fits:
                raise CapacityError(
                    f"no owned machine in {offer.zone or offer.region} has {k} free "
                    f"{offer.gpu_model} GPU(s)",
                    provider=NAME,
                    code="NoFreeGpus",
                    zone=offer.zone,
                )
            # The cheapest machine, then the fullest one that fits: whole machines stay free
            # for the jobs that need them.
            _, _, machine, free = min(fits, key=lambda f: (f[0], f[1]))
            instance = Instance(
                id=f"{machine.name}-{state.next_id:04d}",
                key=idempotency_key,
                machine=machine.name,
                gpus=free[:k],
                job=spec.job,
                attempt=spec.attempt,
                instance_type=offer.instance_type,
                usd_per_hour=offer.usd_per_hour,
                started_at=self.clock(),
            )
            state.next_id += 1
            state.instances[instance.id] = instance  # its GPUs are taken before it starts
        try:
            folder, pid = self._start(machine, instance, spec.bootstrap)
        except ProviderError as exc:
            self._end(instance.id, EndReason.FAILED, f"could not start: {exc}")
            raise ProviderError(
                f"machine {machine.name}: could not start the agent: {exc}",
                provider=NAME,
                code="LaunchFailed",
            ) from exc
        with self.state.edit() as state:
            record = state.instances[instance.id]
            record.pid, record.dir = pid, folder
        self.offers_changed(False)
        log.info(
            "started %s on machine %s (GPUs %s) for job %s attempt %s",
            instance.id,
            machine.name,
            ",".join(map(str, instance.gpus)),
            spec.job,
            spec.attempt,
        )
        return self._ref(instance)

    def _start(self, m: MachineSpec, instance: Instance, bootstrap: str) -> tuple[str, int]:
        """Make the instance's folder, write its bootstrap (0700: it holds the agent's token)
        and start it in a session of its own; (its folder, its process id)."""
        session = self.pool.session(self.target(m))
        where = f"{m.work_dir}/instances/{instance.id}"
        made = session.run(f"mkdir -p {_q(where)}/tmp && cd {_q(where)} && pwd", check=True)
        folder = made.stdout.strip().splitlines()[-1]
        session.write_file(f"{folder}/bootstrap.sh", bootstrap, mode=0o700)
        env = {
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, instance.gpus)),
            "GPUOPT_METADATA_URL": f"file://{folder}/{NOTICE_FILE}",
            "GPUOPT_INSTANCE_ID": instance.id,
            "GPUOPT_AGENT_DIR": f"{folder}/agent",
            "TMPDIR": f"{folder}/tmp",
            MACHINE_MARK_ENV: _mark(instance.id, folder),
        }
        if m.simulate_gpus:
            env["GPUOPT_SIMULATED_GPUS"] = f"{len(instance.gpus)}x{m.gpu_model}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # Only the command itself goes to the background (not `cd && command`, which the
        # shell would run in a subshell of its own), so `$!` is the agent: the shell's child
        # execs setsid, nohup, sh and the bootstrap's own exec in turn, keeping its pid.
        started = session.run(
            f"cd {_q(folder)} || exit 1; {exports} setsid nohup /bin/sh ./bootstrap.sh "
            "> console.log 2>&1 < /dev/null & echo $!",
            check=True,
        )
        return folder, int(started.stdout.strip().splitlines()[-1])

    def describe(self, refs: Iterable[InstanceRef]) -> list[InstanceStatus]:
        from providers.ssh.transport import SshError

        refs = list(refs)
        state = self.state.read()
        now = self.clock()
        # Machines past a drain's power-off: what is left there ends now.
        for name, drain in state.drains.items():
            if now >= drain.power_off_at:
                for left in state.live(name):
                    self._kill(left, EndReason.PREEMPTED, f"machine {name} was taken back")
        state = self.state.read()
        alive: dict[str, set[int] | None] = {}
        for machine in {
            i.machine for r in refs if (i := state.instances.get(r.instance_id)) and not i.ended
        }:
            pids = [i.pid for i in state.live(machine) if i.pid]
            if machine in state.unreachable and now - self._tried.get(machine, 0.0) < RETRY_S:
                # Tried a moment ago and unreachable: not again in this pass (a dead host
                # costs a connect timeout, and every job's pass would wait for it).
                alive[machine] = None
                self._unreachable(machine, self._why.get(machine, "unreachable"), now)
                continue
            self._tried[machine] = now
            try:
                m = self.machine(machine)
                session = self.pool.session(self.target(m))
                listed = " ".join(map(str, pids)) or "0"
                found = session.run(
                    f"for p in {listed}; do kill -0 $p 2>/dev/null && echo $p; done; true"
                )
                alive[machine] = {int(x) for x in found.stdout.split() if x.isdigit()}
            except (SshError, MachineError) as exc:
                log.warning("machine %s: %s", machine, exc)
                alive[machine] = None  # unknown: left as it was, until it counts as gone
                self._why[machine] = str(exc)
                self._unreachable(machine, str(exc), now)
            else:
                self._reached(machine, session)
        state = self.state.read()
        out: list[InstanceStatus] = []
        for ref in refs:
            instance: Instance | None = state.instances.get(ref.instance_id)
            if instance is None:
                out.append(
                    InstanceStatus(
                        ref, InstanceState.TERMINATED, EndReason.FAILED, "unknown instance"
                    )
                )
                continue
            seen = alive.get(instance.machine)
            if (
                not instance.ended
                and seen is not None
                and instance.pid
                and instance.pid not in seen
            ):
                drained = instance.machine in state.drains
                why = EndReason.PREEMPTED if drained else None
                instance = self._end(instance.id, why, "its agent exited") or instance
            assert instance is not None
            out.append(self._status(ref, instance))
        return out

    def _unreachable(self, machine: str, exc: str, now: float) -> None:
        """The machine could not be reached: after `lost_after_s` of that it has gone away
        (powered off, cut off), and its instances end as failed, so their jobs restart
        elsewhere from their checkpoints; its GPUs are freed."""
        with self.state.edit() as state:
            since = state.unreachable.setdefault(machine, now)
            # It offers nothing until a check reaches it again (each poll tries).
            state.checks[machine] = Check(now, False, f"unreachable: {exc}")
            gone = now - since >= self.config.lost_after_s
            left = state.live(machine) if gone else []
        for instance in left:
            self._end(
                instance.id,
                EndReason.FAILED,
                f"machine {machine} unreachable for {now - since:.0f} s: {exc}",
            )

    def _reached(self, machine: str, session: Any) -> None:
        """The machine answers again. Instances ended while it could not be reached (their
        jobs restarted elsewhere) may still run there, cut off: they are stopped now, so two
        runs never write one job's checkpoints (their agents also stop their jobs once they
        cannot reach the daemon)."""
        from providers.ssh.transport import SshError

        if machine not in self.state.read().unreachable:
            return
        with self.state.edit() as state:
            since = state.unreachable.pop(machine, None)
            cut_off = [
                i
                for i in state.instances.values()
                if i.machine == machine
                and i.pid
                and since is not None
                and (i.ended_at or 0) >= since
                and i.end_reason == EndReason.FAILED.value
            ]
        for instance in cut_off:
            try:
                session.run(
                    _stop_script(int(instance.pid or 0), _mark(instance.id, instance.dir)),
                    timeout=STOP_GRACE_S + 20,
                )
            except SshError as exc:
                log.warning("machine %s: could not stop %s: %s", machine, instance.id, exc)

    def _status(self, ref: InstanceRef, i: Instance) -> InstanceStatus:
        if not i.ended:
            return InstanceStatus(ref, InstanceState.RUNNING, launched_at=_dt(i.started_at))
        reason = EndReason(i.end_reason) if i.end_reason else None
        return InstanceStatus(
            ref,
            InstanceState.TERMINATED,
            reason,
            i.detail,
            launched_at=_dt(i.started_at),
            terminated_at=_dt(i.ended_at or i.started_at),
        )

    def terminate(self, ref: InstanceRef) -> None:
        instance = self.state.read().instances.get(ref.instance_id)
        if instance is None or instance.ended:
            return
        self._kill(instance, EndReason.USER, "terminated")

    def _kill(self, instance: Instance, why: EndReason, detail: str) -> None:
        """End the instance's session (SIGTERM, then SIGKILL after STOP_GRACE_S) and free its
        GPUs. A machine that cannot be reached: its GPUs are freed all the same once the
        daemon let the instance go (the agent stops its job when the daemon is gone)."""
        from providers.ssh.transport import SshError

        if instance.pid:
            script = _stop_script(int(instance.pid), _mark(instance.id, instance.dir))
            try:
                m = self.machine(instance.machine)
                self.pool.session(self.target(m)).run(script, timeout=STOP_GRACE_S + 20)
            except (SshError, MachineError) as exc:
                detail += f" (machine unreachable: {exc})"
        self._end(instance.id, why, detail)

    def _end(self, instance_id: str, why: EndReason | None, detail: str) -> Instance | None:
        with self.state.edit() as state:
            instance = state.instances.get(instance_id)
            if instance is None or instance.ended:
                return instance
            instance.ended_at = self.clock()
            instance.end_reason = None if why is None else why.value
            instance.detail = detail
            offered = instance.machine not in state.drains
        self.offers_changed(offered)  # its GPUs are free (offered again unless drained)
        return instance

    def _ref(self, instance: Instance) -> InstanceRef:
        m = self.machine(instance.machine)
        return InstanceRef(NAME, m.region, m.zone, instance.id)

    # -- taking a machine back -----------------------------------------------------------------

    def drain(self, name: str, in_s: float, *, reason: str = "drain") -> list[str]:
        """Take the machine back in `in_s` seconds: no new work on it from now, and an
        interruption notice (power-off now + in_s) to each instance there; the instances
        told."""
        from providers.ssh.transport import SshError

        m = self.machine(name)
        now = self.clock()
        with self.state.edit() as state:
            state.drains[name] = Drain(now, now + in_s, reason)
            live = state.live(name)
        notice = json.dumps(
            {"action": "terminate", "time": utc_text(_dt(now + in_s)), "reason": reason}
        )
        told = []
        for instance in live:
            if not instance.dir:
                continue
            try:
                session = self.pool.session(self.target(m))
                session.write_file(f"{instance.dir}/{NOTICE_FILE}", notice + "\n", mode=0o644)
                told.append(instance.id)
            except SshError as exc:
                log.warning(
                    "machine %s: could not tell %s of the drain: %s", name, instance.id, exc
                )
        return told

    def undrain(self, name: str) -> None:
        """Give a drained machine back to the offers (its instances, if any are left, keep
        their notice: the handover under way goes on)."""
        self.machine(name)
        with self.state.edit() as state:
            if state.drains.pop(name, None) is None:
                raise MachineError(f"machine {name} is not being drained", code="NotDrained")
        self.offers_changed(True)  # its GPUs are offered again

    def close(self) -> None:
        self.pool.close()


def utilization(state: State, m: MachineSpec, now: float) -> float | None:
    """The machine's measured utilization: GPU-seconds its instances held over the GPU-seconds
    it had, since it was first seen ready (at most UTILIZATION_S back); None before that."""
    first = state.first_seen.get(m.name)
    if first is None or now <= first:
        return None
    since = max(first, now - UTILIZATION_S)
    return round(state.busy_gpu_seconds(m.name, since, now) / (m.gpus * (now - since)), 4)


def _q(path: str) -> str:
    """A path for the remote shell: `~/` and relative paths stay relative to the home."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def judge(m: MachineSpec, found: dict[str, Any], now: float) -> Check:
    """The machine's inventory against what the inventory file says it has."""
    gpus = [g for g in found.get("gpus", []) if isinstance(g, dict)]
    simulated = bool(found.get("simulated"))
    disk = found.get("disk_free_gib")
    disk_gib = float(disk) if isinstance(disk, int | float) else None
    if not gpus:
        error = found.get("nvml_error")
        why = f"no GPU found (NVML: {error})" if error else "no GPU found (NVML)"
        why += "" if m.simulate_gpus else "; simulate_gpus is off"
        return Check(now, False, why, gpus, simulated, disk_gib)
    models = sorted({str(g.get("model", "?")) for g in gpus})
    if len(gpus) != m.gpus or any(x.lower() != m.gpu_model.lower() for x in models):
        said = f"{m.gpus}x {m.gpu_model}"
        has = ", ".join(f"{sum(1 for g in gpus if g.get('model') == x)}x {x}" for x in models)
        return Check(
            now,
            False,
            f"the inventory says {said}, the machine has {has}",
            gpus,
            simulated,
            disk_gib,
        )
    what = f"{len(gpus)}x {models[0]}" + (" (simulated)" if simulated else "")
    if disk_gib is not None:
        what += f", {disk_gib:.0f} GiB free"
    return Check(now, True, what, gpus, simulated, disk_gib)


__all__ = [
    "NAME",
    "UTILIZATION_S",
    "MachineError",
    "MachineView",
    "SshProvider",
    "instance_type",
    "judge",
    "shares",
    "utilization",
]
