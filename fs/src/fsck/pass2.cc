// Pass 2: directories. Assumes pass 1's model (and pass 1B's: no block has two owners with
// repair). Reads every live directory's blocks (pass2_dir.cc), then checks every entry's
// target (allocated, sound, of the entry's type) and that each directory has exactly one
// name. Leaves ents_ (each directory's entries, removals marked `drop`) and each
// directory's `namer` for pass 3; reachability is not looked at yet.
#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

void Checker::pass2() {
  uint64_t entries = 0;
  for (size_t k = 0; k < found_infos_ && !failed(); ++k) {
    Info& d = infos_[k];
    if (d.state != State::kLive || !is_dir(d)) continue;
    // An orphan directory that the mount had begun to free: it truncates the inode in
    // transactions of its own (the inode stays on the orphan list until the last one), so
    // its mapping may end short of its size. Nothing to read.
    if (d.on_orphan_list && mapped_end(d) < d.size / kBlockSize) continue;
    scan_dir(d, ents_[k]);
    entries += ents_[k].size();
    if (d.on_orphan_list && !ents_[k].empty()) {
      problem("directory " + num(d.ino) + ": on the orphan list, but it has " +
                  num(ents_[k].size()) + " entries",
              "they go with it");
    }
  }
  verbose("pass 2: " + num(entries) + " directory entries");
  resolve_entries();
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
