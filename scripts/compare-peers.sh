#!/usr/bin/env bash
# Puts polyrail beside UCX, Open MPI, MPICH and the physical floor in ONE run, on this machine.
#
#   scripts/compare-peers.sh            # REPEATS=3 by default; OUT=target/peers
#
# Every tool runs its two processes pinned to CPU 0 and CPU 1; each configuration is repeated
# REPEATS times, interleaved (the machine's speed drifts within minutes, so only numbers from
# the same run compare). Raw points go to $OUT/results.csv
# (tool,mode,metric,size,rep,value); then `polyrail-bench report` writes medians, ratios and
# plots ($OUT/report.md, $OUT/*.svg).
#
# The peers' measurement programs are the ones in ../shared/tools/peers (mpi_pp.c: osu_latency
# and osu_bw methods for MPI; physlim.c: memcpy bandwidth and one cache line between two
# processes); UCX is measured with ucx_perftest tag_lat / tag_bw.
#
# Paired 8 B latency: the host moves this guest's vCPUs between sharing a core complex (a cache
# line crosses in ~30-50 ns) and sitting apart (~160 ns) every few minutes, and every tool's
# small-message latency follows by 2-3x; the measurements above lie minutes apart, so their
# 8 B medians and the floor may come from different placements. So each repeat starts with a
# tight block (a few seconds): the cache-line floor, the 8 B one-way latency of polyrail, Open
# MPI, MPICH and UCX, and the floor again. Its rows are tool=paired, mode=floor_before|polyrail|
# ompi|mpich|ucx|floor_after, metric lat_us, size 8; the report compares them repeat by repeat
# and keeps only repeats whose floors before and after agree (the placement held). Every other
# measurement (one polyrail latency or bandwidth run, one MPI program, one UCX series) is
# bracketed by the floor too (rows tool=place), and the report gives, beside the medians of
# everything, the medians of the measurements that ran wholly near and wholly apart.
# Latency with fresh data: polyrail-bench latency --fresh and mpi_pp.c's latency with a memset
# of the message before each send (rows mode=fresh), for Open MPI and MPICH (ucx_perftest
# cannot write its messages).
# Env: REPEATS (3), OUT (target/peers), PEERS_SRC (../shared/tools/peers), SKIP_INSTALL=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
REPEATS=${REPEATS:-3}
OUT=${OUT:-$ROOT/target/peers}
PEERS_SRC=${PEERS_SRC:-$ROOT/../shared/tools/peers}
# Every power of two from 4 KiB (the node-local issue's bandwidth target holds "at every size
# from 4 KiB up"), and three small sizes.
SIZES="8 64 512 4096 8192 16384 32768 65536 131072 262144 524288 1048576 2097152 4194304"
CPU_A=0
CPU_B=1
mkdir -p "$OUT/logs"
CSV=$OUT/results.csv
echo "tool,mode,metric,size,rep,value" > "$CSV"
rec() { echo "$1,$2,$3,$4,$5,$6" >> "$CSV"; }
log() { echo "[$(date +%T)] $*" >&2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 UCX_NET_DEVICES=lo

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    if ! dpkg -s ucx-utils openmpi-bin libopenmpi-dev mpich libmpich-dev > /dev/null 2>&1; then
        log "installing peers (ucx-utils, openmpi, mpich)"
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=120 \
            ucx-utils openmpi-bin libopenmpi-dev mpich libmpich-dev > "$OUT/logs/apt.log" 2>&1 \
            || { $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
                 ucx-utils openmpi-bin libopenmpi-dev mpich libmpich-dev > "$OUT/logs/apt.log" 2>&1; }
    fi
fi

log "building"
cargo build --release -p polyrail-bench --quiet
BENCH=$ROOT/target/release/polyrail-bench
gcc -O2 -o "$OUT/physlim" "$PEERS_SRC/physlim.c" -lpthread
# mpi_pp.c as the peers' harness has it, with its size list replaced by ours.
sed "s/^static const int sizes\[\] = {.*};/static const int sizes[] = {$(echo $SIZES | tr ' ' ',')};/" \
    "$PEERS_SRC/mpi_pp.c" > "$OUT/mpi_pp.c"
grep -q "sizes\[\] = {$(echo $SIZES | tr ' ' ',')}" "$OUT/mpi_pp.c" || { log "cannot set mpi_pp.c's sizes"; exit 1; }
# And its latency part alone with fresh data: the sender writes the whole message before each
# send (the data check then no longer applies).
sed -e 's/^\( *\)MPI_Send(s, sz, /\1memset(s, i, sz);\n\1MPI_Send(s, sz, /' \
    -e 's|^ */\* bandwidth, osu_bw style \*/|    MPI_Finalize();\n    return 0;|' -e '/data check failed/d' \
    "$OUT/mpi_pp.c" > "$OUT/mpi_pp_fresh.c"
[ "$(grep -c 'memset(s, i, sz);' "$OUT/mpi_pp_fresh.c")" = 2 ] || { log "cannot make mpi_pp_fresh.c"; exit 1; }
for f in mpi_pp mpi_pp_fresh; do
    mpicc.openmpi -O2 -o "$OUT/${f}_ompi" "$OUT/$f.c"
    mpicc.mpich -O2 -Wno-stringop-overflow -o "$OUT/${f}_mpich" "$OUT/$f.c"
done
{
    echo "date (UTC): $(date -u)"; echo "kernel: $(uname -r)"
    lscpu | grep -E 'Model name|^CPU\(s\)|L1d|L2|L3'
    dpkg-query -W -f='${Package} ${Version}\n' ucx-utils openmpi-bin mpich 2>/dev/null
    echo "polyrail: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$OUT/machine.txt"

OMPI="mpirun.openmpi --allow-run-as-root -np 2 --bind-to core --map-by core --mca oob_tcp_if_include lo"
OMPI="$OMPI --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism cma"
MPICH="mpiexec.mpich -n 2 -bind-to core -iface lo -launcher fork"
ucx_n() { case $1 in 8|64|512) echo 100000;; 4096|8192|16384) echo 50000;; 32768|65536) echo 20000;; 131072|262144) echo 4000;; 524288|1048576) echo 1000;; *) echo 300;; esac; }
PORT=23700

