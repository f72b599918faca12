#!/usr/bin/env bash
# Hostile experiments against polyrail jobs, as a repeatable script: a killed rank, a stopped
# rank, a segment truncated during a run, names squatted in /dev/shm (by the same user and, as
# root, by another), a flood of PMI puts, a tiny open-files limit, a full /dev/shm (root: a
# mount namespace of its own) and Open MPI's mpirun. Each experiment says what it did and
# `pass`, `fail` or `skip` with the reason; the script exits 1 if any failed.
#
#   scripts/faults.sh      (builds the workspace in release first; CI runs it from .ci/run)
set -uo pipefail
cd "$(dirname "$0")/.."

cargo build --release --workspace --quiet || exit 1
run=target/release/polyrail
ring=target/release/examples/ring
halo=target/release/examples/halo
uid=$(id -u)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
skipped=0
pass() { echo "faults: pass: $1"; passed=$((passed + 1)); }
fail() { echo "faults: FAIL: $1"; failed=$((failed + 1)); }
skip() { echo "faults: skip: $1"; skipped=$((skipped + 1)); }
# Root, or a sudo that asks no password: what the experiments that need root run with.
SUDO=""
if [ "$uid" != 0 ]; then
    if sudo -n true 2> /dev/null; then SUDO="sudo -n"; else SUDO="none"; fi
fi

# The ranks (children) of launcher $1, once there are $2 of them (at most 10 s); in $ranks.
ranks_of() {
    local _
    ranks=()
    for _ in $(seq 100); do
        mapfile -t ranks < <(pgrep -P "$1" | sort -n || true)
        [ "${#ranks[@]}" -ge "$2" ] && return 0
        sleep 0.1
    done
    return 1
}

# Waits at most $2 seconds for process $1 to end; its status in $status (124 if it did not).
wait_for() {
    local t=0
    while kill -0 "$1" 2> /dev/null && [ "$t" -lt $(($2 * 10)) ]; do
        sleep 0.1
        t=$((t + 1))
    done
    if kill -0 "$1" 2> /dev/null; then
        kill -KILL "$1" 2> /dev/null
        wait "$1" 2> /dev/null
        status=124
    else
        wait "$1"
        status=$?
    fi
}

# A halo job long enough to meddle with: about 600 steps a second on 4 ranks of a 2-core machine.
long_halo=(-n 4 "$halo" 64 100000000)

echo "== faults: a rank killed with SIGKILL"
$run run "${long_halo[@]}" > "$work/kill.out" 2>&1 &
launcher=$!
if ranks_of $launcher 4; then
    sleep 0.5
    kill -KILL "${ranks[2]}"
    wait_for $launcher 20
    if [ "$status" != 0 ] && [ "$status" != 124 ] && grep -q "rank 2" "$work/kill.out"; then
        pass "killed rank 2 (pid ${ranks[2]}) of 4: the job ended with status $status naming it"
    else
        fail "killed rank 2 of 4: status $status, output: $(tail -5 "$work/kill.out")"
    fi
else
    kill $launcher 2> /dev/null
    fail "the 4 ranks of the kill experiment did not start"
fi

echo "== faults: a rank stopped with SIGSTOP (scripts/stopped-peer-test.sh)"
if scripts/stopped-peer-test.sh > "$work/stop.out" 2>&1; then
    pass "the peer of a stopped rank sleeps: $(tr '\n' ' ' < "$work/stop.out")"
else
    fail "stopped peer: $(tr '\n' ' ' < "$work/stop.out")"
fi

echo "== faults: every shm segment truncated during a run"
# Through /proc/<pid>/map_files, which only root opens; a same-user process could do the same
# through a segment's name in /dev/shm, when segments had one.
if [ "$SUDO" = none ]; then
    skip "truncating segments: /proc/<pid>/map_files needs root"
else
    # About 6 s of steps: the ranks still run when their mappings are truncated.
    $run run "${long_halo[@]/100000000/60000}" > "$work/trunc.out" 2>&1 &
    launcher=$!
    if ranks_of $launcher 4; then
        sleep 0.5
        tried=0
        shrank=0
        for pid in "${ranks[@]}"; do
            for f in $($SUDO find "/proc/$pid/map_files" -mindepth 1 2> /dev/null); do
                target=$($SUDO readlink "$f" 2> /dev/null)
                case $target in
                    /memfd:polyrail-segment* | /dev/shm/polyrail-*) ;;
                    *) continue ;;
                esac
                tried=$((tried + 1))
                if $SUDO truncate -s 0 "$f" 2> /dev/null; then shrank=$((shrank + 1)); fi
            done
        done
        wait_for $launcher 60
        if grep -Eq "SIGBUS|signal 7|Bus error" "$work/trunc.out"; then
            fail "truncated $shrank of $tried segment mappings: a rank died of SIGBUS: $(grep -E 'SIGBUS|signal 7|Bus error' "$work/trunc.out" | head -2)"
        elif [ "$tried" = 0 ]; then
            fail "found no segment mapped by the ranks of the job (status $status)"
        elif [ "$status" = 0 ] && [ "$shrank" = 0 ]; then
            pass "all $tried truncations of segment mappings of 4 ranks refused; the run went on and ended with status 0"
        elif [ "$status" != 0 ] && [ "$status" != 124 ] && grep -q "rank [0-9]" "$work/trunc.out"; then
            pass "truncated $shrank of $tried mappings; the job failed without SIGBUS, naming a rank: $(grep -m1 'rank [0-9]' "$work/trunc.out")"
        else
            fail "truncated $shrank of $tried mappings; status $status: $(tail -5 "$work/trunc.out")"
        fi
    else
        kill $launcher 2> /dev/null
        fail "the 4 ranks of the truncation experiment did not start"
    fi
