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
# Env: REPEATS (3), OUT (target/peers), PEERS_SRC (../shared/tools/peers), SKIP_INSTALL=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
REPEATS=${REPEATS:-3}
OUT=${OUT:-$ROOT/target/peers}
PEERS_SRC=${PEERS_SRC:-$ROOT/../shared/tools/peers}
SIZES="8 64 512 4096 32768 262144 1048576 4194304"
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
mpicc.openmpi -O2 -o "$OUT/mpi_pp_ompi" "$PEERS_SRC/mpi_pp.c"
mpicc.mpich -O2 -Wno-stringop-overflow -o "$OUT/mpi_pp_mpich" "$PEERS_SRC/mpi_pp.c"
{
    echo "date (UTC): $(date -u)"; echo "kernel: $(uname -r)"
    lscpu | grep -E 'Model name|^CPU\(s\)|L1d|L2|L3'
    dpkg-query -W -f='${Package} ${Version}\n' ucx-utils openmpi-bin mpich 2>/dev/null
    echo "polyrail: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} > "$OUT/machine.txt"

OMPI="mpirun.openmpi --allow-run-as-root -np 2 --bind-to core --map-by core --mca oob_tcp_if_include lo"
OMPI="$OMPI --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism cma"
MPICH="mpiexec.mpich -n 2 -bind-to core -iface lo -launcher fork"
ucx_n() { case $1 in 8|64|512) echo 100000;; 4096) echo 50000;; 32768) echo 20000;; 262144) echo 4000;; 1048576) echo 1000;; *) echo 300;; esac; }
PORT=23700

csv_sizes=$(echo $SIZES | tr ' ' ',')
for r in $(seq 1 "$REPEATS"); do
    log "repeat $r/$REPEATS: physical floor"
    "$OUT/physlim" memcpy $CPU_A > "$OUT/logs/memcpy_$r.txt"
    while read -r _ sz v; do rec floor memcpy GBps "$sz" "$r" "$v"; done < <(grep '^memcpy ' "$OUT/logs/memcpy_$r.txt")
    read -r _ _ _ mn _ md < <("$OUT/physlim" proc $CPU_A $CPU_B | grep '^pp_proc ')
    rec floor cacheline lat_us 64 "$r" "$(awk -v x="$md" 'BEGIN{printf "%.4f", x/1000}')"

    log "repeat $r: polyrail"
    # Modes: the automatic route, shm only, cma forced, and the automatic route from and into
    # buffers of Context::alloc_registered (memory files the peer maps) and into Vecs of the
    # MappedHeap (memory files too, registered at first use).
    for t in auto shm cma registered heap; do
        args=(--transport "$t"); [ "$t" = registered ] && args=(--registered); [ "$t" = heap ] && args=(--heap)
        "$BENCH" latency "${args[@]}" --sizes "$csv_sizes" > "$OUT/logs/polyrail_lat_${t}_$r.txt"
        while read -r sz v; do rec polyrail "$t" lat_us "$sz" "$r" "$v"; done < <(grep -E '^[0-9]' "$OUT/logs/polyrail_lat_${t}_$r.txt")
        "$BENCH" bw "${args[@]}" --sizes "$csv_sizes" > "$OUT/logs/polyrail_bw_${t}_$r.txt"
        while read -r sz v; do rec polyrail "$t" bw_MBps "$sz" "$r" "$v"; done < <(grep -E '^[0-9]' "$OUT/logs/polyrail_bw_${t}_$r.txt")
    done

    log "repeat $r: Open MPI (vader + cma), MPICH (ch4:ucx)"
    for m in ompi mpich; do
        f="$OUT/logs/${m}_$r.txt"
        if [ $m = ompi ]; then timeout 600 $OMPI "$OUT/mpi_pp_ompi" > "$f" 2>&1 || log "Open MPI failed (see $f)"
        else timeout 600 $MPICH "$OUT/mpi_pp_mpich" > "$f" 2>&1 || log "MPICH failed (see $f)"; fi
        while read -r k sz v; do
            [ "$k" = lat ] && rec "$m" default lat_us "$sz" "$r" "$v"
            [ "$k" = bw ] && rec "$m" default bw_MBps "$sz" "$r" "$v"
        done < <(grep -E '^(lat|bw) ' "$f")
    done

    log "repeat $r: UCX (ucx_perftest, default transports)"
    for t in tag_lat tag_bw; do
        for s in $SIZES; do
            PORT=$((PORT + 1))
            f="$OUT/logs/ucx_${t}_${s}_$r"
            taskset -c $CPU_A timeout 120 ucx_perftest -p $PORT > "$f.srv.txt" 2>&1 &
            srv=$!
            for _ in $(seq 1 100); do ss -ltn 2>/dev/null | grep -q ":$PORT " && break; sleep 0.05; done
            O=""; [ $t = tag_bw ] && O="-O 64"
            taskset -c $CPU_B timeout 120 ucx_perftest 127.0.0.1 -p $PORT -t $t -s "$s" -n "$(ucx_n "$s")" $O > "$f.cli.txt" 2>&1 || true
            wait $srv || true
            line=$(grep '^Final:' "$f.cli.txt" | tail -1 || true)
            [ -z "$line" ] && { log "UCX $t $s: no result (see $f.cli.txt)"; continue; }
            read -r _ _ _ _ overall _ bwall _ _ <<< "$line"
            if [ $t = tag_lat ]; then rec ucx default lat_us "$s" "$r" "$overall"
            else rec ucx default bw_MBps "$s" "$r" "$(awk -v x="$bwall" 'BEGIN{printf "%.1f", x*1.048576}')"; fi
        done
    done
done

log "report"
"$BENCH" report --input "$CSV" --out "$OUT"
log "done: $OUT/report.md"
