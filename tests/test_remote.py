"""GGUF models on the Hugging Face Hub and in Ollama's library, estimated from their headers.

A real HTTP server on 127.0.0.1 (tests/support/fake_remote.py) serves real GGUF files these tests
write (sparse synthetic models, a split one, a vision projector) and the real demo model, with
range requests, the Hub's listing and resolve shapes and Ollama's registry shapes; ``HF_ENDPOINT``
and ``FITSCOPE_OLLAMA_REGISTRY`` point at it. The server counts every byte it sends.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from app.adapters import remote_gguf
from app.adapters.header_cache import HeaderCache
from app.adapters.remote_gguf import FetchCancelledError, HttpLimits, RemoteError
from app.cli import main
from app.core.common.errors import FitScopeError, ModelFileError
from app.core.model.catalog import find_model, find_projector
from app.core.model.gguf_reader import HeaderIncompleteError, header_from_buffer, read_gguf_header
from app.core.model.projector_file import read_projector
from app.core.model.remote import choose_file, group_gguf_files, parse_hf_ref, parse_ollama_ref, quant_label
from app.core.model.source import model_from_gguf
from app.core.report.choices import Controls, ModelChoice, load_model
from app.services.remote import Fetch, list_remote, load_remote_model, resolve_remote
from tests.support.fake_remote import FakeRemote, HubRepo, OllamaModel
from tests.support.synthetic_gguf import write_sparse_gguf, write_sparse_split_gguf
from tests.support.synthetic_mmproj import write_sparse_mmproj

REPO = "fitscope-test/Llama-3.1-8B-Instruct-GGUF"
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real (sparse) GGUF files: one model in two quantizations, the same split in three parts, a
    Gemma 3 model with its projector."""
    root = tmp_path_factory.mktemp("gguf")
    llama = find_model("llama-3.1-8b")
    out = {
        "q4": root / "Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        "q8": root / "Llama-3.1-8B-Instruct-Q8_0.gguf",
        "gemma": root / "gemma-3-4b-it-Q4_K_M.gguf",
        "mmproj": root / "mmproj-gemma-3-4b-it-F16.gguf",
    }
    write_sparse_gguf(out["q4"], llama, "Q4_K_M")
    write_sparse_gguf(out["q8"], llama, "Q8_0")
    write_sparse_gguf(out["gemma"], find_model("gemma-3-4b"), "Q4_K_M")
    write_sparse_mmproj(out["mmproj"], find_projector("gemma-3-4b").spec())
    split_dir = root / "split"
    split_dir.mkdir()
    parts, _ = write_sparse_split_gguf(split_dir, "Llama-3.1-8B-Instruct-Q6_K", llama, "Q6_K", 3)
    for i, p in enumerate(parts):
        out[f"split{i}"] = p
    return out


