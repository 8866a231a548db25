"""How fast the trial-output pump drains a pipe (issue 41: 1 GiB without newline, 200 MB of ``\\r`` bars).

Usage: python bench/pump_drain.py [MiB]   (prints MB/s for each shape; no assertion, a figure)
"""

from __future__ import annotations

import os
import sys
import threading
import time

from autotune.tail import OutputQueue, pump_pipe


class _NullLog:
    closed = False

    def write(self, data: bytes) -> int:
        return len(data)

    def close(self) -> None:
        self.closed = True


def drain(total_bytes: int, block: bytes) -> tuple[float, int]:
    """Seconds to pump ``total_bytes`` of ``block`` repeated, and the segments produced."""
    read_fd, write_fd = os.pipe()
    segments = OutputQueue()
    pump = threading.Thread(target=pump_pipe, args=(read_fd, "stdout", _NullLog(), segments, print))
    began = time.perf_counter()
    pump.start()
    data = block * max(1, (1 << 20) // len(block))  # about 1 MiB per write
    written = 0
    while written < total_bytes:
        written += os.write(write_fd, data)
    os.close(write_fd)
    count = 0
    while True:
        item = segments.get()
        if item[1] is None:
            break
        count += 1
    pump.join()
    os.close(read_fd)
    return time.perf_counter() - began, count


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    for name, block in (
        ("no newline", b"x" * 4096),
        ("\\r progress bars", b"  7%|#       | 7/100 [00:01<00:13]\r"),
    ):
        seconds, count = drain(mib << 20, block)
        print(f"{name:>18}: {mib} MiB in {seconds:.2f} s = {mib / seconds:.0f} MiB/s, {count} segments")


if __name__ == "__main__":
    main()
