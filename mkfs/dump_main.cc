// dump.warpfs: what a warpfs holds, as dumpe2fs and debugfs show ext4: the superblock, the
// journal's state, the block groups, and an inode (by number or path) with its extents and,
// for a directory, its entries. Read-only: the image is opened for reading under the read
// lock that fsck.warpfs -n takes. Text for people, --json (one object) for scripts.
//
// Exit codes: 0 shown, 1 cannot be shown (no device, not a warpfs, no such inode), 2 usage.
#include <getopt.h>
#include <sys/stat.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "args.h"
#include "warpfs/blockdev/stack.h"
#include "warpfs/fs/filesystem.h"
#include "warpfs/fs/format.h"
#include "warpfs/fs/layout.h"
#include "warpfs/fs/replay.h"
#include "warpfs/fs/tune.h"

using namespace warpfs;
using json = nlohmann::ordered_json;

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: dump.warpfs [--json] [--inode N | --path PATH] DEVICE\n"
               "  DEVICE          emu:PATH or PATH (an image file), or vfio:DDDD:BB:DD.F\n"
               "  (nothing)       the superblock, the journal and the block groups\n"
               "  -i, --inode N   inode N: its fields, extents and extent-tree blocks; a\n"
               "                  directory's entries too\n"
               "  -p, --path PATH the same for the inode at PATH (from the root: /a/b)\n"
               "  -j, --json      one JSON object instead of text\n"
               "  -V, --version   print the version\n");
}

json superblock_json(const fs::Superblock& sb) {
  return {{"magic_ok", sb.magic == fs::kMagic},
          {"version", sb.version},
          {"label", tools::label_string(sb)},
          {"uuid", tools::uuid_string(sb)},
          {"state", sb.state == fs::kStateClean   ? "clean"
                    : sb.state == fs::kStateDirty ? "dirty"
                                                  : "unknown"},
          {"block_size", sb.block_size},
          {"block_count", sb.block_count},
          {"data_blocks", fs::data_blocks(sb)},
          {"free_blocks", sb.free_blocks},
          {"reserved_blocks", sb.reserved_blocks},
          {"reserved_uid", sb.reserved_uid},
          {"reserved_gid", sb.reserved_gid},
          {"inode_count", sb.inode_count},
          {"free_inodes", sb.free_inodes},
          {"group_count", sb.group_count},
          {"blocks_per_group", sb.blocks_per_group},
          {"inodes_per_group", sb.inodes_per_group},
          {"journal_blocks", sb.journal_blocks},
          {"gdt_start", sb.gdt_start},
          {"gdt_blocks", fs::gdt_blocks_of(sb)},
          {"root_inode", sb.root_inode},
          {"orphan_head", sb.orphan_head},
          {"features", sb.features},
          {"commit_interval_s", sb.commit_interval_s},
          {"mount_opts", fs::default_mount_options(sb)},
          {"mkfs_time_ns", sb.mkfs_time},
          {"mount_time_ns", sb.mount_time},
          {"write_time_ns", sb.write_time},
          {"mount_count", sb.mount_count},
          {"journal_seq", sb.journal_seq},
          {"checksum_ok", sb.checksum == fs::superblock_checksum(sb)}};
}

// The journal: its header, and what a replay would write home (a dry run).
json journal_json(blockdev::BlockDevice& dev, const fs::Superblock& sb) {
  fs::JournalHeader h{};
  json j;
  if (!dev.read(1, 1, &h).is_ok()) return {{"error", "cannot read the journal header"}};
  j["header_ok"] =
      h.magic == fs::kJournalHeaderMagic &&
      h.checksum == fs::block_checksum(&h, offsetof(fs::JournalHeader, checksum), sb.checksum_seed);
  j["tail_position"] = h.tail_block;
  j["tail_seq"] = h.tail_seq;
  fs::ReplayResult rr;
  const blockdev::Status st = fs::replay_journal(dev, sb, /*dry_run=*/true, &rr);
  j["pending_transactions"] = rr.transactions;
  j["pending_blocks"] = rr.blocks;
  j["next_seq"] = rr.next_seq;
  j["scan_stopped"] = st.is_ok() ? rr.stopped : st.to_string();
  return j;
}

json groups_json(blockdev::BlockDevice& dev, const fs::Superblock& sb) {
  json out = json::array();
  const uint32_t gdt_blocks =
      (sb.group_count + fs::kGroupDescsPerBlock - 1) / fs::kGroupDescsPerBlock;
  std::vector<fs::GroupDesc> d(size_t{gdt_blocks} * fs::kGroupDescsPerBlock);
  if (!dev.read(sb.gdt_start, gdt_blocks, d.data()).is_ok())
    return {{{"error", "cannot read the group descriptors"}}};
  for (uint32_t g = 0; g < sb.group_count; ++g) {
    const fs::GroupDesc& gd = d[g];
    out.push_back({{"group", g},
                   {"block_bitmap", gd.block_bitmap},
                   {"inode_bitmap", gd.inode_bitmap},
                   {"inode_table", gd.inode_table},
                   {"free_blocks", gd.free_blocks},
                   {"free_inodes", gd.free_inodes},
                   {"used_dirs", gd.used_dirs},
                   {"refcount_table", gd.refcount_table},
                   {"checksum_ok", gd.checksum == fs::group_checksum(gd, sb.checksum_seed)}});
  }
  return out;
}

