"""Limits on everything a file controls: a model's chat template, a suite, a kept run, a settings
file, a cache file or a file name never exhausts memory, hangs, or loses results.

Each test rebuilds one defect of the issue that asked for these limits. Where a regression would
take gigabytes or never end, the reproducer runs in a child process held to BOUND_BYTES of address
space and BOUND_S seconds, so it fails the test instead of taking the machine down.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from app import cli
from app.core.common.text import safe_label, safe_text, shell_quote
from tests.test_chat import CHATML, GEMMA

ROOT = Path(__file__).resolve().parents[1]
BOUND_BYTES = 1024**3
BOUND_S = 30


def bounded(code: str, *, env: dict[str, str] | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python held to BOUND_BYTES of address space and BOUND_S seconds."""

    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (BOUND_BYTES, BOUND_BYTES))

    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        input=stdin,
        capture_output=True,
        timeout=BOUND_S,
        preexec_fn=limit,
        env=full_env,
        cwd=ROOT,
    )


# -- chat templates -------------------------------------------------------------------------------

# Each as the Python expression that builds it (the largest would not fit on a command line).
HOSTILE_TEMPLATES = {
    "nested range loops printing": repr(
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}"
    ),
    "a 3 GB repetition": repr("{{ 'x' * 3000000000 }}"),
    "a 10 GB prompt": repr("{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}"),
    "a 2 GB %-format width": repr("{{ '%2000000000d' % 1 }}"),
    "a 2 GB format() width": repr("{{ '{:2000000000}'.format(1) }}"),
    "lipsum of 10 million paragraphs": repr("{{ lipsum(n=10**7) }}"),
    "a text doubled in a loop": repr(
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
    ),
    "a 31 MB template": "'x' * (31 * 1024 * 1024)",
    "a padded method call": repr("{{ 'a'.ljust(10**9) }}"),
    # Found by scripts/fuzz.py: Python refused the code Jinja made ("too many levels of indentation").
    "loops nested 200 deep": repr("{% for k in range(1) %}" * 200 + "{% endfor %}" * 200),
}


@pytest.mark.parametrize("name", list(HOSTILE_TEMPLATES))
def test_a_hostile_chat_template_is_refused_within_its_budget(name):
    # The issue: nested ranges reached 10 GB in 75 s, 'x'*3000000000 took 8.7 GB, a 10 GB prompt
    # 9.6 GB before the length check, '%2000000000d' 7.6 GB; lipsum(n=10**7) and a 31 MB template
    # never finished.
    done = bounded(
        f"""
        import json, time
        from app.core.quality.chat import ChatTemplateError, render_chat
        template = {HOSTILE_TEMPLATES[name]}
        started = time.perf_counter()
        try:
            render_chat(template, [{{"role": "user", "content": "hi"}}])
            message = None
        except ChatTemplateError as exc:
            message = str(exc)
        # VmHWM: this program's own peak. ru_maxrss would also count the test process's memory,
        # which the child shares between fork and exec.
        hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
        print(json.dumps({{"message": message, "s": time.perf_counter() - started, "peak_mib": hwm / 1024}}))
        """
    )
    assert done.returncode == 0, done.stderr.decode()[-500:]
    outcome = json.loads(done.stdout)
    assert outcome["message"] is not None and outcome["message"].startswith("this model's chat template")
    assert outcome["s"] < 10 and outcome["peak_mib"] < 400


def test_a_template_that_spins_is_stopped_and_named_in_one_sentence():
    from app.adapters.chat_render import render_conversations

    spin = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.perf_counter()
    results = render_conversations(spin, [[{"role": "user", "content": "hi"}]] * 3, time_limit_s=2)
    assert time.perf_counter() - started < 8
    assert [str(r) for r in results] == [
        "this model's chat template did not finish within 2 s and was stopped (templates come with the model "
        "file; FitScope limits their rendering)"
    ] * 3


