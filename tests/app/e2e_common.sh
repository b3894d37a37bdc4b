# Sourced by the app e2e scripts (argument 1: the deltadeck binary): a work folder removed on exit
# (KEEP=1 keeps it) after killing any process the script put in `pids`, fail(), a small corpus.
set -euo pipefail
bin=$1
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# make_corpus FILE N TEXT: N text documents "TEXT 1" .. "TEXT N", each ended by a line "%".
make_corpus() {
  mkdir -p "$(dirname "$1")"
  for i in $(seq 1 "$2"); do printf '%s %d\n%%\n' "$3" "$i" >> "$1"; done
}
need_xvfb() { command -v xvfb-run > /dev/null || fail "xvfb-run is missing (scripts/setup installs xvfb)"; }
