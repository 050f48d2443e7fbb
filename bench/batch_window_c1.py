"""A batched model at concurrency 1, by batch window, for sluice and Triton side by side.

    .venv/bin/python bench/batch_window_c1.py [--windows 0 100 300 500 700 1000]
        [--protocol http] [--rounds 2] [--interval 1500]

At c=1 a dynamic batcher holds every request for its whole ``max_queue_delay_microseconds``
(Triton's semantics, which sluice keeps): nothing else arrives to fill the batch. The
request's time is then the window plus the rest (front-end, hand-over to the python worker,
the client). This serves add_sub (bench-peers' model, one instance, batching) with each
window on both servers at once and prints, per window, each server's throughput, its time in
the queue (its own statistics, as perf_analyzer reports them) and the rest of a request's
time (1e6 / throughput - queue), then sluice/Triton. What it shows on this VM: the rest grows
with the window on both servers (idle vCPUs wake slower the longer they sleep), so a window
puts a ceiling on the c=1 ratio that no front-end cut of a few tens of microseconds lifts.
Needs ../shared/bench-peers/setup.sh (Triton, perf_analyzer).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from servers import Server, csv_run, start_sluice, start_triton  # noqa: E402
from vs_triton import SERVER_ENV, pa_command, write_repo  # noqa: E402


def windowed_repo(dest: Path, windows: list[int]) -> list[str]:
    """add_sub copied once per window as ``add_sub_w<us>``; returns the model names."""
    write_repo(dest, ["add_sub"])
    config = (dest / "add_sub" / "config.pbtxt").read_text()
    names = []
    for w in windows:
        name = f"add_sub_w{w}"
        shutil.copytree(dest / "add_sub", dest / name)
        text = config.replace('name: "add_sub"', f'name: "{name}"')
        text, n = re.subn(
            r"max_queue_delay_microseconds: *\d+", f"max_queue_delay_microseconds: {w}", text
        )
        if n != 1:
            raise RuntimeError("add_sub's config.pbtxt changed: no max_queue_delay_microseconds")
        (dest / name / "config.pbtxt").write_text(text)
        names.append(name)
    shutil.rmtree(dest / "add_sub")
    return names


def measure(
    server: Server, model: str, proto: str, interval: int, out: Path
) -> tuple[float, float] | None:
    """(requests a second, queue us a request) at c=1; None when the run failed."""
    row = csv_run(pa_command(server, model, proto, 1, interval, out), out, f"{server.name} {model}")
    if row is None:
        return None
    return float(row["Inferences/Second"]), float(row.get("Server Queue") or 0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--windows", type=int, nargs="+", default=[0, 100, 300, 500, 700, 1000])
    p.add_argument("--protocol", choices=("grpc", "http"), default="http")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--interval", type=int, default=1500, help="perf_analyzer window (ms)")
    args = p.parse_args()
    got: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-window-") as tmp:
        root = Path(tmp)
        names = windowed_repo(root / "models", args.windows)
        servers = {
            "sluice": start_sluice(root / "models", root / "sluice.log", env=SERVER_ENV),
            "triton": start_triton(root / "models", root / "triton.log", env=SERVER_ENV),
        }
        try:
            for s in servers.values():
                s.wait_ready()
                for name in names:
                    s.wait_ready(f"/v2/models/{name}/ready", timeout=120)
            for r in range(args.rounds):
                for i, (w, name) in enumerate(zip(args.windows, names, strict=True)):
                    order = ["sluice", "triton"] if (r + i) % 2 == 0 else ["triton", "sluice"]
                    for who in order:
                        res = measure(
                            servers[who], name, args.protocol, args.interval, root / "o.csv"
                        )
                        if res is not None:
                            got.setdefault((who, w), []).append(res)
                            print(
                                f"round {r + 1} window {w} us {who}: {res[0]:.0f}/s, "
                                f"queue {res[1]:.0f} us",
                                flush=True,
                            )
        finally:
            for s in servers.values():
                s.stop()
    print(
        f"\nadd_sub at c=1 over {args.protocol}, medians of {args.rounds} round(s); "
        "rest = 1e6 / throughput - queue (us a request)"
    )
    print("window us | sluice /s  queue   rest | triton /s  queue   rest | sluice/triton")
    for w in args.windows:
        cells = []
        for who in ("sluice", "triton"):
            runs = got.get((who, w))
            if not runs:
                cells.append(None)
                continue
            rate = statistics.median(x[0] for x in runs)
            queue = statistics.median(x[1] for x in runs)
            cells.append((rate, queue, 1e6 / rate - queue))
        line = f"{w:9d} |"
        for c in cells:
            line += " {:9.0f} {:6.0f} {:6.0f} |".format(*c) if c else "         -      -      - |"
        if cells[0] and cells[1]:
            line += f" {cells[0][0] / cells[1][0]:.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
