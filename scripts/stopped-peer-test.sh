#!/usr/bin/env bash
# A rank waiting on a peer that was stopped (SIGSTOP) must sleep, not spin: runs
# `polyrail-bench bw` with 1 MiB and 4 KiB messages, stops one rank for 3 s and checks that the
# other used under a tenth of a core meanwhile.
#
#   scripts/stopped-peer-test.sh [BENCH]    (default target/release/polyrail-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:-target/release/polyrail-bench}
hz=$(getconf CLK_TCK)
fail=0
for size in 1m 4k; do
    for stopped in 0 1; do
        "$bench" bw --sizes "$size" --iters 100000000 --quiet > /dev/null 2>&1 &
        launcher=$!
        # The bench starts its two ranks as children.
        ranks=()
        for _ in $(seq 50); do
            sleep 0.2
            mapfile -t ranks < <(pgrep -P "$launcher" | sort -n || true)
            [ "${#ranks[@]}" -eq 2 ] && break
        done
        # Into the measurement loop.
        sleep 1
        if [ "${#ranks[@]}" -ne 2 ]; then
            echo "stopped-peer: expected 2 ranks under $launcher, found ${#ranks[@]}" >&2
            kill "$launcher" 2> /dev/null || true
            exit 1
        fi
        victim=${ranks[$stopped]}
        waiter=${ranks[$((1 - stopped))]}
        kill -STOP "$victim"
        sleep 0.5
        t0=$(awk '{print $14 + $15}' "/proc/$waiter/stat")
        sleep 3
        t1=$(awk '{print $14 + $15}' "/proc/$waiter/stat")
        kill -CONT "$victim"
        kill "$launcher" 2> /dev/null || true
        wait "$launcher" 2> /dev/null || true
        used=$((t1 - t0))
        # Under a tenth of a core over 3 s.
        if [ "$used" -gt $((3 * hz / 10)) ]; then
            echo "stopped-peer: $size, rank $stopped stopped: the other used $used of $((3 * hz)) ticks" >&2
            fail=1
        else
            echo "stopped-peer: $size, rank $stopped stopped: the other used $used of $((3 * hz)) ticks"
        fi
    done
done
exit $fail
