"""Exports and launch commands of an evaluated view, built with the real evaluator (no mocks)."""

from __future__ import annotations

import ast
import base64
import csv
import dataclasses
import io
import json
import shlex
from pathlib import Path

import pytest

from app.core.common.errors import EstimateError
from app.core.common.units import GIB
from app.core.model.tensors import CACHE_TYPES, GGMLType
from app.core.report.choices import Controls, HardwareChoice, Machine, ModelChoice
from app.services.estimate import answer
from app.services.exports import (
    copy_command_text,
    llama_cpp_python_snippet,
    llama_server_command,
    report_csv,
    report_html,
    report_json,
)
from app.services.view import Evaluator, Request, View

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


@pytest.fixture(scope="module")
def evaluator() -> Evaluator:
    return Evaluator()


def _view(
    evaluator: Evaluator,
    ref: str = "llama-3.1-8b",
    controls: Controls | None = None,
    hardware: HardwareChoice | None = None,
    compare: tuple[HardwareChoice, ...] = (),
) -> View:
    request = Request(
        ModelChoice(kind="catalog", ref=ref, quant="Q4_K_M"),
        hardware or HardwareChoice(kind="catalog", device_id="rtx-4090"),
        controls or Controls(),
        Machine(),
        compare=compare,
    )
    return evaluator.evaluate(request)


@pytest.fixture(scope="module")
def fits_view(evaluator: Evaluator) -> View:
    return _view(
        evaluator,
        controls=Controls(context_per_user_tokens=8192),
        compare=(HardwareChoice(kind="catalog", device_id="rtx-3090", count=2),),
    )


@pytest.fixture(scope="module")
def too_big_view(evaluator: Evaluator) -> View:
    return _view(evaluator, ref="llama-3.1-70b", controls=Controls(gpu_layers=81))


@pytest.fixture(scope="module")
def impossible_view(evaluator: Evaluator) -> View:
    return _view(evaluator, controls=Controls(flash_attn=False, cache_type_v="q8_0"))


@pytest.fixture(scope="module")
def four_users_view(evaluator: Evaluator) -> View:
    return _view(evaluator, controls=Controls(context_per_user_tokens=4096, users=4))


def _keywords(snippet: str) -> dict[str, object]:
    """The keyword arguments of the snippet's Llama(...) call, as Python values."""
    call = next(n for n in ast.walk(ast.parse(snippet)) if isinstance(n, ast.Call))
    assert isinstance(call.func, ast.Name) and call.func.id == "Llama"
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}


def _csv_sections(text: str) -> tuple[list[list[str]], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(text)))
    blank = rows.index([])
    return rows[:blank], rows[blank + 1 :]


# -- JSON ----------------------------------------------------------------------------------------


def test_json_kv_cache_of_llama_8b_at_8192_tokens_is_one_gib(fits_view: View) -> None:
    data = report_json(fits_view)
    # 32 layers x 8 KV heads x 128 dims x 2 bytes (f16) x 2 (K and V) x 8192 cells.
    assert data["kv_cache_bytes"] == 1073741824
    assert data["context_tokens"] == 8192
    assert data["context_per_user_tokens"] == 8192
    assert data["users"] == 1


def test_json_figures_are_the_estimate_and_survive_json_dumps(fits_view: View) -> None:
    est = fits_view.estimate
    assert est is not None
    data = json.loads(json.dumps(report_json(fits_view)))
    assert data["total_bytes"] == est.total_bytes
    assert data["model_bytes"] == est.model_bytes
    assert [d["total_bytes"] for d in data["devices"]] == [d.total_bytes for d in est.devices]
    assert [d["name"] for d in data["devices"]] == [
        "NVIDIA GeForce RTX 4090",
        "Host RAM (DDR5-5600, 2 channels (desktop))",
    ]
    assert data["fits"] is True
    assert data["gpu_layers"] == 33
    assert data["largest_context_per_user_tokens"] == fits_view.largest_context_per_user_tokens > 8192
    assert data["users_that_fit"] == fits_view.users_that_fit >= 1
    assert data["hardware"] == "NVIDIA GeForce RTX 4090"
    assert data["controls"]["context_per_user_tokens"] == 8192
    assert data["verdict"]["level"] == "green"
    assert data["verdict"]["text"].startswith("Fits, with")
    assert data["error"] == ""
    assert data["settings"]["cache_type_k"] == "f16"
    assert data["decode_tokens_per_s"]["high"] >= data["decode_tokens_per_s"]["low"] > 0


