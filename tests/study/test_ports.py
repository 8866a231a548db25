"""Rendezvous ports outside the kernel's ephemeral range, taken in turn under a host lock (review #17)."""

from __future__ import annotations

import socket
from pathlib import Path

from autotune.study.ports import PORT_RANGE, ephemeral_range, free_port

LINUX = (32768, 60999)


def test_ports_come_from_outside_the_ephemeral_range_in_turn(tmp_path: Path) -> None:
    first = free_port(tmp_path, LINUX)
    second = free_port(tmp_path, LINUX)
    for port in (first, second):
        assert PORT_RANGE[0] <= port <= PORT_RANGE[1] and not LINUX[0] <= port <= LINUX[1]
    assert second > first  # the shared cursor moved on: a port just handed out is not handed out again


def test_a_port_in_use_is_passed_over(tmp_path: Path) -> None:
    taken = free_port(tmp_path, LINUX) + 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", taken))
        s.listen()
        assert free_port(tmp_path, LINUX) > taken


def test_an_ephemeral_range_over_ours_falls_back_to_the_kernels_port(tmp_path: Path) -> None:
    low, high = ephemeral_range()
    port = free_port(tmp_path, (1024, 65535))
    assert 1024 <= port <= 65535 and (low <= port <= high)


def test_the_ephemeral_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert ephemeral_range(path) == (40000, 50000)
    assert ephemeral_range(tmp_path / "missing") == LINUX
