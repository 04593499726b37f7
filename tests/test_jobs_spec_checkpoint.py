"""A job spec's `checkpoint`: a bucket URI (or uri/keep/region), checked where it is read,
and exactly one of `checkpoint` and `checkpoint_dir`, each error located at its field."""

from __future__ import annotations

import json

import pytest

from optimizer.jobs.spec import (
    CheckpointSpec,
    JobSpecError,
    bucket_provider,
    check_uri,
    from_stored,
    parse_job_spec,
    stored_form,
)

BASE = "name: train\npolicy: p\nrun: python train.py\n"


def problems(text: str) -> list[str]:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(text, path="j.yaml")
    return [str(p) for p in caught.value.problems]


def test_a_plain_string_is_the_uri_with_the_defaults() -> None:
    spec = parse_job_spec(BASE + "checkpoint: s3://team-ckpt/resnet/\n")
    assert spec.checkpoint == CheckpointSpec(uri="s3://team-ckpt/resnet", keep=3, region=None)
    assert spec.checkpoint_dir is None


def test_the_long_form_takes_keep_and_region() -> None:
    text = BASE + "checkpoint:\n  uri: gs://team-ckpt\n  keep: 10\n  region: europe-west4\n"
    spec = parse_job_spec(text)
    assert spec.checkpoint == CheckpointSpec(uri="gs://team-ckpt", keep=10, region="europe-west4")


def test_checkpoint_dir_alone_keeps_todays_meaning() -> None:
    spec = parse_job_spec(BASE + "checkpoint_dir: /mnt/shared/c\n")
    assert (spec.checkpoint, spec.checkpoint_dir) == (None, "/mnt/shared/c")


def test_both_are_refused_at_checkpoint_dir() -> None:
    found = problems(BASE + "checkpoint: s3://team-ckpt\ncheckpoint_dir: /c\n")
    assert found == [
        "j.yaml:5:17: checkpoint_dir: give either `checkpoint` or `checkpoint_dir`, not both"
    ]


def test_neither_is_accepted_and_the_job_restarts_from_the_beginning() -> None:
    spec = parse_job_spec(BASE)
    assert (spec.checkpoint, spec.checkpoint_dir) == (None, None)
    assert spec.restarts_from_beginning
    assert not parse_job_spec(BASE + "checkpoint_dir: /c\n").restarts_from_beginning


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("ftp://host/x", "j.yaml:4:1: checkpoint.uri: 'ftp://host/x': unsupported scheme 'ftp'"),
        ("gs://", "j.yaml:4:1: checkpoint.uri: 'gs://': no bucket name after gs://"),
        ("team-ckpt/x", "not a storage URI"),
        ("file://relative/x", "file:///absolute/path (found host 'relative'"),
        ("s3://Team_Bucket", "'Team_Bucket' is not a valid bucket name"),
        ("s3://bkt/a/../x", "key 'a/../x' has an empty, '.' or '..' segment"),
        ("s3://bkt/a//x", "key 'a//x' has an empty, '.' or '..' segment"),
    ],
)
def test_bad_uris_are_located_at_checkpoint_uri(value: str, expected: str) -> None:
    [found] = problems(BASE + f"checkpoint: {value}\n")
    assert expected in found and "checkpoint.uri" in found, found


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("  keep: 0\n", "j.yaml:6:9: checkpoint.keep: must be >= 1"),
        ("  keep: 101\n", "j.yaml:6:9: checkpoint.keep: must be <= 100"),
        ("  region: 'US East'\n", "checkpoint.region:"),
        ("  bucket: x\n", "j.yaml:6:3: checkpoint.bucket: unknown field"),
    ],
)
def test_bad_checkpoint_fields_are_located(extra: str, expected: str) -> None:
    found = problems(BASE + "checkpoint:\n  uri: s3://team-ckpt\n" + extra)
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    ("uri", "canonical", "provider"),
    [
        ("s3://team-ckpt/a/b/", "s3://team-ckpt/a/b", "aws"),
        ("gs://team.ckpt", "gs://team.ckpt", "gcp"),
        ("file:///srv/ckpt/", "file:///srv/ckpt", "local"),
    ],
)
def test_uris_come_back_canonical_with_their_provider(
    uri: str, canonical: str, provider: str
) -> None:
    assert check_uri(uri) == canonical
    assert bucket_provider(canonical) == provider


def test_a_checkpoint_spec_stores_and_reads_back() -> None:
    spec = parse_job_spec(BASE + "checkpoint: {uri: 's3://team-ckpt/r', region: us-east-1}\n")
    stored = json.loads(json.dumps(stored_form(spec)))
    assert stored["checkpoint"] == {"uri": "s3://team-ckpt/r", "keep": 3, "region": "us-east-1"}
    assert from_stored(stored, name="train", policy="p") == spec


def test_a_spec_stored_before_checkpoint_reads_unchanged() -> None:
    old = {"run": "python train.py", "checkpoint_dir": "s3://team-ckpt/old", "probes": "deep"}
    spec = from_stored(old, name="train", policy="p")
    assert (spec.checkpoint, spec.checkpoint_dir, spec.probes) == (
        None,
        "s3://team-ckpt/old",
        "deep",
    )
