"""The shared test helpers themselves: waiting fails loudly, the AWS tests stay offline with
fake credentials only."""

from __future__ import annotations

import socket

import pytest

from tests.helpers import wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, 7])
    assert wait_until(lambda: next(calls), timeout=1) == 7


def test_wait_until_fails_with_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match="the moon"):
        wait_until(lambda: False, timeout=0.02, what="the moon")


@pytest.mark.usefixtures("aws_env", "offline")
def test_no_test_can_reach_beyond_loopback() -> None:
    with pytest.raises(AssertionError, match="tried to reach"):
        socket.create_connection(("192.0.2.1", 443), timeout=0.01)


@pytest.mark.usefixtures("aws_env", "offline")
def test_fake_credentials_are_the_only_ones() -> None:
    import boto3

    credentials = boto3.session.Session().get_credentials()
    assert credentials is not None and credentials.access_key == "testing"
