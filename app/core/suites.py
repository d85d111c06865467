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

``check: {contains: Paris}`` is short for ``check: {kind: contains, value: Paris}`` and
``json_schema: {...}`` for ``kind: json_schema`` with ``schema: {...}``; both forms are read.
The prompts are raw completion prompts: no chat template is applied.

Every problem in a suite text is a SuiteError naming the line at fault and what to change.
"""

from __future__ import annotations

import difflib
import json
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
CHECK_KINDS = ("exact", "contains", "regex", "json_schema")
DEFAULT_MAX_TOKENS = 96

Task = Literal["chat", "summarization", "extraction", "tool_call", "custom"]
CheckKind = Literal["exact", "contains", "regex", "json_schema"]

_TEXT_KINDS = ("exact", "contains", "regex")
_CHECK_OPTIONS = ("case_sensitive", "description")
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


class Check(BaseModel):
    """How an answer is judged. ``value`` is the text for exact/contains/regex, ``schema_`` (written
    ``schema`` in files) the JSON Schema for json_schema."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    kind: CheckKind
    value: str | None = Field(default=None, validate_default=True)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema", validate_default=True)
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
    others = [key for key in check if key not in ("value", "schema", "schema_", *_CHECK_OPTIONS)]
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
    target = "schema" if kind == "json_schema" else "value"
    if target in check:
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
_CHECK_KEYS = ("kind", "value", "schema", "case_sensitive", "description")
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


def find_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, else the suite file at that path."""
    suites = builtin_suites()
    wanted = name_or_path.strip()
    for name, suite in suites.items():
        if name.lower() == wanted.lower():
            return suite
    path = Path(wanted).expanduser()
    if path.exists() or path.suffix.lower() in (".yaml", ".yml", ".json") or os.sep in wanted or "/" in wanted:
        return load_suite(path)
    close = difflib.get_close_matches(wanted, list(suites), n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise SuiteError(
        f"there is no built-in suite or suite file '{name_or_path}'{hint}; the built-in suites are "
        f"{', '.join(sorted(suites))}",
        source="",
    )


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
    doc: dict[str, Any] = {check.kind: check.schema_ if check.kind == "json_schema" else check.value}
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
    cut_note = " (it sits inside a JSON object that is never closed: was the answer cut off?)" if scan.cut_off else ""
    return CheckResult(False, f"The JSON does not match the schema{where}: {_clip(error.message, 160)}{cut_note}.")


def check_answer(check: Check, answer: str) -> CheckResult:
    """Judge one answer. Never raises: a broken check is a failed result saying so."""
    if check.kind == "exact":
        return _check_exact(check, answer)
    if check.kind == "contains":
        return _check_contains(check, answer)
    if check.kind == "regex":
        return _check_regex(check, answer)
    return _check_json_schema(check, answer)


def check_prompt(prompt: SuitePrompt, answer: str) -> CheckResult:
    """Judge the model's continuation of ``prompt``, with the prompt's answer_prefix put back in front."""
    return check_answer(prompt.check, prompt.answer_prefix + answer)


def pass_rate(results: Sequence[CheckResult]) -> float:
    """The share of passed results, 0..1 (0.0 when there are none)."""
    return sum(1 for r in results if r.passed) / len(results) if results else 0.0
