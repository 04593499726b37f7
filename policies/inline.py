"""Resources written inline (`gpuopt run --gpu T4 …`, or a job spec's `resources:` block),
merged over a default policy into the policy a job runs under (docs/policies.md, "Inline
resources").

```yaml
resources:
  gpu: T4              # a GPU model (canonical name or alias): workload.gpu_models
  gpus: 1              # GPUs per node: workload.gpus
  market: spot         # spot | on_demand | any: markets
  max_price: 0.5       # USD per hour for the whole instance: bid.max_usd_per_hour
  regions: ["eu-*"]    # region globs: placement.regions.allow
  compliance: gdpr     # a region preset: placement.compliance
  providers: [local]   # placement.providers
```

Each value is checked here by the policy schema's own model for the key it sets, so a bad
value is an error located at `resources.<key>` (the job file's line, or the flag that set
it). `merge` writes the values over the default policy's keys of the same meaning, every other
key of it (recovery, budget, migration, utilization, the data rules) staying as it is, and
validates the result as the policy loader validates a policy file: every rule, explanation
and budget applies to the job as to any policy.

The default policy is the daemon's `policies.default` setting (a loaded policy's name), else
`SHIPPED_DEFAULT`, which ships with gpuopt.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from optimizer.common.bounds import Usd
from policies.loader import parse_policy
from policies.schema import Placement, Policy, RegionGlob, Workload

SHIPPED_DEFAULT_TEXT = """\
apiVersion: gpuopt/v1
kind: Policy
name: default
description: gpuopt's default policy for inline resources; one GPU, spot first, on-demand
  when no spot offer fits.
workload:
  type: training
  gpus: 1
markets: [spot, on_demand]
"""

MARKETS: dict[str, list[str]] = {
    "spot": ["spot"],
    "on_demand": ["on_demand"],
    "any": ["spot", "on_demand"],
}


def shipped_default() -> Policy:
    """The default policy that ships with gpuopt (`SHIPPED_DEFAULT_TEXT`)."""
    return parse_policy(SHIPPED_DEFAULT_TEXT, path="<gpuopt's default policy>")


def _problems(exc: ValidationError) -> str:
    return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())


class Resources(BaseModel):
    """What a job needs, written inline; each key is optional and overrides the default
    policy's key of the same meaning."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    gpu: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="A GPU model (canonical name or alias): the policy's workload.gpu_models.",
        examples=["T4", "A100-80GB"],
    )
    gpus: int | None = Field(None, ge=1, le=64, description="GPUs per node: workload.gpus.")
    market: Literal["spot", "on_demand", "any"] | None = Field(
        None, description="spot, on_demand or any (both): the policy's markets."
    )
    max_price: Usd | None = Field(
        None, gt=0, description="USD per hour, whole instance: bid.max_usd_per_hour."
    )
    regions: list[RegionGlob] | None = Field(
        None,
        min_length=1,
        description="Region globs: placement.regions.allow.",
        examples=[["eu-*"]],
    )
    compliance: str | None = Field(
        None, description="A region preset (eu, alias gdpr; us, uk, ch): placement.compliance."
    )
    providers: list[str] | None = Field(
        None, min_length=1, description="Providers: placement.providers.", examples=[["aws"]]
    )

    @field_validator("gpu")
    @classmethod
    def _gpu(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return Workload(gpu_models=[value]).gpu_models[0]
        except ValidationError as exc:
            raise ValueError(_problems(exc)) from None

    @field_validator("compliance")
    @classmethod
    def _compliance(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return Placement(compliance=value).compliance
        except ValidationError as exc:
            raise ValueError(_problems(exc)) from None

    @field_validator("providers")
    @classmethod
    def _providers(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        try:
            return list(Placement.model_validate({"providers": value}).providers)
        except ValidationError as exc:
            raise ValueError(_problems(exc)) from None

    def overrides(self) -> dict[str, Any]:
        """The policy keys this sets, as dotted paths (`workload.gpus`) to their values."""
        out: dict[str, Any] = {}
        if self.gpu is not None:
            out["workload.gpu_models"] = [self.gpu]
        if self.gpus is not None:
            out["workload.gpus"] = self.gpus
        if self.market is not None:
            out["markets"] = MARKETS[self.market]
        if self.max_price is not None:
            out["bid.max_usd_per_hour"] = self.max_price
        if self.regions is not None:
            out["placement.regions.allow"] = list(self.regions)
        if self.compliance is not None:
            out["placement.compliance"] = self.compliance
        if self.providers is not None:
            out["placement.providers"] = list(self.providers)
        return out


class InlineError(ValueError):
    """Inline resources that do not make a policy over the default (the message says why)."""


def inline_name(job: str) -> str:
    """The name of the policy a job with inline resources runs under: `job-<name>` (a name
    too long for that keeps its start and a hash of the whole)."""
    name = f"job-{job}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(job.encode()).hexdigest()[:8]
    return f"job-{job[:50].rstrip('-')}-{digest}"


def document(policy: Policy) -> dict[str, Any]:
    """A policy as the JSON document `merge` and the API hand around (it loads back)."""
    return policy.model_dump(mode="json", by_alias=True, exclude_none=True)


def merge(base: Policy, resources: Resources | None, *, name: str) -> Policy:
    """`resources` written over `base`, named `name`, validated as a policy file is;
    InlineError naming the keys where the combination is no policy."""
    doc = document(base)
    doc["name"] = name
    doc["description"] = f"inline resources over policy {base.name}"
    for path, value in (resources.overrides() if resources is not None else {}).items():
        *parents, leaf = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    try:
        return Policy.model_validate(doc, strict=False)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(p) for p in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
        raise InlineError(
            f"the resources over policy {base.name} make no policy: " + "; ".join(problems)
        ) from None


def load_document(doc: dict[str, Any]) -> Policy:
    """A document `document` wrote, as a `Policy` again."""
    return Policy.model_validate(doc, strict=False)
