"""Pages from the package's Jinja2 templates, with the console's number and time formats and
the security headers every console answer carries."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import HTMLResponse

from optimizer.clock import parse_utc, utc_label, utc_text
from optimizer.common.units import size_text

if TYPE_CHECKING:
    from jinja2 import Environment

# Everything the pages load comes from /ui/static/ (no CDN, no inline script or style), so
# the policy can forbid the rest; uPlot styles its elements through the CSSOM, which
# style-src does not govern.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
NONE = "\u2013"  # an en dash where there is no figure

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def usd(value: float | None, digits: int = 2) -> str:
    """An amount, to the cent, as every total and row of the console rounds it ($1,234.56),
    so rows add up to their totals as shown; a non-zero amount under a cent is `<$0.01`."""
    if value is None:
        return NONE
    if value != 0 and abs(value) < 0.5 * 10**-digits:
        return f"{'-' if value < 0 else ''}<${10**-digits:.{digits}f}"
    sign = "-" if value < 0 else ""
    return f"{sign}${abs(value):,.{digits}f}"


def price(value: float | None) -> str:
    """A price per hour: four decimals under a dollar (spot prices are small), else two."""
    if value is None:
        return NONE
    return usd(value, 2 if abs(value) >= 1 or value == 0 else 4)


def pct(value: float | None, digits: int = 0) -> str:
    return NONE if value is None else f"{value * 100:.{digits}f}%"


def when(value: datetime | str | None) -> str:
    """`2026-03-14 12:03:07 UTC`."""
    if value is None:
        return NONE
    if isinstance(value, str):
        value = parse_utc(value)
    return utc_label(value)


def iso(value: datetime | None) -> str:
    return "" if value is None else utc_text(value)


def duration(seconds: float | None) -> str:
    """`3h 07m`, `4m 12s`, `9s`."""
    if seconds is None:
        return NONE
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


@cache
def environment() -> Environment:
    """The templates' environment, made at the first page: an idle daemon whose console
    nobody opens does not load Jinja2."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    env = Environment(
        loader=PackageLoader("optimizer.ui", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        usd=usd, price=price, pct=pct, when=when, iso=iso, duration=duration, size=size_text
    )
    return env


def html(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """`template` rendered with `context` (and the request), with the console's headers."""
    text = environment().get_template(template).render(request=request, **context)
    return HTMLResponse(text, status_code=status_code, headers=HEADERS)
