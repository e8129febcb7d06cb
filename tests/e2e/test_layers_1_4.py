"""End-to-end tests of assertion layers 1-4 through the real attest-ai 0.9.0 SDK.

Every test builds assertions with the SDK's ``expect()`` DSL and evaluates
them with the SDK pytest plugin's ``attest`` fixture, i.e.
``attest.evaluate(chain) -> attest.AgentResult``. Each
``AgentResult.assertion_results`` entry is an ``AssertionResult`` with
``assertion_id``, ``status`` ("pass" | "soft_fail" | "hard_fail"), ``score``
and ``explanation``.

A JSON-RPC error from the engine surfaces as
``attest._proto.codec.ProtocolError`` carrying ``.code``.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable

import pytest
from attest import AgentResult, ExpectChain, Trace, TraceBuilder, agent, expect
from attest._proto.codec import ProtocolError
from attest._proto.types import (
    ERR_ASSERTION_ERROR,
    STATUS_HARD_FAIL,
    STATUS_PASS,
    STATUS_SOFT_FAIL,
    TYPE_CONSTRAINT,
    TYPE_CONTENT,
    TYPE_SCHEMA,
    TYPE_TRACE,
)

PASS = STATUS_PASS  # "pass"
SOFT = STATUS_SOFT_FAIL  # "soft_fail"
HARD = STATUS_HARD_FAIL  # "hard_fail"

assert ERR_ASSERTION_ERROR == 1002

# ─────────────────────────────────────────────────────────────────────────────
# Traces
# ─────────────────────────────────────────────────────────────────────────────

REFUND_MESSAGE = (
    "Your refund of $89.99 has been processed. You'll see it in 3 business days. "
    "Refund ID: RFD-001."
)
LOOKUP_ARGS = {"order_id": "ORD-123"}
LOOKUP_RESULT = {"status": "delivered", "amount": 89.99, "eligible_for_refund": True}
REFUND_ARGS = {"order_id": "ORD-123", "amount": 89.99}
REFUND_RESULT = {"refund_id": "RFD-001", "estimated_days": 3}
REFUND_OUTPUT = {"message": REFUND_MESSAGE, "structured": {"refund_id": "RFD-001", "confidence": 0.95}}


@agent("refund-agent")
def refund_agent(builder: TraceBuilder, order_id: str) -> dict:
    """The canonical trace: 1 llm_call + 2 tool_calls (3 steps)."""
    builder.set_trace_id("trc_e2e_refund")
    builder.add_llm_call(
        "reasoning",
        result={"completion": f"Customer wants a refund for {order_id}; look it up, then refund."},
    )
    builder.add_tool_call("lookup_order", args={"order_id": order_id}, result=LOOKUP_RESULT)
    builder.add_tool_call("process_refund", args=REFUND_ARGS, result=REFUND_RESULT)
    builder.set_metadata(total_tokens=1350, cost_usd=0.0067, latency_ms=4200, model="gpt-4.1")
    return REFUND_OUTPUT


def _variant(trace_id: str, steps: list[tuple[str, str]]) -> Trace:
    """Refund trace variant with a different step sequence ((type, name) pairs)."""
    builder = TraceBuilder(agent_id="refund-agent").set_trace_id(trace_id)
    builder.set_input(order_id="ORD-123")
    for step_type, name in steps:
        if step_type == "llm_call":
            builder.add_llm_call(name, result={"completion": "..."})
        elif step_type == "retrieval":
            builder.add_retrieval(name, args={"query": "refund policy"}, result={"docs": ["30 days"]})
        elif name == "lookup_order":
            builder.add_tool_call(name, args=LOOKUP_ARGS, result=LOOKUP_RESULT)
        elif name == "process_refund":
            builder.add_tool_call(name, args=REFUND_ARGS, result=REFUND_RESULT)
        else:
            builder.add_tool_call(name, args=LOOKUP_ARGS, result={"ok": True})
    builder.set_output_dict(REFUND_OUTPUT)
    builder.set_metadata(total_tokens=1350, cost_usd=0.0067, latency_ms=4200, model="gpt-4.1")
    return builder.build()


TRACES: dict[str, AgentResult | Trace] = {
    # reasoning(llm) -> lookup_order -> process_refund
    "refund": refund_agent(order_id="ORD-123"),
    # reasoning(llm) -> refund_policy(retrieval) -> lookup_order -> reasoning(llm) -> process_refund
    # (llm steps between tools and a repeated llm name must be ignored by trace checks)
    "interleaved": _variant(
        "trc_e2e_refund_interleaved",
        [
            ("llm_call", "reasoning"),
            ("retrieval", "refund_policy"),
            ("tool_call", "lookup_order"),
            ("llm_call", "reasoning"),
            ("tool_call", "process_refund"),
        ],
    ),
    # reasoning(llm) -> lookup_order x3 -> process_refund
    "looping": _variant(
        "trc_e2e_refund_loop",
        [
            ("llm_call", "reasoning"),
            ("tool_call", "lookup_order"),
            ("tool_call", "lookup_order"),
            ("tool_call", "lookup_order"),
            ("tool_call", "process_refund"),
        ],
    ),
    # reasoning(llm) -> lookup_order -> check_fraud -> process_refund
    "detour": _variant(
        "trc_e2e_refund_detour",
        [
            ("llm_call", "reasoning"),
            ("tool_call", "lookup_order"),
            ("tool_call", "check_fraud"),
            ("tool_call", "process_refund"),
        ],
    ),
}


def test_refund_trace_shape() -> None:
    """Sanity-check the wire form of the canonical trace the SDK sends."""
    wire = TRACES["refund"].trace.to_dict()
    assert wire["trace_id"] == "trc_e2e_refund"
    assert [(s["type"], s["name"]) for s in wire["steps"]] == [
        ("llm_call", "reasoning"),
        ("tool_call", "lookup_order"),
        ("tool_call", "process_refund"),
    ]
    assert wire["steps"][1]["args"] == {"order_id": "ORD-123"}
    assert wire["output"] == REFUND_OUTPUT
    assert wire["metadata"] == {
        "total_tokens": 1350,
        "cost_usd": 0.0067,
        "latency_ms": 4200,
        "model": "gpt-4.1",
    }


# ─────────────────────────────────────────────────────────────────────────────
# Helpers
# ─────────────────────────────────────────────────────────────────────────────

Build = Callable[[ExpectChain], ExpectChain]


def case(case_id: str, build: Build, status: str, score: float, *, trace: str = "refund"):
    """One table row: apply ``build`` to ``expect(TRACES[trace])``; expect one result."""
    return pytest.param(trace, build, status, score, id=f"{case_id}[{trace}]")


def check_results(agent_result: AgentResult, chain: ExpectChain) -> None:
    """Invariants for every evaluate_batch answer."""
    sent = [a.assertion_id for a in chain.assertions]
    got = [r.assertion_id for r in agent_result.assertion_results]
    assert got == sent, "one result per assertion, in request order"
    for r in agent_result.assertion_results:
        assert r.status in (PASS, SOFT, HARD), r
        assert 0.0 <= r.score <= 1.0, r
        assert isinstance(r.explanation, str) and r.explanation.strip(), (
            f"empty explanation for {r.assertion_id}: {r!r}"
        )


def evaluate_single(attest, trace_key: str, build: Build):
    chain = build(expect(TRACES[trace_key]))
    assert len(chain.assertions) == 1
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)
    (result,) = agent_result.assertion_results
    return agent_result, result


def run_case(attest, trace_key: str, build: Build, status: str, score: float) -> None:
    agent_result, result = evaluate_single(attest, trace_key, build)
    assert (result.status, result.score) == (status, pytest.approx(score)), (
        f"{result.status} score={result.score}: {result.explanation}"
    )
    assert agent_result.passed is (status == PASS)
    assert len(agent_result.hard_failures) == (status == HARD)
    assert len(agent_result.soft_failures) == (status == SOFT)


# ─────────────────────────────────────────────────────────────────────────────
# Layer 1: schema (JSON Schema 2020-12)
# ─────────────────────────────────────────────────────────────────────────────

STRUCTURED_SCHEMA = {
    "type": "object",
    "required": ["refund_id", "confidence"],
    "properties": {
        "refund_id": {"type": "string", "pattern": "^RFD-[0-9]{3}$"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "additionalProperties": False,
}

LAYER_1 = [
    case("output_matches_schema-pass",
         lambda e: e.output_matches_schema(STRUCTURED_SCHEMA), PASS, 1.0),
    case("output_matches_schema-fail-missing-required",
         lambda e: e.output_matches_schema({"type": "object", "required": ["refund_id", "customer_email"]}),
         HARD, 0.0),
    case("output_matches_schema-fail-wrong-type",
         lambda e: e.output_matches_schema({"type": "array"}), HARD, 0.0),
    # dependentRequired is 2020-12 (draft 2019-09+) vocabulary; a draft-7 validator would ignore it.
    case("output_matches_schema-2020-12-dependentRequired-pass",
         lambda e: e.output_matches_schema({
             "$schema": "https://json-schema.org/draft/2020-12/schema",
             "dependentRequired": {"refund_id": ["confidence"]},
         }), PASS, 1.0),
    case("output_matches_schema-2020-12-dependentRequired-fail",
         lambda e: e.output_matches_schema({"dependentRequired": {"refund_id": ["currency"]}}),
         HARD, 0.0),
    case("output_field_matches_schema-message-pass",
         lambda e: e.output_field_matches_schema("message", {"type": "string", "minLength": 20, "pattern": "RFD-[0-9]{3}"}),
         PASS, 1.0),
    case("output_field_matches_schema-nested-pass",
         lambda e: e.output_field_matches_schema("structured.refund_id", {"type": "string", "pattern": "^RFD-[0-9]{3}$"}),
         PASS, 1.0),
    case("output_field_matches_schema-message-fail",
         lambda e: e.output_field_matches_schema("message", {"type": "string", "maxLength": 20}),
         HARD, 0.0),
    case("output_field_matches_schema-nested-fail",
         lambda e: e.output_field_matches_schema("structured.confidence", {"type": "number", "minimum": 0.99}),
         HARD, 0.0),
    case("tool_args_match_schema-pass",
         lambda e: e.tool_args_match_schema("process_refund", {
             "type": "object",
             "required": ["order_id", "amount"],
             "properties": {
                 "order_id": {"type": "string", "pattern": "^ORD-"},
                 "amount": {"type": "number", "exclusiveMinimum": 0},
             },
         }), PASS, 1.0),
    case("tool_args_match_schema-fail-missing-required",
         lambda e: e.tool_args_match_schema("process_refund", {"type": "object", "required": ["reason"]}),
         HARD, 0.0),
    case("tool_args_match_schema-fail-wrong-type",
         lambda e: e.tool_args_match_schema("lookup_order", {"properties": {"order_id": {"type": "integer"}}}),
         HARD, 0.0),
    case("tool_result_matches_schema-pass",
         lambda e: e.tool_result_matches_schema("lookup_order", {
             "type": "object",
             "required": ["status", "amount", "eligible_for_refund"],
             "properties": {"eligible_for_refund": {"const": True}, "amount": {"type": "number"}},
         }), PASS, 1.0),
    case("tool_result_matches_schema-pass-integer",
         lambda e: e.tool_result_matches_schema("process_refund", {
             "required": ["refund_id", "estimated_days"],
             "properties": {"estimated_days": {"type": "integer", "maximum": 5}},
         }), PASS, 1.0),
    case("tool_result_matches_schema-fail",
         lambda e: e.tool_result_matches_schema("lookup_order", {
             "properties": {"status": {"enum": ["pending", "shipped"]}},
         }), HARD, 0.0),
]


@pytest.mark.parametrize(("trace", "build", "status", "score"), LAYER_1)
def test_layer1_schema(attest, trace, build, status, score) -> None:
    run_case(attest, trace, build, status, score)


# ─────────────────────────────────────────────────────────────────────────────
# Layer 2: constraints  (metadata: total_tokens 1350, cost_usd 0.0067, latency_ms 4200)
# ─────────────────────────────────────────────────────────────────────────────

TOOL_CALLS = "steps[?type=='tool_call'].length"

LAYER_2 = [
    case("cost_under-pass", lambda e: e.cost_under(0.01), PASS, 1.0),
    case("cost_under-pass-boundary", lambda e: e.cost_under(0.0067), PASS, 1.0),
    case("cost_under-fail", lambda e: e.cost_under(0.005), HARD, 0.0),
    case("latency_under-pass", lambda e: e.latency_under(5000), PASS, 1.0),
    case("latency_under-pass-boundary", lambda e: e.latency_under(4200), PASS, 1.0),
    case("latency_under-fail", lambda e: e.latency_under(4199), HARD, 0.0),
    case("tokens_under-pass", lambda e: e.tokens_under(2000), PASS, 1.0),
    case("tokens_under-pass-boundary", lambda e: e.tokens_under(1350), PASS, 1.0),
    case("tokens_under-fail", lambda e: e.tokens_under(1349), HARD, 0.0),
    case("tokens_between-pass", lambda e: e.tokens_between(1000, 2000), PASS, 1.0),
    case("tokens_between-pass-inclusive", lambda e: e.tokens_between(1350, 1350), PASS, 1.0),
    case("tokens_between-fail-below-min", lambda e: e.tokens_between(1351, 2000), HARD, 0.0),
    case("tokens_between-fail-above-max", lambda e: e.tokens_between(100, 1349), HARD, 0.0),
    case("step_count-eq-pass", lambda e: e.step_count("eq", 3), PASS, 1.0),
    case("step_count-lte-pass", lambda e: e.step_count("lte", 3), PASS, 1.0),
    case("step_count-gt-fail", lambda e: e.step_count("gt", 3), HARD, 0.0),
    case("step_count-lt-fail", lambda e: e.step_count("lt", 3), HARD, 0.0),
    case("step_count-eq-pass", lambda e: e.step_count("eq", 5), PASS, 1.0, trace="interleaved"),
    case("tool_call_count-eq-pass", lambda e: e.tool_call_count("eq", 2), PASS, 1.0),
    case("tool_call_count-gte-fail", lambda e: e.tool_call_count("gte", 3), HARD, 0.0),
    # retrieval and llm_call steps are not tool_call steps
    case("tool_call_count-eq-pass", lambda e: e.tool_call_count("eq", 2), PASS, 1.0, trace="interleaved"),
    case("tool_call_count-eq-pass", lambda e: e.tool_call_count("eq", 4), PASS, 1.0, trace="looping"),
    case("tool_call_count-lte-fail", lambda e: e.tool_call_count("lte", 2), HARD, 0.0, trace="looping"),
    case("constraint-lt-pass", lambda e: e.constraint("metadata.total_tokens", "lt", 1351), PASS, 1.0),
    case("constraint-lt-fail-boundary", lambda e: e.constraint("metadata.total_tokens", "lt", 1350), HARD, 0.0),
    case("constraint-lte-pass-boundary", lambda e: e.constraint("metadata.total_tokens", "lte", 1350), PASS, 1.0),
    case("constraint-lte-fail", lambda e: e.constraint("metadata.cost_usd", "lte", 0.006), HARD, 0.0),
    case("constraint-gt-pass", lambda e: e.constraint("metadata.latency_ms", "gt", 4000), PASS, 1.0),
    case("constraint-gt-fail-boundary", lambda e: e.constraint("metadata.latency_ms", "gt", 4200), HARD, 0.0),
    case("constraint-gte-pass-boundary", lambda e: e.constraint("metadata.cost_usd", "gte", 0.0067), PASS, 1.0),
    case("constraint-gte-fail", lambda e: e.constraint("metadata.cost_usd", "gte", 0.007), HARD, 0.0),
    case("constraint-eq-pass", lambda e: e.constraint("metadata.total_tokens", "eq", 1350), PASS, 1.0),
    case("constraint-eq-fail", lambda e: e.constraint("metadata.total_tokens", "eq", 1351), HARD, 0.0),
    case("constraint-between-pass", lambda e: e.constraint("metadata.latency_ms", "between", min=4000, max=4500), PASS, 1.0),
    case("constraint-between-pass-inclusive", lambda e: e.constraint("metadata.latency_ms", "between", min=4200, max=4200), PASS, 1.0),
    case("constraint-between-fail", lambda e: e.constraint("metadata.latency_ms", "between", min=4201, max=5000), HARD, 0.0),
    case("constraint-steps.length-pass", lambda e: e.constraint("steps.length", "eq", 3), PASS, 1.0),
    case("constraint-steps.length-fail", lambda e: e.constraint("steps.length", "gte", 4), HARD, 0.0),
    case("constraint-tool_call-length-pass", lambda e: e.constraint(TOOL_CALLS, "between", min=1, max=2), PASS, 1.0),
    case("constraint-tool_call-length-fail", lambda e: e.constraint(TOOL_CALLS, "gt", 2), HARD, 0.0),
]


@pytest.mark.parametrize(("trace", "build", "status", "score"), LAYER_2)
def test_layer2_constraint(attest, trace, build, status, score) -> None:
    run_case(attest, trace, build, status, score)


# ─────────────────────────────────────────────────────────────────────────────
# Layer 3: trace checks (only tool_call and retrieval steps count as tools)
# ─────────────────────────────────────────────────────────────────────────────

LAYER_3 = [
    case("tools_called_in_order-pass", lambda e: e.tools_called_in_order(["lookup_order", "process_refund"]), PASS, 1.0),
    case("tools_called_in_order-pass-single", lambda e: e.tools_called_in_order(["process_refund"]), PASS, 1.0),
    case("tools_called_in_order-pass-non-contiguous",
         lambda e: e.tools_called_in_order(["lookup_order", "process_refund"]), PASS, 1.0, trace="detour"),
    case("tools_called_in_order-fail-wrong-order",
         lambda e: e.tools_called_in_order(["process_refund", "lookup_order"]), HARD, 0.0),
    case("tools_called_in_order-fail-missing",
         lambda e: e.tools_called_in_order(["lookup_order", "process_refund", "send_email"]), HARD, 0.0),
    case("tools_called_in_order-fail-llm-step-is-not-a-tool",
         lambda e: e.tools_called_in_order(["reasoning", "lookup_order"]), HARD, 0.0),
    case("tools_called_exactly-pass", lambda e: e.tools_called_exactly(["lookup_order", "process_refund"]), PASS, 1.0),
    case("tools_called_exactly-pass-llm-between-ignored",
         lambda e: e.tools_called_exactly(["lookup_order", "process_refund"]), PASS, 1.0, trace="interleaved"),
    case("tools_called_exactly-pass-retrieval-is-a-tool",
         lambda e: e.tools_called_exactly(["refund_policy", "lookup_order", "process_refund"]),
         PASS, 1.0, trace="interleaved"),
    case("tools_called_exactly-fail-tool-between",
         lambda e: e.tools_called_exactly(["lookup_order", "process_refund"]), HARD, 0.0, trace="detour"),
    case("tools_called_exactly-fail-wrong-order",
         lambda e: e.tools_called_exactly(["process_refund", "lookup_order"]), HARD, 0.0),
    case("no_tool_loops-pass", lambda e: e.no_tool_loops("lookup_order"), PASS, 1.0),
    case("no_tool_loops-fail-default-max", lambda e: e.no_tool_loops("lookup_order"), HARD, 0.0, trace="looping"),
    case("no_tool_loops-fail", lambda e: e.no_tool_loops("lookup_order", max_repetitions=2), HARD, 0.0, trace="looping"),
    case("no_tool_loops-pass-boundary",
         lambda e: e.no_tool_loops("lookup_order", max_repetitions=3), PASS, 1.0, trace="looping"),
    case("no_tool_loops-pass-repeated-llm-ignored",
         lambda e: e.no_tool_loops("reasoning"), PASS, 1.0, trace="interleaved"),
    case("no_duplicate_tools-pass", lambda e: e.no_duplicate_tools(), PASS, 1.0),
    case("no_duplicate_tools-pass-repeated-llm-ignored", lambda e: e.no_duplicate_tools(), PASS, 1.0, trace="interleaved"),
    case("no_duplicate_tools-fail", lambda e: e.no_duplicate_tools(), HARD, 0.0, trace="looping"),
    case("required_tools-pass", lambda e: e.required_tools(["process_refund", "lookup_order"]), PASS, 1.0),
    case("required_tools-pass-retrieval", lambda e: e.required_tools(["refund_policy"]), PASS, 1.0, trace="interleaved"),
    case("required_tools-fail", lambda e: e.required_tools(["lookup_order", "escalate_to_human"]), HARD, 0.0),
    case("required_tools-fail-llm-step-is-not-a-tool", lambda e: e.required_tools(["reasoning"]), HARD, 0.0),
    case("forbidden_tools-pass", lambda e: e.forbidden_tools(["delete_account", "escalate_to_human"]), PASS, 1.0),
    case("forbidden_tools-pass-llm-step-is-not-a-tool", lambda e: e.forbidden_tools(["reasoning"]), PASS, 1.0),
    case("forbidden_tools-fail", lambda e: e.forbidden_tools(["escalate_to_human", "process_refund"]), HARD, 0.0),
    case("forbidden_tools-fail-retrieval", lambda e: e.forbidden_tools(["refund_policy"]), HARD, 0.0, trace="interleaved"),
]


@pytest.mark.parametrize(("trace", "build", "status", "score"), LAYER_3)
def test_layer3_trace(attest, trace, build, status, score) -> None:
    run_case(attest, trace, build, status, score)


# ─────────────────────────────────────────────────────────────────────────────
# Layer 4: content  (target output.message unless stated)
#   "Your refund of $89.99 has been processed. You'll see it in 3 business days.
#    Refund ID: RFD-001."
# ─────────────────────────────────────────────────────────────────────────────

LAYER_4 = [
    case("output_contains-pass", lambda e: e.output_contains("refund of $89.99"), PASS, 1.0),
    case("output_contains-pass-case-insensitive-default", lambda e: e.output_contains("REFUND ID"), PASS, 1.0),
    case("output_contains-fail-case-sensitive",
         lambda e: e.output_contains("REFUND ID", case_sensitive=True), HARD, 0.0),
    case("output_contains-fail", lambda e: e.output_contains("cancelled"), HARD, 0.0),
    case("output_not_contains-pass", lambda e: e.output_not_contains("sorry"), PASS, 1.0),
    case("output_not_contains-pass-case-sensitive",
         lambda e: e.output_not_contains("REFUND ID", case_sensitive=True), PASS, 1.0),
    case("output_not_contains-fail-case-insensitive-default",
         lambda e: e.output_not_contains("REFUND ID"), HARD, 0.0),
    case("output_matches_regex-pass", lambda e: e.output_matches_regex(r"Refund ID: RFD-\d{3}\."), PASS, 1.0),
    case("output_matches_regex-pass-anchored", lambda e: e.output_matches_regex(r"^Your refund.*RFD-001\.$"), PASS, 1.0),
    case("output_matches_regex-pass-amount", lambda e: e.output_matches_regex(r"\$\d+\.\d{2}"), PASS, 1.0),
    case("output_matches_regex-pass-re2-inline-flag",
         lambda e: e.output_matches_regex(r"(?i)refund id: rfd-\d{3}"), PASS, 1.0),
    case("output_matches_regex-fail-case-sensitive-default",
         lambda e: e.output_matches_regex(r"refund id: rfd-\d{3}"), HARD, 0.0),
    case("output_matches_regex-fail", lambda e: e.output_matches_regex(r"^Sorry"), HARD, 0.0),
    case("output_has_all_keywords-pass",
         lambda e: e.output_has_all_keywords(["refund", "processed", "business days"]), PASS, 1.0),
    case("output_has_all_keywords-pass-case-insensitive-default",
         lambda e: e.output_has_all_keywords(["REFUND", "Processed"]), PASS, 1.0),
    case("output_has_all_keywords-fail-half-found",
         lambda e: e.output_has_all_keywords(["refund", "processed", "voucher", "store credit"]), HARD, 0.5),
    case("output_has_all_keywords-fail-case-sensitive-two-thirds",
         lambda e: e.output_has_all_keywords(["Refund", "REFUND", "RFD-001"], case_sensitive=True), HARD, 2 / 3),
    case("output_has_all_keywords-fail-none-found",
         lambda e: e.output_has_all_keywords(["voucher"]), HARD, 0.0),
    case("output_has_any_keyword-pass", lambda e: e.output_has_any_keyword(["voucher", "refund"]), PASS, 1.0),
    case("output_has_any_keyword-pass-case-insensitive-default",
         lambda e: e.output_has_any_keyword(["VOUCHER", "PROCESSED"]), PASS, 1.0),
    case("output_has_any_keyword-fail", lambda e: e.output_has_any_keyword(["voucher", "store credit"]), HARD, 0.0),
    case("output_has_any_keyword-fail-case-sensitive",
         lambda e: e.output_has_any_keyword(["REFUND", "PROCESSED"], case_sensitive=True), HARD, 0.0),
    case("output_forbids-pass", lambda e: e.output_forbids(["password", "social security"]), PASS, 1.0),
    case("output_forbids-fail", lambda e: e.output_forbids(["password", "Refund ID"]), HARD, 0.0),
    case("output_forbids-fail-case-insensitive-default", lambda e: e.output_forbids(["rfd-001"]), HARD, 0.0),
    case("content_contains-message-pass", lambda e: e.content_contains("output.message", "REFUND ID"), PASS, 1.0),
    case("content_contains-structured-field-pass",
         lambda e: e.content_contains("output.structured.refund_id", "rfd-001"), PASS, 1.0),
    case("content_contains-fail", lambda e: e.content_contains("output.message", "RFD-999"), HARD, 0.0),
    case("content_contains-fail-case-sensitive",
         lambda e: e.content_contains("output.structured.refund_id", "rfd-001", case_sensitive=True), HARD, 0.0),
]


@pytest.mark.parametrize(("trace", "build", "status", "score"), LAYER_4)
def test_layer4_content(attest, trace, build, status, score) -> None:
    run_case(attest, trace, build, status, score)


# ─────────────────────────────────────────────────────────────────────────────
# soft=True: a failing soft assertion is soft_fail (never hard_fail); a passing
# soft assertion is still pass.
# ─────────────────────────────────────────────────────────────────────────────

SOFT_CASES = [
    case("cost_under-soft", lambda e: e.cost_under(0.005, soft=True), SOFT, 0.0),
    case("latency_under-soft", lambda e: e.latency_under(4000, soft=True), SOFT, 0.0),
    case("tokens_under-soft", lambda e: e.tokens_under(1000, soft=True), SOFT, 0.0),
    case("tokens_between-soft", lambda e: e.tokens_between(1400, 2000, soft=True), SOFT, 0.0),
    case("step_count-soft", lambda e: e.step_count("gt", 3, soft=True), SOFT, 0.0),
    case("tool_call_count-soft", lambda e: e.tool_call_count("eq", 1, soft=True), SOFT, 0.0),
    case("constraint-soft", lambda e: e.constraint("metadata.latency_ms", "lt", 1000, soft=True), SOFT, 0.0),
    case("tools_called_in_order-soft",
         lambda e: e.tools_called_in_order(["process_refund", "lookup_order"], soft=True), SOFT, 0.0),
    case("tools_called_exactly-soft",
         lambda e: e.tools_called_exactly(["lookup_order", "process_refund"], soft=True), SOFT, 0.0, trace="detour"),
    case("no_tool_loops-soft", lambda e: e.no_tool_loops("lookup_order", soft=True), SOFT, 0.0, trace="looping"),
    case("no_duplicate_tools-soft", lambda e: e.no_duplicate_tools(soft=True), SOFT, 0.0, trace="looping"),
    case("required_tools-soft", lambda e: e.required_tools(["escalate_to_human"], soft=True), SOFT, 0.0),
    case("forbidden_tools-soft", lambda e: e.forbidden_tools(["process_refund"], soft=True), SOFT, 0.0),
    case("output_contains-soft", lambda e: e.output_contains("cancelled", soft=True), SOFT, 0.0),
    case("output_not_contains-soft", lambda e: e.output_not_contains("refund", soft=True), SOFT, 0.0),
    case("output_matches_regex-soft", lambda e: e.output_matches_regex(r"^Sorry", soft=True), SOFT, 0.0),
    case("output_has_all_keywords-soft",
         lambda e: e.output_has_all_keywords(["refund", "voucher"], soft=True), SOFT, 0.5),
    case("output_has_any_keyword-soft", lambda e: e.output_has_any_keyword(["voucher"], soft=True), SOFT, 0.0),
    case("content_contains-soft", lambda e: e.content_contains("output.message", "RFD-999", soft=True), SOFT, 0.0),
    case("cost_under-soft-passing", lambda e: e.cost_under(0.01, soft=True), PASS, 1.0),
    case("required_tools-soft-passing", lambda e: e.required_tools(["lookup_order"], soft=True), PASS, 1.0),
    case("output_contains-soft-passing", lambda e: e.output_contains("RFD-001", soft=True), PASS, 1.0),
    # The SDK's output_forbids() has no soft flag; send the raw spec it would
    # produce plus soft:true. Contract: forbidden failures are always hard_fail.
    case("forbidden-soft-spec-still-hard",
         lambda e: e._add(TYPE_CONTENT, {"target": "output.message", "check": "forbidden",
                                         "values": ["RFD-001"], "soft": True}),
         HARD, 0.0),
]


@pytest.mark.parametrize(("trace", "build", "status", "score"), SOFT_CASES)
def test_soft(attest, trace, build, status, score) -> None:
    run_case(attest, trace, build, status, score)


# ─────────────────────────────────────────────────────────────────────────────
# Batches
# ─────────────────────────────────────────────────────────────────────────────


def test_mixed_batch(attest) -> None:
    chain = (
        expect(TRACES["refund"])
        .output_matches_schema(STRUCTURED_SCHEMA)                        # pass
        .cost_under(0.01)                                                # pass
        .latency_under(3000, soft=True)                                  # soft_fail
        .tools_called_in_order(["lookup_order", "process_refund"])      # pass
        .forbidden_tools(["process_refund"])                             # hard_fail
        .output_contains("RFD-001")                                      # pass
        .output_has_all_keywords(["refund", "voucher"], soft=True)       # soft_fail, 0.5
        .output_forbids(["89.99"])                                       # hard_fail
    )
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)

    assert [(r.status, r.score) for r in agent_result.assertion_results] == [
        (PASS, 1.0),
        (PASS, 1.0),
        (SOFT, 0.0),
        (PASS, 1.0),
        (HARD, 0.0),
        (PASS, 1.0),
        (SOFT, pytest.approx(0.5)),
        (HARD, 0.0),
    ]
    ids = [a.assertion_id for a in chain.assertions]
    assert agent_result.passed is False
    assert agent_result.pass_count == 4
    assert agent_result.fail_count == 4
    assert [r.assertion_id for r in agent_result.soft_failures] == [ids[2], ids[6]]
    assert [r.assertion_id for r in agent_result.hard_failures] == [ids[4], ids[7]]
    assert agent_result.total_cost == 0.0  # layers 1-4 are deterministic: no LLM spend
    assert agent_result.trace is chain.trace


def test_all_pass_batch_across_layers(attest) -> None:
    chain = (
        expect(TRACES["refund"])
        .output_matches_schema(STRUCTURED_SCHEMA)
        .tool_args_match_schema("lookup_order", {"required": ["order_id"]})
        .cost_under(0.01)
        .tokens_between(1000, 2000)
        .step_count("eq", 3)
        .tools_called_exactly(["lookup_order", "process_refund"])
        .no_duplicate_tools()
        .required_tools(["lookup_order", "process_refund"])
        .output_contains("refund")
        .output_matches_regex(r"RFD-\d{3}")
        .output_forbids(["password"])
    )
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)
    assert agent_result.passed, agent_result.render_diagnostics()
    assert agent_result.pass_count == len(chain.assertions) == 11
    assert all(r.score == 1.0 for r in agent_result.assertion_results)


def test_evaluate_async(attest) -> None:
    """The plugin's evaluate_async path (awaited from a different event loop)."""
    chain = expect(TRACES["refund"]).required_tools(["lookup_order"]).cost_under(0.001)

    agent_result = asyncio.run(attest.evaluate_async(chain))

    check_results(agent_result, chain)
    assert [r.status for r in agent_result.assertion_results] == [PASS, HARD]