# A template in the shape of the published ones (Qwen, Llama 3): namespace, loop state, filters, tojson.
RICH_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages if m.role == 'system' %}{% set ns.system = m.content %}{% endfor -%}"
    "{{ bos_token }}{% if ns.system %}<|system|>{{ ns.system | trim }}\n{% endif %}"
    "{%- for m in messages | rejectattr('role', 'equalto', 'system') -%}"
    "<|{{ m.role }}|>{{ m.content }}{% if not loop.last %}\n{% endif %}{{ '%s' % '' }}"
    "{%- endfor -%}{{ {'turns': messages | length} | tojson }}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)


@pytest.mark.parametrize("template", [RICH_TEMPLATE, CHATML, GEMMA], ids=["rich", "chatml", "gemma"])
def test_a_real_template_renders_the_same_under_the_budget(template):
    # The budget must not change what a well-behaved template renders.
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from app.adapters.chat_render import render_conversations

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    expected = plain.render(messages=messages, bos_token="<bos>", eos_token="<eos>", add_generation_prompt=True)
    assert render_conversations(template, [messages], "<bos>", "<eos>") == [expected.removeprefix("<bos>")]


@pytest.mark.llamacpp
def test_a_template_nested_too_deeply_is_named_not_blamed_on_llama_cpp(tmp_path):
    # The issue: "llama.cpp could not load it: maximum recursion depth exceeded" (llama-cpp-python
    # compiled the template at load, without limits).
    from app.adapters.llamacpp_runner import RunError, run_live
    from app.core.speed.measure import RunSettings
    from tests.support.tiny_gguf import write_tiny_llama

    deep = "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000
    path = write_tiny_llama(tmp_path / "deep.gguf", chat_template=deep)
    with pytest.raises(RunError) as caught:
        run_live(RunSettings(gguf_path=str(path), chat=True, prompt="hi", max_tokens=2, context_tokens=256))
    assert "this model's chat template nests too deeply" in str(caught.value)
    assert "could not load" not in str(caught.value)


@pytest.mark.llamacpp
def test_a_template_error_fails_its_prompts_and_the_suite_goes_on(tmp_path):
    # The issue: one variant's template error threw away the other variants' results.
    from app.adapters.suite_runner import PromptJob, SuiteRunSettings, run_suite
    from tests.support.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(tmp_path / "refuses.gguf", chat_template="{{ raise_exception('no user turns') }}")
    jobs = (PromptJob(id="s/a", prompt="one", max_tokens=2), PromptJob(id="s/b", prompt="two", max_tokens=2))
    run = run_suite(SuiteRunSettings(gguf_path=str(path), prompts=jobs, context_tokens=256))
    assert [o.id for o in run.outcomes] == ["s/a", "s/b"] and not run.stopped
    assert all("refused the messages: no user turns" in (o.error or "") for o in run.outcomes)


# -- kept runs and the history --------------------------------------------------------------------


