"""Help for people new to FitScope: the three-step walk-through, "How the estimate works", "About",
and the diagnostics a bug report needs."""

from __future__ import annotations

import platform
import sys
from html import escape
from importlib import metadata

import pyqtgraph as pg
import PySide6
from PySide6.QtCore import Qt, qVersion
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QStackedWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.core.common.units import MIB
from app.core.memory.records import CPU_RUNTIME_OVERHEAD_BYTES, GPU_RUNTIME_OVERHEAD_BYTES
from app.core.model.coverage import coverage_table, llamacpp_architectures
from app.core.report.choices import Machine

HOW_IT_WORKS = f"""
<h2>How the estimate works</h2>
<p>FitScope adds up what llama.cpp allocates when it loads a model, device by device, the way
llama.cpp itself does it. Every part is checked against llama.cpp's own report (the README's
accuracy table shows how closely).</p>
<h3>Memory</h3>
<ul>
<li><b>Weights</b> — every tensor's bytes: its element count times its type's bytes per element
(a Q4_K block of 256 weights takes 144 bytes). For a catalog model, the types are the ones
llama.cpp's quantizer gives each tensor under the chosen preset. The token embedding stays in
system memory; the last <i>GPU layers</i> layers go to the GPUs, split in proportion to their
memory.</li>
<li><b>KV cache</b> ("remembering the conversation") — for every attention layer, a K and a V
row per token of context: <i>context × layers × (K width + V width) × bytes per value</i>. Context
is rounded up to a multiple of 256 per user. An 8-bit cache halves it; sliding-window layers keep
less when the full-size window is off.</li>
<li><b>Compute buffers</b> — the working space of the largest step llama.cpp plans for: one batch
of up to 512 tokens against the whole cache (the logits, the feed-forward block or, without flash
attention, the attention scores — whichever is largest).</li>
<li><b>Runtime overhead</b> — an assumption, not a measurement: {GPU_RUNTIME_OVERHEAD_BYTES // MIB} MiB
per GPU (CUDA context, cuBLAS workspace, memory pool; public logs show 0.3–0.6 GiB) and
{CPU_RUNTIME_OVERHEAD_BYTES // MIB} MiB for the process.</li>
</ul>
<p>It <b>fits</b> when every device's total is within its memory (a GPU's free memory when it is this
machine's). The light is amber when less than 10% is left, or when only some layers fit on the GPU.</p>
<h3>Speed</h3>
<ul>
<li><b>Generating</b> (decode) reads every active weight once per token, plus the cache so far:
<i>tokens/s ≈ efficiency × memory bandwidth ÷ bytes read per token</i>. The efficiency is a range
seen in public llama.cpp benchmarks until a run on this machine measures it.</li>
<li><b>Reading the prompt</b> (prefill) is limited by arithmetic: about 2 operations per parameter
per token, divided by the device's throughput.</li>
<li><b>Words a second</b> assumes about 0.75 English words per token.</li>
</ul>
<p>Every assumption behind the figures on screen is listed in the Details tab.</p>
"""