def test_engine_survives_many_sequential_requests(attest) -> None:
    for i in range(25):
        chain = expect(TRACES["looping"]).no_tool_loops("lookup_order", max_repetitions=i % 5 + 1)
        agent_result = attest.evaluate(chain)
        check_results(agent_result, chain)
        expected = PASS if i % 5 + 1 >= 3 else HARD
        assert agent_result.assertion_results[0].status == expected, i


# ─────────────────────────────────────────────────────────────────────────────
# Bad specs: the whole evaluate_batch request fails with JSON-RPC error 1002
# ─────────────────────────────────────────────────────────────────────────────

ERROR_CASES = [
    pytest.param(lambda e: e.output_matches_regex("([unclosed"), id="invalid-regex"),
    # valid PCRE/Python syntax, but not RE2: lookahead and backreference
    pytest.param(lambda e: e.output_matches_regex(r"RFD(?=-001)"), id="regex-lookahead-not-re2"),
    pytest.param(lambda e: e.output_matches_regex(r"(RFD)-\1"), id="regex-backreference-not-re2"),
    pytest.param(
        lambda e: e.output_contains("refund").cost_under(0.01).output_matches_regex("([unclosed"),
        id="invalid-regex-fails-whole-batch",
    ),
    pytest.param(lambda e: e._add("no_such_assertion_type", {"soft": False}), id="unknown-assertion-type"),
    pytest.param(lambda e: e.passes_judge("polite", rubric="vibes"), id="unknown-judge-rubric"),
]


