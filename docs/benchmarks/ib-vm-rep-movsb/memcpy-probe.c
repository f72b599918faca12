#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
static void chunked(char*d,const char*s,size_t n,size_t c){for(size_t o=0;o<n;o+=c)memcpy(d+o,s+o,c);}
static void words(char*d,const char*s,size_t n){volatile uint64_t*dd=(volatile uint64_t*)d;const uint64_t*ss=(const uint64_t*)s;for(size_t i=0;i<n/8;i++)dd[i]=ss[i];}
int main(){ size_t n=65536; char*a=malloc(n*64),*b=malloc(n*64); memset(a,1,n*64); memset(b,2,n*64);
 for(int k=0;k<2;k++){
 double t=now(); for(int i=0;i<64;i++) memcpy(b+i*n,a+i*n,n); printf("memcpy whole: %.1f us per 64KiB\n",(now()-t)/64);
 t=now(); for(int i=0;i<64;i++) chunked(b+i*n,a+i*n,n,1024); printf("memcpy 1KiB parts: %.1f us\n",(now()-t)/64);
 t=now(); for(int i=0;i<64;i++) chunked(b+i*n,a+i*n,n,2048); printf("memcpy 2KiB parts: %.1f us\n",(now()-t)/64);
 t=now(); for(int i=0;i<64;i++) words(b+i*n,a+i*n,n); printf("u64 loop: %.1f us\n",(now()-t)/64);
 }
 return 0;}