fi

# Fills /dev/shm with files named as the segments of the next 400 launchers (job pr<pid>)
# were, for this user's uid and the squatter's: empty ones, and ones with a segment header
# naming a live process (this script), dated a day ahead; made by one process of user $1 (empty:
# this user), so that the next launchers' pids fall in the range. Then runs jobs, which must
# succeed and leave every such file in place.
squat() {
    local who=$1 as=() owner=$uid
    if [ -n "$who" ]; then
        as=(setpriv --reuid="$who" --regid="$who" --clear-groups)
        owner=$who
    fi
    # The header's start: magic, version 5, rank 0, size 2, ..., owner pid (this script).
    local le32 header
    le32() { printf '\\%03o\\%03o\\%03o\\%03o' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)); }
    header="PRLSHM01$(le32 5)$(le32 0)$(le32 2)$(le32 64)$(le32 4)$(le32 128)$(le32 16384)$(le32 $$)"
    local next
    next=$(($(cat /proc/sys/kernel/ns_last_pid 2> /dev/null || echo $$) + 1))
    # Shell builtins only: the pids after `next` stay for the launchers.
    "${as[@]}" bash -c '
        header=$1 next=$2 uid=$3 owner=$4
        for ((p = next; p <= next + 400; p++)); do
            for r in 0 1; do
                for u in "$uid" "$owner"; do
                    f=/dev/shm/polyrail-$u-pr$p-$r
                    [ -e "$f" ] && continue
                    if ((p % 2)); then printf "$header" > "$f"; else : > "$f"; fi && echo "$f"
                done
            done
        done' squat "$header" "$next" "$uid" "$owner" > "$work/squat.list" 2> /dev/null
    "${as[@]}" xargs -a "$work/squat.list" touch -d tomorrow 2> /dev/null
    local made
    made=$(wc -l < "$work/squat.list")
    local ok=0 jobs=0 hits=0 j
    for j in 1 2 3; do
        jobs=$((jobs + 1))
        $run run -n 2 "$ring" > "$work/squat.out" 2>&1 &
        # The job is named pr<launcher pid>.
        local l=$!
        grep -q -- "-pr$l-" "$work/squat.list" && hits=$((hits + 1))
        wait_for $l 60
        [ "$status" = 0 ] && ok=$((ok + 1))
    done
    local gone=0 f
    while read -r f; do
        [ -e "$f" ] || gone=$((gone + 1))
        rm -f "$f"
    done < "$work/squat.list"
    local what="${who:+as uid $who, }$made files squatted under the names of the next launchers' segments"
    if [ "$made" = 0 ]; then
        fail "could not create squatting files in /dev/shm${who:+ as uid $who}"
    elif [ "$ok" = "$jobs" ] && [ "$gone" = 0 ]; then
        pass "$what: $ok of $jobs jobs ran ($hits under a squatted name), none of the files was removed"
    else
        fail "$what: $ok of $jobs jobs ran, $gone file(s) removed; last output: $(tail -3 "$work/squat.out")"
    fi
}

echo "== faults: names squatted in /dev/shm by this user"
squat ""
echo "== faults: names squatted in /dev/shm by another user"
if [ "$uid" != 0 ]; then
    skip "squatting as another user needs root (setpriv)"
elif ! command -v setpriv > /dev/null || ! id nobody > /dev/null 2>&1; then
    skip "squatting as another user needs setpriv and the user nobody"
else
    squat "$(id -u nobody)"
fi

echo "== faults: a rank floods the PMI server with puts"
cat > "$work/flood.sh" << 'EOF'
fd=$PMI_FD
printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&"$fd"
read -r -u "$fd" line
printf 'cmd=get_my_kvsname\n' >&"$fd"
read -r -u "$fd" line
kvs=${line##*kvsname=}
kvs=${kvs%% *}
value=$(head -c 1000 /dev/zero | tr '\0' x)
ok=0 refused=0 msg=""
for i in $(seq 3000); do
    printf 'cmd=put kvsname=%s key=flood%d value=%s\n' "$kvs" "$i" "$value" >&"$fd"
    read -r -u "$fd" line || break
    case $line in
        *rc=0*) ok=$((ok + 1)) ;;
        *) refused=$((refused + 1)); msg=$line ;;
    esac
