"""What a task suite is: the validated records of a suite, its prompts and the checks on their answers.

:class:`Suite` is a named list of :class:`SuitePrompt`, each with the :class:`Check` that judges the
model's answer (exact, contains, regex, json_schema, similar, fields or tool_call, with the content
each kind needs). Every record is a frozen pydantic model whose validators refuse a check that
cannot work (an empty text, an invalid regex or JSON Schema, a reference answer without content
words, a repeated prompt id) with a :class:`FieldProblemError` that says where; the reader
(:mod:`app.core.quality.suite_reading`) turns that into a :class:`SuiteError` naming the line.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

from jsonschema import exceptions as schema_exceptions
from jsonschema.validators import validator_for
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from app.core.common.errors import FitScopeError
from app.core.quality.suite_schema import compile_problem, schema_policy_problem
from app.core.quality.suite_similarity import content_words

EDITOR_SOURCE = "<editor>"
TASKS = ("chat", "summarization", "extraction", "tool_call", "custom")
CHECK_KINDS = ("exact", "contains", "regex", "json_schema", "similar", "fields", "tool_call")
DEFAULT_MAX_TOKENS = 96
MAX_PREFIX_CHARS = 10_000  # an answer_prefix is the start of an answer: "{" or a few words
DEFAULT_SIMILARITY = 0.4  # content-word F1 a 'similar' check needs unless it sets its own threshold

Task = Literal["chat", "summarization", "extraction", "tool_call", "custom"]
CheckKind = Literal["exact", "contains", "regex", "json_schema", "similar", "fields", "tool_call"]

_TEXT_KINDS = ("exact", "contains", "regex")

# A path into the parsed document, as pydantic reports locations: mapping keys and list indexes.
DocumentPath = tuple[str | int, ...]


def clip(text: str, limit: int = 60) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


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


class FieldProblemError(ValueError):
    """A validator's complaint, with the path below the validated field that is at fault so the
    error can point at that exact line (a schema's bad keyword, a repeated id)."""

    def __init__(self, message: str, where: DocumentPath = ()) -> None:
        super().__init__(message)
        self.where = where


def number_as_text(value: Any) -> Any:
    """A number as the text the user meant (an id or value written without quotes); anything else as it is."""
    # `value: 12` or `id: 3` in YAML are numbers; the user meant the text.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _check_schema(schema: dict[str, Any]) -> None:
    policy = schema_policy_problem(schema)
    if policy is not None:
        message, where = policy
        at = f" at '{'.'.join(str(p) for p in where)}'" if where else ""
        raise FieldProblemError(f"the JSON Schema is refused{at}: {message}", where)
    try:
        validator_for(schema).check_schema(schema)
    except schema_exceptions.SchemaError as exc:
        where = tuple(exc.path)
        at = f" at '{'.'.join(str(p) for p in where)}'" if where else ""
        raise FieldProblemError(f"the JSON Schema is invalid{at}: {clip(exc.message, 160)}", where) from None


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
        return number_as_text(value)

    @field_validator("value")
    @classmethod
    def _value_fits_kind(cls, value: str | None, info: ValidationInfo) -> str | None:
        kind = info.data.get("kind")  # absent when the kind itself was invalid
        if kind in _TEXT_KINDS:
            if not value:
                raise FieldProblemError(f"a '{kind}' check needs a non-empty 'value' (the text to look for)")
            if kind == "regex":
                problem = compile_problem(value)
                if problem:
                    raise FieldProblemError(
                        f"the regex '{clip(value, 80)}' is invalid ({problem}); fix it, or use a 'contains' "
                        "check for plain text"
                    )
        return value

    @field_validator("schema_")
    @classmethod
    def _schema_fits_kind(cls, schema: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if info.data.get("kind") == "json_schema":
            if schema is None:
                raise FieldProblemError("a 'json_schema' check needs a 'schema' (a JSON Schema mapping)")
            _check_schema(schema)
        return schema

    @field_validator("references", mode="before")
    @classmethod
    def _references_as_texts(cls, value: Any) -> Any:
        # `similar: One reference.` is the common case; a list gives several.
        value = number_as_text(value)
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list):
            return tuple(number_as_text(v) for v in value)
        return value

    @field_validator("references")
    @classmethod
    def _references_fit_kind(cls, references: tuple[str, ...] | None, info: ValidationInfo) -> tuple[str, ...] | None:
        if info.data.get("kind") == "similar":
            if not references:
                raise FieldProblemError("a 'similar' check needs a reference answer (or a list of them)")
            for index, text in enumerate(references):
                if not content_words(text):
                    raise FieldProblemError(
                        f"the reference '{clip(text)}' has no content words to compare; write the answer you expect",
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
            raise FieldProblemError("a 'fields' check needs the expected values, e.g. 'fields: {name: Maria, age: 34}'")
        return fields

    @field_validator("call")
    @classmethod
    def _call_fits_kind(cls, call: ExpectedCall | None, info: ValidationInfo) -> ExpectedCall | None:
        if info.data.get("kind") == "tool_call" and call is None:
            raise FieldProblemError(
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
    answer_prefix: str = Field(default="", max_length=MAX_PREFIX_CHARS)
    line: int | None = None  # where the prompt starts in its file; set by the loader

    @field_validator("id", mode="before")
    @classmethod
    def _id_as_text(cls, value: Any) -> Any:
        return number_as_text(value)


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
                raise FieldProblemError(
                    f"the id '{prompt.id}' is already used by the prompt{where}; give each prompt its own id",
                    (index, "id"),
                )
            seen[prompt.id] = prompt
        return prompts
