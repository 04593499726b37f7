"""The console's pages over a real daemon (in process, on loopback, its offers from a fake
source and a manual clock): what each page and data endpoint answers, without a browser;
and the attempt timeline's pure drawing. tests/test_ui_browser.py drives the same pages in
Chromium end to end."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.model import Market
from optimizer.ui import console_app
from optimizer.ui import session as sessions
from tests.helpers import TOKEN, make_config, make_offer, running, wait_until, write_policy
from tests.helpers.offers import FakeSource
from tests.helpers.policies import policy_text

pytestmark = pytest.mark.usefixtures("daemon_env")

NOW = datetime(2026, 3, 14, 12, 0, tzinfo=UTC)
SPOT = make_offer(observed_at=NOW - timedelta(hours=2), usd_per_hour=0.50)
ON_DEMAND = make_offer(zone=None, market=Market.ON_DEMAND, usd_per_hour=1.20, observed_at=NOW)
EXPENSIVE = make_offer(zone="use1-az2", usd_per_hour=3.0, observed_at=NOW)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    policies = tmp_path / "policies"
    write_policy(policies, "small.yaml", policy_text("small", cap=1.0))
    write_policy(
        policies, "broken.yaml", "apiVersion: gpuopt/v1\nkind: Policy\nname: x\nbuffer: lots\n"
    )
    source = FakeSource([SPOT, ON_DEMAND, EXPENSIVE])
    config = make_config(tmp_path, policy_dir=policies)
    with running(config, face=console_app, clock=ManualClock(NOW), sources={"aws": source}) as d:
        d.store.prices.record_offers([SPOT, replace(SPOT, usd_per_hour=0.45, observed_at=NOW)])
        for poll in d.polls:
            poll.run_once()
        wait_until(lambda: d.registry.get("small") and d.registry.rejected(), 10, "policies")
        yield d


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=10) as c:
        assert c.post("/ui/login", data={"token": TOKEN}).status_code == 303
        yield c


def test_the_offers_page_groups_rejections_by_rule_with_their_reasons(
    client: httpx.Client,
) -> None:
    page = client.get("/ui/offers", params={"policy": "small"})
    assert page.status_code == 200
    assert 'data-rule="bid.max_usd_per_hour"' in page.text
    assert "&gt; cap $1/h</td>" in page.text  # the reason, escaped
    assert "use1-az1 g5.xlarge" in page.text  # the candidate
    narrowed = client.get("/ui/offers", params={"policy": "small", "q": "use1-az2 spot"})
    assert "(1 match)" in narrowed.text and "(0 match the filter)" in narrowed.text
    unknown = client.get("/ui/offers", params={"policy": "nope"})
    assert "No policy named nope is loaded" in unknown.text


def test_the_policies_page_shows_located_errors_and_the_version_in_force(
    client: httpx.Client, daemon: Daemon
) -> None:
    page = client.get("/ui/policies").text
    loaded = daemon.registry.get("small")
    assert loaded is not None and loaded.sha256[:12] in page
    assert "broken.yaml:4:9: buffer: must be a number" in page


def test_the_price_data_has_spot_on_demand_and_the_bid_cap(client: httpx.Client) -> None:
    page = client.get("/ui/prices", params={"policy": "small"})
    assert page.status_code == 200 and 'id="price-chart"' in page.text
    pool = "aws|us-east-1|use1-az1|g5.xlarge"
    data = client.get("/ui/data/prices", params={"pool": pool, "policy": "small"}).json()
    assert data["spot"][-1] == 0.45 and 0.50 in data["spot"]
    assert data["on_demand"][-1] == 1.20
    assert data["cap"][-1] == 1.0  # the policy's max_usd_per_hour, under 1.20 x nothing
    assert len(data["t"]) == len(data["spot"]) == len(data["cap"])
    assert client.get("/ui/data/prices", params={"pool": "nonsense"}).status_code == 422


G5_12XLARGE = {"instance_type": "g5.12xlarge", "gpu_count": 4, "vcpus": 48, "ram_gib": 192.0}
# The hour before NOW in 5-minute buckets (a day's window: 289 buckets from NOW - 1 day)
AT_3H, AT_2H, AT_1H, AT_NOW = 252, 264, 276, 288


def _index(values: list[float | None], value: float | None) -> list[int]:
    return [i for i, v in enumerate(values) if v == value]


def test_a_gpu_models_prices_per_region_with_each_regions_bid_cap(
    client: httpx.Client, daemon: Daemon, tmp_path: Path
) -> None:
    write_policy(
        tmp_path / "policies",
        "half.yaml",
        policy_text("half").replace("markets:", "bid: {max_fraction_of_on_demand: 0.5}\nmarkets:"),
    )
    eu = {"region": "eu-west-1", "observed_at": NOW - timedelta(hours=3)}
    daemon.store.prices.record_offers(
        [
            make_offer(**eu, zone="euw1-az1", usd_per_hour=0.60),  # $0.60 per GPU-hour
            make_offer(**eu, **G5_12XLARGE, zone="euw1-az2", usd_per_hour=2.00),  # $0.50
            make_offer(**eu, zone=None, market=Market.ON_DEMAND, usd_per_hour=1.00),
            make_offer(**eu, **G5_12XLARGE, zone=None, market=Market.ON_DEMAND, usd_per_hour=5.0),
            # from an hour ago the 1-GPU pool is the cheapest: $0.30
            make_offer(
                region="eu-west-1",
                zone="euw1-az1",
                usd_per_hour=0.30,
                observed_at=NOW - timedelta(hours=1),
            ),
        ]
    )
    wait_until(lambda: daemon.registry.get("half"), 10, "the half policy")
    page = client.get("/ui/prices/gpu")  # the model of small's best offer: A10G
    assert page.status_code == 200 and 'id="gpu-chart"' in page.text
    assert "/ui/data/prices/gpu?gpu=A10G&amp;days=2" in page.text

    url = "/ui/data/prices/gpu"
    query = {"gpu": "A10G", "market": "spot", "policy": "half", "days": 1}
    data = client.get(url, params=query).json()
    assert data["summary"]["bucket_s"] == 300 and len(data["t"]) == AT_NOW + 1
    assert data["t"][AT_NOW] == NOW.timestamp()
    eu_spot, us_spot = data["series"]
    assert (eu_spot["label"], us_spot["label"]) == ("aws eu-west-1 spot", "aws us-east-1 spot")
    # eu-west-1: the 4-GPU pool at 2.00/4 until an hour ago, then the 1-GPU pool at 0.30
    assert _index(eu_spot["values"], None) == list(range(AT_3H))
    assert _index(eu_spot["values"], 0.50) == list(range(AT_3H, AT_1H))
    assert _index(eu_spot["values"], 0.30) == list(range(AT_1H, AT_NOW + 1))
    assert (eu_spot["now"], eu_spot["now_pool"]) == (0.30, "euw1-az1 g5.xlarge (1\u00d7)")
    assert (eu_spot["low"], eu_spot["high"]) == (0.30, 0.50)
    # us-east-1: 0.50 from two hours ago, 0.45 from NOW (the $3 pool is never the cheapest)
    assert _index(us_spot["values"], 0.50) == list(range(AT_2H, AT_NOW))
    assert us_spot["values"][AT_NOW] == 0.45 == us_spot["now"]
    # half's cap, per GPU-hour: half the on-demand price of the cheapest pool's type
    eu_cap, us_cap = data["caps"]
    assert eu_cap["of"] == 0 and eu_cap["label"] == "bid cap aws eu-west-1 spot"
    assert _index(eu_cap["values"], 0.625) == list(range(AT_3H, AT_1H))  # 0.5 x 5.00 / 4
    assert _index(eu_cap["values"], 0.50) == list(range(AT_1H, AT_NOW + 1))  # 0.5 x 1.00
    # us-east-1's on-demand price is known from NOW only
    assert _index(us_cap["values"], 0.60) == [AT_NOW] and us_spot["cap_now"] == 0.60

    # 4 GPUs per instance, both markets, EU only, under small's $1/h cap
    query = {"gpu": "A10G", "gpus": "4", "regions": "eu-*", "policy": "small", "days": 1}
    data = client.get(url, params=query).json()
    assert [s["label"] for s in data["series"]] == [
        "aws eu-west-1 spot",
        "aws eu-west-1 on-demand",
    ]
    spot, on_demand = data["series"]
    assert set(spot["values"][AT_3H:]) == {0.50} and set(on_demand["values"][AT_3H:]) == {1.25}
    (cap,) = data["caps"]
    assert set(cap["values"][AT_3H:]) == {0.25}  # $1/h over 4 GPUs

    assert client.get(url, params={"gpu": "A10G", "market": "committed"}).status_code == 422
    assert client.get(url, params={"gpu": "A10G", "gpus": "x"}).status_code == 422
    assert client.get(url, params={"gpu": "H200"}).json()["series"] == []
    with httpx.Client(base_url=daemon.url) as stranger:
        assert stranger.get(url, params={"gpu": "A10G"}).status_code == 401


def test_a_job_page_and_its_cancel_needs_the_forms_csrf_token(
    client: httpx.Client, daemon: Daemon
) -> None:
    daemon.store.jobs.add_job("j1", "small", {"run": "x", "checkpoint_dir": "/x"})
    page = client.get("/ui/jobs/j1")
    assert page.status_code == 200 and 'id="cancel"' in page.text
    assert client.get("/ui/jobs").text.count('data-job="j1"') == 1
    assert client.get("/ui/jobs/none").status_code == 404
    assert client.post("/ui/jobs/j1/cancel", data={"csrf": "forged"}).status_code == 403
    assert daemon.store.jobs.get_job("j1").cancel_requested_at is None  # type: ignore[union-attr]
    value = client.cookies[sessions.COOKIE]
    found = sessions.verify(TOKEN, value, NOW)
    assert found is not None
    answer = client.post("/ui/jobs/j1/cancel", data={"csrf": sessions.csrf_token(TOKEN, found)})
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs/j1?cancelled=1"
    assert daemon.store.jobs.get_job("j1").cancel_requested_at is not None  # type: ignore[union-attr]
    assert client.get("/ui/data/jobs/j1/logs").text == "(no output yet)"
    assert client.get("/ui/data/jobs/j1/utilization").json()["t"] == []


def test_a_job_page_reads_the_stored_spec_with_its_defaults(
    client: httpx.Client, daemon: Daemon
) -> None:
    """A spec stored without `probes` (an earlier version's) runs the default quick probe, so
    its page does not say the job runs without probes; one stored with `probes: none` does."""
    daemon.store.jobs.add_job("old", "small", {"run": "x", "checkpoint_dir": "/x"})
    daemon.store.jobs.add_job(
        "bare", "small", {"run": "x", "checkpoint_dir": "/x", "probes": "none"}
    )
    note = "(the job runs with <code>probes: none</code>)"
    assert note not in client.get("/ui/jobs/old").text
    assert note in client.get("/ui/jobs/bare").text


def test_a_job_page_lists_its_checkpoints_their_restores_and_the_states_cost(
    client: httpx.Client, daemon: Daemon
) -> None:
    store = daemon.store
    spec = {"run": "x", "checkpoint": {"uri": "s3://team/r", "keep": 3, "region": "eu-central-1"}}
    job = store.jobs.add_job("ck", "small", spec)
    first, second = (
        store.jobs.create_attempt(
            job, n, f"ck-{n}", make_offer(provider="aws"), f"{n:064d}", NOW - timedelta(days=2)
        ).id
        for n in (1, 2)
    )
    for name, size, at in (("step-10", 4 * 10**9, 2), ("step-20", 6 * 10**9, 1)):
        store.checkpoints.add_checkpoint(
            job_id=job, attempt_id=first, name=name, step=int(name[5:]), size_bytes=size,
            files=1, uri=f"s3://team/r/data/{name}", provider="aws", region="eu-central-1",
            committed_at=NOW - timedelta(days=at), upload_s=3.0, final=name == "step-20",
        )  # fmt: skip
    store.checkpoints.mark_deleted(job, ["step-10"], NOW - timedelta(days=1))
    store.checkpoints.add_restore(
        job_id=job, attempt_id=second, checkpoint_name="step-20", size_bytes=6 * 10**9,
        fetched_bytes=6 * 10**9, seconds=12.0, from_provider="aws", from_region="eu-central-1",
        to_provider="gcp", to_region="us-central1", at=NOW - timedelta(hours=20),
    )  # fmt: skip
    page = client.get("/ui/jobs/ck").text
    assert "<code>s3://team/r</code> (eu-central-1), the 3 newest kept" in page
    rows = page.split('id="checkpoints"')[1].split("</table>")[0]
    assert rows.index("step-20") < rows.index("step-10")  # newest first
    assert "5.6 GiB" in rows and "#2" in rows and "final" in rows and "pruned" in rows
    # one day of 4 GB and one of 6 GB at $0.023/GB-month, plus 6 GB to another cloud at $0.09
    storage = (4 + 6) * 24 / 730 * 0.023
    assert f"storage and egress so far ${storage + 6 * 0.09:.2f}" in page  # to the cent
    # the newest live checkpoint's move, along each path out of its region
    assert "5.6 GiB in aws eu-central-1; moving it costs $0.12 (same-continent)" in page


def test_amounts_round_to_the_cent_alike_and_prices_keep_four_decimals() -> None:
    from optimizer.ui.render import NONE, price, usd

    # Rows and their total round alike: 0.124 + 0.124 + 0.124 shows as 0.12 each and 0.37.
    assert [usd(0.124), usd(0.372), usd(1234.5), usd(0.0), usd(-2.5)] == [
        "$0.12", "$0.37", "$1,234.50", "$0.00", "-$2.50",
    ]  # fmt: skip
    assert usd(0.003) == "<$0.01" and usd(None) == NONE
    assert [price(0.1713), price(3.06), price(0.0)] == ["$0.1713", "$3.06", "$0.00"]


def test_spend_is_the_instances_everywhere_and_a_removed_job_keeps_its_name(
    client: httpx.Client, daemon: Daemon
) -> None:
    """One definition: "spend" is the instances' cost on the console (overview, jobs list,
    job page) as in GET /costs and `gpuopt costs`, so spend + savings = the on-demand
    baseline; disks and storage are in the total billed beside it. A removed job's costs read
    `spent (removed job N)`, never the row's `spent~removed~N`."""
    store = daemon.store
    job = store.jobs.add_job("spent", "small", {"run": "x", "checkpoint_dir": "/x"})
    start = NOW - timedelta(hours=3)
    store.prices.record_offers([replace(ON_DEMAND, observed_at=start - timedelta(hours=1))])
    attempt = store.jobs.create_attempt(job, 1, "spent-1", SPOT, "0" * 64, start)
    store.jobs.update_attempt(
        attempt.key, instance_id="i-1", launched_at=start, disk_gib=100.0,
        terminated_at=NOW - timedelta(hours=1), ended_at=NOW - timedelta(hours=1),
        state="ended", end_reason="succeeded",
    )  # fmt: skip
    assert store.jobs.transition_job(
        job, expected="pending", state="succeeded", reason="done", at=NOW - timedelta(hours=1)
    )
    with httpx.Client(base_url=daemon.url, timeout=10) as api_client:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        by_job = api_client.get("/costs", params={"by": "job"}, headers=headers).json()
    [row] = [g for g in by_job if g["group"] == "spent"]
    assert row["storage_usd"] > 0 and row["total_usd"] > row["spend_usd"] > 0
    assert row["on_demand_usd"] > row["spend_usd"]
    page = client.get("/ui/jobs/spent").text
    assert f'id="job-spend">${row["spend_usd"]:,.2f} (instances)</dd>' in page
    listed = client.get("/ui/jobs?state=succeeded").text
    assert f"${row['spend_usd']:,.2f}" in listed.split('data-job="spent"')[1].split("</tr>")[0]
    overview = client.get("/ui/").text
    from optimizer.costs.report import add_up

    total = add_up(by_job)
    assert f'id="mtd-spend">${total["spend_usd"]:,.2f}</span>' in overview
    assert f'id="mtd-total">${total["total_usd"]:,.2f}</span>' in overview
    assert round(total["spend_usd"] + total["savings_usd"], 6) == round(total["on_demand_usd"], 6)

    assert store.jobs.remove_job("spent", at=NOW) is not None
    with httpx.Client(base_url=daemon.url, timeout=10) as api_client:
        after = api_client.get("/costs", params={"by": "job"}, headers=headers).json()
    assert [g["group"] for g in after] == [f"spent (removed job {job})"]


