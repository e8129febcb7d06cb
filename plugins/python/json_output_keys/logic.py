"""json-output-keys: the plugin's logic, free of any WebAssembly or WIT code.

Everything here is plain Python (standard library only: ``json`` and ``re``),
so it runs under ordinary pytest. ``app.py`` maps these plain values onto the
WIT types of ``attest:plugin@0.1.0``.

An assertion checks that one JSON object in the trace (``output.structured`` by
default) has every key in ``required_keys``, none of ``forbidden_keys``, and
that the string values named in ``patterns`` match their regular expressions.
Each key named is one check; the score is the fraction of checks that passed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Union

from json_output_keys import target as targets

PLUGIN_ID = "json-output-keys"
PLUGIN_VERSION = "0.1.0"
DESCRIPTION = (
    "Checks that a JSON object in the trace (output.structured by default) has "
    "all required_keys, none of forbidden_keys, and string values matching "
    "patterns (Python re.search); score = fraction of checks passed."
)
DEFAULT_TARGET = "output.structured"

# Longest value quoted in an explanation; the full value is in `details`.
_QUOTE_LIMIT = 60

CONFIG_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "json-output-keys assertion config",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "target": {
            "description": (
                "The JSON object to check, in the engine's target grammar: output, "
                "output.structured, output.<path>, input.<path>, metadata.<path>, "
                "steps[?name=='<name>'].args|result|metadata[.<path>], "
                "steps[?type=='<type>'].result, steps[<index>].result; a <path> is "
                ".key, [index] or ['key'] segments."
            ),
            "type": "string",
            "pattern": targets.PATTERN,
            "maxLength": 1024,
            "default": DEFAULT_TARGET,
        },
        "parse_json_string": {
            "description": (
                "When the target is a string, parse it as JSON text first "
                "(for agents that emit their structured answer as a JSON string)."
            ),
            "type": "boolean",
            "default": False,
        },
        "required_keys": {
            "description": "Keys the object must have (top-level keys of the target, matched exactly).",
            "type": "array",
            "items": {"type": "string"},
            "uniqueItems": True,
            "default": [],
        },
        "forbidden_keys": {
            "description": "Keys the object must not have.",
            "type": "array",
            "items": {"type": "string"},
            "uniqueItems": True,
            "default": [],
        },
        "patterns": {
            "description": (
                "key -> Python regular expression, applied with re.search (anchor "
                "with ^ and $ for a full match). The key's value must be a string "
                "that matches. A pattern whose key is absent is not applicable and "
                "is not counted; list the key in required_keys too to demand it."
            ),
            "type": "object",
            "additionalProperties": {"type": "string"},
            "default": {},
        },
        "min_score": {
            "description": "Lowest score that still passes; 1 (the default) means every check must pass.",
            "type": "number",
            "minimum": 0,
            "maximum": 1,
            "default": 1,
        },
        "severity": {
            "description": "Status reported when the assertion does not hold; 'hard_fail' cannot be softened.",
            "enum": ["fail", "hard_fail"],
            "default": "fail",
        },
    },
    "anyOf": [
        {"required": ["required_keys"], "properties": {"required_keys": {"minItems": 1}}},
        {"required": ["forbidden_keys"], "properties": {"forbidden_keys": {"minItems": 1}}},
        {"required": ["patterns"], "properties": {"patterns": {"minProperties": 1}}},
    ],
}


def config_schema_json() -> str:
    return json.dumps(CONFIG_SCHEMA, separators=(",", ":"))


# --------------------------------------------------------------------------
# Plain result values (mapped onto WIT types by app.py)
# --------------------------------------------------------------------------

PASS = "pass"
FAIL = "fail"
HARD_FAIL = "hard_fail"


@dataclass
class Verdict:
    status: str  # PASS, FAIL or HARD_FAIL
    score: float
    explanation: str
    details: Optional[str]  # JSON text


@dataclass
class PluginFailure:
    """Why no verdict could be reached; `kind` names the WIT plugin-error case."""

    kind: str  # "invalid_config", "unsupported_trace" or "internal"
    message: str


Outcome = Union[Verdict, PluginFailure]


class _Failure(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def _invalid_config(message: str) -> _Failure:
    return _Failure("invalid_config", message)


# --------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------


@dataclass
class Config:
    target: targets.Target
    target_text: str
    parse_json_string: bool
    required_keys: List[str]
    forbidden_keys: List[str]
    patterns: List[tuple]  # (key, source, compiled)
    min_score: float
    severity: str


def _string_list(raw: dict, name: str) -> List[str]:
    value = raw.get(name, [])
    if not isinstance(value, list) or not all(isinstance(k, str) for k in value):
        raise _invalid_config(f"'{name}' must be an array of strings")
    return list(dict.fromkeys(value))  # drop duplicates, keep order


def parse_config(text: str) -> Config:
    """Parses and checks one assertion config (JSON text).

    The engine has already validated it against CONFIG_SCHEMA; this repeats the
    checks that matter (the plugin must not trust its input) and adds those the
    schema cannot express: regexes that compile, no key both required and
    forbidden.
    """
    try:
        raw = json.loads(text)
    except (ValueError, TypeError) as e:
        raise _invalid_config(f"config is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise _invalid_config("config must be a JSON object")
    unknown = sorted(set(raw) - set(CONFIG_SCHEMA["properties"]))
    if unknown:
        raise _invalid_config("unknown config field(s): " + ", ".join(unknown))

    target_text = raw.get("target", DEFAULT_TARGET)
    if not isinstance(target_text, str):
        raise _invalid_config("'target' must be a string such as 'output.structured'")
    try:
        target = targets.parse(target_text)
    except targets.TargetError as e:
        raise _invalid_config(str(e)) from None

    parse_json_string = raw.get("parse_json_string", False)
    if not isinstance(parse_json_string, bool):
        raise _invalid_config("'parse_json_string' must be a boolean")

    required = _string_list(raw, "required_keys")
    forbidden = _string_list(raw, "forbidden_keys")
    both = [k for k in required if k in forbidden]
    if both:
        raise _invalid_config(
            "key(s) both required and forbidden: " + ", ".join(_q(k) for k in both)
        )

    raw_patterns = raw.get("patterns", {})
    if not isinstance(raw_patterns, dict):
        raise _invalid_config("'patterns' must be an object of key -> regular expression")
    patterns = []
    for key, source in raw_patterns.items():
        if not isinstance(source, str):
            raise _invalid_config(f"pattern for key {_q(key)} must be a string")
        if key in forbidden:
            raise _invalid_config(f"key {_q(key)} is forbidden and also has a pattern")
        try:
            compiled = re.compile(source)
        except re.error as e:
            raise _invalid_config(f"pattern for key {_q(key)} is not a valid regular expression: {e}") from None
        patterns.append((key, source, compiled))

    if not required and not forbidden and not patterns:
        raise _invalid_config(
            "nothing to check: give at least one of required_keys, forbidden_keys, patterns"
        )

    min_score = raw.get("min_score", 1)
    if isinstance(min_score, bool) or not isinstance(min_score, (int, float)) or not 0 <= min_score <= 1:
        raise _invalid_config("'min_score' must be a number from 0 to 1")

    severity = raw.get("severity", "fail")
    if severity not in ("fail", "hard_fail"):
        raise _invalid_config("'severity' must be 'fail' or 'hard_fail'")

    return Config(
        target=target,
        target_text=target_text,
        parse_json_string=parse_json_string,
        required_keys=required,
        forbidden_keys=forbidden,
        patterns=patterns,
        min_score=float(min_score),
        severity=HARD_FAIL if severity == "hard_fail" else FAIL,
    )


# --------------------------------------------------------------------------
# Trace
# --------------------------------------------------------------------------


def parse_trace(text: str) -> dict:
    try:
        trace = json.loads(text)
    except (ValueError, TypeError) as e:
        raise _Failure("unsupported_trace", f"trace is not JSON: {e}") from None
    if not isinstance(trace, dict):
        raise _Failure("unsupported_trace", "trace is not a JSON object")
    return trace


# --------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------


def _q(text: str) -> str:
    """Quotes a key or value for an explanation, clipped."""
    if len(text) > _QUOTE_LIMIT:
        text = text[: _QUOTE_LIMIT - 1] + "…"
    return json.dumps(text, ensure_ascii=False)


def _check_count(config: Config) -> int:
    return len(config.required_keys) + len(config.forbidden_keys) + len(config.patterns)


def _status(config: Config, score: float) -> str:
    return PASS if score >= config.min_score else config.severity


def _unreachable_target(config: Config, reason: str) -> Verdict:
    """The target is absent or not an object: every check fails."""
    total = _check_count(config)
    details = {
        "target": config.target_text,
        "target_is_object": False,
        "reason": reason,
        "checks_total": total,
        "checks_passed": 0,
    }
    return Verdict(
        status=_status(config, 0.0),
        score=0.0,
        explanation=f"{reason}, so " + ("its 1 check fails" if total == 1 else f"all {total} checks fail"),
        details=json.dumps(details, ensure_ascii=False),
    )


def evaluate_one(trace: dict, config: Config) -> Verdict:
    target = config.target_text
    try:
        value = targets.resolve(config.target, trace)
    except targets.Missing as e:
        return _unreachable_target(config, str(e))
    if isinstance(value, str) and config.parse_json_string:
        try:
            value = json.loads(value)
        except ValueError as e:
            return _unreachable_target(config, f"{target} is a string that is not JSON text ({e.msg})")
    if not isinstance(value, dict):
        hint = ""
        if isinstance(value, str) and not config.parse_json_string:
            hint = " (set parse_json_string to parse JSON text)"
        return _unreachable_target(config, f"{target} is {targets.kind(value)}, not a JSON object{hint}")

    missing = [k for k in config.required_keys if k not in value]
    present_forbidden = [k for k in config.forbidden_keys if k in value]
    mismatched = []  # (key, reason)
    not_applicable = []
    matched = []
    for key, source, compiled in config.patterns:
        if key not in value:
            not_applicable.append(key)
            continue
        v = value[key]
        if not isinstance(v, str):
            mismatched.append((key, f"{_q(key)} is {targets.kind(v)}, not a string"))
        elif compiled.search(v) is None:
            mismatched.append((key, f"{_q(key)}: {_q(v)} does not match /{source}/"))
        else:
            matched.append(key)

    total = len(config.required_keys) + len(config.forbidden_keys) + len(config.patterns) - len(not_applicable)
    failed = len(missing) + len(present_forbidden) + len(mismatched)
    passed = total - failed
    score = 1.0 if total == 0 else passed / total
    status = _status(config, score)

    if failed == 0:
        parts = []
        if config.required_keys:
            n = len(config.required_keys)
            parts.append("the required key " + _q(config.required_keys[0]) if n == 1 else f"all {n} required keys")
        if config.forbidden_keys:
            n = len(config.forbidden_keys)
            parts.append("not the forbidden key " + _q(config.forbidden_keys[0]) if n == 1 else f"none of {n} forbidden keys")
        if matched:
            parts.append(_n(len(matched), "value") + " matching " + ("its pattern" if len(matched) == 1 else "their patterns"))
        if total == 0:
            explanation = (
                f"{target} has none of the keys the patterns apply to ("
                + ", ".join(_q(k) for k in not_applicable)
                + "), so no check applied"
            )
        else:
            explanation = f"{target} has " + _join(parts) + f" ({passed}/{total} checks passed)"
    else:
        problems = []
        if missing:
            problems.append("missing required " + _plural(len(missing), "key") + ": " + ", ".join(_q(k) for k in missing))
        if present_forbidden:
            problems.append("forbidden " + _plural(len(present_forbidden), "key") + " present: " + ", ".join(_q(k) for k in present_forbidden))
        if mismatched:
            problems.append(_plural(len(mismatched), "pattern mismatch", "pattern mismatches") + ": " + "; ".join(r for _, r in mismatched))
        explanation = f"{target} failed {failed} of {_n(total, 'check')}: " + "; ".join(problems)
    unreported = [k for k in not_applicable if k not in missing]
    if unreported and total > 0:
        explanation += (
            "; " + _plural(len(unreported), "pattern") + " not applied (key absent): "
            + ", ".join(_q(k) for k in unreported)
        )

    details = {
        "target": target,
        "target_is_object": True,
        "checks_total": total,
        "checks_passed": passed,
        "missing_keys": missing,
        "forbidden_keys_present": present_forbidden,
        "pattern_mismatches": [{"key": k, "reason": r} for k, r in mismatched],
        "patterns_not_applied": not_applicable,
    }
    return Verdict(
        status=status,
        score=score,
        explanation=explanation,
        details=json.dumps(details, ensure_ascii=False),
    )


def _plural(count: int, word: str, plural: Optional[str] = None) -> str:
    return word if count == 1 else (plural or word + "s")


def _n(count: int, word: str) -> str:
    return f"{count} {_plural(count, word)}"


def _join(parts: List[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def evaluate(
    trace_text: str,
    configs: List[str],
    log: Optional[Callable[[str], None]] = None,
) -> List[Outcome]:
    """One outcome per config, in order. `log` receives one debug line per call."""
    try:
        trace: Optional[dict] = parse_trace(trace_text)
        trace_error: Optional[PluginFailure] = None
    except _Failure as f:
        trace, trace_error = None, PluginFailure(f.kind, f.message)

    if log is not None:
        trace_id = trace.get("trace_id") if trace is not None else None
        log(
            f"{PLUGIN_ID} {PLUGIN_VERSION}: evaluating {len(configs)} config(s) "
            f"against trace {trace_id if isinstance(trace_id, str) else '(unreadable)'}"
        )

    outcomes: List[Outcome] = []
    for text in configs:
        if trace_error is not None:
            outcomes.append(trace_error)
            continue
        try:
            outcomes.append(evaluate_one(trace, parse_config(text)))
        except _Failure as f:
            outcomes.append(PluginFailure(f.kind, f.message))
        except Exception as e:  # a bug here must not take the other configs down
            outcomes.append(PluginFailure("internal", f"{type(e).__name__}: {e}"))
    return outcomes
