#!/usr/bin/env bash
# ib-vm-bench.sh - polyrail's ib channel beside perftest on real verbs (Soft-RoCE), in one VM run.
#
# Usage: scripts/ib-vm-bench.sh [--no-build] [--out DIR] [--repeats N] [--mtu BYTES] [--ack-timeout N]
#                              [--glibc-copies]
#
# Builds polyrail-bench with the `verbs` feature (into IB_VM_TARGET_DIR, default
# <repo>/target/verbs, as scripts/ib-vm-test.sh does), boots ONE guest with scripts/rxe-vm.sh
# and runs there, N times each (default 3), alternating tools:
#   - perftest ib_write_lat (one-way latency, average) and ib_write_bw / ib_read_bw (bandwidth,
#     average; perftest's MB are MiB, converted to 10^6 bytes here);
#   - polyrail-bench latency and bw --transport ib (two ranks on two virtual nodes, real verbs),
#     with ordinary buffers (bounce buffers or registered per rendezvous), with --registered
#     buffers and with --heap buffers (Vecs in memory files of polyrail's MappedHeap), which kind
#     goes first rotating by repeat;
# size by size, polyrail right after perftest, with the same iteration count (latency: 3000
# round trips up to 1 KiB, 1000 up to 8 KiB, 300 up to 64 KiB, 100 above).
# POLYRAIL_* variables of the caller reach the guest (e.g. POLYRAIL_IB_EAGER_LIMIT=64k).
# Client and server of each tool are pinned to the guest's two vCPUs. The guest runs under TCG
# emulation: absolute numbers are only proof that things work; the ratios polyrail/perftest from
# the same run are what count: each ratio is the median over repeats of polyrail's value over
# perftest's from the same repeat (seconds apart, so the host's drift cancels). --mtu sets the
# RoCE path MTU of rxe0 (256, 512, 1024, 2048 or 4096; default 1024, what a 1500-byte Ethernet
# MTU gives; InfiniBand fabrics run 2048 or 4096) for both tools. --ack-timeout sets both tools'
# queue-pair ack timeout, 4.096 us x 2^N (perftest -u, POLYRAIL_IB_ACK_TIMEOUT; default 20, Open
# MPI's): at 14 (67 ms) rxe here resends in-flight requests several times a second though
# nothing was lost (its retransmit timer fires while traffic flows), and each resend can stall
# either tool for milliseconds to seconds; none happen at 20. The guest prints how many requests
# rxe saw twice (hw_counters/duplicate_request). IB_BENCH_LAT_SIZES and IB_BENCH_BW_SIZES
# (space-separated byte counts) replace the default sizes. Writes DIR/ib-vm.csv
# (tool,mode,size,rep,value,unit) and DIR/ib-vm.md (medians and ratios); DIR defaults to
# docs/benchmarks, or docs/benchmarks/mtu-BYTES with --mtu other than 1024.
# polyrail-bench runs in the guest with GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1g:
# the emulated CPU advertises fast `rep movsb` (ERMS), so glibc's memcpy uses it from a few KiB
# up, but TCG executes it at about 4 ns a byte (a 64 KiB memcpy took 295 us in the guest, 39 us
# with glibc's vector loop; on hardware with ERMS the two are about equal). Only polyrail copies
# (ordinary memory goes through bounce buffers); perftest does not. --glibc-copies keeps
# glibc's own choice.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/.." && pwd)
TARGET_DIR=${IB_VM_TARGET_DIR:-$REPO/target/verbs}
OUT=$REPO/docs/benchmarks
REPEATS=3
BUILD=1
MTU=1024
ACK_TIMEOUT=20
OUT_SET=0
TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1073741824
LAT_SIZES=${IB_BENCH_LAT_SIZES:-8 1024 8192 65536 262144 1048576}
BW_SIZES=${IB_BENCH_BW_SIZES:-4096 65536 262144 1048576}

while (($#)); do
    case $1 in
    --no-build) BUILD=0; shift ;;
    --out) OUT=${2:?--out needs a directory}; OUT_SET=1; shift 2 ;;
    --mtu) MTU=${2:?--mtu needs a size}; shift 2 ;;
    --repeats) REPEATS=${2:?--repeats needs a count}; shift 2 ;;
    --ack-timeout) ACK_TIMEOUT=${2:?--ack-timeout needs an exponent}; shift 2 ;;
    --glibc-copies) TUNABLES=""; shift ;;
    -h | --help) sed -n '2,38p' "$SELF" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ib-vm-bench: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ $REPEATS =~ ^[1-9][0-9]*$ ]] || { echo "ib-vm-bench: --repeats needs a positive count" >&2; exit 2; }
[[ $ACK_TIMEOUT =~ ^[0-9]+$ ]] && ((ACK_TIMEOUT >= 1 && ACK_TIMEOUT <= 31)) ||
    { echo "ib-vm-bench: --ack-timeout takes an exponent from 1 to 31, not $ACK_TIMEOUT" >&2; exit 2; }
