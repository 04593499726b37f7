"""Pydantic's validation errors said for people, and a document with its bad values taken out.

`findings` words each error the way a person fixes it: plain messages for pydantic's types,
and for a wrong shape (a list where a mapping belongs) the keys the mapping takes and an
example, from the field's `examples` (the JSON Schema keyword, so editors show the same one).
`without` takes the bad values out of a document so a checker can build a model of the rest
(each bad value at its default) and go on to the checks that need a whole model.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import InitErrorDetails, PydanticCustomError

from optimizer.common.errors import Problem

FieldPath = tuple[str | int, ...]
Shape = Literal["mapping", "list"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One validation error in plain words; `on_key`: about the key, not its value."""

    field: FieldPath
    message: str
    on_key: bool


# Plain words for pydantic's error types; the others keep pydantic's message.
_MESSAGES = {
    "extra_forbidden": "unknown field",
    "missing": "required field is missing",
    "greater_than": "must be > {gt}",
    "greater_than_equal": "must be >= {ge}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "int_type": "must be a whole number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "string_type": "must be text",
    "bool_type": "must be true or false",
    "too_short": "must not be empty",
    "string_pattern_mismatch": (
        "must be 1-63 lowercase letters, digits and dashes, starting and ending with a letter "
        "or digit"
    ),
}


# Wrong shapes: said with the keys a mapping takes and an example (`expected`).
_SHAPES: dict[str, Shape] = {
    "list_type": "list",
    "dict_type": "mapping",
    "model_type": "mapping",
    "model_attributes_type": "mapping",
}


def in_file_order(problems: Iterable[Problem]) -> list[Problem]:
    """Problems as a person meets them reading the file: by line and column, the ones without
    a position after (each group keeps the order it came in)."""
    return sorted(problems, key=lambda p: (p.line is None, p.line or 0, p.column or 0))


def _plain_number(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _unwrap(annotation: Any) -> Any:
    """`X | None` and `Annotated[X, …]` to X (the first non-None member of a union)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _model(annotation: Any) -> type[BaseModel] | None:
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _field(model: type[BaseModel], key: str) -> FieldInfo | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info
    return None


def _resolve(model: type[BaseModel], loc: tuple[str | int, ...]) -> tuple[Any, FieldInfo | None]:
    """The type expected at `loc`, and its field when the last step names one (not a list
    item or a dict value); (None, None) where the path leaves what the models describe."""
    annotation: Any = model
    info: FieldInfo | None = None
    for step in loc:
        annotation = _unwrap(annotation)
        origin = typing.get_origin(annotation)
        inner = _model(annotation)
        if inner is not None and isinstance(step, str):
            info = _field(inner, step)
            if info is None:
                return None, None
            annotation = info.annotation
        elif origin is list and isinstance(step, int):
            annotation, info = typing.get_args(annotation)[0], None
        elif origin is dict and isinstance(step, str):
            annotation, info = typing.get_args(annotation)[1], None
        else:
            return None, None
    return _unwrap(annotation), info


def _flow(value: Any) -> str:
    """One line of flow-style YAML, as a person would type it inline."""
    return str(
        yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    ).strip()


def keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a person writes for `model`, aliases where they have one."""
    return [info.alias or name for name, info in model.model_fields.items()]


def example(model: type[BaseModel], loc: tuple[str | int, ...]) -> str | None:
    """`key: value` from the `examples` of the field at `loc`, or None when it has none."""
    _, info = _resolve(model, loc)
    if info is None or not info.examples or not loc or not isinstance(loc[-1], str):
        return None
    return f"{loc[-1]}: {_flow(info.examples[0])}"


def expected(model: type[BaseModel], loc: tuple[str | int, ...], shape: Shape) -> str:
    """`must be a mapping with keys allow, deny; for example: regions: {allow: [eu-*]}`."""
    annotation, _ = _resolve(model, loc)
    message = f"must be a {shape}"
    inner = _model(annotation)
    if shape == "mapping" and inner is not None:
        message += " with keys " + ", ".join(keys_of(inner))
    shown = example(model, loc)
    return f"{message}; for example: {shown}" if shown else message


def _paths(model: type[BaseModel], prefix: FieldPath = (), depth: int = 3) -> Iterator[FieldPath]:
    """Every key path `model` takes, through nested models, `depth` levels down."""
    for key in keys_of(model):
        path = (*prefix, key)
        yield path
        annotation, _ = _resolve(model, (key,))
        inner = _model(annotation)
        if inner is not None and depth > 1:
            yield from _paths(inner, path, depth - 1)


def did_you_mean(model: type[BaseModel], loc: FieldPath) -> str:
    """For an unknown key at `loc`: `did you mean …?` with a close spelling among its
    mapping's keys, else `it belongs at …` where the key (or a close spelling) is one of the
    document's elsewhere (`regions` at the top of a policy: `placement.regions`); "" when
    nothing is close."""
    import difflib

    if not loc or not isinstance(loc[-1], str):
        return ""
    key, parent = loc[-1], loc[:-1]
    annotation, _ = _resolve(model, parent)
    inner = _model(annotation)
    if inner is None:
        return ""
    close = difflib.get_close_matches(key, keys_of(inner), n=1, cutoff=0.75)
    if close:
        return f"did you mean {close[0]!r}?"
    paths = [path for path in _paths(model) if path != loc]
    leaves = {str(path[-1]) for path in paths}
    near = set(difflib.get_close_matches(key, leaves, n=3, cutoff=0.75))
    elsewhere = [".".join(map(str, p)) for p in paths if p[-1] == key or p[-1] in near]
    if not elsewhere or len(elsewhere) > 3:
        return ""
    return "it belongs at " + " or ".join(repr(e) for e in elsewhere)


def findings(error: ValidationError, model: type[BaseModel]) -> Iterator[Finding]:
    """Each of `error`'s errors, worded for the person who wrote the document for `model`."""
    for item in error.errors(include_url=False):
        loc: list[str | int] = list(item["loc"])
        on_key = item["type"] == "extra_forbidden"
        if loc and loc[-1] == "[key]":  # a bad key inside a dict field (e.g. min_tflops)
            loc.pop()
            on_key = True
        field = tuple(loc)
        shape = _SHAPES.get(item["type"])
        if shape is not None:
            message = expected(model, field, shape)
        else:
            message = item["msg"]
            for prefix in ("Value error, ", "Assertion failed, "):
                message = message.removeprefix(prefix)
            ctx = {k: _plain_number(v) for k, v in item.get("ctx", {}).items()}
            message = _MESSAGES.get(item["type"], message).format(**ctx)
            message = message.replace("Input should be", "must be")
            if item["type"] == "extra_forbidden":
                hint = did_you_mean(model, field)
                message = f"{message}; {hint}" if hint else message
        yield Finding(field, message, on_key)


_GONE = object()  # a value taken out of a document, swept away before the next try


def _take_out(data: Any, loc: FieldPath) -> bool:
    """Mark the deepest value on `loc` that the document has as gone; False when the loc
    points at the document itself (nothing smaller to take out)."""
    node, steps = data, 0
    for step in loc:
        has = isinstance(node, dict) and step in node
        has = has or (isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node))
        if not has:
            break
        child = node[step]
        if child is _GONE:
            return True  # already taken out with an earlier problem
        node, steps = child, steps + 1
    if steps == 0:
        return False
    parent = data
    for step in loc[: steps - 1]:
        parent = parent[step]
    parent[loc[steps - 1]] = _GONE
    return True


