#!/usr/bin/env bash
# ib-vm-test.sh - test the ib channel on real rdma-core verbs (Soft-RoCE) in one QEMU guest.
#
# Usage: scripts/ib-vm-test.sh [--no-build] [--timeout SECS] [SCENARIO...]
#
# Builds, in release mode with the cargo feature `verbs`, into IB_VM_TARGET_DIR (default
# <repo>/target/verbs, apart from the usual target directory so that the two builds do not
# fight over the build lock or overwrite each other's binaries):
#   - the polyrail binary,
#   - the verbs integration tests of polyrail-ib (crates/ib/tests/verbs.rs),
#   - the whole-job test binary (crates/cli/tests/job.rs), which runs the scenario
#     named by its first argument when `polyrail run` starts it.
# Then boots ONE guest with scripts/rxe-vm.sh (rxe0, GID index 1) and runs there:
#   - the verbs integration tests (a missing device fails them: IB_TEST_REQUIRE_DEVICE=1),
#   - POLYRAIL_IB_PROVIDER=verbs polyrail run -n 2 --nodes 2 JOBTEST SCENARIO, and the same with
#     -n 4 --nodes 2, for each scenario (default: sizes order wildcard truncate flood registered cancel-race spaces space-ends). Ranks on
#     different virtual nodes talk over ib only, here over real verbs.
# Prints one `ok` or `FAIL` line per step with its time in the guest (output of failed steps
# follows their line) and exits non-zero when any step failed, 125 when the guest did not run.
#
# Options: --no-build reuses the binaries of the last build; --timeout is the whole guest run's
# limit (default 1200 s; the guest runs under TCG emulation, which is slow). Environment:
# IB_VM_TARGET_DIR (see above); POLYRAIL_* and RUST_* variables reach the guest (rxe-vm.sh
# forwards them), e.g. POLYRAIL_LOG=debug.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
TARGET_DIR=${IB_VM_TARGET_DIR:-$REPO/target/verbs}
BUILD=1
TIMEOUT=1200
SCENARIOS=()

usage() { sed -n '2,25p' "$SELF" | sed 's/^# \{0,1\}//'; exit 2; }

while (($#)); do
    case $1 in
    --no-build) BUILD=0; shift ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "ib-vm-test: unknown option $1" >&2; usage ;;
    *) SCENARIOS+=("$1"); shift ;;
    esac
done
((${#SCENARIOS[@]})) || SCENARIOS=(sizes order wildcard truncate flood registered cancel-race spaces space-ends)
for s in "${SCENARIOS[@]}"; do
    [[ $s =~ ^[a-z-]+$ ]] || { echo "ib-vm-test: bad scenario name $s" >&2; exit 2; }
done

STAGE=$TARGET_DIR/ib-vm-test
mkdir -p "$STAGE"

# The executable of the test target a `cargo test --no-run --message-format=json` run reports
# (the bin targets it builds on the way come in any order).
executable_of() {
    grep '"kind":\["test"\]' | grep -o '"executable":"[^"]*"' | tail -n 1 | sed 's/^"executable":"//; s/"$//'
}

if ((BUILD)); then
    cd "$REPO"
    export CARGO_TARGET_DIR=$TARGET_DIR
    t0=$SECONDS
    echo "ib-vm-test: building (release, --features verbs) in $TARGET_DIR" >&2
    cargo build --release -p polyrail-cli --features polyrail/verbs --bin polyrail
    verbs_test=$(cargo test --release -p polyrail-ib --features verbs --no-run --test verbs \
        --message-format=json-render-diagnostics | executable_of)
    job_test=$(cargo test --release -p polyrail-cli --features polyrail/verbs --no-run --test job \
        --message-format=json-render-diagnostics | executable_of)
    [[ -x $verbs_test && -x $job_test ]] || { echo "ib-vm-test: test executables not found" >&2; exit 1; }
    # Stable names in the guest (--bin copies by basename).
    cp -f "$TARGET_DIR/release/polyrail" "$STAGE/polyrail"
    cp -f "$verbs_test" "$STAGE/verbs-test"
    cp -f "$job_test" "$STAGE/job-test"
    echo "ib-vm-test: built in $((SECONDS - t0)) s" >&2
fi
for b in polyrail verbs-test job-test; do
    [[ -x $STAGE/$b ]] || { echo "ib-vm-test: $STAGE/$b missing (run without --no-build)" >&2; exit 1; }
done

# The guest's script (busybox sh). Each step: one ok/FAIL line with its time; the output of a
# failed step after it; a summary line at the end, and the exit status says how many failed.
guest=$(cat <<'EOF'
fails=0
now() { cut -d' ' -f1 /proc/uptime; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
step() {
    name=$1; shift
    t=$(now)
    "$@" > /tmp/step.log 2>&1
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "ok   $name ($(secs "$t" "$(now)") s)"
        return 0
    fi
    echo "FAIL $name (exit $rc after $(secs "$t" "$(now)") s)"
    sed 's/^/     | /' /tmp/step.log | tail -n 80
    fails=$((fails + 1))
    return 0
}
verbs_tests() {
    IB_TEST_REQUIRE_DEVICE=1 /opt/bin/verbs-test --test-threads 1 --nocapture > /tmp/verbs.log 2>&1
    rc=$?
    cat /tmp/verbs.log
    return $rc
}
echo "guest: $(uname -r), $(nproc) CPUs; rxe0 GID 1: $(cat /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null)"
step "verbs integration tests (crates/ib/tests/verbs.rs)" verbs_tests
grep -E '^test .* \.\.\. |^test result|in [0-9.]+ s|found gone' /tmp/verbs.log | sed 's/^/     | /'
export POLYRAIL_IB_PROVIDER=verbs
POLYRAIL_LOG=info timeout 60 polyrail info > /tmp/info.log 2>&1 || true
grep -m 1 'rdma-core verbs' /tmp/info.log | sed 's/^ */     | info: /'
for s in $SCENARIOS; do
    step "polyrail run -n 2 --nodes 2 job-test $s" timeout 600 polyrail run -n 2 --nodes 2 /opt/bin/job-test "$s"
    step "polyrail run -n 4 --nodes 2 job-test $s" timeout 600 polyrail run -n 4 --nodes 2 /opt/bin/job-test "$s"
done
echo "guest: $fails failed"
[ "$fails" -eq 0 ]
EOF
)

echo "ib-vm-test: booting the guest (scenarios: ${SCENARIOS[*]})" >&2
t0=$SECONDS
set +e
"$REPO/scripts/rxe-vm.sh" --timeout "$TIMEOUT" \
    --bin "$STAGE/polyrail" --bin "$STAGE/verbs-test" --bin "$STAGE/job-test" \
    -- "SCENARIOS='${SCENARIOS[*]}'; $guest"
rc=$?
set -e
echo "ib-vm-test: guest run took $((SECONDS - t0)) s (boot included)" >&2
case $rc in
0) echo "ib-vm-test: all passed" ;;
124) echo "ib-vm-test: FAIL: the guest run timed out after $TIMEOUT s" ;;
125) echo "ib-vm-test: FAIL: the guest did not get to run the tests" ;;
*) echo "ib-vm-test: FAIL: some steps failed" ;;
esac
exit "$rc"