done
msg=${msg//\\ / }
echo "flood: $ok puts taken, $refused refused: ${msg:0:160}"
printf 'cmd=finalize\n' >&"$fd"
read -r -u "$fd" line
EOF
timeout 60 $run run -n 1 bash "$work/flood.sh" > "$work/flood.out" 2>&1
status=$?
line=$(grep "^flood:" "$work/flood.out" | head -1)
taken=$(echo "$line" | awk '{print $2}')
if [ "$status" = 0 ] && [ -n "$line" ] && [ "${taken:-3000}" -lt 3000 ] && echo "$line" | grep -q "refused: .*rc=-1"; then
    pass "3000 puts of 1000 bytes: ${line#flood: }"
else
    fail "PMI flood: status $status: $(tail -3 "$work/flood.out")"
fi

echo "== faults: a tiny open-files limit"
for n in 16 64; do
    (ulimit -n $n && timeout 60 $run run -n 8 "$ring") > "$work/nofile.out" 2>&1
    status=$?
    if grep -q "panicked" "$work/nofile.out" || [ "$status" = 124 ] || [ "$status" -gt 128 ]; then
        fail "ulimit -n $n, 8 ranks: status $status: $(tail -3 "$work/nofile.out")"
    elif [ "$status" = 0 ]; then
        pass "ulimit -n $n, 8 ranks: the job ran"
    elif grep -Eqi "open files|ulimit -n|descriptor" "$work/nofile.out"; then
        pass "ulimit -n $n, 8 ranks: refused with status $status, naming the limit: $(grep -Ei -m1 'open files|ulimit -n|descriptor' "$work/nofile.out")"
    else
        fail "ulimit -n $n, 8 ranks: status $status without naming the limit: $(tail -3 "$work/nofile.out")"
    fi
done

echo "== faults: a full /dev/shm (a mount namespace of its own)"
if [ "$uid" != 0 ] || ! command -v unshare > /dev/null; then
    skip "a full /dev/shm needs root and unshare (a tmpfs of its own on /dev/shm)"
else
    unshare -m sh -c "mount -t tmpfs -o size=64k tmpfs /dev/shm \
        && (dd if=/dev/zero of=/dev/shm/fill bs=4k 2> /dev/null || true) \
        && timeout 60 $run run -n 4 $ring" > "$work/full.out" 2>&1
    status=$?
    warnings=$(grep -c "polyrail: WARN" "$work/full.out" || true)
    if [ "$status" = 0 ] && [ "$warnings" -le 4 ]; then
        pass "4 ranks with /dev/shm full: status 0, $warnings warning line(s)"
    else
        fail "4 ranks with /dev/shm full: status $status, $warnings warning line(s): $(head -5 "$work/full.out")"
    fi
fi
# Where segments live now, memory: one asked for more than there is fails shm in every rank,
# which says why once, and once that no channel carries its messages (not once per peer).
POLYRAIL_SHM_CELLS=65536 POLYRAIL_SHM_CELL_SIZE=1m POLYRAIL_TRANSPORTS=self,shm,cma \
    timeout 60 $run run -n 4 "$ring" > "$work/short.out" 2>&1
status=$?
lines=$(grep -c "WARN.*no channel carries messages" "$work/short.out" || true)
causes=$(grep -c "shm channel unavailable.*memory" "$work/short.out" || true)
if [ "$status" != 0 ] && [ "$lines" -le 4 ] && [ "$causes" -ge 1 ] && [ "$causes" -le 4 ]; then
    pass "4 ranks, 64 GiB segments asked: status $status, $causes line(s) naming the cause, $lines about the peers"
else
    fail "4 ranks, 64 GiB segments asked: status $status, $causes cause line(s), $lines peer line(s): $(head -8 "$work/short.out")"
fi

echo "== faults: Open MPI's mpirun"
if ! command -v mpirun.openmpi > /dev/null; then
    if [ "$SUDO" != none ] && command -v apt-get > /dev/null; then
        echo "faults: installing openmpi-bin"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=120 openmpi-bin \
            > "$work/apt.out" 2>&1 \
            || { $SUDO apt-get update -qq > /dev/null 2>&1 \
                && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=120 \
                    openmpi-bin > "$work/apt.out" 2>&1; }
    fi
fi
if ! command -v mpirun.openmpi > /dev/null; then
    skip "Open MPI: no mpirun.openmpi, and it could not be installed (Debian package openmpi-bin; root or sudo)"
else
    ompi=(mpirun.openmpi --oversubscribe --mca oob_tcp_if_include lo)
    [ "$uid" = 0 ] && ompi+=(--allow-run-as-root)
    timeout 60 "${ompi[@]}" -np 2 "$ring" > "$work/ompi.out" 2>&1
    status=$?
    if [ "$status" != 0 ] && grep -q "Open MPI's mpirun" "$work/ompi.out"; then
        pass "mpirun -np 2 ring: status $status, the ranks named it: $(grep -m1 -o "launcher polyrail cannot join ([^)]*)" "$work/ompi.out")"
    elif ! timeout 60 "${ompi[@]}" -np 1 true > /dev/null 2>&1; then
        skip "Open MPI's mpirun cannot start processes here: $(head -3 "$work/ompi.out")"
    else
        fail "mpirun -np 2 ring: status $status: $(head -5 "$work/ompi.out")"
    fi
fi

echo "faults: $passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
