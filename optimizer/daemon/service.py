"""The daemon: the store, the providers, the loops on the scheduler, the HTTP server, signals.

The daemon knows no web framework and no API: it serves whatever ASGI app its `face` builds
from it (`gpuopt daemon` passes the HTTP API's `optimizer.api.serve.daemon_app`). So the
dependencies run one way, from the API to the daemon. `Daemon(config, face=...).run()` is
`gpuopt daemon`. Tests and benches use `start()`/`stop()` and may inject the clock, the random
source of the alert back-off, offer sources and the HTTP client.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from pydantic import SecretStr
from sqlalchemy import text

from optimizer import __version__
from optimizer.alerts.channels import build_notifiers
from optimizer.alerts.outbox import Emitter
from optimizer.alerts.routing import Router
from optimizer.clock import Clock, utc_now
from optimizer.common.files import private_dir
from optimizer.daemon import settings
from optimizer.daemon.config import DaemonConfig, ProviderConfig, weak_token_problem
from optimizer.daemon.errors import DaemonError
from optimizer.daemon.eventlog import JobEventLog
from optimizer.daemon.leader import Election, PostgresElection, make_leadership
from optimizer.daemon.logsetup import quiet_libraries
from optimizer.daemon.loops.deliver import DeliverLoop
from optimizer.daemon.loops.poll import PollLoop
from optimizer.daemon.loops.queue import QueueLoop, queue_handles
from optimizer.daemon.loops.reconcile import ReconcileLoop
from optimizer.daemon.loops.retention import RetentionLoop
from optimizer.daemon.loops.watch import PolicyWatcher
from optimizer.daemon.metrics import Metrics
from optimizer.daemon.policies import PolicyRegistry
from optimizer.daemon.prices import PriceWatch
from optimizer.daemon.providers import ProviderHandle, make_handles, provider_secrets
from optimizer.daemon.scheduler import LoopScheduler
from optimizer.daemon.server import ApiServer, is_loopback
from optimizer.daemon.spend import CostCollector
from optimizer.jobs.ledger import CostFreezer
from optimizer.jobs.measured import ProbeFailureWatch
from optimizer.jobs.reconcile import JobReconciler
from optimizer.jobs.summary import MonthlySummary
from optimizer.jobs.windows import WindowWatch
from optimizer.model import EventKind, Market
from optimizer.store import Store
from optimizer.store.migrate import SchemaError, UnreachableError, ensure_ready
from providers.base import OfferSource

log = logging.getLogger(__name__)

TOKEN_FILE = "api-token"

HttpFace = Callable[["Daemon"], Any]
"""Builds the ASGI app the daemon serves, once, from the daemon's parts (its store, registry,
emitter, metrics, clock, token, `wakeup`, `readiness`, leadership)."""


def resolve_token(config: DaemonConfig) -> tuple[SecretStr, Path | None]:
    """The configured API token, else the one in `<data dir>/api-token` (created with mode
    0600 on first start). Returns (token, file it came from or None)."""
    if config.api.token is not None:
        return config.api.token, None
    path = config.effective_data_dir / TOKEN_FILE
    try:
        saved = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        saved = ""
    if saved:
        return SecretStr(saved), path
    settings.make_private_dir(path.parent)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as stream:
        stream.write(token + "\n")
    return SecretStr(token), path


class ClusterWakeup(threading.Event):
    """The API's wake-up: runs a reconcile pass here when this replica leads, else asks the
    leader for one (PostgreSQL NOTIFY), so an agent's interruption notice acts at once
    whichever replica received it."""

    def __init__(self, local: threading.Event, leadership: Election) -> None:
        super().__init__()
        self.local = local
        self.leadership = leadership

    def set(self) -> None:
        super().set()
        if self.leadership.is_leader:
            self.local.set()
        else:
            self.leadership.nudge()


class Daemon:
    """One gpuopt daemon. Public parts for later steps: `reconcile.reconcilers` (append a
    reconciler), `reconcile.wakeup` (set it to run a pass now), `wakeup` (the same, from any
    replica), `emitter` (record events with alerts), `handles` (providers). `face` builds
    the app it serves (see `HttpFace`). The constructor binds the API's socket before
    anything else, so a taken port creates no database, data directory or token file;
    `stop()`, or a failed `start()`, releases it."""

    def __init__(
        self,
        config: DaemonConfig,
        *,
        face: HttpFace,
        clock: Clock = utc_now,
        rng: random.Random | None = None,
        sources: Mapping[str, OfferSource] | None = None,
        http_client: httpx.Client | None = None,
        store: Store | None = None,
    ) -> None:
        quiet_libraries(config.api.access_log)
        self.config = config
        self.clock = clock
        self._check_listener()
        # Bind first: a taken port or a bad address fails here, with one line, before the
        # store, the data directory or the token file is touched.
        self.server = ApiServer(
            config.api.host,
            config.api.port,
            access_log=config.api.access_log,
            limits=config.api.limits(),
        )
        self.server.bind()
        try:
            self._assemble(face, clock, rng, sources, http_client, store)
        except BaseException:
            self.server.close()
            raise

    def _assemble(
        self,
        face: HttpFace,
        clock: Clock,
        rng: random.Random | None,
        sources: Mapping[str, OfferSource] | None,
        http_client: httpx.Client | None,
        store: Store | None,
    ) -> None:
        config = self.config
        self.metrics = Metrics(start_time=clock().timestamp())
        self.store = store or Store(config.effective_database_url, clock=clock)
        self.event_log = JobEventLog()  # each job's events as log lines, once committed
        self.store.events.listen(self.event_log)
        self.registry = PolicyRegistry(default=config.policies.default)
        self.emitter = Emitter(
            self.store.events, Router(config.alerts.routes, config.alerts.channels.keys())
        )
        if sources is not None:
            self.handles = {
                name: ProviderHandle.given(name, config.providers.get(name, ProviderConfig()), src)
                for name, src in sources.items()
            }
        else:
            self.handles = make_handles(
                config.enabled_providers(), config.effective_data_dir, self.store, clock
            )
        secrets = [*config.secrets(), *provider_secrets()]
        config.data_transfer.apply()  # the egress rates a move of a job's state is priced at
        self.prices = PriceWatch(
            self.store,
            self.registry,
            self.emitter,
            drop_fraction=config.prices.drop_fraction,
            probe_window=config.probes.window(),
        )
        self.polls = [
            PollLoop(
                handle,
                market,
                self.store,
                self.emitter,
                clock,
                metrics=self.metrics,
                after=self._rank_prices,
                secrets=secrets,
            )
            for handle in self.handles.values()
            for market in map(Market, handle.capabilities.markets)
        ]
        self.reconcile = ReconcileLoop(
            self.store,
            self.registry,
            self.emitter,
            clock,
            providers=self.handles,
            metrics=self.metrics,
            leading=lambda: self.leadership.is_leader,
        )
        self.retention = RetentionLoop(
            self.store,
            clock,
            config.prices.retention.retention(),
            batch_rows=config.prices.retention.batch_rows,
            log_retention=timedelta(days=config.logs.retention_days),
            telemetry_retention=(
                timedelta(days=config.telemetry.minute_days),
                timedelta(days=config.telemetry.hourly_days),
            ),
            agent_event_retention=timedelta(days=config.agent_events.retention_days),
            leading=lambda: self.leadership.is_leader,
        )
        self.queues = [
            QueueLoop(handle, self.store, clock, wake=self.reconcile.wakeup.set)
            for handle in queue_handles(self.handles)
        ]
        self.leadership = make_leadership(
            self.store,
            check_s=config.leader.check_s,
            lease_s=config.leader.lease_s,
            on_wakeup=self.reconcile.wakeup.set,
            api_url=self._api_url,
            clock=clock,
        )
        self.leadership.listeners.append(self._leadership_changed)
        self._own_http = http_client is None
        self.http = http_client or httpx.Client(
            timeout=config.alerts.retry.timeout_s,
            follow_redirects=False,
            headers={"User-Agent": f"gpuopt/{__version__}"},
        )
        self.deliver = DeliverLoop(
            self.store,
            build_notifiers(config.alerts.channels, self.http, clock),
            clock,
            retry=config.alerts.retry,
            rng=rng,
            api_url=config.api.public_url,
            metrics=self.metrics,
        )
        self.watcher = PolicyWatcher(
            config.effective_policy_dir,
            self.registry,
            self.store,
            self.emitter,
            clock,
            metrics=self.metrics,
            on_change=self._policies_changed,
            records=lambda: self.leadership.is_leader,
        )
        self.scheduler = LoopScheduler(
            metrics=self.metrics, misfire_grace_s=config.loops.misfire_grace_s, clock=clock
        )
        self.cost_metrics = CostCollector(self.store, self.registry, clock)
        self.token, self.token_file = resolve_token(config)
        self.wakeup = ClusterWakeup(self.reconcile.wakeup, self.leadership)
        self._polled: set[str] = set()  # polls that have run at least once in this process
        self._first_polls = threading.Lock()
        self._leader_loops: list[str] = []
        # Loops a takeover runs once its first reconcile pass has ended (see
        # _leadership_changed), and the lock that hands them over.
        self._after_takeover_pass: list[str] = []
        self._takeover_lock = threading.Lock()
        self._was_ready = False
        self._stop = threading.Event()
        self.stopping = threading.Event()  # set as stop() begins: long API streams end then
        self._started = False
        self.started_at = clock()
        self.app = face(self)  # last: the face may read any part of the daemon

    def _check_listener(self) -> None:
        """Refuse a listener the config does not make safe (before anything is touched)."""
        if not is_loopback(self.config.api.host) and self.config.api.token is None:
            raise DaemonError(
                f"refusing to listen on {self.config.api.host} without an API token: set "
                "api.token in the config or GPUOPT_API__TOKEN (or bind 127.0.0.1)"
            )
        weak = weak_token_problem(self.config)
        if weak:
            raise DaemonError(weak)

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.server.url

    def _api_url(self) -> str:
        """Where agents and alert links reach this API: api.public_url, else the bound URL."""
        return self.config.api.public_url or self.server.url

    def start(self) -> None:
        """Open the store, join the election, load policies, start the loops and serve the
        API on the socket the constructor bound. On failure whatever was claimed is given
        back."""
        try:
            self._start()
        except BaseException:
            self.leadership.stop()
            self.server.stop()
            raise

    def _start(self) -> None:
        settings.make_private_dir(self.config.effective_data_dir)
        private_dir(self.config.effective_policy_dir)  # policies say where money goes
        self.leadership.claim()  # SQLite: a second daemon stops here, before touching the store
        try:
            ensure_ready(self.store.engine)  # empty: created at head; else at head or refused
        except (SchemaError, UnreachableError) as exc:
            raise DaemonError(str(exc)) from exc
        self.leadership.start()
        self.watcher.run_once()  # policies are in force before anything reads them
        self.metrics.watch(self.store, self.registry.status_counts)
        self.metrics.registry.register(self.cost_metrics)
        if self.deliver.api_url is None:
            self.deliver.api_url = self._api_url()
        loops = self.config.loops
        for poll in self.polls:
            cfg = poll.handle.config
            often = poll.market in (Market.SPOT, Market.OWNED)  # free GPUs change as spot does
            every = cfg.spot_interval_s if often else cfg.on_demand_interval_s
            self._lead(poll.name, self._polling(poll), every)
        for handle in self.handles.values():
            names = tuple(p.name for p in self.polls if p.handle is handle)
            handle.on_offers_changed = partial(self._offers_changed, handle.name, names)
        for queue in self.queues:  # back to back: each run is one long poll
            self._lead(queue.name, queue.run_once, 0.5)
        local = self.handles.get("local")
        if local is not None and int(getattr(local.config, "history_days", 0) or 0) > 0:
            from optimizer.daemon.local_history import LocalHistory

            # Once, at the first tick a leader has: days of simulated prices before the first
            # poll's (providers/local/history.py); later ticks return at once.
            self.local_history = LocalHistory(
                local,
                database_url=self.config.effective_database_url,
                data_dir=self.config.effective_data_dir,
                clock=self.clock,
                stopping=self._stop,
            )
            self._lead("local-history", self.local_history.run_once, 3600.0)
        self.scheduler.add("watch", self.watcher.run_once, loops.watch_s, run_now=False)
        # tick() refuses to overlap itself, so a wake-up is never dropped as a second instance
        self._lead("reconcile", self._reconcile_tick, loops.reconcile_s, guards_overlap=True)
        self._lead("deliver", self.deliver.run_once, loops.deliver_s)
        self._lead("retention", self.retention.run_once, loops.retention_s)
        self.reconcile.attach(lambda: self.scheduler.run_now("reconcile"))
        window = self.config.probes.window()
        # first in the pass: a schedule window's boundary alerted before jobs act on it
        self.reconcile.reconcilers.append(WindowWatch(window))
        jobs = JobReconciler(
            self._api_url,
            agent=self.config.agent.settings(),
            probe_window=window,
            decide_every=timedelta(seconds=loops.reconcile_s),
        )
        self.reconcile.reconcilers.append(jobs)
        # types whose probes keep failing: one alert per streak (the ranking demotes them)
        self.reconcile.reconcilers.append(ProbeFailureWatch(window))
        # last in the pass: the attempts the pass ended have their cost lines frozen
        self.reconcile.reconcilers.append(CostFreezer())
        # then, on a month's first pass, last month's cost summary (once per month)
        self.reconcile.reconcilers.append(MonthlySummary())
        self.scheduler.start()
        self.server.start(self.app)
        self._started = True
        log.info(
            "gpuopt %s serving %s; providers: %s; policies from %s; %s (replica %s)",
            __version__,
            self.url,
            ", ".join(self.handles) or "none",
            self.config.effective_policy_dir,
            self.leadership.role,
            self.leadership.replica,
        )

    def _lead(
        self, name: str, func: Callable[[], object], every_s: float, *, guards_overlap: bool = False
    ) -> None:
        """Schedule a loop that only the leader runs (followers skip their ticks)."""

        def run() -> None:
            if self.leadership.is_leader:
                func()

        self._leader_loops.append(name)
        self.scheduler.add(name, run, every_s, guards_overlap=guards_overlap)

    def _leadership_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        self.metrics.leader_changes.labels("leader" if leading else "follower").inc()
        if not leading:
            return
        self._start_hosted()
        self.watcher.resync()  # record policy changes made while no leader was recording
        # A takeover acts now, not at the next tick. Only loops already scheduled: at start
        # the election is won before the loops are added, and each one runs when it is
        # added (the watch pass right after the election, in _start). The reconcile pass
        # first: the polls (CPU-bound: a replica's first builds every local offer) and
        # retention would share the interpreter with it and slow it down, and the store
        # already holds the last leader's prices; they run as soon as that pass has ended.
        held = {*(poll.name for poll in self.polls), "retention"}
        names = [n for n in [*self._leader_loops, "watch"] if n in self.scheduler.names]
        with self._takeover_lock:
            self._after_takeover_pass = [n for n in names if n in held]
        for name in names:
            if name not in held:
                self.scheduler.run_now(name)
        if isinstance(self.leadership, PostgresElection):  # after: the loops need not wait
            self.emitter.emit(
                EventKind.LEADER_ELECTED,
                f"replica {self.leadership.replica} now leads: it polls, reconciles jobs "
                "and sends alerts",
                data={"replica": self.leadership.replica},
            )

    def _reconcile_tick(self) -> None:
        """The reconcile loop's tick; after the first one since a takeover, the loops that
        waited for it."""
        try:
            self.reconcile.tick()
        finally:
            with self._takeover_lock:
                waiting, self._after_takeover_pass = self._after_takeover_pass, []
            for name in waiting:
                self.scheduler.run_now(name)

    def _start_hosted(self) -> None:
        """Start what the leader hosts for running instances (the local cloud's metadata
        endpoint and ticker) now, not at the first pass that happens to describe one: they
        lost their metadata, and their power-offs their enforcer, when the last leader
        died."""
        for handle in self.handles.values():
            try:
                handle.start_hosted()
            except Exception as exc:  # the takeover goes on; the first launch tries again
                log.warning("could not start provider %s on taking over: %s", handle.name, exc)

    def _offers_changed(self, provider: str, polls: tuple[str, ...], freed: bool) -> None:
        """A provider's offers changed (owned machines: a launch took GPUs, an end freed
        them): its polls run now, not at their next tick, so the next launch ranks what is
        free; where capacity came back, its pools' cooldowns end (a launch that found no
        free GPU cooled one)."""
        if freed and self.leadership.is_leader:
            try:
                self.store.jobs.end_cooldowns(provider, self.clock())
            except Exception:  # the store is down: the cooldowns end on their own
                log.warning("could not end %s's pool cooldowns", provider, exc_info=True)
        for name in polls:
            self.scheduler.run_now(name)

    def _polling(self, poll: PollLoop) -> Callable[[], None]:
        def run() -> None:
            try:
                poll.run_once()
            finally:
                self._polled_once(poll.name)

        return run

    def _polled_once(self, name: str) -> None:
        """After each poll. When the last of the first polls ends, rank the policies: each
        one's baseline (after a restart: compared with the stored state). Ranking after the
        first poll alone would take a baseline over one market's offers (spot, say, with no
        on-demand price for a bid cap's fraction), and the next poll's offers would then look
        like a new best offer and pools crossing the bid cap, at every fresh start."""
        with self._first_polls:
            if name in self._polled:
                return
            if {p.name for p in self.polls} - self._polled == {name}:
                self.prices.evaluate(self.clock())
            self._polled.add(name)  # after the baseline: /readyz waits for it

    def _rank_prices(self, now: datetime | None = None) -> None:
        """Rank every policy and raise what changed: on the leader, once every poll has run
        (see `_polled_once`)."""
        if not self.leadership.is_leader:
            return
        if any(p.name not in self._polled for p in self.polls):
            return
        self.prices.evaluate(now or self.clock())
        # New prices: a reconcile pass now decides on moving running jobs (migration) at once
        # rather than up to a reconcile interval later.
        self.reconcile.wakeup.set()

    def _policies_changed(self) -> None:
        """The policies in force changed: reconcile now, and rank them now rather than at
        the next poll (a policy edited down to no candidate raises `best_offer.lost` at
        once, not up to a spot interval later)."""
        self.reconcile.wakeup.set()
        self._rank_prices()

    def stop(self) -> None:
        """Let each loop finish its current iteration, stop serving, close everything."""
        log.info("stopping: waiting for the loops' current iterations")
        self.stopping.set()  # streams following job output end now
        self.retention.stop()  # a long pruning pass ends after its current batch
        self.reconcile.alarm.close()  # no pass is woken at an instant any more
        self.scheduler.shutdown(wait=True)
        self.leadership.stop()  # after the loops; the release lets a follower take over at once
        self.server.stop()
        for handle in self.handles.values():
            handle.close()
        if self._own_http:
            self.http.close()
        self.store.events.unlisten(self.event_log)
        self.store.close()
        self._started = False
        log.info("stopped")

    def request_stop(self) -> None:
        self._stop.set()

    def run(self, announce: Callable[[str], None] | None = None) -> int:
        """Start, serve until SIGTERM/SIGINT (or `request_stop()`), stop; the exit status."""
        first = True

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            nonlocal first
            if not first:
                os._exit(128 + signum)  # a second signal: the user insists
            first = False
            name = signal.Signals(signum).name
            log.info("%s received: finishing the current loop iterations", name)
            self._stop.set()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            if announce is not None:
                announce(self.url)
            while not self._stop.wait(0.5):
                if not self.server.alive:
                    log.error("the API server stopped unexpectedly")
                    self.stop()
                    return 1
            self.stop()
            return 0
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    # -- readiness ---------------------------------------------------------------------------

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        checks: dict[str, Any] = {}
        try:
            with self.store.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            checks["store"] = "ok"
        except Exception as exc:
            checks["store"] = f"unavailable: {type(exc).__name__}"
        checks["scheduler"] = "running" if self.scheduler.running else "stopped"
        leading = self.leadership.is_leader
        checks["role"] = "leader" if leading else "follower"
        checks["replica"] = self.leadership.replica
        waiting = sorted(p.name for p in self.polls if p.name not in self._polled)
        if leading:
            checks["first_polls"] = "done" if not waiting else {"waiting": waiting}
        checks["policies"] = len(self.registry.snapshot())
        # A follower serves the API from the shared store; a daemon that starts as the leader
        # waits for its first polls. Once ready, a replica stays ready when it takes over:
        # the store already holds the previous leader's offers.
        ready = checks["store"] == "ok" and self.scheduler.running
        if ready and not self._was_ready and leading and waiting:
            ready = False
        self._was_ready = self._was_ready or ready
        return ready, checks
