/* pack-probe.c - message rate of a one-way stream of 8-byte messages between two pinned
 * processes: one entry of STRIDE bytes per message (STRIDE 128: polyrail's records; 16: packed
 * entries, four per line). Ring of 8 KiB; the consumer publishes its read index every quarter.
 *   gcc -O2 -o pack-probe pack-probe.c && ./pack-probe STRIDE
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
#define N 20000000ULL
#define RING 8192
int main(int argc,char**argv){
  int stride=atoi(argv[1]); uint64_t slots=RING/stride;
  char*m=mmap(0,RING+4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  volatile uint64_t *readpos=(uint64_t*)(m+RING); char*ring=m;
  pid_t c=fork();
  if(c==0){pin(1); uint64_t sum=0;
    for(uint64_t i=0;i<N;i++){
      volatile uint64_t*e=(uint64_t*)(ring+(i%slots)*stride);
      uint64_t want=i/slots+1;
      while(__atomic_load_n(&e[0],__ATOMIC_ACQUIRE)!=want);
      sum+=e[1];
      if((i+1)%(slots/4)==0) __atomic_store_n(readpos,i+1,__ATOMIC_RELEASE);
    }
    if(sum==42)puts("");
    exit(0);}
  pin(0); double t0=now(); uint64_t cached=0;
  for(uint64_t i=0;i<N;i++){
    while(i-cached>=slots) cached=__atomic_load_n(readpos,__ATOMIC_ACQUIRE);
    volatile uint64_t*e=(uint64_t*)(ring+(i%slots)*stride);
    e[1]=i;
    __atomic_store_n(&e[0],i/slots+1,__ATOMIC_RELEASE);
  }
  waitpid(c,0,0);
  double t=now()-t0; printf("stride %d: %.1f ns per message, %.1f M msg/s\n",stride,t/N,N/t*1e3); return 0;}
