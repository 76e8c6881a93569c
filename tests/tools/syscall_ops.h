// crash_harness.h's operations as real syscalls on a mounted filesystem, with the model
// following: what warpfs-kill9 runs from one thread, and warpfs-stress-mount from many
// processes at once. Writes and reads go through pwrite/pread, O_DIRECT descriptors or a
// shared mapping (Op::via), fallocate through fallocate(2), clones through
// copy_file_range(2) (a dedupe is skipped: FIDEDUPERANGE does not reach a FUSE daemon), and
// so on.
//
// Thread-safety: a SyscallRunner is used by one thread; several runners may work on one
// mount at once, each on a subtree of its own. A mapping that faults against a dead daemon
// raises SIGBUS: the runner catches it for its own accesses (install_sigbus_guard()) and
// reports EIO.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fs/crash_harness.h"

namespace warpfs::fs::mounted {

// A create, mkdir or symlink that a kill interrupted: its inode number comes from the
// recovered tree, if the entry is there.
struct PendingCreate {
  bool set = false;
  crash::OpKind kind = crash::OpKind::kCreate;
  crash::Id dir = 0;
  std::string name, target;
  uint32_t perm = 0;
};

// SIGBUS in a mapping access of a SyscallRunner becomes EIO: call once per process, before
// any runner maps a file.
void install_sigbus_guard();
// memcpy to or from a mapping: false if it raised SIGBUS (install_sigbus_guard() first).
bool guarded_memcpy(void* dst, const void* src, size_t n);

class SyscallRunner {
 public:
  // `base`: the model's root on the mount (the mountpoint, or a directory under it).
  // `killed`: whether the daemon was killed (an operation that failed then may or may not
  // have happened); null: never.
  SyscallRunner(std::string base, crash::Model* model, std::function<bool()> killed = nullptr)
      : base_(std::move(base)), m_(*model), killed_(std::move(killed)) {}
  ~SyscallRunner() { close_all(); }
  SyscallRunner(const SyscallRunner&) = delete;
  SyscallRunner& operator=(const SyscallRunner&) = delete;

  // Runs `op` on the mount and on the model: the model changes when the call succeeded, or
  // when the daemon was killed meanwhile. "" or a mismatch (a read that disagrees with the
  // model, a mode that is not the one asked for); the errno in *rc.
  std::string exec(const crash::Op& op, int* rc);
  // Closes what kOpen holds (the model is not told: the harness drops or restarts it).
  void close_all();
  // kOpen's descriptors, released as kRelease would (the model follows).
  void release_all();
  const PendingCreate& pending() const { return pending_; }
  void clear_pending() { pending_ = PendingCreate{}; }
  // The model side of a create, mkdir or symlink of `name` in `dir`: a new state.
  std::string add_created(crash::OpKind kind, crash::Id dir, const std::string& name, Ino ino,
                          uint32_t perm, const std::string& target, uint32_t mode);

 private:
  std::string path(const std::string& p) const { return base_ + (p == "/" ? "" : p); }
  bool killed() const { return killed_ && killed_(); }
  bool path_of(crash::Id id, std::string* p) const;
  // A descriptor on `id`: one the workload holds, else a new one (*temp: close it after).
  // `fresh`: always a new one (O_DIRECT), through /proc/self/fd for an unlinked inode.
  // -errno if it cannot be had.
  int open_id(crash::Id id, int flags, bool fresh, bool* temp);
  int create(crash::OpKind kind, const std::string& p, uint32_t perm, const std::string& target,
             Ino* ino, uint32_t* mode);
  int write(int fd, const crash::Op& op, const std::string& data);  // 0 or errno
  int read(int fd, const crash::Op& op, std::string* out);          // 0 or errno

  const std::string base_;
  crash::Model& m_;
  std::function<bool()> killed_;
  std::map<crash::Id, std::vector<int>> fds_;  // files the workload holds open (kOpen)
  PendingCreate pending_;
};

}  // namespace warpfs::fs::mounted