def test_json_keys_and_bytes_match_the_cli(fits_view: View) -> None:
    est = fits_view.estimate
    assert est is not None and fits_view.model is not None
    cli = answer(fits_view.model, list(fits_view.targets), fits_view.request.controls, repack=est.settings.repack)
    data = report_json(fits_view)
    assert set(cli.to_json()) <= set(data)
    for key in ("weights_bytes", "kv_cache_bytes", "compute_bytes", "total_bytes", "devices", "kv_caches"):
        assert data[key] == cli.to_json()[key], key
    assert data["largest_context_per_user_tokens"] == cli.to_json()["largest_context_per_user_tokens"] == 131072


def test_json_ladder_and_comparison(fits_view: View) -> None:
    data = json.loads(json.dumps(report_json(fits_view)))
    assert len(data["ladder"]) == len(fits_view.ladder) > 5
    current = [r for r in data["ladder"] if r["current"]]
    assert [r["preset"] for r in current] == ["Q4_K_M"]
    assert current[0]["budget_bytes"] == fits_view.estimate.devices[0].total_bytes
    assert set(current[0]["decode_tokens_per_s"]) == {"low", "high"}
    (row,) = data["comparison"]
    assert row["label"] == "2x RTX 3090 PC"  # a machine as a buyer says it, priced whole
    assert row["capacity_bytes"] == fits_view.comparison[0].capacity_bytes
    assert fits_view.current is not None and fits_view.current.label == "RTX 4090 PC (current)"
    assert fits_view.current.decode_tokens_per_s.as_dict() == data["decode_tokens_per_s"]
    assert row["fits"] is True and row["error"] == ""
    assert row["decode_tokens_per_s"]["low"] > 0


def test_json_of_a_model_that_does_not_fit(too_big_view: View) -> None:
    data = report_json(too_big_view)
    assert data["fits"] is False
    assert data["gpu_layers"] == 81
    assert data["verdict"]["level"] == "red"
    gpu = data["devices"][0]
    assert gpu["kind"] == "gpu" and gpu["fits"] is False and gpu["free_bytes"] < 0
    json.dumps(data)


def test_json_of_impossible_settings(impossible_view: View) -> None:
    assert impossible_view.estimate is None and impossible_view.error
    data = json.loads(json.dumps(report_json(impossible_view)))
    assert data["fits"] is False
    assert data["error"] == impossible_view.error
    assert "flash attention" in data["error"]
    assert data["verdict"]["level"] == "red"
    assert data["model"] == "Llama 3.1 8B"
    assert data["controls"]["cache_type_v"] == "q8_0"
    assert data["ladder"] == [] and data["comparison"] == []
    assert "total_bytes" not in data and "devices" not in data


# -- CSV -----------------------------------------------------------------------------------------


def test_csv_parses_back_to_the_estimate(fits_view: View) -> None:
    est = fits_view.estimate
    assert est is not None
    text = report_csv(fits_view)
    assert "\r" not in text
    devices, ladder = _csv_sections(text)
    header, *rows = devices
    assert header[0] == "device" and header[-4:] == ["total_bytes", "capacity_bytes", "fits", "layers"]
    by_col = [dict(zip(header, r, strict=True)) for r in rows]
    assert [int(r["total_bytes"]) for r in by_col] == [d.total_bytes for d in est.devices]
    assert int(by_col[0]["kv_cache_bytes"]) == 1073741824
    assert [r["fits"] for r in by_col] == ["yes", "yes"]
    assert by_col[0]["layers"] == "32"

    ladder_header, *ladder_rows = ladder
    assert ladder_header[:3] == ["preset", "ppl_increase", "memory_bytes"]
    assert len(ladder_rows) == len(fits_view.ladder)
    lad = [dict(zip(ladder_header, r, strict=True)) for r in ladder_rows]
    assert [r["preset"] for r in lad if r["current"] == "yes"] == ["Q4_K_M"]
    assert all(r["ppl_increase"] == "" for r in lad if r["preset"] == "IQ2_XS")
    assert [int(r["memory_bytes"]) for r in lad] == [r.budget_bytes for r in fits_view.ladder]
    assert all(float(r["decode_tokens_per_s_low"]) <= float(r["decode_tokens_per_s_high"]) for r in lad)


def test_csv_of_a_model_that_does_not_fit_says_no(too_big_view: View) -> None:
    devices, _ = _csv_sections(report_csv(too_big_view))
    header, gpu, _host = devices
    assert dict(zip(header, gpu, strict=True))["fits"] == "no"


def test_csv_of_impossible_settings_has_headers_only(impossible_view: View) -> None:
    devices, ladder = _csv_sections(report_csv(impossible_view))
    assert len(devices) == 1 and devices[0][0] == "device"
    assert len(ladder) == 1 and ladder[0][0] == "preset"


# -- HTML ----------------------------------------------------------------------------------------


