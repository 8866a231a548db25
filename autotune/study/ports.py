"""Rendezvous ports for trials: outside the kernel's ephemeral range, handed out under a host lock.

A port the kernel hands out for ``bind(0)`` is ephemeral: between autotune's check and torchrun's bind
seconds later, any socket another process opens (a concurrent trial's NCCL, vLLM or Ray sockets, a
client) may be given the same port. Ports below the ephemeral range are handed out only on request, so
taking them in turn under a lock every autotune process on the host shares makes that race one between
explicit binds only; torch's ``EADDRINUSE`` that remains is a relaunch, not a result
(:data:`autotune.trial.evidence.COMMON_PATTERNS`).
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from pathlib import Path

__all__ = ["PORT_RANGE", "ephemeral_range", "free_port"]

#: the ports trials take, in turn: below Linux's default ephemeral range (32768-60999) and above Ray's
#: worker ports (10002-19999)
PORT_RANGE = (20000, 32767)
_DEFAULT_EPHEMERAL = (32768, 60999)
_LOCK_NAME = "autotune-ports.lock"


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(x) for x in path.read_text().split()[:2])
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ephemeral_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port(lock_dir: Path | None = None, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port free right now on this host, for torch.distributed's ``MASTER_PORT``.

    The next port of :data:`PORT_RANGE` (outside the ephemeral range) after the last one any autotune
    process on the host took, that binds now; the cursor lives in a file locked with ``flock``. Where
    the range cannot be used (the kernel's ephemeral range covers it, the lock cannot be taken), an
    ephemeral port as before.

    Args:
        lock_dir: where the shared cursor lives; default the system's temporary directory.
        ephemeral: the kernel's ephemeral range; default read from ``/proc``.
    """
    low, high = PORT_RANGE
    e_low, e_high = ephemeral if ephemeral is not None else ephemeral_range()
    candidates = [p for p in range(low, high + 1) if not e_low <= p <= e_high]
    if not candidates:
        return _ephemeral_port()
    path = (lock_dir or Path(tempfile.gettempdir())) / _LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    except OSError:
        return _ephemeral_port()
    with os.fdopen(fd, "r+") as f:
        # flock on the cursor file itself, not filelock (no dependency of autotune, and its lock file
        # cannot also hold the cursor): the kernel frees it when a holder dies
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            text = f.read().strip()
            last = int(text) if text.isdigit() else candidates[-1]
            start = next((i for i, p in enumerate(candidates) if p > last), 0)
            for k in range(len(candidates)):
                port = candidates[(start + k) % len(candidates)]
                if _bindable(port):
                    f.seek(0)
                    f.truncate()
                    f.write(str(port))
                    f.flush()
                    return port
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return _ephemeral_port()
