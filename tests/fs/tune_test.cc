// tune.warpfs's library (fs/tune.h): the adjustable superblock fields change in the primary
// and the backup, take effect at the next mount, leave fsck clean; dirty or damaged
// filesystems and bad values are refused with nothing written.
#include "warpfs/fs/tune.h"

#include <sys/statvfs.h>

#include <cstring>

#include "fs/core_rig.h"

namespace warpfs::fs::test {
namespace {

// The raw bytes of the primary and the backup superblock, to show nothing was written.
std::string both_raw(Rig& r) {
  const Superblock sb = r.superblock_at(0);
  std::string out(2 * kBlockSize, '\0');
  EXPECT_TRUE(r.dev->read(0, 1, out.data()).is_ok());
  EXPECT_TRUE(r.dev->read(sb.block_count - 1, 1, out.data() + kBlockSize).is_ok());
  return out;
}

void unmount(Rig& r) {
  ASSERT_EQ(r.fs->unmount(), 0) << r.log;
  r.fs.reset();
}

TEST(Tune, FieldsChangeInBothCopiesAndTakeEffectAtTheNextMount) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "kept");
  ASSERT_EQ(r->write(f, 0, std::string(100000, 'k')), 0);
  unmount(*r);
  TuneRequest t;
  t.label = "tuned volume";
  t.reserved_percent = 20;
  t.reserved_uid = 42;
  t.reserved_gid = 43;
  t.commit_interval_s = 2;
  Superblock out;
  ASSERT_EQ(tune(*r->dev, t, &out), "");
  for (uint64_t b : {uint64_t{0}, out.block_count - 1}) {
    const Superblock sb = r->superblock_at(b);
    EXPECT_STREQ(sb.label, "tuned volume") << "block " << b;
    EXPECT_EQ(sb.reserved_blocks, data_blocks(sb) / 5) << "block " << b;
    EXPECT_EQ(sb.reserved_uid, 42u);
    EXPECT_EQ(sb.reserved_gid, 43u);
    EXPECT_EQ(sb.commit_interval_s, 2u);
    EXPECT_EQ(sb.checksum, superblock_checksum(sb));
  }
  EXPECT_EQ(r->fsck_unmounted(), "");
  r->commit_interval_ms = 0;  // the mount names no interval
  ASSERT_TRUE(r->mount()) << r->log;
  EXPECT_EQ(r->fs->stats().commit_interval_ms, 2000u) << "the superblock's default is in force";
  struct statvfs st;
  ASSERT_EQ(r->fs->statfs(&st), 0);
  EXPECT_GE(st.f_bfree - st.f_bavail, out.reserved_blocks) << "df leaves the kept blocks out";
  EXPECT_EQ(r->read(f, 0, 100000), std::string(100000, 'k'));
  // Commit 0 brings back the 5 s default.
  unmount(*r);
  TuneRequest back;
  back.commit_interval_s = 0;
  back.reserved_blocks = 1000;
  ASSERT_EQ(tune(*r->dev, back), "");
  ASSERT_TRUE(r->mount()) << r->log;
  EXPECT_EQ(r->fs->stats().commit_interval_ms, 5000u);
  EXPECT_STREQ(r->superblock_at(0).label, "tuned volume") << "fields not asked for stay";
  EXPECT_EQ(r->superblock_at(0).reserved_blocks, 1000u);
  unmount(*r);
  TuneRequest seven;
  seven.commit_interval_s = 7;
  ASSERT_EQ(tune(*r->dev, seven), "");
  r->commit_interval_ms = 3000;  // the mount's own interval wins over the superblock's
  ASSERT_TRUE(r->mount()) << r->log;
  EXPECT_EQ(r->fs->stats().commit_interval_ms, 3000u);
  EXPECT_EQ(r->check_and_remount(), "");
}

TEST(Tune, BadValuesAreRefusedAndNothingIsWritten) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  unmount(*r);
  const std::string before = both_raw(*r);
  TuneRequest long_label;
  long_label.label = std::string(64, 'x');
  EXPECT_NE(tune(*r->dev, long_label), "");
  TuneRequest big_share;
  big_share.reserved_percent = 60;
  EXPECT_NE(tune(*r->dev, big_share), "");
  TuneRequest big_count;
  big_count.reserved_blocks = r->superblock_at(0).block_count;
  EXPECT_NE(tune(*r->dev, big_count), "");
  TuneRequest long_commit;
  long_commit.commit_interval_s = 86401;
  EXPECT_NE(tune(*r->dev, long_commit), "");
  for (const char* bad : {"cache_mb=64", "ro,queues=2", "meta_cache_mb=x", "meta_cache_mb=-1",
                          "meta_cache_mb=65537", "ro,,rw", "-h"}) {
    TuneRequest opts;
    opts.mount_opts = bad;
    EXPECT_NE(tune(*r->dev, opts), "") << bad;
  }
  TuneRequest long_opts;  // each option valid, the list over 63 bytes
  long_opts.mount_opts = "ro";
  while (long_opts.mount_opts->size() < 64) *long_opts.mount_opts += ",ro";
  EXPECT_NE(tune(*r->dev, long_opts), "");
  EXPECT_EQ(both_raw(*r), before);
}

