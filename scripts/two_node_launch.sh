#!/usr/bin/env bash
# A two-node run started by hand (no scheduler): run this on both machines, with NODE_RANK=0 on the
# one whose address is MASTER_ADDR and NODE_RANK=1 on the other. Every GPU of each machine becomes
# a rank; node 0 serves the rendezvous on MASTER_PORT and records the run.
#
#   MASTER_ADDR=10.0.0.1 NODE_RANK=0 scripts/two_node_launch.sh --config assets/configs/small.toml
#   MASTER_ADDR=10.0.0.1 NODE_RANK=1 scripts/two_node_launch.sh --config assets/configs/small.toml
set -euo pipefail
: "${MASTER_ADDR:?set MASTER_ADDR to node 0's address}"
: "${NODE_RANK:?set NODE_RANK to 0 or 1}"
exec build/app/deltadeck train --no-gui --nnodes 2 --node-rank "$NODE_RANK" --master-addr "$MASTER_ADDR" \
  --master-port "${MASTER_PORT:-29500}" --set 'run.devices="all"' "$@"
