"""What the fuzz harness feeds FitScope, and how each case ended.

Three targets, each a plain function of one input that never raises: GGUF headers (written to a
file and read, then estimated when accepted), config.json contents (read, then estimated) and
command lines (``fitscope`` in this process, output captured). An outcome is one of:

- ``clean``: refused with FitScope's own one-line message;
- ``accepted``: read and estimated without complaint;
- ``traceback``: any other exception (a defect);
- ``hang``: longer than HANG_S seconds (a defect);
- ``memory``: Python allocations above MEMORY_LIMIT_BYTES while reading a header-only input.

Used by tests/test_fuzz.py (a quick Hypothesis run) and scripts/fuzz.py (a long run with counts).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import signal
import struct
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app import cli
from app.core.common.errors import FitScopeError
from app.core.memory.estimate import estimate
from app.core.memory.records import MAX_CONTEXT_TOKENS, Settings, Target
from app.core.model.gguf_model import read_gguf
from app.core.model.hf_config import read_hf_config

HANG_S = 5.0
MEMORY_LIMIT_BYTES = 300 * 1024**2
_CPU = Target(name="CPU", kind="cpu", capacity_bytes=1 << 40, bandwidth_gb_s=50, fp16_tflops=1, efficiency_class="cpu")


@dataclass(frozen=True)
class Outcome:
    kind: str  # clean | accepted | traceback | hang | memory
    seconds: float
    peak_bytes: int
    detail: str = ""


class _HangError(Exception):
    pass


def _alarm(_signum: int, _frame: Any) -> None:
    raise _HangError


def _guarded(work) -> Outcome:
    """Runs ``work()`` (which returns "clean" or "accepted") under a time limit and allocation
    tracking; any other exception is a traceback outcome."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        kind, detail = work(), ""
    except _HangError:
        kind, detail = "hang", ""
    except Exception as exc:
        kind, detail = "traceback", f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    seconds = time.perf_counter() - started
    if kind in ("clean", "accepted") and peak > MEMORY_LIMIT_BYTES:
        kind = "memory"
    return Outcome(kind, seconds, peak, detail)


def _estimate_small(arch, tensors) -> None:
    ctx = max(256, min(4096, arch.n_ctx_train, MAX_CONTEXT_TOKENS))
    estimate(arch, tensors, Settings(context_tokens=ctx), [_CPU])


# -- GGUF headers ---------------------------------------------------------------------------------


def gguf_case(data: bytes, path: Path) -> Outcome:
    path.write_bytes(data)

    def work() -> str:
        try:
            model = read_gguf(path)
            _estimate_small(model.architecture, model.tensors)
        except FitScopeError:
            return "clean"
        return "accepted"

    return _guarded(work)


def mutate_gguf(seed: bytes, rng: random.Random) -> bytes:
    """Structure-aware mutations of a GGUF: length and count fields set to extreme values, bytes
    flipped, the file cut or a region repeated."""
    data = bytearray(seed)
    for _ in range(rng.randint(1, 4)):
        header_end = min(len(data), 4096)
        kind = rng.random()
        if kind < 0.45 and header_end > 16:
            # A u64 or u32 field (lengths, counts, dims, offsets) at an aligned-ish position.
            pos = rng.randrange(4, header_end - 8)
            value = rng.choice(
                [0, 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, 240_000_000, rng.randrange(1 << 20)]
            )
            if rng.random() < 0.5:
                data[pos : pos + 8] = struct.pack("<Q", value % (1 << 64))
            else:
                data[pos : pos + 4] = struct.pack("<I", value % (1 << 32))
        elif kind < 0.75 and header_end > 0:
            pos = rng.randrange(header_end)
            data[pos] = rng.randrange(256)
        elif kind < 0.9:
            del data[rng.randrange(max(1, len(data))) :]
        else:
            start = rng.randrange(max(1, header_end))
            end = min(len(data), start + rng.randrange(1, 64))
            data[start:start] = data[start:end] * rng.randint(1, 4)
    return bytes(data)


