"""Owned machines (providers/ssh, docs/owned.md): list, add (checked at once), check,
drain, undrain, remove.

The routes act on the daemon's `ssh` provider (`state.extras["machines"]` gives it); a
daemon whose config has no `providers.ssh` section answers 404 saying so. A change that
alters what the machines offer (an add, a drain, an undrain) polls their offers again at
once and wakes the reconcile pass, so the next launch ranks what is free now.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optimizer import answers
from optimizer.api.state import ApiState, StateDep
from providers.base import ProviderError

router = APIRouter(prefix="/machines", tags=["machines"])


class AddMachine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    machine: dict[str, Any] = Field(
        description="The machine, as providers.ssh.machines writes one."
    )
    trust_new_host_key: bool = Field(
        False, description="Pin the host key if this host is not in known_hosts yet."
    )


class DrainMachine(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    in_s: float = Field(600.0, ge=0, le=30 * 86_400, description="Seconds until it is taken.")
    reason: str = Field("drain", min_length=1, max_length=80)


def _provider(state: ApiState) -> Any:
    get = state.extras.get("machines")
    if get is None:
        raise HTTPException(
            404, "no owned machines here: the daemon config has no providers.ssh section"
        )
    try:
        return get()
    except ProviderError as exc:
        raise HTTPException(503, f"owned machines unavailable: {exc}") from exc


def _changed(state: ApiState) -> None:
    refresh = state.extras.get("machines_polled")
    if refresh is not None:
        refresh()
    state.wakeup.set()


def _view(provider: Any, name: str) -> dict[str, Any]:
    """The machine's view, as GET /machines lists it."""
    return dict(next(v for v in provider.views() if v.spec.name == name).to_dict())


@contextmanager
def _refusing() -> Iterator[None]:
    """A provider's refusal as the HTTP answer its code calls for (the message names the
    machine and the problem): unknown machine 404, a clash 409, anything else 422."""
    try:
        yield
    except ProviderError as exc:
        status = {"UnknownMachine": 404, "Duplicate": 409, "Busy": 409, "NotDrained": 409}.get(
            getattr(exc, "code", ""), 422
        )
        raise HTTPException(status, str(exc)) from exc


@router.get("", response_model=answers.MachineList)
def list_machines(state: StateDep) -> dict[str, Any]:
    """Every owned machine: GPUs free and used, its TCO rate, state, last check."""
    provider = _provider(state)
    return {"machines": [v.to_dict() for v in provider.views()]}


@router.post("", status_code=201, response_model=answers.Machine)
def add_machine(body: AddMachine, state: StateDep) -> dict[str, Any]:
    """Add a machine: reached over SSH with its host key checked, its GPUs read by the agent's
    inventory and compared with what the body says; kept only if all of that holds."""
    provider = _provider(state)
    try:
        spec = provider.parse(body.machine)
    except ValidationError as exc:
        detail = [
            {
                "loc": ["body", "machine", *map(str, e["loc"])],
                "msg": str(e["msg"])[:300],
                "type": e["type"],
            }
            for e in exc.errors(include_url=False)
        ]
        raise HTTPException(422, detail) from exc
    with _refusing():
        view = provider.add(spec, trust_new=body.trust_new_host_key)
    _changed(state)
    return dict(view.to_dict())


@router.post("/{name}/check", response_model=answers.Machine)
def check_machine(name: str, state: StateDep) -> dict[str, Any]:
    """Check a machine again now (reachable, host key, GPUs, disk)."""
    provider = _provider(state)
    with _refusing():
        provider.check(name)
    _changed(state)
    return _view(provider, name)


@router.post("/{name}/drain", response_model=answers.MachineDrained)
def drain_machine(name: str, body: DrainMachine, state: StateDep) -> dict[str, Any]:
    """Take a machine back in `in_s` seconds: no new work on it, and an interruption notice
    to each job there, which the hot handover moves (to another owned machine, else the
    cloud)."""
    provider = _provider(state)
    with _refusing():
        told = provider.drain(name, body.in_s, reason=body.reason)
    _changed(state)
    view = _view(provider, name)
    return {"machine": view, "power_off_at": view["draining_until"], "told": told}


@router.post("/{name}/undrain", response_model=answers.Machine)
def undrain_machine(name: str, state: StateDep) -> dict[str, Any]:
    """Give a drained machine back to the offers."""
    provider = _provider(state)
    with _refusing():
        provider.undrain(name)
    _changed(state)
    return _view(provider, name)


@router.delete("/{name}", response_model=answers.MachineRemoved)
def remove_machine(name: str, state: StateDep) -> dict[str, str]:
    """Forget a machine added at run time (refused while instances run there)."""
    provider = _provider(state)
    with _refusing():
        provider.remove(name)
    _changed(state)
    return {"removed": name}
