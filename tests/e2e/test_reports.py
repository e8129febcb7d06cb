"""Session reports read by real consumers: the JUnit XML with ``junitparser``
(the parser CI report tools build on), and the JSON report with ``json``.

The engine is run directly with ``--report`` flags (the SDK cannot pass flags),
fed a session of batches and a submitted plugin result built with the SDK's own
types, and stopped by closing stdin, as a crashed or finished client would.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from attest import TraceBuilder, expect
from junitparser import Failure, JUnitXml

ENGINE = os.environ.get("ATTEST_ENGINE_PATH", "")


def _trace(trace_id: str, message: str):
    return (TraceBuilder(agent_id="support-bot").set_trace_id(trace_id).set_output(message=message)
            .set_metadata(total_tokens=10, cost_usd=0.001, latency_ms=5).build())


def _request(i: int, method: str, params: dict) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params})


@pytest.fixture
def reports(tmp_path: Path) -> dict:
    ok = _trace("trc_report_ok", "Your refund RFD-001 is on its way.")
    bad = _trace("trc_report_bad", "Sorry, I cannot help.")
    chain_ok = expect(ok).output_contains("refund").output_contains("RFD-001").output_contains("missing", soft=True)
    chain_bad = expect(bad).output_contains("refund").output_not_contains("Sorry")
    lines = [
        _request(0, "initialize", {"sdk_name": "e2e", "sdk_version": "0", "protocol_version": 1, "required_capabilities": []}),
        _request(1, "evaluate_batch", {"trace": ok.to_dict(), "assertions": [a.to_dict() for a in chain_ok.assertions]}),
        _request(2, "evaluate_batch", {"trace": bad.to_dict(), "assertions": [a.to_dict() for a in chain_bad.assertions]}),
        _request(3, "submit_plugin_result", {"trace_id": "trc_report_bad", "plugin_name": "toxicity", "assertion_id": "tox",
                                            "result": {"status": "hard_fail", "score": 0.1, "explanation": "rude"}}),
    ]
    paths = {"junit": tmp_path / "attest.xml", "json": tmp_path / "attest.json"}
    # Only this test's settings: other modules export ATTEST_* variables (a
    # plugin directory, providers) that would make this engine load them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTEST_")}
    env["ATTEST_CACHE_DIR"] = str(tmp_path / "cache")
    done = subprocess.run(
        [ENGINE, "--log-level=warn", "--report", f"junit={paths['junit']}", "--report", f"json={paths['json']}"],
        input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=60, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 4, done.stdout
    return paths


def test_junit_report_loads_in_junitparser(reports) -> None:
    xml = JUnitXml.fromfile(str(reports["junit"]))
    suites = {s.name: s for s in xml}
    assert set(suites) == {"trc_report_ok", "trc_report_bad"}
    assert (xml.tests, xml.failures, xml.errors) == (6, 3, 0)
    ok, bad = suites["trc_report_ok"], suites["trc_report_bad"]
    assert (ok.tests, ok.failures) == (3, 0), "a soft failure is not a JUnit failure"
    assert (bad.tests, bad.failures) == (3, 3)
    failed = {case.name: case for case in bad if any(isinstance(r, Failure) for r in case.result)}
    assert "tox" in failed and failed["tox"].classname == "trc_report_bad.layer8.plugin:toxicity"
    soft = [case for case in ok if case.system_out and "soft_fail" in case.system_out]
    assert len(soft) == 1, [c.system_out for c in ok]


def test_json_report_counts_match_the_session(reports) -> None:
    report = json.loads(reports["json"].read_text())
    assert report["counts"] == {"total": 6, "passed": 2, "soft_failures": 1, "hard_failures": 3}
    assert report["by_layer"]["4"]["total"] == 5 and report["by_layer"]["8"]["hard_failures"] == 1
    # Batches run concurrently: traces are listed in the order their first batch finished.
    traces = {t["trace_id"]: t for t in report["traces"]}
    assert set(traces) == {"trc_report_ok", "trc_report_bad"}
    assert traces["trc_report_ok"]["counts"] == {"total": 3, "passed": 2, "soft_failures": 1, "hard_failures": 0}
    submitted = [r for r in traces["trc_report_bad"]["results"] if r["source"] == "submitted"]
    assert submitted == [{"assertion_id": "tox", "type": "plugin:toxicity", "layer": 8, "status": "hard_fail", "score": 0.1,
                          "explanation": "rude", "cost": 0.0, "duration_ms": 0, "source": "submitted"}]