case $MTU in 256 | 512 | 1024 | 2048 | 4096) ;; *) echo "ib-vm-bench: --mtu takes 256, 512, 1024, 2048 or 4096, not $MTU" >&2; exit 2 ;; esac
((MTU == 1024 || OUT_SET)) || OUT=$OUT/mtu-$MTU

if ((BUILD)); then
    (cd "$REPO" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release -p polyrail-bench --features polyrail/verbs)
fi
BENCH=$TARGET_DIR/release/polyrail-bench
[[ -x $BENCH ]] || { echo "ib-vm-bench: $BENCH missing (run without --no-build)" >&2; exit 1; }

# The guest's script: one line per point, `RESULT tool mode size rep value unit`.
GUEST=$(mktemp)
trap 'rm -f "$GUEST"' EXIT
cat > "$GUEST" <<EOF
lat_sizes="$LAT_SIZES"; bw_sizes="$BW_SIZES"; repeats=$REPEATS; mtu=$MTU; ack_timeout=$ACK_TIMEOUT
tunables="$TUNABLES"
EOF
cat >> "$GUEST" <<'EOF'
export POLYRAIL_IB_PROVIDER=verbs POLYRAIL_IB_ACK_TIMEOUT=$ack_timeout
retransmitted() { cat /sys/class/infiniband/rxe0/ports/1/hw_counters/duplicate_request 2>/dev/null || echo 0; }
resent() { # counter before, point name, size: requests rxe saw twice during the point
    echo "RESULT rxe resent-$2 $3 $rep $(($(retransmitted) - $1)) requests"
}
# rxe derives its path MTU from the netdev's: leave room for the Ethernet, IP, UDP and RoCE headers.
ip link set dummy0 mtu $((mtu + 200))
active=$(ibv_devinfo -d rxe0 | awk '/active_mtu/ { print $2 }')
echo "guest: rxe0 active_mtu $active" >&2
[ "$active" = "$mtu" ] || { echo "guest: wanted path MTU $mtu, rxe0 has $active" >&2; exit 1; }
pt() { # perftest server and client: tool, size, extra args; prints the client's output
    # perftest has no timeout of its own: a client that came before the server listened (TCG
    # starts programs slowly) left the server waiting forever. Retry the client, bound both.
    timeout 900 taskset -c 0 "$1" -d rxe0 -i 1 -x 1 -u "$ack_timeout" -s "$2" $3 > /dev/null 2>&1 &
    server=$!
    for try in 1 2 3 4 5; do
        sleep 1
        out=$(timeout 600 taskset -c 1 "$1" -d rxe0 -i 1 -x 1 -u "$ack_timeout" -s "$2" $3 10.77.0.1 2>&1) && break
        kill -0 $server 2>/dev/null || break
        echo "guest: $1 -s $2 client failed (try $try), retrying" >&2
    done
    echo "$out"
    kill $server 2>/dev/null
    wait $server 2>/dev/null
}
pb() { # polyrail-bench: bench, iterations, size, unit; every buffer kind
    # The first launch after perftest ran slower (8 B: plain, always first, 1.5x against 1.0-1.2
    # for the same eager path from the other buffers): rotate which kind goes first by repeat.
    case $((rep % 3)) in
    1) modes="plain registered heap" ;;
    2) modes="registered heap plain" ;;
    *) modes="heap plain registered" ;;
    esac
    for mode in $modes; do
        flag=""; [ $mode != plain ] && flag=--$mode
        c=$(retransmitted)
        GLIBC_TUNABLES=$tunables timeout 900 polyrail-bench "$1" --transport ib --iters "$2" $flag --sizes "$3" 2>&1 |
            awk -v r=$rep -v m=$mode -v b="$1" -v u="$4" '$1 ~ /^[0-9]+$/ { print "RESULT polyrail " b "-" m " " $1 " " r " " $2 " " u }'
        resent "$c" "polyrail-$1-$mode" "$3"
    done
}
iters() { # round trips per latency point: about a second of them, at least 100
    if [ "$1" -le 1024 ]; then echo 3000; elif [ "$1" -le 8192 ]; then echo 1000; elif [ "$1" -le 65536 ]; then echo 300; else echo 100; fi
}
rep=1
while [ $rep -le $repeats ]; do
    # Each size: perftest, then polyrail right after it, so both see the same host.
    for s in $lat_sizes; do
        n=$(iters "$s")
        # Columns: bytes iterations t_min t_max t_typical t_avg ...
        c=$(retransmitted)
        v=$(pt ib_write_lat "$s" "-n $n" | awk -v s="$s" '$1 == s { print $6 }')
        echo "RESULT perftest write_lat $s $rep ${v:-nan} us"
        resent "$c" perftest-write_lat "$s"
        pb latency "$n" "$s" us
    done
    for s in $bw_sizes; do
        # Columns: bytes iterations peak average(MiB/s) msgrate; MiB -> 10^6 bytes.
        for t in write read; do
            c=$(retransmitted)
            v=$(pt ib_${t}_bw "$s" "-n 200" | awk -v s="$s" '$1 == s { printf "%.2f", $4 * 1.048576 }')
            echo "RESULT perftest ${t}_bw $s $rep ${v:-nan} MB/s"
            resent "$c" "perftest-${t}_bw" "$s"
        done
        pb bw 4 "$s" MB/s
    done
    rep=$((rep + 1))
