"""The API token's guessability estimate (optimizer/daemon/token_strength.py): long but
patterned tokens score low, generated ones high, and the estimate never shows the token."""

from __future__ import annotations

import math

import pytest

from optimizer.daemon.token_strength import MAX_CHARS, MIN_BITS, alphabet, strength

# Made once by secrets.token_urlsafe(32), token_hex(32) and token_hex(16): test values only.
URLSAFE = "XnZd9WS_taWVxrtJwoFV-UpHqrALd8E4aIkAT2jErAs"
HEX_64 = "dc9b85fc8605a6374b09cad9fa321de64babd55e68940e3a48e62080598b6bfc"
HEX_32 = "c9db641f775c8c6d7a85347787ab4098"


@pytest.mark.parametrize(
    "token",
    [
        "a" * 32,
        "a" * 64,
        "password" * 4,
        "PASSWORD" * 4,
        "abcdefghijklmnopqrstuvwxyz012345",
        "0123456789" * 4,
        "qwertyqwertyqwertyqwertyqwertyqw",
        "changeme-changeme-changeme-chang",
        "ab" * 16,
        "Summer2026!" * 3,
    ],
)
def test_long_but_patterned_tokens_score_under_the_bar(token: str) -> None:
    found = strength(token)
    assert found.bits < MIN_BITS and not found.strong
    assert found.patterns  # says what made it guessable
    assert all(token[:4] not in p for p in found.patterns)  # without showing it


@pytest.mark.parametrize("token", [URLSAFE, HEX_64, HEX_32])
def test_generated_tokens_pass(token: str) -> None:
    assert strength(token).strong


def test_a_random_token_scores_its_length_times_its_alphabet() -> None:
    assert alphabet(URLSAFE) == 26 + 26 + 10 + 33
    assert strength(URLSAFE).bits == pytest.approx(len(URLSAFE) * math.log2(95))
    assert alphabet(HEX_64) == 36 and alphabet("\u00e9t\u00e9") == 126


def test_the_work_is_bounded_whatever_the_length() -> None:
    assert strength("a" * 100_000).bits == strength("a" * MAX_CHARS).bits
