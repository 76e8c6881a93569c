// Pass 4: link counts, as e2fsck's pass4.c, and the orphan list. The list is read right after
// pass 1 (orphan_list: every inode on it allocated, sound, links 0), and its inodes are freed
// after pass 3 has taken off it those that still have a name (free_orphans), as the next
// mount would. Link counts assume pass 3's final entries, /lost+found's included (in check
// mode, the names it would give: extra_names_).
#include <unordered_set>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

// The orphan list: superblock.orphan_head -> next_orphan -> ... -> 0, every inode on it
// allocated with links 0. A list that breaks off is cut there.
void Checker::orphan_list() {
  uint64_t cur = sb_->orphan_head;
  std::string prev = "the superblock";
  std::unordered_set<uint64_t> seen;
  while (cur != 0) {
    Info* n = info(cur);
    std::string why;
    if (cur > L_.inode_count) {
      why = "names inode " + num(cur) + ", which does not exist";
    } else if (n == nullptr) {
      why = "names free inode " + num(cur);
    } else if (n->state != State::kLive) {
      why = "names inode " + num(cur) + ", which is corrupt";
    } else if (!seen.insert(cur).second) {
      why = "loops back to inode " + num(cur);
    } else if (cur == kRootInode) {
      why = "names the root directory";
    }
    if (!why.empty()) {
      problem("orphan list: " + prev + " " + why, "the list is cut there");
      return;
    }
    if (n->links != 0) {
      problem("orphan list: inode " + num(cur) + " has link count " + num(n->links) +
                  " (0 on the list)",
              "taken off the list");
      n->dirty = true;
    } else {
      n->on_orphan_list = true;
    }
    prev = "inode " + num(cur);
    cur = n->next_orphan;
  }
}

// The orphans: freed as the next mount would (a notice, not a problem).
void Checker::free_orphans() {
  for (Info& x : infos_) {
    if (!x.on_orphan_list || x.state != State::kLive) continue;
    const std::string what = "orphan list: " + iname(x) + " (links 0, " + num(x.size) + " bytes)";
    if (o_.repair) {
      notice(what + ": freed");
      x.state = State::kFreed;
      ++orphans_freed_;
    } else {
      notice(what + " is freed at the next mount");
    }
  }
}

void Checker::pass4() {
  count_names();
  for (Info& n : infos_) {
    if (n.state != State::kLive || n.on_orphan_list) continue;
    if (is_dir(n)) {
      const uint64_t want = 2 + uint64_t{n.subdirs};
      if (n.links != want) {
        problem("directory " + num(n.ino) + ": link count " + num(n.links) + ", but it has " +
                    num(n.subdirs) + (n.subdirs == 1 ? " subdirectory" : " subdirectories") +
                    " (expected " + num(want) + ")",
                "set to " + num(want));
        n.links = static_cast<uint32_t>(want);
        n.dirty = true;
      }
    } else if (n.links != n.names) {
      problem("inode " + num(n.ino) + ": link count " + num(n.links) + ", but " + num(n.names) +
                  (n.names == 1 ? " directory entry names it" : " directory entries name it"),
              "set to " + num(n.names));
      n.links = n.names;
      n.dirty = true;
    }
  }
}

// Each inode's names and each directory's subdirectories, from the live directories' entries.
void Checker::count_names() {
  for (Info& n : infos_) n.names = n.subdirs = 0;
  for (size_t k = 0; k < infos_.size(); ++k) {
    Info& d = infos_[k];
    if (!dir_live(d)) continue;
    for (const Ent& e : ents_[k]) {
      Info* t = e.drop ? nullptr : info(e.ino);
      if (t == nullptr || t->state != State::kLive) continue;
      t->names += 1;
      if (is_dir(*t)) d.subdirs += 1;
    }
  }
  for (size_t k = 0; k < extra_names_.size(); ++k) infos_[k].names += extra_names_[k];
}

}  // namespace warpfs::fs::fsck_impl
