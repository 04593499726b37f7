"""The web console in a real browser (headless Chromium through Selenium) against a real
daemon on the local cloud: sign in, watch a job submitted through the API reach running on
the overview, interrupt it on the local cloud and see the interruption on its timeline,
cancel it from its page, find a rejection reason on the example policy's offers page, open a
pool's price chart and its GPU model's across regions. One daemon, one cloud and one browser
for the whole story (CI time is tight).

Each page is saved as a 1280x800 screenshot into $GPUOPT_UI_SCREENSHOTS (the committed ones
in docs/screenshots/console/ come from `GPUOPT_UI_SCREENSHOTS=docs/screenshots/console`),
else into the test's own folder.
"""

from __future__ import annotations

import os
import shutil
import sys
from fnmatch import fnmatchcase
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from optimizer.clock import SteadyClock, utc_text
from optimizer.model import Offer
from optimizer.ui import console_app
from optimizer.ui.timeline import job_end
from providers.local.prices import STEP_S, local_offers
from providers.snapshot import load_snapshot
from tests.helpers import TOKEN, api, make_config, running, wait_until, write_policy
from tests.helpers.browser import HEIGHT, WIDTH, browser, viewport
from tests.helpers.jobs import MID_MONTH, ROOT, e2e_cloud, running_instance

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

JOB = "ui-train"
BROKEN = "apiVersion: gpuopt/v1\nkind: Policy\nname: broken\nworkload: {gpus: many}\n"
HISTORY_H = 36  # hours of the local cloud's own price walk recorded before the run
GPU_REGIONS = "eu-*"  # the regions the GPU model's price chart shows


# read at import: the daemon_env fixture clears GPUOPT_* settings before the test runs
SCREENSHOTS = os.environ.get("GPUOPT_UI_SCREENSHOTS", "")