def _kept_run_payload() -> dict:
    from app.core.speed.measure import MeasuredBuffers, RunResult, RunSettings, figures_from_times

    result = RunResult(
        settings=RunSettings(gguf_path="/models/x.gguf"),
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
    return {"result": json.loads(result.model_dump_json()), "estimate": None, "reason": "test"}


@pytest.mark.parametrize(
    "content",
    ["[]", '"x"', "42", "[" * 100_000 + "]" * 100_000, "{", '{"result": {"started_at": NaN}}'],
    ids=["list", "string", "number", "deep", "broken", "nan-literal"],
)
def test_a_bad_kept_run_is_moved_aside_and_the_next_run_is_saved(tmp_path, monkeypatch, content):
    # The issue: [], "x", 42 or deep nesting made every later run fail "unexpectedly" and lose the
    # run just measured, and the window exit at start.
    from app.adapters.history import RunHistory
    from app.adapters.run_saving import record_run
    from app.core.speed.measure import RunResult

    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    kept = tmp_path / "unsaved-runs" / "run-1-1.json"
    kept.parent.mkdir()
    kept.write_text(content)
    with RunHistory() as history:
        assert len(history.notices) == 1 and "moved aside as run-1-1.json.bad" in history.notices[0]
    assert not kept.exists() and kept.with_name("run-1-1.json.bad").exists()
    saved = record_run(RunResult.model_validate(_kept_run_payload()["result"]), None, None, "m")
    assert saved.history_id is not None and saved.message is None


def test_a_nan_start_time_no_longer_diverts_every_run(tmp_path, monkeypatch):
    # The issue: a kept run with a NaN started_at sent every new run to unsaved-runs for good.
    from app.adapters.run_saving import record_run
    from app.core.speed.measure import RunResult

    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    payload = _kept_run_payload()
    payload["result"]["started_at"] = "nan"  # validates as a float; the history refuses it
    folder = tmp_path / "unsaved-runs"
    folder.mkdir()
    (folder / "run-2-2.json").write_text(json.dumps(payload))
    good = RunResult.model_validate(_kept_run_payload()["result"])
    first = record_run(good, None, None, "m")
    second = record_run(good, None, None, "m")
    assert first.history_id is not None and second.history_id is not None
    assert sorted(p.name for p in folder.iterdir()) == ["run-2-2.json.bad"]


def test_a_fifo_or_a_link_to_dev_zero_among_kept_runs_neither_hangs_nor_fills_memory(tmp_path):
    # The issue: a FIFO hung every start; a symlink to /dev/zero used 12.8 GB.
    folder = tmp_path / "unsaved-runs"
    folder.mkdir()
    os.mkfifo(folder / "run-3-3.json")
    (folder / "run-4-4.json").symlink_to("/dev/zero")
    done = bounded(
        """
        from app.adapters.history import RunHistory
        with RunHistory() as history:
            print(len(history.notices))
        """,
        env={"FITSCOPE_DATA_DIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr.decode()[-500:]
    assert done.stdout.decode().strip() == "2"
    assert sorted(p.name for p in folder.iterdir()) == ["run-3-3.json.bad", "run-4-4.json.bad"]


def test_the_history_opens_at_once_while_another_process_holds_its_write_lock(tmp_path, monkeypatch):
    # The issue: the window refused to open while another process held the write lock for 5 s.
    from app.adapters.history import RunHistory

    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    RunHistory().close()
    folder = tmp_path / "unsaved-runs"
    folder.mkdir()
    (folder / "run-5-5.json").write_text(json.dumps(_kept_run_payload()))
    other = sqlite3.connect(tmp_path / "runs.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        started = time.perf_counter()
        with RunHistory() as history:
            assert time.perf_counter() - started < 2
            assert any("busy" in n for n in history.notices)
        assert (folder / "run-5-5.json").exists()  # imported the next time
    finally:
        other.execute("ROLLBACK")
        other.close()
    with RunHistory() as history:
        assert len(history.rows()) == 1 and not (folder / "run-5-5.json").exists()


def test_a_full_disk_leaves_no_partial_kept_run(tmp_path, monkeypatch):
    from app.adapters import kept_runs
    from app.core.speed.measure import RunResult

    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))

    def full(self, *_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError):
        kept_runs.keep_unsaved(RunResult.model_validate(_kept_run_payload()["result"]), None, "x")
    assert list((tmp_path / "unsaved-runs").iterdir()) == []


@pytest.mark.parametrize("kind", ["deep", "fifo", "nan"])
def test_a_broken_settings_file_gives_defaults_at_once(tmp_path, kind):
    # The issue: a deeply nested or FIFO settings.json crashed or hung the window at every start.
    path = tmp_path / "settings.json"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text("[" * 200_000 + "]" * 200_000 if kind == "deep" else '{"schema_version": 1, "x": NaN}')
    done = bounded(
        f"""
        from pathlib import Path
        from app.core.report.prefs import Preferences, load_preferences
        prefs, note = load_preferences(Path({str(path)!r}))
        assert prefs == Preferences()
        print(note)
        """
    )
    assert done.returncode == 0, done.stderr.decode()[-500:]
    assert done.stdout.decode().startswith("Your saved settings could not be read")
    assert (tmp_path / "settings.json.bad").exists() and not path.exists()


# -- labels from files on the terminal ------------------------------------------------------------

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"


def test_the_sanitiser_removes_escape_sequences_and_shows_undecodable_bytes():
    assert safe_label(f"Evil{OSC52} model\x1b[2J\x9b31m\u202e") == "Evil model"
    assert safe_text("line 1\n\x1b]0;title\x1b\\line 2\t!") == "line 1\nline 2\t!"
    assert safe_label("mod\udcffel.gguf") == "mod\\xffel.gguf"


def test_a_model_name_with_osc52_never_reaches_the_terminal_and_json_stays_exact(tmp_path, capsys):
    # The issue: general.name, suite names and prompt ids were printed raw, OSC 52 included.
    from tests.test_gguf_reader import write_gguf

    path = write_gguf(tmp_path / "evil.gguf", name=f"Evil{OSC52}Model")
    assert cli.main(["estimate", "--gguf", str(path), "--cpu"]) == 0
    out, err = capsys.readouterr()
    assert "EvilModel" in out and "\x1b" not in out + err and "\x07" not in out + err
    assert cli.main(["estimate", "--gguf", str(path), "--cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == f"Evil{OSC52}Model"


def test_suite_names_and_ids_from_files_are_listed_clean(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    folder = tmp_path / "suites"
    folder.mkdir()
    (folder / "evil.yaml").write_text(
        json.dumps(
            {
                "name": f"mine{OSC52}",
                "task": "custom",
                "prompts": [{"id": f"p{OSC52}", "prompt": "Say hi.", "check": {"kind": "contains", "value": "hi"}}],
            }
        )
    )
    assert cli.main(["suites"]) == 0
    out, err = capsys.readouterr()
    assert "mine" in out and "\x1b" not in out + err


# -- suite checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["regex", "schema pattern", "patternProperties"])
def test_a_backtracking_pattern_fails_its_check_in_about_a_second(kind):
    # The issue: a regex like ^(a+)+$ against a suite's answer_prefix spun for ever after every
    # variant had run, and all results were lost.
    check = {
        "regex": {"kind": "regex", "value": "^(a|aa)+$"},
        "schema pattern": {
            "kind": "json_schema",
            "schema": {"type": "object", "properties": {"k": {"pattern": "^(a|aa)+$"}}},
        },
        "patternProperties": {
            "kind": "json_schema",
            "schema": {"type": "object", "patternProperties": {"^(a|aa)+$": {"type": "string"}}},
        },
    }[kind]
    prefix = (
        "a" * 60 + "!"
        if kind == "regex"
        else json.dumps({"k" if kind == "schema pattern" else "a" * 60 + "!": "a" * 60 + "!"})
    )
    done = bounded(
        f"""
        import json, time
        from app.core.quality.suite import SuitePrompt
        from app.core.quality.suite_checks import check_prompt
        prompt = SuitePrompt.model_validate({{"id": "p", "prompt": "x", "answer_prefix": {prefix!r},
                                             "check": {check!r}}})
        started = time.perf_counter()
        result = check_prompt(prompt, "")
        print(json.dumps([result.passed, result.reason, time.perf_counter() - started]))
        """
    )
    assert done.returncode == 0, done.stderr.decode()[-500:]
    passed, reason, seconds = json.loads(done.stdout)
    assert not passed and "took longer than 0.5 s" in reason and seconds < 5


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"$ref": "https://example.com/schema.json"}, "not a local pointer"),
        ({"$ref": "#"}, "leads back to itself"),
        ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "leads back"),
        ({"$ref": "#/$defs/missing"}, "not a local pointer"),
        ({"$id": "https://example.com/x", "type": "object"}, "is not allowed in a suite's schema"),
    ],
)
def test_a_remote_or_cyclic_ref_is_refused_when_the_suite_is_loaded(schema, words):
    # The issue: a remote or self-referencing $ref crashed the compare after all runs.
    from app.core.quality.suite import SuiteError
    from app.core.quality.suite_reading import parse_suite

    text = json.dumps(
        {
            "name": "s",
            "task": "extraction",
            "prompts": [{"id": "p", "prompt": "x", "check": {"kind": "json_schema", "schema": schema}}],
        }
    )
    with pytest.raises(SuiteError, match=words):
        parse_suite(text, "s.json")


