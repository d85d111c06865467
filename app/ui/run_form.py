"""The Run tab's settings form: what to run (a prompt, a preset, a long synthetic prompt, or a
llama-bench style benchmark), how (the chat template, a system prompt, threads, GPU layers, RPC
servers on this machine) and how often. ``RunForm.values()`` reads them as :class:`RunSettings`
fields; the tab (``run_panel.py``) adds the model file and the context from the window.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from app.adapters.cpu_topology import llama_math_threads, logical_cpus
from app.adapters.rpc_backend import rpc_backend_problem
from app.core.memory.records import GpuLayers
from app.core.report.run_vs_estimate import CUDA_INSTALL_HINT, gpu_build_advice
from app.core.speed.llama_defaults import thread_sweep

PASSAGE = (
    "The lighthouse at the end of the harbour was built in 1871 from granite quarried on the island. "
    "For ninety years a keeper climbed its 112 steps every evening to light the lamp, wind the clockwork "
    "that turned the lens, and write the weather in a log that is now kept in the town museum. In 1962 "
    "the light was automated and the keeper's cottage became a summer school for sailing. Storms in 1990 "
    "cracked the lower wall, and the town raised the money to repair it by selling engraved paving stones, "
    "which now line the path to the door."
)
# Each preset as a chat message (sent through the model's chat template, as deployed) and as a raw
# completion (for base models, or with the template switched off).
PRESETS: dict[str, tuple[str, str] | None] = {
    "Chat": (
        "I am going hiking for a weekend in the mountains. What should I pack?",
        "User: I am going hiking for a weekend in the mountains. What should I pack?\nAssistant:",
    ),
    "Summarize a passage": (
        f"Summarize this passage in two sentences.\n\n{PASSAGE}",
        f"Summarize this passage in two sentences.\n\n{PASSAGE}\n\nSummary:",
    ),
    "Extract JSON": (
        "Extract the customer's name, the invoice date and the total amount from the text below. Answer with "
        'JSON only, with the keys "name", "date" and "amount".\n\nText: Invoice 2231 was issued to Maria '
        "Okafor on 14 March 2025 for the repair of two bicycles; the total due is 186.40 euros.",
        "Extract the customer's name, the invoice date and the total amount from the text below. Answer with "
        'JSON only, with the keys "name", "date" and "amount".\n\nText: Invoice 2231 was issued to Maria '
        "Okafor on 14 March 2025 for the repair of two bicycles; the total due is 186.40 euros.\n\nJSON:",
    ),
    "Long context": None,
}


class RunForm(QGroupBox):
    """The prompt and generation settings of the next run."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Prompt and generation", parent)
        self.llama_threads = llama_math_threads()
        self.sweep_counts = thread_sweep(self.llama_threads, logical_cpus())
        form = QFormLayout(self)
        self.model_label = QLabel("")
        self.model_label.setWordWrap(True)
        form.addRow("Model", self.model_label)
        self.mode_combo = QComboBox()
        self.mode_combo.addItem("Generate from a prompt", "generate")
        self.mode_combo.addItem("Benchmark (llama-bench: pp and tg)", "bench")
        self.mode_combo.setAccessibleName("Run mode")
        self.mode_combo.setToolTip(
            "Benchmark: process N random prompt tokens in one batch (pp), then generate M tokens one by one (tg), "
            "as llama-bench does, after filling the context to the chosen depth"
        )
        form.addRow("M&ode", self.mode_combo)
        self.preset_combo = QComboBox()
        self.preset_combo.addItems(list(PRESETS))
        self.preset_combo.setAccessibleName("Prompt preset")
        form.addRow("&Preset", self.preset_combo)
        self.chat_check = QCheckBox("Through the model's chat &template")
        self.chat_check.setChecked(True)
        self.chat_check.setToolTip(
            "As the model is deployed: the prompt goes in as one user turn of the model's own chat template "
            "(llama-server --jinja), and the answer ends at the model's end-of-turn token. Off: the text is sent "
            "as typed (base models have no template and are always prompted this way)."
        )
        form.addRow(self.chat_check)
        self.system_edit = QLineEdit()
        self.system_edit.setPlaceholderText("optional, e.g. You are a helpful assistant.")
        self.system_edit.setAccessibleName("System prompt")
        form.addRow("S&ystem prompt", self.system_edit)
        self.prompt_edit = QPlainTextEdit()
        self.prompt_edit.setAccessibleName("Prompt")
        self.prompt_edit.setMaximumHeight(110)
        form.addRow("P&rompt", self.prompt_edit)
        self.long_tokens = QSpinBox()
        self.long_tokens.setRange(16, 1 << 20)
        self.long_tokens.setValue(2048)
        self.long_tokens.setSuffix(" tokens")
        self.long_tokens.setGroupSeparatorShown(True)
        form.addRow("Prompt &length (long prompt, pp)", self.long_tokens)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 1 << 16)
        self.max_tokens.setValue(128)
        form.addRow("&Max new tokens", self.max_tokens)
        self.depth_spin = QSpinBox()
        self.depth_spin.setRange(0, 1 << 20)
        self.depth_spin.setSuffix(" tokens")
        self.depth_spin.setToolTip("Benchmark: context already in the cache before timing (llama-bench -d)")
        form.addRow("&Depth", self.depth_spin)
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 2.0)
        self.temperature.setSingleStep(0.1)
        form.addRow("&Temperature", self.temperature)
        self.repeat = QSpinBox()
        self.repeat.setRange(1, 20)
        self.repeat.setValue(3)
        self.repeat.setToolTip("Runs the same prompt N times; the figures are medians with their spread")
        form.addRow("Re&peat", self.repeat)
        self.threads = QSpinBox()
        self.threads.setRange(0, max(256, 2 * logical_cpus()))
        self.threads.setSpecialValueText(f"like llama-server: {self.llama_threads} physical cores")
        self.threads.setAccessibleName("CPU threads")
        self.threads.setToolTip(
            "CPU threads for llama.cpp. The default is what llama-server and llama-bench use on this machine "
            "(the physical cores); runs with another count are shown but do not calibrate later estimates."
        )
        form.addRow("T&hreads", self.threads)
        self.sweep = QCheckBox("Sweep threads (" + ", ".join(map(str, self.sweep_counts)) + ")")
        self.sweep.setToolTip("Benchmark once per thread count to see where prefill and decode peak")
        form.addRow("", self.sweep)
        self.ngl = QSpinBox()
        self.ngl.setRange(-1, 1000)
        self.ngl.setSpecialValueText("all")
        form.addRow("&GPU layers", self.ngl)
        self.gpu_note = QLabel("")
        self.gpu_note.setWordWrap(True)
        form.addRow("", self.gpu_note)
        self.rpc_local = QSpinBox()
        self.rpc_local.setRange(0, 8)
        self.rpc_local.setSpecialValueText("off: this process only")
        self.rpc_local.setSuffix(" local RPC servers")
        self.rpc_local.setAccessibleName("Split across local RPC servers")
        rpc_problem = rpc_backend_problem()
        self.rpc_local.setEnabled(rpc_problem is None)
        self.rpc_local.setToolTip(
            rpc_problem
            or "Split the model across N llama.cpp RPC servers started on this machine (as across machines "
            "with --rpc), and compare each server's buffers with the RPC plan"
        )
        form.addRow("&Split across", self.rpc_local)
        # Wrapped and selectable, so the whole command can be read and copied.
        self.gpu_command = QLabel(CUDA_INSTALL_HINT)
        self.gpu_command.setWordWrap(True)
        self.gpu_command.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.gpu_command.setAccessibleName("Command that installs a GPU build of llama.cpp")
        self.gpu_command.setVisible(False)
        form.addRow("", self.gpu_command)
        self.preset_combo.currentTextChanged.connect(self._preset_chosen)
        self.chat_check.toggled.connect(self._chat_toggled)
        self.mode_combo.currentIndexChanged.connect(lambda _i: self._preset_chosen(self.preset_combo.currentText()))
        self._preset_chosen(self.preset_combo.currentText())

    @property
    def bench_mode(self) -> bool:
        return self.mode_combo.currentData() == "bench"

    def _preset_text(self, name: str) -> str | None:
        preset = PRESETS.get(name)
        if preset is None:
            return None
        return preset[0] if self.chat_check.isChecked() else preset[1]

    def _chat_toggled(self, on: bool) -> None:
        self.system_edit.setEnabled(on and not self.bench_mode)
        # A preset's text follows the switch; a prompt of the user's own stays as written.
        preset = PRESETS.get(self.preset_combo.currentText())
        if preset is not None and self.prompt_edit.toPlainText() == preset[1 if on else 0]:
            self.prompt_edit.setPlainText(preset[0] if on else preset[1])

    def _preset_chosen(self, name: str) -> None:
        text = self._preset_text(name)
        bench = self.bench_mode
        self.chat_check.setEnabled(not bench)
        self.system_edit.setEnabled(not bench and self.chat_check.isChecked())
        if bench != getattr(self, "_was_bench", False):
            # llama-bench's defaults (pp512, tg128) when entering benchmark mode; back to a long prompt after.
            self.long_tokens.setValue(512 if bench else 2048)
            self.max_tokens.setValue(128)
            self._was_bench = bench
        self.preset_combo.setEnabled(not bench)
        self.depth_spin.setEnabled(bench)
        self.sweep.setEnabled(bench)
        if bench:
            self.prompt_edit.setEnabled(False)
            self.long_tokens.setEnabled(True)
            self.prompt_edit.setPlainText("(pp: random tokens of the chosen length, in one batch)")
            return
        self.prompt_edit.setEnabled(text is not None)
        self.long_tokens.setEnabled(text is None)
        if text is not None:
            self.prompt_edit.setPlainText(text)
        else:
            self.prompt_edit.setPlainText("(a synthetic prompt of the chosen length)")

    def values(self) -> dict[str, Any]:
        """The run's settings as :class:`RunSettings` fields (all but the model file and the context),
        read on the GUI thread for the run's thread to use."""
        threads = {"n_threads": self.threads.value() or None}
        if self.bench_mode:
            return threads | {
                "mode": "bench",
                "prompt_tokens": self.long_tokens.value(),
                "max_tokens": self.max_tokens.value(),
                "depth_tokens": self.depth_spin.value(),
                "ignore_eos": True,
                "repeat": self.repeat.value(),
                "gpu_layers": self._gpu_layers(),
            }
        long = PRESETS.get(self.preset_combo.currentText()) is None
        chat = self.chat_check.isChecked() and not long
        return threads | {
            "prompt": None if long else self.prompt_edit.toPlainText(),
            "chat": chat,
            "system_prompt": (self.system_edit.text().strip() or None) if chat else None,
            "prompt_tokens": self.long_tokens.value() if long else None,
            "max_tokens": self.max_tokens.value(),
            "temperature": self.temperature.value(),
            "repeat": self.repeat.value(),
            "gpu_layers": self._gpu_layers(),
        }

    def _gpu_layers(self) -> GpuLayers:
        """The GPU layers asked for: a number, or "all" (the spin box's -1); 0 without GPU offload."""
        if not self.ngl.isEnabled():
            return 0
        return "all" if self.ngl.value() < 0 else self.ngl.value()

    def set_gpu_offload_supported(self, supported: bool, gpu_vendor: str | None) -> None:
        """When the installed llama.cpp cannot offload: the build ``gpu_vendor``'s GPU needs (None: none found)."""
        self.ngl.setEnabled(supported)
        self.gpu_command.setVisible(not supported)
        if supported:
            self.gpu_note.setText("")
        else:
            self.ngl.setValue(0)
            sentence, command = gpu_build_advice(gpu_vendor)
            self.gpu_note.setText(sentence)
            self.gpu_command.setText(command)
