"""The daemon's HTTP API (FastAPI): `create_app(state)` and the state it serves."""

from optimizer.api.app import OPEN, PROTECTED, create_app
from optimizer.api.auth import require_token
from optimizer.api.state import ApiState, StateDep, get_state

__all__ = ["OPEN", "PROTECTED", "ApiState", "StateDep", "create_app", "get_state", "require_token"]