def _shots(tmp_path: Path) -> Path:
    folder = Path(SCREENSHOTS or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _text(driver: Any, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return str(driver.find_element("css selector", css).text)
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def _handover_drawn(driver: Any) -> bool:
    """Whether the timeline draws attempt 1's last bar ending after attempt 2's first began."""
    edges = driver.execute_script(
        "function bars(n) { return Array.from(document.querySelectorAll("
        "'#timeline [data-attempt=\"' + n + '\"] rect')).map(function (r) {"
        "return [r.x.baseVal.value, r.x.baseVal.value + r.width.baseVal.value]; }); }"
        "var one = bars(1), two = bars(2);"
        "if (!one.length || !two.length) { return null; }"
        "return [Math.max.apply(null, one.map(function (b) { return b[1]; })), two[0][0]];"
    )
    return edges is not None and edges[0] > edges[1]


def test_the_console_follows_a_job_through_an_interruption_and_a_cancel(tmp_path: Path) -> None:
    if shutil.which("chromium") is None and shutil.which("google-chrome") is None:
        pytest.skip("no chromium here (apt-get install chromium chromium-driver)")
    shots = _shots(tmp_path)
    clock = SteadyClock(MID_MONTH)  # the local cloud's machines keep its time
    policies = tmp_path / "policies"
    example = (ROOT / "examples" / "local-train-policy.yaml").read_text()
    write_policy(policies, "local-train.yaml", example)
    write_policy(policies, "broken.yaml", BROKEN)
    config = make_config(tmp_path, policy_dir=policies, loops={"reconcile_s": 0.25})
    with (
        e2e_cloud(tmp_path, clock) as cloud,
        running(config, sources={"local": cloud}, clock=clock, face=console_app) as daemon,
        browser() as driver,
    ):
        for poll in daemon.polls:
            poll.run_once()
        with api(daemon) as client:
            best = client.get("/offers", params={"policy": "local-train", "limit": 1}).json()
        top = best["candidates"][0]["offer"]
        # the local cloud's price walk over the hours before the run, in its region
        now = clock().timestamp()
        snapshot = load_snapshot()

        def record_history(rows: list[Offer], regions: list[str] | None = None) -> None:
            steps = range(int(HISTORY_H * 3600 / STEP_S), 0, -1)
            daemon.store.prices.record_offers(  # one transaction
                o
                for step in steps
                for o in local_offers(rows, cloud.walk, now - step * STEP_S, regions)
            )

        region = top["region"]
        record_history(snapshot, [region])

        def shot(name: str) -> None:
            driver.save_screenshot(str(shots / f"{name}.png"))

        # -- signing in ------------------------------------------------------------------
        driver.get(f"{daemon.url}/ui/")
        assert driver.current_url.startswith(f"{daemon.url}/ui/login")
        driver.find_element("id", "token").send_keys("wrong-token")
        driver.find_element("css selector", "form button[type=submit]").click()
        # the click submits the form: the answer is a new page, read once it has come
        wait_until(lambda: "not the API token" in _text(driver, "#login-error"), 10, "the error")
        assert driver.get_cookies() == []
        shot("01-login-error")
        driver.find_element("id", "token").send_keys(TOKEN)
        driver.find_element("css selector", "form button[type=submit]").click()
        wait_until(lambda: _text(driver, "h1") == "Overview", 10, "the overview")
        (cookie,) = driver.get_cookies()
        assert (
            cookie["httpOnly"] and cookie["sameSite"] == "Strict" and TOKEN not in cookie["value"]
        )

        # -- a job through the API, running on the overview (no reload: live updates) -----
        body = {
            "name": JOB,
            "policy": "local-train",
            "workdir": str(ROOT),
            "run": (
                f"{sys.executable} examples/train_with_checkpoints.py --engine numpy "
                "--steps 100000 --checkpoint-every 20 --step-sleep 0.05 --log-every 20"
            ),
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "probes": "quick",
        }
        with api(daemon) as client:
            assert client.post("/jobs", json=body).status_code == 201
        row = f'#live-jobs tr[data-job="{JOB}"]'
        wait_until(lambda: "running" in _text(driver, row), 90, "running on the overview")
        first = wait_until(lambda: running_instance(cloud, JOB, 1), 10, "attempt 1's instance")
        cloud.inject_telemetry(first, util=0.62, memory=0.41, memory_gib=16.0, interval_s=1.0)
        wait_until(lambda: "%" in _text(driver, f"{row} td:nth-of-type(5)"), 60, "utilization")
        assert _text(driver, "#leader")  # this daemon leads
        shot("02-overview")

        # -- the job's page: output following, then an interruption on its timeline -------
        driver.get(f"{daemon.url}/ui/jobs/{JOB}")
        wait_until(lambda: "step " in _text(driver, "#logs"), 60, "the job's output")
        util = driver.find_element("id", "util-chart")
        wait_until(lambda: util.get_attribute("data-points") not in (None, "0"), 30, "util chart")
        wait_until(lambda: _text(driver, "#probes"), 30, "probe results")
        shot("03-job-running")
        # a minute or two of readings: the time axis spans minutes (10 at least), not years
        wait_until(lambda: util.get_attribute("data-span"), 10, "the chart's time axis")
        assert 600 <= int(util.get_attribute("data-span") or 0) <= 3600
        driver.execute_script("document.getElementById('util-h').scrollIntoView()")
        shot("03b-job-chart-output")
        driver.execute_script("window.scrollTo(0, 0)")
        cloud.interrupt(first)
        label = '#timeline [data-attempt="1"] .marker-label'
        wait_until(lambda: "interrupted" in _text(driver, label), 60, "the interruption")
        wait_until(lambda: _text(driver, '#attempts tr[data-attempt="2"]'), 60, "attempt 2")
        wait_until(lambda: "running" in _text(driver, "#job-state"), 90, "attempt 2 running")
        second = wait_until(lambda: running_instance(cloud, JOB, 2), 10, "attempt 2's instance")
        cloud.inject_telemetry(second, util=0.55, memory=0.45, memory_gib=16.0, interval_s=1.0)
        assert "job.interrupted" in _text(driver, "#job-events")
        wait_until(lambda: "attempt 2" in _text(driver, "#logs"), 60, "attempt 2's output")
        # the hot handover: attempt 1 is drawn until its job stopped (the agent's exit
        # report, else its instance's termination), not its row's end; where that is past
        # attempt 2's start, the bars overlap
        job_id = daemon.store.jobs.get_job(JOB).id  # type: ignore[union-attr]

        def settled() -> tuple[Any, Any, Any] | None:
            old, new = daemon.store.jobs.attempts(job_id)[:2]
            exited = daemon.store.costs.exits([old.key]).get(old.key)
            return (old, new, exited) if exited or old.instance_gone else None

        old, new, exited = wait_until(settled, 60, "attempt 1's job to stop")
        stopped = job_end(old, exited, old.ended_at)  # settled: the time now plays no part
        until = f'#timeline [data-attempt="1"][data-until="{utc_text(stopped)}"]'
        wait_until(lambda: driver.find_elements("css selector", until), 30, "drawn to its stop")
        if stopped > new.started_at:  # the cloud may also take the job down with its row's end
            assert _handover_drawn(driver)
        shot("04-job-interrupted")

        # -- cancel from the page --------------------------------------------------------
        driver.find_element("id", "cancel").click()
        driver.switch_to.alert.accept()
        wait_until(lambda: "Cancel requested" in _text(driver, ".flash"), 10, "the request")
        wait_until(lambda: "cancelled" in _text(driver, "#job-state"), 60, "the cancel")
        # ended while the page is open: the output is no longer followed
        ended = "Output (last 200 lines)"
        wait_until(lambda: _text(driver, "#logs-h") == ended, 10, "the output's heading")
        assert "GPU now" not in _text(driver, "dl.facts")
        shot("05-job-cancelled")
        driver.get(f"{daemon.url}/ui/jobs/nobody")
        assert _text(driver, "h1") == "Not Found" and "No job named" in _text(driver, "#error")
        assert _text(driver, 'nav a[aria-current="page"]') == "Jobs"

        driver.get(f"{daemon.url}/ui/jobs")
        assert "cancelled" in _text(driver, f'#jobs tr[data-job="{JOB}"]')
        shot("06-jobs")

        # -- the example policy's offers: a rejection and its reason ----------------------
        driver.get(f"{daemon.url}/ui/offers?policy=local-train")
        reasons = driver.find_elements("css selector", "details.rule[open] td.reason")
        assert reasons and all(r.text for r in reasons)
        assert _text(driver, "#candidates")
        shot("07-offers")
        driver.execute_script("document.getElementById('rej-h').scrollIntoView()")
        shot("08-offers-rejections")
        driver.find_element("id", "q").send_keys("spot")
        driver.find_element("css selector", "form.filters button").click()
        wait_until(lambda: "match" in _text(driver, "#rej-h ~ details summary"), 10, "the filter")

        # -- a price chart ---------------------------------------------------------------
        # of the best spot pool now, which the interruption may have moved to another region
        with api(daemon) as client:
            ranked = client.get("/offers", params={"policy": "local-train"}).json()
        charted = next(
            c["offer"]["region"] for c in ranked["candidates"] if c["offer"]["market"] == "spot"
        )
        if charted != region:
            record_history(snapshot, [charted])
        driver.get(f"{daemon.url}/ui/prices")
        chart = driver.find_element("id", "price-chart")
        wait_until(lambda: chart.get_attribute("data-ready") == "1", 20, "the price chart")
        assert int(chart.get_attribute("data-points") or 0) > 100
        assert driver.find_elements("css selector", "#price-chart canvas")
        assert _text(driver, '#price-summary [data-k="cap_latest"]').startswith("$")
        shot("09-prices")
        # the best offer's GPU model in the other regions its chart shows
        model, count = top["gpu_model"], top["gpu_count"]
        record_history(
            [
                o
                for o in snapshot
                if (o.gpu_model, o.gpu_count) == (model, count)
                and fnmatchcase(o.region, GPU_REGIONS)
                and o.region not in {region, charted}
            ]
        )
        driver.find_element("link text", "A GPU model across regions").click()
        wait_until(lambda: _text(driver, "h1") == "Prices by GPU model", 10, "the GPU view")
        query = f"gpu={model}&gpus={count}&regions={GPU_REGIONS}&policy=local-train"
        driver.get(f"{daemon.url}/ui/prices/gpu?{query}")
        chart = driver.find_element("id", "gpu-chart")
        wait_until(lambda: chart.get_attribute("data-ready") == "1", 20, "the GPU model chart")
        assert int(chart.get_attribute("data-series") or 0) >= 4  # 2 regions or more, 2 markets
        assert driver.find_elements("css selector", "#gpu-chart canvas")
        spot = driver.find_elements("css selector", '#gpu-summary tr[data-series$=" spot"]')
        assert len(spot) >= 2 and all("$" in row.text.split()[-1] for row in spot)  # the caps
        shot("09b-prices-gpu")

        # -- policies: valid, invalid with located errors ---------------------------------
        driver.get(f"{daemon.url}/ui/policies")
        assert "broken.yaml:" in _text(driver, "#rejected")
        assert "valid" in _text(driver, '#policies tr[data-policy="local-train"]')
        shot("10-policies")

        # -- a phone's width ---------------------------------------------------------------
        viewport(driver, 390, 844, mobile=True)
        driver.get(f"{daemon.url}/ui/")
        wait_until(lambda: _text(driver, "h1") == "Overview", 10, "the overview")
        assert driver.execute_script("return document.documentElement.scrollWidth") <= 390 + 1
        shot("11-overview-phone")
        # the job's page: the timeline keeps legible text and scrolls sideways in its box
        driver.get(f"{daemon.url}/ui/jobs/{JOB}")
        wait_until(lambda: _text(driver, "#timeline"), 10, "the timeline")
        assert driver.execute_script("return document.documentElement.scrollWidth") <= 390 + 1
        box = driver.execute_script(
            "var t = document.getElementById('timeline');"
            "return [t.scrollWidth, t.clientWidth, Array.from("
            "t.querySelectorAll('.axis text, .row-label, .marker-label')).map(function (e) {"
            "var r = e.getBoundingClientRect(); return [r.left, r.right, r.top, r.height]; })];"
        )
        scroll_w, client_w, texts = box
        assert scroll_w > client_w and texts and all(h >= 9.5 for *_, h in texts)
        rows: dict[float, list[tuple[float, float]]] = {}
        for left, right, top, _ in texts:
            rows.setdefault(round(top), []).append((left, right))
        for spans in rows.values():  # labels on one line do not overlap
            spans.sort()
            assert all(a[1] <= b[0] for a, b in pairwise(spans)), spans
        driver.execute_script("document.getElementById('timeline-h').scrollIntoView()")
        shot("12-job-phone")
        viewport(driver, WIDTH, HEIGHT)

        # -- signing out -------------------------------------------------------------------
        driver.find_element("css selector", "form.logout button").click()
        wait_until(lambda: "/ui/login" in driver.current_url, 10, "the login page")
        assert driver.get_cookies() == []
        driver.get(f"{daemon.url}/ui/jobs")
        assert "/ui/login" in driver.current_url

    for name in (
        "02-overview",
        "04-job-interrupted",
        "08-offers-rejections",
        "09-prices",
        "09b-prices-gpu",
    ):
        assert (shots / f"{name}.png").stat().st_size > 10_000, name
