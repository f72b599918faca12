/*
 * reply-delay-probe.c - does a reply written into the line of the message it answers beat a
 * line per direction when software runs between reading the message and writing the reply?
 *
 *   gcc -O2 -o reply-delay-probe reply-delay-probe.c && ./reply-delay-probe MODE TICKS
 *
 * MODE 0: one line, two words (ping writes word 0 and polls word 1; pong the other way round).
 * MODE 1: one line per direction.
 * TICKS: time-stamp-counter ticks both sides spend between seeing a message and answering it
 * (0: none). Prints the one-way time (half a round trip) and that minus the delay.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define N 1000000

static void pin(int c) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(c, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static inline void delay(int d) {
    if (!d) return;
    uint64_t t = __rdtsc();
    while (__rdtsc() - t < (uint64_t)d);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int mode = atoi(argv[1]), d = atoi(argv[2]);
    char *m = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    volatile uint64_t *a = (uint64_t *)m, *b = (uint64_t *)(m + (mode == 0 ? 8 : (1 << 19)));
    pid_t c = fork();
    if (c == 0) {
        pin(1);
        for (uint64_t i = 0; i < N; i++) {
            while (*a != i + 1);
            delay(d);
            *b = i + 1;
        }
        exit(0);
    }
    pin(0);
    uint64_t s0 = __rdtsc();
    double t0 = now();
    delay(100000000);
    double tick_ns = (now() - t0) / (double)(__rdtsc() - s0);
    t0 = now();
    for (uint64_t i = 0; i < N; i++) {
        *a = i + 1;
        while (*b != i + 1);
        delay(d);
    }
    double t = (now() - t0) / N / 2;
    waitpid(c, 0, 0);
    printf("mode %d delay %d ticks (%.0f ns): one-way %.1f ns, minus the delay %.1f\n", mode, d, d * tick_ns, t,
           t - d * tick_ns);
    return 0;
}
