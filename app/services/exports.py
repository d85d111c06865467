"""Exports of one evaluated :class:`~app.services.view.View`: JSON (the CLI's ``estimate --json``
keys plus the window's extras), CSV, a self-contained HTML page to email, and the llama-server /
llama-cpp-python launch commands that reproduce the estimated settings; and the rows and texts the
window's tables and model summary show (the comparison, the per-device breakdown, the model's facts).

Pure Python: the window calls these, but nothing here knows about Qt.
"""

from __future__ import annotations

import base64
import csv
import html
import io
from datetime import datetime
from typing import Any

from app.core.common.errors import EstimateError
from app.core.common.units import GIB
from app.core.memory.records import MAX_CONTEXT_TOKENS, Estimate
from app.core.model.tensors import CACHE_TYPES
from app.core.report.verdict import rate_range
from app.core.speed.predict import Range
from app.services.estimate import model_file
from app.services.tables import BREAKDOWN_HEADER, COMPARE_HEADER, breakdown_rows, compare_cells, comparison_rows
from app.services.view import View

_DOT_COLOURS = {"green": "#2e9d4a", "amber": "#e0a100", "red": "#d23c3c"}


# -- shared pieces -------------------------------------------------------------------------------


def _has_gpu(view: View) -> bool:
    return any(t.kind == "gpu" for t in view.targets)


def _require_estimate(view: View) -> Estimate:
    if view.estimate is None:
        reason = view.error or "there is no estimate"
        raise EstimateError(f"There is no launch command for these settings: {reason}")
    return view.estimate


def _model_path(view: View, model_path: str | None) -> str:
    """The GGUF to load: the caller's, else the model's own file, else a placeholder to edit."""
    return model_file(view.model, model_path)


def _ngl(view: View, est: Estimate) -> int:
    return est.gpu_layers if _has_gpu(view) else 0


# -- JSON ----------------------------------------------------------------------------------------


def report_json(view: View) -> dict[str, Any]:
    """The view as a JSON-serialisable dict.

    With an answer, the top-level keys are those of ``fitscope estimate --json``
    (:meth:`app.services.estimate.Answer.to_json`): memory figures in bytes (integers, never
    rounded), ``context_tokens`` as llama.cpp's total ``-c``, speeds in tokens/s and ``ttft_s`` in
    seconds as ``{"low", "high"}``. The window's extras follow: ``hardware``, ``controls``,
    ``verdict``, ``ladder``, ``comparison`` and ``error``. Without an answer (impossible settings)
    the estimate's keys are absent, ``fits`` is false and ``error`` says why.
    """
    model = view.model
    controls = view.request.controls
    out: dict[str, Any] = {
        "model": model.label if model is not None else None,
        "architecture": model.arch.arch if model is not None else None,
        "quant": model.quant if model is not None else None,
    }
    if view.answer is not None:
        out |= view.answer.to_json(_model_path(view, None))
    else:
        out |= {"fits": False, "assumptions": []}
    out |= {
        "context_per_user_tokens": controls.context_per_user_tokens,
        "users": controls.users,
        "hardware": view.hardware_label,
        "controls": controls.model_dump(),
        "verdict": {"level": view.verdict.level, "headline": view.verdict.headline, "text": view.verdict.text},
        "ladder": [
            {
                "preset": r.preset,
                "ppl_increase": r.ppl_increase,
                "budget_bytes": r.budget_bytes,
                "capacity_bytes": r.capacity_bytes,
                "fits": r.fits,
                "gpu_layers": r.gpu_layers,
                "decode_tokens_per_s": r.decode_tokens_per_s.as_dict(),
                "current": r.current,
            }
            for r in view.ladder
        ],
        "comparison": [
            {
                "label": r.label,
                "budget_bytes": r.budget_bytes,
                "capacity_bytes": r.capacity_bytes,
                "fits": r.fits,
                "gpu_layers": r.gpu_layers,
                "decode_tokens_per_s": r.decode_tokens_per_s.as_dict() if r.decode_tokens_per_s else None,
                "price_usd": r.price_usd,
                "error": r.error,
            }
            for r in view.comparison
        ],
        "error": view.error,
    }
    return out


