# Sourced first by every e2e script's common file (argument 1: the deltadeck binary): strict mode,
# $bin, a work folder removed on exit (KEEP=1 keeps it) after killing any process the script put
# in `pids`, and fail().
set -euo pipefail
bin=$1
work=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
