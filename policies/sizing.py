"""GPU memory a model needs per GPU, from its parameter count, precision and optimizer.

Pure arithmetic over plain values; the policy engine applies the headroom (`with_buffer`).
Sizes are GiB (2**30 bytes). Every figure is an allowance for choosing an instance, not a
measurement: activation memory really depends on batch, sequence length and recomputation,
which a policy's `model:` block does not state.

Sources:
- ZeRO: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", §3.1 (mixed-precision Adam holds 2 + 2 + 12 = 16 bytes per parameter).
- Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
  (arXiv:2205.05198), §4.1: activations per transformer layer are sbh(34 + 5as/h) bytes.
- Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import Decimal

GIB = 2**30
WORKLOAD_TYPES = ("training", "inference", "hpc", "rendering")
MAX_PARAMETERS = 10**15  # a sanity bound: 500x the largest models published so far

# Bytes per parameter as stored. TF32 is a tensor-core math mode over FP32 storage.
PRECISIONS: dict[str, float] = {
    "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5,
}  # fmt: skip
PRECISION_ALIASES = {
    "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16", "float8": "fp8",
}  # fmt: skip
# Precisions a training run's weights and gradients can be kept in (see `_check_training`).
TRAINING_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

# Optimizer state in bytes per parameter, kept in FP32, *excluding* the FP32 master copy of the
# weights (added by `optimizer_bytes` when the weights are below FP32). With a 16-bit model this
# gives the mixed-precision totals: adam 4 + 8 = 12 (ZeRO's K = 12), sgd 4 + 4 = 8.
OPTIMIZERS: dict[str, float] = {
    "adam": 8,  # first and second moments, FP32 (ZeRO §3.1)
    "adamw": 8,  # Adam with decoupled weight decay: same state
    "sgd": 4,  # one FP32 momentum buffer (SGD with momentum)
    # Adafactor factors the second moment of an n x m matrix into n + m row/column sums and, as
    # recommended (beta1 = 0), keeps no first moment. That is 8/d bytes per parameter for a
    # d x d matrix, plus a full 4 bytes for the few unfactored vectors (biases, norms). We
    # charge 1% of a full FP32 moment, which covers d >= 200 and vectors up to ~1% of params.
    "adafactor": 0.04,
    "none": 0,  # no optimizer state and no master copy
}
MASTER_WEIGHT_BYTES = 4  # FP32 master weights of mixed-precision training (ZeRO §3.1)

# Training activations, as a fraction of the model-state memory (weights + grads + optimizer).
# For a 7B transformer (h=4096, 32 layers, 32 heads) at one 2048-token sequence, Korthikanti's
# sbh(34 + 5as/h) per layer gives ~28 GiB with no recomputation (27% of its 104 GiB of model
# states) and ~8.5 GiB with fused attention (8%); full recomputation needs 2sbh per layer
# (~0.5 GiB). 20% sits between; larger micro-batches scale it linearly, so it is an allowance.
TRAINING_ACTIVATION_FRACTION = 0.20
# Inference KV cache and activations, as a fraction of the weights. A 7B model with full
# multi-head attention caches 2 (K, V) x 32 layers x 4096 x 2 bytes = 0.5 MiB per token, so a
# 4096-token context is 2 GiB against 13 GiB of FP16 weights (15%); 20% adds the activation
# workspace. Grouped-query models (Llama-2-70B) need far less; batched serving far more.
INFERENCE_KV_FRACTION = 0.20

_SUFFIXES = {"k": 3, "m": 6, "b": 9, "t": 12}
_DIGITS = r"\d(?:_?\d)*"
_PARAMETERS_RE = re.compile(
    rf"(?P<mantissa>{_DIGITS}(?:\.{_DIGITS})?)"
    rf"(?:(?P<suffix>[kmbt])|e(?P<exponent>[+-]?\d{{1,3}}))?",
    re.IGNORECASE,
)
_ACCEPTED = "a positive whole number such as 7000000000, 7_000_000_000, 7e9, 340M, 7B, 1.5T, 125k"


class SizingError(ValueError):
    """A model description that cannot be sized (names the bad value)."""


def parse_parameters(value: int | float | str) -> int:
    """A parameter count from a number or a string such as `340M`, `7B`, `1.5T` or `7e9`."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise SizingError(f"parameters {value!r} is not a number; expected {_ACCEPTED}")
    if isinstance(value, str):
        match = _PARAMETERS_RE.fullmatch(value.strip())
        if match is None:
            why = "must be positive" if value.strip().startswith("-") else "is not understood"
            raise SizingError(f"parameters {value!r} {why}; expected {_ACCEPTED}")
        mantissa, suffix, exponent = match.group("mantissa", "suffix", "exponent")
        scale = _SUFFIXES[suffix.lower()] if suffix else int(exponent or 0)
        number = Decimal(mantissa.replace("_", "")).scaleb(scale)  # the pattern admits digits only
    elif isinstance(value, float) and not math.isfinite(value):
        raise SizingError(f"parameters {value!r} is not finite; expected {_ACCEPTED}")
    else:
        number = Decimal(value)
    if number <= 0:
        raise SizingError(f"parameters {value!r} must be positive; expected {_ACCEPTED}")
    if number != number.to_integral_value():
        raise SizingError(f"parameters {value!r} is not a whole number; expected {_ACCEPTED}")
    if number > MAX_PARAMETERS:
        raise SizingError(f"parameters {value!r} exceeds {MAX_PARAMETERS:.0e}; check the unit")
    return int(number)


