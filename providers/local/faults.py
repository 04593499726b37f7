"""Launch failures injected into the local cloud, kept in its state directory so that any
process (a test, `gpuopt local fail-next`) can inject one into a cloud another runs."""

from __future__ import annotations

from optimizer.model import Offer
from providers.base import (
    AuthError,
    CapacityError,
    PriceTooLowError,
    ProviderError,
    QuotaError,
    ThrottledError,
)
from providers.local.state import StateDir

# Injectable launch failures: name -> (class, the cloud error code it stands for).
FAULTS: dict[str, tuple[type[ProviderError], str]] = {
    "capacity": (CapacityError, "InsufficientInstanceCapacity"),
    "quota": (QuotaError, "VcpuLimitExceeded"),
    "price": (PriceTooLowError, "SpotMaxPriceTooLow"),
    "throttled": (ThrottledError, "RequestLimitExceeded"),
    "auth": (AuthError, "UnauthorizedOperation"),
    "provider": (ProviderError, "InternalError"),
}
_FAULT_NAMES = {cls: name for name, (cls, _) in FAULTS.items()}


def fault_name(error: type[ProviderError] | str) -> str:
    name = error if isinstance(error, str) else _FAULT_NAMES.get(error)
    if name not in FAULTS:
        raise ValueError(f"unknown fault {error!r}; choose one of {', '.join(FAULTS)}")
    return name


def matches(match: str | list[str], offer: Offer) -> bool:
    if isinstance(match, list):
        return [str(v) if v is not None else None for v in offer.pool] == match
    return match in ("*", offer.instance_type, offer.region, offer.zone)


def add_fault(
    state: StateDir,
    match: str | tuple[str | None, ...],
    error: type[ProviderError] | str,
    times: int,
    after: int = 0,
) -> None:
    """Queue a rule: the next `times` launches matching `match` raise `error`, once `after`
    matching launches have gone through (one node of a gang, say)."""
    rule = {
        "match": list(match) if isinstance(match, tuple) else match,
        "error": fault_name(error),
        "remaining": int(times),
        "after": int(after),
    }
    with state.locked():
        state.save_faults([*state.faults(), rule])


def take_fault(state: StateDir, offer: Offer) -> None:
    """Raise the first pending fault that matches the offer, using one of its times.

    Call under the state lock.
    """
    faults = state.faults()
    for index, rule in enumerate(faults):
        if rule.get("remaining", 0) > 0 and matches(rule["match"], offer):
            if rule.get("after", 0) > 0:
                rule["after"] -= 1
                state.save_faults(faults)
                continue
            rule["remaining"] -= 1
            state.save_faults([f for f in faults if f.get("remaining", 0) > 0])
            cls, code = FAULTS[rule["error"]]
            raise cls(
                f"injected {rule['error']} error for {offer.instance_type} in "
                f"{offer.zone or offer.region} (fault {index + 1})",
                provider="local",
                code=code,
                zone=offer.zone,
            )