def test_a_console_page_that_fails_is_a_page_in_the_frame_with_its_status(
    client: httpx.Client, daemon: Daemon
) -> None:
    """An unknown job, an address with no page, a bad parameter and a refused form answer
    their status with the console's header and navigation around what went wrong; what the
    pages' scripts fetch and the API keep their JSON."""
    gone = client.get("/ui/jobs/nobody")
    assert gone.status_code == 404 and gone.headers["content-type"].startswith("text/html")
    assert 'class="brand"' in gone.text and '<a href="/ui/jobs" aria-current="page">' in gone.text
    assert "No job named &#39;nobody&#39;." in gone.text and 'action="/ui/logout"' in gone.text
    assert gone.headers["content-security-policy"].startswith("default-src 'self'")
    nowhere = client.get("/ui/nowhere")
    assert nowhere.status_code == 404 and "There is no console page at /ui/nowhere." in nowhere.text
    bad = client.get("/ui/prices", params={"days": 99})
    assert bad.status_code == 422 and '<ul id="error-problems">' in bad.text
    assert "<li>days: Input should be less than or equal to 30</li>" in bad.text
    daemon.store.jobs.add_job("j2", "small", {"run": "x", "checkpoint_dir": "/x"})
    refused = client.post("/ui/jobs/j2/cancel", data={"csrf": "forged"})
    assert refused.status_code == 403 and "CSRF token is missing or wrong" in refused.text
    assert 'class="brand"' in refused.text
    # the scripts' endpoints and the API: JSON as before
    data = client.get("/ui/data/jobs/nobody/logs")
    assert data.status_code == 404 and data.json() == {"detail": "no job named 'nobody'"}
    assert client.get("/ui/fragments/jobs/nobody").json()["detail"] == "no job named 'nobody'"
    invalid = client.get("/ui/data/prices", params={"pool": "x", "days": 99})
    assert invalid.status_code == 422 and invalid.json()["detail"][0]["loc"] == ["query", "days"]
    with httpx.Client(base_url=daemon.url) as stranger:
        api = stranger.get("/jobs/nobody", headers={"Authorization": f"Bearer {TOKEN}"})
        assert api.status_code == 404 and api.json()["detail"]
        # a stranger gets the frame without a sign-out form; pages still send them to sign in
        lost = stranger.get("/ui/nowhere")
        assert lost.status_code == 404 and 'action="/ui/logout"' not in lost.text
        assert stranger.get("/ui/jobs/nobody").status_code == 303


