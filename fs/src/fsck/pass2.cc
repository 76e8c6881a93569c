// Pass 2: directories. Assumes pass 1's model (and pass 1B's: no block has two owners with
// repair). Reads every live directory's blocks (pass2_dir.cc; directories side by side on
// the workers, merged in inode order as passes 1 and 5 merge their groups), then checks every
// entry's target (allocated, sound, of the entry's type) and that each directory has exactly one
// name. Leaves ents_ (each directory's entries, removals marked `drop`) and each
// directory's `namer` for pass 3; reachability is not looked at yet.
#include <algorithm>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

constexpr size_t kMinParallelDirs = 16;

void Checker::pass2() {
  std::vector<size_t> dirs;  // the directories to read, as infos_ indexes
  for (size_t k = 0; k < found_infos_; ++k) {
    const Info& d = infos_[k];
    if (d.state != State::kLive || !is_dir(d)) continue;
    // An orphan directory that the mount had begun to free: it truncates the inode in
    // transactions of its own (the inode stays on the orphan list until the last one), so
    // its mapping may end short of its size. Nothing to read.
    if (!d.on_orphan_list || mapped_end(d) >= d.size / kBlockSize) dirs.push_back(k);
  }
  uint64_t entries = 0;
  // A few directories are read faster than workers are woken.
  const unsigned t = dirs.size() < kMinParallelDirs ? 1 : workers().count();
  const size_t window = t == 1 ? 1 : 64 * size_t{t};  // directories scanned side by side
  for (size_t base = 0; base < dirs.size() && !failed(); base += window) {
    const auto n = static_cast<uint32_t>(std::min(window, dirs.size() - base));
    std::vector<DirFindings> found(n);
    workers().for_each_index(n, [&](uint32_t i) {
      const size_t k = dirs[base + i];
      scan_dir(*io_, L_, infos_[k], ents_[k], &found[i]);
    });
    for (uint32_t i = 0; i < n; ++i) {
      // After a read error the serial scan stops: what the window read past it is dropped.
      if (failed()) ents_[dirs[base + i]].clear();
      if (!failed()) entries += merge_dir(dirs[base + i], found[i]);
    }
  }
  verbose("pass 2: " + num(entries) + " directory entries");
  resolve_entries();
}

// One directory's scan joins the model, as if the calling thread had scanned it.
size_t Checker::merge_dir(size_t k, const DirFindings& f) {
  report_all(f.findings);
  if (!f.error.empty()) fail(f.error);
  const Info& d = infos_[k];
  if (d.on_orphan_list && !ents_[k].empty()) {
    problem("directory " + num(d.ino) + ": on the orphan list, but it has " + num(ents_[k].size()) +
                " entries",
            "they go with it");
  }
  return ents_[k].size();
}

// Checks every entry's target and that each directory has one name; removes what cannot
// stand.
void Checker::resolve_entries() {
  for (size_t k = 0; k < found_infos_; ++k) {
    if (dir_live(infos_[k])) check_targets(infos_[k], ents_[k]);
  }
  one_name_per_directory();
}

void Checker::check_targets(Info& d, std::vector<Ent>& ents) {
  const std::string where = "directory " + num(d.ino);
  for (Ent& e : ents) {
    if (e.drop) continue;
    // Built only for a report: a million entries are checked, few are reported.
    auto entry = [&] { return where + ": entry '" + printable(e.name) + "'"; };
    Info* t = info(e.ino);
    std::string why;
    if (e.ino == 0 || e.ino > L_.inode_count) {
      why = "names inode " + num(e.ino) + ", which does not exist";
    } else if (t == nullptr) {
      why = "names free inode " + num(e.ino);
    } else if (t->state == State::kBad) {
      why = "names inode " + num(e.ino) + ", which is corrupt";
    } else if (e.ino == kRootInode) {
      why = "names the root directory";
    }
    if (!why.empty()) {
      problem(entry() + " " + why, "removed");
      e.drop = true;
      d.rebuild = true;
      continue;
    }
    if (e.type != dtype(t->mode)) {
      problem(entry() + " has type " + num(e.type) + ", but inode " + num(e.ino) + " is " +
                  type_name(t->mode),
              "type set to " + num(dtype(t->mode)));
      e.type = dtype(t->mode);
      d.rebuild = true;
    }
  }
}

// A directory has exactly one name: the one its parent field agrees with, else the first.
void Checker::one_name_per_directory() {
  // (directory index + 1, entry) of each directory's name so far.
  std::vector<std::pair<uint64_t, size_t>> namer_ent(infos_.size(), {0, 0});
  for (size_t k = 0; k < found_infos_; ++k) {
    if (!dir_live(infos_[k])) continue;
    for (size_t i = 0; i < ents_[k].size(); ++i) {
      const Ent& e = ents_[k][i];
      if (e.drop || !is_dir(*info(e.ino))) continue;
      Info& t = *info(e.ino);
      auto& cur = namer_ent[index_of(t)];
      if (cur.first == 0) {
        cur = {k + 1, i};
        continue;
      }
      size_t loser_dir = k, loser_ent = i;
      if (infos_[cur.first - 1].ino != t.parent && infos_[k].ino == t.parent) {
        loser_dir = cur.first - 1;
        loser_ent = cur.second;
        cur = {k + 1, i};
      }
      Ent& l = ents_[loser_dir][loser_ent];
      problem("directory " + num(infos_[loser_dir].ino) + ": entry '" + printable(l.name) +
                  "' is a second name of directory " + num(t.ino),
              "removed");
      l.drop = true;
      infos_[loser_dir].rebuild = true;
    }
  }
  for (size_t ti = 0; ti < namer_ent.size(); ++ti) {
    if (namer_ent[ti].first != 0) infos_[ti].namer = infos_[namer_ent[ti].first - 1].ino;
  }
}

}  // namespace warpfs::fs::fsck_impl
