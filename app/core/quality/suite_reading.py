"""Reading task suites: YAML or JSON text into a validated suite, every problem named with its line.

:func:`parse_suite` reads a document while recording the line of every key and list item, expands
the checks' short forms (``contains: Paris`` for ``kind: contains`` with ``value: Paris``) and
validates it as a :class:`~app.core.quality.suite.Suite`; a validation error becomes a
:class:`~app.core.quality.suite.SuiteError` in plain words, at the line at fault, with the key meant
when one was misspelt. :func:`load_suite` reads a file, :func:`builtin_suites` the suites shipped in
``resources/suites`` and :func:`find_suite` one by name or path.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from app.core.common.errors import FitScopeError
from app.core.common.files import read_text_file
from app.core.model.catalog import RESOURCES_DIR
from app.core.quality.suite import (
    CHECK_KINDS,
    EDITOR_SOURCE,
    TASKS,
    DocumentPath,
    FieldProblemError,
    Suite,
    SuiteError,
    number_as_text,
)

SUITES_DIR = RESOURCES_DIR / "suites"
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

MAX_SUITE_ITEMS = 200_000  # keys and list items once aliases are expanded; suites hold hundreds


def _collect_lines(
    node: yaml.Node, path: DocumentPath, line: int, lines: dict[DocumentPath, int], source: str, active: set[int]
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


def _read_yaml(text: str, source: str) -> tuple[Any, dict[DocumentPath, int]]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[DocumentPath, int] = {}
        if node is None:
            return None, lines
        # Lines first: construction flattens `<<` merges into the nodes, which would look like repeated keys.
        _collect_lines(node, (), node.start_mark.line + 1, lines, source, set())
        return loader.construct_document(node), lines
    finally:
        loader.dispose()


def _read_document(text: str, source: str) -> tuple[Any, dict[DocumentPath, int]]:
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


def _expand_check(
    check: dict[Any, Any], path: DocumentPath, lines: dict[DocumentPath, int], who: str, source: str
) -> dict[Any, Any]:
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
        pid = number_as_text(prompts[index].get("id"))
        if isinstance(pid, str) and pid:
            return f"prompt '{pid}'"
    return f"prompt {index + 1}"


def _prepared(data: dict[Any, Any], lines: dict[DocumentPath, int], source: str) -> dict[Any, Any]:
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


def _line_at(lines: dict[DocumentPath, int], path: DocumentPath) -> int | None:
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
_MISSING_HINTS: dict[DocumentPath, str] = {
    ("name",): "the suite has no 'name'; add one, e.g. 'name: my-task'",
    ("task",): f"the suite has no 'task'; add one of {_TASKS_TEXT}",
    ("prompts",): "the suite has no 'prompts'; add a list of prompts, each with an id, a prompt and a check",
    ("id",): "{who} has no 'id'; give it a short name of its own",
    ("prompt",): "{who} has no 'prompt' (the text given to the model)",
    ("check",): "{who} has no 'check'; add one, e.g. 'check: {{contains: Paris}}'",
    ("check", "kind"): f"{{who}} has a check without a kind; use one of {_KINDS_TEXT} (e.g. 'contains: Paris')",
}


def _validation_message(error: Any, who: str, rest: DocumentPath) -> str:
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


def _translate(exc: ValidationError, data: dict[Any, Any], lines: dict[DocumentPath, int], source: str) -> SuiteError:
    errors = exc.errors()
    error = errors[0]
    if error["type"] == "missing":
        # A missing key next to an unknown one is most likely a typo of it: name the typo.
        parent = tuple(error["loc"])[:-1]
        typo = [e for e in errors if e["type"] == "extra_forbidden" and tuple(e["loc"])[:-1] == parent]
        error = typo[0] if typo else error
    loc: DocumentPath = tuple(error["loc"])
    problem = (error.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblemError):
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
