#!/usr/bin/env bash
# polyrail's test command (the README's second command; CI runs it through .ci/run).
#
#   scripts/test.sh
#
# 1. unit, property and conformance tests of every crate, and the whole-job tests through the
#    launcher (2, 4 and 8 ranks over each channel, faults, truncated segments) - `cargo test`;
# 2. jobs under MPICH's Hydra: the PMI probe with PMI-1 and PMI-2, then polyrail programs;
# 3. the benchmark runner and the criterion benches once each in quick mode (no timing asserted).
set -euo pipefail
cd "$(dirname "$0")/.."

# mpich for the Hydra tests (skipped without it); see scripts/install-deps.sh.
scripts/install-deps.sh || echo "== could not install mpich: the Hydra tests will be skipped"

echo "== cargo test (release build: the job tests move up to 8 MiB per message)"
cargo test --workspace --release

cargo build --release --examples --quiet
if command -v mpiexec.hydra > /dev/null; then
    echo "== Hydra (mpiexec.hydra)"
    scripts/hydra-test.sh 4
    for pmi in 1 2; do
        POLYRAIL_PMI=$pmi timeout 120 mpiexec.hydra -n 4 target/release/examples/ring
        POLYRAIL_PMI=$pmi timeout 120 mpiexec.hydra -n 4 target/release/examples/halo 32 5
    done
    echo "hydra: polyrail ring and halo examples ok"
    # Nodes with devices (--layout 1+1,1+1 of polyrail run): each block of Hydra's command line
    # places one rank, so host and device ranks talk over scif, the nodes over ib.
    cargo build --release --workspace --quiet
    place() { echo "-n 1 -env POLYRAIL_NODE $1 -env POLYRAIL_DOMAIN $2 -env POLYRAIL_DOMAINS 2"; }
    ring=target/release/examples/ring
    timeout 120 mpiexec.hydra $(place 0 0) $ring : $(place 0 1) $ring : $(place 1 0) $ring : $(place 1 1) $ring
    check="target/release/polyrail-bench latency --sizes 8,16k,64k,1m,4m --validate --iters 10"
    timeout 300 mpiexec.hydra $(place 0 0) $check : $(place 0 1) $check > /dev/null
    echo "hydra: ring over host and device ranks of two nodes, checked messages host <-> device ok"
else
    echo "== Hydra tests skipped: no mpiexec.hydra (Debian package mpich)"
fi

echo "== examples through polyrail run"
cargo build --release --workspace --quiet
run=target/release/polyrail
timeout 120 $run run -n 2 target/release/examples/pingpong > /dev/null
timeout 120 $run run -n 8 target/release/examples/ring > /dev/null
timeout 120 $run run -n 4 target/release/examples/halo > /dev/null
POLYRAIL_TRANSPORTS=shm timeout 120 $run run -n 2 target/release/examples/channel_choice > /dev/null
timeout 60 $run info > /dev/null
tuning=$(mktemp)
timeout 120 $run tune --quick -o "$tuning" > /dev/null
grep -q '^cma_threshold ' "$tuning"
POLYRAIL_TUNING="$tuning" timeout 60 $run info | grep -q 'measured by `polyrail tune`'
if POLYRAIL_TUNING=/nonexistent/tuning $run info 2> /tmp/polyrail-badtuning.txt; then
    echo "a missing POLYRAIL_TUNING file was accepted" >&2
    exit 1
fi
grep -q "POLYRAIL_TUNING" /tmp/polyrail-badtuning.txt
if POLYRAIL_TRANSPORTS=tcp $run run -n 2 target/release/examples/ring 2> /tmp/polyrail-badenv.txt; then
    echo "a bad POLYRAIL_TRANSPORTS value was accepted" >&2
    exit 1
