"""The Scale out tab: the current model and context on several GPUs, two ways — llama.cpp's layer
split and vLLM's tensor parallelism — with the memory each GPU will hold and the launch commands."""

from __future__ import annotations

import json
from collections.abc import Callable

from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.memory.records import Settings
from app.core.model.catalog import load_devices
from app.core.model.quant import SERVING_FORMATS
from app.core.model.source import ModelSource
from app.core.plans.layer_split import LlamaSplitPlan
from app.core.plans.vllm import VllmPlan
from app.services.plans import ScaleOut, scale_out
from app.ui.jobs import JobRunner, Report
from app.ui.stale import StaleMark

ModelProvider = Callable[[], tuple[ModelSource, Settings, int, int, int]]
"""The current model with its tensors, llama.cpp settings, context per sequence, sequences, host RAM
bytes. Called on the tab's worker thread; raises FitScopeError when the model cannot be read."""


class ScalePanel(QWidget):
    def __init__(self, current: ModelProvider, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._current = current
        self.split: LlamaSplitPlan | None = None
        self.vllm: VllmPlan | None = None
        form_box = QGroupBox("GPUs")
        form = QFormLayout(form_box)
        self.gpu_combo = QComboBox()
        for d in load_devices():
            if d.vendor == "nvidia":
                self.gpu_combo.addItem(f"{d.name} ({d.memory_gib:g} GiB)", d)
        self.gpu_combo.setCurrentIndex(max(0, self.gpu_combo.findText("NVIDIA A100 80GB SXM (80 GiB)")))
        self.gpu_combo.setAccessibleName("GPU model")
        form.addRow("&GPU", self.gpu_combo)
        self.count = QSpinBox()
        self.count.setRange(1, 16)
        self.count.setValue(4)
        form.addRow("&Number of GPUs", self.count)
        self.dtype = QComboBox()
        for fmt in SERVING_FORMATS:
            self.dtype.addItem(fmt.name, fmt.name)
        form.addRow("vLLM &weights", self.dtype)
        self.max_seqs = QSpinBox()
        self.max_seqs.setRange(1, 4096)
        self.max_seqs.setValue(256)
        form.addRow("vLLM --max-num-&seqs", self.max_seqs)
        self.utilization = QDoubleSpinBox()
        self.utilization.setRange(0.1, 0.99)
        self.utilization.setSingleStep(0.05)
        self.utilization.setValue(0.90)
        form.addRow("vLLM GPU memory &utilization", self.utilization)
        self.plan_button = QPushButton("&Plan")
        form.addRow(self.plan_button)
        self.message = QLabel("Plans the model and context chosen on the left.")
        self.message.setWordWrap(True)
        form.addRow(self.message)

        self.llama_text = QPlainTextEdit()
        self.llama_text.setReadOnly(True)
        self.llama_text.setAccessibleName("llama.cpp layer split plan")
        self.vllm_text = QPlainTextEdit()
        self.vllm_text.setReadOnly(True)
        self.vllm_text.setAccessibleName("vLLM tensor parallel plan")
        self.copy_llama = QPushButton("Copy llama-server command")
        self.copy_vllm = QPushButton("Copy vllm serve command")
        self.export_json = QPushButton("Copy both plans as JSON")
        for b in (self.copy_llama, self.copy_vllm, self.export_json):
            b.setEnabled(False)
        buttons = QHBoxLayout()
        for b in (self.copy_llama, self.copy_vllm, self.export_json):
            buttons.addWidget(b)
        buttons.addStretch(1)

        plans = QVBoxLayout()
        self.stale_note = QLabel("")
        plans.addWidget(self.stale_note)
        llama_title = QLabel("<b>llama.cpp</b>: whole layers per GPU (-sm layer)")
        vllm_title = QLabel("<b>vLLM</b>: every layer sharded over the GPUs (tensor parallel)")
        for title in (llama_title, vllm_title):
            title.setWordWrap(True)  # read whole at any width and type size
        plans.addWidget(llama_title)
        plans.addWidget(self.llama_text)
        plans.addWidget(vllm_title)
        plans.addWidget(self.vllm_text)
        plans.addLayout(buttons)
        layout = QHBoxLayout(self)
        layout.addWidget(form_box, 1)
        layout.addLayout(plans, 3)
        self.stale = StaleMark(
            self.stale_note, [self.llama_text, self.vllm_text], "press Plan", ("model", "people", "conversation length")
        )
        self.plan_button.clicked.connect(self.plan)
        self._job = JobRunner("plan", self)
        self._job.finished.connect(self._on_planned)
        self._job.failed.connect(self._on_failed)
        self._job.running_changed.connect(self._on_running)
        self.copy_llama.clicked.connect(lambda: self._copy(self.split.command if self.split else ""))
        self.copy_vllm.clicked.connect(lambda: self._copy(self.vllm.command if self.vllm else ""))
        self.export_json.clicked.connect(self._copy_json)

    def plan(self) -> int:
        """Plans on the tab's worker (reading a GGUF file and searching the split take a moment);
        returns the job's id, 0 while a plan is still being made."""
        gpu = self.gpu_combo.currentData()
        count = self.count.value()
        dtype = self.dtype.currentData()
        max_seqs = self.max_seqs.value()
        utilization = self.utilization.value()
        current = self._current

        def work(_report: Report) -> tuple[str, ScaleOut]:
            model, settings, context, sequences, host_ram = current()
            plans = scale_out(
                model,
                settings,
                gpu,
                count,
                host_ram,
                dtype=dtype,
                context_per_sequence=context,
                max_num_seqs=max_seqs,
                gpu_memory_utilization=utilization,
            )
            summary = (
                f"{model.label}, {context:,} tokens per sequence, {sequences} sequence(s) for llama.cpp, on {count} x "
                f"{gpu.name}."
            )
            return summary, plans

        job = self._job.start(work)
        if job:
            self.stale.begin()
            self.message.setText("Planning…")
        return job

    def _on_running(self, running: bool) -> None:
        self.plan_button.setEnabled(not running)

    def _on_failed(self, _job_id: int, message: str) -> None:
        self.message.setText(message)

    def _on_planned(self, _job_id: int, outcome: tuple[str, ScaleOut]) -> None:
        summary, plans = outcome
        self.split, self.vllm = plans.split, plans.vllm
        self.llama_text.setPlainText("\n".join([*plans.split.summary_lines(), "", plans.split.command]))
        if plans.vllm is not None:
            self.vllm_text.setPlainText("\n".join([*plans.vllm.summary_lines(), "", plans.vllm.command]))
        else:
            self.vllm_text.setPlainText(f"vLLM cannot serve it this way: {plans.vllm_problem}")
        self.message.setText(summary)
        self.stale.done()
        self.copy_llama.setEnabled(True)
        self.copy_vllm.setEnabled(self.vllm is not None)
        self.export_json.setEnabled(True)

    def shutdown(self) -> None:
        self._job.close(timeout=5)

    def _copy(self, text: str) -> None:
        if text:
            QGuiApplication.clipboard().setText(text)

    def _copy_json(self) -> None:
        data = {
            "llama_cpp": self.split.to_json() if self.split else None,
            "vllm": self.vllm.to_json() if self.vllm else None,
        }
        self._copy(json.dumps(data, indent=2))
