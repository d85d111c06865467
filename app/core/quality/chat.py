"""Prompts as a deployed model sees them: rendered through the model's own chat template, under a
budget.

A GGUF carries its template (``tokenizer.chat_template``, Jinja2, as in the model's
tokenizer_config.json). FitScope renders it the way llama-server does with ``--jinja``: in a
sandbox, with ``messages``, ``bos_token``, ``eos_token`` and ``add_generation_prompt``, then drops
a leading BOS text because the tokenizer adds the BOS token itself. A model without a template (a
base model) is prompted raw.

A template comes with a downloaded file, so it is treated as hostile. Jinja's sandbox keeps it
away from Python's internals but not from the machine's memory or time: ``'x' * 3000000000``,
``'%2000000000d' % 1``, ``lipsum(n=10**7)`` or nested ``range`` loops would each take gigabytes or
run for ever. Here (:class:`BudgetSandbox`) every repetition, concatenation, ``%``/``format`` width,
padding method and filter result is held to :data:`MAX_VALUE_CHARS`, ``range`` to Jinja's own
100,000 items, ``lipsum`` to a few paragraphs, the template itself to :data:`MAX_TEMPLATE_CHARS`
(Jinja compiles about 100 KB a second) and the output, streamed, to :data:`MAX_RENDERED_CHARS`.
Time and memory as a whole are bounded where the render runs, in a child process that is ended
past its limits (:mod:`app.adapters.chat_render`); this module is the pure part.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable, Sequence
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import generate_lorem_ipsum

from app.core.common.errors import FitScopeError

MAX_TEMPLATE_CHARS = 256 * 1024
"""Real chat templates are 1-40 KB; compiling 256 KB takes Jinja a few seconds."""
MAX_RENDERED_CHARS = 1_000_000
"""The longest prompt a template may render (a million characters is ~250,000 tokens)."""
MAX_VALUE_CHARS = 4_000_000
"""The longest text or list any one operation inside a template may build."""
MAX_FORMAT_WIDTH = 4096
"""The widest field a ``%`` or ``format`` specification, or a padding method, may ask for."""
MAX_LIPSUM_PARAGRAPHS = 20
MAX_LIPSUM_WORDS = 200
TEMPLATE_NAME = "this model's chat template"


class ChatTemplateError(FitScopeError):
    """The model's chat template cannot render these messages; the message says why."""


class TemplateBudgetError(ChatTemplateError):
    """The template asked for more than its render budget allows."""


def _over(what: str) -> TemplateBudgetError:
    return TemplateBudgetError(f"{TEMPLATE_NAME} went over its render budget: {what}")


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the model's chat template refused the messages: {message}")


def messages_for(prompt: str, system: str | None = None) -> list[dict[str, str]]:
    """One user turn (after an optional system turn), as a suite prompt or a Run tab preset is asked."""
    out = [{"role": "system", "content": system}] if system else []
    return out + [{"role": "user", "content": prompt}]


# -- the budget ----------------------------------------------------------------------------------

