/*
 * line-probe.c - what a ring costs over one cache line, between two pinned processes.
 *
 *   gcc -O2 -o line-probe line-probe.c && ./line-probe MODE [SLOTS [STRIDE]]
 *
 * MODE 0: one cache line carries both directions (physlim's floor: 2i+1 out, 2i+2 back).
 * MODE 1: one fixed line per direction (ping writes A, pong writes B).
 * MODE 2: one ring of SLOTS slots (STRIDE bytes apart: default 256 slots, 64 B) per direction;
 *         message i uses slot i % SLOTS, as polyrail's shm rings do (a fresh line per message).
 * Prints the one-way time (half a round trip) over 2,000,000 round trips.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
#define N 2000000
int main(int argc,char**argv){
  int mode=atoi(argv[1]), slots=argc>2?atoi(argv[2]):256, stride=argc>3?atoi(argv[3]):64;
  if(slots<1||stride<8||stride%8||(long)slots*stride>(1<<19)) return 2; /* the two directions 512 KiB apart: their rings never share a line */
  char*m=mmap(0,1<<20,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  volatile uint64_t *a=(uint64_t*)m, *b=(uint64_t*)(m+(mode==0?0:(1<<19)));
  pid_t c=fork();
  if(c==0){pin(1);
    for(uint64_t i=0;i<N;i++){
      volatile uint64_t *sa=a, *sb=b; if(mode==2){sa=a+stride/8*(i%slots); sb=b+stride/8*(i%slots);}
      if(mode==0){while(*sa!=2*i+1);*sa=2*i+2;} else {while(*sa!=i+1);*sb=i+1;}
    } exit(0);}
  pin(0); double t0=now();
  for(uint64_t i=0;i<N;i++){
    volatile uint64_t *sa=a, *sb=b; if(mode==2){sa=a+stride/8*(i%slots); sb=b+stride/8*(i%slots);}
    if(mode==0){*sa=2*i+1;while(*sa!=2*i+2);} else {*sa=i+1;while(*sb!=i+1);}
  }
  double t=now()-t0; waitpid(c,0,0); printf("mode %d one-way %.1f ns\n",mode,t/N/2); return 0;}
