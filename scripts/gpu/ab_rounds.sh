#!/bin/bash
# Two variants of `deltadeck bench train` measured in alternating rounds within one call (how
# docs/perf.md compares a change: the machine's clocks drift between runs, and the first run of a
# fresh machine is faster than the ones after it), and optionally one traced step of each with the
# mean time a launch of chosen kernels. Usage, from the checkout on the GPU machine:
#   A_ENV="DD_PROBE=1" A="" B="--state-products tight" ROUNDS=3 GPT=2 TRACES=2 REF="backward_tail" \
#     KERNELS="state_grads;copy_warps_kernel<6, 96, true" \
#     bash scripts/gpu/ab_rounds.sh --family hybrid --preset base --batch 8 --seq-len 2048
#   A, B          each variant's extra flags (empty: the defaults)
#   A_ENV, B_ENV  each variant's environment assignments (NAME=value, space-separated)
#   ROUNDS        alternating rounds (default 3); GPT: rounds of --family gpt at the same shape after
#                 them (default 0), the denominator of the hybrid's ratio
#   KERNELS       ';'-separated name patterns (Python regexes): a traced step of each variant, each
#                 pattern's launches and mean µs (scripts/gpu/kernel_means.py) and the step's span
#   REF           with KERNELS: a pattern for a kernel neither variant changes; each mean is also
#                 given as a multiple of its mean in the same trace (traces drift with the clocks)
#   TRACES        with KERNELS: traced steps of each variant (default 1), in the order a b b a a b ...,
#                 so that neither variant always runs first
#   BIN           the binary (default build-gpu/app/deltadeck); OUT the folder for the traces'
#                 timelines (default $OUT, else /tmp)
#   A_BIN, B_BIN  each variant's own binary (default BIN), to compare two builds, e.g. main's built
#                 from a worktree (build_target.sh's SRC=.before BUILD=build-before) against this tree's;
#                 the GPT rounds run BIN
# The remaining arguments go to every run (the GPT rounds replace --family).
set -uo pipefail
bin=${BIN:-build-gpu/app/deltadeck}
a_bin=${A_BIN:-$bin}
b_bin=${B_BIN:-$bin}
rounds=${ROUNDS:-3}
out=${OUT:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
read -ra a_flags <<< "${A:-}"
read -ra b_flags <<< "${B:-}"
read -ra a_env <<< "${A_ENV:-}"
read -ra b_env <<< "${B_ENV:-}"

# run VARIANT ARGS...: one bench run of variant a or b with ARGS after the common arguments.
run() {
  local v=$1
  shift
  if [ "$v" = a ]; then
    env "${a_env[@]}" "$a_bin" bench train "$@" "${a_flags[@]}"
  else
    env "${b_env[@]}" "$b_bin" bench train "$@" "${b_flags[@]}"
  fi
}
row() { grep -E '^\| [a-z0-9-]+/' || echo "(no table row: the run failed)"; }

for ((i = 1; i <= rounds; ++i)); do
  for v in a b; do
    echo "round $i $v: $(run $v --steps 30 --warmup 5 "$@" 2>&1 | row)"
  done
done
if [ "${GPT:-0}" -gt 0 ]; then
  # The same arguments with the family replaced.
  args=()
  skip=0
  for x in "$@"; do
    if [ $skip = 1 ]; then skip=0; continue; fi
    if [ "$x" = --family ]; then skip=1; continue; fi
    args+=("$x")
  done
  for ((i = 1; i <= GPT; ++i)); do
    echo "gpt $i: $("$bin" bench train --family gpt --steps 30 --warmup 5 "${args[@]}" 2>&1 | row)"
  done
fi
if [ -n "${KERNELS:-}" ]; then
  IFS=';' read -ra patterns <<< "$KERNELS"
  ref=()
  [ -n "${REF:-}" ] && ref=(--ref "$REF")
  for ((i = 1; i <= ${TRACES:-1}; ++i)); do
    order="a b"
    [ $((i % 2)) = 0 ] && order="b a"
    for v in $order; do
      run $v --steps 5 --warmup 5 --profile --profile-top 5 --profile-trace "$out/ab_$v.json" "$@" > /dev/null 2>&1
      python3 "$here/graph_timeline.py" "$out/ab_$v.json" "$out/ab_timeline_$v.txt" > /dev/null 2>&1 &&
        echo "traced $v: $(python3 "$here/kernel_means.py" "$out/ab_timeline_$v.txt" "${ref[@]}" "${patterns[@]}")" ||
        echo "traced $v: no trace (the run or graph_timeline.py failed)"
      rm -f "$out/ab_$v.json"
    done
  done
fi
