"""Task suites: prompts with checks on the answers, for choosing a quantization by the user's own task.

A suite is a named list of prompts, each with a check on what the model answers. FitScope runs
every prompt greedily on a few quantized variants of one model and reports the pass rate per
suite, so a user sees whether a smaller quantization still does their job.

Suites are YAML or JSON files (the built-in ones live in ``resources/suites``)::

    name: capitals
    description: Short factual answers.
    task: chat                      # chat, summarization, extraction, tool_call or custom
    quality_floor: 0.8              # optional: the pass rate a deployment needs (0..1)
    prompts:
      - id: france
        prompt: "Question: What is the capital of France?\\nAnswer:"
        max_tokens: 16              # optional, 96 by default
        check: {contains: Paris}    # exact, contains or regex; add case_sensitive: true if case matters
      - id: age
        prompt: "Text: Maria is 34.\\nJSON: {"
        answer_prefix: "{"          # put back in front of the answer before checking (the prompt opened it)
        check:
          json_schema: {type: object, required: [age], properties: {age: {const: 34}}}
      - id: the-same-age
        prompt: "Text: Maria is 34.\\nJSON: {"
        answer_prefix: "{"
        check: {fields: {name: Maria, age: 34}}     # these keys with these values; others are ignored
      - id: timer
        prompt: "Tool: set_timer(minutes: integer)\\nUser: 15 minutes, please.\\nCall: {"
        answer_prefix: "{"
        check: {tool_call: {name: set_timer, arguments: {minutes: 15}}}
      - id: summary
        prompt: "Article: ...\\nSummary in one sentence:"
        check:
          similar: ["The council will close the unsafe library.", "An unsafe library is to close."]
          threshold: 0.5            # optional, 0.4 by default

``check: {contains: Paris}`` is short for ``check: {kind: contains, value: Paris}``,
``json_schema: {...}`` for ``kind: json_schema`` with ``schema: {...}``, ``similar: ...`` for
``kind: similar`` with ``references: [...]``, ``tool_call: {...}`` for ``kind: tool_call`` with
``call: {...}`` and ``fields: {...}`` for ``kind: fields``; both forms are read.

Value checks (``fields``, ``tool_call``) compare JSON values by meaning: text ignores case (unless
``case_sensitive``), surrounding and repeated whitespace and a final period; numbers compare as
numbers (34 and 34.0 are equal, "34" is not a number); lists compare as collections in any
order; nested objects field by field. A tool call must name the function and give exactly the
expected arguments: a missing, wrong or extra argument fails, as it would when the call reached
the real tool.

``similar`` judges free text against one or more reference answers by content-word F1 (see
``similarity``): the share of content words the answer and a reference have in common, as the
harmonic mean of precision and recall, after dropping function words and word endings. Word
order is ignored on purpose: a summary that says the same thing in another order is as good. The
best score over the references counts. Only the answer's opening is judged (as many paragraphs as
the reference has, after a lead-in line ending in ":"), so a base model that writes its summary
and then goes on with the next article is judged by its summary, not by what it restates after.

Prompts go through the model's chat template when it has one (see ``app.adapters.suite_runner``),
else as raw completions; the built-in prompts read well either way.

Every problem in a suite text is a SuiteError naming the line at fault and what to change.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from jsonschema import exceptions as schema_exceptions
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from app.core.catalog import RESOURCES_DIR
from app.core.errors import FitScopeError
from app.core.files import read_text_file

SUITES_DIR = RESOURCES_DIR / "suites"
EDITOR_SOURCE = "<editor>"
TASKS = ("chat", "summarization", "extraction", "tool_call", "custom")
CHECK_KINDS = ("exact", "contains", "regex", "json_schema", "similar", "fields", "tool_call")
DEFAULT_MAX_TOKENS = 96
DEFAULT_SIMILARITY = 0.4  # content-word F1 a 'similar' check needs unless it sets its own threshold

Task = Literal["chat", "summarization", "extraction", "tool_call", "custom"]
CheckKind = Literal["exact", "contains", "regex", "json_schema", "similar", "fields", "tool_call"]

_TEXT_KINDS = ("exact", "contains", "regex")
_CHECK_OPTIONS = ("case_sensitive", "description", "threshold")
# Where each kind's short form (`contains: Paris`) puts its content in the long form.
_CHECK_TARGET = {
    "exact": "value",
    "contains": "value",
    "regex": "value",
    "json_schema": "schema",
    "similar": "references",
    "fields": "fields",
    "tool_call": "call",
}
_KINDS_TEXT = ", ".join(CHECK_KINDS)
_TASKS_TEXT = ", ".join(TASKS)

# A path into the parsed document, as pydantic reports locations: mapping keys and list indexes.
_Path = tuple[str | int, ...]


class SuiteError(FitScopeError):
    """A suite text or file is unusable. ``line`` is 1-based (None when no line is at fault) and
    ``source`` the file name or "<editor>"; str(error) reads "tools.yaml, line 12: ..."."""

    def __init__(self, message: str, *, line: int | None = None, source: str = EDITOR_SOURCE) -> None:
        message = message.strip()
        if message and message[-1] not in ".?!":
            message += "."
        self.message = message
        self.line = line
        self.source = source
        where = ", ".join(part for part in (source, f"line {line}" if line is not None else "") if part)
        super().__init__(f"{where}: {message}" if where else message[:1].upper() + message[1:])


class _FieldProblem(ValueError):
    """A validator's complaint, with the path below the validated field that is at fault so the
    error can point at that exact line (a schema's bad keyword, a repeated id)."""

    def __init__(self, message: str, where: _Path = ()) -> None:
        super().__init__(message)
        self.where = where


def _number_as_text(value: Any) -> Any:
    # `value: 12` or `id: 3` in YAML are numbers; the user meant the text.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _check_schema(schema: dict[str, Any]) -> None:
    try:
        validator_for(schema).check_schema(schema)
    except schema_exceptions.SchemaError as exc:
        where = tuple(exc.path)
        at = f" at '{'.'.join(str(p) for p in where)}'" if where else ""
        raise _FieldProblem(f"the JSON Schema is invalid{at}: {_clip(exc.message, 160)}", where) from None


def _plain_json(value: Any) -> Any:
    """``value`` with what YAML reads beyond JSON made JSON: an unquoted 2025-05-14 is a date to
    YAML, and the text "2025-05-14" to the model's JSON."""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain_json(v) for v in value]
    return value