_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?([#0 +\-]*)(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])?")


def _check_percent_format(fmt: str) -> None:
    """Refuse a ``%`` format whose width or precision exceeds MAX_FORMAT_WIDTH or comes from the
    arguments (``*``)."""
    for match in _PERCENT_SPEC.finditer(fmt):
        for number in (match.group(2), match.group(3)):
            if number == "*":
                raise _over("a '%' format takes its width from the arguments ('*')")
            if number and int(number) > MAX_FORMAT_WIDTH:
                raise _over(f"a '%' format asks for a field {int(number):,} characters wide")


def _check_brace_format(fmt: str, depth: int = 0) -> None:
    """Refuse a ``str.format`` specification wider than MAX_FORMAT_WIDTH or nested more than once."""
    try:
        parts = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # Python refuses it itself
    for _literal, _field, spec, _conversion in parts:
        if not spec:
            continue
        if "{" in spec:
            raise _over("a format specification takes its width from the arguments")
        for number in re.findall(r"\d+", spec):
            if int(number) > MAX_FORMAT_WIDTH:
                raise _over(f"a format asks for a field {int(number):,} characters wide")


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict) else 0


def _check_size(value: Any, what: str) -> Any:
    if _size(value) > MAX_VALUE_CHARS:
        raise _over(f"{what} built {_size(value):,} items, more than {MAX_VALUE_CHARS:,}")
    return value


_WIDTH_METHODS = {"ljust", "rjust", "center", "zfill"}


def _check_method_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse the calls of a text's own methods that would build a huge text from small arguments."""
    owner = getattr(func, "__self__", None)
    if not isinstance(owner, str):
        return
    name = getattr(func, "__name__", "")
    if name in _WIDTH_METHODS:
        width = args[0] if args else kwargs.get("width", 0)
        if isinstance(width, int) and width > MAX_FORMAT_WIDTH:
            raise _over(f"'{name}' pads to {width:,} characters")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int) and size * (owner.count("\t") + 1) + len(owner) > MAX_VALUE_CHARS:
            raise _over("'expandtabs' would build a huge text")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        old, new = args[0], args[1]
        count = owner.count(old) if old else len(owner) + 1
        if len(owner) + count * max(len(new) - len(old), 0) > MAX_VALUE_CHARS:
            raise _over("'replace' would build a huge text")


