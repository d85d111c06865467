"""The 2026 catalog: every entry made from a collected config.json (tests/data/model_configs) still reads
the same from that file, the families the buyers ask about are there, and a GGUF of each reads back
to the same architecture."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.model.catalog import by_family, find_model, load_models
from app.core.model.hf_config import read_hf_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
CATALOG_IDS = {"kimi-k2-instruct": "kimi-k2"}
# Architecture fields: everything but the catalog's own words.
OWN_WORDS = {"id", "name", "source", "params_billions", "default_quant"}


def _collected() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(CONFIGS.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        catalog_id = CATALOG_IDS.get(record["id"], record["id"])
        if any(m.id == catalog_id for m in load_models()):
            out.append((catalog_id, record))
    return out


COLLECTED = _collected()


def test_at_least_25_entries_come_from_collected_configs_and_cite_them() -> None:
    assert len(COLLECTED) >= 25
    for catalog_id, record in COLLECTED:
        source = find_model(catalog_id).source
        assert record["hf_repo"] in source, catalog_id
        if not record["source"].startswith("https://huggingface.co/"):
            assert record["source"] in source, f"{catalog_id} does not name the copy its values come from"


@pytest.mark.parametrize(("catalog_id", "record"), COLLECTED, ids=[c for c, _ in COLLECTED])
def test_catalog_entry_is_what_its_config_json_says(catalog_id: str, record: dict) -> None:
    entry = find_model(catalog_id)
    read = read_hf_config(record["config"], model_id=catalog_id)
    fields = set(type(entry).model_fields) - OWN_WORDS
    assert {f: getattr(entry, f) for f in fields} == {f: getattr(read, f) for f in fields}


def test_the_families_buyers_ask_about_are_in_the_catalog() -> None:
    families = dict(by_family(load_models()))
    wanted = {
        "Qwen3.5 / Qwen3.6": {"qwen3.5-27b", "qwen3.6-27b", "qwen3.5-35b-a3b", "qwen3.5-397b-a17b"},
        "Gemma 4": {"gemma-4-e2b", "gemma-4-e4b", "gemma-4-26b-a4b", "gemma-4-31b"},
        "DeepSeek": {"deepseek-v3.1", "deepseek-v3.2"},
        "Kimi": {"kimi-k2", "kimi-k2.5", "kimi-k2.6"},
        "GLM": {"glm-4.7-flash", "glm-5", "glm-5.1", "glm-5.2"},
        "MiniMax": {"minimax-m2.7"},
        "Nemotron": {"nemotron-3-nano-30b-a3b", "nemotron-3-super-120b-a12b"},
        "Qwen3-Coder": {"qwen3-coder-30b-a3b", "qwen3-coder-next"},
        "Granite": {"granite-4.0-h-small", "granite-4.0-h-micro", "granite-4.0-h-1b", "granite-4.0-h-350m"},
        "Apertus": {"apertus-8b", "apertus-70b"},
        "Mistral": {"ministral-3-3b", "ministral-3-14b", "mistral-medium-3.5-128b"},
    }
    for family, ids in wanted.items():
        assert ids <= {m.id for m in families[family]}, family


def test_models_with_an_mtp_head_say_it_is_not_loaded() -> None:
    # The converter keeps the MTP block for these; llama.cpp loads it only with --spec-type draft-mtp.
    kept = {m.id: m.n_nextn_layers for m in load_models() if m.n_nextn_layers}
    assert {"qwen3.5-27b", "qwen3.5-397b-a17b", "deepseek-v3.2", "glm-5", "nemotron-3-super-120b-a12b"} <= set(kept)
    # DeepseekV2Model drops it (skip_mtp): DeepSeek-V3.1, Kimi K2 and GLM-4.7-Flash have none in their GGUFs.
    assert not {"deepseek-v3.1", "kimi-k2", "glm-4.7-flash"} & set(kept)


def test_the_catalog_entries_script_prints_the_catalog() -> None:
    """scripts/catalog_entries.py is how the entries were made: it still prints them as they are."""
    some = ["qwen3.5-35b-a3b", "gemma-4-31b", "glm-5.2"]
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "catalog_entries.py"), *(str(CONFIGS / f"{i}.json") for i in some)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    for entry in printed:
        assert find_model(entry["id"]).model_dump(exclude_defaults=True, exclude_none=True) | {
            "tied_embeddings": find_model(entry["id"]).tied_embeddings
        } == entry
