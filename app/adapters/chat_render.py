"""A model's chat template rendered where a limit can stop it: a child process of its own.

:mod:`app.core.quality.chat` holds every single operation of a template to a size budget, but a
template is a program: loops that print nothing can still run for ever, and many operations
within budget can still add up. So the prompts of a run or a suite are rendered in one short-lived
child (``python -m app.adapters.chat_render``, through
:class:`~app.adapters.child_protocol.WorkerProcess`), with :data:`RENDER_TIME_LIMIT_S` for all of
them and :data:`RENDER_MEMORY_LIMIT_BYTES` of address space (``RLIMIT_AS`` where the system
enforces it; elsewhere a watchdog thread ends the child when its resident memory passes the
limit). A template over its budget becomes one sentence naming it: "this model's chat template did
not finish within 5 s", and each prompt it could not render carries that sentence.

Measured on this 2-core machine: starting the child and rendering a suite's prompts through a
real template takes about 0.2 s, once per model load.

Protocol: settings (:class:`RenderJob`: the template, the conversations, the BOS and EOS texts) as
one JSON line on stdin; one :class:`Rendered` event per conversation, then
:class:`~app.adapters.child_protocol.Done`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Literal

from app.adapters.child_protocol import ChildChannel, ChildEvent, Done, WorkerProcess, serve_child
from app.core.common.units import Frozen
from app.core.quality.chat import (
    TEMPLATE_NAME,
    ChatTemplateError,
    compile_template,
    render_compiled,
)

RENDER_TIME_LIMIT_S = 5.0
"""Real templates render a prompt in milliseconds; a file's template gets this long for all of them."""
RENDER_MEMORY_LIMIT_BYTES = 1024**3
_WATCH_INTERVAL_S = 0.05


class RenderJob(Frozen):
    """What the renderer child is given: the template, each conversation's messages, the texts of
    the BOS and EOS tokens."""

    template: str
    conversations: tuple[tuple[dict[str, str], ...], ...]
    bos_token: str = ""
    eos_token: str = ""
    add_generation_prompt: bool = True


class Rendered(ChildEvent):
    """Conversation ``index`` rendered (``text``) or refused (``error``, one sentence)."""

    event: Literal["rendered"] = "rendered"
    index: int
    text: str = ""
    error: str | None = None


RENDER_EVENTS = (Rendered, Done)


def render_conversations(
    template: str,
    conversations: Sequence[Sequence[dict[str, str]]],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    time_limit_s: float = RENDER_TIME_LIMIT_S,
) -> list[str | ChatTemplateError]:
    """Each conversation rendered through ``template`` in a child process held to ``time_limit_s``
    seconds and RENDER_MEMORY_LIMIT_BYTES: the text, or a ChatTemplateError saying why not (the
    same error for every conversation left when the template went over its limits). Never raises."""
    if not conversations:
        return []
    job = RenderJob(
        template=template,
        conversations=tuple(tuple(m) for m in conversations),
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
    )
    results: list[str | ChatTemplateError | None] = [None] * len(conversations)
    try:
        child = WorkerProcess(
            "app.adapters.chat_render", job, RENDER_EVENTS, name=TEMPLATE_NAME, timeout_s=time_limit_s
        )
    except (OSError, ValueError) as exc:
        return [ChatTemplateError(f"{TEMPLATE_NAME} could not be rendered: {exc}")] * len(conversations)

    def on_event(event: ChildEvent) -> None:
        if isinstance(event, Rendered) and 0 <= event.index < len(results):
            results[event.index] = ChatTemplateError(event.error) if event.error is not None else event.text

    child.follow(on_event)
    missing: ChatTemplateError
    if child.timed_out:
        missing = ChatTemplateError(
            f"{TEMPLATE_NAME} did not finish within {time_limit_s:g} s and was stopped (templates come "
            "with the model file; FitScope limits their rendering)"
        )
    elif child.failed is not None:
        missing = ChatTemplateError(child.failed.message)
    else:
        missing = ChatTemplateError(
            f"{TEMPLATE_NAME} stopped its renderer (more than {RENDER_MEMORY_LIMIT_BYTES // 1024**2:,} MiB, "
            f"or {child.failure('while rendering') or 'no answer'})"
        )
    return [r if r is not None else missing for r in results]


# -- child ---------------------------------------------------------------------------------------


def _limit_memory(limit_bytes: int) -> None:
    """Hold this process to ``limit_bytes``: RLIMIT_AS where it exists (a MemoryError then stops
    the render), and a watchdog that ends the process past it in any case (macOS does not enforce
    RLIMIT_AS; Windows has none)."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    except (ImportError, ValueError, OSError):
        pass
    import psutil

    me = psutil.Process()

    def watch() -> None:
        while True:
            time.sleep(_WATCH_INTERVAL_S)
            if me.memory_info().rss > limit_bytes:
                os._exit(9)

    threading.Thread(target=watch, daemon=True).start()


def _child_render(child: ChildChannel, job: RenderJob) -> int:
    try:
        compiled = compile_template(job.template)
    except ChatTemplateError as exc:
        return child.fail(str(exc))
    except MemoryError:
        return child.fail(f"{TEMPLATE_NAME} needed more than {RENDER_MEMORY_LIMIT_BYTES // 1024**2:,} MiB to compile")
    for index, messages in enumerate(job.conversations):
        if child.stop_requested:
            return 0
        try:
            text = render_compiled(compiled, messages, job.bos_token, job.eos_token, job.add_generation_prompt)
            child.emit(Rendered(index=index, text=text))
        except ChatTemplateError as exc:
            child.emit(Rendered(index=index, error=str(exc)))
        except MemoryError:
            return child.fail(
                f"{TEMPLATE_NAME} needed more than {RENDER_MEMORY_LIMIT_BYTES // 1024**2:,} MiB to render"
            )
    child.emit(Done())
    return 0


if __name__ == "__main__":
    _limit_memory(RENDER_MEMORY_LIMIT_BYTES)
    sys.exit(serve_child(RenderJob, _child_render))