# -- config.json ----------------------------------------------------------------------------------

CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "vocab_size",
    "head_dim",
    "sliding_window",
    "layer_types",
    "attention_bias",
    "tie_word_embeddings",
    "num_local_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "text_config",
)
MODEL_TYPES = (
    "llama",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma3_text",
    "gemma2",
    "mistral",
    "phi3",
    "gpt_oss",
    "mamba",
    "x",
)


def config_case(config: Any) -> Outcome:
    def work() -> str:
        try:
            arch = read_hf_config(config if isinstance(config, dict) else {"model_type": config})
            from app.core.model.quant import find_preset, quantize_layout

            _estimate_small(arch, quantize_layout(arch, find_preset("Q4_K_M")))
        except FitScopeError:
            return "clean"
        return "accepted"

    return _guarded(work)


def random_config(rng: random.Random) -> dict:
    base = {
        "model_type": rng.choice(MODEL_TYPES),
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "max_position_embeddings": 2048,
        "vocab_size": 1000,
    }
    values = [
        0,
        -1,
        1,
        7,
        2**31,
        10**9,
        10**30,
        1e300,
        float("nan"),
        float("inf"),
        -0.5,
        "false",
        "no",
        "12",
        None,
        True,
        [],
        [1, 2],
        {"a": 1},
        ["sliding_attention"] * rng.randint(0, 5000),
    ]
    for _ in range(rng.randint(1, 5)):
        base[rng.choice(CONFIG_KEYS)] = rng.choice(values)
    return base


# -- command lines -------------------------------------------------------------------------------

_FLAG_VALUES = (
    "0",
    "-1",
    "1",
    "nan",
    "inf",
    "-inf",
    "1e300",
    "99999999999999",
    "abc",
    "",
    "q8_0",
    "f16",
    "\x1b[31m",
    "auto",
)
_ESTIMATE_FLAGS = (
    "-c",
    "-b",
    "-ub",
    "-np",
    "-ngl",
    "-ctk",
    "-ctv",
    "-fa",
    "--host-ram-gib",
    "--quant",
    "--n-cpu-moe",
    "--fit-target",
    "--backend",
    "--consumer",
    "-p",
)


def random_command(rng: random.Random, scratch: Path) -> list[str]:
    command = rng.choice(["estimate", "estimate", "estimate", "plan", "models", "gpus"])
    argv = [command]
    if command in ("estimate", "plan"):
        argv += ["--model", rng.choice(["llama-3.1-8b", "qwen3-30b-a3b", "gpt-oss-20b", "nope", "mamba-130m"])]
        if command == "estimate":
            argv += rng.choice([["--gpu", "rtx-4090"], ["--gpu", "dgx-spark"], ["--gpu", "epyc-9655"], ["--gpu", "x"]])
        else:
            argv += ["--gpu", rng.choice(["rtx-4090", "h100-sxm", "zz"])]
        for _ in range(rng.randint(0, 4)):
            argv += [rng.choice(_ESTIMATE_FLAGS), rng.choice(_FLAG_VALUES)]
    if rng.random() < 0.3:
        argv.append("--json")
    if rng.random() < 0.1:
        argv += ["--gguf", rng.choice([str(scratch / "missing.gguf"), str(scratch), "/dev/null"])]
    return argv


def command_case(argv: list[str]) -> Outcome:
    def work() -> str:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(argv)
        text = err.getvalue().strip()
        if rc == 1 or "Traceback" in text:
            raise RuntimeError(f"fitscope {' '.join(argv)!r} -> {text[:200]}")
        if rc not in (0, 2) or (rc == 2 and (len(text.splitlines()) != 1 or not text.startswith("fitscope"))):
            raise RuntimeError(f"fitscope {' '.join(argv)!r} exited {rc}: {text[:200]!r}")
        if rc == 0 and "--json" in argv:
            json.loads(out.getvalue())
        return "accepted" if rc == 0 else "clean"

    return _guarded(work)


