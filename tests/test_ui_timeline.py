"""The attempt timeline's pure drawing (optimizer/ui/timeline.py): phases, the interruption's
mark, the hot handover (the old attempt's job drawn running until it exited, over its
replacement's provisioning and probing), labels that fit; and the charts' time helpers
(optimizer/ui/static/charts.js), run in Node where it is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from optimizer.store.jobs import AttemptRecord
from optimizer.ui.timeline import LABEL_CHARS, job_end, segments, svg

NOW = datetime(2026, 3, 14, 12, 0, tzinfo=UTC)
CHARTS_JS = Path(__file__).parents[1] / "optimizer" / "ui" / "static" / "charts.js"


def _attempt(number: int, start: datetime, **values: object) -> AttemptRecord:
    base = {
        "id": number,
        "job_id": 1,
        "number": number,
        "key": f"j-{number}",
        "provider": "local",
        "region": "eu-west-1",
        "zone": "eu-west-1-a",
        "instance_type": "g4dn.xlarge",
        "market": "spot",
        "usd_per_hour": 0.2,
        "instance_id": f"i-{number}",
        "state": "live",
        "end_reason": None,
        "started_at": start,
        "ended_at": None,
        "token_sha256": "",
        "registered_at": None,
        "probe_status": None,
        "job_started_at": None,
        "exit_code": None,
        "notice_at": None,
        "stop_sent_at": None,
        "instance_gone": False,
        "preempted": False,
    }
    base.update(values)
    return AttemptRecord(**base)  # type: ignore[arg-type]


def test_the_timeline_draws_phases_and_marks_the_interruption() -> None:
    t = NOW
    first = _attempt(
        1,
        t,
        registered_at=t + timedelta(seconds=10),
        job_started_at=t + timedelta(seconds=20),
        notice_at=t + timedelta(seconds=60),
        ended_at=t + timedelta(seconds=70),
        end_reason="preempted",
        preempted=True,
    )
    second = _attempt(2, t + timedelta(seconds=62), registered_at=t + timedelta(seconds=70))
    assert [s.phase for s in segments(first, t + timedelta(seconds=90))] == [
        "provisioning",
        "probing",
        "running",
        "notice",
    ]
    assert [s.phase for s in segments(second, t + timedelta(seconds=90))] == [
        "provisioning",
        "probing",
    ]
    drawn = str(svg([first, second], t + timedelta(seconds=90)))
    assert drawn.count('class="marker"') == 1
    assert "interrupted 12:01:00" in drawn and ">live<" in drawn
    assert 'data-attempt="2"' in drawn and "<title" in drawn
    assert str(svg([], t)) == ""


def _bars(drawn: str) -> dict[int, list[tuple[str, float, float]]]:
    """Each attempt's bars as (phase, left, right) in the drawing's units."""
    out: dict[int, list[tuple[str, float, float]]] = {}
    for g in ET.fromstring(drawn).iter("g"):
        if "data-attempt" in g.attrib:
            out[int(g.attrib["data-attempt"])] = [
                (
                    r.attrib["class"][4:],
                    float(r.attrib["x"]),
                    float(r.attrib["x"]) + float(r.attrib["width"]),
                )
                for r in g.iter("rect")
            ]
    return out


def _handover() -> tuple[AttemptRecord, AttemptRecord]:
    """An interrupted attempt whose job ran on, as the daemon records it: the notice at 60 s
    ends the attempt's row at 61 s and launches attempt 2 then; attempt 2 registers at 75 s
    and passes its probe at 92 s, when the old job gets its stop; it exits at 95 s and the new
    job starts at 96 s."""
    t = NOW
    old = _attempt(
        1, t, registered_at=t + timedelta(seconds=10), job_started_at=t + timedelta(seconds=20),
        notice_at=t + timedelta(seconds=60), ended_at=t + timedelta(seconds=61),
        end_reason="preempted", preempted=True, stop_sent_at=t + timedelta(seconds=92),
        exit_code=143, instance_gone=True, terminated_at=t + timedelta(seconds=100),
    )  # fmt: skip
    new = _attempt(
        2, t + timedelta(seconds=61), registered_at=t + timedelta(seconds=75),
        job_started_at=t + timedelta(seconds=96),
    )  # fmt: skip
    return old, new


def test_the_old_attempts_job_runs_on_its_bar_until_it_exited() -> None:
    old, new = _handover()
    now = NOW + timedelta(seconds=120)
    exited = NOW + timedelta(seconds=95)
    assert segments(old, now, exited)[-1].end == exited  # not the row's end at 61 s
    bars = _bars(str(svg([old, new], now, {old.key: exited})))
    old_end = max(right for _, _, right in bars[1])
    new_probing = next((lo, hi) for phase, lo, hi in bars[2] if phase == "probing")
    new_running = next(left for phase, left, _ in bars[2] if phase == "running")
    # the handover: the old job ran through its replacement's boot and probe, and stopped
    # just before the new job started (the downtime)
    assert new_probing[0] < old_end < new_running == new_probing[1]
    # without the agent's exit report, the instance's termination bounds it
    assert job_end(old, None, now) == NOW + timedelta(seconds=100)


def test_a_job_outliving_its_attempt_runs_until_now_while_it_hands_over() -> None:
    """An ended attempt whose job has not exited on an instance not seen gone is still handing
    over: its bar reaches now. One whose job never started, or that ended normally after its
    job's exit, ends where its row does."""
    old, _ = _handover()
    running_on = AttemptRecord(
        **{**_fields(old), "exit_code": None, "instance_gone": False, "terminated_at": None}
    )
    now = NOW + timedelta(seconds=80)
    assert job_end(running_on, None, now) == now
    never_started = AttemptRecord(**{**_fields(running_on), "job_started_at": None})
    assert job_end(never_started, None, now) == old.ended_at
    finished = _attempt(
        3, NOW, job_started_at=NOW + timedelta(seconds=5), exit_code=0,
        ended_at=NOW + timedelta(seconds=40), end_reason="succeeded",
    )  # fmt: skip
    assert job_end(finished, NOW + timedelta(seconds=39), now) == NOW + timedelta(seconds=40)
    assert job_end(_attempt(4, NOW), None, now) == now  # a live attempt


