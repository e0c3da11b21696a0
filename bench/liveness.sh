#!/bin/sh
# bench/liveness.sh: how fast a hung peer is found with default settings
# (DT_HEARTBEAT_MS=500, DT_LIVENESS_MS=5000, DT_TIMEOUT_MS unset = 30 min).
#
# Runs test_liveness's slow matrices (needs root for the network namespaces):
#   - a rank SIGSTOPped while the others run 1 KiB all_reduces in a loop: the time from
#     the SIGSTOP to the error of the slowest other rank; 2 and 4 ranks, shm and tcp,
#     10 trials each, the frozen rank cycling over every position (rank 0 = the store);
#     whether any error named a healthy rank;
#   - the link between two network namespaces cut (ip link set down) while 2 ranks
#     (one per namespace, tcp) run 4 MiB all_reduces: the time from the cut until both
#     ranks have returned from dt_pg_free, 10 trials.
# Prints one RESULT line per configuration (median and max in seconds).
#
#   bench/liveness.sh            (after make tests, or it builds them)
set -eu
cd "$(dirname "$0")/.."
make -s NODEPS=1 tests >/dev/null
DT_TEST_SLOW=1 build/release/tests/comm/test_liveness 2>/dev/null | grep -E '^(RESULT|SKIP|[0-9]+ passed)'
