// Pass 3: connectivity, as e2fsck's pass3.c. Assumes pass 2's entries and namers. Makes sure
// there is a live root directory, takes inodes that still have a name off the orphan list,
// marks what the root reaches, frees allocated inodes that nothing names and nothing holds
// (links 0), connects the rest to /lost+found (created if missing), and makes directories'
// parent fields agree with their names. Leaves link counts to pass 4.
#include <algorithm>
#include <chrono>
#include <random>

#include "fsck/checker.h"

namespace warpfs::fs::fsck_impl {

void Checker::pass3() {
  Info* root = check_root();
  unorphan_named();
  reach(*root);
  free_unlinked();
  connect_unreachable();
  for (size_t k = 0; k < infos_.size(); ++k) {
    Info& x = infos_[k];
    if (x.state == State::kLive && !x.reached && !x.on_orphan_list && !is_dir(x)) connect(x, false);
  }
  uint64_t lost = 0;
  if (lost_found_ != 0) lost = ents_[index_of(*info(lost_found_))].size();
  verbose("pass 3: " +
          num(static_cast<uint64_t>(std::count_if(infos_.begin(), infos_.end(),
                                                  [](const Info& n) { return n.reached; }))) +
          " inodes reachable from the root" +
          (lost ? ", " + num(lost) + " names in /lost+found" : ""));
  check_parents();
  free_orphans();
}

// A live root directory whose parent is itself; recreated empty if it is not there.
Info* Checker::check_root() {
  Info* root = info(kRootInode);
  if (root == nullptr || root->state != State::kLive || !is_dir(*root) || root->on_orphan_list) {
    const std::string why = root == nullptr               ? "free"
                            : root->state != State::kLive ? "corrupt"
                            : !is_dir(*root)              ? "not a directory"
                                                          : "on the orphan list";
    // Check mode models the new root too, so that both modes report the same problems.
    problem("root directory (inode 1): " + why,
            "recreated empty (what it held goes to /lost+found)");
    root = make_directory(kRootInode, kRootInode);
  }
  if (root->parent != kRootInode) {
    problem("directory 1 (the root): parent field " + num(root->parent) + ", not 1", "set to 1");
    root->parent = kRootInode;
    root->dirty = true;
  }
  return root;
}

// Inodes on the orphan list that still have a name come off the list.
void Checker::unorphan_named() {
  for (size_t k = 0; k < infos_.size(); ++k) {
    if (!dir_live(infos_[k])) continue;
    for (const Ent& e : ents_[k]) {
      Info* t = e.drop ? nullptr : info(e.ino);
      if (t == nullptr || !t->on_orphan_list) continue;
      problem("inode " + num(t->ino) + ": on the orphan list, but directory " + num(infos_[k].ino) +
                  " names it ('" + printable(e.name) + "')",
              "taken off the orphan list");
      t->on_orphan_list = false;
      t->next_orphan = 0;
      t->dirty = true;
    }
  }
}

// Inodes with links 0 that nothing names and that are not orphans: freed. A directory freed
// so frees what only it named, when that has links 0 too.
void Checker::free_unlinked() {
  std::vector<uint32_t> named(infos_.size(), 0);
  for (size_t k = 0; k < infos_.size(); ++k) {
    if (!dir_live(infos_[k])) continue;
    for (const Ent& e : ents_[k]) {
      if (Info* t = e.drop ? nullptr : info(e.ino)) ++named[index_of(*t)];
    }
  }
  auto doomed = [&](const Info& n) {
    return n.state == State::kLive && !n.reached && !n.on_orphan_list && n.links == 0 &&
           named[index_of(n)] == 0;
  };
  std::vector<size_t> work;
  for (size_t k = 0; k < infos_.size(); ++k) {
    if (doomed(infos_[k])) work.push_back(k);
  }
  while (!work.empty()) {
    Info& n = infos_[work.back()];
    work.pop_back();
    if (!doomed(n)) continue;
    problem(iname(n) + ": link count 0, but it is neither reachable nor on the orphan list",
            "freed");
    const bool was_dir = dir_live(n);
    n.state = State::kFreed;
    if (!was_dir) continue;
    for (const Ent& e : ents_[index_of(n)]) {
      Info* t = e.drop ? nullptr : info(e.ino);
      if (t == nullptr) continue;
      --named[index_of(*t)];
      if (doomed(*t)) work.push_back(index_of(*t));
    }
  }
}

// Unreachable directories: connect the top of each unreachable tree (or one member of a
// loop), which reaches the rest.
void Checker::connect_unreachable() {
  for (size_t k = 0; k < infos_.size(); ++k) {
    Info& x = infos_[k];
    if (!dir_live(x) || x.reached) continue;
    std::vector<uint64_t> path;
    Info* top = &x;
    bool loop = false;
    for (;;) {
      path.push_back(top->ino);
      Info* p = top->namer ? info(top->namer) : nullptr;
      if (p == nullptr || !dir_live(*p) || p->reached) break;
      if (std::find(path.begin(), path.end(), p->ino) != path.end()) {
        loop = true;
        break;
      }
      top = p;
    }
    if (loop && o_.repair) open_loop(*top);
    connect(*top, loop);
  }
}

// `top`'s old name, inside a directory loop, goes: /lost+found gives it a new one.
void Checker::open_loop(Info& top) {
  Info& p = *info(top.namer);
  for (Ent& e : ents_[index_of(p)]) {
    if (!e.drop && e.ino == top.ino) e.drop = true;
  }
  p.rebuild = true;
  if (p.links > 2) p.links -= 1;
  p.dirty = true;
}

// Parent fields agree with the names.
void Checker::check_parents() {
  for (Info& x : infos_) {
    if (!dir_live(x) || x.ino == kRootInode || x.namer == 0 || x.parent == x.namer) continue;
    problem("directory " + num(x.ino) + ": parent field " + num(x.parent) + ", but directory " +
                num(x.namer) + " names it",
            "set to " + num(x.namer));
    x.parent = x.namer;
    x.dirty = true;
  }
}

// Marks everything reachable from `start` through live directories.
void Checker::reach(Info& start) {
  std::vector<size_t> queue{index_of(start)};
  start.reached = true;
  while (!queue.empty()) {
    const size_t k = queue.back();
    queue.pop_back();
    if (!dir_live(infos_[k])) continue;
    for (const Ent& e : ents_[k]) {
      if (e.drop) continue;
      Info* t = info(e.ino);
      if (t == nullptr || t->reached || t->state != State::kLive) continue;
      t->reached = true;
      if (is_dir(*t)) queue.push_back(index_of(*t));
    }
  }
}

// A new, empty directory `ino` (fsck's root or lost+found), its blocks written later.
Info* Checker::make_directory(uint64_t ino, uint64_t parent) {
  Info* n = info(ino);
  if (n == nullptr) {
    infos_.emplace_back();
    ents_.emplace_back();
    slot_[ino] = static_cast<uint32_t>(infos_.size());
    n = &infos_.back();
  } else {
    ents_[index_of(*n)].clear();
    *n = Info{};
  }
  std::random_device rd;
  n->ino = ino;
  n->mode = S_IFDIR | 0700;
  n->links = 2;
  n->parent = n->namer = parent;
  n->dir_seed = (uint64_t{rd()} << 32) ^ rd() ^
                static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  n->fresh = n->dirty = n->rebuild = n->reached = true;
  return n;
}

// /lost+found: the root's live directory of that name, else a new one.
Info* Checker::lost_found() {
  if (lost_found_ != 0) return info(lost_found_);
  std::string name = "lost+found";
  if (Info* t = find_lost_found(&name)) return t;
  const uint64_t ino = alloc_inode();
  if (ino == 0) {
    unfixable("/lost+found: no free inode to create it with");
    return nullptr;
  }
  Info* lf = make_directory(ino, kRootInode);
  Info& r = *info(kRootInode);
  ents_[index_of(r)].push_back(
      Ent{name_hash(name.data(), name.size(), r.dir_seed), ino, dtype(lf->mode), false, name});
  r.rebuild = true;
  r.links += 1;
  r.dirty = true;
  notice("created /" + name + " (inode " + num(ino) + ")");
  lost_found_ = ino;
  return lf;
}

// The root's live directory named *name; when the name is taken by something else, *name
// becomes the one to create instead.
Info* Checker::find_lost_found(std::string* name) {
  for (const Ent& e : ents_[index_of(*info(kRootInode))]) {
    if (e.drop || e.name != *name) continue;
    Info* t = info(e.ino);
    if (t != nullptr && dir_live(*t)) {
      lost_found_ = t->ino;
      return t;
    }
    *name = "lost+found.fsck";
  }
  return nullptr;
}

// Gives an unreachable inode a name in /lost+found (check mode: says it would).
void Checker::connect(Info& n, bool loop) {
  const std::string what =
      iname(n) + ": unreachable" +
      (is_dir(n) ? (loop ? " (in a directory loop)" : " (no reachable directory names it)")
                 : " (links " + num(n.links) + ", no directory entry names it)");
  if (!o_.repair) {
    problem(what);
    extra_names_.resize(infos_.size());
    extra_names_[index_of(n)] += 1;
    n.namer = 0;
    reach(n);
    return;
  }
  Info* lf = lost_found();
  if (lf == nullptr) {
    unfixable(what);
    reach(n);
    return;
  }
  std::string name = "#" + num(n.ino);
  auto& le = ents_[index_of(*lf)];
  while (std::any_of(le.begin(), le.end(), [&](const Ent& e) { return !e.drop && e.name == name; }))
    name += "+";
  le.push_back(
      Ent{name_hash(name.data(), name.size(), lf->dir_seed), n.ino, dtype(n.mode), false, name});
  lf->rebuild = true;
  if (is_dir(n)) {
    n.parent = n.namer = lf->ino;
    n.dirty = true;
    lf->links += 1;
    lf->dirty = true;
  }
  problem(what, "connected to /lost+found as '" + name + "'");
  reach(n);
}

}  // namespace warpfs::fs::fsck_impl