def versions(machine: Machine | None = None) -> dict[str, str]:
    """FitScope's, llama.cpp's, Qt's and the GPU driver's versions (without loading llama.cpp)."""

    def dist(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    driver = "no GPU found"
    if machine is not None and machine.gpus:
        driver = machine.gpus[0].driver_version or "unknown"
        if machine.gpus[0].cuda_version:
            driver += f" (CUDA {machine.gpus[0].cuda_version})"
    return {
        "FitScope": __version__,
        "llama-cpp-python": dist("llama-cpp-python"),
        "Qt": qVersion(),
        "PySide6": PySide6.__version__,
        "pyqtgraph": pg.__version__,
        "Python": platform.python_version(),
        "GPU driver": driver,
        "System": f"{platform.system()} {platform.release()} ({platform.machine()})",
    }


def diagnostics(machine: Machine, context: dict[str, str], last_error: str, log_path: str) -> str:
    """Plain text for a bug report: versions, the detected hardware, what was on screen, the last error."""
    lines = ["FitScope diagnostics", ""]
    lines += [f"{k}: {v}" for k, v in versions(machine).items()]
    lines.append("")
    host = machine.host
    if host is not None:
        bw = (
            f", measured read bandwidth {host.measured_read_bandwidth_gb_s:.0f} GB/s"
            if (host.measured_read_bandwidth_gb_s)
            else ""
        )
        clocks = host.cpu_clocks_ghz
        lines.append(
            f"CPU: {host.cpu_model}, {host.physical_cores or '?'} cores / {host.logical_cores} threads, "
            + (f"base {clocks[0]:.2f} GHz, boost {clocks[1]:.2f} GHz, " if clocks else "")
            + f"flags {' '.join(host.cpu_flags) or 'none'}"
        )
        lines.append(
            f"RAM: {host.ram_total_bytes / 2**30:.1f} GiB total, {host.ram_available_bytes / 2**30:.1f} free{bw}"
        )
    for g in machine.gpus:
        lines.append(
            f"GPU {g.index}: {g.name} ({g.vendor}), {g.memory_total_bytes / 2**30:.1f} GiB usable, "
            f"{g.memory_free_bytes / 2**30:.1f} free, compute capability {g.compute_capability or '?'}"
        )
    if not machine.gpus:
        lines.append(f"GPUs: {machine.gpu_message or 'none detected'}")
    lines.append("")
    lines += [f"{k}: {v}" for k, v in context.items()]
    lines += ["", f"Last error: {last_error or 'none'}", f"Log file: {log_path}", f"Command: {' '.join(sys.argv)}"]
    return "\n".join(lines)


class AboutDialog(QDialog):
    def __init__(self, machine: Machine, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About FitScope")
        rows = "".join(f"<tr><td><b>{k}</b></td><td>{v}</td></tr>" for k, v in versions(machine).items())
        self.label = QLabel(
            "<h2>FitScope</h2><p>Will this language model run on this machine — and how fast?</p>"
            f"<table cellpadding='3'>{rows}</table>"
            "<p>The built-in demo model is Gemma 3 270M (Q4_K_M); Gemma Terms of Use apply.</p>"
        )
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        layout.addWidget(buttons)


# Every term the window uses, in plain words: the Help ▸ Glossary page, and the tooltips of the
# controls that use the term.
GLOSSARY: dict[str, str] = {
    "Model": "The trained network that writes the answers. Bigger models (more billions of parameters) "
    "answer better and need more memory.",
    "Parameters": "The numbers a model learned. 8B = 8 billion. Each needs 2 bytes at full precision, "
    "about half a byte when quantized to 4 bits.",
    "Quantization": "Storing the model's numbers with fewer bits, so it takes less memory and runs faster, "
    "at some loss of quality. Q8_0 is nearly lossless; Q4_K_M is the usual choice; Q2_K loses noticeably.",
    "Q4_K_M, Q8_0, IQ2_XXS": "Names of llama.cpp's quantization presets: the number is about how many bits "
    "each weight keeps (Q4 ≈ 4.5 bits); K and IQ are newer methods; _S/_M/_L mean small, medium, large "
    "variants of the same level.",
    "Perplexity (ppl)": "How surprised a model is by ordinary text; lower is better. FitScope shows how much a "
    "quantization raises it, in words: practically the same, slightly worse, noticeably worse.",
    "Token": "The piece of text a model reads and writes at a time: about three quarters of an English word.",
    "Tokens per second (tok/s)": "How fast text comes out. Reading is about 4 words a second for most "
    "people, so 6 tokens/s keeps up with a reader.",
    "Context": "How much of the conversation the model keeps in view, in tokens: 8,000 tokens is about "
    "6,000 words, a long report.",
    "KV cache": "The memory that remembers the conversation so far: it grows with the context and with "
    "the number of users.",
    "Concurrent users": "How many conversations are served at the same moment; each has its own context.",
    "Compute buffers": "Working memory llama.cpp keeps for its calculations, sized for the largest step.",
    "Runtime overhead": "Memory the program and the GPU driver need before any model is loaded.",
    "GiB": "Gibibyte: 1,073,741,824 bytes, what operating systems usually call a GB.",
    "GPU": "The graphics card: fast memory and many calculators, the quickest place to run a model.",
    "Layers": "A model is a stack of similar blocks; llama.cpp can put some on the GPU and the rest on the "
    "CPU (GPU layers, -ngl) when the GPU is too small for all of them.",
    "Runs partly in system memory": "The model does not fit the GPU, so some layers run from the "
    "computer's main memory: it works, but much more slowly.",
    "Prefill (reading the prompt)": "The first phase of an answer: the model reads everything it was "
    "given. Limited by arithmetic speed.",
    "Decode (writing)": "The second phase: the model writes one token at a time. Limited by how fast "
    "memory can be read.",
    "Time to first token (TTFT)": "How long before the first word of the answer appears.",
    "p50 / p95": "Waiting times: half of the requests wait less than p50, 95 in 100 wait less than p95.",
    "Batching": "Answering several requests in one pass: more answers per second in total, each a little slower.",
    "Flash attention": "A faster way to compute attention that also needs less working memory; llama.cpp "
    "uses it by default where it can.",
    "Mixture of experts (MoE)": "Models with many expert blocks of which only a few work on each token: "
    "large in memory, fast to run.",
    "Vision projector": "The extra file that lets a model read images (llama-server --mmproj).",
    "llama.cpp / llama-server": "The open-source program FitScope models and runs: llama-server serves a "
    "model over HTTP.",
    "vLLM": "Another serving program, for GPU servers; FitScope plans it for multi-GPU setups.",
    "Approximate": "FitScope's rules for this kind of model are not checked against llama.cpp: the weights "
    "are exact, the rest may be off. Keep a margin.",
}


def glossary_html() -> str:
    rows = "".join(f"<dt><b>{escape(term)}</b></dt><dd>{escape(text)}</dd>" for term, text in GLOSSARY.items())
    return f"<h2>Glossary</h2><p>The words FitScope uses, in plain terms.</p><dl>{rows}</dl>"


def term(name: str) -> str:
    """A tooltip: the glossary's explanation of ``name``."""
    return GLOSSARY[name]


def architectures_html() -> str:
    """The coverage report: each architecture the shipped llama.cpp loads, and how exact FitScope is."""
    version, known = llamacpp_architectures()
    rows = coverage_table()
    exact = [r for r in rows if r.status == "exact"]
    other = [r for r in rows if r.status != "exact"]
    out = [
        "<h2>Model architectures</h2>",
        f"<p>The llama.cpp inside FitScope (llama-cpp-python {escape(version or 'unknown')}) loads "
        f"{len(known)} model architectures. For <b>{len(exact)}</b> of them FitScope's memory rules are "
        "<b>exact</b>: sparse test files of each were loaded into llama.cpp, and the weights and the "
        "conversation memory matched to the byte, the working buffers within a few percent.</p>",
        "<table cellpadding='3'><tr><th align='left'>Architecture</th><th align='left'>Proven on</th></tr>",
        *(f"<tr><td><b>{escape(r.arch)}</b></td><td>{escape(r.detail)}</td></tr>" for r in exact),
        "</table>",
        "<p>Every other architecture is estimated <b>approximately</b> when you open its GGUF file: the "
        "weights are still exact (each tensor is read from the file), but the conversation memory and "
        "working buffers follow the generic rules, and the verdict says so. Keep a margin.</p>",
        "<p>" + ", ".join(escape(r.arch) for r in other if r.status == "approximate") + "</p>",
    ]
    return "\n".join(out)


class TextDialog(QDialog):
    """A help page: rich text in a scrolling view, and Close."""

    def __init__(self, title: str, html: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(title)
        self.resize(720, 640)
        self.text = QTextBrowser()
        self.text.setHtml(html)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.text)
        layout.addWidget(buttons)


class Walkthrough(QDialog):
    """Three steps for a first start: your hardware, pick a model, press Run."""

    def __init__(self, machine: Machine, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Welcome to FitScope")
        self.resize(560, 320)
        host = machine.host
        here = (
            ", ".join(g.name for g in machine.gpus)
            if machine.gpus
            else f"no GPU, so the CPU ({host.cpu_model if host else 'unknown'})"
        )
        pages = [
            (
                "1. Your hardware",
                f"On the left, FitScope shows what this machine has: {here}. Under <i>Estimate for</i> you can "
                "also pick hardware you do not own — a GPU (or several), an Apple machine — to see what it would "
                "take before buying it.",
            ),
            (
                "2. Pick a model",
                "Search the catalog, open a GGUF file you have (Ctrl+O, or drop it on the window), or import a "
                "model's config.json. Move the context slider: the verdict on top and the charts follow at once — "
                "green fits with room, amber only just, red does not fit.",
            ),
            (
                "3. Press Run",
                "The <i>Run</i> tab generates text with the real llama.cpp on this machine and sets what it "
                "measured — speed and memory — beside the estimate. The built-in demo model is ready to try.",
            ),
        ]
        self.stack = QStackedWidget()
        for title, text in pages:
            label = QLabel(f"<h2>{title}</h2><p>{text}</p>")
            label.setWordWrap(True)
            label.setAlignment(Qt.AlignmentFlag.AlignTop)
            self.stack.addWidget(label)
        self.back = QPushButton("&Back")
        self.next = QPushButton("&Next")
        self.done_button = QPushButton("&Done")
        self.back.clicked.connect(lambda: self.go(self.stack.currentIndex() - 1))
        self.next.clicked.connect(lambda: self.go(self.stack.currentIndex() + 1))
        self.done_button.clicked.connect(self.accept)
        row = QHBoxLayout()
        row.addWidget(QLabel("Reopen this from Help ▸ Getting started."))
        row.addStretch(1)
        for b in (self.back, self.next, self.done_button):
            row.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addWidget(self.stack, 1)
        layout.addLayout(row)
        self.go(0)

    def go(self, index: int) -> None:
        index = max(0, min(index, self.stack.count() - 1))
        self.stack.setCurrentIndex(index)
        self.back.setEnabled(index > 0)
        self.next.setVisible(index < self.stack.count() - 1)
        self.done_button.setVisible(index == self.stack.count() - 1)
        (self.next if index < self.stack.count() - 1 else self.done_button).setDefault(True)