TEST(Tune, DefaultMountOptionsParseAsTheDaemonAppliesThem) {
  DefaultMountOptions d;
  ASSERT_EQ(parse_default_mount_options("", &d), "");
  EXPECT_FALSE(d.read_only || d.discard || d.meta_cache_mb);
  ASSERT_EQ(parse_default_mount_options("ro,nodiscard,meta_cache_mb=4", &d), "");
  EXPECT_EQ(d.read_only, std::optional<bool>(true));
  EXPECT_EQ(d.discard, std::optional<bool>(false));
  EXPECT_EQ(d.meta_cache_mb, std::optional<uint32_t>(4));
  ASSERT_EQ(parse_default_mount_options("ro,rw,discard", &d), "");  // the last one wins
  EXPECT_EQ(d.read_only, std::optional<bool>(false));
  EXPECT_EQ(d.discard, std::optional<bool>(true));
  EXPECT_FALSE(d.meta_cache_mb);
  // A refused list leaves *out as it was.
  EXPECT_NE(parse_default_mount_options("ro,stats=/tmp/x", &d), "");
  EXPECT_EQ(d.read_only, std::optional<bool>(false));
}

TEST(Tune, DefaultMountOptionsAreKeptInBothCopiesAndCleared) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  unmount(*r);
  TuneRequest set;
  set.mount_opts = "ro,meta_cache_mb=8";
  ASSERT_EQ(tune(*r->dev, set), "");
  const Superblock sb = r->superblock_at(0);
  EXPECT_EQ(default_mount_options(sb), "ro,meta_cache_mb=8");
  EXPECT_EQ(default_mount_options(r->superblock_at(sb.block_count - 1)), "ro,meta_cache_mb=8");
  EXPECT_EQ(r->fsck_unmounted(), "");
  TuneRequest clear;
  clear.mount_opts = "";
  ASSERT_EQ(tune(*r->dev, clear), "");
  EXPECT_EQ(default_mount_options(r->superblock_at(0)), "");
  // A field with no NUL (a damaged or foreign superblock) reads as no options.
  Superblock odd = r->superblock_at(0);
  std::memset(odd.mount_opts, 'r', sizeof odd.mount_opts);
  EXPECT_EQ(default_mount_options(odd), "");
}

TEST(Tune, ADirtyOrDamagedFilesystemIsRefused) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  unmount(*r);
  Superblock sb = r->superblock_at(0);
  sb.state = kStateDirty;  // what a crash leaves: the journal may hold an older superblock
  sb.checksum = superblock_checksum(sb);
  ASSERT_TRUE(r->dev->write(0, 1, &sb).is_ok());
  const std::string before = both_raw(*r);
  TuneRequest t;
  t.label = "x";
  const std::string why = tune(*r->dev, t);
  EXPECT_NE(why.find("not cleanly unmounted"), std::string::npos) << why;
  EXPECT_EQ(both_raw(*r), before);
  sb.checksum ^= 1;  // damaged
  ASSERT_TRUE(r->dev->write(0, 1, &sb).is_ok());
  EXPECT_NE(tune(*r->dev, t).find("damaged"), std::string::npos);
  std::string zero(kBlockSize, '\0');
  ASSERT_TRUE(r->dev->write(0, 1, zero.data()).is_ok());
  EXPECT_EQ(tune(*r->dev, t), "not a warpfs filesystem");
}

// Remount (Filesystem::set_read_only): read-only leaves the image as clean as an unmount
// does (fsck of the device then finds nothing) and refuses changes; read-write takes them.
TEST(Remount, ReadOnlyLeavesTheImageCleanAndReadWriteTakesChangesAgain) {
  auto r = Rig::make(64);
  ASSERT_TRUE(r);
  const Ino f = r->create(kRootInode, "f");
  ASSERT_EQ(r->write(f, 0, "before"), 0);
  ASSERT_EQ(r->fs->set_read_only(true), 0) << r->log;
  EXPECT_TRUE(r->fs->read_only());
  EXPECT_EQ(r->write(f, 0, "x"), EROFS);
  EXPECT_EQ(r->fs->unlink(kRootInode, "f"), EROFS);
  EXPECT_EQ(r->superblock_at(0).state, kStateClean);
  EXPECT_EQ(r->fsck_unmounted(), "") << "the image under a read-only remount";
  EXPECT_EQ(r->read(f, 0, 6), "before");
  ASSERT_EQ(r->fs->set_read_only(false), 0) << r->log;
  EXPECT_EQ(r->superblock_at(0).state, kStateDirty);
  EXPECT_EQ(r->write(f, 0, "after!"), 0);
  EXPECT_EQ(r->check_and_remount(), "");
  EXPECT_EQ(r->read(f, 0, 6), "after!");
}

}  // namespace
}  // namespace warpfs::fs::test