done
echo "guest: rxe retransmitted $(retransmitted) requests in all (ack timeout exponent $ack_timeout)" >&2
EOF

mkdir -p "$OUT"
RAW=$(mktemp)
trap 'rm -f "$GUEST" "$RAW"' EXIT
echo "ib-vm-bench: running in the guest ($REPEATS repeats; several minutes under TCG)" >&2
"$REPO/scripts/rxe-vm.sh" --timeout $((REPEATS * 900 + 600)) --bin "$BENCH" -- "$(cat "$GUEST")" | tee "$RAW" | grep -v '^RESULT' >&2 || true
CSV=$OUT/ib-vm.csv
echo "tool,mode,size,rep,value,unit" > "$CSV"
awk '$1 == "RESULT" { print $2 "," $3 "," $4 "," $5 "," $6 "," $7 }' "$RAW" >> "$CSV"
n=$(($(wc -l < "$CSV") - 1))
((n > 0)) || { echo "ib-vm-bench: no results" >&2; exit 1; }

# Medians and ratios.
python3 - "$CSV" "$OUT/ib-vm.md" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
med = {}
for r in rows:
    try:
        v = float(r["value"])
    except ValueError:
        continue
    if v == v:
        med.setdefault((r["tool"], r["mode"], int(r["size"])), []).append(v)
by_rep = {(r["tool"], r["mode"], int(r["size"]), r["rep"]): float(r["value"]) for r in rows if r["value"] not in ("nan", "")}
med = {k: statistics.median(v) for k, v in med.items()}
def paired(tool, mode, size, refs):
    """Median over repeats of tool/mode over the largest of refs (perftest modes), same repeat."""
    ratios = []
    for (t, m, s, rep), v in by_rep.items():
        if (t, m, s) != (tool, mode, size):
            continue
        ref = [by_rep.get(("perftest", x, size, rep)) for x in refs]
        ref = [x for x in ref if x]
        if ref:
            ratios.append(v / max(ref))
    return f"{statistics.median(ratios):.2f}" if ratios else "-"

def get(t, m, s):
    return med.get((t, m, s))
def fmt(x):
    return "-" if x is None else f"{x:.2f}"
modes = ("plain", "registered", "heap")
out = ["| size | perftest ib_write_lat (us) | polyrail (us) | polyrail registered (us) | polyrail heap (us) | polyrail / perftest | registered / perftest | heap / perftest |",
       "|---|---|---|---|---|---|---|---|"]
for s in sorted({k[2] for k in med if k[1] == "write_lat"}):
    vals = " | ".join(fmt(get("polyrail", f"latency-{m}", s)) for m in modes)
    ratios = " | ".join(paired("polyrail", f"latency-{m}", s, ["write_lat"]) for m in modes)
    out.append(f"| {s} | {fmt(get('perftest', 'write_lat', s))} | {vals} | {ratios} |")
out += ["", "| size | ib_write_bw (MB/s) | ib_read_bw (MB/s) | polyrail (MB/s) | polyrail registered (MB/s) | polyrail heap (MB/s) | polyrail / best perftest | registered / best perftest | heap / best perftest |",
        "|---|---|---|---|---|---|---|---|---|"]
for s in sorted({k[2] for k in med if k[1] == "write_bw"}):
    vals = " | ".join(fmt(get("polyrail", f"bw-{m}", s)) for m in modes)
    ratios = " | ".join(paired("polyrail", f"bw-{m}", s, ["write_bw", "read_bw"]) for m in modes)
    out.append(f"| {s} | {fmt(get('perftest', 'write_bw', s))} | {fmt(get('perftest', 'read_bw', s))} | {vals} | {ratios} |")
resent = {}
for r in rows:
    if r["tool"] == "rxe":
        who = r["mode"].split("-")[1]
        resent[who] = resent.get(who, 0) + int(float(r["value"]))
        resent.setdefault(who + " points hit", 0)
        resent[who + " points hit"] += int(float(r["value"])) > 0
if resent:
    out += ["", "Requests rxe resent during the points (a resend stalls the tool that meets it): " + ", ".join(
        f"{w} {resent[w]} in {resent[w + ' points hit']} points" for w in ("perftest", "polyrail") if w in resent) + "."]
text = "\n".join(out) + "\n"
open(sys.argv[2], "w").write(text)
print(text)
EOF
