"""The verdict in plain words: whether it fits (green, amber, red), what takes the memory, how
fast, how many people can chat at once, and what to change when it does not fit. Pure text from
an estimate; ``app.services.view`` puts it in the view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.core.common.units import GIB
from app.core.memory.backends import BUILD_NAMES
from app.core.memory.records import Estimate
from app.core.model.catalog import find_device
from app.core.model.coverage import approximate_sentence
from app.core.report.choices import MAX_USERS, MIN_CONTEXT_TOKENS, Controls, HardwareChoice, Machine
from app.core.report.lengths import WORDS_PER_TOKEN
from app.core.speed.predict import Range, SpeedEstimate

AMBER_HEADROOM = 0.10  # under 10% of the memory left: it fits, but only just
# An architecture whose rules are not proven: "fits" needs a wider margin before it shows green
# (the unverified parts, KV cache and compute buffers, were off by up to 5x on hybrid models).
APPROXIMATE_HEADROOM = 0.25


@dataclass(frozen=True)
class Verdict:
    """The answer in plain words (``headline``, ``sentences``); ``technical`` says the same in
    llama.cpp's terms (flags, layer counts as llama.cpp numbers them) for the details and tooltips."""

    level: Literal["green", "amber", "red"]
    headline: str
    sentences: tuple[str, ...]
    technical: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return " ".join((self.headline, *self.sentences))

    def adding(self, *sentences: str, technical: tuple[str, ...] = ()) -> Verdict:
        """This verdict with ``sentences`` (the empty ones left out) and ``technical`` added."""
        return Verdict(
            self.level,
            self.headline,
            (*self.sentences, *(s for s in sentences if s)),
            (*self.technical, *technical),
        )


@dataclass(frozen=True)
class Budget:
    """The memory that limits: the GPUs together when layers are on them, else host memory."""

    label: str
    used_bytes: int
    capacity_bytes: int
    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int
    overhead_bytes: int
    projector_bytes: int = 0
    speculative_bytes: int = 0

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


# -- plain words ---------------------------------------------------------------------------------


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GIB:,.1f} GiB"


def budget_of(est: Estimate) -> Budget:
    gpus = [d for d in est.devices if d.kind == "gpu" and (d.layers or d.weights_bytes)]
    chosen = gpus or [d for d in est.devices if d.kind == "cpu"]
    label = chosen[0].name if len(chosen) == 1 else f"{len(chosen)} GPUs together"

    def total(*names: str) -> int:
        return sum(getattr(d, n) for d in chosen for n in names)

    return Budget(
        label=label,
        used_bytes=total("total_bytes"),
        capacity_bytes=total("capacity_bytes"),
        weights_bytes=total("weights_bytes", "repack_bytes"),
        kv_cache_bytes=total("kv_cache_bytes", "recurrent_state_bytes"),
        compute_bytes=total("compute_bytes", "output_bytes"),
        overhead_bytes=total("overhead_bytes"),
        projector_bytes=total("projector_bytes"),
        speculative_bytes=total("speculative_bytes"),
    )


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


SLOWEST_SHOWN = 0.01  # per second: anything slower is said as "under 0.01"


def rate(x: float) -> str:
    """A speed for a sentence: whole numbers from 10 up, one decimal below 10, two below 1, and
    "under 0.01" below that (never a "0")."""
    if x < SLOWEST_SHOWN:
        return f"under {SLOWEST_SHOWN:g}"
    return f"{x:,.0f}" if x >= 10 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"


def _range_text(low: float, high: float, unit: str) -> str:
    if high <= 0:
        return "no speed figure"
    lo, hi = rate(low), rate(high)
    if high < SLOWEST_SHOWN or lo == hi:
        return f"{hi} {unit}"
    if low < SLOWEST_SHOWN:
        return f"up to {hi} {unit}"
    return f"{lo}-{hi} {unit}"


def rate_range(r: Range) -> str:
    """A speed range for a sentence, the same way everywhere: "8.2-12 tokens/s" (never "0-0": a
    speed that rounds to nothing is "under 0.01 tokens/s", a range whose ends round alike one figure)."""
    return _range_text(r.low, r.high, "tokens/s")


def words_range(r: Range) -> str:
    """The same speed in words a second (English prose, :data:`WORDS_PER_TOKEN` words a token)."""
    return _range_text(r.low * WORDS_PER_TOKEN, r.high * WORDS_PER_TOKEN, "words a second")


def _speed_words(decode: Range) -> str:
    if decode.high <= 0:
        return ""
    if decode.high < 1:
        return f"Expect under one word a second ({rate_range(decode)}): too slow for a conversation."
    return f"Expect about {words_range(decode)} ({rate_range(decode)})."