# floor_us: one cache line between CPU_A and CPU_B, median one-way time (µs).
floor_us() { "$OUT/physlim" proc $CPU_A $CPU_B | awk '/^pp_proc /{printf "%.4f", $6 / 1000}'; }
# mpi_run ompi|mpich LOG [fresh]: mpi_pp (latency then bandwidth, every size) under that MPI;
# with `fresh`, mpi_pp_fresh (latency with fresh data).
mpi_run() {
    local cmd=$OMPI prog=mpi_pp; [ "$1" = mpich ] && cmd=$MPICH; [ "${3:-}" = fresh ] && prog=mpi_pp_fresh
    timeout 600 $cmd "$OUT/${prog}_$1" > "$2" 2>&1 || log "$1 $prog failed (see $2)"
}
# ucx_run TEST SIZE ITERS LOG: one ucx_perftest run, server on CPU_A, client on CPU_B; sets
# $line to the client's 'Final:' line (empty if none).
ucx_run() {
    PORT=$((PORT + 1))
    taskset -c $CPU_A timeout 120 ucx_perftest -p $PORT > "$4.srv.txt" 2>&1 &
    local srv=$! O=""
    for _ in $(seq 1 100); do ss -ltn 2>/dev/null | grep -q ":$PORT " && break; sleep 0.05; done
    [ "$1" = tag_bw ] && O="-O 64"
    taskset -c $CPU_B timeout 120 ucx_perftest 127.0.0.1 -p $PORT -t "$1" -s "$2" -n "$3" $O > "$4.cli.txt" 2>&1 || true
    wait $srv || true
    line=$(grep '^Final:' "$4.cli.txt" | tail -1 || true)
    [ -n "$line" ] || log "UCX $1 $2: no result (see $4.cli.txt)"
}
# place TOOL MODE METRIC before|after: the floor around one measurement of the main loop, as a
# row tool=place, mode=TOOL:MODE:METRIC (METRIC all for a program measuring both), metric
# floor_before|floor_after; the report sorts measurements by the placement they ran in.
place() { rec place "$1:$2:$3" "floor_$4" 0 "$r" "$(floor_us)"; }
# prec MODE VALUE: one row of the paired block of repeat $r (skipped, logged, if VALUE is empty).
prec() { if [ -n "$2" ]; then rec paired "$1" lat_us 8 "$r" "$2"; else log "paired $1: no result"; fi; }

