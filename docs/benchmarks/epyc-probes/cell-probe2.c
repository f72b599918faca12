/* cell-probe2: like cell-probe, with CHUNK bytes per message, NT 0 memcpy / 1 avx2 stream / 2 sse2 stream,
 * SAME 1 = every message from the same source and into the same destination (osu_bw's buffers). */
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
__attribute__((target("avx2"))) static void nt_copy(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){__m256i a=_mm256_loadu_si256((const __m256i*)(s+i)),b=_mm256_loadu_si256((const __m256i*)(s+i+32));_mm256_stream_si256((__m256i*)(d+i),a);_mm256_stream_si256((__m256i*)(d+i+32),b);}}
static void nt_copy2(char*d,const char*s,size_t n){for(size_t i=0;i<n;i+=64){__m128i a=_mm_loadu_si128((const __m128i*)(s+i)),b=_mm_loadu_si128((const __m128i*)(s+i+16)),c=_mm_loadu_si128((const __m128i*)(s+i+32)),e=_mm_loadu_si128((const __m128i*)(s+i+48));_mm_stream_si128((__m128i*)(d+i),a);_mm_stream_si128((__m128i*)(d+i+16),b);_mm_stream_si128((__m128i*)(d+i+32),c);_mm_stream_si128((__m128i*)(d+i+48),e);}}
int main(int argc,char**argv){
  int chunk=atoi(argv[1]), nt=atoi(argv[2]), same=atoi(argv[3]); int reps=20;
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
      if(nt==1){nt_copy(d,s,chunk);_mm_sfence();} else if(nt==2){nt_copy2(d,s,chunk);_mm_sfence();} else memcpy(d,s,chunk); h++; __atomic_store_n(head,h,__ATOMIC_RELEASE);}
    while(*tail!=h); double t=now()-t0; sum+=t; if(t<best)best=t; }
  waitpid(c,0,0); printf("chunk %d nt=%d same=%d: best %.2f GB/s mean %.2f\n",chunk,nt,same,MSG/best,MSG/(sum/reps)); return 0;}