@pytest.mark.parametrize("build", ERROR_CASES)
def test_bad_spec_is_error_1002(attest, build) -> None:
    chain = build(expect(TRACES["refund"]))

    with pytest.raises(ProtocolError) as excinfo:
        attest.evaluate(chain)

    assert excinfo.value.code == ERR_ASSERTION_ERROR == 1002
    assert isinstance(excinfo.value.error_message, str) and excinfo.value.error_message.strip()


def test_engine_usable_after_error(attest) -> None:
    with pytest.raises(ProtocolError) as excinfo:
        attest.evaluate(expect(TRACES["refund"]).output_matches_regex("(?P<unterminated"))
    assert excinfo.value.code == 1002

    chain = expect(TRACES["refund"]).output_matches_regex(r"RFD-\d{3}")
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)
    assert agent_result.assertion_results[0].status == PASS


# ─────────────────────────────────────────────────────────────────────────────
# Coverage guard: every layer 1-4 DSL method of the installed SDK has at least
# one passing and one failing case in the tables above.
# ─────────────────────────────────────────────────────────────────────────────

# ExpectChain methods are recognised by the assertion type they pass to _add().
_LAYER_1_4_ADD = re.compile(r"self\._add\(\s*TYPE_(SCHEMA|CONSTRAINT|TRACE|CONTENT)\b")
assert (TYPE_SCHEMA, TYPE_CONSTRAINT, TYPE_TRACE, TYPE_CONTENT) == ("schema", "constraint", "trace", "content")


def _sdk_layer_1_4_methods() -> set[str]:
    names = set()
    for name, fn in inspect.getmembers(ExpectChain, inspect.isfunction):
        if name.startswith("_"):
            continue
        if _LAYER_1_4_ADD.search(inspect.getsource(fn)):
            names.add(name)
    return names


def test_every_layer_1_4_method_has_pass_and_fail_cases() -> None:
    sdk_methods = _sdk_layer_1_4_methods()
    assert len(sdk_methods) >= 24, sorted(sdk_methods)

    covered: dict[str, set[str]] = {}
    for param in LAYER_1 + LAYER_2 + LAYER_3 + LAYER_4:
        _trace, build, status, _score = param.values
        for name in build.__code__.co_names:
            if name in sdk_methods:
                covered.setdefault(name, set()).add("pass" if status == PASS else "fail")

    missing = {m: {"pass", "fail"} - covered.get(m, set()) for m in sdk_methods}
    assert not {m: gap for m, gap in missing.items() if gap}, missing
