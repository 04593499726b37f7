"""The interruption watchers: IMDSv2 and GCP metadata, against the local cloud's metadata
endpoint (a real HTTP server) and, for the corner cases, a scripted transport."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from optimizer.agent.imds import (
    TOKEN_HEADER,
    AwsImds,
    GcpMetadata,
    UnknownWatcherKind,
    make_watcher,
)
from optimizer.model import Market
from providers.base import LaunchSpec
from providers.local import LocalCloud


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[LocalCloud]:
    local = LocalCloud(tmp_path / "cloud", tick_s=0.05)
    local.start()
    yield local
    local.kill_all()
    local.close()


@pytest.fixture
def instance(cloud: LocalCloud) -> str:
    """A running spot instance whose process just sleeps."""
    offer = next(o for o in cloud.fetch_offers(["us-east-1"]) if o.market is Market.SPOT)
    ref = cloud.launch(offer, LaunchSpec(job="j", attempt=1, bootstrap="sleep 60"), "j/1")
    return ref.instance_id


def test_no_event_until_interrupted_then_each_notice_once(cloud: LocalCloud, instance: str) -> None:
    imds = AwsImds(cloud.metadata_url(instance))
    assert imds.instance_id() == instance
    assert imds.check() == []  # 404 on both paths: no event
    assert imds.token_fetches == 1 and imds.errors == 0

    record = cloud.interrupt(instance, grace_s=30)
    notices = imds.check()
    assert [n.source for n in notices] == ["aws-imds-spot", "aws-imds-rebalance"]
    spot, rebalance = notices
    assert spot.action == "terminate" and spot.time is not None
    assert spot.time.endswith("Z") and rebalance.action == "rebalance"
    assert spot.payload_sha256 == hashlib.sha256(spot.payload.encode()).hexdigest()
    assert record.interruption is not None
    assert imds.check() == []  # the same payloads again: deduplicated
    assert imds.token_fetches == 1  # one token served every call


def test_an_expired_token_is_refreshed_on_401(cloud: LocalCloud, instance: str) -> None:
    imds = AwsImds(cloud.metadata_url(instance))
    assert imds.check() == []
    cloud.metadata.expire_tokens()
    cloud.interrupt(instance)
    assert len(imds.check()) == 2
    assert imds.token_fetches == 2 and imds.errors == 0
    statuses = [s for m, p, s in cloud.metadata.requests if p.endswith("spot/instance-action")]
    assert statuses == [404, 401, 200]


def test_the_token_is_renewed_before_its_ttl_runs_out(cloud: LocalCloud, instance: str) -> None:
    now = [0.0]
    imds = AwsImds(cloud.metadata_url(instance), clock=lambda: now[0])
    imds.check()
    now[0] = 3600 - 20  # more than 15 s left: kept
    imds.check()
    assert imds.token_fetches == 1
    now[0] = 3600 - 10  # 15 s or less left: renewed
    imds.check()
    assert imds.token_fetches == 2


def test_the_endpoint_insists_on_imdsv2_rules(cloud: LocalCloud, instance: str) -> None:
    base = cloud.metadata_url(instance)
    with httpx.Client() as client:
        assert client.get(f"{base}/latest/meta-data/instance-id").status_code == 401
        assert client.put(f"{base}/latest/api/token").status_code == 400  # TTL header missing
        ttl = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
        forwarded = client.put(f"{base}/latest/api/token", headers={**ttl, "X-Forwarded-For": "x"})
        assert forwarded.status_code == 403
        token = client.put(f"{base}/latest/api/token", headers=ttl)
        assert token.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "60"
        life = client.get(
            f"{base}/latest/meta-data/instance-life-cycle", headers={TOKEN_HEADER: token.text}
        )
        assert life.text == "spot"
        other = cloud.metadata.url + "/i-local-9999/latest/api/token"
        assert client.put(other, headers=ttl).status_code == 404


def test_an_unreachable_endpoint_is_an_error_count_not_an_exception() -> None:
    slept: list[float] = []
    imds = AwsImds("http://127.0.0.1:9", sleep=slept.append, rng=lambda: 0.5, timeout_s=0.5)
    assert imds.check() == []
    assert imds.errors == 2 and "ConnectError" in (imds.last_error or "")
    # jittered back-off between the three tries: 3/4 of 0.25 s, then of 0.5 s
    assert slept == [0.1875, 0.375, 0.1875, 0.375]
    assert imds.instance_id() is None


def scripted(responses: dict[tuple[str, str], list[httpx.Response]]) -> httpx.Client:
    """A client whose answers come from `responses[(method, path)]`, in order (last repeats)."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        queue = responses.get((request.method, request.url.path)) or [httpx.Response(404)]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    client = httpx.Client(transport=httpx.MockTransport(handle))
    client.seen = seen  # type: ignore[attr-defined]
    return client


