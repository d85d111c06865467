"""Write a tiny, real Llama-architecture GGUF file that llama.cpp loads, tokenizes with and runs.

Used by fast tests and benchmarks of the generation runner, which need a model that actually
generates tokens without shipping or downloading one. Unlike :mod:`tests.support.synthetic_gguf`
(sparse zeros, for measuring allocations), every byte here is written: the weights are seeded
random numbers, so the model writes gibberish, but it does so at the speed of a real model of
that shape and type.

The tokenizer is a SentencePiece-style ("llama") vocabulary laid out like Llama 2's:

* ``<unk>`` (0), ``<s>`` (1), ``</s>`` (2), ``<pad>`` (3), then the 256 byte-fallback tokens
  ``<0x00>``..``<0xFF>`` (type BYTE), so any text at all can be tokenized;
* the word-start marker ``▁`` alone, every printable ASCII character, and ``▁`` + each of a few
  hundred common English words *together with every prefix of it* (``▁t``, ``▁th``, ``▁the``).
  llama.cpp's SPM tokenizer only ever merges two adjacent pieces whose concatenation is in the
  vocabulary, so a word is reachable as one token only if its whole prefix chain is; with the
  chain present, common lowercase words become one token each, other words become their longest
  known prefix plus single characters, and anything non-ASCII falls back to bytes;
* ``<unused_N>`` pieces (type UNUSED) that pad the vocabulary to a multiple of 32, as the real
  converters do; nothing tokenizes to them.

``token_embd`` and ``output`` are stored in ``weight_type`` like the other matrices (their rows
are ``n_embd`` wide, so q8_0 needs only ``n_embd`` to be a multiple of 32); norms stay f32, as
llama.cpp's converter keeps them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType
from gguf.quants import quantize

__all__ = ["TINY_PROMPT", "WEIGHT_TYPES", "n_params", "tiny_vocab", "write_tiny_llama"]

TINY_PROMPT = (
    "The old man went to the market in the morning and bought some bread, milk and fresh fruit "
    "for his family because they were going to have a long day at the house."
)

# weight_type -> (ggml type of the matrices, general.file_type)
WEIGHT_TYPES: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
}

MODEL_NAME = "FitScope tiny test model"
_Q8_0_BLOCK = 32
_WEIGHT_STD = 0.02  # small enough that activations stay finite through any number of layers
_WORD_START = "\u2581"  # SentencePiece's "▁", which stands for a space before a word

# A few hundred common English words, kept as text so the list stays readable.
_WORD_TEXT = """
the of and to in is was it for on with as at by from that this be are or an not but have has had
his her their they we you he she i me my our your its them him us who what which when where why
how all any each every some many much more most other such no nor only own same so than too very
can will just should now would could may might must shall do does did done been being were am
one two three four five six seven eight nine ten first second last new old good great little long
small large big high low young right left next early late few best better own well also back
still even here there then again never always often about after before over under into out up
down off through between during without within against among around because while if until
time year day week month night morning evening people man woman child children family world life
hand part place case point way home house water room money story fact book word words side kind
head eye face city country school state name work number group problem question system program
end member area line law car market bread milk fruit food tree river road light fire sun moon
go goes going went make made take took come came see saw know knew get got give gave find found
think thought tell told say said ask asked feel felt try tried leave left call called keep kept
let begin began seem seemed help helped show showed hear heard play played run ran move moved
live lived believe bring brought happen write wrote sit sat stand stood lose lost pay paid meet
buy bought open opened walk walked talk talked turn turned start started look looked want wanted
use used need needed like liked love loved fresh quick brown fox jumps lazy dog cat red blue
green white black dark warm cold hot happy sad true false model test token text fast slow
"""
_WORDS = _WORD_TEXT.split()

# Sentence starters get a capitalised chain of their own, so "The" is one token as in real vocabularies.
_STARTER_TEXT = "the a an it in on this that we i he she they there what when how if but and"
_CAPITALISED = _STARTER_TEXT.split()


def tiny_vocab() -> tuple[list[str], list[float], list[int]]:
    """The tokenizer's pieces, scores and token types, in vocabulary order."""
    tokens: list[str] = ["<unk>", "<s>", "</s>", "<pad>"]
    types: list[int] = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TokenType.BYTE] * 256

    pieces: dict[str, None] = {_WORD_START: None}  # an ordered set
    # Every printable ASCII character, so ordinary text never needs a byte token.
    for code in range(33, 127):
        pieces[chr(code)] = None
    for word in _WORDS + [w.capitalize() for w in _CAPITALISED]:
        full = _WORD_START + word
        for end in range(2, len(full) + 1):
            pieces[full[:end]] = None
    for piece in pieces:
        tokens.append(piece)
        types.append(TokenType.NORMAL)

    padded = -(-len(tokens) // 32) * 32
    for i in range(padded - len(tokens)):
        tokens.append(f"<unused_{i}>")
        types.append(TokenType.UNUSED)

    # SPM merges the highest-scoring pair first; longer pieces winning keeps a word in one piece.
    scores = [float(len(t)) if ty == TokenType.NORMAL else 0.0 for t, ty in zip(tokens, types, strict=True)]
    return tokens, scores, [int(t) for t in types]


def _check(n_embd: int, n_head: int, n_head_kv: int, n_ff: int, n_layer: int, weight_type: str) -> None:
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {', '.join(WEIGHT_TYPES)}, not {weight_type!r}")
    sizes = {"n_layer": n_layer, "n_embd": n_embd, "n_head": n_head, "n_head_kv": n_head_kv, "n_ff": n_ff}
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be at least 1 (got {value})")
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) is not a multiple of n_head ({n_head})")
    if n_head % n_head_kv:
        raise ValueError(f"n_head ({n_head}) is not a multiple of n_head_kv ({n_head_kv})")
    if (n_embd // n_head) % 2:
        raise ValueError(f"the head width n_embd / n_head = {n_embd // n_head} must be even for RoPE")
    if weight_type == "q8_0":
        # q8_0 quantizes each row in blocks of 32: every matrix row (n_embd or n_ff wide) must fill whole blocks.
        for name, value in (("n_embd", n_embd), ("n_ff", n_ff)):
            if value % _Q8_0_BLOCK:
                raise ValueError(f"q8_0 needs {name} to be a multiple of {_Q8_0_BLOCK} (got {value})")


def write_tiny_llama(
    path: str | os.PathLike[str],
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_ctx_train: int = 2048,
    seed: int = 0,
    weight_type: str = "f32",
    chat_template: str | None = None,
) -> Path:
    """Write a tiny random-weight Llama model with a working tokenizer to ``path`` and return the path.

    ``weight_type`` ("f32", "f16" or "q8_0") is the type of every matrix; norms stay f32. The same
    arguments always give the same file. Raises ValueError for shapes llama.cpp would reject.
    """
    _check(n_embd, n_head, n_head_kv, n_ff, n_layer, weight_type)
    if n_ctx_train < 1:
        raise ValueError(f"n_ctx_train must be at least 1 (got {n_ctx_train})")
    qtype, file_type = WEIGHT_TYPES[weight_type]
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    tokens, scores, types = tiny_vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def matrix(n_in: int, n_out: int) -> tuple[np.ndarray, GGMLQuantizationType | None]:
        # ggml's ne is [n_in, n_out]; numpy holds it reversed, one row per output.
        w = (rng.standard_normal((n_out, n_in), dtype=np.float32) * _WEIGHT_STD).astype(np.float32)
        if qtype == GGMLQuantizationType.F32:
            return w, None
        if qtype == GGMLQuantizationType.F16:
            return w.astype(np.float16), None
        return quantize(w, qtype), qtype

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(path, "llama")
    try:
        writer.add_name(MODEL_NAME)
        writer.add_file_type(int(file_type))
        writer.add_context_length(n_ctx_train)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_dimension_count(head_dim)
        writer.add_vocab_size(n_vocab)

        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_pad_token_id(3)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        if chat_template is not None:
            writer.add_chat_template(chat_template)

        def add(name: str, n_in: int, n_out: int) -> None:
            data, raw = matrix(n_in, n_out)
            writer.add_tensor(name, data, raw_dtype=raw)

        def add_norm(name: str) -> None:
            writer.add_tensor(name, np.ones(n_embd, dtype=np.float32))

        add("token_embd.weight", n_embd, n_vocab)
        for i in range(n_layer):
            add_norm(f"blk.{i}.attn_norm.weight")
            add(f"blk.{i}.attn_q.weight", n_embd, n_embd)
            add(f"blk.{i}.attn_k.weight", n_embd, n_embd_kv)
            add(f"blk.{i}.attn_v.weight", n_embd, n_embd_kv)
            add(f"blk.{i}.attn_output.weight", n_embd, n_embd)
            add_norm(f"blk.{i}.ffn_norm.weight")
            add(f"blk.{i}.ffn_gate.weight", n_embd, n_ff)
            add(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
            add(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
        add_norm("output_norm.weight")
        add("output.weight", n_embd, n_vocab)

        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def n_params(
    *, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128, n_vocab: int
) -> int:
    """Number of weights in the model :func:`write_tiny_llama` writes for these shapes."""
    n_embd_kv = n_embd // n_head * n_head_kv
    per_layer = 2 * n_embd + 2 * n_embd * n_embd + 2 * n_embd * n_embd_kv + 3 * n_embd * n_ff
    return 2 * n_vocab * n_embd + n_embd + n_layer * per_layer