def _copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_copy(v) for v in data]
    return data


def _sweep(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _sweep(v) for k, v in data.items() if v is not _GONE}
    if isinstance(data, list):
        return [_sweep(v) for v in data if v is not _GONE]
    return data


def without(data: Any, locs: Iterable[FieldPath]) -> Any | None:
    """A copy of `data` without the deepest value it has on each loc (the bad value, or the
    mapping a missing field belongs in); None when a loc points at the document itself."""
    data = _copy(data)
    if not all([_take_out(data, loc) for loc in locs]):
        return None
    return _sweep(data)


class SectionError(ValueError):
    """No model for a section: reported at `loc` below the section's key."""

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.loc = loc


def _error(key: Any, loc: tuple[Any, ...], kind: str, message: str, value: Any) -> Any:
    template = message.replace("{", "{{").replace("}", "}}")
    return InitErrorDetails(type=PydanticCustomError(kind, template), loc=(key, *loc), input=value)


def validate_each(
    title: str, sections: Any, model_of: Callable[[Any, Any], type[BaseModel]]
) -> Any:
    """Each value of a mapping validated with the model `model_of(key, value)` picks (a
    provider's own settings model, a channel type's config model): for a field whose model a
    plug-in declares. Every error keeps its location below the key, as a nested model's would;
    `model_of` raises ValueError for a key it has no model for (SectionError: reported below the
    key, at its `loc`). A value that is not a
    mapping, or a value already validated, is left to the field's own type."""
    if not isinstance(sections, dict):
        return sections
    out: dict[Any, Any] = {}
    errors: list[InitErrorDetails] = []
    for key, raw in sections.items():
        if isinstance(raw, BaseModel) or not isinstance(raw, dict):
            out[key] = raw
            continue
        try:
            model = model_of(key, raw)
        except SectionError as exc:
            errors.append(_error(key, exc.loc, "value_error", str(exc), raw))
            continue
        try:
            out[key] = model.model_validate(raw)
        except ValidationError as exc:
            errors.extend(
                _error(key, tuple(e["loc"]), e["type"], str(e["msg"]), e.get("input"))
                for e in exc.errors()
            )
    if errors:
        raise ValidationError.from_exception_data(title, errors)
    return out