def small_seeds(folder: Path) -> list[bytes]:
    """Small valid GGUFs of three shapes (dense, tied, MoE) written into ``folder``, as bytes."""
    from tests.test_gguf_reader import write_gguf

    files = [
        write_gguf(folder / "llama.gguf"),
        write_gguf(folder / "tied.gguf", tied=True, n_layer=2),
        write_gguf(
            folder / "moe.gguf",
            extra=lambda w: (w.add_expert_count(4), w.add_expert_used_count(2)),
            tensors={"blk.0.ffn_up_exps.weight": np.zeros((4, 128, 64), dtype=np.float32)},
        ),
    ]
    return [p.read_bytes() for p in files]


# -- what the data folder and downloaded files control ---------------------------------------------
#
# Chat templates, suites, kept runs and settings files. Each case is bounded: FILE_HANG_S of wall
# time (SIGALRM) and FILE_MEMORY_LIMIT_BYTES of peak resident memory; a template renders through
# the product's own child process (time and memory limited there), whose peak memory is read back.

FILE_HANG_S = 10.0
FILE_MEMORY_LIMIT_BYTES = 1024**3
_N = (0, 1, 7, 300, 100_000, 10**6, 10**9, 2**31, -1)


def _peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _guarded_file(work) -> Outcome:
    """A case of the file surfaces: FILE_HANG_S of wall time (SIGALRM), and the process's peak
    resident memory held against FILE_MEMORY_LIMIT_BYTES (a case that raises the peak above it is a
    memory outcome; a MemoryError too). Python's allocation tracing is not used here: it slows the
    regex engine tenfold, and the limit is on the process."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, FILE_HANG_S)
    before = _peak_rss_bytes()
    started = time.perf_counter()
    try:
        kind, detail = work(), ""
    except _HangError:
        kind, detail = "hang", ""
    except MemoryError:
        kind, detail = "memory", "MemoryError"
    except Exception as exc:
        kind, detail = "traceback", f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    peak = _peak_rss_bytes()
    if kind in ("clean", "accepted") and peak > max(before, FILE_MEMORY_LIMIT_BYTES):
        kind = "memory"
    return Outcome(kind, time.perf_counter() - started, peak, detail)


_TEMPLATE_PIECES = (
    "{{ messages[0].content }}",
    "{% for m in messages %}<|{{ m.role }}|>{{ m['content'] }}{% endfor %}",
    "{% if add_generation_prompt %}<|assistant|>{% endif %}",
    "{{ bos_token }}{{ eos_token }}",
    "{{ 'x' * N }}",
    "{{ [1] * N }}",
    "{{ '%Nd' % 1 }}",
    "{{ '%.Nf' % 1.5 }}",
    "{{ '{:N}'.format(1) }}",
    "{{ lipsum(n=N) }}",
    "{{ 'a'.ljust(N) }}",
    "{{ 'ab' | center(N) }}",
    "{{ messages | tojson(indent=N) }}",
    "{{ 2 ** N }}",
    "{{ range(N) | list | length }}",
    "{% for i in range(N) %}{{ i }}{% endfor %}",
    "{% for i in range(N) %}{% for j in range(N) %}{% endfor %}{% endfor %}",
    "{% set ns = namespace(s='x') %}{% for i in range(N) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% set ns = namespace(s=[1]) %}{% for i in range(N) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ raise_exception('no system role') }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ messages | join('x' * N) }}",
    "{{ ('x' * 1000) | replace('x', 'y' * N) }}",
    "{% if %}",
    "{{ 1 / 0 }}",
    "{{ messages[N] }}",
    "{{ undefined_thing.attr }}",
)


def random_template(rng: random.Random) -> str:
    """A chat template of a few pieces, numbers taken from extremes, sometimes nested in a loop or
    an if, sometimes deeply nested or very long."""
    pieces = []
    for _ in range(rng.randint(1, 4)):
        piece = rng.choice(_TEMPLATE_PIECES).replace("N", str(rng.choice(_N)))
        if rng.random() < 0.2:
            piece = f"{{% for k in range({rng.choice(_N)}) %}}{piece}{{% endfor %}}"
        pieces.append(piece)
    template = "".join(pieces)
    roll = rng.random()
    if roll < 0.03:
        depth = rng.choice([100, 1000, 5000])
        template = "{% if true %}" * depth + template + "{% endif %}" * depth
    elif roll < 0.05:
        template *= rng.choice([1000, 20000])
    return template


def template_case(template: str) -> Outcome:
    """One template through the product's renderer (a child held to its time and memory limits)."""
    import resource

    from app.adapters.chat_render import render_conversations
    from app.core.quality.chat import ChatTemplateError

    def work() -> str:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        (result,) = render_conversations(template, [messages], "<s>", "</s>")
        if isinstance(result, ChatTemplateError):
            text = str(result)
            if not text.startswith(("this model's chat template", "the model's chat template")):
                raise RuntimeError(f"not a template sentence: {text[:200]}")
            return "clean"
        return "accepted"

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    outcome = _guarded_file(work)
    # The largest child so far: a new peak above the limit can only be this case's renderer.
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    if outcome.kind in ("clean", "accepted") and child_peak > max(before, FILE_MEMORY_LIMIT_BYTES):
        return Outcome("memory", outcome.seconds, child_peak, "the renderer child")
    return Outcome(outcome.kind, outcome.seconds, max(outcome.peak_bytes, child_peak), outcome.detail)


