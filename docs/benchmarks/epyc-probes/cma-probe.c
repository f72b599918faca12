/*
 * cma-probe.c - process_vm_readv of 4 MiB from a peer's private memory against a 4 MiB memcpy.
 *
 *   gcc -O2 -o cma-probe cma-probe.c && ./cma-probe HUGE [CHUNK]
 *
 * The parent (CPU 0) fills 4 MiB of private anonymous memory; the child (CPU 1) reads it with
 * process_vm_readv in CHUNK-byte calls (default: one call), 50 times, then memcpys 4 MiB of its
 * own 50 times. HUGE=1 asks for transparent huge pages on both buffers (MADV_HUGEPAGE), 0 forbids
 * them. Prints medians and their ratio.
 */
#define _GNU_SOURCE
#include <sys/uio.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>
#include <sys/wait.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  size_t n=4<<20; int huge=argc>1&&atoi(argv[1]); size_t chunk=argc>2?strtoul(argv[2],0,0):n;
  char*src=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  if(huge)madvise(src,n,MADV_HUGEPAGE); else madvise(src,n,MADV_NOHUGEPAGE);
  memset(src,1,n);
  int p[2];pipe(p);
  pid_t par=getpid();
  pid_t c=fork();
  if(c==0){pin(1);char*dst=mmap(0,n,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
    if(huge)madvise(dst,n,MADV_HUGEPAGE); else madvise(dst,n,MADV_NOHUGEPAGE);
    memset(dst,2,n);double t[50];
    for(int i=0;i<50;i++){double a=now();
      for(size_t off=0;off<n;off+=chunk){struct iovec l={dst+off,chunk},r={src+off,chunk};
      if(process_vm_readv(par,&l,1,&r,1,0)!=(ssize_t)chunk){perror("readv");exit(1);}}
      t[i]=now()-a;}
    qsort(t,50,sizeof(double),cmp);
    double m[50];char*d2=malloc(n);memset(d2,0,n);
    for(int i=0;i<50;i++){double a=now();memcpy(d2,dst,n);m[i]=now()-a;}
    qsort(m,50,sizeof(double),cmp);
    printf("huge=%d chunk=%zu readv median %.1f us min %.1f ; memcpy median %.1f ratio %.2f\n",huge,chunk,t[25],t[0],m[25],t[25]/m[25]);
    exit(0);}
  pin(0);waitpid(c,0,0);return 0;}
