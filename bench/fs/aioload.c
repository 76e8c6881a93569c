// aioload: 4 KiB random O_DIRECT reads or writes through Linux native AIO at a given queue
// depth, several jobs at once: fio's randread/randwrite libaio jobs where fio and its
// libraries cannot be carried (the device machine). Raw syscalls, no libaio.
//   usage: aioload FILE read|write SIZE_MB QD JOBS SECONDS
// The file must exist with at least SIZE_MB (the caller lays it out). Prints one JSON object:
// {"rw","qd","jobs","seconds","ios","iops"}.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/aio_abi.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { kBlock = 4096, kMaxQd = 256 };

static const char* path;
static int writing, qd;
static uint64_t blocks;
static double seconds;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t next_rand(uint64_t* s) {  // xorshift64*
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return *s * 0x2545F4914F6CDD1Dull;
}

static void die(const char* what) {
  fprintf(stderr, "aioload: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void* job(void* arg) {
  uint64_t seed = 0x9E3779B97F4A7C15ull * ((uintptr_t)arg + 1);
  int fd = open(path, (writing ? O_WRONLY : O_RDONLY) | O_DIRECT);
  if (fd < 0) die("open");
  aio_context_t ctx = 0;
  if (syscall(SYS_io_setup, qd, &ctx) != 0) die("io_setup");
  static __thread struct iocb cbs[kMaxQd];
  struct iocb* ptrs[kMaxQd];
  struct io_event evs[kMaxQd];
  char* buf;
  if (posix_memalign((void**)&buf, kBlock, (size_t)qd * kBlock) != 0) die("posix_memalign");
  memset(buf, 0x5a, (size_t)qd * kBlock);
  for (int i = 0; i < qd; ++i) {
    memset(&cbs[i], 0, sizeof cbs[i]);
    cbs[i].aio_fildes = (uint32_t)fd;
    cbs[i].aio_lio_opcode = writing ? IOCB_CMD_PWRITE : IOCB_CMD_PREAD;
    cbs[i].aio_buf = (uint64_t)(uintptr_t)(buf + (size_t)i * kBlock);
    cbs[i].aio_nbytes = kBlock;
    cbs[i].aio_offset = (int64_t)(next_rand(&seed) % blocks) * kBlock;
    cbs[i].aio_data = (uint64_t)i;
    ptrs[i] = &cbs[i];
  }
  if (syscall(SYS_io_submit, ctx, (long)qd, ptrs) != qd) die("io_submit");
  uint64_t ios = 0;
  const double end = now_s() + seconds;
  int inflight = qd;
  while (inflight > 0) {
    long n = syscall(SYS_io_getevents, ctx, 1L, (long)qd, evs, NULL);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("io_getevents");
    }
    inflight -= (int)n;
    const int more = now_s() < end;
    int k = 0;
    for (long e = 0; e < n; ++e) {
      if ((int64_t)evs[e].res != kBlock) {
        errno = evs[e].res < 0 ? (int)-evs[e].res : EIO;
        die("a request");
      }
      ++ios;
      if (!more) continue;
      struct iocb* cb = &cbs[evs[e].data];
      cb->aio_offset = (int64_t)(next_rand(&seed) % blocks) * kBlock;
      ptrs[k++] = cb;
    }
    if (k > 0) {
      if (syscall(SYS_io_submit, ctx, (long)k, ptrs) != k) die("io_submit");
      inflight += k;
    }
  }
  syscall(SYS_io_destroy, ctx);
  free(buf);
  close(fd);
  return (void*)(uintptr_t)ios;
}

int main(int argc, char** argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: aioload FILE read|write SIZE_MB QD JOBS SECONDS\n");
    return 2;
  }
  path = argv[1];
  writing = strcmp(argv[2], "write") == 0;
  blocks = strtoull(argv[3], NULL, 10) * (1u << 20) / kBlock;
  qd = atoi(argv[4]);
  const int jobs = atoi(argv[5]);
  seconds = atof(argv[6]);
  if (blocks == 0 || qd < 1 || qd > kMaxQd || jobs < 1 || jobs > 64 || !(seconds > 0)) {
    fprintf(stderr, "aioload: bad arguments\n");
    return 2;
  }
  pthread_t t[64];
  const double start = now_s();
  for (int j = 0; j < jobs; ++j) {
    if ((errno = pthread_create(&t[j], NULL, job, (void*)(uintptr_t)j)) != 0) die("pthread_create");
  }
  uint64_t ios = 0;
  for (int j = 0; j < jobs; ++j) {
    void* r;
    pthread_join(t[j], &r);
    ios += (uint64_t)(uintptr_t)r;
  }
  const double took = now_s() - start;
  printf("{\"rw\":\"%s\",\"qd\":%d,\"jobs\":%d,\"seconds\":%.3f,\"ios\":%llu,\"iops\":%.0f}\n",
         writing ? "write" : "read", qd, jobs, took, (unsigned long long)ios, (double)ios / took);
  return 0;
}
