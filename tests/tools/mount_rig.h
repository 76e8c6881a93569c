// A real warpfs mount driven from a test program (tests/tools/kill9.cc): the child processes
// (the warpfs daemon in the foreground, mkfs.warpfs, fsck.warpfs, fusermount3), and the tree
// under a mount read back with syscalls in the crash harness's terms (crash_harness.h
// Observed), so that its checker can judge it.
//
// Children get SIGKILL when this process dies (PR_SET_PDEATHSIG): no daemon outlives a
// harness that a test driver killed. Thread-safety: a Daemon is used by one thread; another
// may send its pid() a signal (the kill -9 harness does) while that thread works on the mount.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fs/crash_harness.h"

namespace warpfs::fs::mounted {

std::string errno_name(int e);                           // "ENOENT"; "0" for 0
std::string last_lines(const std::string& s, size_t n);  // the last n lines of s

// Starts argv[0] (searched in PATH) with stdout and stderr on `out_fd`, SIGINT, SIGTERM,
// SIGHUP and SIGPIPE at their defaults, and SIGKILL for it when this process ends. Its pid,
// or -1 with *error set (exec's failure included).
pid_t spawn(const std::vector<std::string>& argv, int out_fd, std::string* error);
// A wait status as a shell shows it: the exit code, or 128 + the signal.
int status_code(int wait_status);
// Runs argv to completion, its stdout and stderr in *out. Its status_code(), or -1 if it
// could not start.
int run_program(const std::vector<std::string>& argv, std::string* out);

// The warpfs daemon of one mount: the image DIR/img mounted on DIR/mnt, its output in
// DIR/daemon.log. At most one daemon at a time per object; the destructor abandon()s it.
class Daemon {
 public:
  Daemon(const std::string& warpfs, const std::string& dir);
  ~Daemon() { abandon(); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  const std::string& mnt() const { return mnt_; }
  pid_t pid() const { return pid_; }  // -1 once reaped
  std::string log() const;            // what the last daemon printed

  // `warpfs -f emu:DIR/img DIR/mnt -o options`; "" once the mount is there (30 s at most),
  // or why not.
  std::string start(const std::string& options);
  // Starts a daemon and sends it SIGKILL `delay_us` later, mounted or not yet (inside
  // journal replay, say), and detaches the mount if there is one. "" or how the daemon ended
  // before the signal.
  std::string start_and_kill(const std::string& options, uint64_t delay_us);
  // "" while the daemon runs; once it has ended (it is then reaped): "killed" after SIGKILL,
  // else how it ended, with the end of its log.
  std::string ended();
  // After a SIGKILL was sent: reaps the daemon. "" if SIGKILL ended it, else how it ended.
  std::string reap_killed();
  // Detaches a mount whose daemon is dead (umount -l); nothing if there is no mount.
  void detach();
  // A clean unmount: fusermount3 -u, and the daemon must exit 0 within 30 s. "" or what not.
  std::string unmount();
  // Whatever its state: killed, reaped, the mount detached.
  void abandon();

 private:
  std::string launch(const std::string& options);  // "" or why it did not start
  std::string describe_end(int wait_status);       // sets ended_
  void set_pid(pid_t p);

  const std::string prog_, dir_, img_, mnt_, log_;
  pid_t pid_ = -1;
  std::string ended_;  // how the last daemon ended, once reaped
};

// From now on SIGINT and SIGTERM kill the running Daemon, detach its mount and remove
// `dir`'s img, daemon.log and mnt, and `dir`, before the signal ends this process. Call once.
void clean_up_on_termination(const std::string& dir);

// The tree under `mnt` read with syscalls (lstat, readdir, read, readlink, listxattr,
// getxattr), inode numbers as the daemon gives them. "" or what could not be read, an entry
// whose readdir and lstat disagree, a directory reachable twice, or a "." or ".." naming the
// wrong inode.
std::string observe(const std::string& mnt, crash::Observed* out);
// The same for the subtree at `dir` (a directory in a mount), whose ".." is inode `parent`.
std::string observe(const std::string& dir, Ino parent, crash::Observed* out);

}  // namespace warpfs::fs::mounted
