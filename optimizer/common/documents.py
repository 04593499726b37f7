"""The one YAML document loader: a person-edited YAML file to a pydantic model, located errors.

Safe YAML only. The loader keeps the position of every key and value, so a schema error points
at the line a person has to edit (`file:line:col: field: message`, see `optimizer.common.errors`).
Where the caller allows it (`interpolate=True`: the daemon config and job specs, which the CLI
reads on the submitter's machine), `${VAR}` and `${VAR:-default}` in values are replaced from
the environment (`$${` writes a literal `${`). Where it does not (policies, which the API
returns and many people edit), a `${` in a value is a located error, so a file can never pull
the reader's environment in. Duplicate keys, syntax errors, a root that is not a mapping,
documents that expand past a node budget (alias bombs) and files over 1 MiB are errors too.

Policies, the daemon config and job specs are read through it; each passes its own
`LocatedError` subclass and a word for what the document is (`what="policy"`).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from optimizer.common.errors import LocatedError, Problem
from optimizer.common.validation import FieldPath, findings, in_file_order, without

MAX_BYTES = 1 << 20  # a page or two of YAML; anything this big is a mistake or an attack
MAX_NODES = 10_000  # nodes built, aliases counted each time they are used
_ENV = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class _Marks:
    key: yaml.Mark | None
    value: yaml.Mark


class _Builder:
    """Turns a composed YAML node tree into plain values, remembering where each came from."""

    def __init__(
        self,
        path: str,
        environ: Mapping[str, str] | None,
        error: type[LocatedError] = LocatedError,
        what: str = "document",
        text: str = "",
    ) -> None:
        self.path = path
        self.text = text
        self.environ = environ  # None: no interpolation; a `${` in a value is an error
        self.what = what
        self.error = error
        self.marks: dict[FieldPath, _Marks] = {}
        self.nodes = 0
        self._scalars = yaml.SafeLoader("")  # only its resolver and scalar constructors are used

    def fail(self, message: str, mark: yaml.Mark | None, field: FieldPath = ()) -> LocatedError:
        return self.error([_problem(self.path, message, mark, field)])

    def build(self, node: yaml.Node, at: FieldPath, key_mark: yaml.Mark | None = None) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise self.fail(
                f"document expands to more than {MAX_NODES} nodes (an alias bomb?)", node.start_mark
            )
        self.marks[at] = _Marks(key_mark, node.start_mark)
        if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.tag not in _SAFE_TAGS:
            raise self.fail(f"YAML tag {node.tag} is not allowed", node.start_mark, at)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise self.fail("merge keys (<<) are not supported", key_node.start_mark, at)
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.fail("a key must be a plain value", key_node.start_mark, at)
                key = self._scalar(key_node, interpolate=False)
                if not isinstance(key, str | int | float | bool) and key is not None:
                    raise self.fail("a key must be a plain value", key_node.start_mark, at)
                step = key if isinstance(key, str | int) else str(key)
                if key in out:
                    first = self.marks[(*at, step)].key
                    seen = f" (first at line {first.line + 1})" if first else ""
                    raise self.fail(f"duplicate key{seen}", key_node.start_mark, (*at, step))
                out[key] = self.build(value_node, (*at, step), key_node.start_mark)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*at, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, yaml.ScalarNode)
        return self._scalar(node, interpolate=True, at=at)

    def _scalar(self, node: yaml.ScalarNode, *, interpolate: bool, at: FieldPath = ()) -> Any:
        if node.tag not in _SAFE_TAGS:
            raise self.fail(f"YAML tag {node.tag} is not allowed", node.start_mark, at)
        if interpolate and "${" in node.value:
            if self.environ is None:
                raise self.fail(
                    f"'${{' is not allowed in a {self.what}: values are never taken from the "
                    "environment",
                    _find(self.text, node, "${"),
                    at,
                )
            text = self._interpolate(node, at)
            # A plain scalar, or a value that is one whole ${VAR}: the value's own type comes
            # through (`${CAP}` set to 40 is a number), so numbers work inside flow mappings too.
            if node.style is None or _ENV.fullmatch(node.value):
                tag = self._scalars.resolve(yaml.ScalarNode, text, (True, False))
                node = yaml.ScalarNode(tag, text, node.start_mark, node.end_mark)
            else:
                return text
        try:
            return self._scalars.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            raise self.fail(str(exc.problem), node.start_mark, at) from None

    def _interpolate(self, node: yaml.ScalarNode, at: FieldPath) -> str:
        environ = self.environ
        assert environ is not None  # the caller checked

        def replace(match: re.Match[str]) -> str:
            escaped, name, default = match.groups()
            if escaped:
                return match.group(0)[1:]
            value = environ.get(name)
            if value is None or (value == "" and default is not None):
                if default is None:
                    raise self.fail(
                        f"environment variable {name} is not set (write ${{{name}:-default}} "
                        "to give a default)",
                        node.start_mark,
                        at,
                    )
                return default
            return value

        return _ENV.sub(replace, node.value)


def _find(text: str, node: yaml.ScalarNode, needle: str) -> yaml.Mark:
    """Where `needle` first appears in a scalar's source text, else where the scalar starts."""
    start = node.start_mark
    at = text.find(needle, start.index, node.end_mark.index)
    if at < 0:
        return start
    line_start = text.rfind("\n", 0, at) + 1
    line = text.count("\n", 0, at)
    return yaml.Mark(start.name, at, line, at - line_start, None, None)  # type: ignore[arg-type]


