"""Unit tests for json_output_keys.logic: plain pytest, no WebAssembly.

Run from this directory: `pytest -q` (see README.md). The schema tests use the
`jsonschema` package when it is installed (requirements-dev.txt) and are
skipped otherwise.
"""

import json
from pathlib import Path

import pytest

from json_output_keys import logic

EXAMPLE_TRACE = Path(__file__).resolve().parents[2] / "examples" / "refund_trace.json"


def make_trace(output=None, **extra):
    trace = {
        "schema_version": 1,
        "trace_id": "trc_test",
        "steps": [
            {"type": "tool_call", "name": "lookup_order", "args": {"order_id": "ORD-1"},
             "result": {"status": "delivered", "amount": 89.99}},
        ],
        "output": output if output is not None else {
            "message": "Refund RFD-001 processed.",
            "structured": {"refund_id": "RFD-001", "confidence": 0.95, "currency": "USD"},
        },
    }
    trace.update(extra)
    return json.dumps(trace)


def run(config, trace=None):
    """Evaluates one config; returns its outcome."""
    [outcome] = logic.evaluate(trace if trace is not None else make_trace(), [json.dumps(config)])
    return outcome


def verdict(config, trace=None):
    outcome = run(config, trace)
    assert isinstance(outcome, logic.Verdict), outcome
    return outcome


def failure(config, trace=None):
    outcome = run(config, trace)
    assert isinstance(outcome, logic.PluginFailure), outcome
    return outcome


# --------------------------------------------------------------------------
# Passing assertions
# --------------------------------------------------------------------------


def test_all_checks_pass():
    v = verdict({
        "required_keys": ["refund_id", "confidence"],
        "forbidden_keys": ["internal_notes"],
        "patterns": {"refund_id": r"^RFD-\d{3}$", "currency": "^[A-Z]{3}$"},
    })
    assert v.status == logic.PASS
    assert v.score == 1.0
    assert "output.structured" in v.explanation
    assert "5/5 checks passed" in v.explanation
    details = json.loads(v.details)
    assert details["checks_total"] == 5 and details["checks_passed"] == 5
    assert details["missing_keys"] == [] and details["forbidden_keys_present"] == []


def test_single_required_key_named_in_explanation():
    v = verdict({"required_keys": ["refund_id"]})
    assert v.status == logic.PASS
    assert 'the required key "refund_id"' in v.explanation


def test_example_trace_from_repo():
    v = verdict({"required_keys": ["refund_id", "confidence"]}, EXAMPLE_TRACE.read_text())
    assert v.status == logic.PASS and v.score == 1.0


def test_target_output():
    v = verdict({"target": "output", "required_keys": ["message", "structured"],
                 "patterns": {"message": "RFD-\\d+"}})
    assert v.status == logic.PASS
    assert v.explanation.startswith("output has")


@pytest.mark.parametrize("target", [
    "steps[0].result",
    "steps[?name=='lookup_order'].result",
    'steps[?name == "lookup_order"].result',
    "steps[?type=='tool_call'].result",
])
def test_step_targets(target):
    v = verdict({"target": target, "required_keys": ["status"],
                 "patterns": {"status": "^delivered$"}})
    assert v.status == logic.PASS and v.score == 1.0
    assert v.explanation.startswith(target)


def test_nested_and_quoted_key_targets():
    trace = make_trace({"structured": {"items": [{"a.b": {"sku": "X-1"}}]}})
    v = verdict({"target": "output.structured.items[0]['a.b']", "required_keys": ["sku"]}, trace)
    assert v.status == logic.PASS
    v = verdict({"target": "input.context", "required_keys": ["lang"]},
                make_trace(input={"context": {"lang": "en"}}))
    assert v.status == logic.PASS


def test_parse_json_string():
    trace = make_trace({"message": "ok", "structured": '{"refund_id": "RFD-9"}'})
    v = verdict({"required_keys": ["refund_id"], "parse_json_string": True}, trace)
    assert v.status == logic.PASS


