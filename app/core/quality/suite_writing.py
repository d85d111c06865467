"""Writing task suites: a suite as YAML for the editor, and prompts made from the user's own examples.

:func:`suite_to_yaml` writes a suite the way people write one (short check forms, lists indented
under their key, multi-line prompts as blocks), and :func:`~app.core.quality.suite_reading.parse_suite`
reads it back to an equal suite. :func:`example_prompt` turns a prompt and the answer a user
expects into a suite prompt with a contains, exact or similar check; :func:`with_prompt` appends
one to a suite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from app.core.quality.suite import DEFAULT_MAX_TOKENS, DEFAULT_SIMILARITY, Check, Suite, SuiteError, SuitePrompt

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
