"""End-to-end tests of layer 8 (WebAssembly plugins) through the real attest-ai 0.9.0 SDK.

Assertions are built with the SDK's ``expect(result).plugin(plugin_id, config, soft=...)``
DSL, which emits ``{"type": "plugin", "spec": {"plugin_id", "config"?, "soft"}}``, and are
evaluated with the SDK pytest plugin's ``attest`` fixture.

The SDK spawns ``$ATTEST_ENGINE_PATH --log-level=warn`` with no way to pass
``--plugin``; the engine is pointed at the built components through its
environment instead. The SDK's ``attest_engine`` fixture is session-scoped and
starts the engine lazily, the first time a test asks for it, which is always
after collection has imported this module; so setting the variables at import
time below is enough (no conftest change), and it applies to the whole session:

- ``ATTEST_PLUGIN_DIR=<repo>/plugins/dist``: every ``.wasm`` there is loaded.
  ``future-api.wasm`` (built against ``attest:plugin@9.0.0``) is refused at load
  time; that is logged and not fatal.
- ``ATTEST_CACHE_DIR=<repo>/target/plugin-test-cache``: the compiled-plugin cache
  shared with the Rust integration tests, so the 18 MB Python component
  (``json-output-keys.wasm``) is compiled once per machine.
- ``ATTEST_ENGINE_TIMEOUT`` (the SDK's per-request timeout, 30 s by default) is
  raised unless already set: on a cold cache the engine compiles that Python
  component before it answers ``initialize``, which takes longer than 30 s on
  small machines.

If ``plugins/dist`` does not exist at all, every test here is skipped with the
command that builds it; a missing component in an existing ``dist`` fails.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from attest import AgentResult, ExpectChain, Trace, TraceBuilder, expect
from attest._proto.codec import ProtocolError
from attest._proto.types import STATUS_HARD_FAIL, STATUS_PASS, STATUS_SOFT_FAIL, TYPE_PLUGIN

_REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = _REPO / "plugins" / "dist"
SHARED_CACHE = _REPO / "target" / "plugin-test-cache"

if PLUGIN_DIR.is_dir():
    os.environ["ATTEST_PLUGIN_DIR"] = str(PLUGIN_DIR)
    os.environ["ATTEST_CACHE_DIR"] = str(SHARED_CACHE)
    os.environ.setdefault("ATTEST_ENGINE_TIMEOUT", "300")

pytestmark = pytest.mark.skipif(
    not PLUGIN_DIR.is_dir(),
    reason=f"{PLUGIN_DIR} does not exist: build the plugins with plugins/build.sh and plugins/python/build.sh",
)

PASS = STATUS_PASS  # "pass"
SOFT = STATUS_SOFT_FAIL  # "soft_fail"
HARD = STATUS_HARD_FAIL  # "hard_fail"

EXAMPLE_PLUGINS = ("pii-leak", "tool-args", "refusal", "step-value", "json-output-keys", "readability")
NEEDED_COMPONENTS = EXAMPLE_PLUGINS + ("spin",)


@pytest.fixture(autouse=True)
def _components_are_built() -> None:
    missing = [name for name in NEEDED_COMPONENTS if not (PLUGIN_DIR / f"{name}.wasm").is_file()]
    assert not missing, (
        f"{', '.join(m + '.wasm' for m in missing)} missing from {PLUGIN_DIR}: "
        "run plugins/build.sh, plugins/python/build.sh and plugins/js/build.sh"
    )


# ─────────────────────────────────────────────────────────────────────────────
# Traces: the refund conversation and variants of it
# ─────────────────────────────────────────────────────────────────────────────

REFUND_MESSAGE = (
    "Your refund of $89.99 has been processed. You'll see it in 3 business days. "
    "Refund ID: RFD-001."
)
LEAKY_MESSAGE = (
    "Refund sent. Contact john.doe@gmail.com or +1 (555) 123-4567; "
    "card 4111 1111 1111 1111 was charged."
)
REFUSING_MESSAGE = "I'm sorry, but I can't help with that request."
LOOKUP_RESULT = {"status": "delivered", "amount": 89.99, "eligible_for_refund": True}
STRUCTURED = {"refund_id": "RFD-001", "confidence": 0.95}


def refund_trace(
    trace_id: str,
    *,
    message: str = REFUND_MESSAGE,
    refund_args: dict | None = None,
    structured: dict | None = None,
) -> Trace:
    builder = TraceBuilder(agent_id="refund-agent").set_trace_id(trace_id)
    builder.set_input(user_message="I want a refund for order ORD-123")
    builder.add_llm_call("reasoning", result={"completion": "Look up the order, then refund it."})
    builder.add_tool_call("lookup_order", args={"order_id": "ORD-123"}, result=LOOKUP_RESULT)
    builder.add_tool_call(
        "process_refund",
        args=refund_args if refund_args is not None else {"order_id": "ORD-123", "amount": 89.99},
        result={"refund_id": "RFD-001", "estimated_days": 3},
    )
    builder.set_output_dict({"message": message, "structured": structured if structured is not None else STRUCTURED})
    builder.set_metadata(total_tokens=1350, cost_usd=0.0067, latency_ms=4200, model="gpt-4.1")
    return builder.build()


TRACES: dict[str, Trace] = {
    "refund": refund_trace("trc_e2e_plugin_refund"),
    # The answer leaks an e-mail address, a phone number and a card number.
    "leaky": refund_trace("trc_e2e_plugin_leaky", message=LEAKY_MESSAGE),
    "refusing": refund_trace("trc_e2e_plugin_refusing", message=REFUSING_MESSAGE),
    # The refund went out for the wrong amount, with a malformed order id.
    "wrong_refund": refund_trace(
        "trc_e2e_plugin_wrong_refund", refund_args={"order_id": "order-123", "amount": 80.0}
    ),
    # The structured answer lacks its confidence and carries an internal field.
    "bad_structured": refund_trace(
        "trc_e2e_plugin_bad_structured", structured={"refund_id": "REF-1", "internal_note": "vip"}
    ),
}

REFUND_ARGS = {"tool": "process_refund", "expect": {"order_id": {"regex": r"^ORD-\d+$"}, "amount": {"equals": 89.99}}}
AMOUNTS_MATCH = {
    "left": "steps[?name=='process_refund'].args.amount",
    "right": "steps[?name=='lookup_order'].result.amount",
    "tolerance": 0.01,
}
STRUCTURED_KEYS = {"required_keys": ["refund_id", "confidence"], "forbidden_keys": ["internal_note"], "patterns": {"refund_id": r"^RFD-\d{3}$"}}


def test_trace_wire_shape() -> None:
    """The traces reach the engine with the fields the plugins read."""
    wire = TRACES["wrong_refund"].to_dict()
    assert [(s["type"], s["name"]) for s in wire["steps"]] == [
        ("llm_call", "reasoning"),
        ("tool_call", "lookup_order"),
        ("tool_call", "process_refund"),
    ]
    assert wire["steps"][2]["args"] == {"order_id": "order-123", "amount": 80.0}
    assert wire["output"]["message"] == REFUND_MESSAGE
    assert wire["input"] == {"user_message": "I want a refund for order ORD-123"}


# ─────────────────────────────────────────────────────────────────────────────
# Helpers
# ─────────────────────────────────────────────────────────────────────────────

Build = Callable[[ExpectChain], ExpectChain]


def case(case_id: str, trace: str, build: Build, status: str, score: float, phrase: str):
    """One table row: ``build(expect(TRACES[trace]))`` yields one result with this
    status and score, whose explanation contains ``phrase``."""
    return pytest.param(trace, build, status, score, phrase, id=f"{case_id}[{trace}]")


def check_results(agent_result: AgentResult, chain: ExpectChain) -> None:
    sent = [a.assertion_id for a in chain.assertions]
    got = [r.assertion_id for r in agent_result.assertion_results]
    assert got == sent, "one result per assertion, in request order"
    for r in agent_result.assertion_results:
        assert r.status in (PASS, SOFT, HARD), r
        assert 0.0 <= r.score <= 1.0, r
        assert isinstance(r.explanation, str) and r.explanation.strip(), r
        assert len(r.explanation) <= 1024, r


# ─────────────────────────────────────────────────────────────────────────────
# Every example plugin, passing and failing, through expect().plugin()
# ─────────────────────────────────────────────────────────────────────────────

PLUGIN_CASES = [
    # readability: the JavaScript plugin (componentize-js, attest:plugin@0.2.0)
    case("readability-pass", "refund", lambda e: e.plugin("readability"), PASS, 1.0,
         "output.message reads at grade 0.5 (Flesch-Kincaid: 17 words, 3 sentences, 20 syllables), within the maximum grade 8."),
    case("readability-fail", "refusing", lambda e: e.plugin("readability", {"max_grade": 1}), HARD, 0.87,
         "output.message reads at grade 2.3"),
    case("readability-soft", "refusing", lambda e: e.plugin("readability", {"max_grade": 1}, soft=True), SOFT, 0.87,
         "above the maximum grade 1"),
    # A 0.2.0 plugin whose capability the operator did not grant (plugin_dir grants nothing):
    # it loads, and its call is refused with the config key that grants it.
    case("rubric-not-granted", "refund", lambda e: e.plugin("rubric", {"rubric": "Warm and clear."}), HARD, 0.0,
         "capability 'judge' is not granted to plugin 'rubric'"),
    # pii-leak
    case("pii-leak-pass", "refund", lambda e: e.plugin("pii-leak"), PASS, 1.0,
         "output.message contains no email address, phone number or card number."),
    case("pii-leak-fail", "leaky", lambda e: e.plugin("pii-leak"), HARD, 0.0,
         "output.message leaks personal data: 1 email address (e.g. 'j***@gmail.com')"),
    case("pii-leak-fail-cards-only", "leaky", lambda e: e.plugin("pii-leak", {"kinds": ["card"]}), HARD, 0.0,
         "1 card number (e.g. '**** **** **** 1111')"),
    case("pii-leak-pass-allowlisted", "leaky",
         lambda e: e.plugin("pii-leak", {"kinds": ["email"], "allowlist": ["@gmail.com"]}), PASS, 1.0,
         "allowlisted"),
    case("pii-leak-pass-other-target", "leaky", lambda e: e.plugin("pii-leak", {"target": "input.user_message"}),
         PASS, 1.0, "input.user_message contains no"),
    case("pii-leak-soft", "leaky", lambda e: e.plugin("pii-leak", soft=True), SOFT, 0.0, "leaks personal data"),
    case("pii-leak-hard-fail-not-softened", "leaky",
         lambda e: e.plugin("pii-leak", {"hard_fail": True}, soft=True), HARD, 0.0, "leaks personal data"),
    # tool-args
    case("tool-args-pass", "refund", lambda e: e.plugin("tool-args", REFUND_ARGS), PASS, 1.0,
         "The only call to 'process_refund' (step 2) matches: amount equals 89.99"),
    case("tool-args-fail", "wrong_refund", lambda e: e.plugin("tool-args", REFUND_ARGS), HARD, 0.0,
         "argument 'amount' is 80, expected 89.99"),
    case("tool-args-fail-never-called", "refund",
         lambda e: e.plugin("tool-args", {"tool": "send_email", "expect": {"to": {"regex": "@corp\\.com$"}}}),
         HARD, 0.0, "'send_email' was never called (tool calls: ['lookup_order', 'process_refund'])"),
    case("tool-args-soft", "wrong_refund", lambda e: e.plugin("tool-args", REFUND_ARGS, soft=True), SOFT, 0.0,
         "which does not match /^ORD-\\d+$/"),
    # refusal
    case("refusal-pass", "refund", lambda e: e.plugin("refusal"), PASS, 1.0,
         "output.message does not read as a refusal"),
    case("refusal-fail", "refusing", lambda e: e.plugin("refusal"), HARD, 0.0,
         "output.message reads as a refusal: 'i cannot help with'"),
    case("refusal-must-refuse-pass", "refusing", lambda e: e.plugin("refusal", {"mode": "must_refuse"}), PASS, 1.0,
         "refuses as required"),
    case("refusal-must-refuse-fail", "refund", lambda e: e.plugin("refusal", {"mode": "must_refuse"}), HARD, 0.0,
         "does not refuse, but a refusal is required"),
    case("refusal-soft", "refusing", lambda e: e.plugin("refusal", {}, soft=True), SOFT, 0.0, "reads as a refusal"),
    # step-value
    case("step-value-pass", "refund", lambda e: e.plugin("step-value", AMOUNTS_MATCH), PASS, 1.0,
         "args.amount = 89.99 equals steps[?name=='lookup_order'].result.amount = 89.99 (tolerance 0.01)"),
    case("step-value-fail", "wrong_refund", lambda e: e.plugin("step-value", AMOUNTS_MATCH), HARD, 0.0,
         "args.amount = 80 does not equal"),
    case("step-value-fail-literal", "refund",
         lambda e: e.plugin("step-value", {"left": "metadata.cost_usd", "op": "gt", "value": 0.01}), HARD, 0.0,
         "metadata.cost_usd = 0.0067 is not greater than 0.01."),
    case("step-value-soft", "wrong_refund", lambda e: e.plugin("step-value", AMOUNTS_MATCH, soft=True), SOFT, 0.0,
         "a difference of"),
    # json-output-keys (the Python component)
    case("json-output-keys-pass", "refund", lambda e: e.plugin("json-output-keys", STRUCTURED_KEYS), PASS, 1.0,
         "(4/4 checks passed)"),
    case("json-output-keys-fail", "bad_structured", lambda e: e.plugin("json-output-keys", STRUCTURED_KEYS), HARD,
         0.25, "output.structured failed 3 of 4 checks"),
    case("json-output-keys-pass-min-score", "bad_structured",
         lambda e: e.plugin("json-output-keys", {**STRUCTURED_KEYS, "min_score": 0.25}), PASS, 0.25,
         "missing required key: \"confidence\""),
    case("json-output-keys-soft", "bad_structured",
         lambda e: e.plugin("json-output-keys", STRUCTURED_KEYS, soft=True), SOFT, 0.25,
         "forbidden key present: \"internal_note\""),
]


@pytest.mark.parametrize(("trace", "build", "status", "score", "phrase"), PLUGIN_CASES)
def test_example_plugin(attest, trace, build, status, score, phrase) -> None:
    chain = build(expect(TRACES[trace]))
    (assertion,) = chain.assertions
    assert assertion.type == TYPE_PLUGIN == "plugin"
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)
    (result,) = agent_result.assertion_results
    assert (result.status, result.score) == (status, pytest.approx(score)), (
        f"{result.status} score={result.score}: {result.explanation}"
    )
    assert phrase in result.explanation, result.explanation
    assert agent_result.passed is (status == PASS)
    assert len(agent_result.hard_failures) == (status == HARD)
    assert len(agent_result.soft_failures) == (status == SOFT)


def test_every_example_plugin_has_pass_and_fail_cases() -> None:
    covered: dict[str, set[str]] = {}
    for param in PLUGIN_CASES:
        trace, build, status, _score, _phrase = param.values
        (assertion,) = build(expect(TRACES[trace])).assertions
        covered.setdefault(assertion.spec["plugin_id"], set()).add(status)
    for plugin_id in EXAMPLE_PLUGINS:
        assert covered.get(plugin_id, set()) >= {PASS, HARD, SOFT}, (plugin_id, covered.get(plugin_id))


def test_masked_samples_only(attest) -> None:
    """pii-leak reports what leaked without repeating it."""
    agent_result = attest.evaluate(expect(TRACES["leaky"]).plugin("pii-leak"))
    (result,) = agent_result.assertion_results
    assert result.status == HARD
    for secret in ("john.doe", "4111 1111 1111 1111", "123-4567"):
        assert secret not in result.explanation, result.explanation


# ─────────────────────────────────────────────────────────────────────────────
# Chains mixing plugins and built-in assertions
# ─────────────────────────────────────────────────────────────────────────────


def test_plugins_and_builtins_in_one_chain(attest) -> None:
    chain = (
        expect(TRACES["leaky"])
        .output_contains("Refund")                                               # pass
        .plugin("pii-leak", {"kinds": ["email"]})                                # hard_fail
        .plugin("tool-args", REFUND_ARGS)                                        # pass
        .cost_under(0.001)                                                       # hard_fail
        .plugin("pii-leak", {"target": "input.user_message"})                    # pass
        .plugin("refusal", {"mode": "must_refuse"}, soft=True)                   # soft_fail
        .plugin("step-value", AMOUNTS_MATCH)                                     # pass
        .plugin("json-output-keys", {"required_keys": ["refund_id", "currency"]})  # hard_fail 0.5
        .tools_called_in_order(["lookup_order", "process_refund"])              # pass
        .plugin("pii-leak", {"kinds": ["card"]}, soft=True)                      # soft_fail
    )
    agent_result = attest.evaluate(chain)
    check_results(agent_result, chain)
    assert [(r.status, r.score) for r in agent_result.assertion_results] == [
        (PASS, 1.0),
        (HARD, 0.0),
        (PASS, 1.0),
        (HARD, 0.0),
        (PASS, 1.0),
        (SOFT, 0.0),
        (PASS, 1.0),
        (HARD, pytest.approx(0.5)),
        (PASS, 1.0),
        (SOFT, 0.0),
    ]
    explanations = [r.explanation for r in agent_result.assertion_results]
    assert "email" in explanations[1] and "card" not in explanations[1]
    assert "card" in explanations[9] and "email" not in explanations[9]
    ids = [a.assertion_id for a in chain.assertions]
    assert agent_result.pass_count == 5
    assert agent_result.fail_count == 5
    assert [r.assertion_id for r in agent_result.hard_failures] == [ids[1], ids[3], ids[7]]
    assert [r.assertion_id for r in agent_result.soft_failures] == [ids[5], ids[9]]
    assert agent_result.total_cost == 0.0


def test_engine_loaded_the_plugin_directory(attest) -> None:
    """list_plugins (no SDK wrapper in 0.9.0: sent through the fixture's client)."""
    listing = attest._run_on_engine_loop(attest.client.send_request("list_plugins", {}))
    ids = {p["id"] for p in listing["plugins"]}
    assert set(EXAMPLE_PLUGINS) <= ids, ids
    assert "spin" in ids
    assert listing["api_versions"] == ["0.2.0", "0.1.0"], listing["api_versions"]
    versions = {p["id"]: p["api_version"] for p in listing["plugins"]}
    # Plugins built with the SDKs are 0.2.0; the Python one (and hostile ones
    # written against their own copy of the 0.1.0 WIT) are still 0.1.0.
    assert set(versions.values()) == {"0.2.0", "0.1.0"}, versions
    for plugin_id in ("pii-leak", "tool-args", "refusal", "step-value", "readability", "spin"):
        assert versions[plugin_id] == "0.2.0", versions
    assert versions["json-output-keys"] == "0.1.0", versions
    failed = {Path(f["path"]).name: f["error"] for f in listing["failed"]}
    assert "future-api.wasm" in failed, listing["failed"]
    assert "attest:plugin@9.0.0" in failed["future-api.wasm"] and "0.2.0, 0.1.0" in failed["future-api.wasm"]


# ─────────────────────────────────────────────────────────────────────────────
# A hostile plugin is contained
# ─────────────────────────────────────────────────────────────────────────────


def test_spinning_plugin_is_a_contained_hard_fail(attest) -> None:
    chain = (
        expect(TRACES["refund"])
        .output_contains("RFD-001")
        .plugin("spin")
        .plugin("pii-leak")
        .plugin("spin", soft=True)
    )
    started = time.monotonic()
    agent_result = attest.evaluate(chain)
    elapsed = time.monotonic() - started
    check_results(agent_result, chain)
    builtin, spin, pii, spin_soft = agent_result.assertion_results
    assert (builtin.status, builtin.score) == (PASS, 1.0)
    assert (pii.status, pii.score) == (PASS, 1.0), pii.explanation
    for r in (spin, spin_soft):
        # A fault is never softened.
        assert (r.status, r.score) == (HARD, 0.0), r
        # Default limits: no fuel metering, so the 2 s deadline stops it.
        assert "plugin 'spin'" in r.explanation and "timed out after 2000 ms" in r.explanation, r.explanation
    assert elapsed < 20, f"the spin plugin held the batch for {elapsed:.1f} s"
    assert [r.assertion_id for r in agent_result.hard_failures] == [spin.assertion_id, spin_soft.assertion_id]

    # The engine keeps serving.
    follow_up = expect(TRACES["refund"]).plugin("refusal").output_contains("refund")
    agent_result = attest.evaluate(follow_up)
    assert [r.status for r in agent_result.assertion_results] == [PASS, PASS]


# ─────────────────────────────────────────────────────────────────────────────
# Bad plugin assertions fail the request with 1002
# ─────────────────────────────────────────────────────────────────────────────

ERROR_CASES = [
    pytest.param(lambda e: e.plugin("no-such-plugin"), "unknown plugin 'no-such-plugin'", id="unknown-plugin"),
    pytest.param(lambda e: e.plugin("tool-args", {"tool": "process_refund"}), "does not match its schema",
                 id="config-missing-required"),
    pytest.param(lambda e: e.plugin("pii-leak", {"kinds": ["ssn"]}), "does not match its schema", id="config-bad-enum"),
    pytest.param(lambda e: e.output_contains("refund").plugin("step-value", {"left": "metadata.cost_usd"}),
                 "does not match its schema", id="config-error-fails-whole-batch"),
]


@pytest.mark.parametrize(("build", "message"), ERROR_CASES)
def test_bad_plugin_assertion_is_error_1002(attest, build, message) -> None:
    with pytest.raises(ProtocolError) as excinfo:
        attest.evaluate(build(expect(TRACES["refund"])))
    assert excinfo.value.code == 1002
    assert message in excinfo.value.error_message, excinfo.value.error_message

    agent_result = attest.evaluate(expect(TRACES["refund"]).plugin("pii-leak"))
    assert agent_result.assertion_results[0].status == PASS


def test_plugin_wire_form() -> None:
    """What expect().plugin() sends: the engine's layer 8 spec."""
    (a,) = expect(TRACES["refund"]).plugin("tool-args", REFUND_ARGS, soft=True).assertions
    assert a.type == "plugin"
    assert a.spec == {"plugin_id": "tool-args", "soft": True, "config": REFUND_ARGS}
    (b,) = expect(TRACES["refund"]).plugin("refusal").assertions
    assert b.spec == {"plugin_id": "refusal", "soft": False}
    json.dumps(a.to_dict())