@pytest.fixture
def server(files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with FakeRemote() as s:
        s.hub[REPO] = HubRepo(
            {
                files["q4"].name: files["q4"],
                files["q8"].name: files["q8"],
                **{f"Q6_K/{files[f'split{i}'].name}": files[f"split{i}"] for i in range(3)},
            }
        )
        s.hub["fitscope-test/gemma-3-4b-it-GGUF"] = HubRepo(
            {files["gemma"].name: files["gemma"], files["mmproj"].name: files["mmproj"]}
        )
        s.hub["fitscope-test/no-gguf"] = HubRepo({})
        s.ollama["library/gemma3:4b"] = OllamaModel(files["gemma"], files["mmproj"])
        s.ollama["library/llama3.1:8b"] = OllamaModel(files["q4"])
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        monkeypatch.setenv("FITSCOPE_OLLAMA_REGISTRY", s.url)
        monkeypatch.setenv("FITSCOPE_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield s


def head(path: Path, n: int) -> bytes:
    """The first ``n`` bytes of a (sparse, large) file."""
    with path.open("rb") as f:
        return f.read(n)


def cdn_requests(server: FakeRemote) -> list[tuple[str, str, dict[str, str]]]:
    return [r for r in server.requests if r[1].startswith(("/cdn/", "/storage/"))]


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    capsys.readouterr()
    assert main(["estimate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def same_figures(remote: dict, local: dict) -> None:
    """Every figure of two estimate JSONs, but where their files are."""
    assert _placeless(remote) == _placeless(local)


def _placeless(value: object) -> object:
    """``value`` without where its files are (the command's model path, a projector's file)."""
    if isinstance(value, dict):
        where = ("llama_server_command", "file", "file_name", "source")
        return {k: _placeless(v) for k, v in value.items() if k not in where}
    if isinstance(value, list):
        return [_placeless(v) for v in value]
    return value


# -- what people type, and listings (pure) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Qwen3-8B-Q4_K_M.gguf", "Q4_K_M"),
        ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("gemma-3-27b-it-IQ4_XS.gguf", "IQ4_XS"),
        ("Llama-3.3-70B-Instruct-Q8_0-00001-of-00002.gguf", "Q8_0"),
        ("gpt-oss-20b-mxfp4.gguf", "MXFP4"),
        ("qwen2.5-7b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("Q4_K_M/Kimi-K2-Instruct-00001-of-00013.gguf", "Q4_K_M"),
        ("mmproj-model-f16.gguf", "F16"),
        ("Qwen3-8B.gguf", ""),
    ],
)
def test_quantization_is_read_from_the_file_name(name: str, quant: str) -> None:
    assert quant_label(name) == quant


def test_references_people_type() -> None:
    assert parse_hf_ref("bartowski/Qwen3-8B-GGUF") == ("bartowski/Qwen3-8B-GGUF", None, None)
    assert parse_hf_ref("https://huggingface.co/org/r/blob/abc/sub/x-Q4_K_M.gguf") == (
        "org/r",
        "sub/x-Q4_K_M.gguf",
        "abc",
    )
    assert parse_ollama_ref("qwen3:30b") == ("library/qwen3", "30b")
    assert parse_ollama_ref("someone/model") == ("someone/model", "latest")
    for bad in ("justaname", "org/repo/README.md"):
        with pytest.raises(FitScopeError):
            parse_hf_ref(bad)
    with pytest.raises(FitScopeError, match="not an Ollama model name"):
        parse_ollama_ref("Qwen3 30B")


def test_listing_groups_split_parts_and_projectors() -> None:
    models, projectors = group_gguf_files(
        [
            ("Q6_K/m-Q6_K-00002-of-00002.gguf", 50),
            ("Q6_K/m-Q6_K-00001-of-00002.gguf", 60),
            ("m-Q4_K_M.gguf", 70),
            ("m-Q8_0-00001-of-00003.gguf", 10),  # parts 2 and 3 missing
            ("mmproj-F16.gguf", 5),
            ("README.md", 1),
        ]
    )
    assert [(m.quant, m.size_bytes, len(m.parts)) for m in models] == [
        ("Q8_0", 10, 3),
        ("Q4_K_M", 70, 1),
        ("Q6_K", 110, 2),
    ]
    assert models[0].missing_parts == ("m-Q8_0-00002-of-00003.gguf", "m-Q8_0-00003-of-00003.gguf")
    assert [p.path for p in projectors] == ["mmproj-F16.gguf"]


def test_a_prefix_of_a_file_parses_as_the_file_or_asks_for_more(files: dict[str, Path]) -> None:
    data = head(files["gemma"], 2 * MIB)
    size = files["gemma"].stat().st_size
    whole = read_gguf_header(files["gemma"])
    parsed_at = None
    for n in [*range(64), *range(64, whole.data_offset + 1, 997), whole.data_offset]:
        try:
            got = header_from_buffer(files["gemma"], data[:n], n, size)
        except HeaderIncompleteError as more:
            assert parsed_at is None, "a longer prefix never asks for more once one parsed"
            assert n < more.needed_bytes <= whole.data_offset
            continue
        parsed_at = parsed_at or n
        assert got == whole
    assert parsed_at is not None and parsed_at > whole.data_offset - whole.alignment - 997


# -- the Hub ---------------------------------------------------------------------------------------


def test_listing_a_repository(server: FakeRemote, capsys: pytest.CaptureFixture[str]) -> None:
    listing = list_remote("hf", REPO)
    assert listing.revision == server.hub[REPO].sha
    assert [(m.quant, len(m.parts)) for m in listing.models] == [("Q4_K_M", 1), ("Q6_K", 3), ("Q8_0", 1)]
    assert main(["estimate", "--hf", REPO]) == 0
    out = capsys.readouterr().out
    assert "Q6_K/Llama-3.1-8B-Instruct-Q6_K-00001-of-00003.gguf" in out and "    3  " in out
    assert not cdn_requests(server), "listing reads no file"


def test_remote_estimate_equals_the_local_file_reading_one_chunk(
    server: FakeRemote, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["-c", "32768", "--gpu", "rtx-4090"]
    server.reset_counts()
    remote = cli_json(capsys, "--hf", REPO, "--quant", "Q4_K_M", *common)
    header = read_gguf_header(files["q4"]).data_offset
    assert len(cdn_requests(server)) == 1
    assert header < server.file_bytes <= HttpLimits().first_chunk_bytes  # the header plus the rest of one chunk
    same_figures(remote, cli_json(capsys, "--gguf", str(files["q4"]), *common))
    # By path too, and the text output is the same as --gguf's line for line.
    capsys.readouterr()
    assert main(["estimate", "--hf", f"{REPO}/{files['q4'].name}", *common]) == 0
    by_path = capsys.readouterr()
    assert "from the cache" in by_path.err
    assert main(["estimate", "--gguf", str(files["q4"]), *common]) == 0
    local = capsys.readouterr().out
    assert by_path.out.replace(files["q4"].name, "X") == local.replace(str(files["q4"]), "X")


def test_a_long_header_is_read_in_doubling_ranges_and_no_further(server: FakeRemote, demo_gguf: Path) -> None:
    """The demo model's 262,144-token vocabulary makes a 6.2 MiB header."""
    server.hub["google/gemma-3-270m-GGUF"] = HubRepo({demo_gguf.name: demo_gguf})
    server.reset_counts()
    model = load_model(
        ModelChoice(kind="hf", ref=f"google/gemma-3-270m-GGUF/{demo_gguf.name}"), remote=load_remote_model
    )
    local = model_from_gguf(demo_gguf)
    assert (model.arch.model_copy(update={"source": ""}), model.tensors) == (
        local.arch.model_copy(update={"source": ""}),
        local.tensors,
    )
    header = read_gguf_header(demo_gguf).data_offset
    ranges = [tuple(map(int, r[2]["range"][6:].split("-"))) for r in cdn_requests(server)]
    assert ranges[0] == (0, MIB - 1) and len(ranges) == 4
    for (_, end), (start, next_end) in zip(ranges, ranges[1:], strict=False):
        assert start == end + 1 and next_end + 1 >= 2 * start  # contiguous, the prefix at least doubles
    assert header < server.file_bytes <= 2 * header


def test_split_model_reads_every_part(server: FakeRemote, files: dict[str, Path], capsys) -> None:
    common = ["-c", "8192", "--gpu", "rtx-4090"]
    server.reset_counts()
    remote = cli_json(capsys, "--hf", REPO, "--quant", "Q6_K", *common)
    assert len(cdn_requests(server)) == 3  # one range per part
    same_figures(remote, cli_json(capsys, "--gguf", str(files["split0"]), *common))
    assert len(model_from_gguf(files["split0"]).tensors) == 291  # all three parts' tensors


def test_projector_from_the_repository(server: FakeRemote, files: dict[str, Path], capsys) -> None:
    common = ["-c", "8192", "--gpu", "rtx-4090", "--projector"]
    remote = cli_json(capsys, "--hf", "fitscope-test/gemma-3-4b-it-GGUF", "--quant", "Q4_K_M", *common)
    local = cli_json(capsys, "--gguf", str(files["gemma"]), "--mmproj", str(files["mmproj"]), *common[:-1])
    same_figures(remote, local)
    _model, spec, _file = resolve_remote("hf", "fitscope-test/gemma-3-4b-it-GGUF", "Q4_K_M", projector=True)
    assert spec is not None and spec.weights_bytes == read_projector(files["mmproj"]).weights_bytes


def test_second_estimate_is_offline_and_instant(server: FakeRemote, files, monkeypatch, capsys) -> None:
    fetch = Fetch()
    model, _, chosen = resolve_remote("hf", REPO, "Q6_K", fetch=fetch)
    assert len(cdn_requests(server)) == 3 and fetch.from_cache == 0  # one range of each part
    # The server goes away: a port nobody listens on.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", dead)
    pinned = ModelChoice(kind="hf", ref=f"{REPO}/{chosen.path}", revision=server.hub[REPO].sha)
    again = Fetch()
    assert load_remote_model(pinned, again).tensors == model.tensors
    assert again.transfer.requests == 0 and again.from_cache == 3
    # Unpinned, the listing remembered from the last look stands in, and says so.
    listing = list_remote("hf", REPO)
    assert "cannot reach" in listing.note and "last time" in listing.note
    assert len(listing.models) == 3
    assert main(["models", "--remote"]) == 0
    out = capsys.readouterr().out
    assert out.count("Q6_K-0000") == 3 and "llama" in out


def test_a_corrupt_cache_entry_is_moved_aside_and_fetched_again(server: FakeRemote, tmp_path: Path) -> None:
    choice = ModelChoice(kind="hf", ref=f"{REPO}/Llama-3.1-8B-Instruct-Q8_0.gguf", revision=server.hub[REPO].sha)
    first = load_remote_model(choice)
    cache = HeaderCache()
    (entry,) = list(cache.root.glob("*.ghdr"))
    entry.write_bytes(entry.read_bytes()[:200])  # cut
    fetch = Fetch()
    assert load_remote_model(choice, fetch).tensors == first.tensors
    assert fetch.transfer.requests == 2  # the Hub's redirect, one range
    assert list(cache.root.glob("*.ghdr.corrupt"))
    # Bytes that are well-formed for the cache but not a header: moved aside too.
    (entry,) = list(cache.root.glob("*.ghdr"))
    data = entry.read_bytes()
    start = data.index(b"\n", data.index(b"\n") + 1) + 1
    entry.write_bytes(data[:start] + b"XXXX" + data[start + 4 :])
    assert load_remote_model(choice).tensors == first.tensors


# -- Ollama ----------------------------------------------------------------------------------------


def test_ollama_model_and_projector(server: FakeRemote, files: dict[str, Path], capsys) -> None:
    common = ["-c", "8192", "--gpu", "rtx-4090"]
    server.reset_counts()
    remote = cli_json(capsys, "--ollama", "gemma3:4b", *common, "--projector")
    assert len(cdn_requests(server)) == 2  # the model's header, the projector's
    assert all(r[1].startswith("/storage/sha256:") for r in cdn_requests(server))
    same_figures(remote, cli_json(capsys, "--gguf", str(files["gemma"]), "--mmproj", str(files["mmproj"]), *common))
    same_figures(
        cli_json(capsys, "--ollama", "llama3.1:8b", *common, "--consumer", "ollama"),
        cli_json(capsys, "--gguf", str(files["q4"]), *common, "--consumer", "ollama"),
    )


def test_ollama_consumer_follows_its_batch_sizes() -> None:
    s = Controls(consumer="ollama", context_per_user_tokens=8192).settings()
    assert (s.batch_tokens, s.ubatch_tokens, s.swa_full, s.n_outputs_max) == (1024, 1024, False, 1)
    s = Controls(consumer="ollama", context_per_user_tokens=4096).settings()
    assert (s.batch_tokens, s.ubatch_tokens) == (512, 512)
    s = Controls(consumer="ollama", context_per_user_tokens=65536).settings()
    assert s.batch_tokens == 2048


# -- failures: one sentence each -------------------------------------------------------------------


def failure(call, *args, **kwargs) -> str:
    with pytest.raises(FitScopeError) as exc:
        call(*args, **kwargs)
    message = str(exc.value)
    assert message.endswith((".", ")")) and "\n" not in message and "Traceback" not in message
    return message


def test_offline(server: FakeRemote, monkeypatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("FITSCOPE_OLLAMA_REGISTRY", f"http://127.0.0.1:{port}")
    assert "cannot reach 127.0.0.1" in failure(list_remote, "hf", REPO)
    assert "cannot reach 127.0.0.1" in failure(list_remote, "ollama", "gemma3:4b")


def test_timeout(server: FakeRemote) -> None:
    server.mode, server.hang_s = "hang", 3.0
    fetch = Fetch(limits=HttpLimits(read_timeout_s=0.3))
    message = failure(load_remote_model, ModelChoice(kind="ollama", ref="gemma3:4b"), fetch)
    assert "stopped answering for 0.3 s" in message


def test_missing_gated_and_empty_repositories(server: FakeRemote, monkeypatch) -> None:
    assert "No model repository fitscope-test/nothing" in failure(list_remote, "hf", "fitscope-test/nothing")
    server.hub[REPO].gated_token = "secret"
    assert "gated" in failure(list_remote, "hf", REPO)
    # With the token: listed and read; the token goes to the Hub, never to the CDN's other host.
    monkeypatch.setenv("HF_TOKEN", "secret")
    server.reset_counts()
    resolve_remote("hf", REPO, "Q8_0")
    resolve = [r for r in server.requests if "/resolve/" in r[1]]
    assert resolve and all(r[2].get("authorization") == "Bearer secret" for r in resolve)
    assert cdn_requests(server) and all("authorization" not in r[2] for r in cdn_requests(server))
    # A file of a gated repository without the token: 401, said so.
    monkeypatch.delenv("HF_TOKEN")
    choice = ModelChoice(kind="hf", ref=f"{REPO}/Llama-3.1-8B-Instruct-Q4_K_M.gguf", revision=server.hub[REPO].sha)
    assert "refused access" in failure(load_remote_model, choice) and "HF_TOKEN" in failure(load_remote_model, choice)
    server.hub[REPO].gated_token = None
    assert "holds no GGUF model" in failure(resolve_remote, "hf", "fitscope-test/no-gguf", "Q4_K_M")
    assert "has no Q5_K_M file. It has: Q4_K_M, Q6_K, Q8_0." in failure(choose_file, list_remote("hf", REPO), "Q5_K_M")
    assert "has no nothing:1b" in failure(list_remote, "ollama", "nothing:1b")
    server.ollama["library/tensors:1b"] = OllamaModel(Path(), with_model_layer=False)
    assert "no GGUF model layer" in failure(list_remote, "ollama", "tensors:1b")


def test_truncated_and_corrupt_headers(server: FakeRemote, files: dict[str, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut-Q4_K_M.gguf"
    cut.write_bytes(head(files["q4"], 5000))
    bad = tmp_path / "bad-Q4_K_M.gguf"
    data = bytearray(head(files["q4"], 100_000))
    data[24:32] = (1 << 40).to_bytes(8, "little")  # the first key's length: longer than the file
    bad.write_bytes(bytes(data))
    server.hub["fitscope-test/broken"] = HubRepo({cut.name: cut, bad.name: bad})
    sha = server.hub["fitscope-test/broken"].sha
    message = failure(load_remote_model, ModelChoice(kind="hf", ref=f"fitscope-test/broken/{cut.name}", revision=sha))
    assert "ends inside the header" in message
    message = failure(load_remote_model, ModelChoice(kind="hf", ref=f"fitscope-test/broken/{bad.name}", revision=sha))
    assert "is corrupt" in message and "more than the whole file" in message


def test_hostile_servers(server: FakeRemote) -> None:
    choice = ModelChoice(kind="hf", ref=f"{REPO}/Llama-3.1-8B-Instruct-Q8_0.gguf", revision=server.hub[REPO].sha)
    server.mode = "ignore-range"
    server.reset_counts()
    assert "ignores range requests" in failure(load_remote_model, choice)
    server.mode = "oversend"
    assert "refuses a response other than the one it asked for" in failure(load_remote_model, choice)
    server.mode = "redirect-loop"
    assert "redirected more than 5 times" in failure(load_remote_model, choice)
    server.mode = "status"
    assert "HTTP 500" in failure(load_remote_model, choice)
    server.mode = ""
    small = Fetch(limits=HttpLimits(first_chunk_bytes=4096))
    assert load_remote_model(choice, small).tensors  # a small first chunk: more ranges, the same model
    assert small.transfer.requests > 2


def test_header_longer_than_the_limit_is_refused(server: FakeRemote, demo_gguf: Path, monkeypatch) -> None:
    server.hub["google/gemma-3-270m-GGUF"] = HubRepo({demo_gguf.name: demo_gguf})
    monkeypatch.setattr(remote_gguf, "MAX_HEADER_BYTES", 2 * MIB)
    server.reset_counts()
    choice = ModelChoice(kind="hf", ref=f"google/gemma-3-270m-GGUF/{demo_gguf.name}", revision="0" * 40)
    message = failure(load_remote_model, choice)
    assert "header longer than 2 MiB" in message
    assert server.file_bytes <= 2 * MIB


def test_cancel_stops_the_fetch(server: FakeRemote) -> None:
    fetch = Fetch(cancelled=lambda: True)
    with pytest.raises(FetchCancelledError):
        load_remote_model(ModelChoice(kind="ollama", ref="gemma3:4b"), fetch)


def test_a_remote_choice_needs_the_reader() -> None:
    with pytest.raises(FitScopeError, match="on a server"):
        load_model(ModelChoice(kind="hf", ref="org/repo/x.gguf"))


def test_errors_are_remote_errors_or_file_errors(server: FakeRemote) -> None:
    with pytest.raises(RemoteError):
        list_remote("hf", "fitscope-test/nothing")
    with pytest.raises(ModelFileError):
        server.hub["fitscope-test/text"] = HubRepo({"x-Q4_K_M.gguf": Path(__file__)})
        load_remote_model(ModelChoice(kind="hf", ref="fitscope-test/text/x-Q4_K_M.gguf", revision="1" * 40))
