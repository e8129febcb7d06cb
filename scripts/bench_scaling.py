#!/usr/bin/env python3
"""Growth check: whole-process time of workloads at growing sizes, each beside
a floor of the same size that does linear work, so that a cost growing faster
than its input shows up as a ratio that grows with the size.

    python3 scripts/bench_scaling.py [--engine target/release/attest-engine] [--runs 3]

Workloads (docs/benchmarks.md, "Growth with input size"):
- report: `eval` over N one-assertion traces writing a JUnit report, against
  the same run without a report;
- tool checks: one batch of 20 `no_duplicates` / `required_tools` /
  `forbidden_tools` / `follows_transitions` assertions on a trace of N tool
  calls with N distinct names, against 20 `loop_detection` assertions on the
  same trace (one linear pass over the calls each);
- keywords: `keyword_any` with K absent keywords on K KiB of text, against
  one absent `contains` on the same text;
- agent order: `ordered_agents` with both groups naming their agent N/2 times
  on a tree of N timed steps, against `agent_called` on it;
- schema: an array of N numbers checked as `items: {type: string}` (every
  item fails), against `type: array` (passes).
"""

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"sdk_name": "bench", "sdk_version": "0", "protocol_version": 1, "required_capabilities": ["layers_1_4"]},
}
ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ATTEST_HISTORY": "off"}