def _local_note(machine: Machine, backend: str) -> str:
    """This machine's GPUs whose usable memory is not their size: an Apple GPU's wired limit (and how
    to raise it), an APU that llama.cpp's builds see differently (and which one the estimate used)."""
    sentences = []
    for gpu in machine.gpus:
        if gpu.vendor == "apple":
            sentences.append(gpu.memory_note)
            continue
        if len({b.total_bytes for b in gpu.builds}) < 2:
            continue
        chosen = gpu.memory_for(backend)
        others = ", ".join(
            f"its {BUILD_NAMES.get(b.backend, b.backend)} build {gib(b.total_bytes)}"
            for b in gpu.builds
            if b.backend != chosen.backend
        )
        build = BUILD_NAMES.get(chosen.backend, chosen.backend)
        sentences.append(
            f"On the {gpu.name}, this estimate counts what llama.cpp's {build} build sees, "
            f"{gib(chosen.total_bytes)} ({gib(chosen.free_bytes)} free); {others} (choose the build under Advanced)."
        )
    return " ".join(s for s in sentences if s)


def hardware_note(choice: HardwareChoice, machine: Machine | None = None, backend: str = "auto") -> str:
    """What a number on screen means for this hardware when it differs from the box's label."""
    if choice.kind == "local" and machine is not None:
        return _local_note(machine, backend)
    if choice.kind != "catalog" or not choice.device_id:
        return ""
    device = find_device(choice.device_id)
    if device.memory_kind != "unified" or device.gpu_usable_fraction >= 1:
        return ""
    usable = device.memory_gib * device.gpu_usable_fraction
    if device.vendor == "apple":
        return (
            f"macOS lets the GPU use {usable:,.0f} of the {device.memory_gib:,.0f} GiB by default; it can be raised "
            f"(sudo sysctl iogpu.wired_limit_mb=N), leaving less for the system."
        )
    return (
        f"Of the {device.memory_gib:,.0f} GiB of shared memory, about {usable:,.0f} GiB can be given to the GPU; "
        "the rest stays with the system."
    )


def people_sentence(users: int, controls: Controls, scope: str = "any", placement: str = "gpu") -> str:
    """How many conversations fit at once, each with the chosen context. ``scope`` is the rule that
    counted them (app.services.estimate): "gpu" counts only users that keep everything on the GPUs;
    ``placement`` is where the chosen number of users runs."""
    each = (
        f"{controls.context_per_user_tokens:,} tokens (about "
        f"{controls.context_per_user_tokens * WORDS_PER_TOKEN:,.0f} words) each"
    )
    many = users >= MAX_USERS
    count = f"at least {MAX_USERS} people" if many else "one person" if users == 1 else f"up to {users} people"
    cap = f" (FitScope counts up to {MAX_USERS})" if many else ""
    if scope == "gpu" and placement == "partial":
        return (
            f"Everything stays on the GPU for {count} at once with {each}{cap}; with {controls.users}, part of "
            "the model moves to system memory, which is slower."
        )
    if placement == "partial":
        return f"Memory holds {count} at once with {each}, part of the model in system memory{cap}."
    where = ", all on the GPU" if scope == "gpu" else ""
    if users == 1:
        return f"One person at a time can chat with {each}{where}."
    return f"{count[0].upper()}{count[1:]} can chat at once with {each}{where}{cap}."


def trained_length_warning(controls: Controls, n_ctx_train: int) -> str:
    """The sentence when each user's context is beyond what the model was trained on ("" if not)."""
    if not n_ctx_train or controls.context_per_user_tokens <= n_ctx_train:
        return ""
    who = "each person's conversation" if controls.users > 1 else "the conversation"
    return (
        f"At {controls.context_per_user_tokens:,} tokens, {who} is longer than the {n_ctx_train:,} tokens the "
        "model was trained on: answers degrade there unless the model supports context extension."
    )


def layers_words(gpu_layers: int, n_layer: int, where: str) -> str:
    """Where the layers are, counted as a model card counts them (the output layer said apart):
    llama.cpp's ``gpu_layers`` counts the output layer as one more, after the ``n_layer`` layers."""
    if gpu_layers > n_layer:
        return f"all {n_layer} layers and the output layer are on the {where}"
    rest = n_layer - gpu_layers
    return (
        f"{gpu_layers} of the model's {n_layer} layers are on the {where}; the other {rest} and the output layer "
        "run on the processor, which is slower"
    )


def make_verdict(
    est: Estimate,
    speed: SpeedEstimate,
    controls: Controls,
    max_context: int,
    smaller_quant: str | None,
    n_ctx_train: int = 0,
    gpus_hidden: bool = False,
) -> Verdict:
    """The answer in plain words, with a light: green (fits with room), amber (fits with under 10%
    to spare, or only partly on the GPU, or under 25% to spare on an architecture whose rules are
    approximate), red (does not fit). An approximate estimate says so first; a context beyond the
    trained length says so whatever the number of users and whether it fits."""
    verdict = _verdict(est, speed, controls, max_context, smaller_quant, gpus_hidden)
    verdict = verdict.adding(trained_length_warning(controls, n_ctx_train))
    if est.repack_bytes >= 0.1 * GIB:
        verdict = verdict.adding(
            f"On a processor, llama.cpp also keeps a rearranged copy of {gib(est.repack_bytes)} of the weights for "
            "faster arithmetic, so the same model needs more memory here than on a graphics card."
        )
    if not est.approximate:
        return verdict
    caveat = approximate_sentence(est.architecture or "unknown")
    if est.rules == "unknown":
        caveat = (
            f"The llama.cpp FitScope ships cannot load this architecture ({est.architecture}); the figures below "
            "come from generic rules. " + caveat
        )
    level = verdict.level
    if level == "green" and budget_of(est).free_bytes < APPROXIMATE_HEADROOM * budget_of(est).capacity_bytes:
        level = "amber"
    return Verdict(level, verdict.headline, (caveat, *verdict.sentences), verdict.technical)


