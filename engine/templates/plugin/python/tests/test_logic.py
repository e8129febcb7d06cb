import json

from {{module}} import logic

TRACE = json.dumps({"schema_version": 1, "trace_id": "t", "output": {"message": "Your REFUND is on its way."}})


def test_passes_when_the_phrase_is_there_and_fails_when_it_is_not():
    ok, missing_phrase, missing_target = logic.evaluate(
        TRACE,
        [json.dumps({"phrase": "refund"}), json.dumps({"phrase": "apology"}), json.dumps({"phrase": "x", "target": "output.nope"})],
    )
    assert ok.status == logic.PASS
    assert missing_phrase.status == logic.FAIL
    assert missing_phrase.explanation == "output.message does not contain 'apology'."
    assert "could not be checked" in missing_target.explanation


def test_a_trace_that_is_not_json_is_unsupported():
    (out,) = logic.evaluate("nope", ["{}"])
    assert out.kind == "unsupported_trace"


def test_the_schema_requires_a_phrase():
    assert logic.CONFIG_SCHEMA["required"] == ["phrase"]