def test_html_escapes_the_view_and_embeds_images(fits_view: View) -> None:
    assert fits_view.model is not None
    hostile = dataclasses.replace(fits_view, model=dataclasses.replace(fits_view.model, label="<script>x</script>"))
    page = report_html(hostile, {"Memory <chart>": PNG, "Users": b"second"})
    assert "<script" not in page.lower()
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    assert "Memory &lt;chart&gt;" in page and "<chart>" not in page
    first = f'src="data:image/png;base64,{base64.b64encode(PNG).decode()}"'
    second = f'src="data:image/png;base64,{base64.b64encode(b"second").decode()}"'
    assert first in page and second in page
    assert page.index(first) < page.index(second)
    assert "http://" not in page and "https://" not in page


def test_html_shows_the_verdict_settings_and_breakdown(fits_view: View) -> None:
    est = fits_view.estimate
    assert est is not None
    page = report_html(fits_view, {})
    assert "<title>FitScope report</title>" in page
    assert "#2e9d4a" in page and "#d23c3c" not in page
    assert fits_view.verdict.headline in page
    assert f"{est.devices[0].total_bytes / GIB:,.2f}" in page
    assert f"{est.devices[0].capacity_bytes / GIB:,.2f}" in page
    assert "8,192" in page  # context per user
    assert "33 of 33" in page
    assert "Quantization ladder" in page and "Q4_K_M" in page
    assert "2x RTX 3090 PC" in page
    assert "Generated by FitScope at" in page
    assert "<img" not in page


def test_html_comparison_row_that_failed_shows_the_reason(evaluator: Evaluator) -> None:
    view = _view(evaluator, compare=(HardwareChoice(kind="catalog", device_id="no-such-gpu"),))
    page = report_html(view, {})
    row = page[page.index("Comparison") :]
    assert "There is no device &#x27;no-such-gpu&#x27; in the catalog." in row
    assert "0.00" not in row.split("</table>")[0]
    assert report_json(view)["comparison"][0]["error"].startswith("There is no device")


def test_html_colours_a_red_verdict_and_reports_impossible_settings(too_big_view: View, impossible_view: View) -> None:
    assert "#d23c3c" in report_html(too_big_view, {})
    page = report_html(impossible_view, {})
    assert "#d23c3c" in page
    assert "These settings are not possible." in page
    assert "Memory per device" not in page


# -- launch commands -----------------------------------------------------------------------------


def test_command_for_the_default_view(fits_view: View) -> None:
    cmd = llama_server_command(fits_view)
    assert cmd == "llama-server -m MODEL.gguf -c 8192 -np 1 -b 2048 -ub 512 -fa on -ctk f16 -ctv f16 -ngl 33"


def test_command_for_four_users_uses_the_total_context(four_users_view: View) -> None:
    cmd = llama_server_command(four_users_view)
    assert "-c 16384 -np 4" in cmd
    kw = _keywords(llama_cpp_python_snippet(four_users_view))
    assert kw["n_ctx"] == 16384 and kw["n_seq_max"] == 4
    assert report_json(four_users_view)["context_tokens"] == 16384


def test_command_with_a_q8_0_cache(evaluator: Evaluator) -> None:
    assert CACHE_TYPES["q8_0"] == GGMLType.Q8_0 == 8
    view = _view(evaluator, controls=Controls(context_per_user_tokens=8192, cache_type_k="q8_0", cache_type_v="q8_0"))
    assert "-ctk q8_0 -ctv q8_0" in llama_server_command(view)
    snippet = llama_cpp_python_snippet(view)
    assert "type_k=8,  # q8_0" in snippet and "type_v=8,  # q8_0" in snippet
    # q8_0 stores 32 values in 34 bytes, f16 in 64.
    assert report_json(view)["kv_cache_bytes"] == 1073741824 * 34 // 64


def test_command_without_flash_attention(evaluator: Evaluator) -> None:
    view = _view(evaluator, controls=Controls(flash_attn=False))
    assert "-fa off" in llama_server_command(view)
    assert _keywords(llama_cpp_python_snippet(view))["flash_attn"] is False


def test_command_for_the_cpu_offloads_nothing(evaluator: Evaluator) -> None:
    view = _view(evaluator, hardware=HardwareChoice(kind="cpu"))
    cmd = llama_server_command(view)
    assert cmd.endswith("-ngl 0")
    assert _keywords(llama_cpp_python_snippet(view))["n_gpu_layers"] == 0


def test_command_for_a_fixed_layer_count(too_big_view: View) -> None:
    assert llama_server_command(too_big_view).endswith("-ngl 81")


