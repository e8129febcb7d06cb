"""WIT glue for world `assertion-plugin` (attest:plugin@0.1.0).

componentize-py generates the `wit_world` and `componentize_py_types` modules
at build time; this module is only importable inside that build. All logic
lives in `json_output_keys.logic`.

Mapping (componentize-py 0.25): world-level exports are methods of a class
named `WitWorld`; `result<T, E>` *inside a list* is a plain value, `Ok(T)` or
`Err(E)` from `componentize_py_types` (only a function whose own return type is
a `result` raises `Err`); the `plugin-error` variant is one dataclass per case
(`PluginError_InvalidConfig(value)`, ...).
"""

from typing import List

import wit_world
from componentize_py_types import Err, Ok, Result
from wit_world.imports import host, types

from json_output_keys import logic

_STATUS = {
    logic.PASS: types.Status.PASS,
    logic.FAIL: types.Status.FAIL,
    logic.HARD_FAIL: types.Status.HARD_FAIL,
}

_ERROR = {
    "invalid_config": types.PluginError_InvalidConfig,
    "unsupported_trace": types.PluginError_UnsupportedTrace,
    "internal": types.PluginError_Internal,
}


def _log_debug(message: str) -> None:
    host.log(host.LogLevel.DEBUG, message)


def _to_wit(outcome: logic.Outcome) -> Result[types.Verdict, types.PluginError]:
    if isinstance(outcome, logic.Verdict):
        return Ok(
            types.Verdict(
                status=_STATUS[outcome.status],
                score=float(outcome.score),
                explanation=outcome.explanation,
                details=outcome.details,
            )
        )
    return Err(_ERROR.get(outcome.kind, types.PluginError_Internal)(outcome.message))


class WitWorld(wit_world.WitWorld):
    def describe(self) -> types.PluginInfo:
        return types.PluginInfo(
            id=logic.PLUGIN_ID,
            version=logic.PLUGIN_VERSION,
            description=logic.DESCRIPTION,
            config_schema=logic.config_schema_json(),
        )

    def evaluate(
        self, trace: str, configs: List[str]
    ) -> List[Result[types.Verdict, types.PluginError]]:
        # Plain print() is fine in a plugin: the engine serves WASI stdout
        # and discards it (use host.log for what the engine should keep).
        print(f"json-output-keys: {len(configs)} config(s)")
        try:
            outcomes = logic.evaluate(trace, configs, log=_log_debug)
        except Exception as e:  # never trap: answer every config with `internal`
            message = f"{type(e).__name__}: {e}"
            return [Err(types.PluginError_Internal(message)) for _ in configs]
        return [_to_wit(o) for o in outcomes]
