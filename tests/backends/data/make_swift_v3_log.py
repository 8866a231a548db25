"""Write the ms-swift 3.x recording from the real 4.6 capture (not a test itself).

    python tests/backends/data/make_swift_v3_log.py

No 3.x installation is at hand, so the 3.x log is written from 3.x's own source (tag v3.12.4,
``swift/trainers/callback.py::add_train_message`` and transformers 4's ``ProgressCallback.on_log``)
applied to the same training records as the 4.6 capture:

- every float rounded to 8 places; then ``global_step/max_steps``, ``percentage`` (``'12.50%'``),
  ``elapsed_time``, ``remaining_time``, ``memory(GiB)`` (GPU only, so absent here) and
  ``train_speed(iter/s)`` = round(global_step / elapsed, 6);
- stdout prints the dict with numbers (transformers 4 does not format floats), ``logging.jsonl`` gets
  the same record as JSON;
- the command line says ``--train_type`` (3.x's name of ``--tuner_type``).

Both recordings must parse to the same step records (tests/backends/test_swift_log.py).
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
SOURCE = HERE / "swift_v4.6_cpu_1proc.events.jsonl"
TARGET = HERE / "swift_v3.12.4_cpu_1proc.events.jsonl"
STEP_KEY = "global_step/max_steps"


def _format_time(seconds: float) -> str:
    # swift.utils.format_time of 3.x
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    out = f"{days}d " if days else ""
    out += f"{hours}h " if hours else ""
    out += f"{minutes}m " if minutes else ""
    return out + f"{secs}s"


def to_v3(record: dict) -> dict:
    """One 4.6 record (numbers, from logging.jsonl) as 3.12.4 would have logged it."""
    step, max_steps = (int(x) for x in record[STEP_KEY].split("/"))
    elapsed = float(record["train_speed(s/it)"]) * step
    logs = {
        k: v
        for k, v in record.items()
        if k not in (STEP_KEY, "elapsed_time", "remaining_time", "train_speed(s/it)", "memory(GiB)")
    }
    for k, v in logs.items():
        if isinstance(v, float):
            logs[k] = round(v, 8)
    pct = step / max_steps if max_steps else 0.0
    logs[STEP_KEY] = f"{step}/{max_steps}"
    logs["percentage"] = f"{pct * 100:.2f}%"
    logs["elapsed_time"] = _format_time(elapsed)
    if pct:
        logs["remaining_time"] = _format_time(elapsed / pct - elapsed)
    logs["train_speed(iter/s)"] = round(step / elapsed, 6)
    return logs


def main() -> None:
    events = [json.loads(x) for x in SOURCE.read_text(encoding="utf-8").splitlines() if x.strip()]
    out: list[dict] = []
    converted: dict[tuple[str, bool], dict] = {}
    for ev in events:
        if "meta" in ev:
            meta = dict(ev["meta"])
            meta["source"] = "written by make_swift_v3_log.py from the 4.6 capture, in 3.12.4's log format"
            meta["ms_swift"] = "3.12.4"
            meta["argv"] = ["--train_type" if a == "--tuner_type" else a for a in meta["argv"]]
            out.append({"meta": meta})
            continue
        if ev.get("file") == "output/logging.jsonl":
            record = json.loads(ev["text"])
            if STEP_KEY in record:
                v3 = to_v3(record)
                converted[(record[STEP_KEY], "train_runtime" in record)] = v3
                out.append({**ev, "text": json.dumps(v3)})
            else:
                out.append(ev)
            continue
        if ev.get("stream") == "stdout" and STEP_KEY in ev["text"]:
            # the stdout line follows its file line: print the converted record with numbers
            key = next(
                k
                for k in converted
                if f"'{STEP_KEY}': '{k[0]}'" in ev["text"] and k[1] == ("train_runtime" in ev["text"])
            )
            out.append({**ev, "text": str(converted[key])})
            continue
        if ev.get("stream") == "stdout" and ev["text"].startswith("run sh:"):
            out.append({**ev, "text": ev["text"].replace("--tuner_type", "--train_type")})
            continue
        out.append(ev)
    with TARGET.open("w", encoding="utf-8") as fh:
        for ev in out:
            fh.write(json.dumps(ev, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
