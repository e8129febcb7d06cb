"""Target paths, in the engine's grammar (crates/attest-trace/src/target.rs, Attest protocol v1 §4).

    target     := base segment*
    base       := "output" | "input" | "metadata"
                | "steps" selector "." step_field
    selector   := "[?name==" quoted "]" | "[?type==" quoted "]" | "[" index "]"
    step_field := "args" | "result" | "metadata" | "name" | "type"
    segment    := "." key | "[" index "]" | "[" quoted "]"
    quoted     := '…' | "…"

`steps[?name=='x']` / `steps[?type=='t']` select the first matching top-level
step. Keys containing dots or brackets are written `['a.b']`. The engine's
`.length` forms count things, so they never name an object and are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Tuple, Union

_IDENT = "A-Za-z0-9_$-"
_QUOTED = "'[^']*'|\"[^\"]*\""

# The grammar as one regular expression, for the config schema's `pattern`
# (the engine validates configs with it before the plugin sees them).
PATTERN = (
    r"^(?:output|input|metadata"
    r"|steps\[(?:\?(?:name|type) *== *(?:" + _QUOTED + r")|[0-9]+)\]\.(?:args|result|metadata|name|type))"
    r"(?:\.[" + _IDENT + r"]+|\[(?:[0-9]+|" + _QUOTED + r")\])*$"
)

STEP_FIELDS = ("args", "result", "metadata", "name", "type")


class TargetError(ValueError):
    """The target text is not valid syntax."""


@dataclass(frozen=True)
class Target:
    text: str
    base: str  # "output", "input", "metadata" or "step"
    selector: Tuple[str, Union[str, int]]  # ("name"|"type"|"index", value); only for "step"
    step_field: str  # only for "step"
    path: Tuple[Union[str, int], ...]  # str = key, int = index
    base_text: str


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def err(self, what: str) -> TargetError:
        return TargetError(f"unsupported target {json.dumps(self.text)}: {what} at position {self.pos}")

    def rest(self) -> str:
        return self.text[self.pos:]

    def eat(self, s: str) -> bool:
        if self.rest().startswith(s):
            self.pos += len(s)
            return True
        return False

    def skip_ws(self) -> None:
        while self.rest().startswith(" "):
            self.pos += 1

    def ident(self):
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isascii() and (self.text[self.pos].isalnum() or self.text[self.pos] in "_$-")):
            self.pos += 1
        return self.text[start:self.pos] or None

    def index(self):
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789":
            self.pos += 1
        return int(self.text[start:self.pos]) if self.pos > start else None

    def quoted(self) -> str:
        rest = self.rest()
        if not rest or rest[0] not in "'\"":
            raise self.err("expected a quoted string")
        end = rest.find(rest[0], 1)
        if end < 0:
            self.pos += 1
            raise self.err("unterminated quoted string")
        self.pos += end + 1
        return rest[1:end]

    def parse(self) -> Target:
        if len(self.text.encode()) > 1024:
            raise TargetError("unsupported target: longer than 1024 bytes")
        root = self.ident()
        selector: Tuple[str, Union[str, int]] = ("", "")
        step_field = ""
        if root in ("output", "input", "metadata"):
            base = root
        elif root == "steps":
            base = "step"
            selector, step_field = self.steps()
        else:
            self.pos = 0
            raise self.err("a target starts with output, input, metadata or steps")
        base_text = self.text[: self.pos]
        path: List[Union[str, int]] = []
        while self.rest():
            if self.eat("."):
                key = self.ident()
                if key is None:
                    raise self.err("expected a key after '.'")
                path.append(key)
            elif self.eat("["):
                i = self.index()
                path.append(i if i is not None else self.quoted())
                if not self.eat("]"):
                    raise self.err("expected ']'")
            else:
                raise self.err("expected '.' or '['")
        return Target(self.text, base, selector, step_field, tuple(path), base_text)

    def steps(self):
        if not self.eat("["):
            raise self.err(
                "select a step first (steps[?name=='…'], steps[?type=='…'] or steps[<index>]); "
                "steps.length is a count, not an object"
            )
        if self.eat("?"):
            key = self.ident()
            self.skip_ws()
            if not self.eat("=="):
                raise self.err("expected '==' in a step filter")
            self.skip_ws()
            value = self.quoted()
            if key not in ("name", "type"):
                raise self.err("steps can be filtered by name or type")
            selector: Tuple[str, Union[str, int]] = (key, value)
        else:
            i = self.index()
            if i is None:
                raise self.err("expected ?name=='…', ?type=='…' or an index inside steps[…]")
            selector = ("index", i)
        if not self.eat("]"):
            raise self.err("expected ']'")
        if not self.eat("."):
            raise self.err("expected a step field (" + ", ".join(STEP_FIELDS) + ")")
        field = self.ident()
        if field == "length" and not self.rest():
            raise self.err("steps[…].length is a count, not an object")
        if field not in STEP_FIELDS:
            raise self.err("expected a step field (" + ", ".join(STEP_FIELDS) + ")")
        return selector, field


def parse(text: str) -> Target:
    return _Parser(text).parse()


def _quote(s: str) -> str:
    return json.dumps(s if len(s) <= 60 else s[:59] + "…", ensure_ascii=False)


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _render(seg: Union[str, int]) -> str:
    if isinstance(seg, int):
        return f"[{seg}]"
    if seg and all(c.isascii() and (c.isalnum() or c in "_$-") for c in seg):
        return "." + seg
    return f"['{seg}']"


class Missing(Exception):
    """What the target names is not in this trace; the message says what is missing."""


def resolve(target: Target, trace: dict) -> Any:
    """The value `target` names in `trace`, or raises Missing."""
    if target.base == "output":
        if "output" not in trace:
            raise Missing("trace has no output")
        node = trace["output"]
    elif target.base in ("input", "metadata"):
        node = trace.get(target.base)
        if node is None:  # absent and null both mean "not provided"
            raise Missing(f"trace has no {target.base}")
    else:
        node = _step_field(target, trace)

    at = target.base_text
    for seg in target.path:
        if isinstance(seg, str) and isinstance(node, dict):
            if seg not in node:
                keys = list(node)
                if keys:
                    shown = ", ".join(_quote(k) for k in keys[:10]) + (", …" if len(keys) > 10 else "")
                    raise Missing(f"field {_quote(seg)} not found in {at} (available: {shown})")
                raise Missing(f"field {_quote(seg)} not found in {at} (it is empty)")
            node = node[seg]
        elif isinstance(seg, int) and isinstance(node, list):
            if seg >= len(node):
                raise Missing(f"index {seg} is out of range for {at} (length {len(node)})")
            node = node[seg]
        else:
            what = f"index {seg}" if isinstance(seg, int) else f"field {_quote(seg)}"
            raise Missing(f"{at} is {kind(node)}, so {what} cannot be read from it")
        at += _render(seg)
    return node


def _step_field(target: Target, trace: dict) -> Any:
    steps = trace.get("steps")
    steps = [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
    how, want = target.selector
    if how == "index":
        step = steps[want] if want < len(steps) else None
    else:
        step = next((s for s in steps if s.get(how) == want), None)
    if step is None:
        if how == "index":
            raise Missing(f"no step at index {want} (the trace has {len(steps)} steps)")
        if how == "type":
            raise Missing(f"no step of type {_quote(want)}")
        if not steps:
            raise Missing(f"no step named {_quote(want)} (the trace has no steps)")
        names = [s.get("name") for s in steps if isinstance(s.get("name"), str)]
        raise Missing(f"no step named {_quote(want)} (steps: {', '.join(_quote(n) for n in names)})")
    value = step.get(target.step_field)
    if value is None:
        raise Missing(f"step {_quote(str(step.get('name', '')))} has no {target.step_field}")
    return value
