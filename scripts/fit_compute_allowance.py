"""Measure the compute-buffer allowance of each architecture (resources/compute_allowance.json, read
by app.core.memory.graphs.ALLOWANCE).

    .venv/bin/python scripts/fit_compute_allowance.py [--dry] [--server] [--quick] [model-id ...] 2> rows.txt
    .venv/bin/python scripts/fit_compute_allowance.py [--dry] --from-rows rows.txt ...

For every model given (by default every model the proof cases use, tests/support/proof.py), a sparse
synthetic GGUF is dry-run by the vendored llama.cpp over a grid of cache sizes (graphs.ALLOWANCE_CELLS,
and the model's trained context where it lies between two of them: model_cells),
ubatches (graphs.ALLOWANCE_UBATCHES), f16 and q8_0 caches, one and four sequences, flash attention on
and off and both --swa-full modes; the estimator's modelled compute buffer (without any allowance) is
compared with llama.cpp's. The allowance at each (row of graphs.ALLOWANCE_ROWS, ubatch, cache size) is
the largest shortfall per ubatch token, in floats; a size not measured takes the largest of its measured
neighbours, a ubatch not measured the largest measured one, a row not measured another's (_BORROW).
Each dry run is one line on stderr; ``--from-rows`` rebuilds the tables from such lines without
running llama.cpp: llama.cpp's figure is read from each line (the latest line of a case wins) and the
case is estimated again, so rows written before an estimator change still measure the estimator as
it is. ``--server`` runs llama-server's settings
instead (logits for its slots only, window-sized SWA caches); give both kinds of rows to
``--from-rows`` for the whole table. ``--quick`` leaves ubatch 128 out (its values are then the larger
ubatches'); ``--extra`` runs only the cases added with the quantized-cache rows (extra_grid).

Each model measured gets (or replaces) its own table in the JSON; a file of a measured model's shapes
takes that table, and a model not measured the widest table of its architecture's measured models
without negative entries (graphs.by_architecture). ``--dry`` prints the JSON
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
from app.core.common.units import pad_to  # noqa: E402
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
QV = {True: "q8_0", False: "f16"}  # the V cache with a q8_0 K cache: quantized V needs flash attention
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


def model_cells(model_id: str) -> tuple[int, ...]:
    """The cache sizes a model is measured at: ALLOWANCE_CELLS, and its trained context (in cells) where
    that lies between two of them, since people use it whole. A size between two measured ones takes the
    larger allowance of the two, which can be far from what llama.cpp needs there: LFM2 350M leaves its
    last feed-forward rows below the logits (+14,855 floats per token on the output head) at 65,536 and
    at 128,000 cells alike, but at 128,000 its modelled layers' peak, grown with the mask, is the larger
    part, and that allowance added to it was 17% high."""
    trained = pad_to(architecture_for(model_id).n_ctx_train, 256)
    if ALLOWANCE_CELLS[0] < trained < ALLOWANCE_CELLS[-1] and trained not in ALLOWANCE_CELLS:
        return tuple(sorted((*ALLOWANCE_CELLS, trained)))
    return ALLOWANCE_CELLS


def grid(model_id: str, swa: bool, ubatches: tuple[int, ...] = ALLOWANCE_UBATCHES) -> list[Case]:
    cases = []
    for fa in (True, False):
        for ub in ubatches:
            for ctx in model_cells(model_id):
                if not fa and ctx * ub > NO_FA_LIMIT:
                    continue
                cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa))
                if ub >= 512 and (fa or ub == 512):  # a quantized cache changes what the attention leaves behind
                    cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, cache_k="q8_0", cache_v=QV[fa]))
                if swa:
                    cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, swa_full=False))
        for ctx in (2048, 8192, 32768, 131072):
            if fa or ctx * 512 <= 4 * NO_FA_LIMIT:
                for full in (True, False) if swa else (True,):
                    cases.append(
                        Case(model_id, context=ctx, parallel=4, flash_attn=fa, swa_full=full, cache_k="q8_0",
                             cache_v=QV[fa])
                    )
            if ctx in (8192, 32768):
                cases.append(Case(model_id, context=ctx, parallel=4, flash_attn=fa))
        for ctx in (4096, 16384):  # between the sizes above: the streams' placement is not monotonic
            cases += [
                Case(model_id, context=ctx, parallel=4, flash_attn=fa),
                Case(model_id, context=ctx, parallel=4, flash_attn=fa, cache_k="q8_0", cache_v=QV[fa]),
            ]
    return cases


def server_grid(model_id: str, swa: bool) -> list[Case]:
    """llama-server's settings: logits for its slots only, a window-sized SWA cache (and a full one at
    ubatch 512 with flash attention)."""
    cases = []
    for fa in (True, False):
        for ub in (512, 2048):
            for ctx in model_cells(model_id):
                if not fa and ctx * ub > NO_FA_LIMIT:
                    continue
                cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, swa_full=False, consumer=SERVER))
                if swa and fa and ub == 512:
                    cases.append(Case(model_id, context=ctx, ubatch=ub, flash_attn=fa, consumer=SERVER))
                if fa and ub == 512:
                    cases.append(
                        Case(model_id, context=ctx, ubatch=ub, cache_k="q8_0", cache_v="q8_0", swa_full=False,
                             consumer=SERVER)
                    )
        for ctx in (2048, 8192, 32768, 131072):
            if fa or ctx * 512 <= 4 * NO_FA_LIMIT:
                cases.append(
                    Case(model_id, context=ctx, parallel=4, flash_attn=fa, swa_full=False, consumer=SERVER,
                         cache_k="q8_0", cache_v=QV[fa])
                )
            if fa and ctx in (8192, 32768):
                cases.append(Case(model_id, context=ctx, parallel=4, swa_full=False, consumer=SERVER))
    return cases


def extra_grid(model_id: str) -> list[Case]:
    """The cases the grids gained with the quantized-cache rows, to add to rows measured before them:
    q8_0 caches at ubatch 2048 and without flash attention, f16 caches with four sequences, q8_0 on
    llama-server."""
    cases = []
    for ctx in model_cells(model_id):
        cases.append(Case(model_id, context=ctx, ubatch=2048, cache_k="q8_0", cache_v="q8_0"))
        if ctx * 512 <= NO_FA_LIMIT:
            cases.append(Case(model_id, context=ctx, flash_attn=False, cache_k="q8_0", cache_v="f16"))
        cases.append(Case(model_id, context=ctx, cache_k="q8_0", cache_v="q8_0", swa_full=False, consumer=SERVER))
    for ctx in (8192, 32768):
        cases += [Case(model_id, context=ctx, parallel=4, flash_attn=fa) for fa in (True, False)]
        cases.append(Case(model_id, context=ctx, parallel=4, swa_full=False, consumer=SERVER))
    return cases


def run_model(
    model_id: str, workdir: Path, mode: str = "", ubatches: tuple[int, ...] = ALLOWANCE_UBATCHES
) -> list[Measured]:
    arch = architecture_for(model_id)
    tensors = quantize_layout(arch, "Q4_K_M")
    path = workdir / f"{model_id}.gguf"
    write_sparse_gguf(path, arch, "Q4_K_M", tensors)
    out = []
    if mode == "extra":
        cases = extra_grid(model_id)
    elif mode == "server":
        cases = server_grid(model_id, arch.uses_swa)
    else:
        cases = grid(model_id, arch.uses_swa, ubatches)
    for case in cases:
        try:
            real = measure(path, case.settings()).compute_bytes
        except ProbeError:
            continue  # a setting this architecture refuses (e.g. different K and V cache types for MLA)
        m = measured_row(case, real)
        out.append(m)
        print(f"    {case.label:70s} key {m.key} row {m.row} n_ub {m.n_ub} cells {m.n_kv} model {m.model_bytes} "
              f"real {m.real_bytes} short {m.short:.0f} floats/token", file=sys.stderr, flush=True)
    return out


ROW_LINE = re.compile(r"^\s+(\S+ .*?)\s+key \S+ row \d+ n_ub \d+ cells \d+ model \d+ real (\d+) short")
LABEL = re.compile(
    r"^(?P<model>\S+) (?P<quant>\S+) c=(?P<c>\d+) ub=(?P<ub>\d+) (?P<fa>fa|no-fa)"
    r"(?: kv=(?P<k>\w+)/(?P<v>\w+))?(?: np=(?P<np>\d+))?(?P<window> no-swa-full)?(?P<server> server)?$"
)


def case_of(label: str) -> Case:
    """The proof case a row's label was printed from (Case.label)."""
    m = LABEL.match(label)
    if m is None:
        raise ValueError(f"not a case label: {label!r}")
    return Case(
        m["model"],
        quant=m["quant"],
        context=int(m["c"]),
        ubatch=int(m["ub"]),
        flash_attn=m["fa"] == "fa",
        cache_k=m["k"] or "f16",
        cache_v=m["v"] or "f16",
        parallel=int(m["np"] or 1),
        swa_full=not m["window"],
        consumer=SERVER if m["server"] else "llama-cpp-python",
    )


