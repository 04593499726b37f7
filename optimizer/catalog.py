"""The offer catalog CSV: gpuopt's exchange format for snapshots, exports and tests.

One column per Offer field, in `OFFER_FIELDS` order (docs/catalog-format.md has the units).
Lines starting with `#` before the header are comments (provenance notes). Reading stops at
the first bad value and names its file, line and column.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from optimizer import hardware
from optimizer.clock import parse_utc
from optimizer.common.errors import LocatedError
from optimizer.common.times import SPAN, TimeRangeError, in_span
from optimizer.model import (
    OFFER_FIELDS,
    Fabric,
    Interconnect,
    Market,
    Offer,
    OfferError,
    PaymentOption,
)

OPTIONAL: dict[str, Any] = {
    "zone": None,
    "placement_score": None,
    "interruption_bucket": None,
    "source": "",
    # A file without these columns gets the type's fabric from the hardware table.
    "fabric": None,
    "fabric_interfaces": None,
    "term_years": None,
    "payment_option": None,
    "upfront_usd": None,
}
REQUIRED = frozenset(OFFER_FIELDS) - set(OPTIONAL)


class CatalogError(LocatedError):
    """A catalog file that cannot be read, located as precisely as possible."""


def _text(raw: str) -> str:
    return raw.strip()


def _optional_text(raw: str) -> str | None:
    return raw.strip() or None


def _int(raw: str) -> int:
    value = float(raw)  # accept "8" and "8.0", as cloud exports write counts as floats
    if not value.is_integer():
        raise ValueError(f"expected a whole number, got {raw!r}")
    return int(value)


def _float(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {raw!r}")
    return value


def _optional_float(raw: str) -> float | None:
    return _float(raw) if raw.strip() else None


def _optional_int(raw: str) -> int | None:
    return _int(raw) if raw.strip() else None


def _time(raw: str) -> datetime:
    value = parse_utc(raw.strip())
    if value.tzinfo is None:
        raise ValueError(f"time {raw!r} has no UTC offset (write e.g. 2026-04-23T00:00:00Z)")
    try:
        in_span(value, "observed_at")
    except TimeRangeError:
        raise ValueError(f"time {raw.strip()!r} is not {SPAN}") from None
    return value


def _enum(
    kind: type[Market] | type[Interconnect] | type[Fabric] | type[PaymentOption],
) -> Callable[[str], Any]:
    def parse(raw: str) -> Any:
        try:
            return kind(raw.strip().replace("-", "_").lower())
        except ValueError:
            allowed = ", ".join(m.value for m in kind)
            raise ValueError(f"{raw!r} is not one of: {allowed}") from None

    return parse


def _optional_enum(kind: type[PaymentOption]) -> Callable[[str], Any]:
    parse = _enum(kind)
    return lambda raw: parse(raw) if raw.strip() else None


PARSERS: dict[str, Callable[[str], Any]] = {
    "provider": _text,
    "region": _text,
    "zone": _optional_text,
    "instance_type": _text,
    "gpu_model": _text,
    "gpu_count": _int,
    "gpu_memory_gib": _float,
    "vcpus": _int,
    "ram_gib": _float,
    "interconnect": _enum(Interconnect),
    "market": _enum(Market),
    "usd_per_hour": _float,
    "observed_at": _time,
    "placement_score": _optional_float,
    "interruption_bucket": _optional_text,
    "source": _text,
    "fabric": _enum(Fabric),
    "fabric_interfaces": _int,
    "term_years": _optional_int,
    "payment_option": _optional_enum(PaymentOption),
    "upfront_usd": _optional_float,
}
assert set(PARSERS) == set(OFFER_FIELDS), "every Offer field needs a parser"


def _skip_comments(stream: TextIO) -> tuple[int, Iterator[str]]:
    """Skip leading `#` lines; return how many were skipped and the remaining lines."""
    skipped = 0
    lines = iter(stream)
    for line in lines:
        if line.startswith("#") or not line.strip():
            skipped += 1
            continue
        return skipped, _chain_first(line, lines)
    return skipped, iter(())


def _chain_first(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def iter_offers(stream: TextIO, *, path: str = "<catalog>") -> Iterator[Offer]:
    """Parse offers from an open catalog CSV, raising CatalogError at the first bad value."""
    skipped, lines = _skip_comments(stream)
    reader = csv.reader(lines, strict=True)
    try:
        header = next(reader, None)
        if header is None:
            raise CatalogError.at(path, "empty file: expected a header row", line=skipped + 1)
        header = [h.strip() for h in header]
        missing = sorted(REQUIRED - set(header))
        if missing:
            raise CatalogError.at(
                path, f"header lacks required column(s): {', '.join(missing)}", line=skipped + 1
            )
        unknown = [h for h in header if h not in PARSERS]
        if unknown:
            raise CatalogError.at(
                path, f"header has unknown column(s): {', '.join(unknown)}", line=skipped + 1
            )
        for row in reader:
            line = skipped + reader.line_num
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise CatalogError.at(
                    path, f"expected {len(header)} values, found {len(row)}", line=line
                )
            values: dict[str, Any] = dict(OPTIONAL)
            for column, (name, raw) in enumerate(zip(header, row, strict=True), start=1):
                if name in REQUIRED and not raw.strip():
                    raise CatalogError.at(
                        path, "missing value", line=line, column=column, field=name
                    )
                try:
                    values[name] = PARSERS[name](raw)
                except ValueError as exc:
                    raise CatalogError.at(
                        path, str(exc), line=line, column=column, field=name
                    ) from None
            if values["fabric"] is None or values["fabric_interfaces"] is None:
                try:
                    spec = hardware.instance_fabric(values["provider"], values["instance_type"])
                except hardware.UnknownCloudError as exc:
                    raise CatalogError.at(
                        path, f"{exc}: give the fabric and fabric_interfaces columns", line=line
                    ) from None
                if values["fabric"] is None:
                    values["fabric"] = spec.fabric
                if values["fabric_interfaces"] is None:
                    values["fabric_interfaces"] = spec.interfaces
            try:
                yield Offer(**values)
            except OfferError as exc:
                field = str(exc).split(" ", 1)[0]
                at = header.index(field) + 1 if field in header else None
                raise CatalogError.at(
                    path, str(exc), line=line, column=at, field=field if at else ""
                ) from None
    except csv.Error as exc:
        raise CatalogError.at(
            path, f"malformed CSV: {exc}", line=skipped + reader.line_num
        ) from None


def read_catalog(path: str | Path) -> list[Offer]:
    """Read a catalog file; a missing, unreadable or malformed file raises CatalogError."""
    name = str(path)
    try:
        with open(path, encoding="utf-8", newline="") as stream:
            return list(iter_offers(stream, path=name))
    except FileNotFoundError:
        raise CatalogError.at(name, "no such file") from None
    except IsADirectoryError:
        raise CatalogError.at(name, "is a directory, not a catalog file") from None
    except PermissionError:
        raise CatalogError.at(name, "permission denied") from None
    except UnicodeDecodeError as exc:
        raise CatalogError.at(name, f"not UTF-8 text (byte {exc.start})") from None


def parse_catalog(text: str, *, path: str = "<catalog>") -> list[Offer]:
    return list(iter_offers(io.StringIO(text), path=path))


def _format(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # shortest exact round-trip form
    return str(value)


def write_catalog(offers: Iterable[Offer], stream: TextIO, *, comments: Iterable[str] = ()) -> int:
    """Write offers as catalog CSV (comments first, as `# ` lines); return the row count."""
    for comment in comments:
        stream.write(f"# {comment}\n")
    writer = csv.writer(stream, lineterminator="\n")
    writer.writerow(OFFER_FIELDS)
    count = 0
    for offer in offers:
        row = offer.to_dict()
        writer.writerow([_format(row[name]) for name in OFFER_FIELDS])
        count += 1
    return count
