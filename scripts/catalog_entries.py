"""Print catalog entries (resources/catalog/models.json) for collected config.json files.

    .venv/bin/python scripts/catalog_entries.py tests/data/model_configs/qwen3.5-27b.json [...]

Each entry is what app.core.model.hf_config reads from the file (the fields llama.cpp's converter
writes), with the file's id and name, and a source naming the Hugging Face file and, where the text
came from a copy, the copy. The size is the one in the model's name, else the parameters of the
converted file's tensors. tests/test_catalog_configs.py checks that every catalog entry with a
collected config still equals what this prints.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.core.model.architecture import Architecture  # noqa: E402
from app.core.model.hf_config import read_hf_config  # noqa: E402
from app.core.model.layout import tensor_layout  # noqa: E402

CONFIGS = ROOT / "tests" / "data" / "model_configs"

# Catalog ids that differ from the collected file's id.
CATALOG_IDS = {"kimi-k2-instruct": "kimi-k2"}

# Catalog names where the collected file is a repack or release variant of the model (its architecture
# values are the model's; the source says which file they come from).
NAMES = {
    "kimi-k2-instruct": "Kimi K2",
    "kimi-k2.6": "Kimi K2.6",
    "laguna-xs.2": "Laguna XS.2",
    "nemotron-3-nano-30b-a3b": "Nemotron 3 Nano 30B-A3B",
    "nemotron-3-super-120b-a12b": "Nemotron 3 Super 120B-A12B",
    "nemotron-3-ultra-550b-a55b": "Nemotron 3 Ultra 550B-A55B",
    "qwen3.6-27b": "Qwen3.6 27B",
    "qwen3-coder-30b-a3b": "Qwen3-Coder 30B-A3B",
}


def size_from_name(name: str) -> float | None:
    """The total size a model's name gives (27B, 0.8B, 35B-A3B: 35), None when it gives none."""
    m = re.search(r"(\d+(?:\.\d+)?)B(?:-A\d+(?:\.\d+)?B)?\b", name)
    return float(m.group(1)) if m else None


def counted_params(arch: Architecture) -> float:
    total = 0
    for t in tensor_layout(arch):
        n = 1
        for d in t.shape:
            n *= d
        total += n
    return round(total / 1e9, 1)


def entry(path: Path) -> dict:
    record = json.loads(path.read_text(encoding="utf-8"))
    model_id = CATALOG_IDS.get(record["id"], record["id"])
    arch = read_hf_config(record["config"], model_id=model_id)
    hf = f"https://huggingface.co/{record['hf_repo']}/blob/{record.get('hf_revision') or 'main'}/config.json"
    source = hf if record["source"].startswith(hf.split("/blob/")[0]) else f"{hf} (the text of {record['source']})"
    size = size_from_name(record["hf_repo"]) or size_from_name(record["name"])
    arch = arch.model_copy(
        update={
            "id": model_id,
            "name": NAMES.get(record["id"], record["name"]),
            "source": source,
            "params_billions": size if size is not None else counted_params(arch),
        }
    )
    return arch.model_dump(exclude_defaults=True, exclude_none=True) | {"tied_embeddings": arch.tied_embeddings}


def main(paths: list[str]) -> int:
    out = [entry(Path(p)) for p in paths]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or sorted(str(p) for p in CONFIGS.glob("*.json"))))
