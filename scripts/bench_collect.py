#!/usr/bin/env python3
"""End-to-end traces per second of continuous evaluation, whole processes.

Generates N refund traces and a rules file with the 8 layer 1-4 assertions of
the throughput bench (engine/benches/refund_workload.json), then
times, from the first process start until every result is in the sink:

- embedded: one `attest-engine collect --jsonl traces.jsonl --results-jsonl`
  process (reads, evaluates, writes the JSONL sink and the history), until exit;
- NATS with 1 and 2 workers: a fresh `nats-server -js`, a sink
  (`worker --role sink`), W evaluation workers, and `collect --jsonl --nats`
  publishing; until the sink has written N x 8 result lines.

Each scenario runs with the result history on (a fresh SQLite file, or with
`--history-url` the shared PostgreSQL store, emptied before each run) and off
(`--no-history`), alternating, and reports medians.

    python3 scripts/bench_collect.py --engine target/release/attest-engine \
        [--traces 20000] [--runs 3] [--nats-server /usr/sbin/nats-server] \
        [--history-url postgres://attest@127.0.0.1:5432/bench --psql /usr/bin/psql]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The throughput bench's workload: one refund trace and 8 layer 1-4 assertions.
WORKLOAD = json.loads((REPO / "engine/benches/refund_workload.json").read_text())
ASSERTIONS = WORKLOAD["assertions"]


def trace(i: int) -> dict:
    return dict(WORKLOAD["trace"], trace_id=f"trc_{i:08}")


def lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The shared PostgreSQL history, when measured (--history-url).
HISTORY_URL: str | None = None
PSQL = "psql"


def empty_shared_history() -> None:
    if HISTORY_URL:
        subprocess.run([PSQL, HISTORY_URL, "-q", "-c", "TRUNCATE attest_results"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Run:
    def __init__(self, engine: str, work: Path, history: bool):
        self.engine, self.work, self.history = engine, work, history
        self.env = dict(os.environ, ATTEST_CACHE_DIR=str(work / "cache"))
        if history and HISTORY_URL:
            self.env["ATTEST_HISTORY_URL"] = HISTORY_URL
            empty_shared_history()
        self.procs: list[subprocess.Popen] = []
        self.cpu: dict[str, float] = {}

    def cmd(self, *args: str) -> list[str]:
        return [self.engine, "--log-level=warn", *([] if self.history else ["--no-history"]), *args]

    def spawn(self, args: list[str], name: str) -> subprocess.Popen:
        p = subprocess.Popen(args, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=open(self.work / f"{name}.stderr", "w"))
        p.name = name
        self.procs.append(p)
        return p

    def exited(self, p: subprocess.Popen) -> int | None:
        """`p`'s exit code once it has ended (its CPU time kept), else None."""
        if p.name not in self.cpu:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if not pid:
                return None
            self.cpu[p.name] = usage.ru_utime + usage.ru_stime
            p.returncode = os.waitstatus_to_exitcode(status)
        return p.returncode

    def stop(self) -> dict[str, float]:
        """Stops every process; returns each one's CPU seconds (user + system)."""
        for p in self.procs:
            if p.name not in self.cpu and self.exited(p) is None:
                p.terminate()
        for p in self.procs:
            if p.name not in self.cpu:
                self.cpu[p.name] = reap(p)
        return self.cpu


def reap(p: subprocess.Popen) -> float:
    """Waits for `p` (killing it after 30 s) and returns its CPU seconds."""
    deadline = time.time() + 30
    while True:
        pid, _, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            p.returncode = 0
            return usage.ru_utime + usage.ru_stime
        if time.time() > deadline:
            p.kill()
            _, _, usage = os.wait4(p.pid, 0)
            p.returncode = -9
            return usage.ru_utime + usage.ru_stime
        time.sleep(0.02)


CPU: dict[str, list[float]] = {}


def note_cpu(scenario: str, cpu: dict[str, float], n: int) -> None:
    for name, secs in cpu.items():
        CPU.setdefault(f"{scenario}: {name}", []).append(secs * 1e6 / n)


def embedded(engine: str, work: Path, rules: Path, traces: Path, n: int, history: bool) -> float:
    run = Run(engine, work, history)
    out = work / "results.jsonl"
    t0 = time.perf_counter()
    p = run.spawn(run.cmd("collect", "--rules", str(rules), "--jsonl", str(traces), "--results-jsonl", str(out)), "collect")
    cpu = reap(p)
    elapsed = time.perf_counter() - t0
    if lines(out) != n * len(ASSERTIONS):
        sys.exit(f"embedded run failed ({lines(out)} results):\n{(work / 'collect.stderr').read_text()[-3000:]}")
    if not history:
        note_cpu("embedded", {"collect": cpu}, n)
    return elapsed