def test_swa_full_only_for_sliding_window_models(evaluator: Evaluator, fits_view: View) -> None:
    # The estimate follows llama-server's own small sliding-window cache by default...
    gemma = _view(evaluator, ref="gemma-3-4b")
    assert gemma.model is not None and gemma.model.arch.sliding_window is not None
    assert "--swa-full" not in llama_server_command(gemma)
    # ...and says --swa-full when the full one (llama-cpp-python's default) was estimated.
    full = _view(evaluator, ref="gemma-3-4b", controls=Controls(consumer="llama-cpp-python"))
    assert llama_server_command(full).endswith("--swa-full")
    assert full.estimate.kv_cache_bytes > gemma.estimate.kv_cache_bytes
    assert "--swa-full" not in llama_server_command(fits_view)


def test_model_path_is_quoted_and_chosen_sensibly(fits_view: View) -> None:
    path = "/models/my model's.gguf"
    args = shlex.split(llama_server_command(fits_view, path))
    assert args[args.index("-m") + 1] == path
    assert _keywords(llama_cpp_python_snippet(fits_view, path))["model_path"] == path

    assert fits_view.model is not None
    gguf = dataclasses.replace(fits_view, model=dataclasses.replace(fits_view.model, path=Path("/m/x.gguf")))
    assert "-m /m/x.gguf " in llama_server_command(gguf)
    # A Hugging Face config.json is not something llama.cpp can load.
    hf = dataclasses.replace(fits_view, model=dataclasses.replace(fits_view.model, path=Path("/m/config.json")))
    assert "-m MODEL.gguf " in llama_server_command(hf)


def test_python_snippet_compiles_with_the_estimate_settings(fits_view: View) -> None:
    snippet = llama_cpp_python_snippet(fits_view)
    assert snippet.startswith("from llama_cpp import Llama\n")
    compile(snippet, "<snippet>", "exec")
    assert _keywords(snippet) == {
        "model_path": "MODEL.gguf",
        "n_ctx": 8192,
        "n_batch": 2048,
        "n_ubatch": 512,
        "n_gpu_layers": 33,
        "flash_attn": True,
        "type_k": 1,
        "type_v": 1,
        "swa_full": False,
    }


def test_copy_text_holds_both_labelled(four_users_view: View) -> None:
    text = copy_command_text(four_users_view, "/m/a.gguf")
    server, python = text.split("# llama-cpp-python\n")
    assert server.startswith("# llama-server\nllama-server -m /m/a.gguf -c 16384")
    compile(python, "<copied>", "exec")


def test_commands_refuse_impossible_settings(impossible_view: View) -> None:
    for make in (llama_server_command, llama_cpp_python_snippet, copy_command_text):
        with pytest.raises(EstimateError, match="flash attention"):
            make(impossible_view)


def test_html_comparison_is_the_windows_table_current_hardware_first_no_speed_where_it_cannot_run(
    evaluator: Evaluator,
) -> None:
    from app.services.tables import compare_cells, comparison_rows

    compare = (
        HardwareChoice(kind="catalog", device_id="rtx-3060-12gb"),
        HardwareChoice(kind="catalog", device_id="h100-sxm"),
    )
    # Every layer on the GPU (-ngl 81): a 12 GB card cannot hold a 70B model that way.
    view = _view(evaluator, ref="llama-3.1-70b", controls=Controls(gpu_layers=81), compare=compare)
    rows = comparison_rows(view)
    from app.core.advisor.configs import machine_price
    from app.core.model.catalog import find_device

    whole = machine_price(find_device("rtx-4090")).total_usd
    assert rows[0].label.endswith("(current)") and rows[0].price_usd == whole > 1599
    cells = {r.label: compare_cells(r) for r in rows}
    small = next(c for label, c in cells.items() if "3060" in label)
    assert small[3] == "no" and small[4] == "-"  # cannot hold it: no speed to promise
    big = next(c for label, c in cells.items() if "H100" in label)
    assert big[3] == "yes" and big[4] != "-"
    page = report_html(view, {})
    table = page[page.index("Comparison") :].split("</table>")[0]
    assert "(current)" in table and f"${whole:,.0f} PC" in table
    assert small[0] in table


def test_html_per_device_table_is_the_windows_details_with_the_projector(evaluator: Evaluator) -> None:
    from app.core.model.catalog import find_projector
    from app.core.model.projector import estimate_projector
    from app.services.tables import BREAKDOWN_HEADER, breakdown_rows

    view = _view(
        evaluator,
        ref="gemma-3-4b",
        controls=Controls(projector=find_projector("gemma-3-4b").spec()),
        hardware=HardwareChoice(kind="catalog", device_id="rtx-4060", host_ram_gib=32),
    )
    page = report_html(view, {})
    table = page[page.index("Memory per device") :].split("</table>")[0]
    assert all(name in table for name in BREAKDOWN_HEADER)
    extra = estimate_projector(find_projector("gemma-3-4b").spec()).total_bytes
    row = breakdown_rows(view)[0]
    assert row[BREAKDOWN_HEADER.index("Vision projector")] == f"{extra / GIB:,.2f}"
    assert all(cell in table for cell in row)