def precision_bytes(precision: str) -> float:
    """Bytes per parameter for a precision name or alias (`bf16`, `half`, `int4`, ...)."""
    return PRECISIONS[canonical_precision(precision)]


def canonical_precision(precision: str) -> str:
    """The canonical name of a precision (`bfloat16` -> `bf16`); SizingError if unknown."""
    name = precision.strip().lower() if isinstance(precision, str) else ""
    name = PRECISION_ALIASES.get(name, name)
    if name not in PRECISIONS:
        known = ", ".join([*PRECISIONS, *PRECISION_ALIASES])
        raise SizingError(f"precision {precision!r} is not one of: {known}")
    return name


def canonical_optimizer(optimizer: str) -> str:
    """The optimizer name, lower-cased; SizingError if it is not in OPTIMIZERS."""
    name = optimizer.strip().lower() if isinstance(optimizer, str) else ""
    if name not in OPTIMIZERS:
        raise SizingError(f"optimizer {optimizer!r} is not one of: {', '.join(OPTIMIZERS)}")
    return name


def optimizer_bytes(optimizer: str, precision: str) -> float:
    """Optimizer state per parameter: its FP32 moments, plus FP32 master weights when the
    model is kept below FP32 (ZeRO §3.1: K = 12 for mixed-precision Adam, 8 for FP32 Adam)."""
    name = canonical_optimizer(optimizer)
    master = MASTER_WEIGHT_BYTES if name != "none" and precision_bytes(precision) < 4 else 0
    return OPTIMIZERS[name] + master


@dataclass(frozen=True)
class Estimate:
    """GPU memory for one model on `gpus` GPUs; `breakdown` is GiB per GPU by component."""

    parameters: int
    precision: str
    workload_type: str
    optimizer: str | None  # None for inference
    gpus: int
    per_gpu_gib: float
    total_gib: float
    breakdown: dict[str, float] = field(hash=False)

    def explain(self) -> str:
        """One line: what was sized, the per-GPU need and how it splits."""
        what = f"{_short_count(self.parameters)} {self.precision} {self.workload_type}"
        if self.optimizer is not None:
            what += f" with {self.optimizer}"
        parts = " + ".join(f"{name} {gib:.1f}" for name, gib in self.breakdown.items())
        split = "ZeRO-3/FSDP sharding" if self.workload_type == "training" else "tensor parallel"
        where = f"on {self.gpus} GPUs ({split})" if self.gpus > 1 else "on 1 GPU"
        return (
            f"{what} {where}: {self.per_gpu_gib:.1f} GiB per GPU ({parts}), "
            f"{self.total_gib:.1f} GiB in all, before headroom"
        )


