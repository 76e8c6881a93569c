// The power-cut crash harness. A seeded workload of file operations drives the
// filesystem core in-process, on a RAM-backed emulated NVMe controller behind a CutDevice.
// A Model follows every operation and keeps the states the filesystem may come back in.
// The device is cut at a chosen write, flush or trim (so inside journal commits,
// checkpoints and data writes), the controller loses its volatile write cache
// (EmulatedTransport::power_cut: each cached 4 KiB unit persists or not), a new controller
// powers up over the same media, and then: fsck of the crashed image must be clean (it
// replays the journal in memory), the mount replays the journal, the tree read back must be
// one the model allows, fsck after unmount must be clean, and a few more operations on the
// recovered filesystem must work and check clean too.
//
// The oracle, from what warpfs promises (fs/FORMAT.md "Journal"; filesystem.h): there is one
// metadata journal; every operation joins the running transaction as a whole, and a commit
// contains whole operations (the gate waits until no operation is inside), except for the
// operations that run as several transactions: a write commits per piece of at most 1 MiB
// (file.cc kBlocksPerTxn), and a truncate sets the size in one transaction and frees blocks
// in later ones (invisible here, as is freeing an unlinked inode), and a clone
// (copy_file_range) copies its edges as writes and maps its whole blocks in transactions of a
// few extents before it sets the size (model_clone). fsync, fdatasync (of any
// file or directory) make that node durable: fsync its metadata (for a directory, its
// names), fdatasync its size (or existence) and data; the journal commits in order, so what
// came before the node's last such change is durable too. sync commits everything.
// So, numbering the model's states S_0, S_1, ... (one per operation, one per piece of a
// large write):
//   metadata  The recovered tree (every name, its inode number, type, permission bits, link
//             count, size, symlink target and xattrs; hard links as the same inode) equals
//             S_k for one k with lo <= k <= hi. lo: the state at the last sync that
//             returned 0; the state of the last change an acknowledged fsync/fdatasync needed
//             (Model::synced); or the state before an operation during which a commit
//             completed (FsStats::commits rose: commits are durable when counted). hi: the
//             last state an operation reached before the cut, the cut one included.
//   data      File data is written in place, outside the journal, before the transaction
//             that maps it closes, and every commit flushes before it writes the journal
//             (ordered mode). So when the metadata came back as S_k, every data write of
//             the operations up to k was durable, and each 4 KiB block of a recovered file,
//             as far as its recovered size reaches, equals that block in some S_t with
//             k <= t <= hi: a later write may have landed or not, block by block, never
//             torn inside a block, and from no state before the file's last acknowledged
//             fsync/fdatasync. A file untouched since an acknowledged fsync has exactly its
//             fsync'd content; data that a committed size covers is never lost.
// Nothing else is allowed: no half-done rename, no name in two places, no size or xattr
// from outside [lo, hi]; fsck finds leaked blocks and inodes. (Several states may have the
// same metadata, e.g. around an overwrite; the tree passes if one of them explains it all.)
//
// Thread-safety: none; a Session (and a Model) is used by one thread at a time.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fs/core_rig.h"

namespace warpfs::fs::crash {

using test::CutDevice;

using Id = uint64_t;  // a model inode: one per creation, never reused; the root is 0
// A 4 KiB block of file data, shared between the states that did not change it; null reads
// as zeroes. Bytes past the end of the file are zero.
using Block = std::shared_ptr<const std::string>;

struct MNode {
  Ino ino = 0;
  uint32_t mode = 0;          // type and permission bits
  uint64_t size = 0;          // regular files; symlinks: the target's length
  std::vector<Block> blocks;  // regular files: ceil(size / 4096)
  std::string target;         // symlinks
  std::map<std::string, std::string> xattrs;
  std::map<std::string, Id> entries;  // directories
  uint32_t links = 0;                 // names (directories: 2 + subdirectories)
  uint32_t opens = 0;                 // open handles the workload holds
};

// One state of the filesystem as the workload sees it: linked inodes, and unlinked ones that
// are still open.
struct State {
  std::map<Id, std::shared_ptr<const MNode>> nodes;
};

class Model {
 public:
  // An empty root directory: the filesystem's root (inode 1), or a directory of the tree
  // that one worker of a concurrent workload owns (its mode 0755, as mkfs makes the root).
  explicit Model(Ino root = kRootInode);
  Ino root_ino() const { return root_ino_; }
  const State& now() const { return cur_; }
  const MNode* node(Id id) const;
  // A private copy of `id` in the current state, to change (copy-on-write).
  MNode& edit(Id id);
  Id add(const MNode& n);
  void remove(Id id);
  bool resolve(const std::string& path, Id* id) const;  // "/" and "/a/b"
  // Every name, the root first, breadth first: (path, id).
  std::vector<std::pair<std::string, Id>> names() const;