fi
grep -q "POLYRAIL_TRANSPORTS" /tmp/polyrail-badenv.txt
# A rank that no channel connects to its peers (cma carries no messages) says so once, not once
# per peer: 8 lines for 8 ranks.
POLYRAIL_TRANSPORTS=cma timeout 120 $run run -n 8 target/release/examples/ring > /dev/null 2> /tmp/polyrail-unreachable.txt || true
warned=$(grep -c 'WARN.*no channel carries messages' /tmp/polyrail-unreachable.txt || true)
if [ "$warned" != 8 ] || [ "$(grep -c 'no channel carries messages to 7 ranks' /tmp/polyrail-unreachable.txt)" != 8 ]; then
    echo "unreachable peers: expected one line per rank, got:" >&2
    grep 'no channel carries' /tmp/polyrail-unreachable.txt | head -5 >&2
    exit 1
fi
# Started by a launcher it cannot join (Open MPI's mpirun sets these), a rank is no silent
# job of one: it fails naming what it found.
if PMIX_RANK=0 OMPI_COMM_WORLD_SIZE=2 target/release/examples/ring 2> /tmp/polyrail-pmix.txt; then
    echo "a rank of a PMIx launcher ran as a job of one" >&2
    exit 1
fi
grep -q "OMPI_COMM_WORLD_SIZE=2" /tmp/polyrail-pmix.txt
echo "examples ok"

echo "== benchmarks, quick mode"
# Every channel's messages checked byte by byte (--validate), then the measurements as run.
for t in auto shm cma ib; do
    timeout 300 target/release/polyrail-bench latency --quick --validate --transport "$t" --sizes 0,8,4k,64k,1m
    timeout 300 target/release/polyrail-bench bw --quick --validate --transport "$t" --sizes 8,64k,1m
done
timeout 300 target/release/polyrail-bench bw --quick --validate --registered --sizes 64k,4m
timeout 300 target/release/polyrail-bench latency --quick --validate --heap --sizes 64k,4m
timeout 300 target/release/polyrail-bench latency --quick --sizes 0,8,4k,64k,1m
timeout 300 target/release/polyrail-bench bw --quick --sizes 4k,1m
timeout 300 target/release/polyrail-bench latency --quick --transport shm --sizes 8,1m
timeout 300 target/release/polyrail-bench bibw --quick --sizes 4k,1m
timeout 300 target/release/polyrail-bench mbw-mr --quick -n 4 --sizes 8,64k
timeout 300 target/release/polyrail-bench skew --messages 20 --repeats 1 --sizes 4k,64k
timeout 300 target/release/polyrail-bench overlap --quick --sizes 1m
timeout 300 target/release/polyrail-bench latency --quick --transport ib --sizes 8,64k,1m
timeout 300 target/release/polyrail-bench bw --quick --transport ib --registered --sizes 64k,1m
timeout 300 target/release/polyrail-bench discovery --quick --policies all,dynamic:8
# A rank waiting on a stopped peer sleeps rather than spins.
scripts/stopped-peer-test.sh
csv=$(mktemp -d)/points.csv
timeout 300 target/release/polyrail-bench compare --quick --sizes 8,64k --csv "$csv"
grep -q '^latency,' "$csv"
grep -q '^latency_fresh,auto,' "$csv"
# A forced channel that cannot carry the messages fails its runs (not measuring another
# channel under its name); compare shows their cells as missing and fails.
if POLYRAIL_TRANSPORTS=shm,self timeout 300 target/release/polyrail-bench compare --quick --sizes 8 \
    > /tmp/polyrail-compare-denied.txt 2>&1; then
    echo "compare with cma denied succeeded" >&2
    exit 1
fi
grep -Eq '^ +8 +[0-9.]+ +[0-9.]+ +- ' /tmp/polyrail-compare-denied.txt
grep -q 'latency over cma failed' /tmp/polyrail-compare-denied.txt
if [ -d crates/bench/benches ] && ls crates/bench/benches/*.rs > /dev/null 2>&1; then
    timeout 900 cargo bench -p polyrail-bench -- --test
fi
echo "all tests passed"