const char* type_of(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "file";
    case S_IFDIR:
      return "directory";
    case S_IFLNK:
      return "symlink";
    case S_IFCHR:
      return "character device";
    case S_IFBLK:
      return "block device";
    case S_IFIFO:
      return "fifo";
    case S_IFSOCK:
      return "socket";
    default:
      return "unknown";
  }
}

json inode_json(fs::Filesystem& f, fs::Ino ino, int* rc) {
  fs::InodeReport r;
  if ((*rc = f.inspect(ino, &r)) != 0) return {};
  const fs::Inode& d = r.disk;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", d.mode & 07777);
  json j = {{"inode", ino},
            {"type", type_of(d.mode)},
            {"mode", mode},
            {"uid", d.uid},
            {"gid", d.gid},
            {"links", d.links},
            {"size", d.size},
            {"blocks", d.blocks},
            {"atime_ns", static_cast<int64_t>(d.atime_ns)},
            {"mtime_ns", static_cast<int64_t>(d.mtime_ns)},
            {"ctime_ns", static_cast<int64_t>(d.ctime_ns)},
            {"crtime_ns", static_cast<int64_t>(d.crtime_ns)},
            {"generation", d.generation},
            {"flags", d.flags},
            {"xattr_block", d.xattr_block},
            {"tree_depth", d.tree_depth}};
  if (S_ISDIR(d.mode)) j["parent"] = d.parent;
  if (S_ISCHR(d.mode) || S_ISBLK(d.mode)) j["rdev"] = d.rdev;
  if (S_ISLNK(d.mode)) {
    std::string target;
    if (f.readlink(ino, &target) == 0) j["target"] = target;
  }
  json ext = json::array();
  for (const fs::Extent& e : r.extents) {
    ext.push_back({{"logical", e.logical},
                   {"physical", e.physical},
                   {"blocks", e.blocks()},
                   {"unwritten", e.unwritten()}});
  }
  j["extents"] = std::move(ext);
  j["tree_blocks"] = r.tree_blocks;
  if (S_ISDIR(d.mode)) {
    json entries = json::array();
    const int drc = f.readdir(ino, 0, [&](const fs::DirEntry& e) {
      entries.push_back({{"name", e.name}, {"inode", e.ino}, {"type", e.type}});
      return true;
    });
    if (drc == 0) j["entries"] = std::move(entries);
  }
  return j;
}