class ExpectedCall(BaseModel):
    """The tool call a ``tool_call`` check expects: the function's name and its arguments."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments", mode="before")
    @classmethod
    def _arguments_as_json(cls, value: Any) -> Any:
        return _plain_json(value) if isinstance(value, dict) else value


class Check(BaseModel):
    """How an answer is judged. ``value`` is the text for exact/contains/regex, ``schema_`` (written
    ``schema`` in files) the JSON Schema for json_schema, ``references`` the reference answers of a
    similar check (passing at ``threshold``, DEFAULT_SIMILARITY when unset), ``fields`` the values a
    fields check expects and ``call`` the call a tool_call check expects."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    kind: CheckKind
    value: str | None = Field(default=None, validate_default=True)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema", validate_default=True)
    references: tuple[str, ...] | None = Field(default=None, validate_default=True)
    threshold: float | None = Field(default=None, ge=0, le=1)
    fields: dict[str, Any] | None = Field(default=None, validate_default=True)
    call: ExpectedCall | None = Field(default=None, validate_default=True)
    case_sensitive: bool = False
    description: str | None = None

    @field_validator("value", mode="before")
    @classmethod
    def _value_as_text(cls, value: Any) -> Any:
        return _number_as_text(value)

    @field_validator("value")
    @classmethod
    def _value_fits_kind(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("kind")  # absent when the kind itself was invalid
        if kind in _TEXT_KINDS:
            if not value:
                raise _FieldProblem(f"a '{kind}' check needs a non-empty 'value' (the text to look for)")
            if kind == "regex":
                try:
                    re.compile(value)
                except re.error as exc:
                    raise _FieldProblem(
                        f"the regex '{value}' is invalid ({exc}); fix it, or use a 'contains' check for plain text"
                    ) from None
        return value

    @field_validator("schema_")
    @classmethod
    def _schema_fits_kind(cls, schema: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if info.data.get("kind") == "json_schema":
            if schema is None:
                raise _FieldProblem("a 'json_schema' check needs a 'schema' (a JSON Schema mapping)")
            _check_schema(schema)
        return schema

    @field_validator("references", mode="before")
    @classmethod
    def _references_as_texts(cls, value: Any) -> Any:
        # `similar: One reference.` is the common case; a list gives several.
        value = _number_as_text(value)
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list):
            return tuple(_number_as_text(v) for v in value)
        return value

    @field_validator("references")
    @classmethod
    def _references_fit_kind(cls, references: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        if info.data.get("kind") == "similar":
            if not references:
                raise _FieldProblem("a 'similar' check needs a reference answer (or a list of them)")
            for index, text in enumerate(references):
                if not content_words(text):
                    raise _FieldProblem(
                        f"the reference '{_clip(text)}' has no content words to compare; write the answer you expect",
                        (index,) if len(references) > 1 else (),
                    )
        return references

    @field_validator("fields", mode="before")
    @classmethod
    def _fields_as_json(cls, value: Any) -> Any:
        return _plain_json(value) if isinstance(value, dict) else value

    @field_validator("fields")
    @classmethod
    def _fields_fit_kind(cls, fields: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if info.data.get("kind") == "fields" and not fields:
            raise _FieldProblem("a 'fields' check needs the expected values, e.g. 'fields: {name: Maria, age: 34}'")
        return fields

    @field_validator("call")
    @classmethod
    def _call_fits_kind(cls, call: ExpectedCall | None, info: ValidationInfo) -> ExpectedCall | None:
        if info.data.get("kind") == "tool_call" and call is None:
            raise _FieldProblem(
                "a 'tool_call' check needs the expected call, e.g. "
                "'tool_call: {name: set_timer, arguments: {minutes: 5}}'"
            )
        return call


class SuitePrompt(BaseModel):
    """One prompt. ``answer_prefix`` is put in front of the model's answer before checking, for
    prompts that end inside the answer (a prompt ending in "JSON: {" has answer_prefix "{")."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(min_length=1)
    prompt: str = Field(min_length=1)
    check: Check
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=4096)
    answer_prefix: str = ""
    line: int | None = None  # where the prompt starts in its file; set by the loader

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, value: Any) -> Any:
        return _number_as_text(value)


class Suite(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    task: Task
    quality_floor: float | None = Field(default=None, ge=0, le=1)
    prompts: tuple[SuitePrompt, ...] = Field(min_length=1)

    @field_validator("prompts")
    @classmethod
    def _unique_ids(cls, prompts: tuple[SuitePrompt, ...]) -> tuple[SuitePrompt, ...]:
        seen: dict[str, SuitePrompt] = {}
        for index, prompt in enumerate(prompts):
            first = seen.get(prompt.id)
            if first is not None:
                where = f" on line {first.line}" if first.line is not None else ""
                raise _FieldProblem(
                    f"the id '{prompt.id}' is already used by the prompt{where}; give each prompt its own id",
                    (index, "id"),
                )
            seen[prompt.id] = prompt
        return prompts


# -- reading -------------------------------------------------------------------------------------


MAX_SUITE_ITEMS = 200_000  # keys and list items once aliases are expanded; suites hold hundreds


def _collect_lines(
    node: yaml.Node, path: _Path, line: int, lines: dict[_Path, int], source: str, active: set[int]
) -> None:
    """Record the 1-based line of every key and list item below ``node``. A mapping value is
    recorded at its key's line: for `check:` followed by an indented block, the key is the line
    a person looks for. Raises SuiteError when aliases expand the document beyond MAX_SUITE_ITEMS
    (a "billion laughs" file)."""
    lines[path] = line
    if len(lines) > MAX_SUITE_ITEMS:
        raise SuiteError(
            f"the document expands to more than {MAX_SUITE_ITEMS:,} items (YAML aliases repeating "
            "each other); a suite is far smaller",
            source=source,
        )
    if id(node) in active:  # an alias back to one of its own ancestors
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key, key_line = key_node.value, key_node.start_mark.line + 1
            # YAML and json.loads both keep the last of two equal keys without a word; a person
            # who wrote the key twice meant something else.
            if key in seen and key != "<<":
                raise SuiteError(
                    f"the key '{key}' appears twice in one mapping (first on line {seen[key]}); keep one",
                    line=key_line,
                    source=source,
                )
            seen[key] = key_line
            _collect_lines(value_node, (*path, key), key_line, lines, source, active)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _collect_lines(item, (*path, index), item.start_mark.line + 1, lines, source, active)
    active.discard(id(node))


def _yaml_problem(exc: yaml.YAMLError, what: str, source: str) -> SuiteError:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or "it cannot be read"
        context = ""
        if exc.context and exc.context_mark is not None and exc.context_mark.line != mark.line:
            context = f", {exc.context} on line {exc.context_mark.line + 1}"
        elif exc.context:
            context = f", {exc.context}"
        return SuiteError(
            f"the {what} is invalid: {problem} (column {mark.column + 1}{context})", line=mark.line + 1, source=source
        )
    return SuiteError(f"the {what} is invalid: {exc}", source=source)


def _read_yaml(text: str, source: str) -> tuple[Any, dict[_Path, int]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[_Path, int] = {}
        if node is None:
            return None, lines
        # Lines first: construction flattens `<<` merges into the nodes, which would look like repeated keys.
        _collect_lines(node, (), node.start_mark.line + 1, lines, source, set())
        return loader.construct_document(node), lines
    finally:
        loader.dispose()


def _read_document(text: str, source: str) -> tuple[Any, dict[_Path, int]]:
    """The document's data and the line of each key and list item."""
    json_error: json.JSONDecodeError | None = None
    if text.lstrip().startswith(("{", "[")):
        # JSON is read by json itself (exact values, clearer syntax errors) and by the YAML
        # composer only for line numbers. Tabs can only be whitespace in valid JSON, and YAML
        # refuses them as indentation, so they become spaces for the composer.
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            json_error = exc  # it may still be YAML written in flow style
        else:
            try:
                _, lines = _read_yaml(text.replace("\t", " "), source)
            except yaml.YAMLError:
                lines = {}
            return data, lines
    try:
        return _read_yaml(text, source)
    except yaml.YAMLError as exc:
        if json_error is not None:
            raise SuiteError(
                f"the JSON is invalid: {json_error.msg} (column {json_error.colno})",
                line=json_error.lineno,
                source=source,
            ) from None
        raise _yaml_problem(exc, "YAML", source) from None


def _expand_check(check: dict[Any, Any], path: _Path, lines: dict[_Path, int], who: str, source: str) -> dict[Any, Any]:
    """`{contains: Paris}` → `{kind: contains, value: Paris}`, with the lines moved along."""
    if "kind" in check:
        return check
    contents = {target for target in _CHECK_TARGET.values() if target not in CHECK_KINDS}
    others = [key for key in check if key not in ("schema_", *contents, *_CHECK_OPTIONS)]
    known = [key for key in others if key in CHECK_KINDS]
    if len(known) > 1:
        raise SuiteError(
            f"{who} has a check with several kinds ({', '.join(known)}); give exactly one",
            line=lines.get((*path, known[1])),
            source=source,
        )
    # One known kind: any other key is a typo that validation reports. No known kind: a lone key
    # is a misspelt kind (`regx: ...`), reported as such; none at all is a missing kind.
    kind = known[0] if known else others[0] if len(others) == 1 else None
    if kind is None:
        return check
    target = _CHECK_TARGET.get(kind, "value")
    if target != kind and target in check:
        raise SuiteError(
            f"{who} gives its check both '{kind}' and '{target}'; write either '{kind}: ...' or 'kind: {kind}' "
            f"with '{target}: ...'",
            line=lines.get((*path, target)),
            source=source,
        )
    expanded = {"kind": kind, target: check[kind], **{k: v for k, v in check.items() if k != kind}}
    old = (*path, kind)
    for key, line in list(lines.items()):
        if key[: len(old)] == old:
            lines[(*path, target, *key[len(old) :])] = line
    if old in lines:
        lines[(*path, "kind")] = lines[old]
    return expanded


def _prompt_label(data: dict[Any, Any], index: int) -> str:
    prompts = data.get("prompts")
    if isinstance(prompts, list) and index < len(prompts) and isinstance(prompts[index], dict):
        pid = _number_as_text(prompts[index].get("id"))
        if isinstance(pid, str) and pid:
            return f"prompt '{pid}'"
    return f"prompt {index + 1}"


def _prepared(data: dict[Any, Any], lines: dict[_Path, int], source: str) -> dict[Any, Any]:
    """The document with checks in long form and each prompt's line filled in."""
    prompts = data.get("prompts")
    if not isinstance(prompts, list):
        return data
    out = []
    for index, item in enumerate(prompts):
        if isinstance(item, dict):
            item = dict(item)
            item["line"] = lines.get(("prompts", index))
            check = item.get("check")
            if isinstance(check, dict):
                who = _prompt_label(data, index)
                item["check"] = _expand_check(check, ("prompts", index, "check"), lines, who, source)
        out.append(item)
    return {**data, "prompts": out}


def _line_at(lines: dict[_Path, int], path: _Path) -> int | None:
    """The line of ``path`` or, when it is not in the text (a missing key), of its nearest parent."""
    for end in range(len(path), -1, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None


def _type_name(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, str):
        return "text"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


_SUITE_KEYS = ("name", "description", "task", "quality_floor", "prompts")
_PROMPT_KEYS = ("id", "prompt", "check", "max_tokens", "answer_prefix")
_CHECK_KEYS = ("kind", "value", "schema", "references", "threshold", "fields", "call", "case_sensitive", "description")
_CALL_KEYS = ("name", "arguments")
_MISSING_HINTS: dict[_Path, str] = {
    ("name",): "the suite has no 'name'; add one, e.g. 'name: my-task'",
    ("task",): f"the suite has no 'task'; add one of {_TASKS_TEXT}",
    ("prompts",): "the suite has no 'prompts'; add a list of prompts, each with an id, a prompt and a check",
    ("id",): "{who} has no 'id'; give it a short name of its own",
    ("prompt",): "{who} has no 'prompt' (the text given to the model)",
    ("check",): "{who} has no 'check'; add one, e.g. 'check: {{contains: Paris}}'",
    ("check", "kind"): f"{{who}} has a check without a kind; use one of {_KINDS_TEXT} (e.g. 'contains: Paris')",
}


def _validation_message(error: Any, who: str, rest: _Path) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    field = ".".join(str(p) for p in rest)
    found = error.get("input")
    if kind in ("value_error", "assertion_error") and ctx.get("error") is not None:
        return f"{who}: {ctx['error']}"
    if kind == "literal_error" and rest == ("check", "kind"):
        return f"{who} has check kind '{found}'; use one of {_KINDS_TEXT}"
    if kind == "literal_error" and rest == ("task",):
        return f"the suite has task '{found}'; use one of {_TASKS_TEXT}"
    if kind == "missing":
        hint = _MISSING_HINTS.get(rest)
        return hint.format(who=who) if hint else f"{who} has no '{field}'"
    if kind == "extra_forbidden":
        if len(rest) == 1 and who == "the suite":
            allowed: tuple[str, ...] = _SUITE_KEYS
        elif len(rest) == 2 and rest[0] == "check":
            allowed = _CHECK_KEYS
        elif len(rest) == 3 and rest[:2] == ("check", "call"):
            allowed = _CALL_KEYS
        else:
            allowed = _PROMPT_KEYS
        close = difflib.get_close_matches(str(rest[-1]), allowed, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"use {', '.join(allowed)}"
        return f"{who} has an unknown key '{rest[-1]}'; {hint}"
    if kind == "too_short" and rest == ("prompts",):
        return "the suite has no prompts; add at least one"
    if not field:
        subject = who
    elif who == "the suite":
        subject = f"'{field}'"
    else:
        subject = f"{who}: '{field}'"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        if not rest:
            return f"{who} must be a mapping with id, prompt and check, not {_type_name(found)}"
        return f"{subject} must be a mapping, not {_type_name(found)}"
    if kind in ("tuple_type", "list_type"):
        return f"{subject} must be a list, not {_type_name(found)}"
    if kind == "string_type":
        quotes = " (put it in quotes)" if not isinstance(found, list | dict | type(None)) else ""
        return f"{subject} must be text, not {_type_name(found)}{quotes}"
    if kind == "string_too_short":
        return f"{subject} is empty"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{subject} must be a whole number, not {found!r}"
    if kind in ("float_type", "float_parsing"):
        return f"{subject} must be a number, not {found!r}"
    if kind in ("bool_type", "bool_parsing"):
        return f"{subject} must be true or false, not {found!r}"
    bounds = {"greater_than_equal": "at least", "less_than_equal": "at most", "greater_than": "more than"}
    if kind in bounds:
        limit = next(iter(ctx.values()), "")
        return f"{subject} must be {bounds[kind]} {limit}, not {found!r}"
    if kind == "less_than":
        return f"{subject} must be less than {next(iter(ctx.values()), '')}, not {found!r}"
    message = str(error.get("msg", "is invalid"))
    return f"{subject}: {message[:1].lower() + message[1:]}"


def _translate(exc: ValidationError, data: dict[Any, Any], lines: dict[_Path, int], source: str) -> SuiteError:
    errors = exc.errors()
    error = errors[0]
    if error["type"] == "missing":
        # A missing key next to an unknown one is most likely a typo of it: name the typo.
        parent = tuple(error["loc"])[:-1]
        typo = [e for e in errors if e["type"] == "extra_forbidden" and tuple(e["loc"])[:-1] == parent]
        error = typo[0] if typo else error
    loc: _Path = tuple(error["loc"])
    problem = (error.get("ctx") or {}).get("error")
    if isinstance(problem, _FieldProblem):
        loc = (*loc, *problem.where)
    if len(loc) >= 2 and loc[0] == "prompts" and isinstance(loc[1], int):
        who, rest = _prompt_label(data, loc[1]), loc[2:]
    else:
        who, rest = "the suite", loc
    return SuiteError(_validation_message(error, who, rest), line=_line_at(lines, loc), source=source)


def parse_suite(text: str, source: str = EDITOR_SOURCE) -> Suite:
    """The suite in ``text`` (YAML or JSON). Raises SuiteError with the line at fault."""
    try:
        data, lines = _read_document(text, source)
    except RecursionError:
        raise SuiteError("the text nests too deeply to be a suite", source=source) from None
    if data is None:
        raise SuiteError(
            "the suite is empty; start with 'name:', 'task:' and 'prompts:'", line=lines.get(()), source=source
        )
    if not isinstance(data, dict):
        raise SuiteError(
            f"a suite must be a mapping with name, task and prompts, not {_type_name(data)}",
            line=lines.get((), 1),
            source=source,
        )
    prepared = _prepared(data, lines, source)
    try:
        return Suite.model_validate(prepared)
    except ValidationError as exc:
        raise _translate(exc, prepared, lines, source) from None


def load_suite(path: str | os.PathLike[str]) -> Suite:
    """The suite in a YAML or JSON file. Raises SuiteError naming the file (and the line)."""
    path = Path(path)
    try:
        text = read_text_file(path, "suite file")
    except FitScopeError as exc:
        raise SuiteError(str(exc), source=path.name) from None
    return parse_suite(text, source=path.name)


@cache
def _builtin() -> tuple[tuple[str, Suite], ...]:
    out: dict[str, Suite] = {}
    for path in sorted(SUITES_DIR.glob("*.yaml")):
        suite = load_suite(path)
        if suite.name in out:
            raise SuiteError(f"another built-in suite is already named '{suite.name}'", source=path.name)
        out[suite.name] = suite
    return tuple(out.items())


def builtin_suites() -> dict[str, Suite]:
    """The suites shipped in resources/suites, by name."""
    return dict(_builtin())


def find_suite(name_or_path: str, yours: Sequence[Suite] = ()) -> Suite:
    """A built-in suite by name, else one of ``yours`` (the user's own suites) by name, else the
    suite file at that path. Raises SuiteError when there is none."""
    suites = builtin_suites()
    wanted = name_or_path.strip()
    for suite in (*suites.values(), *yours):
        if suite.name.lower() == wanted.lower():
            return suite
    path = Path(wanted).expanduser()
    if path.exists() or path.suffix.lower() in (".yaml", ".yml", ".json") or os.sep in wanted or "/" in wanted:
        return load_suite(path)
    names = [*suites, *(s.name for s in yours)]
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    own = f"; yours are {', '.join(sorted(s.name for s in yours))}" if yours else ""
    raise SuiteError(
        f"there is no built-in suite or suite file '{name_or_path}'{hint}; the built-in suites are "
        f"{', '.join(sorted(suites))}{own}",
        source="",
    )


# -- the user's own examples ---------------------------------------------------------------------

EXAMPLE_CHECKS = ("contains", "exact", "similar")
_EXAMPLE_CHECK_WORDS = {
    "contains": "the answer contains it",
    "exact": "the answer is exactly it",
    "similar": f"the answer says the same (content-word F1 ≥ {DEFAULT_SIMILARITY:.1f})",
}


def example_check_meaning(kind: str) -> str:
    """What an example's check kind means, in words for a menu."""
    return _EXAMPLE_CHECK_WORDS.get(kind, kind)


def _slug(text: str, words: int = 5, limit: int = 40) -> str:
    parts = re.findall(r"[a-z0-9]+", text.casefold())[:words]
    return "-".join(parts)[:limit].strip("-") or "example"


def example_prompt(prompt: str, expected: str, kind: str, taken: Sequence[str] = ()) -> SuitePrompt:
    """A suite prompt made from a user's example: the prompt as the model gets it, the answer the
    user expects, and how to compare them (one of EXAMPLE_CHECKS). The id comes from the prompt's
    first words, made unique against ``taken``; max_tokens leaves room for about twice the
    expected answer (at least 32, at most 512 tokens). Raises SuiteError for an empty prompt or
    answer, an unknown kind, or a 'similar' answer without content words."""
    prompt, expected = prompt.strip(), expected.strip()
    if not prompt:
        raise SuiteError("the example has no prompt; paste the text the model should answer", source="")
    if not expected:
        raise SuiteError("the example has no expected answer; write the answer you want", source="")
    if kind not in EXAMPLE_CHECKS:
        raise SuiteError(f"an example's check is one of {', '.join(EXAMPLE_CHECKS)}, not '{kind}'", source="")
    base = _slug(prompt)
    pid, n = base, 2
    while pid in taken:
        pid, n = f"{base}-{n}", n + 1
    # About 3 characters per token in English; a verbose model may restate the answer once.
    max_tokens = max(32, min(512, 2 * math.ceil(len(expected) / 3) + 16))
    content: dict[str, Any] = {"references": (expected,)} if kind == "similar" else {"value": expected}
    try:
        check = Check.model_validate({"kind": kind, **content})
    except ValidationError as exc:
        problem = (exc.errors()[0].get("ctx") or {}).get("error") or exc.errors()[0]["msg"]
        raise SuiteError(str(problem), source="") from None
    return SuitePrompt(id=pid, prompt=prompt, check=check, max_tokens=max_tokens)


def with_prompt(suite: Suite, prompt: SuitePrompt) -> Suite:
    """``suite`` with ``prompt`` appended (validated: its id must be new)."""
    data = suite.model_dump(by_alias=True)
    data["prompts"] = [*data["prompts"], prompt.model_dump(by_alias=True)]
    return Suite.model_validate(data)


# -- writing -------------------------------------------------------------------------------------


class _EditorDumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Lists indented under their key, as people write them (and as the built-in files are).
        super().increase_indent(flow, False)


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line prompts as `|` blocks; PyYAML falls back to quotes when a block cannot hold the text.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


def _is_short_leaf(values: list[Any]) -> bool:
    scalars = all(
        v is None or isinstance(v, bool | int | float) or (isinstance(v, str) and "\n" not in v) for v in values
    )
    return scalars and sum(len(str(v)) + 4 for v in values) <= 60


def _represent_list(dumper: yaml.SafeDumper, value: list[Any]) -> yaml.SequenceNode:
    # Short lists of plain values on one line (`required: [name, age]`), as people write them.
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=_is_short_leaf(value))


def _represent_dict(dumper: yaml.SafeDumper, value: dict[Any, Any]) -> yaml.MappingNode:
    leaf = _is_short_leaf([*value.keys(), *value.values()])
    return dumper.represent_mapping("tag:yaml.org,2002:map", value, flow_style=leaf)


_EditorDumper.add_representer(str, _represent_str)
_EditorDumper.add_representer(list, _represent_list)
_EditorDumper.add_representer(dict, _represent_dict)


def _check_doc(check: Check) -> dict[str, Any]:
    content: Any = check.value
    if check.kind == "json_schema":
        content = check.schema_
    elif check.kind == "similar":
        references = list(check.references or ())
        content = references[0] if len(references) == 1 else references
    elif check.kind == "fields":
        content = check.fields
    elif check.kind == "tool_call" and check.call is not None:
        content = {"name": check.call.name, "arguments": check.call.arguments}
    doc: dict[str, Any] = {check.kind: content}
    if check.threshold is not None:
        doc["threshold"] = check.threshold
    if check.case_sensitive:
        doc["case_sensitive"] = True
    if check.description:
        doc["description"] = check.description
    return doc


def suite_to_yaml(suite: Suite) -> str:
    """The suite as YAML for the editor; parse_suite reads it back to an equal suite (lines aside)."""
    doc: dict[str, Any] = {"name": suite.name}
    if suite.description:
        doc["description"] = suite.description
    doc["task"] = suite.task
    if suite.quality_floor is not None:
        doc["quality_floor"] = suite.quality_floor
    prompts = []
    for p in suite.prompts:
        item: dict[str, Any] = {"id": p.id, "prompt": p.prompt}
        if p.max_tokens != DEFAULT_MAX_TOKENS:
            item["max_tokens"] = p.max_tokens
        if p.answer_prefix:
            item["answer_prefix"] = p.answer_prefix
        item["check"] = _check_doc(p.check)
        prompts.append(item)
    doc["prompts"] = prompts
    return yaml.dump(doc, Dumper=_EditorDumper, sort_keys=False, allow_unicode=True, width=100)


# -- checking answers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    reason: str  # one plain sentence for the app


def _clip(text: str, limit: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _quoted(text: str, limit: int = 60) -> str:
    return f"'{_clip(text, limit)}'"


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
    flags = re.DOTALL | (0 if check.case_sensitive else re.IGNORECASE)
    try:
        match = re.search(pattern, answer, flags)
    except re.error as exc:  # only a Check built without validation can get here
        return CheckResult(False, f"The check's regex {_quoted(pattern)} is invalid ({exc}).")
    if match is not None:
        return CheckResult(True, f"The answer matches {_quoted(pattern)} at {_quoted(match.group(0), 40)}.")
    if not answer.strip():
        return CheckResult(False, f"The answer is empty; expected it to match {_quoted(pattern)}.")
    return CheckResult(False, f"The answer does not match {_quoted(pattern)}.")


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
    try:
        cls = validator_for(schema)
        cls.check_schema(schema)
    except schema_exceptions.SchemaError as exc:  # only a Check built without validation can get here
        return CheckResult(False, f"The check's JSON Schema is invalid: {_clip(exc.message, 120)}.")
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    error = schema_exceptions.best_match(validator.iter_errors(scan.value))
    if error is None:
        return CheckResult(True, f"The {what.removesuffix(' or array')} matches the schema.")
    at = ".".join(str(p) for p in error.absolute_path)
    where = f" at '{at}'" if at else ""
    # The scan only goes past an unclosed bracket into it, so the value found lies inside that one.
    cut_note = _CUT_NOTE if scan.cut_off else ""
    return CheckResult(False, f"The JSON does not match the schema{where}: {_clip(error.message, 160)}{cut_note}.")


# -- similarity to a reference answer --------------------------------------------------------------

# Function words carry no content: "the library will close" and "a library is to close" say the same.
# fmt: off
_STOP_WORDS = frozenset(
    {
        "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any", "are", "as", "at",
        "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can", "could", "did",
        "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further", "had", "has", "have",
        "having", "he", "her", "here", "hers", "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is",
        "it", "its", "itself", "just", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off",
        "on", "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "same", "she", "should",
        "so", "some", "such", "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these",
        "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what",
        "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours",
        "yourself", "yourselves", "s", "t"
    }
)
# fmt: on
_KEEP_NEGATION = frozenset({"no", "not", "nor"})  # dropped above, but "not guilty" ≠ "guilty"
_WORD = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+")


def _stem(word: str) -> str:
    """A crude suffix strip so that close/closes/closed/closing and library/libraries meet; a real
    stemmer would be a dependency, and this one only has to make word forms of one text agree."""
    if word[0].isdigit():
        return word.replace(",", "")  # 20,000 and 20000
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def content_words(text: str) -> frozenset[str]:
    """The set of stemmed content words of ``text``: casefolded, without function words, numbers
    kept (20,000 as 20000), negations kept."""
    words = (w for w in _WORD.findall(text.casefold()))
    return frozenset(_stem(w) for w in words if w in _KEEP_NEGATION or w not in _STOP_WORDS)


def similarity(answer: str, reference: str) -> float:
    """Content-word F1 of ``answer`` against ``reference``, 0..1: with A and R the two texts'
    content-word sets, precision |A∩R|/|A|, recall |A∩R|/|R|, and their harmonic mean.

    Chosen over ROUGE-L (the longest common subsequence) because a paraphrase often reorders a
    sentence ("the council will close the library" / "the library is to be closed by the
    council") and an order-blind measure does not punish that; sets rather than counts, so a model
    that repeats itself gains nothing. No synonyms: a summary must use the article's words, which
    summaries mostly do. 0.0 when either text has no content words."""
    a, r = content_words(answer), content_words(reference)
    common = len(a & r)
    if not common:
        return 0.0
    precision, recall = common / len(a), common / len(r)
    return 2 * precision * recall / (precision + recall)


_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def _paragraphs(text: str) -> list[str]:
    return [part.strip() for part in _PARAGRAPH_BREAK.split(text) if part.strip()]


def _opening(answer: str, paragraphs: int) -> str:
    """The answer's first ``paragraphs`` paragraphs, after a lead-in such as "Here is a summary:".
    A base model writes its answer and then goes on with the next item ("\n\nArticle: ..."),
    often restating the text it was given: only the opening is the answer."""
    parts = _paragraphs(answer)
    if len(parts) > 1 and parts[0].endswith(":"):
        parts = parts[1:]
    return "\n\n".join(parts[:paragraphs])


def _check_similar(check: Check, answer: str) -> CheckResult:
    references = check.references or ()
    if not references:
        return CheckResult(False, "The check has no reference answer.")
    threshold = DEFAULT_SIMILARITY if check.threshold is None else check.threshold
    if not answer.strip():
        return CheckResult(False, "The answer is empty; expected one like the reference.")
    scored = []
    for reference in references:
        passage = _opening(answer, max(1, len(_paragraphs(reference))))
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
    return _clip(json.dumps(value, ensure_ascii=False), 40)


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
    """Judge one answer. Never raises: a broken check is a failed result saying so."""
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
