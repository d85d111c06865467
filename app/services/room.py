"""The answer said to a room: one headline naming the model, the machine and the people, then yes
or no and how fast ("Qwen3 32B on an RTX 5090 PC for 12 people: yes — about 28-47 words a second
each"), and the sentences that warn a buyer before the figures: a model far too small for an
assistant several people share, a speed below what each person needs.

Pure text from what the estimate service answered (:class:`app.services.estimate.Answer`); the
window's evaluator (``app.services.view``) puts it in the view. Machines are named as a buyer says
them (:func:`app.core.advisor.configs.machine_name`), speeds in words a second first.
"""

from __future__ import annotations

from app.core.advisor.configs import machine_name
from app.core.common.errors import FitScopeError
from app.core.model.benchmarks import size_warning
from app.core.model.catalog import find_device
from app.core.report.choices import DEMO_CATALOG_ID, HardwareChoice, Machine, ModelChoice
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.report.machine_text import with_article
from app.core.report.verdict import gib, rate, words_range
from app.services.estimate import Answer


def catalog_id(choice: ModelChoice) -> str | None:
    """The catalog model a choice is (the demo file is the catalog's Gemma 3 270M); None for a
    file, a config.json or a model on a server, whose catalog entry is not known."""
    if choice.kind == "catalog":
        return choice.ref
    if choice.kind == "demo":
        return DEMO_CATALOG_ID
    return None


def hardware_words(choice: HardwareChoice, machine: Machine | None = None) -> str:
    """Where it runs, as said in a sentence: "this computer", "an RTX 5090 PC", "a 2x RTX 3090 PC"."""
    if choice.kind == "local":
        return "this computer" if machine is None or machine.gpus else "this computer's processor"
    if choice.kind == "cpu":
        return "this computer's processor"
    return with_article(machine_label(choice, machine))


def machine_label(choice: HardwareChoice, machine: Machine | None = None) -> str:
    """A machine as a comparison lists it: this machine by its GPUs, a catalog one as a buyer says
    it ("RTX 5090 PC", "2x RTX 3090 PC", "M4 Max computer with 128 GiB"), so that the prices beside
    them are for the same thing, a whole computer."""
    if choice.kind != "catalog":
        return choice.label(machine)
    try:
        device = find_device(choice.device_id or "")
    except FitScopeError:
        return choice.label(machine)
    return machine_name(device, choice.count)


def people_words(users: int) -> str:
    return "one person" if users == 1 else f"{users} people"


def room_headline(
    model_name: str,
    where: str,
    users: int,
    found: Answer | None,
    level: str,
    min_tokens_per_s: float | None = None,
) -> str:
    """The headline for a room (see the module docstring). ``level`` is the verdict's light;
    ``min_tokens_per_s`` the speed each person needs (None: not asked)."""
    opening = f"{model_name} on {where} for {people_words(users)}"
    if found is None:
        return f"{opening}: not possible with these settings"
    b = found.budget
    if not found.fits:
        return f"{opening}: no — it needs {gib(b.used_bytes)}, the machine has {gib(b.capacity_bytes)}"
    speed = f"about {words_range(found.speed.decode_tokens_per_s)} each"
    slow = min_tokens_per_s is not None and found.speed.decode_typical < min_tokens_per_s
    if slow:
        assert min_tokens_per_s is not None
        need = rate(min_tokens_per_s * WORDS_PER_TOKEN)
        return f"{opening}: it fits, but slower than the {need} words a second asked for — {speed}"
    if found.gpus_hidden:
        return f"{opening}: only on the processor — {speed}"
    if found.placement == "partial":
        return f"{opening}: partly — {speed}, part of it in slower system memory"
    return f"{opening}: {'yes' if level == 'green' else 'yes, just'} — {speed}"


def buyer_warnings(
    choice: ModelChoice,
    model_name: str,
    params_billions: float | None,
    users: int,
    found: Answer | None,
    min_tokens_per_s: float | None = None,
) -> tuple[str, ...]:
    """What a buyer must hear before the figures: a model far too small for several people, a
    speed below what each person needs."""
    out = []
    if choice.kind == "demo":
        out.append(f"{model_name} is the built-in demo: a tiny model for measuring speed, not for answering questions.")
    else:
        out.append(size_warning(catalog_id(choice), model_name, params_billions, users))
    if found is not None and found.fits and min_tokens_per_s is not None:
        typical = found.speed.decode_typical
        if typical < min_tokens_per_s:
            out.append(
                f"That is slower than the {rate(min_tokens_per_s * WORDS_PER_TOKEN)} words a second each person "
                f"needs (about {rate(typical * WORDS_PER_TOKEN)} expected)."
            )
    return tuple(s for s in out if s)
