// How many FUSE worker threads a daemon starts at most where -o max_threads= is not given
// (fuse_session.h's SessionLoop): a function of the CPUs the daemon may run on. No libfuse
// here, so that the tests can include it.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>

namespace warpfs::daemon {

// The CPUs this thread may run on (its affinity: taskset, a cpuset cgroup, a container), as
// nproc counts them; sysconf's online count where the mask cannot be read. At least 1.
inline unsigned usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<unsigned>(n) : 1;
}

// Worker threads where -o max_threads= is not given: one per two usable CPUs, at least
// libfuse's default (10), at most 64. Where the CPUs are the limit, more threads only add
// switches, and each request also needs CPU outside the daemon (the client, the kernel's
// side of /dev/fuse): on 2 cores, QD32 O_DIRECT random reads ran 22% (warpfs) and 48%
// (warpfs-null) slower with 64 threads than with 10; on the 16-core device machine
// (bench/fs/ab_aio.sh, alternating rounds; bench/results/worker-threads-16core-20261206.md)
// 16 threads against 64 ran 4 x QD8 4 KiB O_DIRECT reads 1.40x, writes 1.37x, and 10 against
// 16 ran QD32 reads 1.12-1.40x, writes 0.96-1.21x, 4 x QD8 reads and writes 1.10-1.33x, QD1
// at par (0.86-1.11, 12 rounds). Daemon CPU a QD32 write fell from 35 µs to 22 (29 and 18 of
// them in the kernel: passthrough_ll's 11 threads spent 13), a 4 x QD8 read from 32 to 23; a
// QD32 read stayed near 20. Above 20 CPUs nothing was measured: half of them is a guess. Idle
// threads stay (libfuse's max_idle_threads default).
inline unsigned default_max_threads(unsigned cpus = usable_cpus()) {
  return std::clamp(cpus / 2, 10u, 64u);
}

// The same where the device takes tens of microseconds per command (a drive through VFIO or
// NVMe/TCP, or the emulation with a latency model) and no read reapers answer the reads
// (default_read_reapers: below 4 CPUs; or -o async_reads=0, or io_uring): a handler keeps
// its thread for the command's whole latency, so the threads bound how many commands the
// device serves together, and more are needed: two per CPU, at least 24, at most 64. With 80
// µs of emulated latency on 2 cores, 24 threads against 10 ran 2 x QD32 O_DIRECT 4 KiB random
// reads 1.22-1.26x, QD32 writes 1.07-1.19x, QD1 1.0x, with less daemon CPU per read. With
// reapers the handlers return before the device does, and default_max_threads() serves: on
// the 16-core device machine with 80 µs, 10 threads against 32 ran QD32 writes 1.13-1.53x,
// 4 x QD8 writes 1.56-1.78x, 4 x QD8 reads 1.06-1.15x, QD32 and QD1 reads at par.
inline unsigned slow_device_max_threads(unsigned cpus = usable_cpus()) {
  return std::clamp(2 * std::min(cpus, 32u), 24u, 64u);
}

// Which of the two a daemon starts with: `prompt` (the device completes commands within
// microseconds) or `reapers` (read_reaper.h threads answer the reads) says that handlers
// do not wait out a device's latency on their threads.
inline unsigned default_worker_threads(bool prompt, unsigned reapers,
                                       unsigned cpus = usable_cpus()) {
  return prompt || reapers != 0 ? default_max_threads(cpus) : slow_device_max_threads(cpus);
}

// Whether the session loop parks the idle workers a light load does not need
// (reader_gate.h): on 8 CPUs or more. Measured at both ends: on the 16-core device machine
// (a VM whose idle vCPUs halt) parking made QD1 4 KiB O_DIRECT reads after a burst 1.35-1.51x
// faster; on the 2-core VM 0.75-0.8x. Between them nothing was measured: 8 is a guess.
inline bool park_idle_workers(unsigned cpus = usable_cpus()) {
  return cpus >= 8;
}

// Whether SessionLoop's workers share the session's one /dev/fuse descriptor (-o shared_fd=1)
// rather than each reading from a clone of its own (worker_fds.h) where shared_fd= is not
// given: shared where the device completes commands promptly (`prompt`: the emulated one
// with no latency), each its own otherwise (a drive, a latency model). Measured on the
// 16-core device machine (bench/results/worker-fds-16core-20261206.md, 4 KiB O_DIRECT at
// 2 x QD32): with an 80 µs device their own descriptors ran writes 1.27-1.30x and reads
// 1.01-1.06x; with a prompt device they halved the daemon's CPU per request (21-28 µs against
// 36-40, which is spinning for the shared descriptor's lock) but ran writes 0.73-0.80x and
// reads 0.79-1.0x, its CPUs 55-72 % idle: the workers then sleep between requests, and waking
// one on that VM (a halted vCPU) costs more than the spin. On the 2-core VM both ways ran
// within the noise of each other.
inline bool default_shared_fd(bool prompt) {
  return prompt;
}

// Threads that answer reads after their handlers return (read_reaper.h, -o async_reads)
// where async_reads= is not given: three per 4 CPUs (at most 32), none below 4. Measured at
// both ends with an 80 µs device. On the 16-core device machine (bench/results/
// reapers-16core-20261206.md, 2 x QD32 4 KiB O_DIRECT random reads, 3 alternating rounds in
// each of three runs): 4 reapers were each busy 88 % of the time (17.6 CPU-s of 20 in 5 s),
// the reads' limit; 8 ran 1.04-1.15x of 4, 12 1.08-1.16x, 16 1.14x; 0.70-0.80 of the
// zero-latency rate with 4, 0.81-0.89 with 12. QD1 reads at par for 4 to 16, 4 x QD8 reads
// 0.95-0.97x of 4 (whose rounds spread 258-277 K), reads at no latency with 8 at par with 4
// (async-reads-20261206.md: 4 against none 1.03-1.07x, 1 reaper 0.55x). On the 2-core VM
// they were slower (one reaper 0.67-0.87x, two 0.79-1.09x): the CPUs are the limit there,
// and a reader woken on /dev/fuse for each request costs more than a worker woken by its
// read. Between 2 and 16 CPUs, and above, nothing was measured: the threshold and the cap
// are guesses.
inline unsigned default_read_reapers(unsigned cpus = usable_cpus()) {
  return cpus >= 4 ? std::min(cpus * 3 / 4, 32u) : 0;
}

}  // namespace warpfs::daemon
