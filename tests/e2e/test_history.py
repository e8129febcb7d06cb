"""End-to-end tests of the result history through the real attest-ai 0.9.0 SDK.

Results are evaluated with the SDK pytest plugin's ``attest`` fixture, and drift
is asked for with the SDK's own ``AttestClient.query_drift`` (0.9.0 has the
wrapper; it returns an ``attest._proto.types.DriftReport``).

Isolation: every test module shares one session engine, and ``test_plugins.py``
sets ``ATTEST_CACHE_DIR`` (the compiled-plugin cache) at import time, so this
module must not change the cache directory. Instead it:

- points ``ATTEST_CONFIG`` at a temporary config file whose only key is
  ``history_path``, so the history file is private to this run and nothing is
  written to ``~/.attest`` (unless ``ATTEST_CONFIG`` is already set: then it is
  left alone); the directory is removed at exit, and
- gives every trace an ``agent_id`` unique to this run. The fingerprint that
  pools results mixes in the agent id, so even a shared history file cannot
  mix these results with anyone else's.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from attest import Trace, TraceBuilder, expect
from attest._proto.codec import ProtocolError
from attest._proto.types import Assertion, DriftReport

if "ATTEST_CONFIG" not in os.environ:
    _HISTORY_DIR = Path(tempfile.mkdtemp(prefix="attest-e2e-history-"))
    _CONFIG = _HISTORY_DIR / "attest.toml"
    _CONFIG.write_text(f"history_path = {str(_HISTORY_DIR / 'history.sqlite3')!r}\n")
    os.environ["ATTEST_CONFIG"] = str(_CONFIG)
    # Removed when the interpreter exits, after the session engine has stopped.
    atexit.register(shutil.rmtree, _HISTORY_DIR, ignore_errors=True)

RUN = uuid.uuid4().hex[:12]
KEYWORDS = ["alpha", "beta", "gamma", "delta"]


def _trace(agent: str, found: int) -> Trace:
    """A trace of ``agent`` whose message mentions the first ``found`` keywords (score found/4)."""
    message = " ".join(KEYWORDS[:found]) + " and filler" if found else "nothing relevant"
    return (
        TraceBuilder(agent_id=f"{agent}-{RUN}")
        .set_trace_id(f"trc_{agent}_{found}")
        .set_output(message=message)
        .build()
    )


def _stats(newest_first: list[float]) -> tuple[float, float]:
    mean = sum(newest_first) / len(newest_first)
    return mean, math.sqrt(sum((s - mean) ** 2 for s in newest_first) / len(newest_first))


def _drift(attest, assertion_id: str, window_size: int = 50) -> DriftReport:
    return attest._run_on_engine_loop(attest.client.query_drift(assertion_id, window_size=window_size))


def _check(report: DriftReport, assertion_id: str, newest_first: list[float], status: str) -> None:
    mean, stddev = _stats(newest_first)
    assert report.assertion_id == assertion_id
    assert report.count == len(newest_first)
    assert report.mean == pytest.approx(mean, abs=1e-9)
    assert report.stddev == pytest.approx(stddev, abs=1e-9)
    assert report.latest_score == pytest.approx(newest_first[0], abs=1e-12)
    assert report.deviation == pytest.approx(newest_first[0] - mean, abs=1e-9)
    assert report.status == status


def test_query_drift_pools_sdk_runs_with_fresh_assertion_ids(attest) -> None:
    """The SDK makes a new random assertion_id per run; history pools them by fingerprint."""
    ids = []
    for found in [4, 3, 0, 2]:
        chain = expect(_trace("pool", found)).output_has_all_keywords(KEYWORDS)
        result = attest.evaluate(chain)
        [r] = result.assertion_results
        assert r.score == pytest.approx(found / 4)
        assert r.status == ("pass" if found == 4 else "hard_fail")
        ids.append(chain.assertions[0].assertion_id)
    assert len(set(ids)) == 4, "the SDK generates a fresh id per assertion"
    # Chronological 1 .75 0 .5 -> newest first .5 0 .75 1: mean .5625; .5 is not drift.
    newest_first = [0.5, 0.0, 0.75, 1.0]
    for assertion_id in (ids[0], ids[-1]):
        _check(_drift(attest, assertion_id), assertion_id, newest_first, "ok")
    _check(_drift(attest, ids[0], window_size=2), ids[0], [0.5, 0.0], "ok")

    # One more run scoring 0: newest first 0 .5 0 .75 1, mean .45, σ ≈ .393: drift.
    chain = expect(_trace("pool", 0)).output_has_all_keywords(KEYWORDS)
    attest.evaluate(chain)
    latest = chain.assertions[0].assertion_id
    _check(_drift(attest, latest), latest, [0.0, 0.5, 0.0, 0.75, 1.0], "drift_detected")


def test_soft_does_not_split_the_history_but_another_agent_does(attest) -> None:
    soft = expect(_trace("soft", 1)).output_has_all_keywords(KEYWORDS, soft=True)
    assert attest.evaluate(soft).assertion_results[0].status == "soft_fail"
    hard = expect(_trace("soft", 3)).output_has_all_keywords(KEYWORDS)
    attest.evaluate(hard)
    _check(_drift(attest, hard.assertions[0].assertion_id), hard.assertions[0].assertion_id, [0.75, 0.25], "ok")
    other = expect(_trace("soft-other", 2)).output_has_all_keywords(KEYWORDS)
    attest.evaluate(other)
    _check(_drift(attest, other.assertions[0].assertion_id), other.assertions[0].assertion_id, [0.5], "ok")


def test_query_drift_for_an_unknown_id_is_no_data(attest) -> None:
    report = _drift(attest, f"never-{RUN}", window_size=7)
    assert (report.assertion_id, report.count, report.status) == (f"never-{RUN}", 0, "no_data")
    assert (report.mean, report.stddev, report.latest_score, report.deviation) == (0.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("window_size", [-1, 10_001])
def test_query_drift_with_a_bad_window_is_a_1002(attest, window_size) -> None:
    with pytest.raises(ProtocolError) as err:
        _drift(attest, "anything", window_size=window_size)
    assert err.value.code == 1002
    # The SDK's ErrorData keeps error_type, retryable and detail (not field).
    assert err.value.data is not None and err.value.data.error_type == "ASSERTION_ERROR"
    assert "window_size" in err.value.error_message and "window_size" in err.value.data.detail
    # The engine keeps serving.
    assert _drift(attest, f"never-{RUN}").status == "no_data"


def test_dynamic_threshold_judges_a_low_score_against_a_low_history(attest) -> None:
    """threshold "dynamic" on a content assertion (the SDK's DSL only offers it on
    layers 5 and 6, so the assertion is built by hand)."""

    def dynamic(found: int) -> tuple[str, float]:
        chain = expect(_trace("dyn", found))
        # The spec output_has_all_keywords sends, plus the threshold.
        spec = {"target": "output.message", "check": "keyword_all", "values": KEYWORDS, "case_sensitive": False, "soft": False}
        chain._assertions.append(
            Assertion(assertion_id=f"dyn_{uuid.uuid4().hex[:8]}", type="content", spec={**spec, "threshold": "dynamic"})
        )
        [r] = attest.evaluate(chain).assertion_results
        return r.status, r.explanation

    # Ten earlier scores of .25 from the plain keyword check (same fingerprint:
    # threshold is not part of it) ...
    for _ in range(9):
        attest.evaluate(expect(_trace("dyn", 1)).output_has_all_keywords(KEYWORDS))
    # ... with nine, the static band still applies: .25 hard-fails.
    status, why = dynamic(1)
    assert status == "hard_fail"
    assert "static band (9 of the 10 earlier scores needed are in history)" in why
    # With ten (all .25, σ 0), .25 passes and 0 fails.
    status, why = dynamic(1)
    assert status == "pass", why
    assert "Dynamic threshold from history: score 0.2500 vs mean 0.2500" in why
    status, why = dynamic(0)
    assert status == "hard_fail", why
    assert "over the last 11 scores: hard_fail." in why