  // The current state is one the filesystem may be found in after a crash.
  void step();
  size_t current() const { return base_ + hist_.size() - 1; }  // index of the last step()
  // States before `k` can no longer be found (k's transaction is durable).
  void durable(size_t k);
  // fsync (`data_only`: fdatasync) of `id` returned 0 in the current state: the state of its
  // last change that the call makes durable (any of its metadata, a directory's names;
  // fdatasync: its size or creation) and every one before it are durable, and its data
  // blocks come from no state before the current one (data_floor).
  void synced(Id id, bool data_only);
  size_t data_floor(Id id) const {
    auto it = data_floor_.find(id);
    return it == data_floor_.end() ? 0 : it->second;
  }
  size_t lo() const { return base_; }
  const State& state(size_t k) const { return keep_ ? hist_[k - base_] : cur_; }
  // Without history (a run with no crash to come: the stress harnesses), step() keeps no
  // copy of the state and only the current one can be checked: lo() == current().
  void keep_history(bool keep) {
    keep_ = keep;
    if (!keep) durable(current());
  }
  // Whether the filesystem has the shared_blocks feature (clones share whole blocks: their
  // states differ, model_clone); set by whoever formatted it. `alone`: nothing but this
  // model's operations changes which blocks its files map (no dedup pass, no clones from
  // them by others), so a kDedupe can check that the destination now maps the source's.
  void set_block_sharing(bool on, bool alone = true) {
    sharing_ = on;
    sharing_alone_ = alone;
  }
  bool block_sharing() const { return sharing_; }
  bool block_sharing_alone() const { return sharing_ && sharing_alone_; }
  // After a recovery: state k (dropping open-unlinked inodes), with each file's data
  // replaced by what the disk holds (`data`: id -> contents). The history restarts there.
  void restart(size_t k, const std::map<Id, std::string>& data);

  // Under the kernel's writeback cache (warpfs -o writeback_cache) a file's data and its
  // size reach the filesystem when the kernel writes its pages back, page by page, in any
  // order, whatever the names did meanwhile; an fsync or fdatasync writes them all back
  // first. So what a crash may find of a file is, block by block, any version the block had
  // since the file's last acknowledged fsync/fdatasync (none later than the last state), and
  // a size it had since then, or a page boundary between the least and the largest of those.
  // track_writeback(true) keeps those versions from now on (step() and synced()).
  struct Versions {
    std::set<uint64_t> sizes;
    std::vector<std::vector<Block>> blocks;  // by block: each version once (null: zeroes)
  };
  void track_writeback(bool on);
  bool tracks_writeback() const { return track_wb_; }
  const Versions* versions(Id id) const {
    auto it = versions_.find(id);
    return it == versions_.end() ? nullptr : &it->second;
  }

