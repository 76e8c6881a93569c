// Small sysfs readers shared by the VFIO transport (vfio.cc) and NVMe discovery (pci.cc).
// Internal to nvme/; every path is absolute, so tests can point them at fake trees.
#pragma once

#include <dirent.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace warpfs::nvme::sysfs {

// A whole attribute file without its trailing newline/spaces; false if it cannot be opened.
inline bool read_text(const std::string& path, std::string* out) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return false;
  char buf[4096];
  out->clear();
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  std::fclose(f);
  while (!out->empty() && (out->back() == '\n' || out->back() == ' ')) out->pop_back();
  return true;
}

// The last component of a symlink's target ("" when `path` is no symlink): a device's
// `driver` and `iommu_group` links name the driver and the group that way.
inline std::string link_name(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return "";
  const std::string target(buf, static_cast<size_t>(n));
  const size_t slash = target.rfind('/');
  return slash == std::string::npos ? target : target.substr(slash + 1);
}

// A directory's entries, sorted, without the dot files.
inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.emplace_back(e->d_name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// The IOMMU group of the device directory `dev_dir`, or -1 (no group: the IOMMU is off).
inline int iommu_group_of(const std::string& dev_dir) {
  const std::string g = link_name(dev_dir + "/iommu_group");
  if (g.empty() || !std::all_of(g.begin(), g.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::atoi(g.c_str());
}

// The devices of IOMMU group `group` other than `bdf` that keep VFIO from opening it, as
// "BDF (bound to DRIVER)": VFIO needs every device bound to vfio-pci or to no driver;
// pci-stub is allowed, and bridges (pcieport) are not endpoints VFIO cares about.
inline std::vector<std::string> group_blockers(const std::string& sysfs_root, int group,
                                               const std::string& bdf) {
  std::vector<std::string> blockers;
  const std::string gdir =
      sysfs_root + "/kernel/iommu_groups/" + std::to_string(group) + "/devices";
  for (const std::string& peer : entries(gdir)) {
    if (peer == bdf) continue;
    const std::string drv = link_name(sysfs_root + "/bus/pci/devices/" + peer + "/driver");
    if (drv.empty() || drv == "vfio-pci" || drv == "pci-stub" || drv == "pcieport") continue;
    blockers.push_back(peer + " (bound to " + drv + ")");
  }
  return blockers;
}

}  // namespace warpfs::nvme::sysfs
