"""The tiny random-weight Llama GGUF: llama.cpp loads it, tokenizes with it and generates from it.

Each model is a few hundred kilobytes and loads and generates in milliseconds, so the real
llama.cpp runs in-process here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from app.core.model.gguf_model import read_gguf
from tests.support.tiny_gguf import MODEL_NAME, TINY_PROMPT, WEIGHT_TYPES, n_params, tiny_vocab, write_tiny_llama

if TYPE_CHECKING:
    from llama_cpp import Llama

pytestmark = [
    pytest.mark.llamacpp,
    pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"),
]

# Bytes per weight of each type (q8_0: 32 int8 plus one f16 scale per block of 32).
BYTES_PER_WEIGHT = {"f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}
N_GENERATED = 16


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {wt: write_tiny_llama(root / f"tiny-{wt}.gguf", weight_type=wt) for wt in WEIGHT_TYPES}


@pytest.fixture(scope="module", params=list(WEIGHT_TYPES))
def llm(request: pytest.FixtureRequest, models: dict[str, Path]) -> Iterator[Llama]:
    from llama_cpp import Llama

    model = Llama(model_path=str(models[request.param]), n_ctx=256, n_threads=2, seed=0, verbose=False)
    yield model
    model.close()


def greedy(llm: Llama, n: int) -> list[int]:
    tokens = llm.tokenize(TINY_PROMPT.encode())
    llm.reset()
    return list(islice(llm.generate(tokens, temp=0.0), n))


@pytest.mark.parametrize("weight_type", list(WEIGHT_TYPES))
def test_file_size_is_dominated_by_the_weights(models: dict[str, Path], weight_type: str) -> None:
    n_vocab = len(tiny_vocab()[0])
    weights = n_params(n_vocab=n_vocab) * BYTES_PER_WEIGHT[weight_type]
    size = models[weight_type].stat().st_size
    # Norms are f32 whatever the type; the header (vocabulary included) is some tens of kilobytes.
    assert weights < size < weights + 100_000


def test_reader_sees_the_written_shape(models: dict[str, Path]) -> None:
    for weight_type, path in models.items():
        model = read_gguf(path)
        arch = model.architecture
        assert model.arch == "llama"
        assert model.name == MODEL_NAME
        assert model.tokenizer_model == "llama"
        assert model.file_type == int(WEIGHT_TYPES[weight_type][1])
        assert (arch.n_layer, arch.n_embd, arch.n_head, arch.n_head_kv, arch.n_ff) == (2, 64, 4, 2, 128)
        assert arch.n_vocab == len(tiny_vocab()[0])
        assert arch.n_ctx_train == 2048
        assert not arch.tied_embeddings
        assert model.file_size_bytes - 100_000 < model.weights_bytes < model.file_size_bytes


def test_reader_sees_other_shapes(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", n_layer=3, n_embd=96, n_head=6, n_head_kv=3, n_ff=160, seed=7)
    arch = read_gguf(path).architecture
    assert (arch.n_layer, arch.n_embd, arch.n_head, arch.n_head_kv, arch.n_ff) == (3, 96, 6, 3, 160)


def test_same_arguments_write_the_same_file(tmp_path: Path) -> None:
    a = write_tiny_llama(tmp_path / "a.gguf", weight_type="q8_0", seed=3)
    b = write_tiny_llama(tmp_path / "b.gguf", weight_type="q8_0", seed=3)
    c = write_tiny_llama(tmp_path / "c.gguf", weight_type="q8_0", seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_vocabulary_layout() -> None:
    tokens, scores, types = tiny_vocab()
    assert tokens[:4] == ["<unk>", "<s>", "</s>", "<pad>"]
    assert tokens[4] == "<0x00>" and tokens[259] == "<0xFF>"
    assert set(types[4:260]) == {6}
    assert len(tokens) == len(set(tokens)) == len(scores) == len(types)
    assert len(tokens) % 32 == 0


def test_tokenize_round_trips(llm: Llama) -> None:
    tokens = llm.tokenize(TINY_PROMPT.encode())
    assert 10 <= len(tokens) <= 80
    assert tokens[0] == 1  # add_bos_token
    assert llm.detokenize(tokens).decode().strip() == TINY_PROMPT
    # Text outside the word list falls back to characters and bytes, and still round-trips.
    odd = "Zebras quizzically juggle 42 naïve émigrés!\n"
    assert llm.detokenize(llm.tokenize(odd.encode())).decode().strip() == odd.strip()


def test_greedy_generation_is_repeatable(llm: Llama) -> None:
    from llama_cpp import Llama

    first = greedy(llm, N_GENERATED)
    assert len(first) == N_GENERATED
    assert greedy(llm, N_GENERATED) == first
    fresh = Llama(model_path=llm.model_path, n_ctx=256, n_threads=2, seed=0, verbose=False)
    try:
        assert greedy(fresh, N_GENERATED) == first
    finally:
        fresh.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_embd": 64, "n_head": 5},
        {"n_head": 4, "n_head_kv": 3},
        {"weight_type": "q4_0"},
        {"weight_type": "q8_0", "n_ff": 100},
        {"n_layer": 0},
    ],
)
def test_bad_arguments_raise(tmp_path: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        write_tiny_llama(tmp_path / "bad.gguf", **kwargs)  # type: ignore[arg-type]
    assert not (tmp_path / "bad.gguf").exists()
