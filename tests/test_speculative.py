"""Speculative decoding as a user meets it: the draft model (-md) or the model's own MTP head
(--spec-type draft-mtp) as its own part of the memory split, in the estimate, the CLI, its JSON and the
llama-server command. The figures themselves are proven against llama.cpp's dry run in test_proof.py
(the "+MTP head" and "+draft" cases)."""

from __future__ import annotations

import json

import pytest

from app import cli
from app.core.common.errors import EstimateError
from app.core.memory.commands import server_command
from app.core.memory.estimate import estimate
from app.core.memory.records import Settings, SpeculativeSpec, Target
from app.core.memory.targets import host_ram_target, target_from_device
from app.core.model.catalog import find_device, find_model
from app.core.model.quant import quantize_layout

GIB = 1024**3


def _targets() -> list[Target]:
    return [target_from_device(find_device("rtx-5090")), host_ram_target(64 * GIB)]


def _run(capsys, *argv: str):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out) if "--json" in argv else out


def test_the_mtp_head_is_its_own_part_and_goes_with_the_last_layer() -> None:
    arch = find_model("qwen3.5-27b")
    tensors = quantize_layout(arch, "Q4_K_M")
    base = Settings(context_tokens=32768, consumer="llama-server", swa_full=False)
    plain = estimate(arch, tensors, base, _targets())
    mtp = estimate(
        arch, tensors, base.model_copy(update={"speculative": SpeculativeSpec(kind="mtp", name="MTP")}), _targets()
    )
    s = mtp.speculative
    assert plain.speculative is None and s is not None
    # the unloaded NextN block is what the MTP context loads
    assert s.weights_bytes == plain.model_bytes - plain.weights_bytes - plain.repack_bytes > 0
    assert s.kv_cache_bytes > 0 and s.compute_bytes > 0 and s.output_bytes > 0
    assert mtp.devices[0].speculative_bytes == s.total_bytes - s.output_bytes  # the GPU holds the last layer
    assert mtp.devices[-1].speculative_bytes == s.output_bytes  # logits in host memory
    assert mtp.total_bytes - plain.total_bytes == s.total_bytes
    assert any("not loaded (load_mtp off)" in a for a in plain.assumptions)
    assert any("Speculative decoding keeps the model's MTP head" in a for a in mtp.assumptions)
    cmd = server_command(mtp, "MODEL.gguf", mtp.gpu_layers, True)
    assert "--spec-type draft-mtp" in cmd and "-ctkd f16 -ctvd f16" in cmd


def test_a_model_without_an_mtp_head_is_refused() -> None:
    arch = find_model("llama-3.1-8b")
    settings = Settings(consumer="llama-server", speculative=SpeculativeSpec(kind="mtp", name="MTP"))
    with pytest.raises(EstimateError, match="no multi-token-prediction head"):
        estimate(arch, quantize_layout(arch, "Q4_K_M"), settings, _targets())


def test_a_draft_model_is_estimated_like_a_model_on_the_same_devices() -> None:
    arch = find_model("qwen3.5-27b")
    draft = find_model("qwen3.5-0.8b")
    draft_tensors = tuple(quantize_layout(draft, "Q8_0"))
    spec = SpeculativeSpec(
        kind="draft", name=draft.name, file_name="draft.gguf", architecture=draft, tensors=draft_tensors,
        cache_type_k="q8_0", cache_type_v="q8_0",
    )
    base = Settings(context_tokens=16384, consumer="llama-server", swa_full=False)
    tensors = quantize_layout(arch, "Q4_K_M")
    with_draft = estimate(arch, tensors, base.model_copy(update={"speculative": spec}), _targets())
    alone = estimate(
        draft, draft_tensors, base.model_copy(update={"cache_type_k": "q8_0", "cache_type_v": "q8_0"}), _targets()
    )
    s = with_draft.speculative
    assert s is not None
    assert s.weights_bytes == alone.weights_bytes + alone.repack_bytes
    assert s.kv_cache_bytes == alone.kv_cache_bytes + alone.recurrent_state_bytes
    # the draft's process overhead is the model's: not counted twice
    assert sum(s.by_device) == alone.total_bytes - alone.overhead_bytes
    cmd = server_command(with_draft, "MODEL.gguf", with_draft.gpu_layers, True)
    assert "-md draft.gguf" in cmd and "-ctkd q8_0 -ctvd q8_0" in cmd


def test_cli_mtp_and_draft(capsys) -> None:
    base = ("estimate", "--model", "qwen3.5-27b", "--gpu", "rtx-5090", "--host-ram-gib", "64", "-c", "32768")
    plain = _run(capsys, *base, "--json")
    mtp = _run(capsys, *base, "--mtp", "--json")
    assert plain["speculative"] is None and plain["speculative_bytes"] == 0
    s = mtp["speculative"]
    assert s["kind"] == "mtp" and mtp["speculative_bytes"] == s["total_bytes"] > 0
    assert mtp["total_bytes"] - plain["total_bytes"] == s["total_bytes"]
    assert mtp["devices"][0]["speculative_bytes"] == s["devices"][mtp["devices"][0]["name"]]
    assert "--spec-type draft-mtp" in mtp["llama_server_command"]

    draft = _run(capsys, *base, "--draft", "qwen3.5-0.8b", "-ctkd", "q8_0", "-ctvd", "q8_0", "--json")
    d = draft["speculative"]
    assert d["kind"] == "draft" and d["weights_bytes"] > 0 and d["kv_cache_bytes"] > 0
    assert "tensors" not in draft["settings"]["speculative"]
    assert "-md qwen3.5-0.8b.gguf" in draft["llama_server_command"]

    text = _run(capsys, *base, "--mtp")
    assert " draft " in text.splitlines()[2]
    assert "--spec-type draft-mtp" in text


def test_cli_refuses_two_speculative_decoders(capsys) -> None:
    rc = cli.main(["estimate", "--model", "qwen3.5-27b", "--cpu", "--mtp", "--draft", "qwen3.5-0.8b"])
    _out, err = capsys.readouterr()
    assert rc == 2 and "Choose one speculative decoder" in err
