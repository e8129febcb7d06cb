#!/usr/bin/env python3
"""Per-step overhead of an ECP runtime, ours against the reference, in one run.

Both runtimes drive the same trivial ecp-sdk agent (the echo branch of
crates/attest-ecp/tests/agents/support_agent.py) through the same manifests:
one scenario of 1 step, and one of 1 + N steps, each step graded by one
text_match. Runs alternate (ours, reference, ours, ...) so drift in the
machine's speed hits both. Per-step time is (T[1+N] - T[1]) / N, which
removes each runtime's and the agent's start-up; the agent's own time per
step is measured inside the agent process and reported beside it.

    python3 scripts/bench_ecp.py --engine target/release/attest-engine \
        --venv target/ecp-venv [--steps 400] [--runs 7]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "crates/attest-ecp/tests/agents/support_agent.py"


def manifest(dir: Path, python: str, steps: int) -> Path:
    lines = [
        "manifest_version: v1",
        f"name: overhead {steps}",
        f"target: '{python} {AGENT}'",
        "scenarios:",
        "  - name: Echo",
        "    steps:",
    ]
    for i in range(steps):
        lines += [f"      - input: hello {i}", "        graders:", f"          - {{type: text_match, condition: contains, value: 'hello {i}'}}"]
    path = dir / f"m{steps}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return elapsed


def agent_step_seconds(python: str, steps: int) -> float:
    """The agent's own time per step: its handler called in-process."""
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import support_agent as a;"
        "ag = a.SupportAgent(); n = int(sys.argv[2]); t0 = time.perf_counter()\n"
        "for i in range(n): ag.step(f'hello {i}')\n"
        "print((time.perf_counter() - t0) / n)"
    )
    out = subprocess.run([python, "-c", code, str(AGENT.parent), str(steps)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


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
        small, large = manifest(dir, python, 1), manifest(dir, python, 1 + args.steps)
        runtimes = {
            "attest-engine ecp": lambda m: [args.engine, "ecp", "run", "-m", str(m), "--quiet", "--json-out", str(dir / "ours.json")],
            "ecp (reference)": lambda m: [reference, "run", "-m", str(m), "--json-out", str(dir / "ref.json")],
        }
        times: dict[str, dict[int, list[float]]] = {name: {1: [], 1 + args.steps: []} for name in runtimes}
        for name, cmd in runtimes.items():  # warm-up: page cache, .pyc files
            timed(cmd(small), env)
        for _ in range(args.runs):
            for m, n in ((small, 1), (large, 1 + args.steps)):
                for name, cmd in runtimes.items():
                    times[name][n].append(timed(cmd(m), env))
        agent = agent_step_seconds(python, 2000)
    print(f"{args.runs} alternating runs; medians; agent's own handler time {agent * 1e6:.1f} µs/step")
    print(f"| runtime | 1 step (s) | {1 + args.steps} steps (s) | per step (ms) | per step beyond the agent's own time (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name in runtimes:
        t1 = statistics.median(times[name][1])
        tn = statistics.median(times[name][1 + args.steps])
        per = (tn - t1) / args.steps
        print(f"| {name} | {t1:.3f} | {tn:.3f} | {per * 1e3:.3f} | {(per - agent) * 1e3:.3f} |")


if __name__ == "__main__":
    main()
