// Extended attributes beyond one block (fs/FORMAT.md "Extended attributes"): chains of xattr
// blocks, values in value blocks, the one-block limit of images without the feature, ENOSPC
// that loses nothing, and several threads at once against a model.
#include <sys/xattr.h>

#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fs/core_rig.h"
#include "warpfs/fs/tune.h"

namespace warpfs::fs::test {
namespace {

std::string name_of(int i) {
  return "user.attr" + std::to_string(i);
}
std::string value_of(int i, size_t len = 0) {
  std::string v = "v" + std::to_string(i * 7919);
  if (len) {
    v.resize(len);
    for (size_t k = 0; k < len; ++k) v[k] = static_cast<char>('a' + (i + k * 31) % 26);
  }
  return v;
}

std::multiset<std::string> listed(Filesystem& fs, Ino ino) {
  std::string names;
  EXPECT_EQ(fs.listxattr(ino, &names), 0);
  std::multiset<std::string> out;
  for (size_t at = 0; at < names.size();) {
    const size_t end = names.find('\0', at);
    out.insert(names.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// 4 KiB blocks (Attr::blocks counts 512-byte units).
uint64_t blocks_of(Filesystem& fs, Ino ino) {
  Attr a;
  EXPECT_EQ(fs.getattr(ino, &a), 0);
  return a.blocks / 8;
}

TEST(Xattr, ThousandsOfSmallAttributes) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "many");
  constexpr int kN = 5000;
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(r->fs->setxattr(f, name_of(i), value_of(i).data(), value_of(i).size(), 0), 0) << i;
  }
  std::string v;
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ(r->fs->getxattr(f, name_of(i), &v), 0) << i;
    ASSERT_EQ(v, value_of(i)) << i;
  }
  std::multiset<std::string> want;
  for (int i = 0; i < kN; ++i) want.insert(name_of(i));
  EXPECT_EQ(listed(*r->fs, f), want);
  EXPECT_GT(blocks_of(*r->fs, f), 10u);
  for (int i = 0; i < kN; i += 2) {
    ASSERT_EQ(r->fs->removexattr(f, name_of(i)), 0) << i;
    want.erase(name_of(i));
  }
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(listed(*r->fs, f), want);
  for (int i = 0; i < kN; ++i) {
    const int rc = r->fs->getxattr(f, name_of(i), &v);
    if (i % 2 == 0) {
      ASSERT_EQ(rc, ENODATA) << i;
    } else {
      ASSERT_EQ(rc, 0) << i;
      ASSERT_EQ(v, value_of(i)) << i;
    }
  }
  // Replacing with a longer value moves entries between blocks; every name stays once.
  for (int i = 1; i < kN; i += 2) {
    ASSERT_EQ(r->fs->setxattr(f, name_of(i), value_of(i, 60).data(), 60, XATTR_REPLACE), 0) << i;
  }
  EXPECT_EQ(listed(*r->fs, f), want);
  for (int i = 1; i < kN; i += 2) {
    ASSERT_EQ(r->fs->getxattr(f, name_of(i), &v), 0) << i;
    ASSERT_EQ(v, value_of(i, 60)) << i;
  }
  EXPECT_EQ(r->check_and_remount(), "");
  for (int i = 1; i < kN; i += 2) ASSERT_EQ(r->fs->removexattr(f, name_of(i)), 0) << i;
  EXPECT_EQ(blocks_of(*r->fs, f), 0u) << "every emptied block left the chain";
  EXPECT_TRUE(listed(*r->fs, f).empty());
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Xattr, LargeValuesAroundEveryThreshold) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "big");
  const std::vector<size_t> sizes = {0,    1,    2047, 2048, 2049,  4060,  4063, 4064,
                                     4065, 4096, 8128, 8129, 12192, 65535, 65536};
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string v = value_of(static_cast<int>(i), sizes[i]);
    ASSERT_EQ(r->fs->setxattr(f, name_of(static_cast<int>(i)), v.data(), v.size(), 0), 0)
        << sizes[i];
  }
  EXPECT_EQ(r->fs->setxattr(f, "user.toolong", std::string(65537, 'x').data(), 65537, 0), E2BIG);
  auto check = [&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::string v;
      ASSERT_EQ(r->fs->getxattr(f, name_of(static_cast<int>(i)), &v), 0) << sizes[i];
      ASSERT_EQ(v, value_of(static_cast<int>(i), sizes[i])) << sizes[i];
    }
  };
  check();
  EXPECT_EQ(r->check_and_remount(), "");
  check();
  // Large replaced by small and small by large, in both directions across the threshold.
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t other = sizes[sizes.size() - 1 - i];
    const std::string v = value_of(static_cast<int>(i) + 100, other);
    ASSERT_EQ(r->fs->setxattr(f, name_of(static_cast<int>(i)), v.data(), v.size(), 0), 0);
    std::string got;
    ASSERT_EQ(r->fs->getxattr(f, name_of(static_cast<int>(i)), &got), 0);
    ASSERT_EQ(got, v) << sizes[i] << " -> " << other;
  }
  EXPECT_EQ(r->check_and_remount(), "");
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(r->fs->removexattr(f, name_of(static_cast<int>(i))), 0);
  }
  EXPECT_EQ(blocks_of(*r->fs, f), 0u) << "value blocks freed with their entries";
  // Unlinking a file with value blocks frees them all (fsck finds no leaked block).
  const Ino g = r->create(kRootInode, "gone");
  for (int i = 0; i < 20; ++i) {
    const std::string v = value_of(i, 65536);
    ASSERT_EQ(r->fs->setxattr(g, name_of(i), v.data(), v.size(), 0), 0);
  }
  EXPECT_EQ(blocks_of(*r->fs, g), 20u * 17 + 1);
  ASSERT_EQ(r->fs->unlink(kRootInode, "gone"), 0);
  r->fs->forget(g, 1);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Xattr, EnospcLosesNothing) {
  auto r = Rig::make(16);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  const std::string big = value_of(1, 65536);
  ASSERT_EQ(r->fs->setxattr(f, "user.keep", big.data(), big.size(), 0), 0);
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(r->fs->setxattr(f, name_of(i), value_of(i).data(), value_of(i).size(), 0), 0);
  }
  // Fill the disk with a file's data.
  const Ino fill = r->create(kRootInode, "fill");
  std::string chunk(1 << 20, 'z');
  for (uint64_t off = 0;; off += chunk.size()) {
    size_t wrote = 0;
    if (r->fs->write(fill, off, chunk.size(), chunk.data(), &wrote) != 0 || wrote == 0) break;
  }
  // Large values until ENOSPC; then the disk is full for them.
  int placed = 0;
  int rc = 0;
  for (; placed < 1000; ++placed) {
    const std::string v = value_of(placed, 40000);
    rc = r->fs->setxattr(f, "user.more" + std::to_string(placed), v.data(), v.size(), 0);
    if (rc) break;
  }
  EXPECT_EQ(rc, ENOSPC);
  const std::string other = value_of(9, 65536);
  EXPECT_EQ(r->fs->setxattr(f, "user.keep", other.data(), other.size(), 0), ENOSPC)
      << "a replacement needs its new blocks first";
  std::string v;
  ASSERT_EQ(r->fs->getxattr(f, "user.keep", &v), 0);
  EXPECT_EQ(v, big) << "the old value is intact";
  EXPECT_EQ(r->fs->getxattr(f, "user.more" + std::to_string(placed), &v), ENODATA);
  for (int i = 0; i < placed; ++i) {
    ASSERT_EQ(r->fs->getxattr(f, "user.more" + std::to_string(i), &v), 0);
    ASSERT_EQ(v, value_of(i, 40000));
  }
  for (int i = 0; i < 300; ++i) {
    ASSERT_EQ(r->fs->getxattr(f, name_of(i), &v), 0);
    ASSERT_EQ(v, value_of(i));
  }
  EXPECT_EQ(listed(*r->fs, f).size(), 301u + placed);
  EXPECT_EQ(r->check_and_remount(), "");
  ASSERT_EQ(r->fs->getxattr(f, "user.keep", &v), 0);
  EXPECT_EQ(v, big);
}

