#!/usr/bin/env bash
# A/B of two polyrail-bench builds, run alternately in one session: osu_latency at 8 B, 4 KiB
# (200000 round trips each) and 4 MiB, osu_bw at 4 KiB and 64 KiB (2000 windows); REPEATS runs of
# each build; prints the medians, their ratio, and the median of the ratios of each repeat's
# pair (robust to a host that moves the vCPUs between runs); keeps every point in OUT.
#
#   scripts/ab-compare.sh OLD_BENCH NEW_BENCH [REPEATS (5)] [OUT (ab.csv)]
set -euo pipefail
old=$1 new=$2 repeats=${3:-5} out=${4:-ab.csv}
echo "build,repeat,bench,transport,size,value,unit" > "$out"
run() {
    local tag=$1 bench=$2 rep=$3 tmp
    tmp=$(mktemp)
    # Small messages 200000 round trips (about 50 ms at 8 B): one short run sees the host's
    # moves of the vCPUs as noise.
    "$bench" latency --sizes 8,4k --iters 200000 --quiet --csv "$tmp" > /dev/null
    [ -n "${AB_SMALL_ONLY:-}" ] || "$bench" latency --sizes 4m --quiet --csv "$tmp" > /dev/null
    [ -n "${AB_SMALL_ONLY:-}" ] || "$bench" bw --sizes 4k,64k --iters 2000 --quiet --csv "$tmp" > /dev/null
    grep -v '^bench,' "$tmp" | sed "s/^/$tag,$rep,/" >> "$out"
    rm -f "$tmp"
}
for rep in $(seq "$repeats"); do
    run old "$old" "$rep"
    run new "$new" "$rep"
done
python3 - "$out" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
keys = sorted({(r["bench"], int(r["size"])) for r in rows})
print(f"{'bench':8} {'size':>8} {'old median':>12} {'new median':>12} {'new/old':>8} {'paired':>8}  unit")
for bench, size in keys:
    val = {b: {int(r["repeat"]): float(r["value"]) for r in rows
               if r["build"] == b and r["bench"] == bench and int(r["size"]) == size}
           for b in ("old", "new")}
    med = {b: statistics.median(val[b].values()) for b in val}
    paired = statistics.median(val["new"][k] / val["old"][k] for k in val["old"] if k in val["new"])
    unit = next(r["unit"] for r in rows if r["bench"] == bench)
    print(f"{bench:8} {size:>8} {med['old']:>12.4g} {med['new']:>12.4g} {med['new'] / med['old']:>8.3f} {paired:>8.3f}  {unit}")
PY