def test_the_favicon_needs_no_token_and_the_api_still_does(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url) as stranger:
        icon = stranger.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert icon.content.startswith(b"<svg")
        assert stranger.get("/ui/static/favicon.svg").content == icon.content
        assert stranger.get("/jobs").status_code == 401
        assert 'rel="icon" href="/ui/static/favicon.svg"' in stranger.get("/ui/login").text


def test_an_ended_jobs_page_says_last_reading_and_does_not_follow_its_output(
    client: httpx.Client, daemon: Daemon
) -> None:
    from optimizer.store.logs import NewChunk
    from optimizer.store.telemetry import GpuMinute

    store = daemon.store
    job = store.jobs.add_job("done", "small", {"run": "x", "checkpoint_dir": "/x"})
    attempt = store.jobs.create_attempt(job, 1, "done-1", SPOT, "0" * 64, NOW)
    store.telemetry.add(
        attempt.id,
        [GpuMinute(NOW, 6, 1, util_mean=0.5, memory_used_gib_max=4, memory_total_gib=16)],
    )
    store.logs.append(
        job_id=job, attempt_id=attempt.id, chunks=[NewChunk(0, "stdout", "step 10 of 10\n")]
    )
    live = client.get("/ui/jobs/done").text
    assert "<dt>GPU now</dt>" in live and "Output (last 200 lines, following)" in live
    assert 'data-logs="/ui/data/jobs/done/logs"' in live
    assert 'data-chart="utilization"' in live and 'data-every="3000" role="img"' in live
    assert store.jobs.transition_job(
        job, expected="pending", state="succeeded", reason="done", at=NOW
    )
    ended = client.get("/ui/jobs/done").text
    assert "<dt>GPU, last reading</dt>" in ended and "GPU now" not in ended
    assert "following" not in ended and "data-logs" not in ended
    assert '<h2 id="logs-h">Output (last 200 lines)</h2>' in ended
    assert "step 10 of 10" in ended.split('id="logs"')[1]  # in the page
    chart = ended.split('id="util-chart"')[1].split(">")[0]
    assert "data-every" not in chart  # the readings are all there are: no polling
    # the utilization's data: one minute, one point (the chart's axis spans it: charts.js)
    assert client.get("/ui/data/jobs/done/utilization").json()["util"] == [50.0]


def test_an_alert_with_several_problems_is_a_list(client: httpx.Client, daemon: Daemon) -> None:
    """A rejected policy edit's alert names each problem on a line of its own: the overview
    and the job's events show them as a list under the first line."""
    problems = ["a.yaml:3:1: buffer: unknown key", "a.yaml:5:9: bid.max_usd_per_hour: not a number"]
    job = daemon.store.jobs.add_job("j3", "small", {"run": "x", "checkpoint_dir": "/x"})
    daemon.store.events.add_event(
        "policy.rejected",
        "a.yaml: edit rejected, no earlier version to keep:\n" + "\n".join(problems),
        severity="warning",
        job_id=job,
    )
    listed = (
        'a.yaml: edit rejected, no earlier version to keep:<ul class="problems">'
        + "".join(f"<li>{p}</li>" for p in problems)
        + "</ul>"
    )
    assert listed in client.get("/ui/").text
    assert listed in client.get("/ui/jobs/j3").text
    daemon.store.events.add_event("job.interrupted", "one line", severity="warning")
    assert "<br>one line</li>" in client.get("/ui/").text