def _verdict(
    est: Estimate,
    speed: SpeedEstimate,
    controls: Controls,
    max_context: int,
    smaller_quant: str | None,
    gpus_hidden: bool,
) -> Verdict:
    budget = budget_of(est)
    convo = (
        f"remembering the conversation ({controls.context_per_user_tokens:,} tokens)"
        if controls.users == 1
        else f"remembering {controls.users} conversations of {controls.context_per_user_tokens:,} tokens each"
    )
    shares = (
        f"The model itself takes {_percent(budget.weights_bytes, budget.capacity_bytes)} of the memory; "
        f"{convo} takes {_percent(budget.kv_cache_bytes, budget.capacity_bytes)}."
    )
    if not est.fits:
        over = [d for d in est.devices if not d.fits]
        worst = max(over, key=lambda d: -d.free_bytes)
        headline = (
            f"Does not fit: {worst.name} needs {gib(worst.total_bytes)} but has {gib(worst.capacity_bytes)} "
            f"({gib(-worst.free_bytes)} short)."
        )
        shares = f"The model itself needs {gib(budget.weights_bytes)}; {convo} needs {gib(budget.kv_cache_bytes)}."
        advice = []
        if max_context >= MIN_CONTEXT_TOKENS and max_context < controls.context_per_user_tokens:
            advice.append(f"The largest context that fits is {max_context:,} tokens per user.")
        if smaller_quant:
            advice.append(smaller_quant)
        if not advice:
            advice.append("Choose a smaller model, or hardware with more memory.")
        return Verdict("red", headline, (shares, *advice))
    gpu_devices = [d for d in est.devices if d.kind == "gpu"]
    partial = gpu_devices and (est.gpu_layers < est.n_layer + 1 or est.cpu_moe_layers > 0)
    speed_text = _speed_words(speed.decode_tokens_per_s)
    if speed_text:
        who = "for each person" if controls.users > 1 else "for one person"
        total = speed.decode_total_tokens_per_s
        speed_text = speed_text[:-1] + (
            f" {who}, {speed.depth_tokens:,} tokens into the conversation"
            + (f"; {words_range(total)} for everyone together" if controls.users > 1 else "")
            + "."
        )
    if gpus_hidden:
        headline = (
            "Runs on the processor only: the graphics card has too little free memory even for the working "
            "buffers llama.cpp keeps on it."
        )
        hidden = ("The graphics card is hidden from llama.cpp (llama-server --device none).",)
        return Verdict("amber", headline, tuple(s for s in (shares, speed_text) if s), hidden)
    if partial:
        gpus = "graphics cards" if len(gpu_devices) > 1 else "graphics card"
        opening = f"Runs partly in system memory, at about {words_range(speed.decode_tokens_per_s)}"
        technical = (f"llama-server -ngl {est.gpu_layers}",)
        if est.gpu_layers >= est.n_layer + 1:
            experts = (
                "its experts"
                if est.cpu_moe_layers >= est.n_layer
                else f"the experts of {est.cpu_moe_layers} of its {est.n_layer} layers"
            )
            headline = f"{opening}: the whole model is on the {gpus} except {experts}, which stay in system memory."
            technical = (f"llama-server -ngl {est.gpu_layers} --n-cpu-moe {est.cpu_moe_layers}",)
        elif controls.gpu_layers == "auto":
            headline = f"{opening}: {layers_words(est.gpu_layers, est.n_layer, gpus)}."
            margin = controls.fit_margin_mib / 1024
            technical = (
                f"Placed as llama.cpp's --fit places it, keeping {margin:g} GiB free per GPU: -ngl {est.gpu_layers} "
                f"(llama.cpp counts the output layer as layer {est.n_layer + 1}).",
            )
        else:
            headline = f"{opening}: as chosen, {layers_words(est.gpu_layers, est.n_layer, gpus)}."
        return Verdict("amber", headline, tuple(s for s in (shares, speed_text) if s), technical)
    level: Literal["green", "amber"] = "green"
    headline = f"Fits, with {gib(budget.free_bytes)} to spare."
    if budget.free_bytes < AMBER_HEADROOM * budget.capacity_bytes:
        level = "amber"
        share = _percent(budget.free_bytes, budget.capacity_bytes)
        headline = f"Fits, but only just: {gib(budget.free_bytes)} to spare ({share})."
    return Verdict(level, headline, tuple(s for s in (shares, speed_text) if s))
