"""A job's attempts on one time axis, as an SVG drawn on the server: a row per attempt, its
phases as bars (provisioning, probing, running, notice), a marker where the cloud interrupted
it, and why it ended. An interrupted or moved attempt's job keeps running while its
replacement boots and probes (the hot handover), so its bars run until its job exited, not
until the attempt's row ended. Pure: attempts, their jobs' exits and the time in, markup out.

The drawing is 1000 units wide and scales to its box; the page gives the box a minimum width
(console.css) and scrolls it sideways on a narrower screen, so its text stays legible."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup, escape

from optimizer.clock import utc_text
from optimizer.store.jobs import AttemptRecord

WIDTH = 1000
LABEL_W = 92
RIGHT_W = 180
LABEL_CHARS = 20  # an end label's characters that fit RIGHT_W at the stylesheet's font size
ROW_H = 30
BAR_H = 16
AXIS_H = 26
TICKS = 5
PHASES = ("provisioning", "probing", "running", "notice")


@dataclass(frozen=True, slots=True)
class Segment:
    phase: str
    start: datetime
    end: datetime


def job_end(a: AttemptRecord, exited: datetime | None, now: datetime) -> datetime:
    """Until when an attempt's bars run: the attempt's end, or later where its job outlived
    it: its job's exit (`exited`, the agent's report), else the instance's termination; a job
    whose attempt ended but which has not exited on an instance not seen gone is still
    handing over, and runs until `now`."""
    end = a.ended_at or now
    if a.ended_at is None or a.job_started_at is None:
        return end
    if exited is not None:
        return max(end, exited)
    if a.exit_code is None and not a.instance_gone:
        return max(end, now)
    return max(end, a.terminated_at) if a.terminated_at is not None else end


def segments(a: AttemptRecord, now: datetime, exited: datetime | None = None) -> list[Segment]:
    """An attempt's phases: provisioning from its row's creation until its agent registered,
    probing until the job started, running until a notice (or the job's end, `job_end`), then
    the notice until the job's end."""
    end = job_end(a, exited, now)
    marks = [
        ("provisioning", a.started_at),
        ("probing", a.registered_at),
        ("running", a.job_started_at),
        ("notice", a.notice_at),
    ]
    points = [(phase, at) for phase, at in marks if at is not None and at <= end]
    out = []
    for (phase, start), following in zip(points, [*points[1:], (None, end)], strict=True):
        stop = following[1] or end
        if stop > start:
            out.append(Segment(phase, start, stop))
    return out


def interrupted(a: AttemptRecord) -> datetime | None:
    """When the cloud took the attempt back (its notice, else its end), if it did."""
    if a.notice_at is not None:
        return a.notice_at
    if a.preempted:
        return a.ended_at
    return None


def _clock(at: datetime) -> str:
    """UTC, 24-hour, as the rest of the console."""
    return at.strftime("%H:%M:%S")


def _tick(at: datetime, span_s: float) -> str:
    """An axis label: the time, with the day where the axis spans more than one."""
    return at.strftime("%m-%d %H:%M" if span_s > 86_400 else "%H:%M:%S")


def svg(
    attempts: Sequence[AttemptRecord],
    now: datetime,
    exits: Mapping[str, datetime] | None = None,
) -> Markup:
    """The timeline (`exits`: when each attempt's job exited, by attempt key); an empty
    Markup for a job with no attempt yet."""
    if not attempts:
        return Markup("")
    exits = exits or {}
    start = min(a.started_at for a in attempts)
    end = max(job_end(a, exits.get(a.key), now) for a in attempts)
    span = max((end - start).total_seconds(), 1.0)
    plot_w = WIDTH - LABEL_W - RIGHT_W

    def x(at: datetime) -> float:
        return LABEL_W + (at - start).total_seconds() / span * plot_w

    height = AXIS_H + ROW_H * len(attempts) + 6
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-labelledby="timeline-title" data-start="{start.isoformat()}">',
        f'<title id="timeline-title">{escape(_summary(attempts))}</title>',
        '<g class="axis">',
    ]
    for i in range(TICKS + 1):
        at = start + timedelta(seconds=span * i / TICKS)
        tx = x(at)
        anchor = "start" if i == 0 else "end" if i == TICKS else "middle"
        parts.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{AXIS_H - 6}" y2="{height}" '
            'stroke="#d5dbe2" stroke-width="1"/>'
            f'<text x="{tx:.1f}" y="{AXIS_H - 10}" text-anchor="{anchor}">{_tick(at, span)}</text>'
        )
    parts.append("</g>")
    for row, a in enumerate(attempts):
        top = AXIS_H + row * ROW_H
        mid = top + ROW_H / 2
        until = job_end(a, exits.get(a.key), now)
        parts.append(
            f'<g class="attempt" data-attempt="{a.number}" data-until="{utc_text(until)}">'
        )
        parts.append(f'<text class="row-label" x="4" y="{mid + 4:.1f}">attempt {a.number}</text>')
        for seg in segments(a, now, exits.get(a.key)):
            x0, x1 = x(seg.start), x(seg.end)
            parts.append(
                f'<rect class="seg-{seg.phase}" x="{x0:.1f}" y="{mid - BAR_H / 2:.1f}" '
                f'width="{max(x1 - x0, 1.5):.1f}" height="{BAR_H}">'
                f"<title>attempt {a.number} {seg.phase} {_clock(seg.start)} to {_clock(seg.end)} "
                f"({(seg.end - seg.start).total_seconds():.0f} s)</title></rect>"
            )
        hit = interrupted(a)
        if hit is not None:
            hx = x(hit)
            parts.append(
                f'<line class="marker" x1="{hx:.1f}" x2="{hx:.1f}" y1="{top + 2}" '
                f'y2="{top + ROW_H - 2}"/>'
            )
        label = _end_label(a, hit)
        if len(label) > LABEL_CHARS:  # the whole of it on hover
            label_markup = f"<title>{escape(label)}</title>{escape(label[: LABEL_CHARS - 1])}\u2026"
        else:
            label_markup = str(escape(label))
        parts.append(
            f'<text class="marker-label" x="{WIDTH - RIGHT_W + 8}" y="{mid + 4:.1f}">'
            f"{label_markup}</text>"
        )
        parts.append("</g>")
    parts.append("</svg>")
    return Markup("".join(parts))


def _end_label(a: AttemptRecord, hit: datetime | None) -> str:
    if hit is not None:
        return f"interrupted {_clock(hit)}"
    if a.ended_at is None:
        return "live"
    return a.end_reason or "ended"


def _summary(attempts: Sequence[AttemptRecord]) -> str:
    words = []
    for a in attempts:
        state = (
            "interrupted"
            if interrupted(a) is not None
            else ("live" if a.ended_at is None else a.end_reason or "ended")
        )
        words.append(f"attempt {a.number} on {a.provider} {a.instance_type}: {state}")
        break_after = len(words) >= 20
        if break_after:
            break
    return "Attempt timeline. " + "; ".join(words)