TEST(Xattr, ImageWithoutTheFeatureKeepsOneBlockUntilTuned) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "old");
  ASSERT_TRUE(r->set_features(r->superblock_at(0).features & ~uint32_t{kFeatureXattrChain}));
  int i = 0;
  for (; i < 1000; ++i) {
    if (r->fs->setxattr(f, name_of(i), value_of(i).data(), value_of(i).size(), 0) != 0) break;
  }
  EXPECT_LT(i, 300) << "one block";
  EXPECT_EQ(r->fs->setxattr(f, name_of(i), value_of(i).data(), value_of(i).size(), 0), ENOSPC);
  EXPECT_EQ(r->fs->setxattr(f, "user.big", std::string(5000, 'b').data(), 5000, 0), ENOSPC);
  EXPECT_EQ(blocks_of(*r->fs, f), 1u);
  EXPECT_EQ(r->check_and_remount(), "");
  // tune.warpfs -O xattr_chain: the one block becomes the first of a chain.
  ASSERT_EQ(r->fs->unmount(), 0);
  r->fs.reset();
  TuneRequest t;
  t.enable_xattr_chain = true;
  ASSERT_EQ(tune(*r->dev, t), "");
  ASSERT_TRUE(r->mount());
  for (int k = i; k < i + 1000; ++k) {
    ASSERT_EQ(r->fs->setxattr(f, name_of(k), value_of(k).data(), value_of(k).size(), 0), 0) << k;
  }
  EXPECT_EQ(listed(*r->fs, f).size(), static_cast<size_t>(i + 1000));
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Xattr, WriteDropsTheCapabilityAmongThousands) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "cap");
  for (int i = 0; i < 2000; ++i) {
    ASSERT_EQ(r->fs->setxattr(f, name_of(i), value_of(i).data(), value_of(i).size(), 0), 0);
  }
  ASSERT_EQ(r->fs->setxattr(f, "security.capability", "capdata!", 8, 0), 0);
  for (int round = 0; round < 2; ++round) {
    size_t wrote = 0;
    ASSERT_EQ(r->fs->write(f, 0, 5, "hello", &wrote), 0);
    std::string v;
    EXPECT_EQ(r->fs->getxattr(f, "security.capability", &v), ENODATA);
    EXPECT_EQ(listed(*r->fs, f).size(), 2000u);
    ASSERT_EQ(r->fs->setxattr(f, "security.capability", "capdata!", 8, 0), 0);
  }
  EXPECT_EQ(r->check_and_remount(), "");
  size_t wrote = 0;
  ASSERT_EQ(r->fs->write(f, 0, 5, "hello", &wrote), 0);
  std::string v;
  EXPECT_EQ(r->fs->getxattr(f, "security.capability", &v), ENODATA) << "after a remount too";
}

