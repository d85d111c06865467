"""``fitscope estimate --hf / --ollama`` (a repository's GGUF files, or one file's estimate from its
header) and ``fitscope models --remote`` (the headers read before), over ``app.services.remote``.

What was fetched is said on stderr, so the estimate on stdout reads exactly as ``--gguf`` prints it
for the same file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

from app.core.common.errors import FitScopeError
from app.core.common.units import GIB, MIB


def estimate_remote(args: argparse.Namespace):
    """(model, projector or None, file name) for --hf/--ollama; None after listing a repository."""
    from app.core.model.remote import parse_hf_ref
    from app.services.remote import Fetch, list_remote, resolve_remote

    fetch = Fetch()
    if args.hf:
        _repo, path, _rev = parse_hf_ref(args.hf)
        if path is None and not args.quant:
            print(format_listing(list_remote("hf", args.hf, fetch, revision=args.revision)))
            return None
        model, projector, chosen = resolve_remote("hf", args.hf, args.quant, args.projector, fetch, args.revision)
    else:
        if args.quant or args.revision:
            raise FitScopeError("--quant and --revision are for --hf; an Ollama tag names one file (MODEL:TAG).")
        model, projector, chosen = resolve_remote("ollama", args.ollama, None, args.projector, fetch)
    t = fetch.transfer
    fetched = f"{t.body_bytes / MIB:,.2f} MiB in {t.requests} request(s)" if t.requests else "nothing"
    cached = f"; {fetch.from_cache} header(s) from the cache" if fetch.from_cache else ""
    print(f"{chosen.path} ({chosen.size_bytes / GIB:,.2f} GiB): fetched {fetched}{cached}.", file=sys.stderr)
    # The file a download keeps (an Ollama blob has no name of its own).
    return model, projector, chosen.name if args.hf else "MODEL.gguf"


def format_listing(listing) -> str:
    """A repository's GGUF files as a table: quantization, size, parts, file; then its projectors."""
    lines = [f"{listing.repo} at {listing.revision[:12]} ({listing.host})"]
    if listing.note:
        lines.append(listing.note)
    if not listing.models:
        lines.append("No GGUF model in this repository." if not listing.projectors else "Only vision projectors:")
    rows = [("model", f) for f in listing.models] + [("projector", f) for f in listing.projectors]
    if rows:
        lines.append(f"  {'kind':9s} {'quant':12s} {'size':>10s} {'parts':>5s}  file")
    for kind, f in rows:
        missing = f"  (missing {len(f.missing_parts)} part(s))" if f.missing_parts else ""
        lines.append(
            f"  {kind:9s} {f.quant or '?':12s} {f.size_bytes / GIB:8.2f}G {len(f.parts):5d}  {f.path}{missing}"
        )
    if listing.models:
        lines.append(
            f"\nEstimate one: fitscope estimate --hf {listing.repo} --quant {listing.models[0].quant or 'QUANT'}"
            + (" --projector" if listing.projectors else "")
        )
    return "\n".join(lines)


def cmd_models_remote(as_json: bool) -> int:
    """``fitscope models --remote``: the remote headers in the cache, newest first."""
    from app.adapters.header_cache import HeaderCache

    entries = HeaderCache().entries()
    if as_json:
        print(json.dumps([vars(e.key) | {k: v for k, v in vars(e).items() if k != "key"} for e in entries], indent=2))
        return 0
    if not entries:
        print("No remote GGUF header has been read yet (fitscope estimate --hf ORG/REPO lists a repository).")
        return 0
    print(f"{'source':7s} {'arch':12s} {'quant':10s} {'size':>9s} {'header':>8s}  {'fetched':16s}  file")
    for e in entries:
        when = datetime.datetime.fromtimestamp(e.fetched_at).strftime("%Y-%m-%d %H:%M")
        where = f"{e.key.repo}/{e.key.file}" if e.key.source == "hf" else f"{e.key.repo} ({e.key.file})"
        print(
            f"{e.key.source:7s} {e.arch[:12]:12s} {e.quant[:10]:10s} {e.file_size_bytes / GIB:8.2f}G "
            f"{e.header_bytes / MIB:6.2f}M  {when:16s}  {where} @ {e.key.revision[:12]}"
        )
    return 0
