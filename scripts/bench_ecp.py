#!/usr/bin/env python3
"""Per-step overhead of an ECP runtime, ours against the reference, in one run.

Both runtimes drive the same trivial ecp-sdk agent (scripts/bench_ecp_agent.py,
an echo) through the same manifests: one scenario of 1 step, and one of
1 + N steps, each step graded by one text_match. Runs alternate (ours,
reference, ours, ...) so drift in the machine's speed hits both. Per-step
time is (T[1+N] - T[1]) / N, which removes each runtime's and the agent's
start-up. The agent writes its own CPU time after each step; the same
difference of it over N steps is the agent's own time per step, and what is
left is the runtime's overhead per step (its own work plus the round trip).

    python3 scripts/bench_ecp.py --engine target/release/attest-engine \
        --venv target/ecp-venv [--steps 400] [--runs 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "scripts/bench_ecp_agent.py"


def manifest(dir: Path, python: str, steps: int, cpu_file: Path) -> Path:
    lines = [
        "manifest_version: v1",
        f"name: overhead {steps}",
        f"target: '{python} {AGENT} {cpu_file}'",
        "scenarios:",
        "  - name: Echo",
        "    steps:",
    ]
    for i in range(steps):
        lines += [f"      - input: hello {i}", "        graders:", f"          - {{type: text_match, condition: equals, value: 'Echo: hello {i}'}}"]
    path = dir / f"m{steps}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(cmd: list[str], env: dict[str, str], cpu_file: Path) -> tuple[float, float]:
    """Wall seconds of the whole run, and the agent's CPU seconds."""
    cpu_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return elapsed, float(cpu_file.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default=str(REPO / "target/release/attest-engine"))
    ap.add_argument("--venv", default=str(REPO / "target/ecp-venv"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    venv = Path(args.venv)
    python = str(venv / "bin/python")
    reference = str(venv / "bin/ecp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECP_")}
    with tempfile.TemporaryDirectory() as d:
        dir = Path(d)
        cpu_file = dir / "agent-cpu"
        small, large = manifest(dir, python, 1, cpu_file), manifest(dir, python, 1 + args.steps, cpu_file)
        runtimes = {
            "attest-engine ecp": lambda m: [args.engine, "ecp", "run", "-m", str(m), "--quiet", "--json-out", str(dir / "ours.json")],
            "ecp (reference)": lambda m: [reference, "run", "-m", str(m), "--json-out", str(dir / "ref.json")],
        }
        runs: dict[str, dict[int, list[tuple[float, float]]]] = {name: {1: [], 1 + args.steps: []} for name in runtimes}
        for name, cmd in runtimes.items():  # warm-up: page cache, .pyc files
            timed(cmd(small), env, cpu_file)
        for _ in range(args.runs):
            for m, n in ((small, 1), (large, 1 + args.steps)):
                for name, cmd in runtimes.items():
                    runs[name][n].append(timed(cmd(m), env, cpu_file))
        for name in runtimes:
            report = json.loads((dir / ("ours.json" if name.startswith("attest") else "ref.json")).read_text())
            if report["passed"] != report["total"]:
                sys.exit(f"{name}: {report['passed']}/{report['total']} checks passed; the bench expects every echo to pass")
    print(f"{args.runs} alternating runs of 1 and {1 + args.steps} steps; medians")
    print("| runtime | 1 step (s) | per step (ms) | agent's own CPU per step (ms) | runtime overhead per step (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name in runtimes:
        t1 = statistics.median(w for w, _ in runs[name][1])
        tn = statistics.median(w for w, _ in runs[name][1 + args.steps])
        c1 = statistics.median(c for _, c in runs[name][1])
        cn = statistics.median(c for _, c in runs[name][1 + args.steps])
        per, agent = (tn - t1) / args.steps, (cn - c1) / args.steps
        print(f"| {name} | {t1:.3f} | {per * 1e3:.3f} | {agent * 1e3:.3f} | {(per - agent) * 1e3:.3f} |")

if __name__ == "__main__":
    main()
