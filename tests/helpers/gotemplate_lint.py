"""Static checks of Helm's Go templates for machines without helm.

Not a renderer: it reads each `{{ … }}` action and reports what `helm template` would reject
before rendering anything (unbalanced blocks, `else` outside a block, bad trim markers,
unbalanced parentheses or quotes, unknown functions, includes of undefined templates). The
rules follow text/template's syntax (https://pkg.go.dev/text/template) and the function
names are Go's builtins, Helm's own and the Sprig ones this chart may use
(https://helm.sh/docs/chart_template_guide/function_list/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEYWORDS = {"if", "else", "end", "range", "with", "define", "template", "block", "break"}
KEYWORDS |= {"continue"}
LITERALS = {"true", "false", "nil"}
OPENERS = {"if", "range", "with", "define", "block"}

GO_BUILTINS = {"and", "or", "not", "len", "index", "slice", "print", "printf", "println"}
GO_BUILTINS |= {"eq", "ne", "lt", "le", "gt", "ge", "html", "js", "urlquery", "call"}
HELM_FUNCTIONS = {"include", "tpl", "required", "fail", "lookup", "toYaml", "fromYaml"}
HELM_FUNCTIONS |= {"toJson", "fromJson", "toToml", "fromYamlArray", "fromJsonArray"}
SPRIG_FUNCTIONS = {"default", "empty", "coalesce", "ternary", "list", "dict", "get", "set"}
SPRIG_FUNCTIONS |= {"unset", "hasKey", "keys", "values", "pluck", "merge", "mustMerge"}
SPRIG_FUNCTIONS |= {"deepCopy", "append", "prepend", "first", "last", "rest", "initial", "uniq"}
SPRIG_FUNCTIONS |= {"has", "without", "compact", "trim", "trimAll", "trimPrefix", "trimSuffix"}
SPRIG_FUNCTIONS |= {"upper", "lower", "title", "nospace", "trunc", "abbrev", "contains"}
SPRIG_FUNCTIONS |= {"hasPrefix", "hasSuffix", "quote", "squote", "cat", "indent", "nindent"}
SPRIG_FUNCTIONS |= {"replace", "plural", "snakecase", "camelcase", "kebabcase", "repeat"}
SPRIG_FUNCTIONS |= {"substr", "join", "split", "splitList", "splitn", "sortAlpha", "toString"}
SPRIG_FUNCTIONS |= {"toStrings", "int", "int64", "float64", "atoi", "add", "add1", "sub", "mul"}
SPRIG_FUNCTIONS |= {"div", "mod", "max", "min", "floor", "ceil", "round", "until", "untilStep"}
SPRIG_FUNCTIONS |= {"seq", "b64enc", "b64dec", "sha1sum", "sha256sum", "adler32sum"}
SPRIG_FUNCTIONS |= {"regexMatch", "regexFind", "regexFindAll", "regexReplaceAll", "regexSplit"}
SPRIG_FUNCTIONS |= {"semver", "semverCompare", "kindIs", "kindOf", "typeOf", "typeIs"}
SPRIG_FUNCTIONS |= {"deepEqual", "now", "date", "dateInZone", "toDate", "durationRound"}
SPRIG_FUNCTIONS |= {"uuidv4", "randAlphaNum"}
KNOWN_FUNCTIONS = GO_BUILTINS | HELM_FUNCTIONS | SPRIG_FUNCTIONS

_ACTION = re.compile(r"{{(.*?)}}", re.DOTALL)
_TOKEN = re.compile(
    r"""
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<char>'(?:[^'\\]|\\.)')
    | (?P<number>-?\d[\w.]*)
    | (?P<variable>\$\w*(?:\.\w+)*)
    | (?P<field>(?:\.\w+)+|\.)
    | (?P<word>[A-Za-z_]\w*)
    | (?P<punct>:=|=|\||\(|\)|,)
    | (?P<space>\s+)
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class Action:
    """One `{{ … }}`: its body without delimiters and trim markers, and where it starts."""

    body: str
    line: int
    raw: str


def actions(text: str) -> list[Action]:
    """Every action in a template, in order, with comments left out."""
    found = []
    for match in _ACTION.finditer(text):
        raw = match.group(0)
        inner = match.group(1)
        line = text.count("\n", 0, match.start()) + 1
        body = inner.removeprefix("-").removesuffix("-").strip()
        if body.startswith("/*") and body.endswith("*/"):
            continue
        found.append(Action(body, line, raw))
    return found


def tokens(body: str) -> list[tuple[str, str]]:
    """(kind, text) pairs of an action's body, spaces dropped."""
    out = []
    for match in _TOKEN.finditer(body):
        kind = match.lastgroup or "other"
        if kind != "space":
            out.append((kind, match.group(0)))
    return out


def defined_templates(text: str) -> set[str]:
    return set(re.findall(r'{{-?\s*define\s+"([^"]+)"', text))


def included_templates(text: str) -> set[str]:
    return set(re.findall(r'\b(?:include|template)\s+"([^"]+)"', text))


def problems(name: str, text: str) -> list[str]:
    """What is wrong with one template file, as `name:line: message` lines."""
    found: list[str] = []
    if text.count("{{") != text.count("}}"):
        found.append(f"{name}: {{{{ and }}}} do not pair up")
    stack: list[tuple[str, int]] = []
    for action in actions(text):
        where = f"{name}:{action.line}"
        inner = action.raw[2:-2]
        if inner.startswith("-") and not inner[1:2].isspace():
            found.append(f"{where}: '{{{{-' must be followed by a space: {action.raw}")
        if inner.endswith("-") and not inner[-2:-1].isspace():
            found.append(f"{where}: '-}}}}' must follow a space: {action.raw}")
        toks = tokens(action.body)
        if not toks:
            found.append(f"{where}: empty action")
            continue
        first = toks[0][1] if toks[0][0] == "word" else ""
        if first in OPENERS:
            if first == "define" and stack:
                found.append(f"{where}: define inside a block")
            stack.append((first, action.line))
        elif first == "else":
            if not stack or stack[-1][0] not in {"if", "with", "range"}:
                found.append(f"{where}: else outside if/with/range")
        elif first == "end":
            if len(toks) > 1:
                found.append(f"{where}: end takes no arguments")
            if not stack:
                found.append(f"{where}: end without an open block")
            else:
                stack.pop()
        depth = 0
        for kind, text_ in toks:
            if kind == "other":
                found.append(f"{where}: unexpected {text_!r} in {action.raw}")
            elif text_ == "(":
                depth += 1
            elif text_ == ")":
                depth -= 1
                if depth < 0:
                    found.append(f"{where}: ')' without '(' in {action.raw}")
            elif kind == "word" and text_ not in KEYWORDS | LITERALS | KNOWN_FUNCTIONS:
                found.append(f"{where}: unknown function {text_!r} in {action.raw}")
        if depth > 0:
            found.append(f"{where}: '(' without ')' in {action.raw}")
    for opener, line in stack:
        found.append(f"{name}:{line}: {opener} is never closed by end")
    return found
