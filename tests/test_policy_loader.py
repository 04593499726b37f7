"""Policy files as people write them: valid ones load, every bad one gets a located error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.common.documents import MAX_BYTES
from policies.loader import PolicyError, load_policy, parse_policy
from policies.schema import Policy, json_schema
from providers import registry

ROOT = Path(__file__).resolve().parents[1]

FULL = """\
apiVersion: gpuopt/v1
kind: Policy
name: llm-training-eu
workload:
  type: training
  gpus: 8
  gpu_memory_gib: 70
  model: {parameters: 7B, precision: bf16, optimizer: adam}
  min_tflops: {bf16: 2000}
  fp64: false
  interconnect: nvlink
  cpu_memory_gib: 512
  vcpus: 64
buffer: 0.20
markets: [spot, on_demand]
rank_by: price
bid:
  max_usd_per_hour: 40
  max_usd_per_gpu_hour: 5
  max_fraction_of_on_demand: 0.6
placement:
  providers: [aws, gcp]
  regions: {allow: ["*"], deny: ["eu-south-*"]}
  compliance: gdpr
  countries: []
budget: {monthly_usd: 5000}
recovery: {max_restarts: 20, pool_cooldown_minutes: 10, on_demand_after_interruptions: 3}
"""
MINIMAL = "apiVersion: gpuopt/v1\nkind: Policy\nname: small\n"


def test_full_policy_loads_with_every_field() -> None:
    policy = parse_policy(FULL)
    assert policy.name == "llm-training-eu"
    assert policy.workload.model is not None and policy.workload.model.parameters == 7 * 10**9
    assert policy.placement.compliance == "eu"  # gdpr is an alias
    assert policy.bid.max_fraction_of_on_demand == 0.6
    # explicit 70 GiB beats the 7B model's 15.6 GiB per GPU on 8 GPUs; then the 20% buffer
    assert policy.memory_need_gib() == pytest.approx(84.0)


def test_defaults() -> None:
    policy = parse_policy(MINIMAL)
    assert policy.buffer == 0.2
    assert policy.markets == ["spot", "on_demand", "owned"]  # owned machines are used by default
    assert policy.workload.gpus == 1 and policy.workload.interconnect == "any"
    assert policy.placement.regions.allow == ["*"] and policy.placement.compliance is None
    assert policy.recovery.pool_cooldown_minutes == 10
    assert policy.memory_need_gib() == 0


def test_model_sizing_feeds_the_memory_need() -> None:
    policy = parse_policy(
        MINIMAL + "workload: {model: {parameters: 7B, precision: fp16}, "
        "type: inference}\nbuffer: 0\n"
    )
    # 7e9 x 2 bytes x 1.2 (KV-cache allowance) / 2^30
    assert policy.memory_need_gib() == pytest.approx(7e9 * 2 * 1.2 / 2**30)


@pytest.mark.parametrize(
    ("text", "line", "col", "field"),
    [
        ('description: "${LEAK_ME} jobs"\n', 4, 15, "description"),
        ('bid: {max_usd_per_hour: "${LEAK_ME}"}\n', 4, 26, "bid.max_usd_per_hour"),
        ("description: x ${LEAK_ME:-default}\n", 4, 16, "description"),
        ("description: |\n  one\n  two $${LEAK_ME}\n", 6, 8, "description"),
        ("placement:\n  regions: {allow: ['${LEAK_ME}']}\n", 5, 22, "placement.regions.allow[0]"),
    ],
)
def test_a_policy_never_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch, text: str, line: int, col: int, field: str
) -> None:
    # The daemon's environment holds secrets, and GET /policies returns what a policy says:
    # a `${` anywhere in a value is an error at the `${`, not a lookup.
    monkeypatch.setenv("LEAK_ME", "s3cr3t-token")
    with pytest.raises(PolicyError) as caught:
        parse_policy(MINIMAL + text, path="p.yaml")
    (problem,) = caught.value.problems
    assert str(problem) == (
        f"p.yaml:{line}:{col}: {field}: '${{' is not allowed in a policy: values are never "
        "taken from the environment"
    )
    assert "s3cr3t" not in str(caught.value)


def test_a_dollar_without_a_brace_is_plain_text() -> None:
    assert parse_policy(MINIMAL + 'description: "costs $5/h, {x}"\n').description == (
        "costs $5/h, {x}"
    )


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, path="p.yaml")
    return [str(p) for p in caught.value.problems]


BAD: list[tuple[str, str, str]] = [
    # (what, YAML appended to the minimal policy or a whole document, expected error)
    ("unknown top-level key", "bufer: 0.1\n", "p.yaml:4:1: bufer: unknown field"),
    (
        "unknown nested key",
        "bid: {max_usd_per_hr: 3}\n",
        "p.yaml:4:7: bid.max_usd_per_hr: unknown field",
    ),
    ("buffer negative", "buffer: -0.1\n", "p.yaml:4:9: buffer: must be >= 0"),
    ("buffer of one", "buffer: 1\n", "p.yaml:4:9: buffer: must be < 1"),
    ("buffer as text", "buffer: lots\n", "p.yaml:4:9: buffer: must be a number"),
    (
        "fraction over one",
        "bid: {max_fraction_of_on_demand: 1.2}\n",
        "p.yaml:4:34: bid.max_fraction_of_on_demand: must be <= 1",
    ),
    (
        "zero price cap",
        "bid: {max_usd_per_hour: 0}\n",
        "p.yaml:4:25: bid.max_usd_per_hour: must be > 0",
    ),
    (
        "empty allow list",
        "placement: {regions: {allow: []}}\n",
        "p.yaml:4:30: placement.regions.allow: must not be empty",
    ),
    (
        "empty region glob",
        "placement: {regions: {allow: ['']}}\n",
        "placement.regions.allow[0]: a region glob must not be empty",
    ),
    (
        "unknown compliance preset",
        "placement: {compliance: mars}\n",
        "placement.compliance: unknown compliance preset 'mars'",
    ),
    (
        "bad country code",
        "placement: {countries: [Germany]}\n",
        "placement.countries: bad country code 'Germany'",
    ),
    (
        "unknown provider",
        "placement: {providers: [azure]}\n",
        "p.yaml:4:25: placement.providers[0]: must be an installed provider: "
        + " or ".join(
            [", ".join(repr(n) for n in registry.names()[:-1]), repr(registry.names()[-1])]
        ),
    ),
    ("no markets", "markets: []\n", "p.yaml:4:10: markets: must not be empty"),
    (
        "unknown market",
        "markets: [reserved]\n",
        "markets[0]: must be 'spot', 'on_demand', 'committed' or 'owned'",
    ),
    ("market twice", "markets: [spot, spot]\n", "markets: markets lists a market twice"),
    (
        "unknown dtype",
        "workload: {min_tflops: {bf17: 100}}\n",
        "p.yaml:4:25: workload.min_tflops.bf17: must be 'fp64'",
    ),
    (
        "negative tflops",
        "workload: {min_tflops: {bf16: -1}}\n",
        "workload.min_tflops: min_tflops.bf16 must be > 0",
    ),
    (
        "fractional gpus",
        "workload: {gpus: 2.5}\n",
        "p.yaml:4:18: workload.gpus: must be a whole number",
    ),
    ("zero gpus", "workload: {gpus: 0}\n", "workload.gpus: must be >= 1"),
    ("gpus as text", "workload: {gpus: '8'}\n", "workload.gpus: must be a whole number"),
    ("unknown workload type", "workload: {type: mining}\n", "workload.type: must be 'training'"),
    ("unknown interconnect", "workload: {interconnect: infiniband}\n", "must be 'any' or 'nvlink'"),
    ("fp64 not a bool", "workload: {fp64: sometimes}\n", "workload.fp64: must be true or false"),
    ("unknown GPU model", "workload: {gpu_models: [A1000]}\n", "unknown GPU model 'A1000'"),
    (
        "bad parameter count",
        "workload: {model: {parameters: 7Q}}\n",
        "workload.model.parameters: parameters '7Q'",
    ),
    (
        "unknown precision",
        "workload: {model: {parameters: 7B, precision: fp12}}\n",
        "precision 'fp12'",
    ),
    (
        "model for rendering",
        "workload: {type: rendering, model: {parameters: 1B}}\n",
        "workload: model sizing applies to training and inference",
    ),
    (
        "int4 training",
        "workload: {model: {parameters: 1B, precision: int4}}\n",
        "cannot size training",
    ),
    ("workload not a mapping", "workload: 8\n", "p.yaml:4:11: workload: must be a mapping"),
    (
        "bad name",
        "apiVersion: gpuopt/v1\nkind: Policy\nname: My_Policy\n",
        "p.yaml:3:7: name: must be",
    ),
    (
        "wrong apiVersion",
        "apiVersion: gpuopt/v2\nkind: Policy\nname: x\n",
        "apiVersion: must be 'gpuopt/v1'",
    ),
    (
        "missing name",
        "apiVersion: gpuopt/v1\nkind: Policy\n",
        "p.yaml:1:1: name: required field is missing",
    ),
    (
        "negative cooldown",
        "recovery: {pool_cooldown_minutes: -5}\n",
        "recovery.pool_cooldown_minutes: must be >= 0",
    ),
    (
        "unknown recovery strategy",
        "recovery:\n  strategy: eager\n",
        "p.yaml:5:13: recovery.strategy: unknown recovery strategy 'eager'; installed: ",
    ),
    (
        "zero on-demand window",
        "recovery: {on_demand_window_minutes: 0}\n",
        "recovery.on_demand_window_minutes: must be > 0",
    ),
    ("budget zero", "budget: {monthly_usd: 0}\n", "budget.monthly_usd: must be > 0"),
    ("syntax error", "bid: {max_usd_per_hour: 3\n", "p.yaml:5:1: YAML syntax error"),
    ("tab indentation", "bid:\n\tmax_usd_per_hour: 3\n", "p.yaml:5:1: YAML syntax error"),
    (
        "duplicate key",
        "buffer: 0.1\nbuffer: 0.3\n",
        "p.yaml:5:1: buffer: duplicate key (first at line 4)",
    ),
    (
        "duplicate nested key",
        "bid:\n  max_usd_per_hour: 3\n  max_usd_per_hour: 4\n",
        "p.yaml:6:3: bid.max_usd_per_hour: duplicate key (first at line 5)",
    ),
    (
        "non-mapping root",
        "- apiVersion: gpuopt/v1\n",
        "p.yaml:1:1: the top level must be a mapping",
    ),
    ("scalar root", "just a string\n", "the top level must be a mapping"),
    ("empty file", "", "p.yaml: empty file"),
    ("two documents", MINIMAL + "---\n" + MINIMAL, "one policy per file"),
    ("python tag", "description: !!python/object/apply:os.system [ls]\n", "is not allowed"),
    ("merge key", "x: &b {buffer: 0.1}\n<<: *b\n", "merge keys (<<) are not supported"),
    (
        "env reference",
        "bid:\n  max_usd_per_hour: ${NOT_SET_ANYWHERE}\n",
        "p.yaml:5:21: bid.max_usd_per_hour: '${' is not allowed in a policy",
    ),
    ("deep nesting", "description: " + "[" * 5000 + "]" * 5000 + "\n", "nests too deeply"),
]


@pytest.mark.parametrize(("what", "text", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_policy_gets_a_located_error(what: str, text: str, expected: str) -> None:
    document = (
        text
        if text.startswith(("apiVersion", "- ", "just", MINIMAL)) or not text
        else (MINIMAL + text)
    )
    found = problems(document)
    assert any(expected in p for p in found), found
    assert all(p.startswith("p.yaml") for p in found)


def test_alias_bomb_is_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    found = problems(MINIMAL + "\n".join(lines) + "\n")
    assert len(found) == 1 and "alias bomb" in found[0]


def test_huge_file_is_refused_before_parsing(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(MINIMAL + "description: '" + "x" * MAX_BYTES + "'\n")
    with pytest.raises(PolicyError, match=r"big.yaml: file is over 1 MiB"):
        load_policy(big)
    with pytest.raises(PolicyError, match="at most 1 MiB"):
        parse_policy("x" * (MAX_BYTES + 1))


def test_every_problem_in_a_file_is_reported() -> None:
    found = problems(MINIMAL + "buffer: 2\nmarkets: []\nbid: {max_usd_per_hr: 1}\n")
    assert found == [
        "p.yaml:4:9: buffer: must be < 1",
        "p.yaml:5:10: markets: must not be empty",
        "p.yaml:6:7: bid.max_usd_per_hr: unknown field; did you mean 'max_usd_per_hour'?",
    ]


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"nope\.yaml: no such file"):
        load_policy(tmp_path / "nope.yaml")
    with pytest.raises(PolicyError, match="is a directory"):
        load_policy(tmp_path)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PolicyError, match="not UTF-8"):
        load_policy(binary)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=20,
)
policy_like = st.fixed_dictionaries(
    {"apiVersion": st.just("gpuopt/v1"), "kind": st.just("Policy"), "name": st.just("p")},
    optional={
        "workload": st.dictionaries(
            st.sampled_from(["gpus", "gpu_memory_gib", "type", "min_tflops", "fp64", "model"]),
            yaml_values,
            max_size=4,
        ),
        "buffer": yaml_values,
        "markets": yaml_values,
        "bid": st.dictionaries(
            st.sampled_from(["max_usd_per_hour", "max_fraction_of_on_demand"]), yaml_values
        ),
        "placement": yaml_values,
    },
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(document=st.one_of(yaml_values, policy_like), mangle=st.integers(0, 3))
def test_random_documents_give_a_policy_or_a_policy_error(document: object, mangle: int) -> None:
    text = yaml.safe_dump(document)
    if mangle == 1:
        text = text.replace(":", "", 1)
    elif mangle == 2:
        text = text[: len(text) // 2]
    try:
        result = parse_policy(text, path="fuzz.yaml")
    except PolicyError as exc:
        assert exc.problems and all(str(p).startswith("fuzz.yaml") for p in exc.problems)
    else:
        assert isinstance(result, Policy)


@given(st.text(max_size=200))
def test_random_text_gives_a_policy_or_a_policy_error(text: str) -> None:
    try:
        result = parse_policy(text, path="t.yaml")
    except PolicyError as exc:
        assert exc.problems
    else:
        assert isinstance(result, Policy)


def test_committed_json_schema_is_current() -> None:
    committed = json.loads((ROOT / "policies" / "policy.schema.json").read_text())
    assert committed == json_schema(), "run: gpuopt policy schema -o policies/policy.schema.json"
    assert committed["additionalProperties"] is False
    assert "apiVersion" in committed["required"]


def gpuopt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "optimizer.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_policy_check_cli_reports_every_file(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(FULL)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL + "buffer: 2\nbid: {max_fraction_of_on_demand: 3}\n")
    clash = tmp_path / "clash.yaml"
    clash.write_text(FULL.replace("buffer: 0.20", "buffer: 0.1"))
    done = gpuopt("policy", "check", str(good), str(bad), str(clash), str(tmp_path / "none.yaml"))
    assert done.returncode == 2
    assert f"{good}: ok (llm-training-eu" in done.stdout
    assert f"{bad}:4:9: buffer: must be < 1" in done.stderr
    assert f"{bad}:5:34: bid.max_fraction_of_on_demand: must be <= 1" in done.stderr
    assert f"{clash}: name: policy name 'llm-training-eu' is already used" in done.stderr
    assert f"{tmp_path / 'none.yaml'}: no such file" in done.stderr
    assert "3 of 4 policy file(s) invalid" in done.stderr and "Traceback" not in done.stderr
    assert gpuopt("policy", "check", str(good)).returncode == 0


def test_policy_schema_cli_prints_the_schema() -> None:
    done = gpuopt("policy", "schema")
    assert done.returncode == 0
    assert json.loads(done.stdout) == json_schema()


def test_policy_check_cli_reports_a_directory_or_fifo_named_yaml(tmp_path: Path) -> None:
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    # The FIFO has no writer: reading it as a file would wait forever (the timeout fails it).
    done = gpuopt("policy", "check", str(folder), str(fifo))
    assert done.returncode == 2
    assert f"{folder}: is a directory, not a policy file" in done.stderr
    assert f"{fifo}: is a FIFO, not a policy file" in done.stderr
    assert "2 of 2 policy file(s) invalid" in done.stderr


def test_a_misspelt_or_misplaced_key_says_what_it_likely_means() -> None:
    found = problems(
        MINIMAL
        + "regoins: {allow: [eu-*]}\nworkload: {type: training, gpu_memroy_gib: 24}\n"
        + "budget: {monthly_usd: 10, alert_at: [0.5]}\n"
    )
    assert found[0] == (
        "p.yaml:4:1: regoins: unknown field; it belongs at 'placement.regions' or 'data.regions'"
    )
    assert found[1] == (
        "p.yaml:5:28: workload.gpu_memroy_gib: unknown field; did you mean 'gpu_memory_gib'?"
    )
    # Nothing close: the plain words alone.
    (plain,) = problems(MINIMAL + "zzzzzz: 1\n")
    assert plain == "p.yaml:4:1: zzzzzz: unknown field"


@pytest.mark.parametrize(
    ("glob", "said"),
    [
        ("us-east-1a", "'us-east-1a' is a zone; a region list takes regions (us-east-1)"),
        (
            "europe-west4-a",
            "'europe-west4-a' is a zone; a region list takes regions (europe-west4)",
        ),
        ("mars-*", "'mars-*' matches no region gpuopt knows (AWS and GCP regions"),
        ("EU-*", "'EU-*' matches no region gpuopt knows (globs are case-sensitive: eu-*?)"),
        ("eu-[west", "'eu-[west' is not a region glob: a [ without its ]"),
        ("eu-[]", "'eu-[]' is not a region glob: a [ without its ]"),
    ],
)
def test_a_region_glob_that_can_match_nothing_is_an_error_located_at_it(
    glob: str, said: str
) -> None:
    quoted = f"'{glob}'"
    for where in (
        f"placement:\n  regions: {{allow: [eu-*, {quoted}]}}\n",
        f"data: {{regions: {{allow: [{quoted}]}}}}\n",
    ):
        (found,) = problems(MINIMAL + where)
        assert said in found, found
        assert "allow[1]" in found or "data.regions.allow[0]" in found
    (found,) = problems(MINIMAL + f"placement:\n  regions: {{deny: [{quoted}]}}\n")
    assert "placement.regions.deny[0]: " in found and said in found


def test_region_globs_that_match_known_regions_pass() -> None:
    for globs in (
        "['*']",
        "[eu-*, europe-*]",
        "[us-east-1, europe-west4]",
        "['eu-[wc]*']",
        "['asia-east?']",
    ):
        parse_policy(MINIMAL + f"placement: {{regions: {{allow: {globs}}}}}\n")