def test_patterns_use_search_not_fullmatch():
    assert verdict({"patterns": {"refund_id": "001"}}).status == logic.PASS
    assert verdict({"patterns": {"refund_id": "^001"}}).status == logic.FAIL


# --------------------------------------------------------------------------
# Failing assertions
# --------------------------------------------------------------------------


def test_missing_forbidden_and_mismatch_are_named():
    v = verdict({
        "required_keys": ["refund_id", "reason", "eta_days"],
        "forbidden_keys": ["confidence", "debug"],
        "patterns": {"refund_id": "^REF-"},
    })
    assert v.status == logic.FAIL
    # 6 checks: refund_id ok, reason missing, eta_days missing, confidence
    # present, debug absent (ok), refund_id pattern mismatch -> 2/6 passed.
    assert v.score == pytest.approx(2 / 6)
    assert '"reason", "eta_days"' in v.explanation
    assert 'forbidden key present: "confidence"' in v.explanation
    assert '"RFD-001" does not match /^REF-/' in v.explanation
    assert "failed 4 of 6 checks" in v.explanation
    details = json.loads(v.details)
    assert details["missing_keys"] == ["reason", "eta_days"]
    assert details["forbidden_keys_present"] == ["confidence"]
    assert [m["key"] for m in details["pattern_mismatches"]] == ["refund_id"]


def test_pattern_on_non_string_value_fails():
    v = verdict({"patterns": {"confidence": r"^0\.9"}})
    assert v.status == logic.FAIL and v.score == 0.0
    assert '"confidence" is a number, not a string' in v.explanation


def test_pattern_for_absent_key_is_not_counted():
    v = verdict({"required_keys": ["refund_id"], "patterns": {"nickname": "^[a-z]+$"}})
    assert v.status == logic.PASS and v.score == 1.0
    assert "1/1 checks passed" in v.explanation
    assert 'not applied (key absent): "nickname"' in v.explanation
    assert json.loads(v.details)["patterns_not_applied"] == ["nickname"]


def test_only_inapplicable_patterns_pass_vacuously():
    v = verdict({"patterns": {"nickname": "x"}})
    assert v.status == logic.PASS and v.score == 1.0
    assert "no check applied" in v.explanation


def test_required_and_pattern_on_missing_key():
    v = verdict({"required_keys": ["reason"], "patterns": {"reason": "."}})
    assert v.status == logic.FAIL and v.score == 0.0
    assert "failed 1 of 1 check:" in v.explanation
    # the absent key is reported once, as missing, not again as "not applied"
    assert "not applied" not in v.explanation


@pytest.mark.parametrize("output, reason", [
    ({"message": "no structured output"}, 'field "structured" not found in output (available: "message")'),
    ({"structured": None}, "output.structured is null, not a JSON object"),
    ({"structured": [1, 2]}, "output.structured is an array, not a JSON object"),
    ({"structured": '{"refund_id": "x"}'}, "set parse_json_string"),
])
def test_target_not_an_object_fails_every_check(output, reason):
    v = verdict({"required_keys": ["refund_id"], "forbidden_keys": ["debug"]}, make_trace(output))
    assert v.status == logic.FAIL and v.score == 0.0
    assert reason in v.explanation
    assert "all 2 checks fail" in v.explanation
    assert json.loads(v.details)["target_is_object"] is False


@pytest.mark.parametrize("target, reason", [
    ("output.message.text", 'output.message is a string, so field "text" cannot be read from it'),
    ("output.structured[0]", "output.structured is an object, so index 0 cannot be read from it"),
    ("steps[5].result", "no step at index 5 (the trace has 1 steps)"),
    ("steps[?name=='refund'].args", 'no step named "refund" (steps: "lookup_order")'),
    ("steps[?type=='retrieval'].result", 'no step of type "retrieval"'),
    ("steps[0].metadata", 'step "lookup_order" has no metadata'),
    ("metadata", "trace has no metadata"),
])
def test_unresolvable_targets_fail(target, reason):
    v = verdict({"target": target, "required_keys": ["a"]})
    assert v.status == logic.FAIL and v.score == 0.0
    assert reason in v.explanation