def distributed(engine: str, nats: str, work: Path, rules: Path, traces: Path, n: int, workers: int, history: bool) -> float:
    server, url = start_nats(nats, work)
    run = Run(engine, work, history)
    out = work / "results.jsonl"
    try:
        t0 = time.perf_counter()
        run.spawn(run.cmd("worker", "--role", "sink", "--nats", url, "--results-jsonl", str(out)), "sink")
        for w in range(workers):
            run.spawn(run.cmd("worker", "--nats", url, "--rules", str(rules)), f"worker{w}")
        collector = run.spawn(run.cmd("collect", "--rules", str(rules), "--jsonl", str(traces), "--nats", url), "collect")
        want = n * len(ASSERTIONS)
        deadline = time.time() + 600
        while lines(out) < want:
            if time.time() > deadline or (run.exited(collector) not in (None, 0)):
                sys.exit(f"distributed run stalled at {lines(out)}/{want}: {(work / 'collect.stderr').read_text()[-2000:]}")
            time.sleep(0.01)
        elapsed = time.perf_counter() - t0
    finally:
        cpu = run.stop()
        server.terminate()
        cpu["nats-server"] = reap(server)
    if not history:
        note_cpu(f"NATS, {workers} worker(s)", cpu, n)
    return elapsed


def start_nats(nats: str, work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen([nats, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(work / "js")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return server, f"nats://127.0.0.1:{port}"
        except OSError:
            if time.time() > deadline:
                sys.exit("nats-server did not start")
            time.sleep(0.05)


def floor(floor_bin: str, nats: str, work: Path, n: int, work_bytes: int, result_bytes: int) -> dict:
    """The broker's own ceiling: the same flow of messages of the same sizes, no evaluation."""
    server, url = start_nats(nats, work)
    try:
        out = subprocess.run([floor_bin, url, str(n), str(work_bytes), str(result_bytes), "1"],
                             capture_output=True, text=True, timeout=600, check=True)
    finally:
        server.terminate()
        server_cpu = reap(server)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["server_cpu_us_per_message"] = server_cpu * 1e6 / n
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="target/release/attest-engine")
    ap.add_argument("--traces", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--nats-server", default=shutil.which("nats-server") or "/usr/sbin/nats-server")
    ap.add_argument("--skip-nats", action="store_true")
    ap.add_argument("--floor", help="the nats_floor example binary (target/release/examples/nats_floor): also measure the broker's own ceiling")
    ap.add_argument("--history-url", help="history on = this PostgreSQL database (emptied before each run) instead of a SQLite file")
    ap.add_argument("--psql", default=shutil.which("psql") or "psql")
    args = ap.parse_args()
    global HISTORY_URL, PSQL
    HISTORY_URL, PSQL = args.history_url, args.psql
    with tempfile.TemporaryDirectory(prefix="attest-bench-collect-") as d:
        base = Path(d)
        rules = base / "rules.json"
        rules.write_text(json.dumps({"rules": [{"name": "refund", "assertions": ASSERTIONS}]}))
        traces = base / "traces.jsonl"
        with open(traces, "w") as f:
            for i in range(args.traces):
                f.write(json.dumps(trace(i)) + "\n")
        scenarios = [("embedded", lambda w, h: embedded(args.engine, w, rules, traces, args.traces, h))]
        if not args.skip_nats:
            for workers in (1, 2):
                scenarios.append((f"NATS, {workers} worker{'s' if workers > 1 else ''}",
                                  lambda w, h, k=workers: distributed(args.engine, args.nats_server, w, rules, traces, args.traces, k, h)))
        where = "the shared PostgreSQL history" if args.history_url else "a SQLite history file"
        print(f"{args.traces} traces x {len(ASSERTIONS)} layer 1-4 assertions; median of {args.runs} alternating runs; until every result is in the sink; history on = {where}")
        print("| mode | history off (traces/s) | history on (traces/s) | history-on time / off |")
        print("|---|---:|---:|---:|")
        for name, fn in scenarios:
            times = {False: [], True: []}
            for r in range(args.runs):
                for history in (False, True):
                    work = base / f"{name.replace(' ', '_').replace(',', '')}-{r}-{history}"
                    work.mkdir()
                    times[history].append(fn(work, history))
                    shutil.rmtree(work)
            off, on = statistics.median(times[False]), statistics.median(times[True])
            print(f"| {name} | {args.traces / off:,.0f} | {args.traces / on:,.0f} | {on / off:.2f} |", flush=True)
        if args.floor and not args.skip_nats:
            # The sizes of the product's messages: a work message is the trace
            # and its rule names; a results message, the trace's 8 records.
            work_bytes = len(json.dumps({"trace": trace(0), "rules": ["refund"], "rules_version": "0" * 16}))
            result_bytes = len(ASSERTIONS) * 330
            floors = []
            for r in range(args.runs):
                work = base / f"floor-{r}"
                work.mkdir()
                floors.append(floor(args.floor, args.nats_server, work, args.traces, work_bytes, result_bytes))
                shutil.rmtree(work)
            best = sorted(floors, key=lambda f: f["per_second"])[len(floors) // 2]
            print(f"| broker floor (async-nats, {work_bytes} B work / {result_bytes} B results messages, no evaluation) | {best['per_second']:,.0f} | | |")
            CPU["broker floor: client (publisher + worker + sink in one process)"] = [best["cpu_us_per_message"]]
            CPU["broker floor: nats-server"] = [best["server_cpu_us_per_message"]]
        print()
        print("CPU per trace, history off (median, µs):")
        print("| process | µs per trace |")
        print("|---|---:|")
        for name, values in CPU.items():
            print(f"| {name} | {statistics.median(values):,.0f} |")


if __name__ == "__main__":
    main()
