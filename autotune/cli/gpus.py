"""``autotune gpus``: what this machine has (NVML), or what was declared, and the host."""

from __future__ import annotations

import typer

from autotune.cli import _options as o

HELP = """List the GPUs NVML sees (count, name, memory, driver, compute capability) and the host's CPU
cores and RAM.

\b
Examples:
  autotune gpus
  autotune gpus --gpus 4 --gpu-type A10 --json"""


def register(app: typer.Typer) -> None:
    """Add the command to the app."""

    @app.command("gpus", cls=o.PanelledCommand, help=HELP)
    def gpus(
        count: o.Gpus = None,
        gpu_type: o.GpuType = None,
        gpu_memory_gib: o.GpuMemoryGib = None,
        as_json: o.Json = False,
    ) -> None:
        import json

        from rich.table import Table

        from autotune.cli._console import console, say
        from autotune.study.hardware import resolve_hardware

        hw = resolve_hardware(count, gpu_type=gpu_type, gpu_memory_gib=gpu_memory_gib)
        if as_json:
            say(json.dumps(hw.model_dump(mode="json"), indent=2))
            return
        host = hw.host
        say(
            f"host {host.hostname}: {host.cpu_cores_logical} CPU cores"
            + (f" ({host.cpu_cores_physical} physical)" if host.cpu_cores_physical else "")
            + f", {host.ram_total_bytes / 2**30:.1f} GiB RAM, {host.platform}"
        )
        if not hw.gpus:
            say(f"no GPU: {hw.nvml_note or 'NVML lists no device'}. autotune search runs on the CPU here.")
            return
        if hw.driver_version:
            say(
                f"driver {hw.driver_version}"
                + (f", CUDA {hw.cuda_driver_version}" if hw.cuda_driver_version else "")
            )
        if hw.nvml_note:
            say(f"note: {hw.nvml_note}")
        table = Table("index", "name", "memory", "compute capability", "source")
        for g in hw.gpus:
            table.add_row(
                str(g.index),
                g.name,
                f"{g.memory_total_bytes / 2**30:.1f} GiB",
                g.compute_capability or "—",
                "declared" if g.declared else "NVML",
            )
        console.print(table)