def test_array_index_out_of_range():
    trace = make_trace({"structured": {"items": []}})
    v = verdict({"target": "output.structured.items[2]", "required_keys": ["a"]}, trace)
    assert "index 2 is out of range for output.structured.items (length 0)" in v.explanation


def test_parse_json_string_with_bad_json():
    trace = make_trace({"structured": "{not json"})
    v = verdict({"required_keys": ["a"], "parse_json_string": True}, trace)
    assert v.status == logic.FAIL and "not JSON text" in v.explanation


def test_severity_hard_fail():
    v = verdict({"required_keys": ["reason"], "severity": "hard_fail"})
    assert v.status == logic.HARD_FAIL
    assert verdict({"required_keys": ["refund_id"], "severity": "hard_fail"}).status == logic.PASS


def test_min_score_allows_partial_pass():
    config = {"required_keys": ["refund_id", "confidence", "currency", "reason"], "min_score": 0.75}
    v = verdict(config)
    assert v.score == 0.75 and v.status == logic.PASS
    assert '"reason"' in v.explanation  # still named although it passes
    config["min_score"] = 0.8
    assert verdict(config).status == logic.FAIL


def test_long_values_are_clipped_in_explanation_only():
    long_value = "x" * 500
    trace = make_trace({"structured": {"k": long_value}})
    v = verdict({"patterns": {"k": "^y"}}, trace)
    assert long_value not in v.explanation
    assert len(v.explanation) < 200


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("config, message", [
    ({"required_keys": ["a"], "patterns": {"a": "("}}, "not a valid regular expression"),
    ({"required_keys": ["a"], "forbidden_keys": ["a"]}, "both required and forbidden"),
    ({"forbidden_keys": ["a"], "patterns": {"a": "x"}}, "forbidden and also has a pattern"),
    ({}, "nothing to check"),
    ({"required_keys": []}, "nothing to check"),
    ({"required_keys": "a"}, "'required_keys' must be an array of strings"),
    ({"required_keys": ["a"], "extra": 1}, "unknown config field(s): extra"),
    ({"required_keys": ["a"], "target": "output..x"}, "expected a key after '.' at position 7"),
    ({"required_keys": ["a"], "target": "trace.output"}, "a target starts with output, input, metadata or steps"),
    ({"required_keys": ["a"], "target": "steps.length"}, "steps.length is a count"),
    ({"required_keys": ["a"], "target": "steps[?name=='x'].length"}, "is a count, not an object"),
    ({"required_keys": ["a"], "target": "steps[?id=='x'].args"}, "steps can be filtered by name or type"),
    ({"required_keys": ["a"], "target": "steps[0].output"}, "expected a step field"),
    ({"required_keys": ["a"], "target": "output['x"}, "unterminated quoted string"),
    ({"required_keys": ["a"], "min_score": 2}, "'min_score'"),
    ({"required_keys": ["a"], "severity": "warn"}, "'severity'"),
])
def test_invalid_config(config, message):
    f = failure(config)
    assert f.kind == "invalid_config"
    assert message in f.message


def test_config_not_json():
    [f] = logic.evaluate(make_trace(), ["{nope"])
    assert isinstance(f, logic.PluginFailure) and f.kind == "invalid_config"
    assert "config is not JSON" in f.message


@pytest.mark.parametrize("trace", ["not json", "[1, 2]"])
def test_unusable_trace_answers_every_config(trace):
    outcomes = logic.evaluate(trace, [json.dumps({"required_keys": ["a"]})] * 2)
    assert len(outcomes) == 2
    assert all(isinstance(o, logic.PluginFailure) and o.kind == "unsupported_trace" for o in outcomes)


def test_one_result_per_config_in_order_and_errors_isolated():
    configs = [
        json.dumps({"required_keys": ["refund_id"]}),
        json.dumps({"required_keys": ["x"], "patterns": {"x": "["}}),
        json.dumps({"required_keys": ["reason"]}),
    ]
    outcomes = logic.evaluate(make_trace(), configs)
    assert [type(o).__name__ for o in outcomes] == ["Verdict", "PluginFailure", "Verdict"]
    assert outcomes[0].status == logic.PASS
    assert outcomes[2].status == logic.FAIL