# -- CSV -----------------------------------------------------------------------------------------

_DEVICE_HEADER = (
    "device",
    "kind",
    "weights_bytes",
    "repack_bytes",
    "kv_cache_bytes",
    "recurrent_state_bytes",
    "compute_bytes",
    "output_bytes",
    "overhead_bytes",
    "total_bytes",
    "capacity_bytes",
    "fits",
    "layers",
)
_LADDER_HEADER = (
    "preset",
    "ppl_increase",
    "memory_bytes",
    "capacity_bytes",
    "fits",
    "gpu_layers",
    "decode_tokens_per_s_low",
    "decode_tokens_per_s_high",
    "current",
)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def report_csv(view: View) -> str:
    """The per-device breakdown, a blank line, then the quantization ladder, as CSV text.

    Bytes are plain integers; ``memory_bytes`` is the limiting memory's use (the GPUs together,
    or host memory), decode speeds are tokens/s. Without an estimate the first section is its
    header alone.
    """
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(_DEVICE_HEADER)
    if view.estimate is not None:
        for d in view.estimate.devices:
            writer.writerow(
                (
                    d.name,
                    d.kind,
                    d.weights_bytes,
                    d.repack_bytes,
                    d.kv_cache_bytes,
                    d.recurrent_state_bytes,
                    d.compute_bytes,
                    d.output_bytes,
                    d.overhead_bytes,
                    d.total_bytes,
                    d.capacity_bytes,
                    _yes(d.fits),
                    d.layers,
                )
            )
    writer.writerow(())
    writer.writerow(_LADDER_HEADER)
    for r in view.ladder:
        speed = r.decode_tokens_per_s.as_dict()
        writer.writerow(
            (
                r.preset,
                "" if r.ppl_increase is None else r.ppl_increase,
                r.budget_bytes,
                r.capacity_bytes,
                _yes(r.fits),
                r.gpu_layers,
                speed["low"],
                speed["high"],
                _yes(r.current),
            )
        )
    return buf.getvalue()


# -- HTML ----------------------------------------------------------------------------------------

_CSS_TABLE = "border-collapse:collapse;margin:4px 0 16px 0;font-size:13px;"
_CSS_CELL = "border:1px solid #d0d0d0;padding:4px 8px;text-align:left;color:#1a1a1a;background:#ffffff;"
_CSS_HEAD = "border:1px solid #d0d0d0;padding:4px 8px;text-align:left;color:#1a1a1a;background:#f0f0f0;"
_CSS_H2 = "font-size:16px;margin:20px 0 6px 0;color:#1a1a1a;"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _gib2(n_bytes: int) -> str:
    return f"{n_bytes / GIB:,.2f}"


def _range(r: Range, digits: int = 1) -> str:
    return f"{r.low:,.{digits}f}–{r.high:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A table of already escaped cells (headers are escaped here)."""
    head = "".join(f'<th style="{_CSS_HEAD}">{_e(h)}</th>' for h in header)
    body = "".join("<tr>" + "".join(f'<td style="{_CSS_CELL}">{c}</td>' for c in row) + "</tr>" for row in rows)
    return f'<table style="{_CSS_TABLE}"><tr>{head}</tr>{body}</table>'


def _kv_table(rows: list[tuple[str, str]]) -> str:
    body = "".join(
        f'<tr><th style="{_CSS_HEAD}">{_e(k)}</th><td style="{_CSS_CELL}">{_e(v)}</td></tr>' for k, v in rows
    )
    return f'<table style="{_CSS_TABLE}">{body}</table>'


def _gpu_layers_text(view: View) -> str:
    est = view.estimate
    if est is None:
        return str(view.request.controls.gpu_layers)
    if not _has_gpu(view):
        return "0 (CPU only)"
    return f"{est.gpu_layers} of {est.n_layer + 1}"


