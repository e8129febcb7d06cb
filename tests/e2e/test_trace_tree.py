"""End-to-end tests of layer 7 (multi-agent trace trees) through the real attest-ai 0.9.0 SDK.

Every trace_tree method of ``expect()`` has a passing and a failing case on a
delegation tree built with the SDK's own types (``TraceBuilder`` and
``Step(type="agent_call", sub_trace=...)``), evaluated by the real engine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
from attest import AgentResult, ExpectChain, Trace, TraceBuilder, expect
from attest._proto.codec import ProtocolError
from attest._proto.types import STATUS_HARD_FAIL, STATUS_PASS, STATUS_SOFT_FAIL, TYPE_TRACE_TREE, Step

PASS, SOFT, HARD = STATUS_PASS, STATUS_SOFT_FAIL, STATUS_HARD_FAIL


def _agent(agent_id: str, trace_id: str, parent: str, *, output: dict, inputs: dict | None = None,
           steps: list[Step] = (), tokens: int = 0, cost: float = 0.0, latency: int = 0) -> Trace:
    b = TraceBuilder(agent_id=agent_id).set_trace_id(trace_id).set_parent_trace_id(parent)
    if inputs is not None:
        b.set_input_dict(inputs)
    for s in steps:
        b.add_step(s)
    b.set_output_dict(output)
    b.set_metadata(total_tokens=tokens, cost_usd=cost, latency_ms=latency)
    return b.build()


def tree() -> Trace:
    """orchestrator → researcher (10–40 ms) → fact_checker; orchestrator → writer (50–90 ms)."""
    fact_checker = _agent("fact_checker", "trc_tt_f", "trc_tt_r", output={"verdict": "confirmed"},
                          steps=[Step(type="retrieval", name="kb_lookup", started_at_ms=21, ended_at_ms=29, agent_id="fact_checker")],
                          tokens=20, cost=0.001, latency=8)
    researcher = _agent("researcher", "trc_tt_r", "trc_tt_root", inputs={"question": "capital of France?"},
                        output={"findings": {"city": "Paris"}, "summary": "Paris, per two sources"},
                        steps=[Step(type="tool_call", name="web_search", started_at_ms=12, ended_at_ms=18, agent_id="researcher"),
                               Step(type="agent_call", name="fact_checker", sub_trace=fact_checker, started_at_ms=20, ended_at_ms=30,
                                    agent_id="fact_checker")],
                        tokens=50, cost=0.002, latency=30)
    writer = _agent("writer", "trc_tt_w", "trc_tt_root", inputs={"notes": {"city": "Paris"}},
                    output={"draft": "Paris is the capital."},
                    steps=[Step(type="tool_call", name="format_text", started_at_ms=55, ended_at_ms=85, agent_id="writer")],
                    tokens=70, cost=0.003, latency=40)
    root = TraceBuilder(agent_id="orchestrator").set_trace_id("trc_tt_root")
    root.set_input(question="capital of France?")
    root.add_llm_call("plan", result={"completion": "research, then write"})
    root.add_step(Step(type="agent_call", name="researcher", sub_trace=researcher, started_at_ms=10, ended_at_ms=40, agent_id="researcher"))
    root.add_step(Step(type="agent_call", name="writer", sub_trace=writer, started_at_ms=50, ended_at_ms=90, agent_id="writer"))
    root.set_output(message="Paris is the capital of France.")
    root.set_metadata(total_tokens=100, cost_usd=0.004, latency_ms=100)
    return root.build()


TREE = tree()
Build = Callable[[ExpectChain], ExpectChain]

CASES = [
    pytest.param(lambda e: e.agent_called("writer"), PASS, id="agent_called-pass"),
    pytest.param(lambda e: e.agent_called("translator"), HARD, id="agent_called-fail"),
    pytest.param(lambda e: e.delegation_depth(2), PASS, id="delegation_depth-pass"),
    pytest.param(lambda e: e.delegation_depth(1), HARD, id="delegation_depth-fail"),
    pytest.param(lambda e: e.agent_output_contains("researcher", "PARIS"), PASS, id="agent_output_contains-pass"),
    pytest.param(lambda e: e.agent_output_contains("researcher", "PARIS", case_sensitive=True), HARD,
                 id="agent_output_contains-case-fail"),
    pytest.param(lambda e: e.cross_agent_data_flow("researcher", "writer", "findings.city"), PASS, id="cross_agent_data_flow-pass"),
    pytest.param(lambda e: e.cross_agent_data_flow("writer", "researcher", "draft"), HARD, id="cross_agent_data_flow-fail"),
    pytest.param(lambda e: e.follows_transitions([("orchestrator", "researcher"), ("researcher", "fact_checker"),
                                                  ("orchestrator", "writer")]), PASS, id="follows_transitions-pass"),
    pytest.param(lambda e: e.follows_transitions([("orchestrator", "researcher")]), HARD, id="follows_transitions-fail"),
    pytest.param(lambda e: e.aggregate_cost_under(0.02), PASS, id="aggregate_cost_under-pass"),
    pytest.param(lambda e: e.aggregate_cost_under(0.005), HARD, id="aggregate_cost_under-fail"),
    pytest.param(lambda e: e.aggregate_tokens_under(240), PASS, id="aggregate_tokens_under-pass"),
    pytest.param(lambda e: e.aggregate_tokens_under(200), HARD, id="aggregate_tokens_under-fail"),
    pytest.param(lambda e: e.aggregate_latency_under(178), PASS, id="aggregate_latency_under-pass"),
    pytest.param(lambda e: e.aggregate_latency_under(150), HARD, id="aggregate_latency_under-fail"),
    pytest.param(lambda e: e.agent_ordered_before("researcher", "writer"), PASS, id="agent_ordered_before-pass"),
    pytest.param(lambda e: e.agent_ordered_before("writer", "researcher"), HARD, id="agent_ordered_before-fail"),
    pytest.param(lambda e: e.agents_overlap("researcher", "fact_checker"), PASS, id="agents_overlap-pass"),
    pytest.param(lambda e: e.agents_overlap("researcher", "writer"), HARD, id="agents_overlap-fail"),
    pytest.param(lambda e: e.agent_wall_time_under("writer", 100), PASS, id="agent_wall_time_under-pass"),
    pytest.param(lambda e: e.agent_wall_time_under("writer", 20), HARD, id="agent_wall_time_under-fail"),
    pytest.param(lambda e: e.ordered_agents([["researcher", "fact_checker"], ["writer"]]), PASS, id="ordered_agents-pass"),
    pytest.param(lambda e: e.ordered_agents([["writer"], ["researcher"]]), HARD, id="ordered_agents-fail"),
    pytest.param(lambda e: e.all_tools_called(["web_search", "kb_lookup", "format_text"]), PASS, id="all_tools_called-pass"),
    pytest.param(lambda e: e.all_tools_called(["web_search", "send_email"]), HARD, id="all_tools_called-fail"),
]


def check_results(agent_result: AgentResult, chain: ExpectChain) -> None:
    assert [r.assertion_id for r in agent_result.assertion_results] == [a.assertion_id for a in chain.assertions]
    for r in agent_result.assertion_results:
        assert r.status in (PASS, SOFT, HARD) and 0.0 <= r.score <= 1.0 and r.explanation.strip(), r


@pytest.mark.parametrize(("build", "status"), CASES)
def test_trace_tree_method(attest, build: Build, status: str) -> None:
    chain = build(expect(TREE))
    (a,) = chain.assertions
    assert a.type == TYPE_TRACE_TREE
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)
    (r,) = agent_result.assertion_results
    assert (r.status, r.score) == (status, 1.0 if status == PASS else 0.0), r.explanation


def test_soft_failure_and_whole_chain(attest) -> None:
    chain = (expect(TREE).agent_called("writer").agent_called("translator", soft=True)
             .output_contains("Paris").delegation_depth(1, soft=True))
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)
    assert [r.status for r in agent_result.assertion_results] == [PASS, SOFT, PASS, SOFT]
    assert "translator" in agent_result.assertion_results[1].explanation


def test_missing_timestamps_fail_naming_what_is_missing(attest) -> None:
    """The SDK's own delegate()/TraceBuilder steps carry no timestamps."""
    child = _agent("helper", "trc_tt_nots_c", "trc_tt_nots", output={"answer": "ok"})
    root = TraceBuilder(agent_id="boss").set_trace_id("trc_tt_nots")
    root.add_step(Step(type="agent_call", name="helper", sub_trace=child))
    root.set_output(message="done")
    chain = expect(root.build()).agent_ordered_before("boss", "helper").agent_called("helper")
    agent_result = attest.evaluate(chain)
    ordered, called = agent_result.assertion_results
    assert ordered.status == HARD, ordered
    assert "started_at_ms" in ordered.explanation or "ended_at_ms" in ordered.explanation, ordered.explanation
    assert called.status == PASS


def test_bad_spec_is_error_1002(attest) -> None:
    with pytest.raises(ProtocolError) as excinfo:
        attest.evaluate(expect(TREE).ordered_agents([["writer"]]))
    assert excinfo.value.code == 1002
    assert attest.evaluate(expect(TREE).agent_called("writer")).assertion_results[0].status == PASS


def _sdk_trace_tree_methods() -> set[str]:
    names = set()
    for name, fn in inspect.getmembers(ExpectChain, inspect.isfunction):
        if not name.startswith("_") and "TYPE_TRACE_TREE" in inspect.getsource(fn):
            names.add(name)
    return names


def test_every_trace_tree_method_has_pass_and_fail_cases() -> None:
    methods = _sdk_trace_tree_methods()
    assert len(methods) == 13, sorted(methods)
    covered: dict[str, set[str]] = {}
    for param in CASES:
        build, status = param.values
        for name in build.__code__.co_names:
            if name in methods:
                covered.setdefault(name, set()).add("pass" if status == PASS else "fail")
    gaps = {m: {"pass", "fail"} - covered.get(m, set()) for m in methods}
    assert not {m: g for m, g in gaps.items() if g}, gaps
