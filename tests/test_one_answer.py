"""One answer everywhere: for the same model, machine and settings, ``fitscope estimate --json``, the
window's view (what it shows and exports) and the hardware advisor's row give the same figures.

Fifty settings: catalog models and a GGUF file, dense, MoE, sliding-window and MLA architectures;
one GPU, several, Apple and other unified-memory machines, CPU servers and this machine's CPU; one
to twelve users, f16 and q8_0 caches, auto placement, fixed layers and experts pinned to RAM.
This machine's host is detected once, for real, and both sides see that one reading.
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

import app.adapters.host as host_adapter
from app.cli import main as cli_main
from app.core.advisor.configs import load_variants, platform_for_gpus
from app.core.advisor.records import Workload
from app.core.advisor.sweep import NO_MACHINE, Sweep
from app.core.model.catalog import find_device, find_model
from app.core.report.choices import Controls, HardwareChoice, Machine, ModelChoice
from app.core.report.verdict import rate_range
from app.services.advisor_evaluate import evaluate_box, evaluate_single
from app.services.exports import report_json
from app.services.view import Evaluator, Request
from tests.support.synthetic_gguf import write_sparse_gguf

# The figures every screen shows: where it runs, each device's memory, speed, limits, the command.
SHARED_KEYS = (
    "context_tokens",
    "context_per_user_tokens",
    "users",
    "placement",
    "gpu_layers",
    "n_cpu_moe",
    "gpus_hidden",
    "fits",
    "weights_bytes",
    "kv_cache_bytes",
    "compute_bytes",
    "total_bytes",
    "users_that_fit",
    "largest_context_per_user_tokens",
    "limit_scope",
    "decode_tokens_per_s",
    "decode_total_tokens_per_s",
    "decode_depth_tokens",
    "prefill_tokens_per_s",
    "ttft_s",
    "llama_server_command",
)


@dataclass(frozen=True)
class Case:
    model: str  # a catalog id, or "gguf:<catalog id>" for a sparse GGUF of that shape
    quant: str
    device: str  # a catalog id, or "cpu" for this machine's CPU
    count: int = 1
    ram_gib: float | None = None
    users: int = 1
    context: int = 4096
    kv: str = "f16"
    gpu_layers: int | str = "auto"
    n_cpu_moe: int | None = None

    @property
    def advisor_comparable(self) -> bool:
        """The advisor's workload has llama.cpp's defaults: f16 cache, auto placement."""
        return self.device != "cpu" and self.kv == "f16" and self.gpu_layers == "auto" and self.n_cpu_moe is None


def _cases() -> list[Case]:
    c = Case
    return [
        # one GPU
        c("llama-3.1-8b", "Q4_K_M", "rtx-4090", context=32768),
        c("llama-3.1-8b", "Q4_K_M", "rtx-4090", users=4, context=8192),
        c("llama-3.1-8b", "Q8_0", "rtx-3060-12gb", users=2, context=16384),
        c("llama-3.1-8b", "Q4_K_M", "rtx-4060", context=65536, kv="q8_0"),
        c("qwen3-32b", "Q4_K_M", "rtx-5090", ram_gib=64, users=12, context=4096),
        c("qwen3-32b", "Q4_K_M", "rtx-4090", ram_gib=64, users=4, context=8192),
        c("qwen3-32b", "Q5_K_M", "rtx-3090", ram_gib=128, context=16384, kv="q8_0"),
        c("llama-3.3-70b", "Q4_K_M", "rtx-4090", ram_gib=128, context=8192),
        c("llama-3.3-70b", "Q4_K_M", "rtx-4090", ram_gib=128, context=8192, gpu_layers=40),
        c("gemma-3-27b", "Q4_K_M", "rtx-4090", context=32768),
        c("gemma-3-27b", "Q4_K_M", "rtx-4090", users=4, context=16384),
        c("gemma-3-12b", "Q4_K_M", "rtx-4070", context=8192),
        c("mistral-nemo-12b", "Q6_K", "rtx-4070-ti-super", users=3, context=12288),
        c("phi-4", "Q4_K_M", "rtx-3060-12gb", context=16384),
        c("deepseek-v2-lite", "Q4_K_M", "rtx-4060-ti-16gb", context=32768),
        # MoE: experts in system memory, chosen by auto-fit or pinned
        c("gpt-oss-120b", "MXFP4_MOE", "rtx-4070", ram_gib=128, context=8192),
        c("gpt-oss-120b", "MXFP4_MOE", "rtx-4070", ram_gib=128, context=8192, n_cpu_moe=31),
        c("gpt-oss-120b", "MXFP4_MOE", "rtx-5090", ram_gib=128, users=4, context=16384),
        c("gpt-oss-20b", "MXFP4_MOE", "rtx-4060-ti-16gb", context=32768),
        c("qwen3-30b-a3b", "Q4_K_M", "rtx-3060-12gb", ram_gib=64, context=16384),
        c("qwen3-30b-a3b", "Q8_0", "rtx-4090", ram_gib=64, users=2, context=8192),
        c("qwen3-235b-a22b", "Q4_K_M", "rtx-5090", ram_gib=192, context=8192),
        c("glm-4.5-air", "Q4_K_M", "rtx-4090", ram_gib=128, context=16384),
        c("qwen3-next-80b-a3b", "Q4_K_M", "rtx-4070", ram_gib=128, context=8192, n_cpu_moe=40),
        c("llama-4-scout", "Q4_K_M", "rtx-5090", ram_gib=128, context=16384),
        c("mixtral-8x7b", "Q4_K_M", "rtx-3090", ram_gib=64, context=8192),
        # several GPUs
        c("qwen3-32b", "Q4_K_M", "rtx-5060-ti-16gb", count=2, ram_gib=64, users=12, context=4096),
        c("llama-3.3-70b", "Q4_K_M", "rtx-3090", count=2, ram_gib=64, context=16384),
        c("llama-3.3-70b", "Q8_0", "rtx-3090", count=4, ram_gib=128, users=4, context=8192),
        c("llama-3.1-70b", "Q4_K_M", "rx-7900-xtx", count=2, ram_gib=64, context=8192),
        c("qwen3-235b-a22b", "Q4_K_M", "rtx-3090", count=4, ram_gib=256, context=8192),
        c("deepseek-v3", "Q4_K_M", "h200", count=8, ram_gib=768, context=16384),
        c("gpt-oss-120b", "MXFP4_MOE", "rtx-3090", count=2, ram_gib=128, users=8, context=8192),
        # Apple and other unified memory
        c("llama-3.3-70b", "Q4_K_M", "m4-max-128gb", context=16384),
        c("qwen3-32b", "Q4_K_M", "m4-max-128gb", users=12, context=4096),
        c("gpt-oss-120b", "MXFP4_MOE", "m3-ultra-256gb", users=4, context=32768),
        c("qwen3-30b-a3b", "Q4_K_M", "m2-16gb", context=4096),
        c("gpt-oss-120b", "MXFP4_MOE", "dgx-spark", context=16384),
        c("qwen3-32b", "Q8_0", "ryzen-ai-max-395-128gb", users=2, context=8192),
        c("llama-3.1-8b", "Q4_K_M", "m1-16gb", context=8192, kv="q8_0"),
        # CPU servers and this machine's CPU
        c("llama-3.3-70b", "Q4_K_M", "epyc-9655", users=4, context=8192),
        c("deepseek-v3", "Q4_K_M", "xeon-6980p", context=8192),
        c("qwen3-30b-a3b", "Q4_K_M", "ryzen-9-9950x", context=16384),
        c("llama-3.2-1b", "Q4_K_M", "cpu", context=4096),
        c("qwen2.5-0.5b", "Q8_0", "cpu", users=2, context=8192),
        c("gemma-3-1b", "Q4_K_M", "cpu", context=16384, kv="q8_0"),
        # GGUF files
        c("gguf:llama-3.1-8b", "Q4_K_M", "rtx-4090", users=2, context=8192),
        c("gguf:qwen3-30b-a3b", "Q4_K_M", "rtx-4070", ram_gib=64, context=8192),
        c("gguf:gemma-3-4b", "Q4_K_M", "m4-16gb", context=16384),
        c("gguf:llama-3.2-3b", "Q4_K_M", "cpu", context=4096),
    ]


CASES = _cases()


def test_there_are_fifty_varied_settings():
    assert len(CASES) == 50
    assert len({c.model for c in CASES}) >= 20
    assert {c.device for c in CASES} >= {"cpu", "m4-max-128gb", "epyc-9655", "dgx-spark"}
    assert any(c.count > 1 for c in CASES) and any(c.n_cpu_moe for c in CASES)
    assert sum(c.advisor_comparable for c in CASES) >= 30


@pytest.fixture(scope="module")
def host():
    return host_adapter.detect_host(measure_bandwidth=True)


@pytest.fixture
def cli(monkeypatch, host):
    """``fitscope estimate ... --json`` in this process, seeing the same host reading as the window."""
    monkeypatch.setattr(host_adapter, "detect_host", lambda measure_bandwidth=False: host)
    bandwidth = host.measured_read_bandwidth_gb_s
    monkeypatch.setattr(host_adapter, "measure_read_bandwidth_gb_s", lambda budget_s=0.3: bandwidth)

    def run(args: list[str]) -> dict:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli_main(["estimate", *args, "--json"]) == 0
        return json.loads(out.getvalue())

    return run


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    out = {}
    for case in CASES:
        if case.model.startswith("gguf:") and case.model not in out:
            arch_id = case.model.split(":", 1)[1]
            path = folder / f"{arch_id}-{case.quant}.gguf"
            write_sparse_gguf(path, find_model(arch_id), case.quant)
            out[case.model] = path
    return out


def _model_choice(case: Case, files: dict[str, Path]) -> ModelChoice:
    if case.model.startswith("gguf:"):
        return ModelChoice(kind="gguf", ref=str(files[case.model]))
    return ModelChoice(kind="catalog", ref=case.model, quant=case.quant)


def _hardware(case: Case, ram_gib: float | None = None, host_memory: str | None = None) -> HardwareChoice:
    if case.device == "cpu":
        return HardwareChoice(kind="cpu")
    return HardwareChoice(
        kind="catalog",
        device_id=case.device,
        count=case.count,
        host_ram_gib=ram_gib if ram_gib is not None else case.ram_gib,
        host_memory=host_memory,
    )


def _cli_args(case: Case, files: dict[str, Path], hardware: HardwareChoice) -> list[str]:
    if case.model.startswith("gguf:"):
        args = ["--gguf", str(files[case.model])]
    else:
        args = ["--model", case.model, "--quant", case.quant]
    if hardware.kind == "cpu":
        args.append("--cpu")
    else:
        args += ["--gpu", case.device] * case.count
        if hardware.host_ram_gib is not None:
            args += ["--host-ram-gib", f"{hardware.host_ram_gib:g}"]
        if hardware.host_memory is not None:
            args += ["--host-memory", hardware.host_memory]
    args += ["-c", str(case.context * case.users), "-np", str(case.users), "-ctk", case.kv, "-ctv", case.kv]
    args += ["-ngl", str(case.gpu_layers)]
    if case.n_cpu_moe is not None:
        args += ["--n-cpu-moe", str(case.n_cpu_moe)]
    return args


def _controls(case: Case) -> Controls:
    return Controls(
        context_per_user_tokens=case.context,
        users=case.users,
        cache_type_k=case.kv,
        cache_type_v=case.kv,
        gpu_layers=case.gpu_layers,  # type: ignore[arg-type]
        n_cpu_moe=case.n_cpu_moe,
    )


def _figures(data: dict) -> dict:
    out = {k: data.get(k) for k in SHARED_KEYS}
    out["devices"] = [(d["kind"], d["total_bytes"], d["capacity_bytes"], d["layers"]) for d in data["devices"]]
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.model}-{c.quant}-{c.count}x{c.device}-{c.users}u")
def test_the_command_line_and_the_window_give_the_same_figures(case, cli, host, gguf_files):
    hardware = _hardware(case)
    view = Evaluator().evaluate(
        Request(_model_choice(case, gguf_files), hardware, _controls(case), Machine(host=host))
    )
    assert not view.error, view.error
    window = report_json(view)
    terminal = cli(_cli_args(case, gguf_files, hardware))
    assert _figures(window) == _figures(terminal)
    # The verdict on screen quotes the same speed and, when it fits, the same number of people.
    decode = terminal["decode_tokens_per_s"]
    shown = view.speed.decode_tokens_per_s
    if terminal["fits"] and decode["high"] >= 1:
        # As every sentence writes a range ("8.2-12 tokens/s"; one figure where both ends round alike).
        assert rate_range(shown) in view.verdict.text
        assert (shown.low, shown.high) == pytest.approx((decode["low"], decode["high"]), abs=0.006)  # JSON: 2 decimals
    if terminal["fits"] and terminal["users_that_fit"] > 1 and not terminal["gpus_hidden"]:
        assert f"{terminal['users_that_fit']} people" in view.verdict.text
    # The compare table's first row is this machine, from the same answer.
    first = view.current
    assert first is not None and first.label.endswith("(current)")
    assert first.decode_tokens_per_s is not None and first.decode_tokens_per_s.as_dict() == decode


def _advisor_row(case: Case, files: dict[str, Path]):
    """The hardware advisor's row for this machine and preset: its own evaluation of that machine."""
    workload = Workload(
        model=_model_choice(case, files),
        quants=(case.quant,),
        context_per_user_tokens=case.context,
        users=case.users,
        min_tokens_per_s=0.0,
        quality_floor="any",
    )
    arch, label, path, variants = load_variants(workload)
    sw = Sweep.start(workload, arch, label, path, variants)
    device = find_device(case.device)
    if device.memory_kind == "dedicated":
        evaluate_box(sw, device, case.count)
    else:
        evaluate_single(sw, device)
    (row,) = [c for c in sw.out if c.quant == case.quant]
    return row


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.advisor_comparable], ids=lambda c: f"{c.model}-{c.count}x{c.device}-{c.users}u"
)
def test_the_advisor_lists_what_the_estimate_says_for_that_machine(case, cli, gguf_files):
    row = _advisor_row(case, gguf_files)
    if not row.llama_command:
        # Settled without an estimate: the weights exceed every memory the machine can have.
        assert row.settled_by == "memory" and not row.passes
        return
    device = find_device(case.device)
    ram = row.host_ram_gib if device.memory_kind == "dedicated" else None
    memory = platform_for_gpus(case.count).host_memory if device.memory_kind == "dedicated" else None
    terminal = cli(_cli_args(case, gguf_files, _hardware(case, ram, memory)))
    placement = {"gpu": "gpu", "experts": "partial", "partial": "partial", "cpu": "cpu"}[row.placement]
    assert terminal["placement"] == placement
    assert terminal["decode_tokens_per_s"] == row.decode.as_dict()
    assert terminal["n_cpu_moe"] == row.n_cpu_moe
    if device.is_gpu:
        assert terminal["gpu_layers"] == row.gpu_layers
    assert terminal["llama_server_command"].split(" -m ")[1].split(" ", 1)[1] == row.llama_command.split(
        " -m "
    )[1].split(" ", 1)[1]


def test_the_issues_example_machine_is_no_longer_listed_as_fitting():
    """Qwen3 32B for 12 people at 4,096 tokens each on 2x RTX 5060 Ti 16 GB: llama.cpp's --fit keeps
    1 GiB free per GPU, so the model is partly in system memory, and the advisor says so too."""
    case = Case("qwen3-32b", "Q4_K_M", "rtx-5060-ti-16gb", count=2, ram_gib=64, users=12, context=4096)
    row = _advisor_row(case, {})
    assert row.placement == "partial"
    assert row.decode is not None and row.decode.high < 10 / 0.75  # below 10 words a second per user


def test_no_machine_is_evaluated_for_the_advisor_from_this_computer():
    # The advisor's machines are the catalog's only: nothing of the machine FitScope runs on.
    assert NO_MACHINE.host is None and NO_MACHINE.gpus == ()
