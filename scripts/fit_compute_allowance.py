"""Measure the compute-buffer allowance of each architecture (resources/compute_allowance.json, read
by app.core.memory.graphs.ALLOWANCE).

    .venv/bin/python scripts/fit_compute_allowance.py [--dry] [--server] [--quick] [model-id ...] 2> rows.txt
    .venv/bin/python scripts/fit_compute_allowance.py [--dry] --from-rows rows.txt ...

For every model given (by default every model the proof cases use, tests/support/proof.py), a sparse
synthetic GGUF is dry-run by the vendored llama.cpp over a grid of cache sizes (graphs.ALLOWANCE_CELLS),
ubatches (graphs.ALLOWANCE_UBATCHES), f16 and q8_0 caches, one and four sequences, flash attention on
and off and both --swa-full modes; the estimator's modelled compute buffer (without any allowance) is
compared with llama.cpp's. The allowance at each (row, ubatch, cache size) is the largest shortfall
per ubatch token, in floats; a size not measured takes the largest of its measured neighbours, and a
ubatch not measured with four sequences the largest measured one. Each dry run is one line on stderr;
``--from-rows`` rebuilds the tables from such lines (the estimator unchanged since they were written)
without running llama.cpp. ``--server`` runs llama-server's settings instead (logits for its slots
only, window-sized SWA caches); give both kinds of rows to ``--from-rows`` for the whole table.
``--quick`` leaves ubatch 128 out (its values are then the larger ubatches').

Each model measured gets (or replaces) its own table in the JSON; a model not measured gets the widest
table of its architecture's measured models (graphs.by_architecture). ``--dry`` prints the JSON
without writing it. The largest over-estimate each table then leaves on the grid is printed. About a
minute per model on two cores.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.adapters.llamacpp_probe import ProbeError  # noqa: E402
from app.core.memory import graphs  # noqa: E402
from app.core.memory.estimate import estimate  # noqa: E402
from app.core.memory.graphs import (  # noqa: E402
    ALLOWANCE_CELLS,
    ALLOWANCE_PATH,
    ALLOWANCE_UBATCHES,
    allowance_key,
    allowance_row,
)
from app.core.memory.kv import context_cells  # noqa: E402
from app.core.model.quant import quantize_layout  # noqa: E402
from tests.support.proof import CASES, CPU_HOST, Case, architecture_for, measure  # noqa: E402
from tests.support.synthetic_gguf import write_sparse_gguf  # noqa: E402

NO_FA_LIMIT = 32768 * 512  # scores beyond this many cells x tokens tell nothing new and take long
SERVER = "llama-server"
LLAMA_CPP_PYTHON = "0.3.36"


@dataclass(frozen=True)
class Measured:
    model_id: str
    key: str
    row: int
    n_ub: int
    n_kv: int
    model_bytes: int
    real_bytes: int

    @property
    def short(self) -> float:
        return (self.real_bytes - self.model_bytes) / (self.n_ub * 4)


def grid(model_id: str, swa: bool, ubatches: tuple[int, ...] = ALLOWANCE_UBATCHES) -> list[Case]:
    cases = []
    for fa in (True, False):
        for ub in ubatches:
            for ctx in ALLOWANCE_CELLS:
                if not fa and ctx * ub > NO_FA_LIMIT:
                    continue
                cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa))
                if fa and ub == 512:  # a quantized cache changes what the attention leaves behind
                    cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, cache_k="q8_0", cache_v="q8_0"))
                if swa and ctx >= 8192:
                    cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, swa_full=False))
        v = "q8_0" if fa else "f16"  # a quantized V cache needs flash attention
        for ctx in (2048, 8192, 32768, 131072):
            if fa or ctx * 512 <= 4 * NO_FA_LIMIT:
                for full in (True, False) if swa else (True,):
                    cases.append(
                        Case(model_id, context=ctx, parallel=4, flash_attn=fa, cache_k="q8_0", cache_v=v, swa_full=full)
                    )
    return cases


def server_grid(model_id: str, swa: bool) -> list[Case]:
    """llama-server's settings: logits for its slots only, a window-sized SWA cache (and a full one at
    ubatch 512 with flash attention)."""
    cases = []
    for fa in (True, False):
        for ub in (512, 2048):
            for ctx in ALLOWANCE_CELLS:
                if not fa and ctx * ub > NO_FA_LIMIT:
                    continue
                cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, swa_full=False, consumer=SERVER))
                if swa and fa and ub == 512:
                    cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, consumer=SERVER))
        v = "q8_0" if fa else "f16"
        for ctx in (2048, 8192, 32768, 131072):
            if fa or ctx * 512 <= 4 * NO_FA_LIMIT:
                cases.append(
                    Case(model_id, context=ctx, parallel=4, flash_attn=fa, cache_k="q8_0", cache_v=v, swa_full=False,
                         consumer=SERVER)
                )
    return cases


def run_model(
    model_id: str, workdir: Path, server: bool = False, ubatches: tuple[int, ...] = ALLOWANCE_UBATCHES
) -> list[Measured]:
    arch = architecture_for(model_id)
    tensors = quantize_layout(arch, "Q4_K_M")
    path = workdir / f"{model_id}.gguf"
    write_sparse_gguf(path, arch, "Q4_K_M", tensors)
    out = []
    cases = server_grid(model_id, arch.uses_swa) if server else grid(model_id, arch.uses_swa, ubatches)
    for case in cases:
        settings = case.settings()
        est = estimate(arch, tensors, settings.model_copy(update={"repack": "none"}), [CPU_HOST])
        try:
            real = measure(path, settings).compute_bytes
        except ProbeError:
            continue  # a setting this architecture refuses (e.g. different K and V cache types for MLA)
        n_ub = min(settings.effective_ubatch, -(-settings.context_tokens // 256) * 256)
        cells, streams = context_cells(settings)
        n_kv = next((c.cells for c in est.kv_caches if c.kind == "full"), cells)
        window = arch.uses_swa and not settings.swa_full
        row = allowance_row(settings.flash_attn, streams, window, settings.n_outputs_max < n_ub)
        m = Measured(model_id, allowance_key(arch), row, n_ub, n_kv, est.compute_bytes, real)
        out.append(m)
        print(f"    {case.label:70s} key {m.key} row {m.row} n_ub {n_ub} cells {n_kv} model {m.model_bytes} "
              f"real {m.real_bytes} short {m.short:.0f} floats/token", file=sys.stderr, flush=True)
    return out


ROW_LINE = re.compile(
    r"^\s+(\S+) .* key (\S+) row (\d) n_ub (\d+) cells (\d+) model (\d+) real (\d+) short"
)


def read_rows(path: Path) -> list[Measured]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        m = ROW_LINE.match(line)
        if m:
            out.append(Measured(m[1], m[2], int(m[3]), int(m[4]), int(m[5]), int(m[6]), int(m[7])))
    return out


def _slot(grid_values: tuple[int, ...], n: int) -> int:
    """The grid entry a measurement at ``n`` is stored under: its own, or the next one above."""
    return next((i for i, g in enumerate(grid_values) if n <= g), len(grid_values) - 1)


def _fill(values: list[float | None]) -> list[float | None]:
    out = list(values)
    if all(v is None for v in values):
        return out
    for i, v in enumerate(values):
        if v is None:
            below = next((w for w in reversed(values[:i]) if w is not None), 0.0)
            above = next((w for w in values[i + 1 :] if w is not None), 0.0)
            out[i] = max(below, above)
    return out


def table_of(measured: list[Measured]) -> graphs.Table:
    """Rows 0-3, 4-7 when window-sized SWA caches or llama-server's logits were measured, 8-15 when
    llama-server's were (a row measured at no ubatch takes the values of the row that stands for it:
    the one with one stream more or less measured, then the full-size cache's, then llama-cpp-python's)."""
    top = max(m.row for m in measured)
    n_rows = 16 if top >= 8 else 8 if top >= 4 else 4
    cells: list[list[list[float | None]]] = [
        [[None] * len(ALLOWANCE_CELLS) for _ in ALLOWANCE_UBATCHES] for _ in range(n_rows)
    ]
    for m in measured:
        u, c = _slot(ALLOWANCE_UBATCHES, m.n_ub), _slot(ALLOWANCE_CELLS, m.n_kv)
        cells[m.row][u][c] = max(cells[m.row][u][c] or 0.0, m.short)
    table: list[tuple[tuple[int, ...], ...]] = []
    for r, row in enumerate(cells):
        filled = [_fill(per_ub) for per_ub in row]
        measured_ubs = [f for f in filled if f[0] is not None]
        if not measured_ubs and r >= 4:
            table.append(table[r - 4] if r >= 12 or r < 8 else table[r - 8])
            continue
        widest = [max(vs) for vs in zip(*measured_ubs, strict=True)] if measured_ubs else [0.0] * len(ALLOWANCE_CELLS)
        table.append(
            tuple(
                tuple(max(0, int(-(-(v if v is not None else w) // 1))) for v, w in zip(f, widest, strict=True))
                for f in filled
            )
        )
    return tuple(table)


def worst_over(measured: list[Measured]) -> float:
    from app.core.memory.graphs import allowance_per_token

    worst = 0.0
    for m in measured:
        arch = architecture_for(m.model_id)
        extra = m.n_ub * 4 * allowance_per_token(
            arch, m.n_kv, m.n_ub, m.row % 2 == 0, 2 if m.row % 4 >= 2 else 1, m.row % 8 >= 4, m.row >= 8
        )
        worst = max(worst, (m.model_bytes + extra - m.real_bytes) / m.real_bytes)
    return worst


def main(argv: list[str]) -> int:
    dry, server, quick = "--dry" in argv, "--server" in argv, "--quick" in argv
    args = [a for a in argv if a not in ("--dry", "--server", "--quick")]
    ubatches = ALLOWANCE_UBATCHES[1:] if quick else ALLOWANCE_UBATCHES
    measured: list[Measured] = []
    if args[:1] == ["--from-rows"]:
        for name in args[1:]:
            measured += read_rows(Path(name))
    else:
        ids = args or list(dict.fromkeys(c.model_id for c in CASES))
        graphs.ALLOWANCE.clear()  # measure the model alone
        graphs.MODEL_ALLOWANCE.clear()
        with tempfile.TemporaryDirectory() as tmp:
            for model_id in ids:
                measured += run_model(model_id, Path(tmp), server, ubatches)
    raw = json.loads(ALLOWANCE_PATH.read_text(encoding="utf-8"))
    by_model: dict[str, list[Measured]] = defaultdict(list)
    for m in measured:
        by_model[m.model_id].append(m)
    for model_id, rows in by_model.items():
        arch = architecture_for(model_id)
        table = table_of(rows)
        raw["models"][model_id] = {
            "key": allowance_key(arch),
            "n_embd": arch.n_embd,
            "n_vocab": arch.n_vocab,
            "floats_per_token": table,
        }
        own = graphs.MeasuredAllowance(allowance_key(arch), arch.n_embd, arch.n_vocab, table)
        graphs.MODEL_ALLOWANCE[model_id] = own
    graphs.ALLOWANCE.clear()
    graphs.ALLOWANCE.update(graphs.by_architecture(graphs.MODEL_ALLOWANCE))
    for model_id, rows in sorted(by_model.items()):
        print(f"{model_id:28s} {rows[0].key:24s} largest over-estimate left on the grid {100 * worst_over(rows):5.1f}%")
    raw["models"] = {k: v for k, v in sorted(raw["models"].items())}
    text = json.dumps(raw, indent=1)
    # one ubatch's values per line
    text = re.sub(r"\[\s+([-\d,\s]+?)\s+\]", lambda m: "[" + ", ".join(m[1].split()).replace(",,", ",") + "]", text)
    if dry:
        print(text)
    else:
        ALLOWANCE_PATH.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {ALLOWANCE_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
