"""The agent's main loop: register, probe, run the job, watch for interruptions, obey `stop`.

The agent reports facts and follows the daemon's commands (docs/agent-protocol.md); the
things it decides alone are to stop the job when the cloud has announced the end of the
instance and the daemon cannot be reached to say so (`self_stop_s` after the notice), so a
job still gets its chance to checkpoint, and to stop it at the power-off less its checkpoint
allowance should the daemon's stop be late (window.py). Nothing here kills the job because the
daemon is gone: reports wait in the queue and are retried.

Threads: the reporter sends events; the log shipper sends the job's output; the watcher polls
the metadata endpoint; a heartbeat thread queues heartbeats; the job runner waits for the
child. Everything that needs a
decision (commands, signals, the job's exit) reaches the main thread through one inbox.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import platform
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from optimizer import __version__, protocol
from optimizer.agent.checkpointing import CheckpointSync, StoreFactory, open_checkpoint_store
from optimizer.agent.code import CodeUnavailable, Interrupted, prepare
from optimizer.agent.config import AgentConfig, Assignment
from optimizer.agent.imds import Notice, Watcher, make_watcher, watch
from optimizer.agent.logship import LogShipper
from optimizer.agent.progress import ProgressTail
from optimizer.agent.reporter import DaemonClient, DaemonError, EventQueue, Reporter
from optimizer.agent.runner import AdoptedJob, JobExit, JobRunner, job_env
from optimizer.agent.standby import Standby, end_orphan, wanted
from optimizer.agent.telemetry import EVENT_KIND as GPU_TELEMETRY
from optimizer.agent.telemetry import (
    ReadingSource,
    TelemetrySampler,
    local_source,
    open_nvml,
)
from optimizer.agent.window import WINDOW_REASON, CheckpointWindow
from optimizer.checkpoints import NoSpace
from optimizer.clock import machine_now
from optimizer.common.files import append_private, private_dir
from optimizer.common.procs import proc_start_ticks
from optimizer.common.retry import Backoff
from optimizer.protocol import CodeArchive, Command, Gang, Internode, Register, Wait

log = logging.getLogger(__name__)

# Notices after which the instance goes away (a rebalance recommendation is only a hint).
ENDING_ACTIONS = frozenset({"terminate", "stop", "hibernate", "preempted"})
JOB_LOG = "job.log"  # the job's stdout (and the agent's notes on it)
JOB_ERR_LOG = "job.err.log"  # the job's stderr


ProbeFn = Callable[[str, int | None], tuple[str, dict[str, Any]]]
# The inter-node probe: given the daemon's `internode` block, the judged result.
InternodeFn = Callable[[dict[str, Any]], dict[str, Any]]


def default_internode(config: AgentConfig) -> InternodeFn:
    """Run optimizer.probes.internode in a subprocess with a hard time limit."""

    def run(ask: dict[str, Any]) -> dict[str, Any]:
        timeout = float(ask.get("timeout_s") or protocol.INTERNODE_TIMEOUT_S)
        fraction = float(ask.get("min_fraction") or protocol.INTERNODE_MIN_FRACTION)
        argv = [
            sys.executable,
            "-m",
            "optimizer.probes.internode",
            *("--rank", str(int(ask["rank"])), "--nodes", str(int(ask["nodes"]))),
            *("--master-addr", str(ask["master_addr"])),
            *("--master-port", str(int(ask["master_port"]))),
            *("--min-fraction", str(fraction)),
            *("--timeout-s", str(timeout)),
        ]
        if ask.get("expected_gbps"):
            argv += ["--expected-gbps", str(float(ask["expected_gbps"]))]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout + 30, check=False
            )
        except subprocess.TimeoutExpired:
            return {"status": "fail", "reason": f"inter-node probe timed out after {timeout:g} s"}
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        try:
            result = json.loads(lines[-1])
        except (IndexError, ValueError):
            tail = (done.stderr or "").strip().splitlines()[-1:] or ["no output"]
            return {"status": "fail", "reason": f"inter-node probe crashed: {tail[0][:300]}"}
        return result if isinstance(result, dict) else {"status": "fail", "reason": "bad output"}

    return run


def node_address(daemon_url: str) -> str:
    """host:port where the other nodes reach this one: the address this host reaches the
    daemon from (127.0.0.1 for a daemon on this host), and a port free now."""
    parsed = urllib.parse.urlsplit(daemon_url)
    host = "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((parsed.hostname or "127.0.0.1", parsed.port or 80))
            host = probe.getsockname()[0]
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    return f"{host}:{port}"


def default_probe(config: AgentConfig) -> ProbeFn:
    def probe(kind: str, expected_gpus: int | None) -> tuple[str, dict[str, Any]]:
        from optimizer.probes import ProbeOptions, run_probe

        extra: dict[str, Any] = {"cpu_n": config.probe_cpu_n} if config.probe_cpu_n else {}
        options = ProbeOptions(
            kind=kind,
            timeout_s=config.probe_timeout_s,
            expected_gpus=expected_gpus,
            visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
            **extra,
        )
        result = run_probe(options)
        return result.status.value, result.to_dict()

    return probe


class Agent:
    """One agent run; `run()` returns the process exit status."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        client: DaemonClient | None = None,
        watcher: Watcher | None = None,
        probe: ProbeFn | None = None,
        internode: InternodeFn | None = None,
        register_backoff: Backoff | None = None,
        send_backoff: Backoff | None = None,
        telemetry_source: Callable[[], ReadingSource | None] | None = None,
        store_factory: StoreFactory | None = None,
        wall: Callable[[], datetime] = machine_now,
    ) -> None:
        self.config = config
        private_dir(config.agent_dir)
        self.client = client or DaemonClient(config.daemon_url, config.token, config.attempt_key)
        self.watcher = watcher or make_watcher(
            config.metadata_kind, config.metadata_url, interval_s=config.poll_s
        )
        self.probe = probe or default_probe(config)
        self.internode = internode or default_internode(config)
        self._gang: Gang | None = None  # the rendezvous, as the daemon last said it
        self._internode_done = False
        self.register_backoff = register_backoff or Backoff(base=1.0, cap=30.0)
        self.queue = EventQueue(config.agent_dir / "events.json", attempt_key=config.attempt_key)
        self.reporter = Reporter(self.queue, self.client, self._on_commands, backoff=send_backoff)
        self.logs = LogShipper(
            {"stdout": config.agent_dir / JOB_LOG, "stderr": config.agent_dir / JOB_ERR_LOG},
            config.agent_dir / "logs.json",
            self.client,
            config.attempt_key,
            backoff=Backoff(send_backoff.base, send_backoff.cap) if send_backoff else None,
            poll_s=config.log_poll_s,
        )
        self._telemetry_source = telemetry_source or self._default_telemetry_source
        self.telemetry: TelemetrySampler | None = None
        self.inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.state = "registering"
        self.job: JobRunner | AdoptedJob | None = None
        self.stop_reason: str | None = None
        self._quit = threading.Event()  # stops the watcher and heartbeat threads
        self._stop_heard = threading.Event()  # a stop command came (ends the handover polls)
        self._notice_at: float | None = None
        self._notice_event: str | None = None
        self._signalled = 0  # the exit status a signal while fenced gives
        self.store_factory = store_factory or open_checkpoint_store
        self._send_backoff = send_backoff
        self.checkpoints: CheckpointSync | None = None  # a job with a checkpoint location
        self._stop_deadline: float | None = None  # when a stop's grace runs out
        self.progress: ProgressTail | None = None  # reads the job's progress file
        # The checkpoint window (the stop at the power-off less the allowance), on `wall`.
        self.window = CheckpointWindow(wall)
        self.standby: Standby | None = None  # a job started in standby (docs/standby.md)

    # --- inputs ----------------------------------------------------------------------

    def deliver_signal(self, signum: int) -> None:
        """What the SIGTERM/SIGINT handlers call (SimpleQueue.put is safe in a handler)."""
        self.inbox.put(("signal", signum))

    def _on_commands(self, commands: list[Command]) -> None:
        for command in commands:
            if command.kind == "stop":
                self._stop_heard.set()
                self.inbox.put(("command", command))
            else:
                log.warning("ignoring unknown command %r", command.kind)

    def _on_notice(self, notice: Notice) -> None:
        event = self.queue.put("interruption_notice", notice.to_data())
        log.warning("interruption notice: %s %s at %s", notice.source, notice.action, notice.time)
        if notice.action in ENDING_ACTIONS and self._notice_at is None:
            self._notice_at, self._notice_event = time.monotonic(), event.id
            self.window.notice(notice.to_data())
            log.info("the job's stop is due at %s at the latest", self.window.due)
            threading.Thread(
                target=self._handover_polls, name="agent-handover", daemon=True
            ).start()

    def _handover_polls(self) -> None:
        """After an ending notice, ask the daemon for commands every `fence_poll_s` until a
        stop comes (or the agent ends), rather than on the heartbeats' answers alone: the
        stop that hands the job over (its replacement is ready, or the checkpoint window has
        come) then reaches the job within that, not within a heartbeat (2 s)."""
        backoff = Backoff(base=self.config.fence_poll_s, cap=5.0)
        while not self._stop_heard.is_set():
            delay = self.config.fence_poll_s
            try:
                self._on_commands(self.client.poll().commands)
            except DaemonError as exc:
                delay = backoff.next()
                log.warning("command poll failed (%s); retrying in %.1f s", exc, delay)
            else:
                backoff.reset()
            if self._quit.wait(delay):
                return

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Route SIGTERM/SIGINT to the inbox; the handlers they replace, to put back."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, lambda s, _f: self.deliver_signal(s))
        return previous

    # --- the run -----------------------------------------------------------------------

    def run(self) -> int:
        previous = self._install_signal_handlers()
        try:
            return self._run()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _run(self) -> int:
        answer = self._register()
        if isinstance(answer, int):
            return answer
        self.window.allowance_s = answer.job.checkpoint_allowance_s
        threading.Thread(target=self._heartbeats, args=(answer,), daemon=True).start()
        threading.Thread(
            target=watch, args=(self.watcher, self._on_notice, self._quit), daemon=True
        ).start()
        self.reporter.start()
        self.logs.start()
        self._start_telemetry()
        try:
            code = self._work(answer)
        finally:
            self._quit.set()
            if self.telemetry is not None:
                self.telemetry.stop(flush=True)  # the minute in progress goes out too
        deadline = time.monotonic() + self.config.flush_s
        self.logs.collect(final=True)  # the job has ended (or never started)
        flushed = self.reporter.flush(self.config.flush_s)
        logs_flushed = self.logs.flush(max(deadline - time.monotonic(), 0.0))
        self.reporter.stop()
        self.logs.stop()
        if not flushed:
            log.error("%d event(s) could not be delivered; giving up", len(self.queue))
        if not logs_flushed:
            log.error("%d chunk(s) of the job's output could not be delivered", self.logs.pending())
        log.info("agent done (exit %d)", code)
        return code

    # --- GPU telemetry -----------------------------------------------------------------

    def _default_telemetry_source(self) -> ReadingSource | None:
        """On a local instance the local cloud's injected readings, else the host's GPUs
        (labelled host); elsewhere NVML, or None where NVML cannot start (no GPU, no driver)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if self.config.cloud == "local":
            return local_source(self.config.metadata_url, visible)
        return open_nvml(visible)

    def _start_telemetry(self) -> None:
        """Start the sampler thread; without GPU readings say so once (a log line and one
        `gpu_telemetry` event with available: false) and send nothing more."""
        try:
            source = self._telemetry_source()
        except Exception as exc:  # telemetry must never stop the agent
            log.warning("no GPU telemetry: %s", exc)
            source = None
        if source is None:
            self.queue.put(GPU_TELEMETRY, {"available": False, "reason": "no GPU readings (NVML)"})
            return

        def emit(minutes: list[dict[str, Any]]) -> None:
            self.queue.put(GPU_TELEMETRY, {"minutes": minutes})

        self.telemetry = TelemetrySampler(source, emit, interval_s=self.config.telemetry_s)
        self.telemetry.start()

    def _register(self) -> Assignment | int:
        """Register, retrying until the daemon answers; an int exit status if a signal came."""
        instance_id = self.config.instance_id or self.watcher.instance_id() or platform.node()
        body = Register(
            attempt_key=self.config.attempt_key,
            instance_id=instance_id,
            provider=self.config.cloud,
            hostname=platform.node(),
            agent_version=__version__,
            address=node_address(self.config.daemon_url),
        ).wire()
        del body["attempt_key"]  # the client adds it
        log.info(
            "registering %s as %s with %s",
            self.config.attempt_key,
            instance_id,
            self.config.daemon_url,
        )
        while True:
            try:
                assignment = Assignment.parse(self.client.register(body))
                log.info("registered: job %r, attempt %d", assignment.job.name, assignment.attempt)
                return assignment
            except (DaemonError, ValueError) as exc:
                delay = self.register_backoff.next()
                log.warning("registration failed (%s); retrying in %.1f s", exc, delay)
            item = self._next(delay)
            if item is not None and item[0] == "signal":
                return 128 + int(item[1])

    def _next(self, timeout: float) -> tuple[str, Any] | None:
        try:
            return self.inbox.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def _heartbeats(self, assignment: Assignment) -> None:
        while not self._quit.wait(assignment.heartbeat_s):
            self.queue.put(
                "heartbeat",
                {
                    "state": self.state,
                    "job_pid": getattr(self.job, "pid", None),
                    "queued": len(self.queue),
                    "metadata_errors": self.watcher.errors,
                },
            )

    def _work(self, assignment: Assignment) -> int:
        previous = self._previous_run()
        if previous is not None and previous.get("phase") == "exited":
            log.info(
                "this attempt's job already ran (exit %s); not running it again",
                previous.get("exit"),
            )
            self.state = "exited"
            return int(previous.get("code", 0))
        if previous is not None and previous.get("phase") == "standby":
            end_orphan(previous, self.config.go_file, self.config.stop_grace_s)
        if previous is not None and previous.get("phase") == "started":
            self.job = AdoptedJob(int(previous["pid"]), previous.get("start_ticks"))
            if self.job.alive():
                log.warning("adopting the job an earlier agent left running (pid %s)", self.job.pid)
                self.state = "running"
                sync = self._checkpoint_sync(assignment)
                if sync is not None and (assignment.gang is None or assignment.gang.rank == 0):
                    sync.start_uploads()
                self._start_progress(assignment)
                return self._supervise()
        probes = assignment.probe  # the daemon's choice: a type probed in full gets `handover`
        if probes != "none":
            self.state = "probing"
            # The job's own count, else the GPUs the offer sold (set by the bootstrap).
            expected = assignment.job.expected_gpus
            if expected is None:
                expected = self.config.expected_gpus
            status, result = self._probe(probes, expected)
            self.queue.put("probe_result", {"status": status, "result": result})
            if status == "fail":
                self.state = "probe_failed"
                return self._await_stop()
        if self._pending_stop():
            return self._stopped()
        self._gang = assignment.gang
        if assignment.internode is not None:
            self._run_internode(assignment.internode)
        if assignment.fence is not None:
            sync = self._checkpoint_sync(assignment)
            if sync is not None:
                sync.start_prefetch()  # the restore after the fence fetches only what changed
            if wanted(assignment):
                return self._start_job(assignment, standby=True)
            return self._start_after_fence(assignment)
        return self._start_job(assignment)

    def _start_after_fence(self, assignment: Assignment) -> int:
        """Wait for the fence to lift, then start the job."""
        assert assignment.fence is not None
        lifted = self._await_fence(assignment.fence)
        if self.checkpoints is not None:
            self.checkpoints.end_prefetch(self.config.flush_s)
        if not lifted:
            return self._stopped() if self.stop_reason is not None else self._signalled
        return self._start_job(assignment)

    def _checkpoint_sync(self, assignment: Assignment) -> CheckpointSync | None:
        """The checkpoint sync of a job with a checkpoint location (made once), else None."""
        ref = assignment.job.checkpoint
        if ref is None:
            return None
        if self.checkpoints is None:
            pace = self._send_backoff
            self.checkpoints = CheckpointSync(
                ref,
                self.config,
                self.queue,
                store_factory=self.store_factory,
                restore_backoff=Backoff(pace.base, pace.cap) if pace else None,
            )
        return self.checkpoints

    def _await_fence(self, why: Wait) -> bool:
        """Wait until the daemon lifts the fence (an earlier attempt's job still runs); False
        if a stop or a signal came first. Polls every `fence_poll_s`, so the job starts
        within that of the daemon seeing the old job exit."""
        self.state = "fenced" if self.standby is None else "standby"
        log.info("waiting before starting the job: %s", why)
        backoff = Backoff(base=self.config.fence_poll_s, cap=5.0)
        while True:
            delay = self.config.fence_poll_s
            if self.standby is not None and self.job is not None:
                self.standby.note_ready(self.job.done(), self.queue)
                delay = self.standby.poll_s(delay)
            try:
                answer = self.client.poll()
            except DaemonError as exc:
                delay = backoff.next()
                log.warning("fence poll failed (%s); retrying in %.1f s", exc, delay)
            else:
                backoff.reset()
                self._on_commands(answer.commands)
                if answer.gang is not None:
                    self._gang = answer.gang
                if answer.internode is not None:
                    self._run_internode(answer.internode)
                    continue  # report it and ask again at once
                if answer.fence is None:
                    log.info("fence lifted")
                    return not self._pending_stop()
            item = self._next(delay)
            if item is None:
                continue
            kind, value = item
            if kind == "command" and value.kind == "stop":
                self.stop_reason = value.reason or "stop"
                return False
            if kind == "signal":
                self._signalled = 128 + int(value)
                return False

    def _run_internode(self, ask: Internode) -> None:
        """Run the inter-node probe once (every node at once, at the daemon's word), and
        report it; the daemon judges the gang from every node's report."""
        if self._internode_done:
            return
        self._internode_done = True
        self.state = "probing_internode"
        log.info("running the inter-node probe as node %s of %s", ask.rank, ask.nodes)
        try:
            result = self.internode(ask.wire())
        except Exception as exc:  # a crashed probe has failed; it must not end the agent
            log.exception("the inter-node probe crashed")
            result = {"status": "fail", "reason": f"{type(exc).__name__}: {exc}"}
        self.queue.put(
            "internode_probe",
            {
                "status": result.get("status", "fail"),
                "reason": result.get("reason"),
                "result": result,
            },
        )
        self.reporter.flush(5.0)
        self.state = "fenced"

    def _probe(self, kind: str, expected: Any) -> tuple[str, dict[str, Any]]:
        log.info("running the %s probe", kind)
        try:
            return self.probe(kind, int(expected) if expected else None)
        except Exception as exc:  # a probe that crashes has failed, it must not end the agent
            log.exception("the probe crashed")
            return "fail", {"error": f"{type(exc).__name__}: {exc}"}

    def _pending_stop(self) -> bool:
        """Drain the inbox before starting the job: a stop or a signal that came meanwhile."""
        while (item := self._next(0)) is not None:
            kind, value = item
            if kind == "command" and value.kind == "stop":
                self.stop_reason = value.reason or "stop"
            elif kind == "signal":
                self.stop_reason = f"signal {value}"
        return self.stop_reason is not None

    def _await_stop(self) -> int:
        log.warning("probe failed: waiting for the daemon's stop command")
        while True:
            item = self._next(1.0)
            if item is None:
                continue
            kind, value = item
            if kind == "command" and value.kind == "stop":
                self.stop_reason = value.reason or "stop"
                return self._stopped()
            if kind == "signal":
                return 128 + int(value)

    def _stopped(self) -> int:
        self.queue.put("stopped", {"reason": self.stop_reason})
        self.state = "stopped"
        return 0

    def _restore(self, assignment: Assignment, sync: CheckpointSync | None) -> int | None:
        """Restore the job's checkpoint and start its uploads; the exit status when the
        attempt cannot start (no room for the checkpoint), else None."""
        if sync is None:
            return None
        self.state = "restoring"
        try:
            sync.restore()  # on every node of a gang...
        except NoSpace as exc:
            return self._cannot_start("restore", str(exc))  # reported by the sync
        if assignment.gang is None or assignment.gang.rank == 0:
            sync.start_uploads()  # ...and uploaded from rank 0's alone
        return None

    def _start_job(self, assignment: Assignment, *, standby: bool = False) -> int:
        """Restore the checkpoint, run the job, supervise it. `standby` (docs/standby.md): the
        fence still holds; the job starts now and gets its go once it lifts, after the
        restore (`_await_go`)."""
        job = assignment.job
        if self._gang is not None:
            assignment = dataclasses.replace(assignment, gang=self._gang)
        sync = self._checkpoint_sync(assignment)
        if not standby and (failed := self._restore(assignment, sync)) is not None:
            return failed
        local = sync.local_dir if sync is not None else None
        progress = self._start_progress(assignment, fresh=True)
        env = job_env(os.environ, assignment.protocol_env(local, progress))
        if standby:
            self.standby = Standby(self.config.go_file)
            env.update(self.standby.prepare())
        checkpoint = env["GPUOPT_CHECKPOINT_DIR"]
        if checkpoint and "://" not in checkpoint:
            Path(checkpoint).mkdir(parents=True, exist_ok=True)
        workdir = Path(job.workdir) if job.workdir else self.config.agent_dir
        log_path = self.config.agent_dir / JOB_LOG
        if job.code is not None:
            self.state = "fetching_code"
            try:
                folder = prepare(
                    self.client, job.code, self.config.agent_dir.parent / "code", wait=self._wait
                )
            except Interrupted:
                return self._stopped() if self.stop_reason is not None else self._signalled
            except CodeUnavailable as exc:
                if standby:  # tried again once the fence lifts, as without standby
                    log.warning("no code for a standby start (%s): starting after the fence", exc)
                    self.standby = None
                    return self._start_after_fence(assignment)
                return self._code_failed(job.code, str(exc))
            workdir = folder / job.workdir if job.workdir else folder

        def started(pid: int, phase: str) -> None:
            if self.standby is None:
                self._report_started(pid, log_path)
            else:  # reported at the go, unless that came first
                self.standby.run_started(
                    pid,
                    waiting=lambda: self._save_run(
                        {"phase": "standby", "pid": pid, "start_ticks": proc_start_ticks(pid)}
                    ),
                    report=lambda: self._report_started(pid, log_path),
                )

        self.state = "standby" if standby else "setup" if job.setup else "starting"
        self.logs.begin()
        self.job = JobRunner(
            run=job.run,
            setup=job.setup,
            env=env,
            log_path=log_path,
            err_path=self.config.agent_dir / JOB_ERR_LOG,
            cwd=workdir,
            on_started=started,
            # wakes `_supervise` at once: the exit is reported (and a replacement's fence
            # lifted) without waiting out its poll
            on_exit=lambda: self.inbox.put(("exited", None)),
        ).start()
        if standby:
            return self._await_go(assignment, sync, log_path)
        return self._supervise()

    def _report_started(self, pid: int, log_path: Path) -> None:
        self._save_run({"phase": "started", "pid": pid, "start_ticks": proc_start_ticks(pid)})
        data: dict[str, Any] = {"pid": pid, "log": str(log_path)}
        if self.standby is not None:  # when it started, before its go (now)
            data.update(standby=True, standby_since=self.standby.since)
        self.queue.put("job_started", data)
        self.state = "running"

    def _await_go(self, assignment: Assignment, sync: CheckpointSync | None, log_path: Path) -> int:
        """The job waits in standby: once the fence lifts, restore its checkpoint, then give
        the go; a stop or a signal first ends it (told to stop, then SIGTERM) and the attempt
        ends as a stop at the fence does, the job never reported started."""
        assert self.standby is not None and assignment.fence is not None
        lifted = self._await_fence(assignment.fence)
        if sync is not None:
            sync.end_prefetch(self.config.flush_s)
        if not lifted:
            self._end_standby()
            return self._stopped() if self.stop_reason is not None else self._signalled
        if (failed := self._restore(assignment, sync)) is not None:
            return failed  # the job in standby ended first (`_cannot_start`)
        self.state = "setup"  # until `run` starts (at once, where it waits for the go)
        self.standby.go(report=lambda pid: self._report_started(pid, log_path))
        return self._supervise()

    def _end_standby(self) -> None:
        """End the job that waits in standby (it has loaded nothing, so nothing is lost)."""
        job = self.job
        assert self.standby is not None and job is not None
        self.state = "stopping"
        self.standby.stop()
        job.stop(self.config.stop_grace_s)
        job.wait(self.config.stop_grace_s + 10.0)
        log.info("the job started in standby has ended before its go")

    def _start_progress(self, assignment: Assignment, *, fresh: bool = False) -> Path:
        """Tail the job's progress file (docs/progress.md); a gang's is read on its rank 0's
        instance only, as its checkpoints are uploaded from there. `fresh`: the job is about
        to start, so a file left on this disk before is not its. The file's path."""
        path = self.config.progress_file
        if fresh:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        gang = self._gang or assignment.gang
        if self.progress is None and (gang is None or gang.rank == 0):
            self.progress = ProgressTail(path, self.queue, poll_s=self.config.progress_poll_s)
            self.progress.start()
        return path

    def _wait(self, delay: float) -> bool:
        """Wait `delay` s before a retry; False when a stop or a signal came meanwhile."""
        item = self._next(delay)
        if item is None:
            return True
        kind, value = item
        if kind == "command" and value.kind == "stop":
            self.stop_reason = value.reason or "stop"
            return False
        if kind == "signal":
            self._signalled = 128 + int(value)
            return False
        return True

    def _code_failed(self, code: CodeArchive, why: str) -> int:
        """The job cannot start without its code (see `_cannot_start`)."""
        self.queue.put("code_failed", {"sha256": code.sha256, "error": why})
        return self._cannot_start("code", why)

    def _cannot_start(self, phase: str, why: str) -> int:
        """The job cannot start (no code, no room for its checkpoint): said in its log and as
        its exit (`phase`, exit 1), so the daemon ends the attempt failed with the reason. A job
        waiting in standby is ended first."""
        log.error("%s", why)
        if self.standby is not None and self.job is not None and not self.job.done():
            self._end_standby()
        self.logs.begin()
        with contextlib.suppress(OSError), append_private(self.config.agent_dir / JOB_ERR_LOG) as f:
            f.write(f"[gpuopt agent] {why}\n".encode())
        data: dict[str, Any] = {"exit_code": 1, "signal": None, "phase": phase, "error": why}
        data["log_chunks"] = self.logs.finish(self.config.flush_s)
        self.queue.put("job_exited", data)
        self._save_run({"phase": "exited", "exit": data, "code": 1})
        self.state = "exited"
        return 1

    def _supervise(self) -> int:
        """Until the job ends: obey stop, forward signals, stop it alone if the daemon is gone."""
        job = self.job
        assert job is not None
        while not job.done():
            item = self._next(self._window_wait(0.2))
            if item is not None:
                kind, value = item
                if kind == "command" and value.kind == "stop":
                    self._stop_job(value.reason or "stop", value.grace_s)
                elif kind == "signal":
                    log.info("forwarding signal %s to the job", value)
                    job.signal(int(value))
            self._maybe_self_stop()
            self._maybe_window_stop()
        end = job.wait()
        assert end is not None
        if self.progress is not None:
            self.progress.stop()  # its last report goes out before its exit
        self._final_checkpoint()
        self.state = "exited"
        data = end.to_data()
        if isinstance(job, AdoptedJob):
            data["adopted"] = True
        # The output first, so whoever follows it sees all of it once the job has ended.
        data["log_chunks"] = self.logs.finish(self.config.flush_s)
        self.queue.put("job_exited", data)
        self._save_run({"phase": "exited", "exit": data, "code": self._code(end)})
        if self.stop_reason is not None:
            return self._stopped()
        return self._code(end)

    def _final_checkpoint(self) -> None:
        """Upload what the job committed last, before its exit is reported: the daemon lifts
        a replacement's fence on `job_exited`, and its restore must find this checkpoint.
        After a stop it gets what is left of the stop's grace (at least a few seconds)."""
        if self.checkpoints is None or self.checkpoints.uploader is None:
            return
        self.state = "uploading"
        timeout = self.config.flush_s
        if self._stop_deadline is not None:
            timeout = self._stop_deadline - time.monotonic()
        commits = self.checkpoints.finish(timeout)
        if commits:
            log.info("final checkpoint(s) uploaded: %s", ", ".join(c.name for c in commits))

    def _code(self, end: JobExit) -> int:
        if self.stop_reason is not None:
            return 0
        if end.exit_code is not None:
            return end.exit_code
        return 128 + (end.signal or 0)

    def _stop_job(self, reason: str, grace: Any) -> None:
        if self.stop_reason is not None or self.job is None:
            return
        self.stop_reason = reason
        grace_s = float(grace) if grace is not None else self.config.stop_grace_s
        self._stop_deadline = time.monotonic() + grace_s
        if self.checkpoints is not None and self.checkpoints.uploader is not None:
            self.checkpoints.uploader.finalize()  # what the job commits now is its last
        log.warning("stopping the job (%s): SIGTERM, SIGKILL after %.0f s", reason, grace_s)
        self.state = "stopping"
        self.job.stop(grace_s)

    def _window_wait(self, most: float) -> float:
        """How long the supervising loop may wait: `most`, or less when the window's stop
        falls due sooner, so the stop comes at its instant and not a wait late."""
        left = self.window.left() if self.stop_reason is None else None
        return most if left is None else min(max(left, 0.0), most)

    def _maybe_window_stop(self) -> None:
        """Stop the job at the power-off less its allowance if no stop has come by then (one
        that came first wins: `_stop_job` stops once)."""
        if self.stop_reason is not None:
            return
        left = self.window.left()
        if left is not None and left <= 0:
            self._stop_job(f"{WINDOW_REASON} (the agent's own stop at the window)", None)

    def _maybe_self_stop(self) -> None:
        if self._notice_at is None or self.stop_reason is not None:
            return
        if time.monotonic() - self._notice_at < self.config.self_stop_s:
            return
        unsent = any(e.id == self._notice_event for e in self.queue.pending(len(self.queue)))
        if unsent:  # the daemon never took the notice: the instance is ending regardless
            self._stop_job("interruption notice; daemon unreachable", None)

    # --- the attempt's record on this instance's disk ------------------------------------

    def _run_path(self) -> Path:
        return self.config.agent_dir / "run.json"

    def _previous_run(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self._run_path().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("attempt_key") != self.config.attempt_key:
            return None
        return data

    def _save_run(self, values: dict[str, Any]) -> None:
        path = self._run_path()
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps({"attempt_key": self.config.attempt_key, **values}))
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("could not record the job's state in %s: %s", path, exc)
