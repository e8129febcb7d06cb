"""The check itself, in plain Python (no WIT types): importable and testable
anywhere. It passes when the target (by default ``output.message``) contains
``phrase``, ignoring case. Replace it with yours."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, List, Union

PLUGIN_ID = "{{name}}"
PLUGIN_VERSION = "0.1.0"
DESCRIPTION = "Passes when a target contains a phrase, ignoring case."

PASS, FAIL, HARD_FAIL = "pass", "fail", "hard-fail"

CONFIG_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "{{name}} config",
    "type": "object",
    "additionalProperties": False,
    "required": ["phrase"],
    "properties": {
        "target": {
            "description": "Where to look: a dotted path with [n] indices, such as output.message.",
            "type": "string",
            "pattern": r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+|\[[0-9]+\])*$",
            "default": "output.message",
        },
        "phrase": {"description": "The phrase the target must contain.", "type": "string", "minLength": 1},
    },
}


@dataclass
class Verdict:
    status: str
    score: float
    explanation: str
    details: str | None = None


@dataclass
class Failure:
    kind: str  # "invalid_config", "unsupported_trace" or "internal"
    message: str


Outcome = Union[Verdict, Failure]

_MISSING = object()


def resolve(root: Any, path: str) -> Any:
    """The value at a dotted path with [n] indices, or _MISSING."""
    cur = root
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        key: Any = int(part[1:-1]) if part.startswith("[") else part
        try:
            cur = cur[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return cur


def check(trace: Any, config: dict) -> Outcome:
    # The engine validated the config and filled in the schema's defaults.
    target = config.get("target", "output.message")
    phrase = config["phrase"]
    value = resolve(trace, target)
    if value is _MISSING:
        return Verdict(FAIL, 0.0, f"{target} could not be checked: it is not in the trace.")
    text = value if isinstance(value, str) else json.dumps(value)
    found = phrase.lower() in text.lower()
    verb = "contains" if found else "does not contain"
    return Verdict(PASS if found else FAIL, 1.0 if found else 0.0, f"{target} {verb} '{phrase}'.")


def evaluate(trace_text: str, configs: List[str]) -> List[Outcome]:
    """One outcome per config, in order."""
    try:
        trace = json.loads(trace_text)
    except ValueError as e:
        return [Failure("unsupported_trace", f"the trace is not JSON: {e}") for _ in configs]
    out: List[Outcome] = []
    for text in configs:
        try:
            out.append(check(trace, json.loads(text)))
        except Exception as e:  # never trap: a failure names what went wrong
            out.append(Failure("internal", f"{type(e).__name__}: {e}"))
    return out
