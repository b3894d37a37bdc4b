# Sourced by the app e2e scripts (argument 1: the deltadeck binary): a work folder removed on exit
# (KEEP=1 keeps it) after killing any process the script put in `pids`, fail(), expect() and has(),
# a small corpus, the tiny model's config keys.
source "$(dirname "${BASH_SOURCE[0]}")/../support/e2e_base.sh" "$1"
# make_corpus FILE N TEXT: N text documents "TEXT 1" .. "TEXT N", each ended by a line "%".
make_corpus() {
  mkdir -p "$(dirname "$1")"
  for i in $(seq 1 "$2"); do printf '%s %d\n%%\n' "$3" "$i" >> "$1"; done
}
# expect RC OUTFILE COMMAND...: runs the command, its output to OUTFILE, and checks its exit code.
expect() {
  local want=$1 out=$2
  shift 2
  set +e
  "$@" > "$out" 2>&1
  local rc=$?
  set -e
  [ "$rc" = "$want" ] || { cat "$out" >&2; fail "'$*' exited $rc, expected $want"; }
}
# has FILE TEXT: FILE holds TEXT (else it is printed and the test fails).
has() { grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "expected '$2' in $1"; }; }
# The [model] keys of the tiny GPT most app e2e runs train (seconds on a CPU), for their TOML heredocs.
TINY_MODEL_KEYS='d = 64
L = 2
attn_heads = 2
attn_kv_heads = 1
attn_head_dim = 32
ffn_hidden = 128'
# run_gui RUNS_DIR CONFIG SCRIPT OUT: the app under Xvfb on a test script, its output to OUT and
# printed; a non-zero exit fails the test.
run_gui() {
  xvfb-run -a -s "-screen 0 1600x1000x24" "$bin" gui --runs-dir "$1" --config "$2" --gui-test-script "$3" \
    > "$4" 2>&1 || { local rc=$?; cat "$4"; fail "the app exited with $rc"; }
  cat "$4"
}
need_xvfb() { command -v xvfb-run > /dev/null || fail "xvfb-run is missing (scripts/setup installs xvfb)"; }
