"""How hard an API token is to guess: a conservative estimate of its entropy in bits.

Length alone says little (`aaaa…` and `passwordpassword…` are long), so the token is read
left to right as a guesser would generate it, and each piece costs what it would cost to
guess (the zxcvbn idea, much reduced; Wheeler, "zxcvbn: Low-Budget Password Strength
Estimation", USENIX Security 2016):

- a **repeat** of text seen earlier in the token (three characters or more; `aaaa` repeats
  its first `a`): where it starts and how long it is, log2(position) + log2(length) bits;
- a **sequence** of three or more characters a constant step apart (`abcd`, `4321`, `aaa`):
  its first character, its step (one of -1, 0, +1: log2(3)) and its length;
- a **common word** (a short list of what people type for a secret, any case): log2 of the
  list's length, and one bit for its capitalisation;
- any other character: log2 of the alphabet the token draws from, by the character classes
  it uses (lower 26, upper 26, digits 10, ASCII punctuation and space 33, anything else 100).

At each position the piece that explains the most characters is taken. A random token
scores close to length x log2(alphabet): `secrets.token_urlsafe(32)` (43 characters) about
256 bits, `openssl rand -hex 32` about 330. What it cannot see: a passphrase of real words
that are not on its list scores as random letters, so generate tokens rather than make them
up. Pure; the daemon config's check uses it (`optimizer/daemon/config.py`).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

MIN_BITS = 128.0  # what a token must score to listen beyond loopback
GENERATE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'

_MIN_RUN = 3
MAX_CHARS = 512  # read at most this much: enough bits in any case, and bounded work
# What people type when asked for a secret (lowercase; a hit of 4+ characters counts).
WORDS = (
    "password", "passwd", "secret", "token", "admin", "root", "letmein", "welcome", "changeme",
    "default", "qwerty", "asdf", "zxcv", "dragon", "monkey", "master", "login", "gpuopt",
    "test", "example", "hello", "iloveyou", "trustno1", "abc123", "football", "shadow",
    "superman", "batman", "sunshine", "princess", "access", "private", "apikey", "bearer",
)  # fmt: skip
_WORD_BITS = math.log2(len(WORDS)) + 1.0
_PUNCTUATION = frozenset(string.punctuation + " ")


@dataclass(frozen=True, slots=True)
class Strength:
    bits: float
    patterns: tuple[str, ...]  # what made it guessable, in order (never the text itself)

    @property
    def strong(self) -> bool:
        return self.bits >= MIN_BITS


def alphabet(token: str) -> int:
    """How many characters a guesser must try per position, from the classes `token` uses."""
    size = 0
    if any(c in string.ascii_lowercase for c in token):
        size += 26
    if any(c in string.ascii_uppercase for c in token):
        size += 26
    if any(c in string.digits for c in token):
        size += 10
    if any(c in _PUNCTUATION for c in token):
        size += 33
    if any(not c.isascii() or (not c.isprintable() and c != " ") for c in token):
        size += 100
    return max(size, 1)


def _repeat(token: str, i: int) -> int:
    """The length of the longest text at `i` that also starts earlier (it may overlap)."""
    n = 0
    while i + n < len(token) and token.find(token[i : i + n + 1], 0, i + n) != -1:
        n += 1
    return n


def _sequence(token: str, i: int) -> int:
    """The length of the run at `i` whose characters go up or down by one, or repeat."""
    if i + 1 >= len(token):
        return 1
    step = ord(token[i + 1]) - ord(token[i])
    if step not in (-1, 0, 1):
        return 1
    n = 2
    while i + n < len(token) and ord(token[i + n]) - ord(token[i + n - 1]) == step:
        n += 1
    return n


def _word(token: str, i: int) -> str | None:
    text = token[i:].lower()
    found = [w for w in WORDS if len(w) >= 4 and text.startswith(w)]
    return max(found, key=len) if found else None


def strength(token: str) -> Strength:
    """The token's estimated entropy in bits and the guessable patterns found (docstring)."""
    token = token[:MAX_CHARS]
    per_char = math.log2(alphabet(token))
    bits = 0.0
    patterns: list[str] = []
    i = 0
    while i < len(token):
        repeat, run, word = _repeat(token, i), _sequence(token, i), _word(token, i)
        longest = max(repeat, run, len(word) if word else 0)
        if longest < _MIN_RUN:
            bits += per_char
            i += 1
            continue
        if word is not None and len(word) == longest:
            bits += _WORD_BITS
            patterns.append(f"a common word ({longest} characters)")
        elif run == longest:
            bits += per_char + math.log2(3) + math.log2(longest)
            patterns.append(f"a run of {longest} repeated or consecutive characters")
        else:
            bits += math.log2(i) + math.log2(longest)
            patterns.append(f"{longest} characters repeated from earlier")
        i += longest
    return Strength(bits, tuple(patterns))
