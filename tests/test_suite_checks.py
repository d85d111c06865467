"""Checks that judge content: similarity to reference answers, expected JSON values, tool calls;
and the user's own examples, saved to a suite file and found by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.adapters.user_suites import EXAMPLES_SUITE, add_example, load_user_suites
from app.cli import main
from app.core.quality.suite import DEFAULT_SIMILARITY, Check, SuiteError
from app.core.quality.suite_checks import check_answer, check_prompt
from app.core.quality.suite_reading import builtin_suites, find_suite, parse_suite
from app.core.quality.suite_similarity import similarity
from app.core.quality.suite_writing import example_prompt, suite_to_yaml

LIBRARY = "The council is closing the unsafe Main Street library, and a new library opens next year by the station."


# -- similar -------------------------------------------------------------------------------------


def test_similarity_passes_a_paraphrase_and_fails_an_unrelated_or_off_point_answer():
    check = Check(kind="similar", references=(LIBRARY,))
    assert check.threshold is None and DEFAULT_SIMILARITY == 0.4
    paraphrase = "A new library will open near the station next year after the council closed the unsafe one."
    assert similarity(paraphrase, LIBRARY) == pytest.approx(0.82, abs=0.005)
    result = check_answer(check, paraphrase)
    assert result.passed and result.reason.startswith("Similarity 0.82 to the reference, at least 0.40")
    assert "library" in result.reason
    # Same subject, wrong content: a model describing the library instead of summing up the news.
    off_point = "The library is located at 100 Main St. in the former library building."
    assert similarity(off_point, LIBRARY) == pytest.approx(0.22, abs=0.005)
    assert not check_answer(check, off_point).passed
    unrelated = "A heavy storm cut power to 20,000 homes overnight."
    assert similarity(unrelated, LIBRARY) == 0.0
    result = check_answer(check, unrelated)
    assert not result.passed
    assert result.reason.startswith("Similarity 0.00 to the reference 'The council is closing")
    assert "below 0.40" in result.reason


def test_similarity_ignores_word_order_word_forms_and_function_words():
    assert similarity("The library closed.", "Closing of the libraries") == 1.0
    assert similarity("20,000 homes", "20000 homes") == 1.0
    # Negation is content: "not guilty" is not "guilty".
    assert similarity("The jury found him not guilty.", "The jury found him guilty.") < 1.0


def test_a_stricter_threshold_and_the_best_of_several_references():
    strict = Check(kind="similar", references=(LIBRARY,), threshold=0.9)
    assert not check_answer(strict, "The council is shutting the unsafe Main Street library.").passed
    several = Check(kind="similar", references=("Bread costs more.", LIBRARY))
    assert check_answer(several, "The council closes the unsafe library; a new one opens by the station.").passed


def test_a_base_model_that_rambles_after_its_summary_is_judged_by_the_summary():
    check = Check(kind="similar", references=(LIBRARY,))
    answer = (
        " The unsafe Main Street library closes and a new library opens by the station next year.\n\n"
        "Article: The weather tomorrow will be sunny with light winds across the whole region and beyond."
    )
    assert check_answer(check, answer).passed
    # What it restates after its own answer earns nothing: only the opening paragraph is judged.
    restated = (
        " Libraries are important to every town.\n\nArticle: The council is closing the unsafe Main Street "
        "library, and a new library opens next year by the station."
    )
    assert not check_answer(check, restated).passed
    # A lead-in line ending in ":" is not the answer either.
    assert check_answer(check, "Here is a summary:\n\nThe unsafe Main Street library closes; a new one opens.").passed


def test_similar_checks_read_from_a_file_in_short_and_long_form():
    text = (
        "name: s\ntask: summarization\nprompts:\n"
        "  - id: one\n    prompt: Sum up.\n    check: {similar: The library closes., threshold: 0.6}\n"
        "  - id: two\n    prompt: Sum up.\n    check:\n      kind: similar\n      references: [A storm., A gale.]\n"
    )
    suite = parse_suite(text)
    assert suite.prompts[0].check.references == ("The library closes.",)
    assert suite.prompts[0].check.threshold == 0.6
    assert suite.prompts[1].check.references == ("A storm.", "A gale.")
    again = parse_suite(suite_to_yaml(suite))
    assert [p.check for p in again.prompts] == [p.check for p in suite.prompts]


def test_a_similar_check_without_content_words_or_above_one_is_refused_at_its_line():
    text = "name: s\ntask: summarization\nprompts:\n  - id: one\n    prompt: Sum up.\n    check: {similar: the of}\n"
    with pytest.raises(SuiteError) as caught:
        parse_suite(text, "s.yaml")
    assert caught.value.line == 6
    assert "no content words" in str(caught.value)
    with pytest.raises(SuiteError, match="at most 1"):
        parse_suite(text.replace("{similar: the of}", "{similar: Storm., threshold: 1.5}"))


def test_every_builtin_summary_fails_with_another_articles_summary():
    prompts = builtin_suites()["summarization"].prompts
    for index, p in enumerate(prompts):
        other = prompts[(index + 1) % len(prompts)].check.references
        assert other is not None
        assert not check_prompt(p, " " + other[0]).passed, p.id


# -- fields --------------------------------------------------------------------------------------


def test_a_fields_check_catches_a_wrong_value_and_forgives_case_spacing_and_order():
    check = Check(kind="fields", fields={"name": "Maria Lopez", "age": 34, "tags": ["a", "b"], "vip": True})
    assert check_answer(
        check, '{"name": "  maria   LOPEZ.", "age": 34.0, "tags": ["B", "a"], "vip": true, "x": 1}'
    ).passed
    result = check_answer(check, '{"name": "Maria Lopez", "age": 35, "tags": ["a", "b"], "vip": true}')
    assert not result.passed
    assert result.reason == "The JSON's 'age' is 35, expected 34."
    assert check_answer(check, '{"name": "Maria Lopez", "age": "34", "tags": ["a", "b"], "vip": true}').reason == (
        "The JSON's 'age' is \"34\", expected 34."
    )
    assert check_answer(check, '{"name": "Maria Lopez", "tags": ["a", "b"], "vip": true}').reason == (
        "The JSON's 'age' is missing."
    )
    assert not check_answer(check, '{"name": "Maria Lopez", "age": 34, "tags": ["a"], "vip": true}').passed
    assert not check_answer(check, '{"name": "Maria Lopez", "age": 34, "tags": ["a", "b"], "vip": false}').passed
    assert check_answer(check, "I cannot help with that.").reason == "No JSON object found in the answer."


def test_a_text_field_accepts_the_same_number_and_nested_objects_compare_field_by_field():
    check = Check(kind="fields", fields={"invoice": "2231", "address": {"city": "Lyon"}})
    assert check_answer(check, '{"invoice": 2231, "address": {"city": "lyon", "street": "8 Quai"}}').passed
    result = check_answer(check, '{"invoice": "2231", "address": {"city": "Paris"}}')
    assert result.reason == 'The JSON\'s \'address.city\' is "Paris", expected "Lyon".'


def test_yaml_dates_in_expected_values_compare_as_the_text_the_model_writes():
    text = "name: e\ntask: extraction\nprompts:\n  - id: d\n    prompt: x\n    check: {fields: {date: 2025-05-14}}\n"
    check = parse_suite(text).prompts[0].check
    assert check.fields == {"date": "2025-05-14"}
    assert check_answer(check, '{"date": "2025-05-14"}').passed


def test_every_builtin_extraction_value_check_catches_one_wrong_value():
    for p in builtin_suites()["extraction"].prompts:
        if p.check.kind != "fields" or p.check.fields is None:
            continue
        for key, value in p.check.fields.items():
            wrong = dict(p.check.fields)
            wrong[key] = not value if isinstance(value, bool) else value + 1 if isinstance(value, int | float) else []
            if isinstance(value, str):
                wrong[key] = value + " Jr"
            assert not check_prompt(p, json.dumps(wrong)[1:]).passed, (p.id, key)


# -- tool_call -----------------------------------------------------------------------------------

TIMER = Check(kind="tool_call", call={"name": "set_timer", "arguments": {"minutes": 15, "label": "pasta"}})


def test_a_tool_call_check_wants_the_function_and_exactly_its_arguments():
    assert check_answer(TIMER, '{"name": "set_timer", "arguments": {"minutes": 15, "label": "Pasta"}}').passed
    cases = {
        '{"name": "set_alarm", "arguments": {"minutes": 15, "label": "pasta"}}': (
            'The call is of "set_alarm", expected set_timer.'
        ),
        '{"name": "set_timer", "arguments": {"minutes": 50, "label": "pasta"}}': (
            "The call of set_timer: argument 'minutes' is 50, expected 15."
        ),
        '{"name": "set_timer", "arguments": {"minutes": 15}}': "The call of set_timer: argument 'label' is missing.",
        '{"name": "set_timer", "arguments": {"minutes": 15, "label": "pasta", "sound": "bell"}}': (
            "The call of set_timer has an unexpected argument 'sound'."
        ),
        '{"arguments": {"minutes": 15, "label": "pasta"}}': (
            "The JSON names no function (no 'name'); expected a call of set_timer."
        ),
    }
    for answer, reason in cases.items():
        result = check_answer(TIMER, answer)
        assert not result.passed and result.reason == reason, answer


def test_a_tool_call_in_the_openai_shape_with_string_arguments_passes():
    answer = json.dumps(
        {"type": "function", "function": {"name": "set_timer", "arguments": '{"minutes": 15, "label": "pasta"}'}}
    )
    assert check_answer(TIMER, answer).passed
    assert check_answer(TIMER, '{"name": "set_timer", "parameters": {"minutes": 15, "label": "pasta"}}').passed


def test_every_builtin_tool_call_check_catches_a_wrong_function_or_argument():
    for p in builtin_suites()["tool_call"].prompts:
        call = p.check.call
        assert call is not None
        right = {"name": call.name, "arguments": call.arguments}
        assert check_prompt(p, json.dumps(right)[1:]).passed, p.id
        assert not check_prompt(p, json.dumps({**right, "name": call.name + "s"})[1:]).passed, p.id
        first = next(iter(call.arguments))
        changed = {**call.arguments, first: "something else"}
        assert not check_prompt(p, json.dumps({"name": call.name, "arguments": changed})[1:]).passed, p.id


def test_a_tool_call_check_without_a_name_is_refused():
    text = "name: t\ntask: tool_call\nprompts:\n  - id: a\n    prompt: x\n    check: {tool_call: {arguments: {a: 1}}}\n"
    with pytest.raises(SuiteError, match="prompt 'a'") as caught:
        parse_suite(text)
    assert caught.value.line == 6
    with pytest.raises(SuiteError, match="did you mean 'arguments'"):
        parse_suite(text.replace("{arguments: {a: 1}}", "{name: f, argments: {a: 1}}"))


# -- the user's own examples ---------------------------------------------------------------------


def test_an_example_becomes_a_prompt_with_its_check():
    p = example_prompt("  What is the capital of Peru?\n", " Lima ", "contains", taken=["what-is-the-capital-of"])
    assert p.id == "what-is-the-capital-of-2"
    assert p.prompt == "What is the capital of Peru?"
    assert p.check.kind == "contains" and p.check.value == "Lima"
    assert p.max_tokens == 32
    summary = example_prompt(
        "Sum up: ...", "The corner shop closed after forty years when its rent doubled.", "similar"
    )
    assert summary.check.references == ("The corner shop closed after forty years when its rent doubled.",)
    assert check_prompt(summary, " After 40 years, the corner shop has closed because the rent doubled.").passed
    with pytest.raises(SuiteError, match="no expected answer"):
        example_prompt("Question?", "  ", "exact")
    with pytest.raises(SuiteError, match="one of contains, exact, similar"):
        example_prompt("Question?", "Yes", "regex")


def test_examples_are_appended_to_the_users_suite_file_keeping_its_comments(tmp_path: Path):
    first = add_example("Question: What is the capital of Peru?\nAnswer:", "Lima", "contains", folder=tmp_path)
    assert first.path == tmp_path / f"{EXAMPLES_SUITE}.yaml"
    assert first.suite.task == "custom" and [p.id for p in first.suite.prompts] == ["question-what-is-the-capital"]
    first.path.write_text(first.path.read_text() + "# my note\n", encoding="utf-8")
    second = add_example("Sum up: the bakery closed.", "The bakery has closed.", "similar", folder=tmp_path)
    assert len(second.suite.prompts) == 2
    text = second.path.read_text()
    assert "# my note" in text and "similar: The bakery has closed." in text
    yours, problems = load_user_suites(tmp_path)
    assert problems == [] and [u.suite.name for u in yours] == [EXAMPLES_SUITE]
    assert find_suite(EXAMPLES_SUITE, [u.suite for u in yours]).prompts[1].check.kind == "similar"
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file of each write is gone


def test_a_broken_suite_file_is_reported_not_overwritten(tmp_path: Path):
    broken = tmp_path / f"{EXAMPLES_SUITE}.yaml"
    broken.write_text("name: my-examples\ntask: custom\nprompts:\n  - id: a\n    prompt: x\n    check: {regx: y}\n")
    with pytest.raises(SuiteError, match="line 6"):
        add_example("Q?", "A", "exact", folder=tmp_path)
    assert "regx" in broken.read_text()
    yours, problems = load_user_suites(tmp_path)
    assert yours == [] and "my-examples.yaml, line 6" in problems[0]


def test_the_cli_adds_an_example_lists_it_and_compare_finds_it_by_name(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    assert main(["suites", "--add", "What is 2 + 2?", "--expect", "4", "--check", "exact"]) == 0
    out = capsys.readouterr().out
    assert "Added 'what-is-2-2' (exact) to my-examples: 1 prompt in" in out
    assert main(["suites"]) == 0
    listing = capsys.readouterr().out
    assert "summarization    summarization      32   70%  similar / built-in" in listing
    assert (
        f"my-examples      custom              1     -  exact / {tmp_path / 'suites' / 'my-examples.yaml'}" in listing
    )
    assert main(["suites", "--add", "What is 2 + 2?"]) == 2
    assert "--add needs --expect" in capsys.readouterr().err
    # compare resolves the name before it opens any model: a misspelt name says what exists.
    assert main(["compare", "--gguf", "a.gguf", "--gguf", "b.gguf", "--suite", "my-exampels", "--no-kl"]) == 2
    assert "did you mean 'my-examples'" in capsys.readouterr().err
