"""Upper bounds on the numbers people write: policies, job specs and the daemon config.

Every duration, count and amount of money a document holds has a finite upper bound, so that
nothing validated can overflow `timedelta` or `datetime` arithmetic later (a `max_duration`
of 1e300 seconds used to pass validation and then raise in every reconcile pass). The bounds
are generous: a duration is at most ten years, which `now + duration` can always hold (the
calendar ends in 9999), a count at most a million, money at most a billion US dollars. NaN and
±infinity are never a value (`allow_inf_nan=False`, said as "must be a finite number").

The types here carry their bound in their metadata; a field adds its own lower bound
(`Minutes = Field(10, ge=0)`), and pydantic merges the two.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

YEAR_S = 365 * 24 * 3600
MAX_DURATION_S = 10 * YEAR_S  # ten years: 315,360,000 s
MAX_DURATION_H = MAX_DURATION_S // 3600  # 87,600 h
MAX_MINUTES = MAX_DURATION_S // 60  # 5,256,000 min
MAX_DAYS = MAX_DURATION_S // 86400  # 3,650 days
MAX_COUNT = 1_000_000
MAX_USD = 1_000_000_000
MAX_TFLOPS = 1_000_000  # whole-node dense TFLOPS: a ceiling no node comes near


Seconds = Annotated[float, Field(le=MAX_DURATION_S, allow_inf_nan=False)]
Minutes = Annotated[float, Field(le=MAX_MINUTES, allow_inf_nan=False)]
Hours = Annotated[float, Field(le=MAX_DURATION_H, allow_inf_nan=False)]
Days = Annotated[float, Field(le=MAX_DAYS, allow_inf_nan=False)]
Usd = Annotated[float, Field(le=MAX_USD, allow_inf_nan=False)]
Tflops = Annotated[float, Field(le=MAX_TFLOPS, allow_inf_nan=False)]
Count = Annotated[int, Field(le=MAX_COUNT)]

__all__ = [
    "MAX_COUNT",
    "MAX_DAYS",
    "MAX_DURATION_H",
    "MAX_DURATION_S",
    "MAX_MINUTES",
    "MAX_TFLOPS",
    "MAX_USD",
    "YEAR_S",
    "Count",
    "Days",
    "Hours",
    "Minutes",
    "Seconds",
    "Tflops",
    "Usd",
]