_SAFE_TAGS = {
    "tag:yaml.org,2002:" + t
    for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq")
}


def _dotted(field: FieldPath) -> str:
    out = ""
    for part in field:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(path: str, message: str, mark: yaml.Mark | None, field: FieldPath = ()) -> Problem:
    if mark is None:
        return Problem(path, message, field=_dotted(field))
    return Problem(path, message, mark.line + 1, mark.column + 1, _dotted(field))


def _mark(marks: dict[FieldPath, _Marks], field: FieldPath, on_key: bool) -> yaml.Mark | None:
    """The nearest position the file has for `field`: the field, else its closest parent
    (at its key, where the field itself is missing)."""
    probe = field
    while probe and probe not in marks:
        probe = probe[:-1]
    found = marks.get(probe)
    if found is None:
        return None
    return found.key if (on_key or probe != field) and found.key else found.value


def _validation_problems(
    path: str, error: ValidationError, marks: dict[FieldPath, _Marks], model: type[BaseModel]
) -> list[Problem]:
    located = (
        _problem(path, f.message, _mark(marks, f.field, f.on_key), f.field)
        for f in findings(error, model)
    )
    return in_file_order(located)


def _build(
    text: str | bytes,
    *,
    path: str,
    interpolate: bool,
    environ: Mapping[str, str] | None,
    what: str,
    error: type[LocatedError],
) -> tuple[Any, _Builder]:
    """One YAML document to plain values and where each came from; raises `error` for
    anything that is not a document of mappings, lists and plain values."""
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > MAX_BYTES:
        raise error([Problem(path, f"file is {size} bytes; a {what} may be at most 1 MiB")])
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error([Problem(path, f"not UTF-8 text (byte {exc.start})")]) from None
    too_deep = Problem(path, f"YAML nests too deeply to be a {what}")
    try:
        documents = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "YAML syntax error"
        raise error([_problem(path, f"YAML syntax error: {problem}", mark)]) from None
    except yaml.YAMLError as exc:
        raise error([Problem(path, f"YAML syntax error: {exc}")]) from None
    except RecursionError:
        raise error([too_deep]) from None
    if not documents or documents[0] is None:
        raise error([Problem(path, f"empty file: expected a {what} mapping")])
    if len(documents) > 1:
        second = documents[1]
        raise error(
            [_problem(path, f"one {what} per file; found a second document", second.start_mark)]
        )
    root = documents[0]
    if not isinstance(root, yaml.MappingNode):
        raise error(
            [_problem(path, f"the top level must be a mapping of {what} fields", root.start_mark)]
        )
    env = (os.environ if environ is None else environ) if interpolate else None
    builder = _Builder(path, env, error, what, text)
    try:
        return builder.build(root, ()), builder
    except RecursionError:
        raise error([too_deep]) from None


def parse_document(
    text: str | bytes,
    model: type[M],
    *,
    path: str,
    interpolate: bool,
    environ: Mapping[str, str] | None = None,
    what: str = "document",
    error: type[LocatedError] = LocatedError,
) -> M:
    """Parse one YAML document into `model`; raises `error` listing every problem found, in
    file order.

    `interpolate`: replace `${VAR}` from `environ` (default: the process's environment); when
    False, a `${` in any value is an error and nothing is read from the environment."""
    data, builder = _build(
        text, path=path, interpolate=interpolate, environ=environ, what=what, error=error
    )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(_validation_problems(path, exc, builder.marks, model)) from None


