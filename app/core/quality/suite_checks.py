"""Judging a model's answer to a suite prompt: each kind of check, with the reason in one sentence.

:func:`check_answer` never raises: a broken check is a failed result saying so. Text checks
(exact, contains, regex) forgive surrounding quotes, whitespace and a final period; JSON checks
(json_schema, fields, tool_call) find the first JSON value in the answer (a fenced block first) and
say when the answer was cut off inside one; ``similar`` scores the answer's opening against each
reference by content-word F1 (:mod:`app.core.quality.suite_similarity`). :func:`pass_rate` is the share of
passed results.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import regex
from jsonschema import exceptions as schema_exceptions
from jsonschema.validators import validator_for

from app.core.quality.suite import DEFAULT_SIMILARITY, Check, SuitePrompt, clip
from app.core.quality.suite_schema import (
    REGEX_TIME_LIMIT_S,
    RegexTimeoutError,
    budget_validator,
    check_budget,
    schema_policy_problem,
    timed_search,
)
from app.core.quality.suite_similarity import answer_opening, content_words, paragraphs, similarity


@dataclass(frozen=True)
class CheckResult:
    """Whether an answer passed its check, and why."""

    passed: bool
    reason: str  # one plain sentence for the app


def _quoted(text: str, limit: int = 60) -> str:
    return f"'{clip(text, limit)}'"


_QUOTE_PAIRS = {'"': '"', "'": "'", "`": "`", "“": "”", "‘": "’", "«": "»"}


def _bare(answer: str) -> str:
    """The answer without surrounding whitespace, one pair of quotes and a trailing period."""
    text = answer.strip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    if len(text) >= 2 and _QUOTE_PAIRS.get(text[0]) == text[-1]:
        text = text[1:-1].strip()
        if text.endswith(".") and not text.endswith(".."):
            text = text[:-1].rstrip()
    return text


def _same(a: str, b: str, case_sensitive: bool) -> bool:
    return a == b if case_sensitive else a.casefold() == b.casefold()


def _check_exact(check: Check, answer: str) -> CheckResult:
    wanted = (check.value or "").strip()
    bare = _bare(answer)
    if any(_same(candidate, wanted, check.case_sensitive) for candidate in (answer.strip(), bare)):
        return CheckResult(True, f"The answer is exactly {_quoted(wanted)}.")
    if not bare:
        return CheckResult(False, f"The answer is empty; expected exactly {_quoted(wanted)}.")
    if check.case_sensitive and _same(bare, wanted, False):
        return CheckResult(False, f"The answer is {_quoted(bare)}, not {_quoted(wanted)} with that case.")
    return CheckResult(False, f"Expected exactly {_quoted(wanted)}, but the answer is {_quoted(bare)}.")


def _check_contains(check: Check, answer: str) -> CheckResult:
    wanted = check.value or ""
    if check.case_sensitive:
        if wanted in answer:
            return CheckResult(True, f"The answer contains {_quoted(wanted)}.")
        if wanted.casefold() in answer.casefold():
            return CheckResult(False, f"The answer contains {_quoted(wanted)} only with a different case.")
    elif wanted.casefold() in answer.casefold():
        return CheckResult(True, f"The answer contains {_quoted(wanted)}.")
    if not answer.strip():
        return CheckResult(False, f"The answer is empty; expected it to contain {_quoted(wanted)}.")
    return CheckResult(False, f"The answer does not contain {_quoted(wanted)}.")


def _check_regex(check: Check, answer: str) -> CheckResult:
    pattern = check.value or ""
    flags = regex.DOTALL | (0 if check.case_sensitive else regex.IGNORECASE)
    try:
        match = timed_search(pattern, answer, flags)
    except RegexTimeoutError:
        return CheckResult(False, _timeout_reason(pattern))
    except regex.error as exc:  # only a Check built without validation can get here
        return CheckResult(False, f"The check's regex {_quoted(pattern)} is invalid ({exc}).")
    if match is not None:
        return CheckResult(True, f"The answer matches {_quoted(pattern)} at {_quoted(match.group(0), 40)}.")
    if not answer.strip():
        return CheckResult(False, f"The answer is empty; expected it to match {_quoted(pattern)}.")
    return CheckResult(False, f"The answer does not match {_quoted(pattern)}.")


def _timeout_reason(pattern: str) -> str:
    return (
        f"The check's pattern {_quoted(pattern)} took longer than {REGEX_TIME_LIMIT_S:g} s on this answer and "
        "was stopped (a pattern that backtracks without end); the check fails."
    )


# A fenced block: ```json ... ``` (the closing fence may be missing when max_tokens cut the answer).
_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CLOSERS = {"{": "}", "[": "]"}
_MAX_UNCLOSED = 8  # bounds the work on an answer that is a long run of unclosed brackets


def _balanced_end(text: str, start: int) -> int | None:
    """The index of the bracket closing the one at ``start`` (or of the first mismatched one),
    skipping brackets inside JSON strings; None when the text ends first."""
    expected: list[str] = []
    in_string = escaped = False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in _CLOSERS:
            expected.append(_CLOSERS[char])
        # A mismatched closer ends the candidate too: json.loads then says what is wrong.
        elif char in "}]" and (not expected or expected.pop() != char or not expected):
            return index
    return None


def _next_opener(text: str, openers: str, start: int) -> int | None:
    found = [i for i in (text.find(o, start) for o in openers) if i >= 0]
    return min(found) if found else None


@dataclass
class _Scan:
    value: Any = None
    found: bool = False
    problem: str = ""  # why the first candidate failed, when none parsed
    cut_off: bool = False  # an opened object was never closed


def _scan_json(text: str, openers: str) -> _Scan:
    """The first balanced JSON object or array in ``text`` that json.loads accepts. A candidate
    that does not parse is skipped whole, so the inside of broken JSON is not mistaken for the answer."""
    scan = _Scan()
    position, unclosed = 0, 0
    while True:
        start = _next_opener(text, openers, position)
        if start is None:
            return scan
        end = _balanced_end(text, start)
        if end is None:
            # Go on inside it: a model that repeats the prompt's "{" writes "{{...}", whose inner
            # object is the answer.
            scan.cut_off = True
            unclosed += 1
            if unclosed > _MAX_UNCLOSED:
                return scan
            position = start + 1
            continue
        candidate = text[start : end + 1]
        try:
            scan.value, scan.found = json.loads(candidate), True
            return scan
        except json.JSONDecodeError as exc:
            if not scan.problem:
                near = candidate[exc.pos : exc.pos + 20]
                scan.problem = f"The JSON is invalid: {exc.msg}" + (f" near {_quoted(near, 20)}." if near else ".")
        position = end + 1


def _extract_json(answer: str, openers: str) -> _Scan:
    # A fenced block is what the model meant as its answer, even if the prose before it has brackets.
    for match in _FENCE.finditer(answer):
        scan = _scan_json(match.group(1), openers)
        if scan.found:
            return scan
    return _scan_json(answer, openers)


def _check_json_schema(check: Check, answer: str) -> CheckResult:
    schema = check.schema_
    if schema is None:
        return CheckResult(False, "The check has no JSON Schema.")
    top = schema.get("type")
    openers = "{" if top == "object" else "[" if top == "array" else "{["
    what = "JSON object" if openers == "{" else "JSON array" if openers == "[" else "JSON object or array"
    scan = _extract_json(answer, openers)
    if not scan.found:
        if scan.problem:
            return CheckResult(False, scan.problem)
        if scan.cut_off:
            return CheckResult(False, f"The {what} is never closed; the answer may have been cut off by max_tokens.")
        return CheckResult(False, f"No {what} found in the answer.")
    policy = schema_policy_problem(schema)
    if policy is not None:  # only a Check built without validation can get here
        return CheckResult(False, f"The check's JSON Schema is refused: {policy[0]}.")
    try:
        validator_for(schema).check_schema(schema)
    except schema_exceptions.SchemaError as exc:  # only a Check built without validation can get here
        return CheckResult(False, f"The check's JSON Schema is invalid: {clip(exc.message, 120)}.")
    try:
        error = schema_exceptions.best_match(budget_validator(schema).iter_errors(scan.value))
    except RegexTimeoutError as exc:
        return CheckResult(False, _timeout_reason(exc.pattern))
    except (RecursionError, schema_exceptions.SchemaError, LookupError) as exc:
        return CheckResult(False, f"The check's JSON Schema cannot be applied ({clip(str(exc), 120)}).")
    if error is None:
        return CheckResult(True, f"The {what.removesuffix(' or array')} matches the schema.")
    at = ".".join(str(p) for p in error.absolute_path)
    where = f" at '{at}'" if at else ""
    # The scan only goes past an unclosed bracket into it, so the value found lies inside that one.
    cut_note = _CUT_NOTE if scan.cut_off else ""
    return CheckResult(False, f"The JSON does not match the schema{where}: {clip(error.message, 160)}{cut_note}.")


def _check_similar(check: Check, answer: str) -> CheckResult:
    references = check.references or ()
    if not references:
        return CheckResult(False, "The check has no reference answer.")
    threshold = DEFAULT_SIMILARITY if check.threshold is None else check.threshold
    if not answer.strip():
        return CheckResult(False, "The answer is empty; expected one like the reference.")
    scored = []
    for reference in references:
        passage = answer_opening(answer, max(1, len(paragraphs(reference))))
        scored.append((similarity(passage, reference), passage, reference))
    score, passage, reference = max(scored, key=lambda t: t[0])
    shared = sorted(content_words(passage) & content_words(reference))
    words = f" (shared words: {', '.join(shared[:6])}{', …' if len(shared) > 6 else ''})" if shared else ""
    if score >= threshold:
        return CheckResult(True, f"Similarity {score:.2f} to the reference, at least {threshold:.2f}{words}.")
    return CheckResult(
        False, f"Similarity {score:.2f} to the reference {_quoted(reference, 50)}, below {threshold:.2f}{words}."
    )


# -- expected values in JSON -----------------------------------------------------------------------


def _text_form(text: str, case_sensitive: bool) -> str:
    flat = " ".join(text.split())
    if flat.endswith(".") and not flat.endswith(".."):
        flat = flat[:-1].rstrip()
    return flat if case_sensitive else flat.casefold()


def _shown(value: Any) -> str:
    return clip(json.dumps(value, ensure_ascii=False), 40)


def _value_problem(expected: Any, got: Any, where: str, case_sensitive: bool) -> str | None:
    """Why ``got`` is not the ``expected`` JSON value at the dotted path ``where`` (None when it is)."""
    at = f"'{where}'"
    if isinstance(expected, bool) or expected is None:
        ok = got is expected
    elif isinstance(expected, int | float):
        ok = isinstance(got, int | float) and not isinstance(got, bool)
        ok = ok and math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-9)
    elif isinstance(expected, str):
        # A number where text was expected ("invoice": 2231 for "2231") says the same thing.
        text = got if isinstance(got, str) else json.dumps(got) if isinstance(got, int | float) else None
        ok = text is not None and not isinstance(got, bool)
        ok = ok and _text_form(str(text), case_sensitive) == _text_form(expected, case_sensitive)
    elif isinstance(expected, list):
        if not isinstance(got, list):
            return f"{at} is {_shown(got)}, expected the list {_shown(expected)}"
        if len(got) != len(expected):
            return f"{at} has {len(got)} items, expected {len(expected)}: {_shown(expected)}"
        unmatched = list(got)
        for item in expected:  # in any order: "flour, sugar" lists the same things as "sugar, flour"
            match = next((g for g in unmatched if _value_problem(item, g, "", case_sensitive) is None), _MISSING)
            if match is _MISSING:
                return f"{at} lacks {_shown(item)}: it is {_shown(got)}"
            unmatched.remove(match)
        return None
    elif isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{at} is {_shown(got)}, expected an object"
        return _fields_problem(expected, got, f"{where}.", case_sensitive)
    else:
        ok = got == expected
    return None if ok else f"{at} is {_shown(got)}, expected {_shown(expected)}"


_MISSING = object()


def _fields_problem(expected: dict[str, Any], got: dict[str, Any], prefix: str, case_sensitive: bool) -> str | None:
    for key, wanted in expected.items():
        if key not in got:
            return f"'{prefix}{key}' is missing"
        problem = _value_problem(wanted, got[key], f"{prefix}{key}", case_sensitive)
        if problem:
            return problem
    return None


_CUT_NOTE = " (it sits inside a JSON object that is never closed: was the answer cut off?)"


def _json_object(answer: str) -> tuple[Any, CheckResult | None, str]:
    """The first JSON object in the answer, or a failed result saying why there is none; and a note
    for a failure when the object found lies inside one that is never closed."""
    scan = _extract_json(answer, "{")
    if scan.found:
        return scan.value, None, _CUT_NOTE if scan.cut_off else ""
    if scan.problem:
        return None, CheckResult(False, scan.problem), ""
    if scan.cut_off:
        return (
            None,
            CheckResult(False, "The JSON object is never closed; the answer may have been cut off by max_tokens."),
            "",
        )
    return None, CheckResult(False, "No JSON object found in the answer."), ""


def _check_fields(check: Check, answer: str) -> CheckResult:
    expected = check.fields or {}
    found, failed, cut_note = _json_object(answer)
    if failed is not None:
        return failed
    problem = _fields_problem(expected, found, "", check.case_sensitive)
    if problem:
        return CheckResult(False, f"The JSON's {problem}{cut_note}.")
    return CheckResult(True, f"The JSON has the {len(expected)} expected value{'s' if len(expected) != 1 else ''}.")


def _call_parts(found: dict[str, Any]) -> tuple[Any, Any]:
    """The function name and arguments of a call written as {"name", "arguments"} (or
    "parameters"), or as an OpenAI tool call {"type": "function", "function": {...}}."""
    inner = found.get("function")
    if isinstance(inner, dict) and "name" in inner:
        found = inner
    arguments = found.get("arguments", found.get("parameters", _MISSING))
    if isinstance(arguments, str):  # OpenAI's API carries the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    return found.get("name", _MISSING), arguments


def _check_tool_call(check: Check, answer: str) -> CheckResult:
    call = check.call
    if call is None:
        return CheckResult(False, "The check has no expected call.")
    found, failed, cut_note = _json_object(answer)
    if failed is not None:
        return failed
    name, arguments = _call_parts(found)
    if name is _MISSING:
        return CheckResult(False, f"The JSON names no function (no 'name'); expected a call of {call.name}{cut_note}.")
    if not isinstance(name, str) or name.strip() != call.name:
        return CheckResult(False, f"The call is of {_shown(name)}, expected {call.name}{cut_note}.")
    if arguments is _MISSING:
        arguments = {}
    if not isinstance(arguments, dict):
        return CheckResult(False, f"The arguments of {call.name} are {_shown(arguments)}, not an object{cut_note}.")
    extra = [key for key in arguments if key not in call.arguments]
    if extra:
        return CheckResult(False, f"The call of {call.name} has an unexpected argument '{extra[0]}'{cut_note}.")
    problem = _fields_problem(call.arguments, arguments, "", check.case_sensitive)
    if problem:
        return CheckResult(False, f"The call of {call.name}: argument {problem}{cut_note}.")
    return CheckResult(True, f"The call is {call.name} with the {len(call.arguments)} expected arguments.")


def check_answer(check: Check, answer: str) -> CheckResult:
    """Judge one answer. Never raises: a broken check is a failed result saying so; a pattern
    that takes longer than REGEX_TIME_LIMIT_S fails its check."""
    try:
        with check_budget():
            return _check_answer(check, answer)
    except RegexTimeoutError as exc:
        return CheckResult(False, _timeout_reason(exc.pattern))
    except RecursionError:
        return CheckResult(False, "The check nests too deeply to be applied to this answer.")


def _check_answer(check: Check, answer: str) -> CheckResult:
    if check.kind == "exact":
        return _check_exact(check, answer)
    if check.kind == "contains":
        return _check_contains(check, answer)
    if check.kind == "regex":
        return _check_regex(check, answer)
    if check.kind == "similar":
        return _check_similar(check, answer)
    if check.kind == "fields":
        return _check_fields(check, answer)
    if check.kind == "tool_call":
        return _check_tool_call(check, answer)
    return _check_json_schema(check, answer)


def check_prompt(prompt: SuitePrompt, answer: str) -> CheckResult:
    """Judge the model's continuation of ``prompt``, with the prompt's answer_prefix put back in front."""
    return check_answer(prompt.check, prompt.answer_prefix + answer)


def pass_rate(results: Sequence[CheckResult]) -> float:
    """The share of passed results, 0..1 (0.0 when there are none)."""
    return sum(1 for r in results if r.passed) / len(results) if results else 0.0
