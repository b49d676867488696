"""CPU seconds per thread of some processes, from /proc (user + system), and the
difference of two snapshots: which of a service's threads (the engine, the RPC writer,
gRPC's pollers, the gateway's loop and stream reader) used the CPU over a run.

    python3 scripts/gpu/thread_cpu.py snap PIDFILE... > before.json
    python3 scripts/gpu/thread_cpu.py diff before.json after.json [SECONDS [DUMP...]]

DUMP: `py-spy dump` outputs of those processes, which name the Python threads by id.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def snapshot(pid_files: list[str]) -> dict[str, dict[str, float]]:
    """{process name: {"tid name": cpu seconds}} (the name: its pid file's stem)."""
    found: dict[str, dict[str, float]] = {}
    for pid_file in pid_files:
        name, pid = Path(pid_file).stem, Path(pid_file).read_text().strip()
        threads: dict[str, float] = {}
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue  # the thread ended
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            threads[f"{task.name} {comm}"] = (int(fields[11]) + int(fields[12])) / TICK
        found[name] = threads
    return found


def thread_names(dumps: list[str]) -> dict[str, str]:
    """{tid: Python thread name} from `py-spy dump` outputs."""
    names: dict[str, str] = {}
    for dump in dumps:
        for match in re.finditer(r'^Thread (\d+) \([^)]*\): "(.*)"$', Path(dump).read_text(),
                                 re.MULTILINE):
            names[match.group(1)] = match.group(2)
    return names


def main(argv: list[str]) -> int:
    if argv[:1] == ["snap"]:
        json.dump(snapshot(argv[1:]), sys.stdout)
        return 0
    if argv[:1] == ["diff"] and len(argv) >= 3:
        before, after = (json.loads(Path(p).read_text()) for p in argv[1:3])
        seconds = float(argv[3]) if len(argv) > 3 else 0.0
        names = thread_names([p for p in argv[4:] if Path(p).is_file()])
        for name, threads in after.items():
            used = sorted(((cpu - before.get(name, {}).get(tid, 0.0), tid)
                           for tid, cpu in threads.items()), reverse=True)
            total = sum(u for u, _ in used)
            shown = ", ".join(f"{tid} {names.get(tid, comm)} {u:.2f}" for u, (tid, comm)
                              in ((u, key.split(" ", 1)) for u, key in used) if u >= 0.05)
            per = f" ({total / seconds:.2f} of a core)" if seconds else ""
            print(f"{name}: {total:.2f} s{per}: {shown}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
