#!/usr/bin/env bash
# Smoke-test a built bundle: the window comes up offscreen and shows its first estimate, the
# command line answers, and a live run starts its llama.cpp worker from inside the bundle.
#   packaging/smoke_test.sh [dist/FitScope/fitscope]
set -euo pipefail
exe="${1:-dist/FitScope/fitscope}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export FITSCOPE_CONFIG_DIR="$tmp/config" FITSCOPE_DATA_DIR="$tmp/data"
fail() { echo "smoke test FAILED: $*" >&2; exit 1; }

out="$(QT_QPA_PLATFORM=offscreen FITSCOPE_REPORT_STARTUP=1 timeout 120 "$exe" window --demo)" || fail "window: $out"
grep -q "first estimate on screen" <<< "$out" || fail "the window did not show an estimate: $out"
echo "ok  window: $out"

json="$(timeout 60 "$exe" estimate --model llama-3.1-8b --quant Q4_K_M -c 8192 --gpu rtx-4090 --json)" || fail "estimate"
kv="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["kv_cache_bytes"])' <<< "$json")"
[ "$kv" = "1073741824" ] || fail "estimate: kv_cache_bytes $kv, expected 1073741824"
echo "ok  estimate: Llama 3.1 8B at 8192 tokens, KV cache $kv bytes"

run="$(timeout 300 "$exe" run -n 8 --repeat 1 --no-save --json)" || fail "run"
python3 - "$run" <<'PY' || fail "run: figures missing"
import json, sys
r = json.loads(sys.argv[1])
assert r["decode_tokens_per_s"] > 0 and r["peak_rss_bytes"] > 0, r
assert all(abs(c["difference_bytes"]) < 0.02 * 2**20 for c in r["comparison"]), r["comparison"]
print(f"ok  run: decode {r['decode_tokens_per_s']:.1f} tok/s, every buffer within 0.02 MiB of the estimate")
PY
echo "smoke test passed"