csv_sizes=$(echo $SIZES | tr ' ' ',')
for r in $(seq 1 "$REPEATS"); do
    log "repeat $r/$REPEATS: paired 8 B latency (floor, polyrail, Open MPI, MPICH, UCX, floor)"
    P=$OUT/logs/paired
    prec floor_before "$(floor_us)"
    rm -f "${P}_polyrail_$r.csv"
    "$BENCH" latency --sizes 8 --csv "${P}_polyrail_$r.csv" > "${P}_polyrail_$r.txt"
    prec polyrail "$(awk -F, '$3 == 8 {print $4}' "${P}_polyrail_$r.csv")"
    for m in ompi mpich; do
        mpi_run $m "${P}_${m}_$r.txt"
        prec $m "$(awk '$1 == "lat" && $2 == 8 {print $3}' "${P}_${m}_$r.txt")"
    done
    ucx_run tag_lat 8 "$(ucx_n 8)" "${P}_ucx_$r"
    prec ucx "$(awk '{print $5}' <<< "$line")"
    prec floor_after "$(floor_us)"

    log "repeat $r: physical floor"
    "$OUT/physlim" memcpy $CPU_A > "$OUT/logs/memcpy_$r.txt"
    while read -r _ sz v; do rec floor memcpy GBps "$sz" "$r" "$v"; done < <(grep '^memcpy ' "$OUT/logs/memcpy_$r.txt")
    rec floor cacheline lat_us 64 "$r" "$(floor_us)"

    log "repeat $r: polyrail"
    # Modes: the automatic route, shm only, cma forced, and the automatic route from and into
    # buffers of Context::alloc_registered (memory files the peer maps) and into Vecs of the
    # MappedHeap (memory files too, registered at first use).
    for t in auto shm cma registered heap; do
        args=(--transport "$t"); [ "$t" = registered ] && args=(--registered); [ "$t" = heap ] && args=(--heap)
        for b in latency bw; do
            m=lat_us; [ "$b" = bw ] && m=bw_MBps
            f="$OUT/logs/polyrail_${b}_${t}_$r"
            rm -f "$f.csv"
            place polyrail "$t" $m before
            "$BENCH" $b "${args[@]}" --sizes "$csv_sizes" --csv "$f.csv" > "$f.txt"
            place polyrail "$t" $m after
            # The CSV has every digit (the OSU table rounds latencies to 10 ns).
            while IFS=, read -r _ _ sz v _; do rec polyrail "$t" $m "$sz" "$r" "$v"; done < <(tail -n +2 "$f.csv")
        done
    done

    log "repeat $r: latency with fresh data (polyrail, Open MPI, MPICH)"
    f="$OUT/logs/polyrail_latency_fresh_$r"
    rm -f "$f.csv"
    place polyrail fresh lat_us before
    "$BENCH" latency --fresh --sizes "$csv_sizes" --csv "$f.csv" > "$f.txt"
    place polyrail fresh lat_us after
    while IFS=, read -r _ _ sz v _; do rec polyrail fresh lat_us "$sz" "$r" "$v"; done < <(tail -n +2 "$f.csv")
    for m in ompi mpich; do
        f="$OUT/logs/${m}_fresh_$r.txt"
        place $m fresh lat_us before
        mpi_run $m "$f" fresh
        place $m fresh lat_us after
        while read -r _ sz v; do rec "$m" fresh lat_us "$sz" "$r" "$v"; done < <(grep -E '^lat ' "$f")
    done

    log "repeat $r: Open MPI (vader + cma), MPICH (ch4:ucx)"
    for m in ompi mpich; do
        f="$OUT/logs/${m}_$r.txt"
        place $m default all before
        mpi_run $m "$f"
        place $m default all after
        while read -r k sz v; do
            [ "$k" = lat ] && rec "$m" default lat_us "$sz" "$r" "$v"
            [ "$k" = bw ] && rec "$m" default bw_MBps "$sz" "$r" "$v"
        done < <(grep -E '^(lat|bw) ' "$f")
    done

    log "repeat $r: UCX (ucx_perftest, default transports)"
    for t in tag_lat tag_bw; do
        metric=lat_us; [ $t = tag_bw ] && metric=bw_MBps
        place ucx default $metric before
        for s in $SIZES; do
            ucx_run $t "$s" "$(ucx_n "$s")" "$OUT/logs/ucx_${t}_${s}_$r"
            [ -z "$line" ] && continue
            read -r _ _ _ _ overall _ bwall _ _ <<< "$line"
            if [ $t = tag_lat ]; then rec ucx default lat_us "$s" "$r" "$overall"
            else rec ucx default bw_MBps "$s" "$r" "$(awk -v x="$bwall" 'BEGIN{printf "%.1f", x*1.048576}')"; fi
        done
        place ucx default $metric after
    done
done

log "report"
"$BENCH" report --input "$CSV" --out "$OUT"
log "done: $OUT/report.md"
