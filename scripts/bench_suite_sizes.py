#!/usr/bin/env python3
"""Cost per assertion at 1, 8, 64 and 512 assertions per batch, whole process.

For each check kind (regex_match, a schema with a `pattern`, contains, a
constraint) and each suite size N, the engine gets batches of N distinct
assertions of that kind (the same N specs in every batch, as an SDK suite
sends them), first one batch at a time (send, wait for the answer, as the
SDK does), then pipelined (every batch written at once). It reports the
microseconds per assertion (wall time over batches x N, after a first batch
that compiles) and the process's peak RSS (VmHWM). A flat column means the
cost per assertion does not grow with the suite.

    python3 scripts/bench_suite_sizes.py --engine target/release/attest-engine [--batches 200]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACE = json.loads((REPO / "engine/benches/refund_workload.json").read_text())["trace"]
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"sdk_name": "bench", "sdk_version": "0", "protocol_version": 1, "required_capabilities": ["layers_1_4"]}}
SIZES = (1, 8, 64, 512)


def assertion(kind: str, i: int) -> dict:
    """The i-th distinct assertion of a kind (distinct specs: each compiles).

    Patterns are a Unicode `.` under a bounded repeat of 100 to 163, some 100 to
    200 KiB of program each whatever the suite's size, so that the columns
    compare suites of the same patterns, not larger ones."""
    if kind == "regex":
        spec = {"target": "output.message", "check": "regex_match", "value": f"refund(?:ed)? .{{0,{100 + i % 64}}}order|RFD-{i:04}"}
        return {"assertion_id": f"r{i}", "type": "content", "spec": spec}
    if kind == "schema pattern":
        schema = {"type": "object", "properties": {"message": {"type": "string", "pattern": f"^(?:Your|We) .{{0,{100 + i % 64}}}$|^ID{i}$"}}}
        return {"assertion_id": f"s{i}", "type": "schema", "spec": {"target": "output", "schema": schema}}
    if kind == "contains":
        return {"assertion_id": f"c{i}", "type": "content", "spec": {"target": "output.message", "check": "contains", "value": f"refund{'' if i == 0 else i}"}}
    if kind == "constraint":
        return {"assertion_id": f"k{i}", "type": "constraint", "spec": {"field": "metadata.cost_usd", "operator": "lte", "value": 1 + i / 1000}}
    raise ValueError(kind)


def run(engine: str, kind: str, n: int, batches: int, pipelined: bool) -> tuple[float, int] | None:
    """Microseconds per assertion and peak MiB; None when the engine refuses the batch."""
    env = dict(os.environ, ATTEST_HISTORY="false")
    p = subprocess.Popen([engine, "--log-level=warn"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert p.stdin and p.stdout
    p.stdin.write((json.dumps(INIT) + "\n").encode())
    p.stdin.flush()
    p.stdout.readline()
    assertions = [assertion(kind, i) for i in range(n)]
    line = lambda k: (json.dumps({"jsonrpc": "2.0", "id": k, "method": "evaluate_batch",
                                  "params": {"trace": TRACE, "assertions": assertions}}) + "\n").encode()
    # The first batch compiles; the rest show what a suite costs once compiled.
    p.stdin.write(line(0))
    p.stdin.flush()
    first = json.loads(p.stdout.readline())
    if "error" in first:
        p.kill()
        p.wait()
        return None
    t0 = time.perf_counter()
    if pipelined:
        p.stdin.write(b"".join(line(k) for k in range(1, batches + 1)))
        p.stdin.flush()
        for _ in range(batches):
            p.stdout.readline()
    else:
        for k in range(1, batches + 1):
            p.stdin.write(line(k))
            p.stdin.flush()
            p.stdout.readline()
    elapsed = time.perf_counter() - t0
    with open(f"/proc/{p.pid}/status") as f:
        hwm = next(int(l.split()[1]) for l in f if l.startswith("VmHWM"))
    p.kill()
    p.wait()
    return elapsed * 1e6 / (batches * n), hwm // 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="target/release/attest-engine")
    ap.add_argument("--batches", type=int, default=200, help="batches per measurement (fewer at 512: a fifth)")
    args = ap.parse_args()
    print("| check | mode | " + " | ".join(f"{n} per batch" for n in SIZES) + " |")
    print("|---|---|" + "---:|" * len(SIZES))
    for kind in ("regex", "schema pattern", "contains", "constraint"):
        for pipelined in (False, True):
            cells = []
            for n in SIZES:
                batches = max(20, args.batches // (5 if n >= 512 else 1))
                measured = run(args.engine, kind, n, batches, pipelined)
                cells.append("refused" if measured is None else f"{measured[0]:.1f} µs, {measured[1]} MiB")
            print(f"| {kind} | {'pipelined' if pipelined else 'one at a time'} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