// Text: one "key: value" line per scalar, nested objects indented, arrays one line per item.
void print_text(const json& j, int indent) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (auto it = j.begin(); it != j.end(); ++it) {
    const json& v = it.value();
    if (v.is_object()) {
      std::printf("%s%s:\n", pad.c_str(), it.key().c_str());
      print_text(v, indent + 2);
    } else if (v.is_array() && !v.empty() && v.front().is_object()) {
      std::printf("%s%s:\n", pad.c_str(), it.key().c_str());
      for (const json& item : v) {
        std::string line;
        for (auto f = item.begin(); f != item.end(); ++f) {
          line += (line.empty() ? "" : " ") + f.key() + "=" +
                  (f.value().is_string() ? f.value().get<std::string>() : f.value().dump());
        }
        std::printf("%s  %s\n", pad.c_str(), line.c_str());
      }
    } else {
      std::printf("%s%s: %s\n", pad.c_str(), it.key().c_str(),
                  v.is_string() ? v.get<std::string>().c_str()
                                : v.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  static const option longs[] = {
      {"inode", required_argument, nullptr, 'i'}, {"path", required_argument, nullptr, 'p'},
      {"json", no_argument, nullptr, 'j'},        {"help", no_argument, nullptr, 'h'},
      {"version", no_argument, nullptr, 'V'},     {nullptr, 0, nullptr, 0}};
  bool as_json = false;
  uint64_t want_ino = 0;
  std::string want_path;
  int c;
  while ((c = getopt_long(argc, argv, "i:p:jhV", longs, nullptr)) != -1) {
    switch (c) {
      case 'i': {
        if (!tools::parse_u64(optarg, UINT64_MAX, &want_ino) || want_ino == 0) {
          std::fprintf(stderr, "dump.warpfs: bad inode number '%s'\n", optarg);
          return 2;
        }
        break;
      }
      case 'p':
        want_path = optarg;
        if (want_path.empty() || want_path[0] != '/') {
          std::fprintf(stderr, "dump.warpfs: a path starts at the root: /%s\n", optarg);
          return 2;
        }
        break;
      case 'j':
        as_json = true;
        break;
      default:  // -h, -V, or not an option
        return tools::help_version_or_usage(c, "dump.warpfs", usage, 0, 2);
    }
  }
  if (optind + 1 != argc || (want_ino != 0 && !want_path.empty())) {
    usage(stderr);
    return 2;
  }
  const std::string device = argv[optind];
  blockdev::StackOptions so;
  so.emulated.read_only = true;  // opened for reading, under a read lock
  so.log = [](const std::string& s) { std::fprintf(stderr, "dump.warpfs: %s\n", s.c_str()); };
  so.block_bytes = fs::kBlockSize;
  std::string err;
  auto stack = blockdev::DeviceStack::open(device, so, &err);
  if (!stack) {
    std::fprintf(stderr, "dump.warpfs: %s\n", err.c_str());
    return 1;
  }
  blockdev::BlockDevice& dev = stack->device();
  fs::Superblock sb;
  if (dev.block_bytes() != fs::kBlockSize || !dev.read(0, 1, &sb).is_ok()) {
    std::fprintf(stderr, "dump.warpfs: %s: cannot read the superblock\n", device.c_str());
    return 1;
  }
  if (std::string why = fs::validate_superblock(sb, dev.block_count()); !why.empty()) {
    std::fprintf(stderr, "dump.warpfs: %s: %s\n", device.c_str(),
                 why == "no warpfs magic" ? "not a warpfs filesystem"
                                          : ("the superblock is damaged (" + why +
                                             "): fsck.warpfs restores it from its backup")
                                                .c_str());
    return 1;
  }
  json out;
  if (want_ino == 0 && want_path.empty()) {
    if (blockdev::RaidBlockDevice* r = stack->raid()) {  // a set: its state first
      const blockdev::RaidBlockDevice::Stats rs = r->stats();
      json failed = json::array();
      for (uint32_t k = 0; k < rs.members; ++k)
        if ((rs.failed >> k) & 1) failed.push_back(stack->members()[k]->name());
      out["raid"] = {{"level", rs.level},
                     {"members", rs.members},
                     {"stripe_blocks", rs.stripe_blocks},
                     {"degraded", rs.failed != 0},
                     {"failed", failed},
                     {"label_generation", rs.generation}};
    }
    out["superblock"] = superblock_json(sb);
    out["journal"] = journal_json(dev, sb);
    out["groups"] = groups_json(dev, sb);
  } else {
    // Inodes are read through a read-only mount of the filesystem core, which needs nothing
    // left in the journal: a replay would have to write.
    fs::ReplayResult rr;
    if (!fs::replay_journal(dev, sb, /*dry_run=*/true, &rr).is_ok() || rr.transactions > 0) {
      std::fprintf(
          stderr,
          "dump.warpfs: %s: the journal holds transactions not yet written home: mount the "
          "filesystem once or run fsck.warpfs -y, then look at its inodes\n",
          device.c_str());
      return 1;
    }
    fs::MountOptions mo;
    mo.read_only = true;
    mo.log = [](const std::string& s) { std::fprintf(stderr, "dump.warpfs: %s\n", s.c_str()); };
    auto f = fs::Filesystem::mount(dev, mo, &err);
    if (!f) {
      std::fprintf(stderr, "dump.warpfs: %s: %s\n", device.c_str(), err.c_str());
      return 1;
    }
    fs::Ino ino = want_ino;
    if (!want_path.empty()) {
      ino = fs::kRootInode;
      size_t pos = 1;
      while (pos < want_path.size()) {
        size_t end = want_path.find('/', pos);
        if (end == std::string::npos) end = want_path.size();
        if (end > pos) {
          fs::Attr a;
          const std::string name = want_path.substr(pos, end - pos);
          if (int rc = f->lookup(ino, name, &a); rc) {
            std::fprintf(stderr, "dump.warpfs: %s: %s\n", want_path.c_str(), std::strerror(rc));
            return 1;
          }
          f->forget(a.ino, 1);
          ino = a.ino;
        }
        pos = end + 1;
      }
    }
    if (ino > sb.inode_count) {
      std::fprintf(stderr,
                   "dump.warpfs: inode %" PRIu64 ": the filesystem has %" PRIu64 " inodes\n", ino,
                   sb.inode_count);
      return 1;
    }
    int rc = 0;
    out = inode_json(*f, ino, &rc);
    if (rc) {
      std::fprintf(stderr, "dump.warpfs: inode %" PRIu64 ": %s\n", ino,
                   rc == ENOENT || rc == ESTALE ? "not in use" : std::strerror(rc));
      return 1;
    }
  }
  if (as_json) {
    std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    print_text(out, 0);
  }
  return 0;
}
