"""Failure diagnostics rendered by the real attest-ai 0.9.0 SDK.

Each test makes one assertion of a layer fail through the SDK (``attest.evaluate``),
lets the SDK parse the result (``AssertionResult.from_dict``) and renders it with the
SDK's own ``attest.cli.diagnostics.render_assertion_failure``. The rendered block must
name the layer (``L<n> <type>``) and carry ``expected:``, ``actual:`` and ``hint:`` lines
holding the real values of the failing trace.

Layers 5 and 6 use the fake OpenAI-compatible provider of ``test_layers_5_6`` (importing
it points the session's engine at it). Layer 8 uses the real ``tool-args`` component from
``plugins/dist`` (importing ``test_plugins`` points the session's engine at it), whose
``details.expected``/``actual``/``path``/``hint`` the engine maps onto the result fields.

The calibration test runs ``attest-engine calibrate --format json`` over label files with
edge cases and compares its statistics with the SDK's ``attest.calibration.compute_agreement``
on the same (human, judge) pairs.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from attest import expect
from attest.calibration import LabelPair, compute_agreement, prompt_hash
from attest.cli.diagnostics import render_assertion_failure

import test_layers_5_6 as paid  # noqa: F401  (sets the provider environment at import)
import test_plugins as plugins
from test_layers_1_4 import TRACES
from test_trace_tree import TREE


def render_only_failure(attest, chain) -> str:
    agent_result = attest.evaluate(chain)
    (result,) = agent_result.assertion_results
    assert result.status != "pass", result
    return render_assertion_failure(result)


def lines(block: str) -> dict[str, str]:
    """The labelled lines of a rendered block (``expected:`` → value)."""
    out = {}
    for line in block.splitlines():
        label, sep, value = line.strip().partition(":")
        if sep and label in {"expected", "actual", "hint", "trace path", "judge", "samples", "bias", "threshold", "calibrated", "prompt"}:
            out[label] = value.strip()
    return out


def check_block(block: str, layer: str) -> dict[str, str]:
    assert layer in block.splitlines()[0], block
    got = lines(block)
    for label in ("expected", "actual", "hint"):
        assert got.get(label), f"no {label}: line in\n{block}"
    return got


def test_layer1_schema_failure_renders_keyword_and_value(attest) -> None:
    schema = {"type": "object", "properties": {"confidence": {"type": "number", "maximum": 0.9}}}
    block = render_only_failure(attest, expect(TRACES["refund"]).output_field_matches_schema("structured", schema))
    got = check_block(block, "L1 schema")
    assert got["expected"].startswith("maximum: 0.9"), block
    assert got["actual"] == "output.structured.confidence = 0.95", block


def test_layer2_constraint_failure_renders_bound_and_value(attest) -> None:
    block = render_only_failure(attest, expect(TRACES["refund"]).cost_under(0.005))
    got = check_block(block, "L2 constraint")
    assert got["expected"] == "metadata.cost_usd lte 0.005", block
    assert got["actual"] == "metadata.cost_usd = 0.0067", block
    assert "0.0017" in got["hint"], block


def test_layer3_trace_failure_renders_expected_and_observed_tools(attest) -> None:
    block = render_only_failure(attest, expect(TRACES["refund"]).tools_called_in_order(["process_refund", "lookup_order"]))
    got = check_block(block, "L3 trace")
    assert got["expected"] == "contains_in_order: process_refund → lookup_order", block
    assert got["actual"] == "tool calls: lookup_order → process_refund", block
    assert got["hint"].startswith("`lookup_order` ran before `process_refund`"), block


def test_layer4_content_failure_renders_excerpt(attest) -> None:
    block = render_only_failure(attest, expect(TRACES["refund"]).output_contains("refund of $99.99"))
    got = check_block(block, "L4 content")
    assert got["expected"] == "contains 'refund of $99.99'", block
    assert "refund of $89.99" in got["actual"].lower(), block


def test_layer5_embedding_failure_renders_threshold_and_score(attest) -> None:
    message, _ = paid.unique(paid.UNRELATED)
    block = render_only_failure(attest, expect(paid.trace_with(message, "diag_emb")).output_similar_to(paid.REFERENCE, threshold=0.8))
    got = check_block(block, "L5 embedding")
    assert got["expected"].startswith("cosine similarity ≥ 0.8"), block
    # The agent's text, then the similarity and the model.
    assert got["actual"].startswith("'" + message[:20]), block
    assert float(got["actual"].split("(similarity ")[1].split(",")[0]) < 0.8, block


def test_layer6_judge_failure_renders_score_and_audit_trail(attest) -> None:
    message, nonce = paid.unique("A BAD answer.")
    chain = expect(paid.trace_with(message, "diag_judge")).passes_judge("answers the refund request", rubric="helpfulness", threshold=0.8)
    block = render_only_failure(attest, chain)
    got = check_block(block, "L6 llm_judge")
    assert got["expected"] == "judged score ≥ 0.8 (helpfulness)", block
    assert got["actual"].startswith("score 0.20"), block
    assert got["judge"].startswith("gpt-4.1 / helpfulness @ 2026-11.1"), block
    # The hash is the SDK's own prompt_hash over the prompt as sent: the
    # system message the provider received, less the verdict contract whose
    # nonce is new with every call, then the assertion's criteria.
    requests = paid.sent(nonce, "/v1/chat/completions")
    assert requests, "the judge was asked"
    sent = requests[0]["body"]["messages"][0]["content"]
    system = sent.split("\n\nYour verdict is one JSON object")[0]
    assert system != sent, "the verdict contract was sent"
    assert got["prompt"] == "#" + prompt_hash(system + "\nEvaluation criteria: answers the refund request"), block


def test_layer7_trace_tree_failure_renders_agent_path(attest) -> None:
    block = render_only_failure(attest, expect(TREE).delegation_depth(1))
    got = check_block(block, "L7 trace_tree")
    assert got["expected"] == "delegation depth ≤ 1", block
    assert got["actual"] == "depth 2 at orchestrator > researcher > fact_checker", block
    assert got["trace path"] == "orchestrator > researcher > fact_checker", block


@pytest.mark.skipif(not plugins.PLUGIN_DIR.is_dir(), reason="plugins/dist is not built (plugins/build.sh)")
def test_layer8_plugin_failure_renders_the_plugins_evidence(attest) -> None:
    chain = expect(plugins.TRACES["wrong_refund"]).plugin("tool-args", plugins.REFUND_ARGS)
    block = render_only_failure(attest, chain)
    got = check_block(block, "L8 plugin")
    assert got["expected"] == "'process_refund' called with amount equals 89.99; order_id matches /^ORD-\\d+$/", block
    assert got["actual"] == "amount=80, order_id='order-123'", block
    assert got["trace path"] == "steps[2].args", block
    assert got["hint"].startswith("Make the agent pass amount equals 89.99"), block


# --- calibrate ---------------------------------------------------------------

# Texts the fake judge scores: GOOD 0.9, BAD 0.2, anything else 0.5.
JUDGE = {"GOOD": 0.9, "BAD": 0.2, "MEH": 0.5}

LABEL_FILES = {
    "mixed": [("GOOD one", 1.0), ("BAD one", 0.0), ("GOOD two", 0.0), ("BAD two", 1.0), ("MEH", 1.0), ("GOOD three", 1.0)],
    "single_class": [("GOOD a", 1.0), ("BAD b", 1.0), ("MEH c", 1.0)],
    "ties": [("MEH a", 1.0), ("MEH b", 0.0), ("MEH c", 1.0), ("MEH d", 0.0)],
    "all_agree": [("GOOD a", 1.0), ("BAD b", 0.0), ("GOOD c", 0.9), ("BAD d", 0.1)],
    "all_disagree": [("GOOD a", 0.0), ("BAD b", 1.0), ("GOOD c", 0.2), ("BAD d", 0.8)],
}


def judge_score(text: str) -> float:
    return next(score for word, score in JUDGE.items() if word in text)


@pytest.mark.parametrize("name", sorted(LABEL_FILES))
@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_calibrate_matches_sdk_compute_agreement(name: str, suffix: str, tmp_path: Path) -> None:
    rows = LABEL_FILES[name]
    # Unique texts so no cached verdict of another run is reused.
    rows = [(f"{text} {paid.nonce()}", label) for text, label in rows]
    path = tmp_path / f"{name}.{suffix}"
    if suffix == "jsonl":
        path.write_text("\n".join(json.dumps({"input": t, "human_label": h}) for t, h in rows) + "\n")
    else:
        path.write_text("input,human_label\n" + "".join(f"{t},{h}\n" for t, h in rows))
    engine = os.environ["ATTEST_ENGINE_PATH"]
    out = subprocess.run(
        [engine, "--log-level=warn", "calibrate", "--labels", str(path), "--rubric", "helpfulness", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ATTEST_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    want = compute_agreement([LabelPair(human=h, judge=judge_score(t)) for t, h in rows], 0.5)
    assert report["label_count"] == want.n
    assert report["agreement"] == pytest.approx(want.agreement, abs=1e-12)
    assert report["cohen_kappa"] == pytest.approx(want.cohen_kappa, abs=1e-12)
    assert report.get("roc_auc", 0.0) == pytest.approx(want.roc_auc, abs=1e-12)
    assert report["rubric_name"] == "helpfulness"
