"""Prompts as a deployed model sees them: rendered through the model's own chat template.

A GGUF carries its template (``tokenizer.chat_template``, Jinja2, as in the model's
tokenizer_config.json). FitScope renders it the way llama-server does with ``--jinja``: in a
sandbox (a template comes from a downloaded file), with ``messages``, ``bos_token``,
``eos_token`` and ``add_generation_prompt``, then drops a leading BOS text because the tokenizer
adds the BOS token itself. A model without a template (a base model) is prompted raw.
"""

from __future__ import annotations

from collections.abc import Sequence

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.core.common.errors import FitScopeError

MAX_RENDERED_CHARS = 1_000_000


class ChatTemplateError(FitScopeError):
    """The model's chat template cannot render these messages; the message says why."""


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the model's chat template refused the messages: {message}")


def messages_for(prompt: str, system: str | None = None) -> list[dict[str, str]]:
    """One user turn (after an optional system turn), as a suite prompt or a Run tab preset is asked."""
    out = [{"role": "system", "content": system}] if system else []
    return out + [{"role": "user", "content": prompt}]


def render_chat(
    template: str,
    messages: Sequence[dict[str, str]],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """The text the model sees for ``messages``. Raises ChatTemplateError for a template that
    fails, refuses the messages or renders absurdly long text."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    try:
        text = env.from_string(template).render(
            messages=list(messages),
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        )
    except ChatTemplateError:
        raise
    except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
        raise ChatTemplateError(f"the model's chat template cannot be rendered: {exc}") from None
    if len(text) > MAX_RENDERED_CHARS:
        raise ChatTemplateError("the model's chat template renders an absurdly long prompt")
    if bos_token and text.startswith(bos_token):
        text = text[len(bos_token) :]  # the tokenizer adds the BOS token itself
    return text
