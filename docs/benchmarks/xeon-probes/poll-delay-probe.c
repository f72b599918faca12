/*
 * poll-delay-probe.c - can a ring message cross in one line transfer if the waiting side holds
 * off its polling until the answer is likely written?
 *
 * A line per direction costs two transfers when the reader polls it: the writer's
 * read-for-ownership, then the reader's miss (probes.txt). Here each side, after writing its
 * message, prefetches its next outgoing line for writing (PFW=1) and waits WAIT ticks before it
 * polls for the answer, so that the peer's poll may not have taken that line back yet; PROC
 * ticks of "software" run between seeing a message and answering it. Slots STRIDE words apart
 * (16: 128-byte records as polyrail's; 512: a page apart, out of the prefetchers' reach).
 *
 *   gcc -O2 [-DSTRIDE=16] -o poll-delay-probe poll-delay-probe.c && ./poll-delay-probe PFW WAIT PROC
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
#define R 64
#ifndef STRIDE
#define STRIDE 8
#endif

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

static inline void delay(uint64_t d) {
    if (!d) return;
    uint64_t t = __rdtsc();
    while (__rdtsc() - t < d);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int pfw = atoi(argv[1]);
    uint64_t wait = atoll(argv[2]), proc = atoll(argv[3]);
    char *m = mmap(0, 1 << 22, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    volatile uint64_t *ab = (uint64_t *)m, *ba = (uint64_t *)(m + (1 << 21));
    pid_t c = fork();
    if (c == 0) {
        pin(1);
        for (uint64_t i = 0; i < N; i++) {
            while (ab[(i % R) * STRIDE] != i + 1);
            delay(proc);
            ba[(i % R) * STRIDE] = i + 1;
            if (pfw) _m_prefetchw((void *)&ba[((i + 1) % R) * STRIDE]);
            delay(wait);
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
        ab[(i % R) * STRIDE] = i + 1;
        if (pfw) _m_prefetchw((void *)&ab[((i + 1) % R) * STRIDE]);
        delay(wait);
        while (ba[(i % R) * STRIDE] != i + 1);
        delay(proc);
    }
    double t = (now() - t0) / N / 2;
    waitpid(c, 0, 0);
    printf("pfw %d wait %llu (%.0f ns) proc %llu (%.0f ns): one-way %.1f ns\n", pfw, (unsigned long long)wait,
           wait * tick_ns, (unsigned long long)proc, proc * tick_ns, t);
    return 0;
}
