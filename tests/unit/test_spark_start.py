"""What a Spark start tries first and how it is said (snapshotter.sinks.spark.start); the
starts themselves run against the real servers in tests/integration/test_spark_start.py."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from snapshotter.config import SparkConfig
from snapshotter.sinks.spark.start import SparkStartError, addresses, bound_retries, probe, shown


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (SparkConfig(master="spark://h1:7077,h2:7078"), [("h1", 7077), ("h2", 7078)]),
        (SparkConfig(master="spark://h1"), [("h1", 7077)]),
        (SparkConfig(master="spark://[::1]:7077"), [("::1", 7077)]),
        (SparkConfig(remote="sc://host"), [("host", 15002)]),
        (SparkConfig(remote="sc://host:1/;token=secret;use_ssl=true"), [("host", 1)]),
        (SparkConfig(master="local[*]"), []),
        (SparkConfig(master="yarn"), []),
        (SparkConfig(master="k8s://https://api:6443"), []),
    ],
)
def test_the_addresses_tried_before_a_start(
    config: SparkConfig, expected: list[tuple[str, int]]
) -> None:
    assert addresses(config) == expected


def test_a_connect_urls_parameters_are_never_shown() -> None:
    assert shown(SparkConfig(remote="sc://host:1/;token=secret")) == "sc://host:1"
    assert shown(SparkConfig(remote="sc://host:1;token=secret")) == "sc://host:1"
    assert shown(SparkConfig(master="spark://h:7077")) == "spark://h:7077"


def test_a_closed_port_is_said_with_the_address_and_the_setting() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused
        with pytest.raises(SparkStartError) as error:
            probe(SparkConfig(remote=f"sc://127.0.0.1:{port}/;token=secret"))
    text = str(error.value)
    assert text.startswith(f"cannot reach the Spark Connect server at sc://127.0.0.1:{port} (")
    assert "[spark] remote" in text and "secret" not in text


def test_any_master_of_a_list_that_answers_will_do() -> None:
    with socket.socket() as closed, socket.socket() as listening:
        closed.bind(("127.0.0.1", 0))
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        a, b = closed.getsockname()[1], listening.getsockname()[1]
        probe(SparkConfig(master=f"spark://127.0.0.1:{a},127.0.0.1:{b}"))


@pytest.mark.parametrize(("timeout_s", "retries"), [(120, 6), (20, 5), (1, 1), (0.1, 1)])
def test_a_connect_clients_retries_are_bounded_by_the_start_timeout(
    timeout_s: float, retries: int
) -> None:
    """PySpark's default retries an unavailable Connect server for ten minutes and more."""
    from types import SimpleNamespace

    set_to: list[Any] = []
    session = SimpleNamespace(client=SimpleNamespace(set_retry_policies=set_to.extend))
    bound_retries(session, timeout_s)
    (policy,) = set_to
    assert policy.max_retries == retries
    assert policy.max_server_retry_delay == int(timeout_s * 1000)