 private:
  Ino root_ino_;
  bool keep_ = true;
  bool sharing_ = false, sharing_alone_ = false;
  State cur_;
  std::deque<State> hist_;  // states base_ .. base_ + size - 1
  size_t base_ = 0;
  // By node, the state of its last metadata change and of its last size change (creation
  // included), found by step() against the state before; and of its last acknowledged
  // fsync (synced()).
  State last_;
  std::map<Id, size_t> meta_at_, size_at_, data_floor_;
  Id next_ = 1;
  bool track_wb_ = false;
  std::map<Id, Versions> versions_;           // regular files, with track_wb_
  void versions_from(Id id, const MNode& n);  // only the versions of n
  void add_versions(Id id, const MNode* before, const MNode& n);
};

// The model's file bytes [off, off + len) written into `n` (regular file); size grows.
void model_write(MNode& n, uint64_t off, const std::string& data);
void model_truncate(MNode& n, uint64_t size);  // bytes past the new end become zero
// Bytes [off, off + len) of a regular file read as zeroes (within its size).
void model_zero(MNode& n, uint64_t off, uint64_t len);
// The states fallocate(mode, off, len) of `id` passes through (file.cc): it zeroes first
// (punch, zero range), then grows the size a piece at a time, so a crash may find the size
// at any block boundary between the old size and the new.
void model_fallocate(Model& m, Id id, int mode, uint64_t off, uint64_t len);
// "" if `got`, read from offset `off` of `n`, is what the model holds there; else where not.
std::string check_read(const MNode& n, uint64_t off, const std::string& got);

// What a mounted filesystem shows, read through the Filesystem API from the root.
struct ONode {
  uint32_t mode = 0, nlink = 0;
  uint64_t size = 0;
  std::string data, target;
  std::map<std::string, std::string> xattrs;
  std::map<std::string, std::pair<Ino, uint8_t>> entries;  // name -> (inode, DT_*)
};
struct Observed {
  std::map<Ino, ONode> nodes;
};
// Reads the whole tree; "" or what could not be read (or a directory reachable twice, an
// entry whose lookup disagrees with readdir, a ".." naming the wrong parent).
std::string observe(Filesystem& fs, Observed* out);

// Each regular file's contents in `o`, by model id, once `o` matched state `s` (of a model
// rooted at s's node 0).
std::map<Id, std::string> recovered_data(const State& s, const Observed& o);

// "" if `o` is a state the model allows: metadata S_k with k in [m.lo(), hi], data from
// [k, hi] (the oracle above); then *matched = k. Else the violation, naming the path. A model
// that tracks the writeback cache (Model::track_writeback) holds a regular file's size and
// data instead to its Versions: any of them, block by block.
std::string check(const Model& m, size_t hi, const Observed& o, size_t* matched = nullptr);

// For the soak tools (warpfs-crash, warpfs-kill9): an unsigned number in any base strtoull
// reads, the whole of `s`; and a report on one line (line breaks as " | "), at most `max`
// characters (0: all).
bool parse_number(const char* s, uint64_t* out);
std::string one_line(const std::string& s, size_t max);

// Operations of the workload. Ops on an inode name it by Id (it may be unlinked and open).
enum class OpKind : uint8_t {
  kCreate,
  kBurst,  // `len` files with long names in directory `path` (directory leaves fill and split)
  kMkdir,
  kSymlink,
  kWrite,
  kTruncate,
  kChmod,
  kRename,
  kExchange,
  kLink,
  kUnlink,
  kRmdir,
  kSetXattr,
  kRemoveXattr,
  kFsync,
  kFdatasync,
  kSync,
  kOpen,
  kRelease,
  kFallocate,  // flags: the mode (0, KEEP_SIZE, PUNCH_HOLE | KEEP_SIZE, ZERO_RANGE [| KEEP_SIZE])
  kRead,       // reads [off, off + len) and compares with the model (changes nothing)
  kClone,      // copy_file_range of [off, off + len) of `id` to off2 of id2 (may be `id`, the
               // ranges apart): whole blocks shared where the offsets lie alike in a block
  kDedupe,     // dedupe_range of [off, off + len) of `id` and [off2, ...) of id2, equal in the
               // model (changes nothing a read sees); through a mount, skipped (FIDEDUPERANGE
               // does not reach a FUSE daemon)
};
// How a write or a read reaches the file through a mount: pwrite/pread, O_DIRECT
// (block-aligned offsets and lengths only), or a shared mapping (writes only within the
// file's size). The in-process runner reads kDirect with ReadFor::kDirect (around the
// device's cache) and ignores the rest.
enum class Via : uint8_t { kPlain, kDirect, kMmap };
struct Op {
  OpKind kind = OpKind::kSync;
  Id id = 0;                // the inode operated on (write, truncate, chmod, xattr, fsync,
                            // open, release, link's source; clone and dedupe: the source)
  Id id2 = 0;               // clone, dedupe: the destination
  uint64_t off2 = 0;        // clone, dedupe: the destination's offset
  std::string path, path2;  // create/mkdir/symlink/unlink/rmdir: path; burst: the directory;
                            // rename, exchange: path -> path2; link: path2; symlink: path2
                            // is the target
  uint64_t off = 0, len = 0, seed = 0;  // write: pattern(seed, off, len); truncate: size off;
                                        // burst: len files, names from seed; clone, dedupe:
                                        // the source's range
  uint32_t perm = 0;                    // create, mkdir, chmod
  unsigned flags = 0;                   // rename: RENAME_NOREPLACE; fallocate: the mode
  Via via = Via::kPlain;                // write, read
  std::string name, value;              // xattr
  std::string describe() const;
};

// The next operation: valid in the model's current state (every one must succeed on a
// healthy filesystem), chosen from `rng` and the state only.
Op next_op(const Model& m, std::mt19937_64& rng);

// The model side of operations, shared by the in-process runner (run_op) and the syscall
// runner (tools/syscall_ops.h); each adds its states. Called when the operation happened (or
// may have), before anything else changed the model.
// A new file, directory or symlink `name` in `dir`, inode `ino`; "" or a mismatch of the mode
// the filesystem reported.
std::string model_create(Model& m, OpKind kind, Id dir, const std::string& name, Ino ino,
                         uint32_t perm, const std::string& target, uint32_t mode);
void model_rename(Model& m, const Op& op);  // kRename, kExchange
void model_link(Model& m, const Op& op);
void model_unlink(Model& m, const Op& op);  // kUnlink, kRmdir
void model_release(Model& m, Id id);
// A write's bytes, a state per `piece` bytes (pieces end at multiples of `piece` from the
// start of the block the write begins in): how much a crash may find written (the core
// commits 1 MiB pieces so counted; the kernel sends 4 KiB pages).
void model_write_pieces(Model& m, const Op& op, uint64_t piece);
// The same for any bytes: `data` written at `off` of `id`.
void model_bytes_pieces(Model& m, Id id, uint64_t off, const std::string& data, uint64_t piece);
// The bytes [off, off + len) of a regular file as the model holds them, cut at its end (what
// copy_file_range copies: fewer at the source's end).
std::string model_read(const MNode& n, uint64_t off, uint64_t len);
// A kClone's states in the core (share.cc), `data` being the source's bytes it copies: where
// `shares` (the shared_blocks feature, and both offsets alike in a block) the edge before the
// first whole block is written as a write is, then the destination's whole blocks there are
// punched (they may read as zeroes) and the source's mapped (a state per block: the size may
// follow them or not), then the edge after them; else the bytes are written as writes of
// 1 MiB each.
void model_clone(Model& m, const Op& op, const std::string& data, bool shares);
// The image on `dev` (unmounted) gets the shared_blocks feature if it lacks it (both copies
// of the superblock rewritten), as mkfs.warpfs may not set it yet; "" or the failure.
std::string enable_shared_blocks(blockdev::BlockDevice& dev);
// The core's reference counts against the references that the regular files of `o` make
// (Filesystem::inspect): a block mapped by n >= 2 written extents counts n, any other 0, and
// FsStats::shared_blocks counts the former. Only exact when `o` holds every inode that maps a
// block (no open unlinked files). "" or the first mismatch.
std::string check_shared_counts(Filesystem& fs, const Observed& o);
// The attribute and xattr changes: kTruncate, kChmod, kSetXattr, kRemoveXattr.
void model_change(Model& m, const Op& op);
// Splitmix64 (seeds for one purpose each), and a 4 KiB block stamped with an inode and a
// block number: the shared-file check of the stress harnesses (a block of a shared file is
// zero or stamped for itself, never torn, never another file's).
uint64_t mix(uint64_t x);
void stamp_block(uint8_t* b, Ino ino, uint64_t lblk, uint64_t tag);
// `may_hold` (may be null): whether a block of `ino` may hold one stamped for another inode
// (stamp), at the same block number: a clone's destination holds its source's blocks.
using MayHold = std::function<bool(Ino ino, Ino stamp)>;
std::string check_stamped_block(const uint8_t* b, Ino ino, uint64_t lblk,
                                const MayHold& may_hold = nullptr);  // "" or what is wrong
// The invariants of a tree whatever its history: every inode's link count equals its names
// (a directory's: 2 + its subdirectories), and every regular file under directory `stamped`
// (0: none) has a size of whole blocks, each zero or stamped for itself. "" or the first
// violation.
std::string check_invariants(const Observed& o, Ino stamped, const MayHold& may_hold = nullptr);

// Runs `op` on the filesystem (in-process) and on the model. The model changes when the call
// succeeded, or when `cut` (may be null) was cut while it ran: then the operation may or may
// not have happened, and its states become possible. "" or a mismatch of what the operation
// reported; the errno in *rc. Several threads may run operations on one filesystem at once,
// each with its own model (of its own subtree).
std::string run_op(Filesystem& fs, Model& m, const Op& op, const CutDevice* cut, int* rc);

// A formatted, mounted filesystem on its own emulated controller, with a model.
class Session {
 public:
  // `seed` seeds the controller's power-cut draws (EmulatedConfig::seed).
  // `commit_each`: MountOptions::commit_every_transaction on every mount.
  static std::unique_ptr<Session> make(uint64_t seed, uint64_t mib, std::string* error,
                                       bool commit_each = false);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Filesystem& fs() { return *fs_; }
  Model& model() { return model_; }
  CutDevice& device() { return *cut_; }