TEST(Xattr, NoNameReachesTheInternalNamespace) {
  auto r = Rig::make();
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "i");
  for (const char* n : {"internal.times", "unknown.times", "times", ".times"}) {
    EXPECT_NE(r->fs->setxattr(f, n, "x", 1, 0), 0) << n;
    std::string v;
    EXPECT_NE(r->fs->getxattr(f, n, &v), 0) << n;
  }
  EXPECT_TRUE(listed(*r->fs, f).empty());
}

// Threads setting, replacing, removing, reading and listing attributes of one shared file
// (each thread its own names) and of a file each, checked against per-thread models.
TEST(Xattr, ThreadsAgainstAModel) {
  auto r = Rig::make(128);
  ASSERT_TRUE(r);
  const Ino shared = r->create(kRootInode, "shared");
  constexpr int kThreads = 4, kOps = 1500;
  std::vector<Ino> own(kThreads);
  for (int t = 0; t < kThreads; ++t) own[t] = r->create(kRootInode, "own" + std::to_string(t));
  std::vector<std::map<std::string, std::string>> model_shared(kThreads), model_own(kThreads);
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      auto fail = [&](const std::string& s) {
        if (failures[t].empty()) failures[t] = s;
      };
      for (int op = 0; op < kOps && failures[t].empty(); ++op) {
        const bool on_shared = rng() % 2;
        const Ino ino = on_shared ? shared : own[t];
        auto& m = on_shared ? model_shared[t] : model_own[t];
        const std::string name = "user.t" + std::to_string(t) + "_" + std::to_string(rng() % 400);
        const size_t len = (rng() % 10 == 0) ? 2000 + rng() % 30000 : rng() % 100;
        const int what = static_cast<int>(rng() % 10);
        if (what < 5) {
          const std::string v = value_of(op, len ? len : 1);
          if (int rc = r->fs->setxattr(ino, name, v.data(), v.size(), 0); rc) {
            fail("set " + name + ": " + std::to_string(rc));
          }
          m[name] = v;
        } else if (what < 7) {
          const int rc = r->fs->removexattr(ino, name);
          if (rc != (m.erase(name) ? 0 : ENODATA))
            fail("remove " + name + ": " + std::to_string(rc));
        } else if (what < 9) {
          std::string v;
          const int rc = r->fs->getxattr(ino, name, &v);
          auto it = m.find(name);
          if (it == m.end() ? rc != ENODATA : (rc != 0 || v != it->second)) fail("get " + name);
        } else {
          const std::multiset<std::string> l = listed(*r->fs, ino);
          if (std::set<std::string>(l.begin(), l.end()).size() != l.size()) fail("a name twice");
          for (const auto& [n, v] : m) {
            if (!l.count(n)) fail("list lost " + n);
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << t;
  auto verify = [&] {
    std::multiset<std::string> want_shared;
    for (int t = 0; t < kThreads; ++t) {
      for (const auto& [n, v] : model_shared[t]) want_shared.insert(n);
      std::multiset<std::string> want_own;
      for (const auto& [n, v] : model_own[t]) {
        want_own.insert(n);
        std::string got;
        ASSERT_EQ(r->fs->getxattr(own[t], n, &got), 0);
        ASSERT_EQ(got, v);
      }
      EXPECT_EQ(listed(*r->fs, own[t]), want_own);
      for (const auto& [n, v] : model_shared[t]) {
        std::string got;
        ASSERT_EQ(r->fs->getxattr(shared, n, &got), 0);
        ASSERT_EQ(got, v);
      }
    }
    EXPECT_EQ(listed(*r->fs, shared), want_shared);
  };
  verify();
  EXPECT_EQ(r->check_and_remount(), "");
  verify();
}

}  // namespace
}  // namespace warpfs::fs::test