def _settings_rows(view: View) -> list[tuple[str, str]]:
    c = view.request.controls
    est = view.estimate
    # Without an estimate, -c is what Controls.settings would have asked llama.cpp for.
    n_ctx = est.settings.context_tokens if est is not None else min(c.n_ctx_tokens, MAX_CONTEXT_TOKENS)
    k, v = (
        (est.settings.cache_type_k, est.settings.cache_type_v) if est is not None else (c.cache_type_k, c.cache_type_v)
    )
    flash = est.settings.flash_attn if est is not None else c.flash_attn
    return [
        ("Context per user (tokens)", f"{c.context_per_user_tokens:,}"),
        ("Users", str(c.users)),
        ("llama.cpp -c (tokens)", f"{n_ctx:,}"),
        ("K cache type", k),
        ("V cache type", v),
        ("Flash attention", "on" if flash else "off"),
        ("GPU layers", _gpu_layers_text(view)),
    ]


def _image_tags(images: dict[str, bytes]) -> str:
    parts = []
    for caption, data in images.items():
        encoded = base64.b64encode(data).decode("ascii")
        parts.append(
            '<figure style="margin:0 0 16px 0;">'
            f'<img src="data:image/png;base64,{encoded}" alt="{_e(caption)}" '
            'style="max-width:100%;height:auto;border:1px solid #d0d0d0;">'
            f'<figcaption style="font-size:12px;color:#555555;">{_e(caption)}</figcaption></figure>'
        )
    return "".join(parts)


def report_html(view: View, images: dict[str, bytes]) -> str:
    """A self-contained one-page HTML report (inline CSS, no scripts, no external resources).

    ``images`` maps a caption to PNG bytes; each is embedded as a data URI, in the dict's order.
    Memory figures are GiB (1024**3 bytes) with two decimals, speeds tokens/s, time to first
    token seconds. Every text taken from the view is HTML-escaped.
    """
    model = view.model
    est = view.estimate
    colour = _DOT_COLOURS.get(view.verdict.level, "#888888")
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        # Mail clients that recolour for dark mode leave a page alone that says it is light only.
        '<meta name="color-scheme" content="light"><meta name="supported-color-schemes" content="light">',
        "<title>FitScope report</title></head>",
        '<body style="margin:0;padding:16px;background:#ffffff;color:#1a1a1a;'
        'font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;font-size:14px;line-height:1.4;">',
        '<div style="max-width:820px;background:#ffffff;color:#1a1a1a;">',
        '<h1 style="font-size:22px;margin:0 0 8px 0;color:#1a1a1a;">FitScope report</h1>',
    ]
    model_text = f"{model.label} ({model.quant}, {model.arch.arch})" if model is not None else "(no model)"
    parts.append(
        f'<p style="margin:0 0 4px 0;"><b>Model:</b> {_e(model_text)}</p>'
        f'<p style="margin:0 0 12px 0;"><b>Hardware:</b> {_e(view.hardware_label)}</p>'
    )
    parts.append(
        '<div style="border:1px solid #d0d0d0;padding:10px 12px;margin:0 0 12px 0;background:#fafafa;">'
        f'<p style="margin:0 0 6px 0;font-size:16px;font-weight:bold;">'
        f'<span style="display:inline-block;width:12px;height:12px;border-radius:6px;background:{colour};'
        f'margin-right:8px;vertical-align:middle;"></span>{_e(view.verdict.headline)}</p>'
        + "".join(f'<p style="margin:0 0 4px 0;">{_e(s)}</p>' for s in view.verdict.sentences)
        + "</div>"
    )

    parts.append(f'<h2 style="{_CSS_H2}">Settings</h2>' + _kv_table(_settings_rows(view)))

    if est is not None:
        # The window's Details table, with whether each device's share fits.
        rows = [
            [_e(cell) for cell in row] + [_yes(d.fits)]
            for row, d in zip(breakdown_rows(view), est.devices, strict=True)
        ]
        header = [*BREAKDOWN_HEADER, "Fits"]
        parts.append(f'<h2 style="{_CSS_H2}">Memory per device (GiB)</h2>' + _table(header, rows))

    if view.speed is not None:
        speed_rows = [
            ("Decode", rate_range(view.speed.decode_tokens_per_s)),
            ("Prefill", rate_range(view.speed.prefill_tokens_per_s)),
            (f"Time to first token, {view.speed.prompt_tokens:,}-token prompt (s)", _range(view.speed.ttft_s, 2)),
        ]
        parts.append(f'<h2 style="{_CSS_H2}">Speed</h2>' + _kv_table(speed_rows))

    if view.ladder or view.ladder_note:
        rows = [
            [
                ("<b>" + _e(r.preset) + "</b> (current)") if r.current else _e(r.preset),
                "" if r.ppl_increase is None else _e(f"+{r.ppl_increase:g}"),
                _gib2(r.budget_bytes),
                _gib2(r.capacity_bytes),
                _yes(r.fits),
                _e(r.gpu_layers),
                _e(rate_range(r.decode_tokens_per_s)),
            ]
            for r in view.ladder
        ]
        header = ["Preset", "Perplexity increase", "Memory (GiB)", "Capacity (GiB)", "Fits", "GPU layers", "Speed"]
        parts.append(f'<h2 style="{_CSS_H2}">Quantization ladder</h2>')
        if view.ladder_note:
            parts.append(f'<p style="margin:0 0 6px 0;">{_e(view.ladder_note)}</p>')
        if rows:
            parts.append(_table(header, rows))

    if view.comparison:
        rows = [[_e(cell) for cell in compare_cells(r)] for r in comparison_rows(view)]
        parts.append(f'<h2 style="{_CSS_H2}">Comparison</h2>' + _table(COMPARE_HEADER, rows))

    if images:
        parts.append(f'<h2 style="{_CSS_H2}">Charts</h2>' + _image_tags(images))

    if view.assumptions:
        items = "".join(f"<li>{_e(a)}</li>" for a in view.assumptions)
        parts.append(f'<h2 style="{_CSS_H2}">Assumptions</h2><ul style="margin:0 0 16px 0;">{items}</ul>')

    stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z").strip()
    parts.append(f'<p style="font-size:12px;color:#555555;">Generated by FitScope at {_e(stamp)}.</p>')
    parts.append("</div></body></html>")
    return "\n".join(parts) + "\n"


