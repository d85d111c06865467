"""Prompts through the model's own chat template, rendered as llama.cpp renders them."""

from __future__ import annotations

import ctypes

import pytest

from app.core.quality.chat import ChatTemplateError, messages_for, render_chat

# Templates written for these tests in the two formats llama.cpp knows by name ("chatml", "gemma").
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GEMMA = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n{{ (first if loop.first else '') + m['content'] | trim }}<end_of_turn>\n"
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def llama_cpp_render(name: str, messages: list[dict[str, str]]) -> str:
    """llama.cpp's own rendering (llama_chat_apply_template with a built-in template name)."""
    import llama_cpp

    array = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        array[i].role, array[i].content = role, content
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(name.encode(), array, len(messages), True, buf, len(buf))
    assert 0 < n < len(buf)
    return buf.value.decode()


@pytest.mark.parametrize("system", [None, "Answer in one sentence."])
@pytest.mark.parametrize(("template", "name", "bos"), [(CHATML, "chatml", "<s>"), (GEMMA, "gemma", "<bos>")])
def test_rendering_matches_llama_cpp(template, name, bos, system):
    messages = messages_for("Summarize: the lighthouse was built in 1871.", system)
    assert render_chat(template, messages, bos_token=bos, eos_token="</s>") == llama_cpp_render(name, messages)


def test_a_hostile_or_broken_template_is_a_clear_error():
    with pytest.raises(ChatTemplateError, match="refused the messages: no system"):
        render_chat("{{ raise_exception('no system') }}", messages_for("hi"))
    with pytest.raises(ChatTemplateError, match="cannot be rendered"):
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", messages_for("hi"))
    with pytest.raises(ChatTemplateError, match="cannot be rendered"):
        render_chat("{% for %}", messages_for("hi"))


@pytest.mark.llamacpp
def test_suites_run_through_the_models_template_and_base_models_raw(tmp_path, demo_gguf):
    from app.adapters.suite_runner import PromptJob, SuiteRunSettings, run_suite
    from tests.support.tiny_gguf import TINY_PROMPT, write_tiny_llama

    chat = write_tiny_llama(tmp_path / "chat.gguf", chat_template=CHATML)
    jobs = (PromptJob(id="s/a", prompt=TINY_PROMPT, max_tokens=2),)
    run = run_suite(SuiteRunSettings(gguf_path=str(chat), prompts=jobs, context_tokens=512))
    assert run.prompt_format == "chat template"
    raw = run_suite(SuiteRunSettings(gguf_path=str(chat), prompts=jobs, context_tokens=512, chat=False))
    assert raw.prompt_format == "raw"
    # The template's turn markers are text to this tiny vocabulary: the chat prompt is longer.
    assert run.outcomes[0].prompt_tokens > raw.outcomes[0].prompt_tokens
    # The demo model is a base model (no template in its file): raw completion, said so.
    demo = run_suite(SuiteRunSettings(gguf_path=str(demo_gguf), prompts=jobs, context_tokens=512))
    assert demo.prompt_format == "raw"


@pytest.mark.llamacpp
def test_a_live_run_can_prompt_through_the_models_template_as_deployed(tmp_path, demo_gguf, capsys):
    import json

    from app.cli import main
    from tests.support.tiny_gguf import TINY_PROMPT, write_tiny_llama

    chat_model = write_tiny_llama(tmp_path / "chat.gguf", chat_template=CHATML)

    def run(model, *extra: str) -> dict:
        args = ["run", "--gguf", str(model), "-p", TINY_PROMPT, "-n", "4", "--repeat", "1", "-c", "512"]
        assert main([*args, "--json", "--no-save", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    raw, chat = run(chat_model), run(chat_model, "--chat")
    system = run(chat_model, "--chat", "--system", "Answer in one word.")
    assert raw["prompt_format"] == "raw" and chat["prompt_format"] == "chat template"
    # The template's turn markers wrap the question: more prompt tokens; a system turn adds more again.
    raw_tokens, chat_tokens = raw["runs"][0]["prompt_tokens"], chat["runs"][0]["prompt_tokens"]
    assert chat_tokens > raw_tokens
    assert system["runs"][0]["prompt_tokens"] > chat_tokens
    # The demo model is a base model (no template in its file): sent as typed, and said so.
    assert run(demo_gguf, "--chat")["prompt_format"] == "raw"
    assert main(["run", "--gguf", str(demo_gguf), "--system", "Be brief.", "--no-save"]) == 2
    assert "--system goes with --chat" in capsys.readouterr().err


@pytest.mark.llamacpp
def test_the_run_tab_sends_presets_through_the_template_and_follows_the_switch(qtbot, tmp_path):
    from test_window import make_services, open_window, settle

    from tests.support.tiny_gguf import write_tiny_llama

    chat_model = write_tiny_llama(tmp_path / "chat.gguf", chat_template=CHATML)
    window = open_window(qtbot, make_services(tmp_path))
    window.open_gguf(str(chat_model))
    settle(qtbot, window, lambda v: v.request.model.kind == "gguf")
    panel = window.run_panel
    panel.form.preset_combo.setCurrentText("Chat")
    assert panel.form.chat_check.isChecked() and not panel.form.prompt_edit.toPlainText().startswith("User:")
    panel.form.chat_check.setChecked(False)
    assert panel.form.prompt_edit.toPlainText().startswith("User:") and not panel.form.system_edit.isEnabled()
    panel.form.chat_check.setChecked(True)
    panel.form.system_edit.setText("Answer briefly.")
    panel.form.max_tokens.setValue(4)
    panel.form.repeat.setValue(1)
    with qtbot.waitSignal(panel.run_finished, timeout=120000) as blocker:
        panel.run_button.click()
    result = blocker.args[0]
    assert result.prompt_format == "chat template" and result.settings.system_prompt == "Answer briefly."
    cells = {panel.figures.item(r, 0).text(): panel.figures.item(r, 1).text() for r in range(panel.figures.rowCount())}
    assert cells["Prompt"] == "one user turn through the model's chat template"
    window.close()
