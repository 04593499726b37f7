"""A list where a mapping belongs (or the other way round) is said with what is expected: the
keys the mapping takes and an example that works; problems come in file order."""

from __future__ import annotations

import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from optimizer.common.documents import parse_document
from optimizer.common.errors import LocatedError
from optimizer.daemon.config import ConfigSchema
from optimizer.jobs.spec import JobSpec
from policies.schema import Policy

HEAD = "apiVersion: gpuopt/v1\nkind: Policy\nname: eu-only\n"
REGIONS_EXAMPLE = "regions: {allow: [eu-*, europe-*], deny: [eu-south-*]}"


def gpuopt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_policy_check_says_regions_takes_allow_and_deny_and_its_example_works(
    tmp_path: Path,
) -> None:
    path = tmp_path / "eu.yaml"
    path.write_text(HEAD + 'placement:\n  regions: ["eu-*"]\n')
    done = gpuopt("policy", "check", str(path))
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        f"{path}:5:12: placement.regions: must be a mapping with keys allow, deny; "
        f"for example: {REGIONS_EXAMPLE}"
    )
    # The example, pasted in place of the bad line, is a policy that checks.
    path.write_text(HEAD + f"placement:\n  {REGIONS_EXAMPLE}\n")
    fixed = gpuopt("policy", "check", str(path))
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.startswith(f"{path}: ok (eu-only")


def test_policy_check_lists_problems_in_file_order(tmp_path: Path) -> None:
    # The model validates workload, markets, bid, placement in its own field order; the file
    # puts them the other way round, and the lines must follow the file.
    path = tmp_path / "order.yaml"
    path.write_text(
        HEAD
        + "placement: {providers: aws}\n"
        + "bid: 3\n"
        + "markets: spot\n"
        + "workload: {gpus: 0, gpu_models: A100}\n"
    )
    done = gpuopt("policy", "check", str(path))
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.startswith(str(path))]
    located = [tuple(int(n) for n in line.split(":")[1:3]) for line in lines]
    assert located == sorted(located) and len(located) == 5, done.stderr
    assert [line.split(": ")[1] for line in lines] == [
        "placement.providers",
        "bid",
        "markets",
        "workload.gpus",
        "workload.gpu_models",
    ]
    assert lines[1].endswith(
        "bid: must be a mapping with keys max_usd_per_hour, max_usd_per_gpu_hour, "
        "max_fraction_of_on_demand, enforce_in_cloud; for example: bid: {max_usd_per_gpu_hour: 2.5}"
    )
    assert lines[2].endswith("markets: must be a list; for example: markets: [spot, on_demand]")


# -- every mapping and list field, in every person-edited schema ----------------------------

# A valid key where a walk steps into a dict of models.
SAMPLE_KEYS = {"providers": "aws", "channels": "ops"}


def _unwrap(annotation: Any) -> Any:
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if origin is not None and origin not in (list, dict) and len(members) == 1:
            annotation = members[0]
            continue
        return annotation


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def shaped_fields(
    model: type[BaseModel], prefix: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(path, shape) of every field that takes a mapping or a list, nested ones too."""
    for name, info in model.model_fields.items():
        at = (*prefix, info.alias or name)
        annotation = _unwrap(info.annotation)
        origin = typing.get_origin(annotation)
        if _is_model(annotation):
            yield at, "mapping"
            yield from shaped_fields(annotation, at)
        elif origin is dict:
            yield at, "mapping"
            value = _unwrap(typing.get_args(annotation)[1])
            if _is_model(value):
                yield from shaped_fields(value, (*at, SAMPLE_KEYS.get(str(at[-1]), "x")))
        elif origin is list:
            yield at, "list"
            item = _unwrap(typing.get_args(annotation)[0])
            if _is_model(item):
                yield from shaped_fields(item, (*at, 0))


def placed(path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A document with `value` at `path` and nothing else."""
    out: Any = value
    for step in reversed(path):
        out = [out] if isinstance(step, int) else {step: out}
    return dict(out)


def dotted(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def problems_of(model: type[BaseModel], document: dict[str, Any]) -> list[str]:
    text = yaml.safe_dump(document, sort_keys=False)
    try:
        parse_document(text, model, path="f.yaml", interpolate=False)
    except LocatedError as exc:
        return [f"{p.field}: {p.message}" for p in exc.problems]
    return []


CASES = [
    (model, path, shape)
    for model in (Policy, JobSpec, ConfigSchema)
    for path, shape in shaped_fields(model)
]


@pytest.mark.parametrize(
    ("model", "path", "shape"),
    CASES,
    ids=[f"{m.__name__}:{dotted(p)}" for m, p, _ in CASES],
)
def test_a_wrong_shape_is_said_with_an_example_that_is_valid(
    model: type[BaseModel], path: tuple[str | int, ...], shape: str
) -> None:
    field = dotted(path)
    # A list where a mapping goes (a number may be a field's shorthand: `work: 7` is 7 s of
    # work), a number where a list goes.
    wrong = problems_of(model, placed(path, [7] if shape == "mapping" else 7))
    [said] = [p for p in wrong if p.startswith(f"{field}: ")]
    assert said.startswith(f"{field}: must be a {shape}")
    assert f"; for example: {path[-1]}: " in said, f"{said} (give the field examples=[...])"
    example = yaml.safe_load(said.split("; for example: ", 1)[1])[path[-1]]
    # The example in its place raises no problem at that field or under it.
    right = problems_of(model, placed(path, example))
    assert not [p for p in right if p.startswith((f"{field}:", f"{field}.", f"{field}["))], right


def test_the_walk_finds_the_fields_people_get_wrong() -> None:
    found = {(m.__name__, dotted(p)) for m, p, _ in CASES}
    assert {
        ("Policy", "placement.regions"),
        ("Policy", "placement.regions.allow"),
        ("Policy", "workload.min_tflops"),
        ("JobSpec", "env"),
        ("ConfigSchema", "providers.aws.regions"),
        ("ConfigSchema", "alerts.routes[0].kinds"),
    } <= found