_MAX_PRUNES = 32  # each round takes out at least one value; documents nest far less deep


@dataclass(frozen=True)
class Checked(Generic[M]):
    """A document checked in full: every problem, in file order, and the model built from
    the values that were valid (each bad one left at its default), for the checks that need
    a whole model; `value` is None when not even that could be built."""

    path: str
    problems: list[Problem]
    value: M | None
    marks: dict[FieldPath, _Marks] = field(default_factory=dict, repr=False)

    def problem(self, message: str, at: FieldPath, near: FieldPath | None = None) -> Problem:
        """A problem about field `at`, located where the file has `near` (default: `at`), or
        else its closest parent."""
        return _problem(self.path, message, _mark(self.marks, near or at, on_key=True), at)


def check_document(
    text: str | bytes,
    model: type[M],
    *,
    path: str,
    interpolate: bool,
    environ: Mapping[str, str] | None = None,
    what: str = "document",
    error: type[LocatedError] = LocatedError,
) -> Checked[M]:
    """Like `parse_document`, but returns every problem instead of raising, with a model of
    what was valid, so a checker can go on to the checks that need one."""
    try:
        data, builder = _build(
            text, path=path, interpolate=interpolate, environ=environ, what=what, error=error
        )
    except LocatedError as exc:
        return Checked(path, in_file_order(exc.problems), None)
    problems: list[Problem] | None = None
    for _ in range(_MAX_PRUNES):
        try:
            value = model.model_validate(data)
        except ValidationError as exc:
            if problems is None:  # the first round's problems are the document's own
                problems = _validation_problems(path, exc, builder.marks, model)
            data = without(data, [tuple(e["loc"]) for e in exc.errors()])
            if data is None:
                break
        else:
            return Checked(path, problems or [], value, builder.marks)
    return Checked(path, problems or [], None, builder.marks)


class NotARegularFile(OSError):
    """The path names a directory, FIFO, socket or device: never something to parse."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"is a {kind}, not a file")
        self.kind = kind


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return kind
    return "special file"


def read_limited(path: str | Path, limit: int = MAX_BYTES) -> bytes:
    """At most `limit` + 1 bytes of a regular file (one more, so the caller can tell it is
    too big). Anything else raises NotARegularFile without blocking: the file is opened
    non-blocking (a FIFO with no writer would otherwise wait forever) and checked by the
    handle it was opened with, so it cannot be swapped in between."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotARegularFile(_kind(mode))
    with os.fdopen(fd, "rb") as stream:
        return stream.read(limit + 1)


def _read(path: str | Path, what: str, error: type[LocatedError]) -> bytes:
    name = str(path)
    try:
        raw = read_limited(path)
    except FileNotFoundError:
        raise error([Problem(name, "no such file")]) from None
    except NotARegularFile as exc:
        raise error([Problem(name, f"is a {exc.kind}, not a {what} file")]) from None
    except PermissionError:
        raise error([Problem(name, "permission denied")]) from None
    if len(raw) > MAX_BYTES:
        raise error([Problem(name, f"file is over 1 MiB; a {what} may be at most 1 MiB")])
    return raw


def load_document(
    path: str | Path,
    model: type[M],
    *,
    interpolate: bool,
    environ: Mapping[str, str] | None = None,
    what: str = "document",
    error: type[LocatedError] = LocatedError,
) -> M:
    """Read and parse one YAML file; every failure is `error` naming the file."""
    return parse_document(
        _read(path, what, error),
        model,
        path=str(path),
        interpolate=interpolate,
        environ=environ,
        what=what,
        error=error,
    )


def check_file(
    path: str | Path,
    model: type[M],
    *,
    interpolate: bool,
    environ: Mapping[str, str] | None = None,
    what: str = "document",
    error: type[LocatedError] = LocatedError,
) -> Checked[M]:
    """Read and check one YAML file (`check_document`); an unreadable file is one problem."""
    try:
        raw = _read(path, what, error)
    except LocatedError as exc:
        return Checked(str(path), exc.problems, None)
    return check_document(
        raw, model, path=str(path), interpolate=interpolate, environ=environ, what=what, error=error
    )
