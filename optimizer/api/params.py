"""Query parameters every route reads the same way: times, ids, page offsets and sizes.

Each is a type with its bounds in it, so a value past them is FastAPI's 422 naming the
parameter (`loc: ["query", name]`), never an overflow further in (a time at the edge of the
calendar with an offset cannot be put in UTC; an offset of 2^63 does not fit the database's
integer). A route gives its own description with `Annotated[Time | None, Query(...)]`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from annotated_types import Ge, Le
from fastapi import HTTPException
from pydantic import AfterValidator

from optimizer.api.state import MAX_ID, MIN_ID
from optimizer.common.times import TimeRangeError, in_span

MAX_PAGE = 1000  # items per page, every list
MAX_OFFSET = 2**31 - 1  # positions skipped: far past any list, inside every integer type


def _time(value: datetime) -> datetime:
    """In [EARLIEST, LATEST) (optimizer/common/times.py); a time with an offset comes back in
    UTC, one without is left for the route to read (some want an offset said)."""
    try:
        utc = in_span(value, "time")
    except TimeRangeError as exc:
        raise ValueError(str(exc).removeprefix("time: ")) from None
    return value if value.tzinfo is None else utc


Time = Annotated[datetime, AfterValidator(_time)]
Offset = Annotated[int, Ge(0), Le(MAX_OFFSET)]
Page = Annotated[int, Ge(1), Le(MAX_PAGE)]
Id = Annotated[int, Ge(MIN_ID), Le(MAX_ID)]  # a store id: 64 bits, signed


def bad_query(field: str, message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own, naming the query parameter."""
    return HTTPException(
        422, detail=[{"loc": ["query", field], "msg": message, "type": "value_error"}]
    )
