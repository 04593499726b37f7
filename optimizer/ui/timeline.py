"""A job's attempts on one time axis, as an SVG drawn on the server: a row per attempt, its
phases as bars (provisioning, probing, running, notice), a marker where the cloud interrupted
it, and why it ended. Pure: attempts and the time in, markup out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from markupsafe import Markup, escape

from optimizer.store.jobs import AttemptRecord

WIDTH = 1000
LABEL_W = 92
RIGHT_W = 150
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


def segments(a: AttemptRecord, now: datetime) -> list[Segment]:
    """An attempt's phases: provisioning from its row's creation until its agent registered,
    probing until the job started, running until a notice (or the end), then the notice."""
    end = a.ended_at or now
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
    return at.strftime("%H:%M:%S")


def svg(attempts: Sequence[AttemptRecord], now: datetime) -> Markup:
    """The timeline; an empty Markup for a job with no attempt yet."""
    if not attempts:
        return Markup("")
    start = min(a.started_at for a in attempts)
    end = max(a.ended_at or now for a in attempts)
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
            f'<text x="{tx:.1f}" y="{AXIS_H - 10}" text-anchor="{anchor}">{_clock(at)}</text>'
        )
    parts.append("</g>")
    for row, a in enumerate(attempts):
        top = AXIS_H + row * ROW_H
        mid = top + ROW_H / 2
        parts.append(f'<g class="attempt" data-attempt="{a.number}">')
        parts.append(f'<text class="row-label" x="4" y="{mid + 4:.1f}">attempt {a.number}</text>')
        for seg in segments(a, now):
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
        parts.append(
            f'<text class="marker-label" x="{WIDTH - RIGHT_W + 8}" y="{mid + 4:.1f}">'
            f"{escape(label)}</text>"
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
