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
cargo build --quiet -p polyrail-pmi --example pmi_probe || fail "cargo build of the pmi_probe example"
target_dir="$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
probe="${target_dir:-target}/debug/examples/pmi_probe"
[ -x "$probe" ] || fail "$probe was not built"

# Runs the probe under Hydra with the variables given before `--` (`POLYRAIL_PMI=1`, ...) and
# Hydra's options after it; `label` names the case. Every rank must report success.
run_probe() {
    local label="$1" vars=() opts=()
    shift
    while [ "$1" != "--" ]; do vars+=("$1"); shift; done
    shift
    opts=("$@")
    local what="${vars[*]} mpiexec.hydra ${opts[*]} -n $ranks $probe"
    local out
    out="$(env "${vars[@]}" timeout 60 mpiexec.hydra "${opts[@]}" -n "$ranks" "$probe" 2>&1)" \
        || fail "$what exited with $?:"$'\n'"$out"
    local ok
    ok="$(grep -c "^pmi_probe rank [0-9]* of $ranks ok$" <<<"$out" || true)"
    [ "$ok" = "$ranks" ] || fail "$what: $ok of $ranks ranks reported ok:"$'\n'"$out"
    echo "hydra-test: $label with $ranks ranks: ok"
}

for pmi in 1 2; do
    run_probe "PMI-$pmi (PMI_FD)" POLYRAIL_PMI=$pmi --
    run_probe "PMI-$pmi -pmi-port" POLYRAIL_PMI=$pmi -- -pmi-port
    # A PMI_RANK and PMI_SIZE left in the environment by an outer launcher (Hydra forwards it):
    # on a shared port the ranks must come from PMI_ID and the handshake, not from those.
    run_probe "PMI-$pmi -pmi-port with a stale PMI_RANK/PMI_SIZE" PMI_RANK=0 PMI_SIZE=1 POLYRAIL_PMI=$pmi -- -pmi-port
done