def _capped_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` with its result held to MAX_VALUE_CHARS, and the filters that take a width or a
    format checked before they run."""

    @functools.wraps(func)
    def capped(*args: Any, **kwargs: Any) -> Any:
        plain = [a for a in args if not hasattr(a, "environment") and not hasattr(a, "autoescape")]
        if name == "format" and plain and isinstance(plain[0], str):
            _check_percent_format(plain[0])
        elif name in ("center", "indent", "tojson"):
            for value in (*plain[1:], *kwargs.values()):
                if isinstance(value, int) and not isinstance(value, bool) and value > MAX_FORMAT_WIDTH:
                    raise _over(f"the '{name}' filter asks for {value:,} characters")
        return _check_size(func(*args, **kwargs), f"the '{name}' filter")

    return capped


def _capped_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    if n > MAX_LIPSUM_PARAGRAPHS or max > MAX_LIPSUM_WORDS or min > MAX_LIPSUM_WORDS:
        raise _over(f"lipsum asks for {n:,} paragraphs of up to {max:,} words")
    return str(generate_lorem_ipsum(n=n, html=html, min=min, max=max))


def _budget_concat(parts: Any) -> str:
    """``"".join`` of rendered parts (block ``set`` captures, macro bodies), held to the budget."""
    pieces: list[str] = []
    total = 0
    for part in parts:
        total += len(part)
        if total > MAX_VALUE_CHARS:
            raise _over(f"a captured block grows past {MAX_VALUE_CHARS:,} characters")
        pieces.append(part)
    return "".join(pieces)


def _budget_join(parts: Any) -> str:
    """The ``~`` operator: its operands as text, joined, held to the budget."""
    return _budget_concat(str(p) for p in parts)


class _BudgetCodeGenerator(CodeGenerator):
    """Jinja's compiler with ``~`` sent through the budget (it is plain ``"".join`` otherwise, and
    doubling a text in a loop would reach gigabytes in a few dozen steps)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # noqa: N802 - Jinja's visitor name
        self.write("environment.budget_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BudgetSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with a size budget on every operation that can build a large
    value from a small expression (see the module's docstring)."""

    intercepted_binops = frozenset({"*", "%", "+", "**"})
    code_generator_class = _BudgetCodeGenerator
    concat = staticmethod(_budget_concat)
    budget_join = staticmethod(_budget_join)

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True)
        self.globals["raise_exception"] = _raise
        self.globals["lipsum"] = _capped_lipsum
        self.filters = {name: _capped_filter(name, f) for name, f in self.filters.items()}

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            seq, times = (left, right) if isinstance(right, int) else (right, left)
            if _size(seq) and isinstance(times, int) and _size(seq) * times > MAX_VALUE_CHARS:
                raise _over(f"a repetition builds {_size(seq) * times:,} items")
        elif operator == "+" and _size(left) + _size(right) > MAX_VALUE_CHARS:
            raise _over(f"a concatenation builds {_size(left) + _size(right):,} items")
        elif operator == "%" and isinstance(left, str):
            _check_percent_format(left)
        elif (
            operator == "**"
            and isinstance(left, int)
            and isinstance(right, int)
            and abs(left) > 1
            and right * abs(left).bit_length() > 100_000
        ):
            raise _over(f"a power ({left} ** {right}) is too large")
        return _check_size(super().call_binop(context, operator, left, right), f"'{operator}'")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's signature
        _check_method_call(__obj, args, kwargs)
        return _check_size(super().call(__context, __obj, *args, **kwargs), "a call")

    def wrap_str_format(self, value: Any) -> Any:
        # A text's format/format_map method, fetched as an attribute: its specification is checked
        # before any call can build the field.
        wrapped = super().wrap_str_format(value)
        if wrapped is not None:
            _check_brace_format(value.__self__)
        return wrapped


# -- rendering -----------------------------------------------------------------------------------


def compile_template(template: str) -> Any:
    """The compiled template. Raises ChatTemplateError for one over MAX_TEMPLATE_CHARS, one Jinja
    refuses, or one nested too deeply to compile."""
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateBudgetError(
            f"{TEMPLATE_NAME} is {len(template):,} characters long, more than the {MAX_TEMPLATE_CHARS:,} "
            "FitScope renders (real templates are a few thousand)"
        )
    try:
        return BudgetSandbox().from_string(template)
    except (RecursionError, SyntaxError):  # Python refuses the code Jinja made ("too many levels of indentation")
        raise ChatTemplateError(f"{TEMPLATE_NAME} nests too deeply to compile") from None
    except MemoryError:
        raise TemplateBudgetError(f"{TEMPLATE_NAME} needed more memory than FitScope allows to compile") from None
    except (TemplateError, ValueError, TypeError, OverflowError) as exc:
        raise ChatTemplateError(f"{TEMPLATE_NAME} cannot be rendered: {exc}") from None


def render_compiled(
    compiled: Any,
    messages: Sequence[dict[str, str]],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """The text the model sees for ``messages`` through a template from :func:`compile_template`,
    streamed and cut off past MAX_RENDERED_CHARS. Raises ChatTemplateError (TemplateBudgetError
    when over budget) for a template that fails, refuses the messages or renders too much."""
    parts: list[str] = []
    total = 0
    try:
        for chunk in compiled.generate(
            messages=list(messages),
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        ):
            total += len(chunk)
            if total > MAX_RENDERED_CHARS:
                raise TemplateBudgetError(
                    f"{TEMPLATE_NAME} renders a prompt of more than {MAX_RENDERED_CHARS:,} characters"
                )
            parts.append(chunk)
    except ChatTemplateError:
        raise
    except RecursionError:
        raise ChatTemplateError(f"{TEMPLATE_NAME} recurses too deeply to render") from None
    except MemoryError:
        raise TemplateBudgetError(f"{TEMPLATE_NAME} needed more memory than FitScope allows") from None
    except (TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as exc:
        raise ChatTemplateError(f"{TEMPLATE_NAME} cannot be rendered: {exc}") from None
    text = "".join(parts)
    if bos_token and text.startswith(bos_token):
        text = text[len(bos_token) :]  # the tokenizer adds the BOS token itself
    return text


def render_chat(
    template: str,
    messages: Sequence[dict[str, str]],
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """The text the model sees for ``messages`` (in this process: the caller bounds time and
    memory as a whole, see :mod:`app.adapters.chat_render`). Raises ChatTemplateError for a
    template that fails, refuses the messages or goes over its budget."""
    return render_compiled(compile_template(template), messages, bos_token, eos_token, add_generation_prompt)
