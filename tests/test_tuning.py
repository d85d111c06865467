"""The fastest llama-server settings that fit: the search (app.core.speed.tuning), ``fitscope tune``
and ``fitscope estimate --fastest``."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from app.core.common.errors import EstimateError
from app.core.common.units import GIB
from app.core.memory.estimate import estimate
from app.core.memory.records import Settings
from app.core.memory.targets import host_ram_target, target_from_device
from app.core.model.catalog import find_device
from app.core.model.source import model_from_catalog
from app.core.speed.tuning import fastest_settings


@pytest.fixture(scope="module")
def gpt_oss():
    return model_from_catalog("gpt-oss-120b", "MXFP4_MOE")


def _targets(memory: str = "ddr5-5600-2ch"):
    return [target_from_device(find_device("rtx-4070")), host_ram_target(64 * GIB, host_memory=memory)]


def test_the_fastest_settings_fit_differ_and_rank_by_decode(gpt_oss):
    base = Settings(context_tokens=16384, consumer="llama-server", swa_full=False)
    targets = _targets()
    found = fastest_settings(gpt_oss.arch, gpt_oss.tensors, base, targets, threads=(None, 4))
    assert len(found) == 3
    # Ranked by decode (ties within 1% go to prefill, the more faithful KV cache, the memory left).
    assert found[0].score >= max(c.score for c in found) * 0.99
    keys = {(c.plan.n_cpu_moe, c.settings.cache_type_k, c.settings.flash_attn) for c in found}
    assert len(keys) == 3
    for c in found:
        assert c.plan.estimate.fits
        assert all(d.total_bytes + 1024**3 <= d.capacity_bytes for d in c.plan.estimate.devices if d.kind == "gpu")
        assert c.max_context_tokens >= 16384
        assert c.plan.n_cpu_moe > 0  # 59 GiB of weights on a 12 GiB card
    # The search's own estimate of its best placement is the estimator's for those flags.
    best = found[0]
    again = estimate(gpt_oss.arch, gpt_oss.tensors, best.settings, targets)
    assert again.total_bytes == best.plan.estimate.total_bytes


def test_a_long_prompt_goal_raises_the_ubatch():
    """Ranked by the time to answer an 8k-token prompt, the best setting copies the experts in RAM
    fewer times: a -ub of 2048 or more."""
    model = model_from_catalog("gpt-oss-120b", "MXFP4_MOE")
    base = Settings(context_tokens=16384, consumer="llama-server", swa_full=False)
    found = fastest_settings(model.arch, model.tensors, base, _targets(), goal="prompt", prompt_tokens=8192)
    assert found[0].settings.ubatch_tokens >= 2048
    decode_best = fastest_settings(model.arch, model.tensors, base, _targets())
    assert found[0].speed.prefill_typical > decode_best[0].speed.prefill_typical


def test_nothing_fits_says_what_was_tried():
    model = model_from_catalog("llama-3.1-70b", "Q4_K_M")
    tiny = [target_from_device(find_device("rtx-4060")), host_ram_target(8 * GIB)]
    with pytest.raises(EstimateError, match="combinations of KV cache"):
        fastest_settings(model.arch, model.tensors, Settings(context_tokens=8192), tiny)


def test_fitscope_tune_prints_three_commands(capsys):
    assert (
        main(["tune", "--model", "gpt-oss-120b", "--gpu", "rtx-4070", "--host-ram-gib", "64", "-c", "8192", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert len(out["settings"]) == 3
    for s in out["settings"]:
        assert s["llama_server_command"].startswith("llama-server -m MODEL.gguf -c 8192")
        assert "--n-cpu-moe" in s["llama_server_command"]
        assert s["decode_tokens_per_s"]["low"] < s["decode_typical"] < s["decode_tokens_per_s"]["high"]
        assert s["trades"]
    assert main(["estimate", "--fastest", "--model", "gpt-oss-20b", "--gpu", "rtx-4090", "--json"]) == 0
    assert "--n-cpu-moe" not in json.loads(capsys.readouterr().out)["settings"][0]["llama_server_command"]
    assert main(["tune", "--model", "gpt-oss-20b", "--gpu", "rtx-4090", "--pcie", "x9"]) == 2
    assert "Invalid --pcie" in capsys.readouterr().err


def test_the_live_check_runs_each_setting_as_searched_and_compares_like_with_like(tmp_path):
    """check_live asks llama.cpp for exactly the searched settings (KV, flash attention, -ub/-b,
    placement) and holds each measured decode against a prediction for the check's own prompt."""
    from app.core.report.choices import Controls
    from app.core.speed.measure import MeasuredBuffers, RunFigures, RunResult
    from app.services.tuning import check_live, tune

    model = model_from_catalog("llama-3.1-8b", "Q4_K_M")
    targets = [target_from_device(find_device("ryzen-9-9950x"))]
    result = tune(model, Controls(context_per_user_tokens=4096), targets, repack="x86-avx512", prompt_tokens=256)
    asked = []

    def run(settings):
        asked.append(settings)
        figures = RunFigures(
            prompt_tokens=256,
            generated_tokens=64,
            ttft_s=1.0,
            prefill_s=0.9,
            decode_s=6.3,
            prefill_tokens_per_s_llama=284.0,
            decode_tokens_per_s_llama=10.0,
        )
        return RunResult(
            settings=settings,
            started_at=0.0,
            llama_cpp_version="test",
            gpu_offload_supported=False,
            model_size_bytes=1,
            model_sha256="",
            n_layer=32,
            load_s=1.0,
            runs=(figures,),
            buffers=MeasuredBuffers(),
        )

    checks = check_live(result, str(tmp_path / "model.gguf"), run=run, generate_tokens=64, repeat=1)
    assert len(checks) == len(asked) == len(result.settings)
    for check, settings in zip(checks, asked, strict=True):
        s = check.setting.candidate.settings
        assert (settings.cache_type_k, settings.flash_attn, settings.ubatch_tokens) == (
            s.cache_type_k,
            s.flash_attn,
            s.ubatch_tokens,
        )
        assert settings.gpu_layers == 0 and settings.prompt_tokens == 256 and settings.max_tokens == 64
        assert check.measured_decode == 10.0
        assert check.decode_error == pytest.approx((check.predicted_decode - 10.0) / 10.0)