def estimate(
    parameters: int | float | str,
    precision: str,
    workload_type: str,
    optimizer: str = "adam",
    gpus: int = 1,
) -> Estimate:
    """Memory per GPU for training or serving a model of `parameters` at `precision`.

    Training (ZeRO §3.1): weights b + gradients b + optimizer_bytes per parameter, where b is
    the precision's bytes (2 for bf16: 2 + 2 + 12 = 16; FP32 Adam: 4 + 4 + 8 = 16), plus
    activations at TRAINING_ACTIVATION_FRACTION of that. Everything is split evenly over the
    GPUs: model states sharded as with ZeRO-3/FSDP, activations as with tensor/sequence
    parallelism. Inference: weights b per parameter plus INFERENCE_KV_FRACTION of them for
    KV cache and activations, the weights split by tensor parallelism. `optimizer` is ignored
    for inference. hpc and rendering have no model to size.
    """
    count = parse_parameters(parameters)
    name = canonical_precision(precision)
    n_gpus = _check_gpus(gpus)
    kind = workload_type.strip().lower() if isinstance(workload_type, str) else workload_type
    if kind in ("hpc", "rendering"):
        raise SizingError(f"model sizing applies to training and inference, not {kind!r}")
    weights = count * PRECISIONS[name] / GIB
    if kind == "training":
        _check_training(name)
        opt: str | None = canonical_optimizer(optimizer)
        states = {
            "weights": weights,
            "gradients": weights,  # gradients are kept at the weights' precision
            "optimizer": count * optimizer_bytes(optimizer, name) / GIB,
        }
        activations = TRAINING_ACTIVATION_FRACTION * sum(states.values())
        total = {**states, "activations": activations}
    elif kind == "inference":
        opt = None
        total = {"weights": weights, "kv_cache": INFERENCE_KV_FRACTION * weights}
    else:
        raise SizingError(f"workload type {workload_type!r} is not one of: {WORKLOAD_TYPES}")
    per_gpu = {part: gib / n_gpus for part, gib in total.items()}
    return Estimate(
        parameters=count,
        precision=name,
        workload_type=kind,
        optimizer=opt,
        gpus=n_gpus,
        per_gpu_gib=sum(per_gpu.values()),
        total_gib=sum(total.values()),
        breakdown=per_gpu,
    )


def with_buffer(gib: float, buffer: float) -> float:
    """`gib` grown by the headroom fraction `buffer` (GUIDE §4.2: 20%), 0 <= buffer < 1.

    This is need x (1 + buffer): 10 GiB at 0.2 asks for 12. Keeping a fifth of the card
    *free* would be need / (1 - buffer), 12.5; the project uses the simpler multiple.
    """
    if isinstance(buffer, bool) or not isinstance(buffer, int | float) or not 0 <= buffer < 1:
        raise SizingError(f"buffer {buffer!r} must be a fraction with 0 <= buffer < 1")
    if isinstance(gib, bool) or not isinstance(gib, int | float) or not 0 <= gib < math.inf:
        raise SizingError(f"memory {gib!r} GiB must be a finite number >= 0")
    return gib * (1 + buffer)


def _check_training(precision: str) -> None:
    # Integer formats are inference-only; FP8 training (Transformer Engine) keeps BF16 weights
    # and gradients and casts to FP8 only for the matmuls, so it is sized as BF16.
    if precision not in TRAINING_PRECISIONS:
        hint = "size FP8 training as bf16" if precision == "fp8" else "it is an inference format"
        raise SizingError(
            f"precision {precision!r} cannot size training ({hint}); "
            f"use one of: {', '.join(TRAINING_PRECISIONS)}"
        )


def _check_gpus(gpus: int) -> int:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise SizingError(f"gpus {gpus!r} must be a whole number >= 1")
    return gpus


def _short_count(count: int) -> str:
    for suffix, exponent in (("T", 12), ("B", 9), ("M", 6), ("k", 3)):
        if count >= 10**exponent:
            return f"{count / 10**exponent:g}{suffix}"
    return str(count)
