"""What a suite's checks may ask of the regex engine and of JSON Schema, and the time they get.

A suite is a file someone else may have written, and its checks run against text it partly
controls too (``answer_prefix`` is put in front of every answer). Two things in it could stop a
comparison after every variant has run:

- a regex with catastrophic backtracking (``^(a|aa)+$`` on a long run of ``a``) spins for ever in
  Python's ``re``. Every pattern of a suite (a ``regex`` check, a JSON Schema ``pattern``,
  ``patternProperties``) runs in the ``regex`` package with a time limit,
  :data:`REGEX_TIME_LIMIT_S`, and a pattern over it fails its check with a sentence saying so;
- a JSON Schema ``$ref`` that is remote (``https://...``) would be fetched or fail to resolve, and
  one that refers back to itself recurses without end. A suite's schema may only refer to local
  JSON pointers (``#/$defs/item``) that exist and form no cycle, and it may not nest deeper than
  :data:`MAX_SCHEMA_DEPTH`; anything else is refused when the suite is loaded
  (:func:`schema_policy_problem`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import regex
from jsonschema import ValidationError
from jsonschema.validators import extend, validator_for

REGEX_TIME_LIMIT_S = 0.5
CHECK_TIME_LIMIT_S = 2.0
"""All the pattern matching one check may do (a schema may hold many patterns, an answer many keys)."""
MAX_SCHEMA_DEPTH = 32
MAX_PATTERN_CHARS = 2000
_REFUSED_KEYWORDS = ("$dynamicRef", "$recursiveRef", "$id", "id")


class RegexTimeoutError(Exception):
    """A suite's pattern took longer than REGEX_TIME_LIMIT_S on a text."""

    def __init__(self, pattern: str) -> None:
        super().__init__(f"the pattern '{pattern[:60]}' took longer than {REGEX_TIME_LIMIT_S:g} s on the answer")
        self.pattern = pattern


def compile_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be a suite's regex (None when it can)."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"it is {len(pattern):,} characters long, more than {MAX_PATTERN_CHARS:,}"
    try:
        regex.compile(pattern)
    except (regex.error, ValueError, OverflowError, RecursionError) as exc:
        return str(exc)
    return None


_budget = threading.local()


@contextlib.contextmanager
def check_budget(seconds: float = CHECK_TIME_LIMIT_S) -> Iterator[None]:
    """Within the block, every :func:`timed_search` together gets at most ``seconds``."""
    previous = getattr(_budget, "deadline", None)
    _budget.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _budget.deadline = previous


def timed_search(pattern: str, text: str, flags: int = 0) -> Any:
    """``regex.search`` held to REGEX_TIME_LIMIT_S (and to what is left of an enclosing
    :func:`check_budget`). Raises RegexTimeoutError past it, regex.error for an invalid pattern."""
    deadline = getattr(_budget, "deadline", None)
    limit = REGEX_TIME_LIMIT_S if deadline is None else min(REGEX_TIME_LIMIT_S, deadline - time.monotonic())
    if limit <= 0:
        raise RegexTimeoutError(pattern)
    try:
        return regex.search(pattern, text, flags, timeout=limit)
    except TimeoutError:
        raise RegexTimeoutError(pattern) from None


# -- JSON Schema -----------------------------------------------------------------------------------