_PATTERNS = ("^(a|aa)+$", "(x+x+)+y", "^\\d{3}-\\d{4}$", "[", "(?<=a+)b", "a{1000000}", "(.*a){30}", "^(\\w+\\s?)*$")
_REFS = ("#", "#/$defs/a", "#/$defs/missing", "https://example.com/s.json", "other.json#/x", "#/properties/k")


def random_suite(rng: random.Random) -> tuple[str, list[str]]:
    """A suite file's text (JSON) with one or two prompts whose checks use random regexes, schema
    patterns and $refs, long or hostile answer prefixes; and answers to check against them."""

    def schema() -> dict:
        out: dict = {"type": rng.choice(["object", "array", "string"])}
        if rng.random() < 0.5:
            out["properties"] = {"k": {"type": "string", "pattern": rng.choice(_PATTERNS)}}
        if rng.random() < 0.3:
            out["patternProperties"] = {rng.choice(_PATTERNS): {"type": "string"}}
            out["additionalProperties"] = rng.random() < 0.5
        if rng.random() < 0.4:
            out["$defs"] = {"a": {"$ref": rng.choice(_REFS)} if rng.random() < 0.5 else {"type": "string"}}
            out["$ref"] = rng.choice(_REFS)
        if rng.random() < 0.05:
            deep: dict = {"type": "object"}
            for _ in range(rng.choice([40, 200])):
                deep = {"type": "object", "properties": {"d": deep}}
            out["properties"] = {"d": deep}
        return out

    prompts = []
    for i in range(rng.randint(1, 2)):
        kind = rng.choice(["regex", "json_schema", "contains"])
        check: dict = {"kind": kind}
        if kind == "regex":
            check["value"] = rng.choice(_PATTERNS)
        elif kind == "json_schema":
            check["schema"] = schema()
        else:
            check["value"] = "\x1b]52;c;eA==\x07" if rng.random() < 0.3 else "x"
        prefix = rng.choice(["", "{", "a" * rng.choice([10, 60, 20000]) + "!", json.dumps({"a" * 60 + "!": "a" * 60})])
        prompts.append({"id": f"p{i}\x1b[31m", "prompt": "x", "answer_prefix": prefix, "check": check})
    text = json.dumps({"name": "fuzz", "task": "custom", "prompts": prompts})
    answers = [rng.choice(["", "a" * 60 + "!", '{"k": "' + "a" * 60 + '!"}', "[1, 2]", "x" * 5000])]
    return text, answers