def read_rows(paths: list[Path]) -> list[Measured]:
    """llama.cpp's reservations from rows written by earlier runs, the latest row of each case
    winning, against the estimator as it is now (each row's case is estimated again)."""
    real: dict[str, int] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            m = ROW_LINE.match(line)
            if m:
                real[m[1].strip()] = int(m[2])
    return [measured_row(case_of(label), value) for label, value in real.items()]


def measured_row(case: Case, real_bytes: int) -> Measured:
    """One measurement against the modelled compute buffer (without any allowance) of ``case``."""
    arch = architecture_for(case.model_id)
    tensors = quantize_layout(arch, "Q4_K_M")
    settings = case.settings()
    est = estimate(arch, tensors, settings.model_copy(update={"repack": "none"}), [CPU_HOST])
    n_ub = min(settings.effective_ubatch, -(-settings.context_tokens // 256) * 256)
    cells, streams = context_cells(settings)
    n_kv = next((c.cells for c in est.kv_caches if c.kind == "full"), cells)
    window = arch.uses_swa and not settings.swa_full
    quantized = settings.cache_type_k != "f16"
    row = allowance_row(settings.flash_attn, streams, window, settings.n_outputs_max < n_ub, quantized)
    return Measured(case.model_id, allowance_key(arch), row, n_ub, n_kv, est.compute_bytes, real_bytes)


def _slot(grid_values: tuple[int, ...], n: int) -> int:
    """The grid entry a measurement at ``n`` is stored under: its own, or the next one above."""
    return next((i for i, g in enumerate(grid_values) if n <= g), len(grid_values) - 1)


def _fill(values: list[float | None]) -> list[float | None]:
    out = list(values)
    if all(v is None for v in values):
        return out
    for i, v in enumerate(values):
        if v is None:
            below = next((w for w in reversed(values[:i]) if w is not None), None)
            above = next((w for w in values[i + 1 :] if w is not None), None)
            out[i] = max(w for w in (below, above) if w is not None)
    return out


# The order in which a row measured at no ubatch borrows a measured row's values: the row with the other
# cache type, then the other SWA cache size, the other stream count, the other logits reservation,
# then two of those at once, ...; flash attention last.
_BORROW = sorted(
    (mask for mask in range(1, 32)),
    key=lambda mask: (mask & 1, bin(mask).count("1"), [16, 4, 2, 8, 1].index(mask & -mask)),
)


def table_of(measured: list[Measured], sizes: tuple[int, ...] = ALLOWANCE_CELLS) -> graphs.Table:
    """All ALLOWANCE_ROWS at the cache sizes ``sizes`` (a row measured at no ubatch borrows another's:
    see _BORROW)."""
    n_rows = len(graphs.ALLOWANCE_ROWS)
    cells: list[list[list[float | None]]] = [
        [[None] * len(sizes) for _ in ALLOWANCE_UBATCHES] for _ in range(n_rows)
    ]
    for m in measured:
        u, c = _slot(ALLOWANCE_UBATCHES, m.n_ub), _slot(sizes, m.n_kv)
        old = cells[m.row][u][c]
        cells[m.row][u][c] = m.short if old is None else max(old, m.short)
    own: dict[int, tuple[tuple[int, ...], ...]] = {}
    for r, row in enumerate(cells):
        filled = [_fill(per_ub) for per_ub in row]
        measured_ubs = [f for f in filled if f[0] is not None]
        if not measured_ubs:
            continue
        widest = [max(vs) for vs in zip(*measured_ubs, strict=True)]  # a ubatch not measured: the largest
        # (a negative value: the modelled peak was above llama.cpp's at every measurement there)
        own[r] = tuple(
            tuple(int(-(-(v if v is not None else w) // 1)) for v, w in zip(f, widest, strict=True)) for f in filled
        )
    zero = tuple(tuple(0 for _ in sizes) for _ in ALLOWANCE_UBATCHES)
    return tuple(
        own.get(r) or next((own[r ^ mask] for mask in _BORROW if r ^ mask in own), zero) for r in range(n_rows)
    )


def worst_over(measured: list[Measured]) -> float:
    from app.core.memory.graphs import allowance_per_token

    worst = 0.0
    for m in measured:
        arch = architecture_for(m.model_id)
        flags = (m.row % 2 == 0, 2 if m.row % 4 >= 2 else 1, m.row % 8 >= 4, m.row % 16 >= 8, m.row >= 16)
        extra = m.n_ub * 4 * allowance_per_token(arch, m.n_kv, m.n_ub, *flags)
        worst = max(worst, (m.model_bytes + extra - m.real_bytes) / m.real_bytes)
    return worst


def _dump(raw: dict[str, object]) -> str:
    """The JSON with one row (its ubatches' lists) per line."""
    head = {k: v for k, v in raw.items() if k != "models"}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + [' "models": {']
    models = raw["models"]
    assert isinstance(models, dict)
    for i, (model_id, entry) in enumerate(models.items()):
        cells = f'"cells": {json.dumps(entry["cells"])}, ' if "cells" in entry else ""
        lines.append(
            f'  {json.dumps(model_id)}: {{"key": {json.dumps(entry["key"])}, "n_embd": {entry["n_embd"]}, '
            f'"n_vocab": {entry["n_vocab"]}, {cells}"floats_per_token": ['
        )
        rows = entry["floats_per_token"]
        last = len(rows) - 1
        lines += [f"   {json.dumps([list(u) for u in row])}" + ("," if r < last else "") for r, row in enumerate(rows)]
        lines.append("  ]}" + ("," if i < len(models) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    dry, quick = "--dry" in argv, "--quick" in argv
    mode = "server" if "--server" in argv else "extra" if "--extra" in argv else ""
    args = [a for a in argv if a not in ("--dry", "--server", "--quick", "--extra")]
    ubatches = ALLOWANCE_UBATCHES[1:] if quick else ALLOWANCE_UBATCHES
    measured: list[Measured] = []
    graphs.ALLOWANCE.clear()  # the modelled compute buffer alone, against which the allowance is measured
    graphs.MODEL_ALLOWANCE.clear()
    if args[:1] == ["--from-rows"]:
        measured = read_rows([Path(name) for name in args[1:]])
    else:
        ids = args or list(dict.fromkeys(c.model_id for c in CASES))
        with tempfile.TemporaryDirectory() as tmp:
            for model_id in ids:
                measured += run_model(model_id, Path(tmp), mode, ubatches)
    raw = json.loads(ALLOWANCE_PATH.read_text(encoding="utf-8"))
    by_model: dict[str, list[Measured]] = defaultdict(list)
    for m in measured:
        by_model[m.model_id].append(m)
    for model_id, rows in by_model.items():
        arch = architecture_for(model_id)
        # the trained context's cells where rows were measured there
        sizes = tuple(c for c in model_cells(model_id) if c in ALLOWANCE_CELLS or any(m.n_kv == c for m in rows))
        table = table_of(rows, sizes)
        entry: dict[str, object] = {"key": allowance_key(arch), "n_embd": arch.n_embd, "n_vocab": arch.n_vocab}
        if sizes != ALLOWANCE_CELLS:
            entry["cells"] = list(sizes)
        raw["models"][model_id] = entry | {"floats_per_token": table}
        own = graphs.MeasuredAllowance(allowance_key(arch), arch.n_embd, arch.n_vocab, table, sizes)
        graphs.MODEL_ALLOWANCE[model_id] = own
    graphs.ALLOWANCE.clear()
    graphs.ALLOWANCE.update(graphs.by_architecture(graphs.MODEL_ALLOWANCE))
    for model_id, rows in sorted(by_model.items()):
        print(f"{model_id:28s} {rows[0].key:24s} largest over-estimate left on the grid {100 * worst_over(rows):5.1f}%")
    raw["models"] = {k: v for k, v in sorted(raw["models"].items())}
    text = _dump(raw)
    if dry:
        print(text)
    else:
        ALLOWANCE_PATH.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {ALLOWANCE_PATH.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