def _walk(schema: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) in a schema, depth first, the root first."""
    stack = [(path, schema)]
    while stack:
        at, value = stack.pop()
        yield at, value
        if isinstance(value, dict):
            stack.extend(((*at, k), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend(((*at, i), v) for i, v in enumerate(value))


def _pointer_target(schema: Any, ref: str) -> tuple[tuple[Any, ...], Any] | None:
    """The (path, subschema) a local ``#/a/b`` pointer names; None when it names nothing."""
    if ref == "#":
        return (), schema
    if not ref.startswith("#/"):
        return None
    node = schema
    path: list[Any] = []
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
            path.append(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            path.append(int(part))
        else:
            return None
    return tuple(path), node


def schema_policy_problem(schema: Any) -> tuple[str, tuple[Any, ...]] | None:
    """Why a suite may not use ``schema`` and where (None when it may): deeper than
    MAX_SCHEMA_DEPTH, a remote, anchored, dynamic or dangling ``$ref``, a ``$ref`` cycle, an
    ``$id``, or a pattern that does not compile."""
    refs: dict[tuple[Any, ...], str] = {}
    for path, value in _walk(schema):
        if len(path) > MAX_SCHEMA_DEPTH:
            return f"it nests more than {MAX_SCHEMA_DEPTH} levels deep", path[:MAX_SCHEMA_DEPTH]
        if not isinstance(value, dict):
            continue
        for keyword in _REFUSED_KEYWORDS:
            if keyword in value and not (keyword == "id" and not isinstance(value[keyword], str)):
                return f"'{keyword}' is not allowed in a suite's schema (refer with local '#/...' pointers)", path
        if "$ref" in value:
            ref = value["$ref"]
            if not isinstance(ref, str) or _pointer_target(schema, ref) is None:
                return (
                    f"the $ref {str(ref)[:80]!r} is not a local pointer to a part of this schema "
                    "(suites refer only to '#/...' inside themselves, never to other files or addresses)",
                    (*path, "$ref"),
                )
            refs[path] = ref
        for keyword in ("pattern",):
            if isinstance(value.get(keyword), str):
                problem = compile_problem(value[keyword])
                if problem:
                    return f"the pattern {value[keyword][:60]!r} is invalid ({problem})", (*path, keyword)
        if isinstance(value.get("patternProperties"), dict):
            for key in value["patternProperties"]:
                problem = compile_problem(str(key))
                if problem:
                    return f"the pattern {str(key)[:60]!r} is invalid ({problem})", (*path, "patternProperties")
        if "unevaluatedProperties" in value and any(
            isinstance(v, dict) and "patternProperties" in v for _, v in _walk(schema)
        ):
            return "'unevaluatedProperties' cannot be combined with 'patternProperties' in a suite", path
    cycle = _ref_cycle(schema, refs)
    if cycle is not None:
        return f"the $ref {cycle[1]!r} leads back to itself (a cycle, which would never finish)", (*cycle[0], "$ref")
    return None


def _ref_cycle(schema: Any, refs: dict[tuple[Any, ...], str]) -> tuple[tuple[Any, ...], str] | None:
    """A ``$ref`` from which following refs (those inside each target) comes back to it."""

    def refs_under(target: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return [p for p in refs if p[: len(target)] == target]

    for start, ref in refs.items():
        seen: set[tuple[Any, ...]] = set()
        found = _pointer_target(schema, ref)
        frontier = refs_under(found[0]) if found else []
        while frontier:
            here = frontier.pop()
            if here == start:
                return start, ref
            if here in seen:
                continue
            seen.add(here)
            nxt = _pointer_target(schema, refs[here])
            if nxt is not None:
                frontier.extend(refs_under(nxt[0]))
    return None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not timed_search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if timed_search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, allowed: Any, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance if key not in properties and not any(timed_search(p, key) for p in patterns)]
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        verb = "was" if len(extras) == 1 else "were"
        yield ValidationError(
            f"Additional properties are not allowed ({', '.join(map(repr, extras))} {verb} unexpected)"
        )


def budget_validator(schema: dict[str, Any]) -> Any:
    """A validator for ``schema`` whose ``pattern``, ``patternProperties`` and
    ``additionalProperties`` match with the time-limited regex engine (they raise RegexTimeoutError
    past REGEX_TIME_LIMIT_S). ``$ref`` resolves only inside the schema (the policy above is
    checked when the suite loads)."""
    base = validator_for(schema)
    cls = extend(
        base,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    )
    return cls(schema, format_checker=base.FORMAT_CHECKER)