def timed(argv, stdin=None, runs=3):
    """Median wall seconds of `runs` runs; each must exit 0."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        p = subprocess.run(argv, input=stdin, capture_output=True, env=ENV)
        times.append(time.perf_counter() - t)
        if p.returncode != 0:
            raise SystemExit(f"{argv[:3]} exited {p.returncode}: {p.stderr.decode()[-500:]}")
        # A request the engine refused would time only its refusal.
        if stdin is not None and '"result"' not in p.stdout.decode().splitlines()[-1]:
            raise SystemExit(f"the engine refused the workload: {p.stdout.decode()[-500:]}")
    return statistics.median(times)


def report_workload(engine, work, n, runs):
    traces = work / f"traces-{n}.jsonl"
    with traces.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"schema_version": 1, "trace_id": f"t{i}", "output": {"message": "refund ok"}}) + "\n")
    assertions = work / "one.json"
    assertions.write_text(json.dumps([{"assertion_id": "a", "type": "content", "spec": {"target": "output.message", "check": "contains", "value": "refund"}}]))
    config = work / "junit.toml"
    config.write_text(f'reports = ["junit={work / "out.xml"}"]\n')
    base = [engine, "eval", "--trace", str(traces), "--assertions", str(assertions), "--format", "json", "--no-history"]
    floor = timed(base, runs=runs)
    with_report = timed(base + ["--config", str(config)], runs=runs)
    return floor, with_report


def batch(trace, assertions):
    request = {"jsonrpc": "2.0", "id": 2, "method": "evaluate_batch", "params": {"trace": trace, "assertions": assertions}}
    return (json.dumps(INIT) + "\n" + json.dumps(request) + "\n").encode()


def tool_workload(engine, n, runs):
    names = [f"tool_{i}" for i in range(n)]
    trace = {"schema_version": 1, "trace_id": "t", "steps": [{"type": "tool_call", "name": x} for x in names], "output": {"message": "done"}}
    few = names[::max(1, n // 50)] + ["never_called"]
    pairs = [[names[i], names[i + 1]] for i in range(0, n - 1, 2)]
    checks = [
        {"check": "no_duplicates"},
        {"check": "required_tools", "tools": few},
        {"check": "forbidden_tools", "tools": few},
        {"check": "follows_transitions", "transitions": pairs},
    ]
    tools = [{"assertion_id": f"a{i}", "type": "trace", "spec": checks[i % 4]} for i in range(20)]
    linear = [{"assertion_id": f"l{i}", "type": "trace", "spec": {"check": "loop_detection", "tool": names[i], "max_repetitions": 1}} for i in range(20)]
    return timed([engine], batch(trace, linear), runs), timed([engine], batch(trace, tools), runs)


def keyword_workload(engine, k, runs):
    text = ("lorem ipsum dolor sit amet " * 38 + "\n") * k
    trace = {"schema_version": 1, "trace_id": "t", "output": {"message": "m", "body": text}}
    words = [f"zq{i}x" for i in range(k)]
    spec = {"target": "output.body", "check": "keyword_any", "values": words}
    floor = {"target": "output.body", "check": "contains", "value": "zq0x"}
    one = lambda s: [{"assertion_id": "a", "type": "content", "spec": s}]
    return timed([engine], batch(trace, one(floor)), runs), timed([engine], batch(trace, one(spec)), runs)


def order_workload(engine, n, runs):
    steps = [
        {"type": "tool_call", "name": "t", "agent_id": "a" if i < n // 2 else "b", "started_at_ms": i, "ended_at_ms": i + 0.5}
        for i in range(n)
    ]
    # A trace holds at most 10,000 steps: the tree holds them in sub-traces.
    per = 5_000
    calls = [
        {"type": "agent_call", "name": f"part{c}", "sub_trace": {"schema_version": 1, "trace_id": f"s{c}", "agent_id": f"part{c}", "steps": steps[c:c + per], "output": {"message": "m"}}}
        for c in range(0, n, per)
    ]
    trace = {"schema_version": 1, "trace_id": "t", "agent_id": "root", "steps": calls, "output": {"message": "m"}}
    spec = {"check": "ordered_agents", "groups": [["a"] * (n // 2), ["b"] * (n // 2)]}
    floor = {"check": "agent_called", "agent_id": "a"}
    one = lambda s: [{"assertion_id": "a", "type": "trace_tree", "spec": s}]
    return timed([engine], batch(trace, one(floor)), runs), timed([engine], batch(trace, one(spec)), runs)


def schema_workload(engine, n, runs):
    trace = {"schema_version": 1, "trace_id": "t", "output": {"message": "m", "items": [0] * n}}
    one = lambda schema: [{"assertion_id": "a", "type": "schema", "spec": {"target": "output.items", "schema": schema}}]
    floor = timed([engine], batch(trace, one({"type": "array"})), runs)
    return floor, timed([engine], batch(trace, one({"items": {"type": "string"}})), runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", default=str(REPO / "target/release/attest-engine"))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        # (title, sizes, workload, what the floor is, what is measured)
        workloads = [
            ("report: eval over N traces, with a JUnit report against without one", (10_000, 50_000, 100_000),
             lambda n: report_workload(args.engine, work, n, args.runs), "without", "with"),
            ("tool checks: 20 trace checks on N distinct tool calls, against 20 loop_detection checks", (1_000, 5_000, 10_000),
             lambda n: tool_workload(args.engine, n, args.runs), "loop_detection", "tool checks"),
            ("keywords: keyword_any with N absent keywords on N KiB of text, against one absent contains", (500, 1_000, 4_000),
             lambda n: keyword_workload(args.engine, n, args.runs), "contains", "keyword_any"),
            ("agent order: ordered_agents naming each agent N/2 times on N timed steps, against agent_called", (8_000, 16_000, 32_000),
             lambda n: order_workload(args.engine, n, args.runs), "agent_called", "ordered_agents"),
            ("schema: N array items each failing the schema, against the same array passing", (250_000, 1_000_000, 2_000_000),
             lambda n: schema_workload(args.engine, n, args.runs), "passing", "failing"),
        ]
        for title, sizes, workload, floor_name, name in workloads:
            print(title)
            for n in sizes:
                floor, t = workload(n)
                print(f"  N={n:>9}: {floor_name} {floor:6.3f} s, {name} {t:6.3f} s, ratio {t / floor:5.2f}")

if __name__ == "__main__":
    main()
