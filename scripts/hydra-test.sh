#!/usr/bin/env bash
# Runs the PMI probe under MPICH's Hydra (mpiexec.hydra) with PMI-1 and PMI-2, over the
# inherited socket (PMI_FD) and over TCP (`-pmi-port`: PMI_PORT and PMI_ID).
# Fails (nonzero exit, message on stderr) if Hydra is missing, the build fails, or any rank
# does not report success. Usage: scripts/hydra-test.sh [ranks] (default 4).
set -euo pipefail

ranks="${1:-4}"
case "$ranks" in ""|*[!0-9]*|0) echo "hydra-test: ranks must be a positive integer, got $ranks" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."

fail() {
    echo "hydra-test: FAILED: $*" >&2
    exit 1
}

command -v mpiexec.hydra >/dev/null || fail "mpiexec.hydra not found (install MPICH: apt-get install mpich)"
cargo build --quiet -p polyrail-core --example pmi_probe || fail "cargo build of the pmi_probe example"
target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
probe="${target_dir:-target}/debug/examples/pmi_probe"
[ -x "$probe" ] || fail "$probe was not built"

for port in "" -pmi-port; do
    for pmi in 1 2; do
        what="POLYRAIL_PMI=$pmi mpiexec.hydra $port -n $ranks $probe"
        out="$(POLYRAIL_PMI=$pmi timeout 60 mpiexec.hydra $port -n "$ranks" "$probe" 2>&1)" \
            || fail "$what exited with $?:"$'\n'"$out"
        ok="$(grep -c "^pmi_probe rank [0-9]* of $ranks ok$" <<<"$out" || true)"
        [ "$ok" = "$ranks" ] || fail "$what: $ok of $ranks ranks reported ok:"$'\n'"$out"
        echo "hydra-test: PMI-$pmi ${port:-(PMI_FD)} with $ranks ranks: ok"
    done
done

# -pmi-port with a PMI_RANK and PMI_SIZE left in the environment by an outer launcher (Hydra
# forwards it): the ranks must come from PMI_ID and the handshake, not from those.
for pmi in 1 2; do
    what="PMI_RANK=0 PMI_SIZE=1 POLYRAIL_PMI=$pmi mpiexec.hydra -pmi-port -n $ranks $probe"
    out="$(PMI_RANK=0 PMI_SIZE=1 POLYRAIL_PMI=$pmi timeout 60 mpiexec.hydra -pmi-port -n "$ranks" "$probe" 2>&1)" \
        || fail "$what exited with $?:"$'\n'"$out"
    ok="$(grep -c "^pmi_probe rank [0-9]* of $ranks ok$" <<<"$out" || true)"
    [ "$ok" = "$ranks" ] || fail "$what: $ok of $ranks ranks reported ok:"$'\n'"$out"
    echo "hydra-test: PMI-$pmi -pmi-port with a stale PMI_RANK/PMI_SIZE and $ranks ranks: ok"
done