def test_a_corrupt_kl_cache_file_is_set_aside_and_measured_again(tmp_path):
    # The issue: a corrupt KL cache file broke every compare until deleted by hand.
    from app.adapters.divergence_cache import cache_file_problem, usable_cache_file

    garbage = tmp_path / "ref-x.npz"
    garbage.write_bytes(b"PK\x03\x04 not really a zip")
    notes: list[str] = []
    assert not usable_cache_file(garbage, "reference", notes)
    assert (tmp_path / "ref-x.npz.bad").exists() and "set aside and measured again" in notes[0]
    good = tmp_path / "var-y.npz"
    np.savez(good, kl=np.zeros(4), nll=np.ones(4), nll_ref=np.ones(4), same_top=np.ones(4, bool), chunks=np.int64(1))
    assert cache_file_problem(good, "variant") is None
    np.savez(
        good,
        kl=np.array([np.nan] * 4),
        nll=np.ones(4),
        nll_ref=np.ones(4),
        same_top=np.ones(4, bool),
        chunks=np.int64(1),
    )
    assert "not finite" in (cache_file_problem(good, "variant") or "")


def test_the_measured_answers_are_kept_before_scoring(tmp_path, monkeypatch):
    from app.adapters.ab_compare import keep_answers
    from app.adapters.suite_runner import PromptOutcome, SuiteRun

    monkeypatch.setenv("FITSCOPE_DATA_DIR", str(tmp_path))
    outcome = PromptOutcome(
        id="s/p",
        text="Paris",
        tokens=(1,),
        prompt_tokens=3,
        ttft_s=0.1,
        prefill_tokens_per_s=None,
        decode_tokens_per_s=None,
    )
    run = SuiteRun(
        gguf_path="a.gguf", load_s=1, model_size_bytes=1, buffers={}, peak_rss_bytes=None, outcomes=(outcome,)
    )
    kept = keep_answers(["a.gguf"], {0: run})
    assert kept is not None and json.loads(kept.read_text())["variants"][0]["run"]["outcomes"][0]["text"] == "Paris"


