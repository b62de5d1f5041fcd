"""What a request's structured-output fields ask for, as the (kind, spec) pair workers constrain sampling
with (`engine.structured_output`): OpenAI's `response_format` and vLLM's extensions, its `structured_outputs`
object and the older `guided_*` fields.

    response_format {"type": "json_schema", "json_schema": {"schema": S}}  -> ("json", S as JSON)
    response_format {"type": "json_object"}                                -> ("json_object", "")
    response_format {"type": "text"}, or nothing                          -> None
    structured_outputs {"json": S} / {"regex": R} / {"choice": [..]} / {"grammar": G} / {"json_object": true}
    guided_json S, guided_regex R, guided_choice [..], guided_grammar G

At most one of them may be set. The router checks their shapes (400 naming the field); the grammar itself
is compiled by the workers, whose refusal of an invalid schema, regex or grammar is a 400 too.
"""

from __future__ import annotations

import json

from router.api_models import _GenerationFields
from router.errors import bad_request

# A schema nested deeper than this is refused before it is parsed further, dumped or compiled: Python's JSON
# coder recurses (a string of 100,000 brackets was a RecursionError, a 500), and xgrammar has crashed on deep
# grammars (Dynamo caps their nesting at 500). Real schemas nest a few levels.
MAX_SCHEMA_DEPTH = 128
# A schema, regex, grammar or list of choices longer than this (as text) is refused: each worker compiles one
# grammar at a time (runtime.grammar_compiles), so a huge one holds back every new grammar behind it (real
# ones are a few KiB).
MAX_SPEC_CHARS = 65_536

# vLLM's structured_outputs keys, each the kind it asks for
STRUCTURED_OUTPUTS_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def structured_from(body: _GenerationFields) -> tuple[str, str] | None:
    """The one (kind, spec) the body asks for, or None; 400 for a malformed or doubled ask."""
    asks = [ask for ask in (_from_response_format(body.response_format), _from_structured_outputs(body.structured_outputs),
                            *_from_guided(body)) if ask is not None]  # fmt: skip
    if len(asks) > 1:
        fields = ", ".join(field for field, _ in asks)
        raise bad_request(f"only one structured output may be asked for, got {fields}", asks[1][0])
    return asks[0][1] if asks else None


def _from_response_format(value: dict | None) -> tuple[str, tuple[str, str]] | None:
    field = "response_format"
    if value is None or value.get("type") == "text":
        return None
    kind = value.get("type")
    if kind == "json_object":
        return field, ("json_object", "")
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise bad_request("response_format json_schema needs a json_schema object with a schema", field)
        return field, ("json", _schema_text(spec["schema"], f"{field}.json_schema.schema"))
    raise bad_request(f"response_format type must be text, json_object or json_schema, got {kind!r}", field)


def _from_structured_outputs(value: dict | None) -> tuple[str, tuple[str, str]] | None:
    field = "structured_outputs"
    if not value:
        return None
    asked = {key: v for key, v in value.items() if v is not None and v is not False}
    unknown = sorted(set(asked) - set(STRUCTURED_OUTPUTS_KEYS))
    if unknown:
        raise bad_request(f"structured_outputs: {', '.join(unknown)} is not supported; use one of "
                          f"{', '.join(STRUCTURED_OUTPUTS_KEYS)}", field)  # fmt: skip
    if len(asked) != 1:
        raise bad_request("structured_outputs must ask for exactly one of " + ", ".join(STRUCTURED_OUTPUTS_KEYS), field)
    key, spec = next(iter(asked.items()))
    return field, _spec(key, spec, f"{field}.{key}")


def _from_guided(body: _GenerationFields) -> list[tuple[str, tuple[str, str]] | None]:
    guided = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
    return [(field, _spec(kind, getattr(body, field), field)) if getattr(body, field) is not None else None
            for field, kind in guided.items()]  # fmt: skip


def _spec(kind: str, value, field: str) -> tuple[str, str]:
    """The (kind, spec) of one ask, no longer than `MAX_SPEC_CHARS`: text as given is measured before it is
    parsed, an object or a list of choices once written as JSON."""
    _check_length(value, field)
    kind, spec = _spec_text(kind, value, field)
    _check_length(spec, field)
    return kind, spec


def _check_length(value, field: str) -> None:
    if isinstance(value, str) and len(value) > MAX_SPEC_CHARS:
        raise bad_request(f"{field} is {len(value)} characters long; at most {MAX_SPEC_CHARS}", field)


def _spec_text(kind: str, value, field: str) -> tuple[str, str]:
    if kind == "json":
        return kind, _schema_text(value, field)
    if kind == "json_object":
        return kind, ""
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise bad_request(f"{field} must be a non-empty list of non-empty strings", field)
        return kind, json.dumps(value)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{field} must be a non-empty string", field)
    return kind, value


def _schema_text(schema, field: str) -> str:
    """A JSON schema as JSON text: given as an object, or as the text of one."""
    too_deep = bad_request(f"{field} is nested deeper than {MAX_SCHEMA_DEPTH} levels", field)
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise bad_request(f"{field} is not valid JSON", field) from None
        except RecursionError:  # deeper than the parser goes, so deeper than the bound
            raise too_deep from None
    if not isinstance(schema, dict):
        raise bad_request(f"{field} must be a JSON schema object", field)
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise too_deep
    return json.dumps(schema)


def _depth(value) -> int:
    """How deep a parsed JSON value nests, without recursion (a deep one must not overflow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_SCHEMA_DEPTH:  # past the bound, deeper makes no difference
                stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest
