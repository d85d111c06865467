"""Task suites: the built-in files, the checks on answers, and errors that point at the line at fault."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from jsonschema.validators import validator_for

from app.core.common.errors import FitScopeError
from app.core.quality.suite import Check, Suite, SuiteError, SuitePrompt
from app.core.quality.suite_checks import CheckResult, check_answer, check_prompt, pass_rate
from app.core.quality.suite_reading import builtin_suites, find_suite, load_suite, parse_suite
from app.core.quality.suite_writing import suite_to_yaml

FLOORS = {"chat": 0.6, "summarization": 0.7, "extraction": 0.9, "tool_call": 0.95}

# A right answer (the model's continuation) for every chat and JSON-Schema prompt: each check must
# accept it, so no built-in check is impossible to pass. The value checks (fields, tool_call) and the
# summaries' references are turned into right answers in right_answer() below.
RIGHT_ANSWERS = {
    "chat": {
        "capital-france": " Paris.",
        "capital-japan": " Tokyo is the capital of Japan.",
        "add-numbers": " 12",
        "multiply": " 6 times 8 is 48.",
        "half-of-fifty": " Twenty-five",
        "square-root": " 9",
        "days-in-week": " There are seven days in a week.",
        "months-in-year": " 12 months",
        "minutes-in-hour": " Sixty minutes.",
        "metres-in-kilometre": " There are 1,000 metres in a kilometre.",
        "hexagon-sides": " 6",
        "spider-legs": " A spider has eight legs.",
        "largest-planet": " Jupiter",
        "red-planet": " Mars",
        "star-of-solar-system": " The Sun.",
        "largest-ocean": " The Pacific Ocean",
        "kenya-continent": " Africa",
        "sky-colour": " Blue.",
        "mix-blue-yellow": " Green",
        "opposite-of-hot": " Cold",
        "opposite-of-early": " Late.",
        "past-tense-go": ' "Went"',
        "plural-mouse": " Mice",
        "solid-water": " Ice",
        "water-freezes": " 0 degrees Celsius.",
        "water-boils": " At 100 degrees Celsius.",
        "photosynthesis-gas": " Carbon dioxide (CO2).",
        "gold-symbol": " Au",
        "fastest-land-animal": " The cheetah.",
        "romeo-author": " William Shakespeare",
        "mona-lisa": " Leonardo da Vinci",
        "first-on-moon": " Neil Armstrong, in 1969.",
        "thank-you-french": " Merci",
        "good-morning-spanish": " Buenos días",
        "dog-german": " der Hund",
    },
    "extraction": {
        "review-sentiment": '"product": "headphones", "sentiment": "negative"}',
        "customer-complaint": '"order": "8830", "problem": "arrived damaged", "refund": true}',
        "sensor-alert": '"sensor": "P-9", "reading": 7.2, "over_limit": true}',
    },
}


def right_answer(suite: str, prompt: SuitePrompt) -> str:
    """A right continuation of ``prompt``, followed by the rambling a base model adds after it."""
    check = prompt.check
    ramble = "\nText: and so on, and so on"
    if check.kind == "similar":
        return " " + (check.references or ("",))[0] + "\n\nArticle: The next story is about the weather."
    if check.kind == "fields":
        return json.dumps(check.fields)[1:] + ramble
    if check.kind == "tool_call" and check.call is not None:
        return json.dumps({"name": check.call.name, "arguments": check.call.arguments})[1:] + ramble
    return RIGHT_ANSWERS[suite][prompt.id]


def _without_lines(suite: Suite) -> dict:
    return suite.model_dump(exclude={"prompts": {"__all__": {"line"}}})


def _error(text: str, source: str = "<editor>") -> SuiteError:
    with pytest.raises(SuiteError) as caught:
        parse_suite(text, source)
    return caught.value


def _line_of(text: str, needle: str) -> int:
    """The 1-based line of the last line containing ``needle``."""
    return max(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# -- built-in suites -----------------------------------------------------------------------------


def test_every_builtin_suite_loads_with_its_floor_and_unique_ids():
    suites = builtin_suites()
    assert set(suites) == set(FLOORS)
    for name, suite in suites.items():
        assert suite.task == name
        assert suite.quality_floor == FLOORS[name]
        assert suite.description
        assert len(suite.prompts) >= 30, name
        ids = [p.id for p in suite.prompts]
        assert len(ids) == len(set(ids))
        for p in suite.prompts:
            assert p.line is not None and p.line > 1
            assert 16 <= p.max_tokens <= 64, p.id  # short answers keep a 30-prompt suite quick


def test_every_builtin_check_compiles():
    for suite in builtin_suites().values():
        for p in suite.prompts:
            check = p.check
            if check.kind == "json_schema":
                assert check.schema_ is not None
                validator_for(check.schema_).check_schema(check.schema_)
            elif check.kind == "similar":
                assert check.references and len(check.references) >= 2, p.id
            elif check.kind == "fields":
                assert check.fields, p.id
            elif check.kind == "tool_call":
                assert check.call is not None and check.call.arguments, p.id
            else:
                assert check.value
                if check.kind == "regex":
                    re.compile(check.value)


def test_extraction_and_tool_call_suites_check_json_continuations():
    for name in ("extraction", "tool_call"):
        for p in builtin_suites()[name].prompts:
            assert p.check.kind in ("json_schema", "fields", "tool_call"), p.id
            assert p.answer_prefix == "{" and p.prompt.endswith("{"), p.id
    kinds = {p.check.kind for p in builtin_suites()["extraction"].prompts}
    assert kinds == {"fields", "json_schema"}
    assert {p.check.kind for p in builtin_suites()["tool_call"].prompts} == {"tool_call"}
    assert {p.check.kind for p in builtin_suites()["summarization"].prompts} == {"similar"}


def test_every_builtin_check_accepts_a_right_answer_and_rejects_an_empty_one():
    for name, suite in builtin_suites().items():
        for p in suite.prompts:
            right = check_prompt(p, right_answer(name, p))
            assert right.passed, (name, p.id, right.reason)
            assert not check_prompt(p, "").passed, (name, p.id)
            assert not check_prompt(p, " I don't know.").passed, (name, p.id)


def test_builtin_suites_are_cached_but_returned_as_fresh_dicts():
    first = builtin_suites()
    first.pop("chat")
    assert "chat" in builtin_suites()
    assert builtin_suites()["chat"] is builtin_suites()["chat"]


def test_find_suite_by_name_or_path(tmp_path: Path):
    assert find_suite("chat") is builtin_suites()["chat"]
    assert find_suite(" Tool_Call ").name == "tool_call"
    path = tmp_path / "mine.yaml"
    path.write_text(MINIMAL, encoding="utf-8")
    assert find_suite(str(path)).name == "mine"
    with pytest.raises(SuiteError) as caught:
        find_suite("chatt")
    message = str(caught.value)
    assert "did you mean 'chat'" in message
    for name in FLOORS:
        assert name in message
    assert message[0].isupper()
    with pytest.raises(SuiteError, match="cannot find the suite file"):
        find_suite(str(tmp_path / "missing.yaml"))


# -- check_answer --------------------------------------------------------------------------------


def test_exact_ignores_case_quotes_and_a_trailing_period():
    check = Check(kind="exact", value="Paris")
    for answer in ("Paris", "  paris\n", '"Paris"', "'Paris'.", "Paris.", "“PARIS”"):
        result = check_answer(check, answer)
        assert result.passed, answer
        assert "exactly 'Paris'" in result.reason
    result = check_answer(check, "Paris is the capital")
    assert not result.passed
    assert result.reason == "Expected exactly 'Paris', but the answer is 'Paris is the capital'."
    assert "empty" in check_answer(check, "  ").reason


def test_exact_case_sensitive():
    check = Check(kind="exact", value="Paris", case_sensitive=True)
    assert check_answer(check, "Paris.").passed
    result = check_answer(check, "paris")
    assert not result.passed
    assert "case" in result.reason


def test_contains():
    check = Check(kind="contains", value="Paris")
    assert check_answer(check, " The capital is PARIS, of course.").passed
    result = check_answer(check, " London")
    assert not result.passed and result.reason == "The answer does not contain 'Paris'."
    strict = Check(kind="contains", value="Paris", case_sensitive=True)
    assert check_answer(strict, "in Paris").passed
    result = check_answer(strict, "in paris")
    assert not result.passed and "different case" in result.reason


def test_regex_searches_the_whole_answer_ignoring_case():
    check = Check(kind="regex", value=r"\b(12|twelve)\b")
    result = check_answer(check, " It is\nTwelve.")
    assert result.passed and "'Twelve'" in result.reason
    assert not check_answer(check, " 112").passed
    dotall = Check(kind="regex", value="start.*end")
    assert check_answer(dotall, "start\nmiddle\nend").passed
    strict = Check(kind="regex", value="^Yes", case_sensitive=True)
    assert not check_answer(strict, "yes").passed
    assert "does not match '^Yes'" in check_answer(strict, "yes").reason


SCHEMA = {
    "type": "object",
    "required": ["amount", "currency"],
    "properties": {"amount": {"type": "number"}, "currency": {"enum": ["EUR", "USD"]}},
}


def test_json_schema_finds_json_in_prose_and_fences():
    check = Check(kind="json_schema", schema=SCHEMA)
    prose = 'Sure! Here it is: {"amount": 12.5, "currency": "EUR"} Hope that helps {smile}.'
    result = check_answer(check, prose)
    assert result.passed, result.reason
    assert result.reason == "The JSON object matches the schema."
    fenced = 'Note [1]: see {below}.\n```json\n{\n  "amount": 3,\n  "currency": "USD"\n}\n```\nDone.'
    assert check_answer(check, fenced).passed
    # a bracket inside a string does not end the object
    assert check_answer(check, 'x {"amount": 1, "currency": "EUR", "note": "a } b {"} y').passed
    # a broken candidate is skipped whole, then the real object is found
    assert check_answer(check, '{not json} then {"amount": 2, "currency": "USD"}').passed


def test_json_schema_on_a_continuation_with_answer_prefix():
    prompt = SuitePrompt(
        id="p", prompt="Text: 5 euros.\nJSON: {", answer_prefix="{", check=Check(kind="json_schema", schema=SCHEMA)
    )
    continuation = ' "amount": 5, "currency": "EUR"}\nText: next one'
    assert check_prompt(prompt, continuation).passed
    assert not check_answer(prompt.check, continuation).passed  # without the prefix there is no object
    # a model that repeats the prompt's brace still has its object found
    assert check_prompt(prompt, '{"amount": 5, "currency": "EUR"}').passed


def test_json_schema_failures_say_why():
    check = Check(kind="json_schema", schema=SCHEMA)
    cases = {
        "I cannot do that.": "No JSON object found in the answer.",
        "{'amount': 5, 'currency': 'EUR'}": "The JSON is invalid: Expecting property name enclosed in double quotes",
        '{"currency": "EUR"}': "The JSON does not match the schema: 'amount' is a required property.",
        '{"amount": 5, "currency": "GBP"}': "The JSON does not match the schema at 'currency': 'GBP' is not one of",
        '{"amount": "5", "currency": "EUR"}': "at 'amount': '5' is not of type 'number'",
        '{"amount": 5, "curr': "The JSON object is never closed",
    }
    for answer, reason in cases.items():
        result = check_answer(check, answer)
        assert not result.passed, answer
        assert reason in result.reason, (answer, result.reason)
        assert result.reason.endswith(".")


def test_json_schema_for_an_array():
    check = Check(kind="json_schema", schema={"type": "array", "items": {"type": "integer"}, "minItems": 2})
    assert check_answer(check, "The ids are [3, 4].").passed
    result = check_answer(check, "none")
    assert not result.passed and result.reason == "No JSON array found in the answer."


def test_check_answer_never_raises_for_a_check_built_without_validation():
    broken = Check.model_construct(kind="regex", value="(", case_sensitive=False)
    result = check_answer(broken, "anything")
    assert not result.passed and "invalid" in result.reason
    bad_schema = Check.model_construct(kind="json_schema", value=None, schema_={"type": 12}, case_sensitive=False)
    result = check_answer(bad_schema, "{}")
    assert not result.passed and "Schema is invalid" in result.reason


def test_json_extraction_stays_fast_on_runaway_brackets():
    check = Check(kind="json_schema", schema=SCHEMA)
    result = check_answer(check, "{" * 20000)
    assert not result.passed and "never closed" in result.reason


def test_pass_rate():
    assert pass_rate([]) == 0.0
    ok, bad = CheckResult(True, "ok"), CheckResult(False, "no")
    assert pass_rate([ok, bad, ok, ok]) == 0.75
    assert pass_rate([ok]) == 1.0


# -- parsing and errors --------------------------------------------------------------------------

MINIMAL = textwrap.dedent(
    """\
    name: mine
    task: custom
    prompts:
      - id: one
        prompt: "Q: 2+2?\\nA:"
        check: {regex: '\\b4\\b'}
    """
)


def test_short_and_long_check_forms_read_the_same():
    short = parse_suite(MINIMAL)
    long = parse_suite(MINIMAL.replace("check: {regex: '\\b4\\b'}", "check: {kind: regex, value: '\\b4\\b'}"))
    assert short.prompts[0].check == long.prompts[0].check == Check(kind="regex", value=r"\b4\b")
    assert short.prompts[0].line == 4
    assert short.prompts[0].max_tokens == 96 and short.quality_floor is None


def test_json_text_is_read_with_lines():
    text = textwrap.dedent(
        """\
        {
          "name": "j",
          "task": "extraction",
          "quality_floor": 0.9,
          "prompts": [
            {
              "id": "a",
              "prompt": "JSON: {",
              "answer_prefix": "{",
              "check": {"kind": "json_schema", "schema": {"type": "object", "required": ["x"]}}
            },
            {"id": 2, "prompt": "p", "check": {"contains": 4}}
          ]
        }
        """
    ).replace("  ", "\t")  # tabs are fine in JSON, though YAML refuses them as indentation
    suite = parse_suite(text)
    assert [p.line for p in suite.prompts] == [6, 12]
    assert suite.prompts[0].check.schema_ == {"type": "object", "required": ["x"]}
    assert suite.prompts[1].id == "2" and suite.prompts[1].check.value == "4"


def test_bad_check_kind_points_at_its_line():
    text = MINIMAL.replace("check: {regex: '\\b4\\b'}", "check:\n      regx: '4'")
    err = _error(text, "tools.yaml")
    assert err.line == _line_of(text, "regx") == 7
    assert err.source == "tools.yaml"
    assert str(err) == (
        "tools.yaml, line 7: prompt 'one' has check kind 'regx'; use one of exact, contains, regex, json_schema, "
        "similar, fields, tool_call."
    )
    long_form = MINIMAL.replace("check: {regex: '\\b4\\b'}", "check:\n      kind: regx\n      value: '4'")
    err = _error(long_form)
    assert err.line == 7 and "line 7" in str(err) and "check kind 'regx'" in str(err)


def test_duplicate_id_in_json_points_at_the_second_id():
    text = textwrap.dedent(
        """\
        {
          "name": "dup",
          "task": "chat",
          "prompts": [
            {
              "id": "weather",
              "prompt": "Q: one?\\nA:",
              "check": {"contains": "x"}
            },
            {
              "id": "weather",
              "prompt": "Q: two?\\nA:",
              "check": {"contains": "y"}
            }
          ]
        }
        """
    )
    err = _error(text, "dup.json")
    assert err.line == 11
    assert "line 11" in str(err)
    assert "prompt 'weather'" in str(err) and "already used by the prompt on line 5" in str(err)


def test_yaml_syntax_error_has_the_parsers_line():
    text = "name: broken\ntask: chat\nprompts:\n  - id: a\n    prompt: [unclosed\n    check: {contains: x}\n"
    err = _error(text)
    assert err.line is not None and err.line >= 5
    assert str(err).startswith(f"<editor>, line {err.line}: the YAML is invalid:")
    err = _error("name: a\n  task: b: c\n")
    assert err.line == 2 and "YAML is invalid" in str(err)


def test_json_syntax_error_has_its_line():
    err = _error('{\n  "name": "x",\n  "task": "chat"\n  "prompts": []\n}\n', "s.json")
    assert err.line == 4
    assert str(err).startswith("s.json, line 4: the JSON is invalid: Expecting ',' delimiter")


def test_invalid_regex_points_at_its_line():
    text = MINIMAL.replace("check: {regex: '\\b4\\b'}", "max_tokens: 8\n    check:\n      regex: '(4'")
    err = _error(text)
    assert err.line == _line_of(text, "regex") == 8
    assert "prompt 'one': the regex '(4' is invalid" in str(err)
    assert "missing )" in str(err)


def test_invalid_schema_points_at_the_bad_keyword():
    text = MINIMAL.replace(
        "check: {regex: '\\b4\\b'}", "check:\n      json_schema:\n        required: [a]\n        type: 12"
    )
    err = _error(text)
    assert err.line == _line_of(text, "type: 12") == 9
    assert "prompt 'one': the JSON Schema is invalid at 'type'" in str(err)
    long_form = MINIMAL.replace("check: {regex: '\\b4\\b'}", 'check: {kind: json_schema, schema: {"type": 12}}')
    err = _error(long_form)
    assert err.line == 6 and "JSON Schema is invalid" in str(err)


def test_missing_and_empty_prompts():
    err = _error("name: x\ntask: chat\n")
    assert err.line == 1 and "no 'prompts'" in str(err)
    err = _error("name: x\ntask: chat\nprompts: []\n")
    assert err.line == 3 and "no prompts; add at least one" in str(err)


@pytest.mark.parametrize(
    ("old", "new", "line", "words"),
    [
        ("task: custom", "task: chatt", 2, "task 'chatt'; use one of chat, summarization"),
        ("name: mine\n", "", 1, "no 'name'"),
        ("  - id: one\n", "  - idd: one\n", 4, "unknown key 'idd'; did you mean 'id'?"),
        ("    check: {regex: '\\b4\\b'}\n", "", 4, "prompt 'one' has no 'check'"),
        ("check: {regex: '\\b4\\b'}", "check: {regex: '4', contains: '4'}", 6, "several kinds (regex, contains)"),
        ("check: {regex: '\\b4\\b'}", "check: {case_sensitive: true}", 6, "a check without a kind"),
        (
            "check: {regex: '\\b4\\b'}",
            "check: {contains: '4', case_sensitiv: true}",
            6,
            "unknown key 'case_sensitiv'; did you mean 'case_sensitive'?",
        ),
        ("check: {regex: '\\b4\\b'}", "check: {contains: ''}", 6, "needs a non-empty 'value'"),
        ("check: {regex: '\\b4\\b'}", "check: 'contains 4'", 6, "'check' must be a mapping, not text"),
        ("check: {regex", "max_tokens: 5000\n    check: {regex", 6, "'max_tokens' must be at most 4096, not 5000"),
        ("check: {regex", "max_tokens: lots\n    check: {regex", 6, "'max_tokens' must be a whole number"),
        ("task: custom", "task: custom\nquality_floor: 95", 3, "'quality_floor' must be at most 1"),
        ("  - id: one\n", "  - id: one\n    id: two\n", 5, "the key 'id' appears twice"),
        ("task: custom", "task: custom\nprompt: x", 3, "unknown key 'prompt'; did you mean 'prompts'?"),
    ],
)
def test_other_mistakes_name_the_line_and_the_fix(old: str, new: str, line: int, words: str):
    assert old in MINIMAL
    err = _error(MINIMAL.replace(old, new))
    assert err.line == line, str(err)
    assert f"line {line}: " in str(err)
    assert words in str(err)
    assert str(err).endswith((".", "?"))


def test_not_a_suite_at_all():
    assert "empty" in str(_error(""))
    assert "must be a mapping" in str(_error("- a\n- b\n"))
    assert "prompt 1 must be a mapping" in str(_error("name: x\ntask: chat\nprompts:\n  - just text\n"))


def test_load_suite_reads_files_and_names_them(tmp_path: Path):
    path = tmp_path / "mine.yml"
    path.write_text(MINIMAL, encoding="utf-8")
    assert load_suite(path) == parse_suite(MINIMAL)
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SuiteError) as caught:
        load_suite(missing)
    assert caught.value.line is None
    assert str(caught.value) == f"nope.yaml: FitScope cannot find the suite file {missing}."
    assert isinstance(caught.value, FitScopeError)
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("task: custom", "task: nope"), encoding="utf-8")
    assert str(pytest.raises(SuiteError, load_suite, bad).value).startswith("bad.yaml, line 2: ")
    with pytest.raises(SuiteError, match="is a folder, not a suite file"):
        load_suite(tmp_path)


def test_suite_to_yaml_round_trips():
    odd = Suite(
        name="odd",
        description="Strings YAML would misread: 'yes', 12, a: b, #hash, trailing space ",
        task="custom",
        quality_floor=0.5,
        prompts=(
            SuitePrompt(
                id="yes", prompt="Line one\nline two ends with a space \n", check=Check(kind="exact", value="12")
            ),
            SuitePrompt(
                id="j",
                prompt="{",
                max_tokens=16,
                answer_prefix="{",
                check=Check(kind="json_schema", schema={"type": "object", "required": ["a: b", "#x"]}),
            ),
            SuitePrompt(
                id="r",
                prompt="- not a list",
                check=Check(kind="regex", value=r"^\s*\d+", case_sensitive=True, description="a number first"),
            ),
        ),
    )
    for suite in (*builtin_suites().values(), odd):
        text = suite_to_yaml(suite)
        again = parse_suite(text)
        assert _without_lines(again) == _without_lines(suite)
        assert all(p.line is not None for p in again.prompts)
    assert "check: {contains: Paris}" in suite_to_yaml(builtin_suites()["chat"])