# -- file names that are not UTF-8 ----------------------------------------------------------------


def test_a_file_name_that_is_not_utf8_is_refused_at_once_and_quoted_with_its_real_bytes(tmp_path):
    # The issue: `fitscope run` hung for ever with no output; `estimate` printed a llama-server
    # command naming a different file.
    from tests.test_gguf_reader import write_gguf

    write_gguf(tmp_path / "plain.gguf")
    odd = os.fsencode(tmp_path) + b"/mod\xffel.gguf"
    os.rename(os.fsencode(tmp_path / "plain.gguf"), odd)
    name = os.fsdecode(odd)
    done = bounded(f"import sys; from app.cli import main; sys.exit(main(['run', '--gguf', {name!r}, '-n', '2']))")
    err = done.stderr.decode()
    assert done.returncode == 2 and len(err.strip().splitlines()) == 1
    assert "not valid UTF-8" in err and f"$'{tmp_path}/mod\\xffel.gguf'" in err
    assert shell_quote(name) == f"$'{tmp_path}/mod\\xffel.gguf'"
    done = bounded(f"import sys; from app.cli import main; sys.exit(main(['estimate', '--gguf', {name!r}, '--cpu']))")
    assert done.returncode == 0 and f"-m $'{tmp_path}/mod\\xffel.gguf'".encode() in done.stdout
    assert subprocess.run(["bash", "-c", f"test -f $'{tmp_path}/mod\\xffel.gguf'"]).returncode == 0