  // Runs `op` on the filesystem and on the model. "" or the failure: an error returned
  // before the device was cut (ops are valid by construction), or a mismatch of what the
  // operation reported. Once the device is cut, the op's states are kept as possible.
  std::string apply(const Op& op);
  // The power goes out: the device is cut (if it was not already) and the controller loses
  // what its volatile cache held, each unit kept with probability `persist`; the filesystem
  // object is dropped.
  void power_cut(double persist);
  // Powers a new controller up over the media; with `cut_after` > 0 the first mount is
  // itself cut at its cut_after'th mutating call (a crash during recovery) and powered off
  // again (`persist`) before the real recovery. Then: fsck of the crashed image, mount,
  // check against the model (hi = the last state reached), unmount, fsck; on success the
  // model restarts from the matched state, the filesystem mounted again. "" or the failure.
  std::string recover(uint64_t cut_after = 0, double persist = 0);
  // Commits, unmounts, fscks, mounts and checks that nothing changed. "" or the failure.
  std::string clean_cycle();
  std::string log() const { return log_; }
  size_t matched() const { return matched_; }  // the state the last recover() found

 private:
  Session() = default;
  bool power_on(uint64_t seed, std::string* error);
  std::string mount();
  std::string fsck(const char* when);

  std::unique_ptr<test::TestDevices> devices_;  // one namespace, or a RAID set's members
  std::unique_ptr<CutDevice> cut_;
  std::unique_ptr<Filesystem> fs_;
  Model model_;
  uint64_t seed_ = 0, power_ons_ = 0;
  bool commit_each_ = false;
  size_t matched_ = 0;
  std::string log_;
};

// One cut: seeded workload, cut, recovery, checks.
struct CutOptions {
  uint64_t seed = 1;
  int ops = 150;  // at most this many operations; the power goes at one of their device
                  // calls (nine cuts in ten) or after the last
  // Commit at the end of every transaction scope (MountOptions::commit_every_transaction):
  // the cut then finds the states between the scopes of one operation on the device.
  bool commit_each = false;
  bool verbose = false;
};
struct CutReport {
  bool passed = false;
  std::string failure;        // the first violation
  int ops_run = 0;            // operations started before the cut (the cut one included)
  uint64_t cut_call = 0;      // the mutating device call that was cut (0: after the workload)
  uint64_t calls = 0;         // mutating device calls of the workload, the cut one included
  uint64_t flushes = 0;       // of those, flushes
  bool cut_at_flush = false;  // the cut call was a flush chosen as such
  double persist = 0;         // power_cut's probability
  uint64_t recovery_cut = 0;  // > 0: recovery itself was cut at this call
  size_t lo = 0, hi = 0, matched = 0;  // the states allowed and the one found
  int clones = 0, dedupes = 0;         // kClone and kDedupe operations run (after recovery too)
  // Blocks the workload's clones shared and its dedupes made one (FsStats, before the cut).
  uint64_t cloned_blocks = 0, deduped_blocks = 0;
  std::vector<std::string> trace;  // the operations, with their results (verbose)
};
CutReport run_cut(const CutOptions& o);

}  // namespace warpfs::fs::crash