# -- launch commands -----------------------------------------------------------------------------


def llama_server_command(view: View, model_path: str | None = None) -> str:
    """The llama-server command line with the settings behind the estimate (``-c`` is the total
    context in tokens, ``-np`` the users). ``model_path`` overrides the model's own GGUF; without
    either, ``MODEL.gguf`` stands in. Raises EstimateError when the view has no estimate.
    """
    _require_estimate(view)
    assert view.answer is not None
    return view.answer.command(_model_path(view, model_path))


def llama_cpp_python_snippet(view: View, model_path: str | None = None) -> str:
    """Python constructing ``llama_cpp.Llama`` with the estimate's settings (``n_ctx`` in tokens,
    cache types as ggml type numbers). Raises EstimateError when the view has no estimate.
    """
    est = _require_estimate(view)
    s = est.settings
    lines = [
        "from llama_cpp import Llama",
        "",
        "llm = Llama(",
        f"    model_path={_model_path(view, model_path)!r},",
        f"    n_ctx={s.context_tokens},",
        f"    n_batch={s.batch_tokens},",
        f"    n_ubatch={s.ubatch_tokens},",
        f"    n_gpu_layers={_ngl(view, est)},",
        f"    flash_attn={s.flash_attn},",
        f"    type_k={int(CACHE_TYPES[s.cache_type_k])},  # {s.cache_type_k}",
        f"    type_v={int(CACHE_TYPES[s.cache_type_v])},  # {s.cache_type_v}",
        f"    swa_full={s.swa_full},",
    ]
    if s.parallel_sequences > 1:
        # Llama() swallows unknown keywords, so say plainly that this one may do nothing.
        lines.append(
            f"    n_seq_max={s.parallel_sequences},  # one sequence per user; llama-cpp-python 0.3.36 ignores it"
        )
    lines.append(")")
    return "\n".join(lines) + "\n"


def copy_command_text(view: View, model_path: str | None = None) -> str:
    """What "Copy command" puts on the clipboard: the llama-server line, then the Python snippet,
    each under a ``#`` label. Raises EstimateError when the view has no estimate."""
    return (
        "# llama-server\n"
        + llama_server_command(view, model_path)
        + "\n\n# llama-cpp-python\n"
        + llama_cpp_python_snippet(view, model_path)
    )