def _fields(a: AttemptRecord) -> dict[str, object]:
    return {name: getattr(a, name) for name in AttemptRecord.__dataclass_fields__}


def test_the_timelines_labels_fit_and_name_the_day_over_a_long_span() -> None:
    """Tick labels far enough apart for their text at the stylesheet's 14 px (8 characters of
    7.5 units at most), an end label cut to what its column holds with the whole of it in a
    tooltip, and dates on the axis of a span over a day."""
    reason = "launch_error: InsufficientInstanceCapacity in eu-west-1a"
    a = _attempt(1, NOW, ended_at=NOW + timedelta(minutes=3), end_reason=reason)
    root = ET.fromstring(str(svg([a], NOW + timedelta(minutes=5))))
    ticks = [t for t in root.iter("text") if t.attrib.get("text-anchor")]
    xs = [float(t.attrib["x"]) for t in ticks]
    assert len(ticks) == 6
    assert min(b - a for a, b in pairwise(xs)) > 2 * max(
        len(t.text or "") * 7.5 for t in ticks
    )  # middle-anchored neighbours: half a label each side
    (label,) = [t for t in root.iter("text") if t.attrib.get("class") == "marker-label"]
    title = label.find("title")
    assert title is not None and title.text == reason
    shown = "".join(label.itertext()).removeprefix(reason)
    assert len(shown) == LABEL_CHARS and shown.endswith("\u2026")
    long = _attempt(1, NOW, ended_at=NOW + timedelta(days=2))
    labels = [t.text for t in ET.fromstring(str(svg([long], NOW))).iter("text")]
    assert "03-14 12:00" in labels and "03-16 12:00" in labels


def _node(script: str) -> object:
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here to run the console's chart helpers")
    source = CHARTS_JS.read_text()
    program = (
        "var window = {}; var document = {readyState: 'complete', querySelectorAll: () => []};\n"
        f"{source}\n"
        f"console.log(JSON.stringify((function (c) {{ {script} }})(window.gpuoptCharts)));"
    )
    done = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_charts_times_are_utc_24_hour_and_one_reading_spans_minutes() -> None:
    t = NOW.timestamp()
    found = _node(
        f"return {{ticks: c.utcTicks([{t - 3600}, {t + 3600 * 2}, {t + 3600 * 13}], 3600),"
        f" seconds: c.utcTicks([{t + 30}], 30), days: c.utcTicks([{t}, {t + 86400}], 86400),"
        f" stamp: c.utcStamp({t + 3600 * 13}), none: c.utcStamp(null),"
        f" one: c.timeRange({t}, {t}), wide: c.timeRange({t}, {t + 7200}),"
        # what uPlot asks for one reading: its own thousand days after it
        f" widened: c.xRange([{t}], {t}, {t + 86_400_000}),"
        f" zoomed: c.xRange([{t}, {t + 60}], {t}, {t + 7200})}}"
    )
    assert found == {
        # the day under the first tick and under the first of a new day; 24-hour UTC
        "ticks": ["11:00\n03-14", "14:00", "01:00\n03-15"],
        "seconds": ["12:00:30\n03-14"],
        "days": ["03-14", "03-15"],
        "stamp": "2026-03-15 01:00 UTC",
        "none": "\u2013",
        "one": [t - 300, t + 300],  # ten minutes around one reading, not years
        "wide": [t, t + 7200],
        "widened": [t - 300, t + 300],
        "zoomed": [t, t + 7200],
    }
