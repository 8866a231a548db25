"""All-reduce bus bandwidth between local ranks: torch.distributed over NCCL on GPUs, gloo on the CPU.

:func:`measure_allreduce` starts one process per rank (``python -m autotune.doctor._allreduce``, an argv
list) and reads rank 0's JSON line. Bus bandwidth follows nccl-tests' convention (``PERFORMANCE.md``):
``algbw = bytes / time`` and ``busbw = algbw × 2(n−1)/n`` for all-reduce, so it compares with the link's
own bandwidth whatever the number of ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

__all__ = ["measure_allreduce", "bus_bandwidth"]


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """nccl-tests' all-reduce bus bandwidth, bytes per second."""
    if seconds <= 0 or world < 2:
        return 0.0
    return nbytes / seconds * 2 * (world - 1) / world


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_allreduce(
    world: int, *, backend: str, nbytes: int, seconds: float, timeout_s: float = 300.0
) -> float:
    """Bus bandwidth of an all-reduce of ``nbytes`` between ``world`` local ranks, bytes per second.

    Raises:
        RuntimeError: a rank failed or the run exceeded ``timeout_s`` (its processes are killed).
    """
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    procs = []
    for rank in range(world):
        argv = [
            sys.executable,
            "-m",
            "autotune.doctor._allreduce",
            "--rank",
            str(rank),
            "--backend",
            backend,
            "--bytes",
            str(nbytes),
            "--seconds",
            str(seconds),
        ]
        procs.append(
            subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    outputs: list[tuple[str, str]] = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout_s))
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"the all-reduce benchmark took over {timeout_s:.0f} s") from exc
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=False):
        if p.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"an all-reduce rank exited with {p.returncode}: {last}")
    return float(json.loads(outputs[0][0].strip().splitlines()[-1])["bus_bytes_per_s"])


def _rank_main(argv: list[str] | None = None) -> None:  # pragma: no cover - runs in the child processes
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--backend", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group(args.backend, rank=args.rank, world_size=world)
    on_gpu = args.backend == "nccl"
    if on_gpu:
        torch.cuda.set_device(args.rank)
    device = torch.device("cuda", args.rank) if on_gpu else torch.device("cpu")
    dtype = torch.bfloat16 if on_gpu else torch.float32
    n = max(1, args.bytes // torch.tensor([], dtype=dtype).element_size())
    buf = torch.ones(n, dtype=dtype, device=device)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    for _ in range(2):  # warm-up: connections and NCCL's channels are set up on first use
        dist.all_reduce(buf)
    sync()
    times = []
    deadline = time.perf_counter() + args.seconds
    while True:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        sync()
        times.append(time.perf_counter() - t0)
        # every rank stops together: rank 0's clock decides, broadcast as a flag
        flag = torch.tensor([1 if time.perf_counter() < deadline else 0], device=device)
        dist.broadcast(flag, 0)
        if not int(flag.item()):
            break
    times.sort()
    median = times[len(times) // 2]
    if args.rank == 0:
        nbytes = n * buf.element_size()
        print(json.dumps({"bus_bytes_per_s": bus_bandwidth(nbytes, median, world), "iterations": len(times)}))
    dist.destroy_process_group()


if __name__ == "__main__":  # pragma: no cover
    _rank_main()
