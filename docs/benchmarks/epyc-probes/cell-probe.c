/*
 * cell-probe.c - a 4 MiB stream through 128 shared 16 KiB cells between two pinned processes,
 * the shape of polyrail's shm-only large messages, in C with nothing else around it.
 *
 *   gcc -O2 -mavx2 -o cell-probe cell-probe.c && ./cell-probe NT
 *
 * The sender (CPU 0) copies each 16 KiB chunk of a private 4 MiB buffer into the next cell in
 * turn (NT=0: memcpy; NT=1: non-temporal 32-byte stores) and publishes it; the receiver (CPU 1)
 * copies it out into its private buffer and frees it. Prints the best of 20 streams.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
#define CELL 16384
#define NCELL 128
#define MSG (4<<20)
static void nt_copy(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){__m256i a=_mm256_loadu_si256((const __m256i*)(s+i)),b=_mm256_loadu_si256((const __m256i*)(s+i+32));_mm256_stream_si256((__m256i*)(d+i),a);_mm256_stream_si256((__m256i*)(d+i+32),b);}}
int main(int argc,char**argv){
  int nt=atoi(argv[1]); int reps=20;
  char*m=mmap(0,NCELL*CELL+4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  volatile uint64_t*head=(uint64_t*)m, *tail=(uint64_t*)(m+64); char*cells=m+4096;
  memset(m,0,NCELL*CELL+4096);
  pid_t c=fork();
  if(c==0){pin(1); char*dst=aligned_alloc(64,MSG); memset(dst,1,MSG);
    uint64_t t=0; for(int r=0;r<reps;r++) for(size_t off=0;off<MSG;off+=CELL){ while(*head==t); memcpy(dst+off,cells+(t%NCELL)*CELL,CELL); t++; __atomic_store_n(tail,t,__ATOMIC_RELEASE);} exit(0);}
  pin(0); char*src=aligned_alloc(64,MSG); memset(src,2,MSG);
  uint64_t h=0; double best=1e18;
  for(int r=0;r<reps;r++){ double t0=now();
    for(size_t off=0;off<MSG;off+=CELL){ while(h-*tail>=NCELL); char*d=cells+(h%NCELL)*CELL; if(nt){nt_copy(d,src+off,CELL);_mm_sfence();} else memcpy(d,src+off,CELL); h++; __atomic_store_n(head,h,__ATOMIC_RELEASE);}
    while(*tail!=h); double t=now()-t0; if(t<best)best=t; }
  waitpid(c,0,0); printf("nt=%d 4MiB stream best %.1f us = %.2f GB/s\n",nt,best/1000,MSG/best); return 0;}