# -- bounds before work ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["run", "--prompt-tokens", "1000000000"], "must be from 1 to 16,777,216"),
        (["run", "--prompt-tokens", "100000"], "need a context of 100,128"),
        (["load", "--requests", "100000000"], "must be from 1 to 100,000"),
        (["plan", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "-c", "2147483647"], "must be from 1 to 16,777,216"),
        (["plan", "--model", "llama-3.1-8b", "--gpu", "rtx-4090", "-np", "1024"], "must be from 1 to 256"),
    ],
)
def test_counts_and_sizes_are_refused_where_they_are_parsed(capsys, argv, words):
    # The issue: run --prompt-tokens 1e9 built a 15 GB prompt before refusing, load --requests 1e8
    # grew without end, plan -c/-np ended in "plan failed unexpectedly (ValidationError...)".
    started = time.perf_counter()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "unexpectedly" not in err
    assert time.perf_counter() - started < 5


def test_the_cli_context_limit_is_the_estimators():
    from app.core.memory.records import MAX_CONTEXT_TOKENS

    assert cli._MAX_CONTEXT == MAX_CONTEXT_TOKENS


def test_suites_add_reads_stdin_with_a_cap(tmp_path):
    # The issue: `suites --add -` read stdin without a limit, and a 67 MB example then made the
    # whole examples file unreadable.
    done = bounded(
        "import sys; from app.cli import main; sys.exit(main(['suites', '--add', '-', '--expect', 'x']))",
        env={"FITSCOPE_DATA_DIR": str(tmp_path)},
        stdin=b"y" * 5_000_000,
    )
    assert done.returncode == 2 and b"longer than 100,000 characters" in done.stderr
    assert not (tmp_path / "suites").exists() or not any((tmp_path / "suites").glob("*.yaml"))


def test_concurrent_additions_keep_every_example(tmp_path):
    # The issue: 20 parallel `suites --add` kept 6 examples.
    from app.adapters.user_suites import add_example, load_user_suites

    errors: list[Exception] = []

    def add(i: int) -> None:
        try:
            add_example(f"Prompt number {i}?", f"answer {i}", folder=tmp_path)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    (mine,) = load_user_suites(tmp_path)[0]
    assert len(mine.suite.prompts) == 20


# -- RPC ------------------------------------------------------------------------------------------


def _server(behaviour: str) -> tuple[socket.socket, str]:
    """A loopback server that accepts and then stays silent, trickles a byte a second, or answers
    like a web server."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                if behaviour == "trickle":
                    for _ in range(20):
                        conn.sendall(b"\x00")
                        time.sleep(0.5)
                elif behaviour == "http":
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                    time.sleep(1)
                else:
                    time.sleep(10)

    threading.Thread(target=serve, daemon=True).start()
    return listener, f"127.0.0.1:{listener.getsockname()[1]}"


import contextlib  # noqa: E402 - used by _server above


@pytest.mark.parametrize(
    ("behaviour", "words"),
    [
        ("silent", "did not answer llama.cpp's RPC hello within 2 s"),
        ("trickle", "did not answer"),
        ("http", "not a llama.cpp RPC server"),
    ],
)
def test_an_rpc_endpoint_that_does_not_answer_is_named_within_the_timeout(behaviour, words):
    # The issue: an endpoint that accepts and never answers (or trickles bytes) hung the load with
    # no message, and anything that accepted on a port counted as a server.
    from app.adapters.rpc_hello import RpcError, rpc_hello

    listener, endpoint = _server(behaviour)
    with listener:
        started = time.perf_counter()
        with pytest.raises(RpcError, match=words) as caught:
            rpc_hello(endpoint, timeout_s=2)
        assert endpoint in str(caught.value) and time.perf_counter() - started < 4


def test_plans_bind_each_rpc_server_to_its_host_and_say_rpc_has_no_authentication(capsys):
    assert (
        cli.main(
            [
                "plan",
                "--model",
                "llama-3.1-8b",
                "--rpc-host",
                "10.0.0.2=rtx-4090",
                "--rpc-host",
                "gpu-box:50053=rtx-4090",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "ggml-rpc-server -H 10.0.0.2 -p 50052" in out and "-H IPV4_OF_GPU_BOX -p 50053" in out
    assert "0.0.0.0" not in out
    assert "The RPC protocol has no authentication" in out
