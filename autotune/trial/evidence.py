"""A framework's failure text: the patterns common to every framework, and how output lines are read.

The runner keeps every line that matches a pattern as evidence while a trial runs; the outcome module
decides from that evidence once it ended. Both read lines the same way (rank prefixes stripped).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from autotune.backends._base import FailurePattern

__all__ = [
    "COMMON_PATTERNS",
    "EXCEPTION_LINE",
    "last_error_line",
    "match_patterns",
    "raised_error_line",
    "strip_rank_prefix",
]

COMMON_PATTERNS: tuple[FailurePattern, ...] = (
    # PyTorch's CUDA allocator: torch.OutOfMemoryError (2.x), torch.cuda.OutOfMemoryError (1.13-2.0),
    # RuntimeError: CUDA out of memory (older) all carry this phrase.
    # Matched case-blind ("(?i:...)"): vLLM's sleep-mode allocator prints "CUDA Error: out of memory at
    # .../cumem_allocator.cpp:62" on a wake-up OOM, the CUDA runtime "CUDA error: out of memory".
    FailurePattern("OOM", r"(?i:CUDA out of memory)", "CUDA out of memory"),
    FailurePattern("OOM", r"(?i:CUDA error: out of memory)", "CUDA out of memory (CUDA runtime error)"),
    # NCCL could not allocate its buffers: "NCCL WARN Cuda failure 2 'out of memory'", and torch's
    # DistBackendError "... Last error: Cuda failure 2 'out of memory'".
    FailurePattern("OOM", r"(?i:Cuda failure \d* ?'out of memory')", "GPU out of memory (NCCL's buffers)"),
    FailurePattern("OOM", r"HIP out of memory", "GPU out of memory (HIP)"),
    FailurePattern("OOM", r"CUBLAS_STATUS_ALLOC_FAILED", "GPU out of memory (cuBLAS could not allocate)"),
    FailurePattern(
        "VLLM_INIT",
        r"Free memory on device .*on startup is less than desired GPU memory utilization",
        "vLLM could not start: free GPU memory is below the requested gpu_memory_utilization",
    ),
    # vLLM's CPU platform (vllm/v1/worker/cpu_worker.py): gpu_memory_utilization is a share of host memory
    FailurePattern(
        "VLLM_INIT",
        r"on startup is less than desired CPU memory utilization",
        "vLLM could not start: free host memory is below the requested gpu_memory_utilization (CPU platform)",
    ),
    FailurePattern(
        "VLLM_INIT",
        r"on kv cache allocation is less than requested memory for kv",
        "vLLM could not start: its share of host memory, less what the process holds, does not fit (CPU platform)",
    ),
    FailurePattern(
        "VLLM_INIT",
        r"No available memory for the cache blocks",
        "vLLM could not start: no memory left for KV cache blocks",
    ),
    FailurePattern(
        "VLLM_INIT",
        r"KV cache is needed, which is larger than the available KV cache memory",
        "vLLM could not start: the KV cache cannot hold one sequence of max_model_len",
    ),
    FailurePattern(
        "VLLM_INIT",
        r"is larger than the maximum number of tokens that can be stored in KV cache",
        "vLLM could not start: the KV cache cannot hold one sequence of max_model_len",
    ),
    FailurePattern(
        "VLLM_INIT",
        r"Error in memory profiling",
        "vLLM could not start: another process freed GPU memory while vLLM profiled (colocated start-up)",
    ),
    FailurePattern("HOST_OOM", r"exitcode\s*:\s*-9\b", "a rank was killed by SIGKILL (host out of memory?)"),
    FailurePattern(
        "HOST_OOM",
        r"Signal 9 \(SIGKILL\) received by PID",
        "a rank was killed by SIGKILL (host out of memory?)",
    ),
    FailurePattern("HOST_OOM", r"DefaultCPUAllocator: can't allocate memory", "host RAM allocation failed"),
    FailurePattern(
        "HANG",
        r"ProcessGroup\w*'s watchdog got stuck for \d+ seconds",
        "the collective-communication watchdog saw no progress (distributed hang)",
    ),
    FailurePattern(
        "HANG",
        r"Watchdog caught collective operation timeout",
        "a collective operation timed out (distributed hang)",
    ),
    # torch's TCPStore could not bind the rendezvous port another process took meanwhile (review #17):
    # the port's fault, not the configuration's; the trial may run again (INTERRUPTED)
    FailurePattern(
        "INTERRUPTED",
        r"server socket has failed to listen on any local network address.*EADDRINUSE",
        "the rendezvous port was taken by another process before torch bound it (EADDRINUSE); "
        "it says nothing about the configuration, which may run again",
    ),
    FailurePattern(
        "INVALID",
        r": error: (?:unrecognized arguments|argument |the following arguments are required|invalid choice)",
        "the framework rejected its arguments",
    ),
    FailurePattern(
        "INVALID",
        r"Some specified arguments are not used by the HfArgumentParser",
        "the framework rejected its arguments",
    ),
    FailurePattern(
        "INVALID",
        r"^Error: (?:No such option|Invalid value for|Missing option|Got unexpected extra argument)",
        "the framework rejected its arguments",
    ),
)

# "[rank1]: ", "[rank1]:[E1111 17:01:37] ", "(EngineCore pid=253) ", "(RayWorker pid=9, ip=...) "
_PREFIX = re.compile(r"^(?:\[rank\d+\]:\s?|\[default\d+\]:\s?|\(\w+ pid=\d+(?:, ip=[^)]*)?\)\s*)+")
# terminal colour codes: Ray colours its "(Worker pid=N)" prefixes even when writing to a pipe
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:Error|Exception|Failure|Interrupt|Exit))\b(?::\s*(.*))?$"
)
_FATAL = re.compile(r"^Fatal Python error: (.+)$")
_WRAPPER_EXC = ("ChildFailedError",)


def strip_rank_prefix(line: str) -> str:
    """``[rank1]: ValueError: x`` → ``ValueError: x`` (torchrun, vLLM worker and Ray prefixes, colour
    codes around them dropped)."""
    return _PREFIX.sub("", _ANSI.sub("", line)).rstrip()


def match_patterns(
    lines: Iterable[str], patterns: Sequence[FailurePattern]
) -> dict[str, tuple[FailurePattern, str]]:
    """The first line matching each status's patterns: status name → (pattern, line)."""
    compiled = [(p, re.compile(p.regex)) for p in patterns]
    found: dict[str, tuple[FailurePattern, str]] = {}
    for raw in lines:
        line = strip_rank_prefix(raw)
        for pattern, rx in compiled:
            if pattern.status not in found and (rx.search(line) or rx.search(raw)):
                found[pattern.status] = (pattern, raw.strip())
    return found


def last_error_line(lines: Sequence[str]) -> str | None:
    """The final ``SomethingError: ...`` line (a wrapper such as ChildFailedError only if alone)."""
    best: str | None = None
    wrapper: str | None = None
    for raw in lines:
        line = strip_rank_prefix(raw)
        m = EXCEPTION_LINE.match(line) or _FATAL.match(line)
        if not m:
            continue
        if line.startswith("Fatal Python error") or m.group(1) not in _WRAPPER_EXC:
            best = line
        else:
            wrapper = line
    return best or wrapper


def raised_error_line(lines: Sequence[str]) -> str | None:
    """The final exception line the program itself raised (``SomethingError: ...``), rank prefix dropped.

    Unlike :func:`last_error_line`, a launcher's wrapper (torchrun's ``ChildFailedError``, which only
    says a child died) and the interpreter's fatal errors (``Fatal Python error: Aborted``, the report
    of a fatal signal) never count: None when the output holds nothing else.
    """
    found: str | None = None
    for raw in lines:
        line = strip_rank_prefix(raw)
        m = EXCEPTION_LINE.match(line)
        if m and m.group(1) not in _WRAPPER_EXC:
            found = line
    return found