def test_a_changed_payload_is_a_new_notice() -> None:
    first = b'{"action": "stop", "time": "2026-11-30T01:02:00Z"}'
    second = b'{"action": "terminate", "time": "2026-11-30T01:02:00Z"}'
    client = scripted(
        {
            ("PUT", "/latest/api/token"): [httpx.Response(200, text="tok")],
            ("GET", "/latest/meta-data/spot/instance-action"): [
                httpx.Response(200, content=first),
                httpx.Response(200, content=first),
                httpx.Response(200, content=second),
            ],
        }
    )
    imds = AwsImds("http://imds", client=client)
    assert [n.action for n in imds.check()] == ["stop"]
    assert imds.check() == []
    assert [n.action for n in imds.check()] == ["terminate"]


def test_without_imdsv2_it_falls_back_to_plain_gets() -> None:
    client = scripted(
        {
            ("PUT", "/latest/api/token"): [httpx.Response(405)],
            ("GET", "/latest/meta-data/spot/instance-action"): [
                httpx.Response(200, content=b'{"action": "terminate", "time": "t"}')
            ],
        }
    )
    imds = AwsImds("http://imds", client=client)
    assert [n.source for n in imds.check()] == ["aws-imds-spot"]
    gets = [r for r in client.seen if r.method == "GET"]  # type: ignore[attr-defined]
    assert gets and all(TOKEN_HEADER not in r.headers for r in gets)


def test_gcp_watcher_hangs_until_preempted_and_reports_once(
    cloud: LocalCloud, instance: str
) -> None:
    gcp = GcpMetadata(cloud.metadata_url(instance), wait_s=10)
    assert gcp.instance_id() == instance
    assert gcp.check() == []  # FALSE, and the ETag to wait on
    found: list = []
    waiter = threading.Thread(target=lambda: found.extend(gcp.check()))
    waiter.start()
    waiter.join(timeout=0.3)
    assert waiter.is_alive()  # no change yet: the GET hangs
    cloud.interrupt(instance)
    waiter.join(timeout=5)
    assert not waiter.is_alive(), "the hanging GET did not return on the change"
    assert [(n.source, n.action) for n in found] == [("gcp-metadata-preempted", "preempted")]
    gcp.wait_s = 1  # nothing changes any more: the next hang times out, with no repeat
    assert gcp.check() == []
    assert gcp.errors == 0


def test_gcp_endpoint_requires_the_metadata_flavor_header(cloud: LocalCloud, instance: str) -> None:
    url = cloud.metadata_url(instance) + "/computeMetadata/v1/instance/preempted"
    assert httpx.get(url).status_code == 403
    answer = httpx.get(url, headers={"Metadata-Flavor": "Google"})
    assert answer.text == "FALSE" and answer.headers["Metadata-Flavor"] == "Google"
    assert answer.headers["ETag"]


def test_the_watcher_kind_picks_the_watcher() -> None:
    aws = make_watcher("aws-imds", "http://127.0.0.1:1", interval_s=1.5)
    assert isinstance(aws, AwsImds) and aws.interval_s == 1.5
    assert isinstance(make_watcher("gcp-metadata", "http://127.0.0.1:1"), GcpMetadata)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("azure-imds", "unknown metadata watcher kind 'azure-imds'"),
        ("gcp", "unknown metadata watcher kind 'gcp'"),  # a cloud is not a watcher kind
        ("", "no metadata watcher kind given"),
    ],
)
def test_an_unknown_or_missing_watcher_kind_is_an_error_not_the_aws_watcher(
    kind: str, message: str
) -> None:
    with pytest.raises(UnknownWatcherKind, match=message) as caught:
        make_watcher(kind, "http://127.0.0.1:1")
    assert "expected one of aws-imds, gcp-metadata" in str(caught.value)