def suite_case(text: str, answers: list[str]) -> Outcome:
    from app.core.quality.suite import SuiteError
    from app.core.quality.suite_checks import check_prompt
    from app.core.quality.suite_reading import parse_suite

    def work() -> str:
        try:
            suite = parse_suite(text, "fuzz.json")
        except SuiteError:
            return "clean"
        for prompt in suite.prompts:
            for answer in answers:
                result = check_prompt(prompt, answer)
                if not isinstance(result.reason, str) or not result.reason:
                    raise RuntimeError("a check without a reason")
        return "accepted"

    return _guarded_file(work)


_ODD_VALUES = (
    "nan",
    "Infinity",
    -1,
    0,
    10**30,
    1e308,
    "",
    "\x1b]52;c;eA==\x07",
    None,
    True,
    [],
    {},
    "x" * 10_000,
)


def _mutate_json(value: object, rng: random.Random) -> object:
    """``value`` (parsed JSON) with one node, chosen at random, replaced by an odd value."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: _mutate_json(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return [*value[:i], _mutate_json(value[i], rng), *value[i + 1 :]]
    return rng.choice(_ODD_VALUES)


def _odd_file_text(valid: str, rng: random.Random) -> str | bytes:
    """A data-folder file's content: the valid text with a node replaced, cut short, made deep,
    given NaN, or not UTF-8."""
    roll = rng.random()
    if roll < 0.55:
        return json.dumps(_mutate_json(json.loads(valid), rng))
    if roll < 0.65:
        return valid[: rng.randrange(len(valid))]
    if roll < 0.72:
        depth = rng.choice([100, 10_000, 200_000])
        return "[" * depth + "]" * depth
    if roll < 0.8:
        return rng.choice(["[]", '"x"', "42", "null", "NaN", "1e999"])
    if roll < 0.88:
        return valid.replace("1", "NaN", 1).replace("0.5", "Infinity", 1)
    return valid.encode() + b"\xff\xfe" + bytes(rng.randrange(256) for _ in range(16))


def _write_odd(path: Path, content: str | bytes, rng: random.Random) -> None:
    import os

    if rng.random() < 0.03:
        os.mkfifo(path)
    elif rng.random() < 0.03:
        path.symlink_to(rng.choice(["/dev/zero", "/dev/urandom", "/nonexistent"]))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")


def kept_run_case(rng: random.Random, folder: Path) -> Outcome:
    """One odd kept-run file imported by the history; the history must still list and read every
    run afterwards."""
    import shutil

    from app.adapters.history import RunHistory
    from app.core.speed.measure import MeasuredBuffers, RunResult, RunSettings, figures_from_times

    shutil.rmtree(folder, ignore_errors=True)
    kept = folder / "unsaved-runs"
    kept.mkdir(parents=True)
    result = RunResult(
        settings=RunSettings(gguf_path="/m/x.gguf"),
        started_at=1_700_000_000.0,
        llama_cpp_version="0.3.36",
        gpu_offload_supported=False,
        model_size_bytes=1000,
        model_sha256="ab",
        n_layer=2,
        load_s=0.5,
        runs=(figures_from_times(8, 0.1, [0.1, 0.2, 0.3]),),
        buffers=MeasuredBuffers(),
    )
    valid = json.dumps({"result": json.loads(result.model_dump_json()), "estimate": None, "reason": "x"})
    _write_odd(kept / "run-1-1.json", _odd_file_text(valid, rng), rng)

    def work() -> str:
        with RunHistory(folder / "runs.sqlite3") as history:
            count = history.import_unsaved(kept)
            for row in history.rows():
                history.get(row.run_id)
        return "accepted" if count else "clean"

    return _guarded_file(work)


def settings_case(rng: random.Random, folder: Path) -> Outcome:
    """One odd settings.json read at start-up: the defaults and a sentence, or the settings."""
    import shutil

    from app.core.report.prefs import Preferences, load_preferences

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    path = folder / "settings.json"
    _write_odd(path, _odd_file_text(Preferences().model_dump_json(), rng), rng)

    def work() -> str:
        _prefs, note = load_preferences(path)
        return "clean" if note else "accepted"

    return _guarded_file(work)
