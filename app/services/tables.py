"""The rows and texts of the window's tables, also used by the HTML export: the comparison of
machines, the per-device memory breakdown, and the model's facts under its list. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.core.common.units import GIB
from app.core.model.benchmarks import answer_quality_sentence
from app.core.model.coverage import APPROXIMATE_NOTE, coverage
from app.core.report.verdict import words_range
from app.services.room import catalog_id
from app.services.view import CompareRow, View

COMPARE_HEADER = ["Hardware", "Memory needed", "Memory it has", "Fits", "Words a second", "Price"]
COMPARE_NOTE = (
    "Memory needed differs between machines for the same job: a graphics card keeps llama.cpp's working buffers "
    "beside the model, a processor keeps a rearranged copy of the weights, and a machine that runs the model partly "
    "in system memory counts only what its graphics cards hold. Prices are whole computers: a graphics card's "
    "catalog price plus an assumed computer around it (hover over a price for what it is made of)."
)


def comparison_rows(view: View) -> list[CompareRow]:
    """The comparison as the window and the report show it: the current hardware first."""
    return ([view.current] if view.current is not None else []) + list(view.comparison)


def compare_cells(r: CompareRow) -> list[str]:
    """One comparison row in words (``COMPARE_HEADER``'s columns). A row that failed has only its
    label and the reason; hardware that cannot hold the model gets no speed (nothing would run)."""
    if r.error:
        return [r.label, "-", "-", r.error, "-", "-"]
    fit_text = "yes" if r.fits else "no"
    if fit_detail(r):
        fit_text = "partly"
    decode = r.decode_tokens_per_s
    return [
        r.label,
        f"{r.budget_bytes / GIB:.1f} GiB",
        f"{r.capacity_bytes / GIB:.1f} GiB",
        fit_text,
        words_range(decode).removesuffix(" words a second") if decode and r.fits else "-",
        f"${r.price_usd:,.0f} {r.price_kind}".rstrip() if r.price_usd else "not listed",
    ]


def fit_detail(r: CompareRow) -> str:
    """What "partly" means for a row (its cell's tooltip): the layers on the GPU, as a model card
    counts them; "" when the whole model is on the GPUs (or it does not fit)."""
    if not (r.fits and r.gpu_layers is not None and r.gpu_layers < r.n_layer + 1):
        return ""
    on_gpu = min(r.gpu_layers, r.n_layer)
    return (
        f"{on_gpu} of the model's {r.n_layer} layers on the GPU; the other {r.n_layer - on_gpu} and the output "
        "layer in system memory, which is slower"
    )


BREAKDOWN_HEADER = [
    "Device",
    "Weights",
    "KV cache",
    "Compute",
    "Output",
    "Overhead",
    "Vision projector",
    "Draft / MTP",
    "Total",
    "Capacity",
]


def breakdown_rows(view: View) -> list[list[str]]:
    """The per-device table under the window's Details (``BREAKDOWN_HEADER``'s columns), in GiB
    with two decimals. Weights include the CPU's rearranged copy, the KV cache any recurrent state.
    Empty without an estimate."""
    if view.estimate is None:
        return []
    return [
        [d.name]
        + [
            f"{v / GIB:,.2f}"
            for v in (
                d.weights_bytes + d.repack_bytes,
                d.kv_cache_bytes + d.recurrent_state_bytes,
                d.compute_bytes,
                d.output_bytes,
                d.overhead_bytes,
                d.projector_bytes,
                d.speculative_bytes,
                d.total_bytes,
                d.capacity_bytes,
            )
        ]
        for d in view.estimate.devices
    ]


@dataclass(frozen=True)
class ModelSummary:
    """What the window says about the model under its list: ``name`` (shown bold), ``kind``
    ("architecture, quantization") and one plain sentence per line."""

    name: str
    kind: str
    lines: tuple[str, ...]


def model_summary(view: View, demo_name: str, demo_license: str) -> ModelSummary | None:
    """The model's facts: parameters, layers, KV heads, trained context, whether its architecture's
    memory rules are proven, its file, and the ladder's note. The built-in demo model is called
    ``demo_name`` and its ``demo_license`` is quoted. None when the view has no model."""
    m = view.model
    if m is None:
        return None
    arch = m.arch
    kv = arch.n_head_kv if isinstance(arch.n_head_kv, int) else f"{min(arch.n_head_kv)}-{max(arch.n_head_kv)}"
    params = f"{arch.params_billions:g} billion parameters" if arch.params_billions else "parameters unknown"
    is_demo = view.request.model.kind == "demo"
    lines = [f"{params}; {arch.n_layer} layers; {kv} KV heads; trained context {arch.n_ctx_train:,} tokens"]
    model_id = catalog_id(view.request.model)
    if is_demo:
        lines.append("A tiny model for measuring speed: its answers say nothing about what a real model can do.")
    elif model_id is not None:
        lines.append(answer_quality_sentence(model_id, "this model").replace("Answer quality of this model", "Answers"))
    rules = coverage(arch.arch)
    if rules.status != "exact":
        lines.append(f"Memory rules for {arch.arch}: {APPROXIMATE_NOTE} ({rules.detail}).")
    if m.path is not None:
        lines.append(f"File: {m.path.name} (in {m.path.parent})")
    if is_demo:
        lines.append(f"Built-in demo model. License: {demo_license}")
    if view.ladder_note:
        lines.append(view.ladder_note)
    return ModelSummary(name=demo_name if is_demo else m.label, kind=f"{arch.arch}, {m.quant}", lines=tuple(lines))
