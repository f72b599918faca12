/*
 * cell-probe.c - a 4 MiB stream through 128 shared 16 KiB cells between two pinned processes,
 * the shape of polyrail's shm-only large messages, in C with nothing else around it.
 *
 *   gcc -O2 -o cell-probe cell-probe.c && ./cell-probe NT [CHUNK [SAME]]
 *
 * The sender (CPU 0) copies each CHUNK-byte piece (default 16384, at most a cell) of a private
 * 4 MiB buffer into the next cell in turn and publishes it; the receiver (CPU 1) copies it out
 * into its private buffer and frees it. NT=0: memcpy; NT=1: non-temporal 32-byte stores (AVX2);
 * NT=2: non-temporal 16-byte stores (SSE2, as polyrail's cells apart). SAME=1: every piece
 * from the same source and into the same destination (osu_bw's buffers). Prints the best and
 * the mean of 20 streams.
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
__attribute__((target("avx2"))) static void nt32(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){__m256i a=_mm256_loadu_si256((const __m256i*)(s+i)),b=_mm256_loadu_si256((const __m256i*)(s+i+32));_mm256_stream_si256((__m256i*)(d+i),a);_mm256_stream_si256((__m256i*)(d+i+32),b);}}
static void nt16(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64)for(int k=0;k<4;k++)_mm_stream_si128((__m128i*)(d+i)+k,_mm_loadu_si128((const __m128i*)(s+i)+k));}
int main(int argc,char**argv){
  int nt=argc>1?atoi(argv[1]):0, chunk=argc>2?atoi(argv[2]):CELL, same=argc>3?atoi(argv[3]):0, reps=20;
  if(chunk<64||chunk>CELL||chunk%64||MSG%chunk) return 2;
  char*m=mmap(0,NCELL*CELL+4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  volatile uint64_t*head=(uint64_t*)m, *tail=(uint64_t*)(m+64); char*cells=m+4096;
  memset(m,0,NCELL*CELL+4096);
  pid_t c=fork();
  if(c==0){pin(1); char*dst=aligned_alloc(64,MSG); memset(dst,1,MSG);
    uint64_t t=0; for(int r=0;r<reps;r++) for(size_t off=0;off<MSG;off+=chunk){ while(*head==t); memcpy(dst+(same?0:off),cells+(t%NCELL)*CELL,chunk); t++; __atomic_store_n(tail,t,__ATOMIC_RELEASE);} exit(0);}
  pin(0); char*src=aligned_alloc(64,MSG); memset(src,2,MSG);
  uint64_t h=0; double best=1e18, sum=0;
  for(int r=0;r<reps;r++){ double t0=now();
    for(size_t off=0;off<MSG;off+=chunk){ while(h-*tail>=NCELL); char*d=cells+(h%NCELL)*CELL; const char*s=src+(same?0:off);
      if(nt==1){nt32(d,s,chunk);_mm_sfence();} else if(nt==2){nt16(d,s,chunk);_mm_sfence();} else memcpy(d,s,chunk);
      h++; __atomic_store_n(head,h,__ATOMIC_RELEASE);}
    while(*tail!=h);
    double t=now()-t0; sum+=t; if(t<best)best=t; }
  waitpid(c,0,0); printf("nt=%d chunk %d same=%d: 4 MiB stream best %.1f us = %.2f GB/s, mean %.2f GB/s\n",nt,chunk,same,best/1000,MSG/best,MSG/(sum/reps)); return 0;}
