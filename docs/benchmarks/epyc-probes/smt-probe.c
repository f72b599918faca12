/* smt-probe.c: memcpy of 256 KiB (L2-resident) repeatedly on CPU 0 alone, then on CPU 0 and CPU 1
 * at once (two processes); prints GB/s per process. Two cores: the pair runs as fast as one
 * alone; two hyperthreads of one core: each gets about half. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include <sys/mman.h>
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define SZ (256<<10)
static double run(int cpu){pin(cpu);char*a=aligned_alloc(64,SZ),*b=aligned_alloc(64,SZ);memset(a,1,SZ);memset(b,2,SZ);
  int n=20000; double t=now(); for(int i=0;i<n;i++){memcpy(b,a,SZ); __asm__ volatile(""::"r"(b):"memory");} t=now()-t; return (double)SZ*n/t/1e9;}
int main(){
  printf("alone cpu0 %.1f GB/s\n", run(0)); fflush(stdout);
  volatile double *r=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  pid_t c=fork(); if(c==0){r[1]=run(1);exit(0);} r[0]=run(0); waitpid(c,0,0);
  printf("together cpu0 %.1f cpu1 %.1f GB/s\n", r[0], r[1]); return 0;}
