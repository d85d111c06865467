"""The user's own task suites: YAML files in FitScope's data folder (``<data>/suites``), listed
beside the built-in ones in the A/B tab and found by name by ``fitscope compare --suite``.

The easy way to grow one is an example: a prompt and the answer the user expects, appended to
``my-examples.yaml`` (``fitscope suites --add`` or *Add example…* in the A/B tab). The example is
appended to the file as text, so comments and layout the user wrote there stay as they were; only a
file whose last key is not its prompt list is written again whole. Every write goes to a temporary
file first and replaces the old one in one step, so a crash never leaves half a suite.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from app.adapters.locks import file_lock
from app.adapters.paths import data_dir
from app.core.common.errors import FitScopeError
from app.core.common.files import MAX_TEXT_BYTES, read_text_file
from app.core.quality.suite import Suite, SuiteError, SuitePrompt
from app.core.quality.suite_reading import builtin_suites, load_suite, parse_suite
from app.core.quality.suite_writing import example_prompt, suite_to_yaml, with_prompt

EXAMPLES_SUITE = "my-examples"
SUFFIXES = (".yaml", ".yml", ".json")
MAX_EXAMPLE_CHARS = 100_000
"""The longest prompt or expected answer an example may have (a long document to summarize fits)."""
LOCK_NAME = ".suites.lock"


@dataclass(frozen=True)
class UserSuite:
    suite: Suite
    path: Path


def user_suites_dir() -> Path:
    """Where the user's suites live (created on the first example)."""
    return data_dir() / "suites"


def load_user_suites(folder: Path | None = None) -> tuple[list[UserSuite], list[str]]:
    """Every suite file in ``folder`` (default: user_suites_dir()), by file name, and one message per
    file that cannot be used (a broken file, or a name a built-in suite already has). Never raises."""
    folder = user_suites_dir() if folder is None else folder
    found: list[UserSuite] = []
    problems: list[str] = []
    try:
        paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in SUFFIXES and p.is_file())
    except OSError:  # no folder yet, or unreadable: no suites of the user's
        return found, problems
    taken = {name.lower() for name in builtin_suites()}
    for path in paths:
        try:
            suite = load_suite(path)
        except SuiteError as exc:
            problems.append(str(exc))
            continue
        if suite.name.lower() in taken:
            problems.append(f"{path.name}: a built-in suite or another of yours is already named '{suite.name}'.")
            continue
        taken.add(suite.name.lower())
        found.append(UserSuite(suite, path))
    return found, problems


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _appended(text: str, prompt: SuitePrompt) -> str:
    """``text`` with the prompt added as the last item of its list, laid out as suite_to_yaml lays
    out every prompt."""
    rendered = suite_to_yaml(Suite(name="x", task="custom", prompts=(prompt,)))
    return text.rstrip("\n") + "\n\n" + rendered.split("\nprompts:\n", 1)[1]


def _whole(suite: Suite, path: Path) -> str:
    text = suite_to_yaml(suite)
    return json.dumps(yaml.safe_load(text), indent=2, ensure_ascii=False) + "\n" if path.suffix == ".json" else text


def _same_prompt(a: SuitePrompt, b: SuitePrompt) -> bool:
    return a.model_dump(exclude={"line"}) == b.model_dump(exclude={"line"})


def add_example(
    prompt: str,
    expected: str,
    check: str = "contains",
    *,
    suite_name: str = EXAMPLES_SUITE,
    folder: Path | None = None,
) -> UserSuite:
    """Append an example (a prompt, the answer expected, and one of ``app.core.suites.EXAMPLE_CHECKS``)
    to the user's suite ``suite_name``, creating its file in ``folder`` (default: user_suites_dir())
    on the first example. Returns the suite as saved. Raises SuiteError for an unusable example or
    a suite file that does not parse (naming its line), and FitScopeError when the file cannot be
    written."""
    folder = user_suites_dir() if folder is None else folder
    if suite_name.lower() in {name.lower() for name in builtin_suites()}:
        raise SuiteError(f"'{suite_name}' is a built-in suite; add examples to a suite of your own", source="")
    for what, text in (("prompt", prompt), ("expected answer", expected)):
        if len(text) > MAX_EXAMPLE_CHARS:
            raise SuiteError(
                f"the example's {what} is {len(text):,} characters long, more than the {MAX_EXAMPLE_CHARS:,} "
                "an example may have",
                source="",
            )
    # Read, append and write under one lock: two additions at once must both be kept.
    with file_lock(folder / LOCK_NAME, "your suites"):
        return _add_example(prompt, expected, check, suite_name, folder)


def _add_example(prompt: str, expected: str, check: str, suite_name: str, folder: Path) -> UserSuite:
    existing, _problems = load_user_suites(folder)
    mine = next((u for u in existing if u.suite.name.lower() == suite_name.lower()), None)
    file_name = re.sub(r"[^\w.-]+", "-", suite_name.strip()).strip(".-") or EXAMPLES_SUITE
    path = mine.path if mine is not None else folder / f"{file_name}.yaml"
    try:
        if mine is None and path.exists():
            load_suite(path)  # a broken file of that name: say where, rather than overwrite it
        if mine is None:
            new = example_prompt(prompt, expected, check)
            suite = Suite(
                name=suite_name,
                description="Examples of your own task: prompts with the answers you expect.",
                task="custom",
                prompts=(new,),
            )
            header = "# Your examples, added in FitScope (A/B tab: Add example…, or `fitscope suites --add`).\n"
            text = header + suite_to_yaml(suite)
        else:
            new = example_prompt(prompt, expected, check, [p.id for p in mine.suite.prompts])
            suite = with_prompt(mine.suite, new)
            text = _appended(read_text_file(path, "suite file"), new)
            try:
                again = parse_suite(text, path.name)
                appended_cleanly = len(again.prompts) == len(suite.prompts) and _same_prompt(again.prompts[-1], new)
            except SuiteError:
                appended_cleanly = False
            if not appended_cleanly or path.suffix.lower() == ".json":
                text = _whole(suite, path)
        if len(text.encode("utf-8")) > MAX_TEXT_BYTES:
            raise SuiteError(
                f"{path.name} would grow past {MAX_TEXT_BYTES // 1024**2} MiB, more than a suite file may have; "
                "start another suite (--to NAME)",
                source="",
            )
        _write_atomically(path, text)
    except OSError as exc:
        raise FitScopeError(f"Could not save the example to {path}: {exc.strerror or exc}.") from None
    return UserSuite(load_suite(path), path)


def save_suite(suite: Suite, path: Path) -> None:
    """Write ``suite`` to the user's suite file ``path`` (YAML, or JSON for a .json file), replacing
    it in one step. Raises FitScopeError when it cannot be written."""
    try:
        _write_atomically(path, _whole(suite, path))
    except OSError as exc:
        raise FitScopeError(f"Could not save the suite to {path}: {exc.strerror or exc}.") from None
