#!/usr/bin/env python3
"""Response time of `attest-engine view` on a large history, whole processes.

Fills a fresh history with N results through the real binary (`collect --jsonl`
over refund traces with the 8 layer 1-4 assertions of the throughput bench;
one trace in 25 breaks the flow, so its evaluation fails and is kept), then
starts `attest-engine view` on it and times each page over HTTP:

- the overview's first load (it sums the whole history once) and later loads
  (served from that sum until the file changes);
- the overview filtered and sorted, an assertion, a failing evaluation, the
  runs and two runs compared;
- floors in the same run: the viewer's built-in stylesheet (the server's own
  cost per request) and a plain SQLite scan of the batches table from Python
  (the least any reader pays to look at every result once).

    python3 scripts/bench_view.py --engine target/release/attest-engine [--results 1000000] [--repeat 20]
"""
from __future__ import annotations

import argparse
import json
import re
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = json.loads((REPO / "engine/benches/refund_workload.json").read_text())


def trace(i: int) -> dict:
    t = json.loads(json.dumps(WORKLOAD["trace"]))
    t["trace_id"] = f"trc_{i}"
    if i % 25 == 0:
        # Tools out of order: the ordering assertions fail, and the evaluation is kept.
        t["steps"] = list(reversed(t["steps"]))
    return t


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str) -> tuple[float, int, bytes]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as r:
        body = r.read()
        status = r.status
    return time.perf_counter() - start, status, body


def timed(url: str, repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        t, status, body = fetch(url)
        assert status == 200, (url, status)
        times.append(t)
    return {"median_ms": round(statistics.median(times) * 1000, 2), "max_ms": round(max(times) * 1000, 2), "bytes": len(body)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default=str(REPO / "target/release/attest-engine"))
    ap.add_argument("--results", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    # 1: a batch per result, the worst case for the overview's one pass.
    ap.add_argument("--assertions", type=int, default=len(WORKLOAD["assertions"]), help="assertions per trace (1-8)")
    args = ap.parse_args()
    # The tool-order check first: it is the one a reversed trace fails.
    ordered = sorted(WORKLOAD["assertions"], key=lambda a: a["spec"].get("check") != "contains_in_order")
    assertions = ordered[: max(1, min(args.assertions, len(ordered)))]
    per_trace = len(assertions)
    traces = args.results // per_trace
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        history = work / "history.sqlite3"
        config = work / "attest.toml"
        config.write_text(f'history_path = "{history}"\nhistory_max_rows = {args.results * 2}\nhistory_max_mib = 4096\n')
        rules = work / "rules.json"
        rules.write_text(json.dumps({"rules": [{"name": "refund", "assertions": assertions}]}))
        # Two halves, two collect runs: the comparison has two runs to compare.
        halves = [work / "first.jsonl", work / "second.jsonl"]
        for half, path in enumerate(halves):
            with path.open("w") as f:
                for i in range(half * traces // 2, (half + 1) * traces // 2):
                    f.write(json.dumps(trace(i)) + "\n")
        env = {"ATTEST_CONFIG": str(config), "PATH": "/usr/bin:/bin"}
        start = time.perf_counter()
        for src in halves:
            subprocess.run([args.engine, "--log-level=warn", "collect", "--rules", str(rules), "--jsonl", str(src)],
                           check=True, env=env, stdin=subprocess.DEVNULL)
        fill_s = time.perf_counter() - start

        # The data floor: every batch read once by a plain SQLite client.
        conn = sqlite3.connect(f"file:{history}?mode=ro", uri=True)
        start = time.perf_counter()
        rows = conn.execute("SELECT id, recorded_at_ms, suite, run, results, costs FROM batches").fetchall()
        scan_ms = (time.perf_counter() - start) * 1000
        stored = conn.execute("SELECT SUM(size) FROM batches").fetchone()[0]
        kept = conn.execute("SELECT MAX(id) FROM kept").fetchone()[0]
        runs = [r[0] for r in conn.execute("SELECT id FROM runs ORDER BY id")]
        conn.close()
        del rows

        port = free_port()
        view = subprocess.Popen([args.engine, "--log-level=info", "view", "--history", str(history), "--addr", f"127.0.0.1:{port}"],
                                env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            # Its log line that says where it serves: the page is up.
            while "url" not in json.loads(view.stderr.readline() or '{"url":0}'):
                pass
            base = f"http://127.0.0.1:{port}"
            first_s, status, body = fetch(base + "/")
            assert status == 200
            shown = int(re.search(rb'id="stat-results">(\d+)<', body).group(1))
            assert shown == stored, (shown, stored)
            assertion = int(re.search(rb'href="/assertion/(\d+)"', body).group(1))
            a, b = runs[0], runs[-1]
            report = {
                "results": stored,
                "results_per_batch": per_trace,
                "fill_seconds": round(fill_s, 1),
                "sqlite_scan_floor_ms": round(scan_ms, 1),
                "overview_first_load_ms": round(first_s * 1000, 1),
                "overview": timed(base + "/", args.repeat),
                "overview_filtered_sorted": timed(base + "/?q=refund&status=failing&sort=pass_rate&dir=desc", args.repeat),
                "assertion": timed(f"{base}/assertion/{assertion}", args.repeat),
                "evaluation": timed(f"{base}/evaluation/{kept}", args.repeat),
                "runs": timed(base + "/runs", args.repeat),
                "compare": timed(f"{base}/compare?a={a}&b={b}", max(3, args.repeat // 4)),
                "stylesheet_floor": timed(base + "/assets/style.css", args.repeat),
            }
            print(json.dumps(report, indent=2))
        finally:
            view.terminate()
            view.wait(timeout=10)


if __name__ == "__main__":
    main()