def test_internal_error_is_isolated(monkeypatch):
    def boom(trace, config):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(logic, "evaluate_one", boom)
    [o] = logic.evaluate(make_trace(), [json.dumps({"required_keys": ["a"]})])
    assert isinstance(o, logic.PluginFailure) and o.kind == "internal"
    assert "RuntimeError: kaboom" in o.message


def test_empty_config_list():
    assert logic.evaluate(make_trace(), []) == []


# --------------------------------------------------------------------------
# Logging
# --------------------------------------------------------------------------


def test_logs_exactly_once_per_call():
    lines = []
    logic.evaluate(make_trace(), [json.dumps({"required_keys": ["a"]})] * 3, log=lines.append)
    assert len(lines) == 1
    assert "3 config(s)" in lines[0] and "trc_test" in lines[0]


def test_logs_once_even_when_trace_is_unreadable():
    lines = []
    logic.evaluate("garbage", [json.dumps({"required_keys": ["a"]})], log=lines.append)
    assert len(lines) == 1 and "(unreadable)" in lines[0]


# --------------------------------------------------------------------------
# Config schema
# --------------------------------------------------------------------------


def test_schema_is_json_and_draft_2020_12():
    schema = json.loads(logic.config_schema_json())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert set(schema["properties"]) == {
        "target", "parse_json_string", "required_keys", "forbidden_keys",
        "patterns", "min_score", "severity",
    }


VALID_CONFIGS = [
    {"required_keys": ["a"]},
    {"forbidden_keys": ["a"]},
    {"patterns": {"a": "^x$"}},
    {"target": "output", "required_keys": ["a"], "min_score": 0.5, "severity": "hard_fail"},
    {"target": "steps[0].result", "parse_json_string": True, "forbidden_keys": ["b"]},
    {"target": "steps[?name=='lookup_order'].result['odd key'][0].x", "required_keys": ["a"]},
]
INVALID_CONFIGS = [
    {},
    {"required_keys": []},
    {"required_keys": ["a", "a"]},
    {"required_keys": [1]},
    {"required_keys": ["a"], "target": ""},
    {"required_keys": ["a"], "target": "output."},
    {"required_keys": ["a"], "target": "steps.0.result"},
    {"required_keys": ["a"], "target": "steps.length"},
    {"required_keys": ["a"], "target": "result"},
    {"required_keys": ["a"], "min_score": 1.5},
    {"required_keys": ["a"], "severity": "soft"},
    {"required_keys": ["a"], "unknown": True},
    {"patterns": {"a": 1}},
]


@pytest.mark.parametrize("config", VALID_CONFIGS)
def test_schema_accepts(config):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator(logic.CONFIG_SCHEMA).validate(config)
    assert isinstance(run(config), logic.Verdict)


@pytest.mark.parametrize("config", INVALID_CONFIGS)
def test_schema_rejects(config):
    jsonschema = pytest.importorskip("jsonschema")
    assert not jsonschema.Draft202012Validator(logic.CONFIG_SCHEMA).is_valid(config)


def test_schema_is_a_valid_schema():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(logic.CONFIG_SCHEMA)


# --------------------------------------------------------------------------
# Target grammar: the schema's pattern and the parser agree
# --------------------------------------------------------------------------

TARGETS = [
    "output", "output.structured", "input.context.lang", "metadata.model",
    "output.a[0]['b.c'][\"d\"].e-f", "steps[3].args", "steps[?name=='x y'].result.z",
    'steps[?type=="llm_call"].metadata', "steps[0].name",
    "", "output.", "output..a", "outputs", "steps", "steps.length", "steps[x].args",
    "steps[?name=='x'].length", "steps[0].results", "output[']", "output.a b", "output[-1]",
]


@pytest.mark.parametrize("text", TARGETS)
def test_schema_pattern_matches_parser(text):
    import re
    from json_output_keys import target
    try:
        target.parse(text)
        parsed = True
    except target.TargetError:
        parsed = False
    assert bool(re.match(target.PATTERN, text)) == parsed
