// NVMe discovery (libpci over sysfs) and the nvme <-> vfio-pci move (sysfs writes, as SPDK's
// scripts/setup.sh does them). The kernel ABI used is Documentation/ABI/testing/sysfs-bus-pci
// (driver_override, drivers_probe, unbind) and sysfs-kernel-iommu_groups.
#include "warpfs/nvme/pci.h"

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sysfs.h"

// libpci 3.9's header has no extern "C" of its own.
extern "C" {
#include <pci/pci.h>
}

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

extern char** environ;

namespace warpfs::nvme::pci {
namespace {

using sysfs::entries;
using sysfs::iommu_group_of;
using sysfs::link_name;
using sysfs::read_text;

// PCI Code and ID Assignment §1.2: base class 01h (mass storage), sub-class 08h
// (non-volatile memory), programming interface 02h (NVM Express I/O controller).
constexpr uint32_t kNvmeClass = 0x010802;
constexpr const char* kVfio = "vfio-pci";
constexpr const char* kNvme = "nvme";
// Binding through drivers_probe is synchronous; the wait only covers a device that shows
// no driver for a moment (a probe still running when sysfs is read).
constexpr auto kSettle = std::chrono::seconds(1);

// ---- small file helpers ------------------------------------------------------------------

std::string link_target(const std::string& path) {
  char buf[4096];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n <= 0 ? "" : std::string(buf, static_cast<size_t>(n));
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool all_digits(const std::string& s, size_t from = 0) {
  if (from >= s.size()) return false;
  return std::all_of(s.begin() + static_cast<long>(from), s.end(),
                     [](char c) { return c >= '0' && c <= '9'; });
}

// One sysfs attribute write, as `echo VALUE > PATH` does it.
bool write_attr(const Roots& roots, const std::string& path, const std::string& value,
                std::string* error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    *error = "cannot open " + path + ": " + std::strerror(e);
    if (e == EACCES || e == EPERM) *error += " (run as root)";
    return false;
  }
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int e = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) {
    *error = "writing '" + value + "' to " + path +
             " failed: " + (n < 0 ? std::strerror(e) : "short write") + " (dmesg may say why)";
    return false;
  }
  if (roots.after_write) roots.after_write(path, value);
  return true;
}

std::string devices_dir(const Roots& r) {
  return r.sysfs + "/bus/pci/devices/";
}
std::string drivers_dir(const Roots& r) {
  return r.sysfs + "/bus/pci/drivers/";
}

// The namespaces' block devices of a controller bound to nvme: the `nvmeXnY` disks under
// <device>/nvme/nvmeX/, or, with native multipath, the `nvmeXcZnY` paths whose disk is the
// subsystem's head `nvmeXnY`.
std::vector<std::string> namespaces_of(const std::string& dev_dir) {
  std::set<std::string> out;
  for (const std::string& ctrl : entries(dev_dir + "/nvme")) {
    for (const std::string& e : entries(dev_dir + "/nvme/" + ctrl)) {
      if (e.rfind("nvme", 0) != 0) continue;
      const size_t n = e.rfind('n');
      if (n <= 4 || !all_digits(e, n + 1)) continue;
      const std::string head = e.substr(0, n);  // nvmeX or nvmeXcZ
      const size_t c = head.find('c', 4);
      if (c == std::string::npos && all_digits(head, 4)) {
        out.insert(e);
      } else if (c != std::string::npos && all_digits(head.substr(0, c), 4) &&
                 all_digits(head, c + 1)) {
        out.insert(head.substr(0, c) + e.substr(n));
      }
    }
  }
  return {out.begin(), out.end()};
}

// ---- libpci ------------------------------------------------------------------------------

// libpci reports fatal errors through pci_access::error, which must not return. It jumps
// back to the guard around the libpci call that failed; only libpci's C frames and a lambda
// holding no objects lie between, so no destructor is skipped.
thread_local std::jmp_buf* t_pci_jump = nullptr;
thread_local char t_pci_error[512];

[[noreturn]] void pci_die(char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(t_pci_error, sizeof t_pci_error, fmt, ap);
  va_end(ap);
  if (t_pci_jump == nullptr) {  // a libpci call outside a guard: a bug here
    std::fprintf(stderr, "libpci: %s\n", t_pci_error);
    std::abort();
  }
  std::longjmp(*t_pci_jump, 1);
}

// Warnings (an unreadable config space, a missing pci.ids) leave the data we use intact.
void pci_quiet(char*, ...) {}

// Runs `call` (libpci calls only); false with libpci's message if libpci died in it.
template <typename Call>
bool pci_guard(Call call, std::string* error) {
  std::jmp_buf here;
  std::jmp_buf* const outer = t_pci_jump;
  t_pci_jump = &here;
  if (setjmp(here) != 0) {
    t_pci_jump = outer;
    *error = t_pci_error;
    return false;
  }
  call();
  t_pci_jump = outer;
  return true;
}

// Owns one pci_access.
class PciAccess {
 public:
  PciAccess() : a_(pci_alloc()) {
    a_->error = pci_die;
    a_->warning = pci_quiet;
    a_->debug = pci_quiet;
    a_->method = PCI_ACCESS_SYS_BUS_PCI;
  }
  ~PciAccess() { pci_cleanup(a_); }
  PciAccess(const PciAccess&) = delete;
  PciAccess& operator=(const PciAccess&) = delete;
  pci_access* get() const { return a_; }

 private:
  pci_access* a_;
};

std::string lookup(pci_access* a, int flags, uint16_t vendor, uint16_t device) {
  char buf[256];
  const char* name = nullptr;
  std::string error;
  // PCI_LOOKUP_NO_NUMBERS: null (not "Device 1234") when pci.ids does not know the id.
  if (!pci_guard(
          [&] {
            name =
                pci_lookup_name(a, buf, sizeof buf, flags | PCI_LOOKUP_NO_NUMBERS, vendor, device);
          },
          &error)) {
    return "";  // a broken pci.ids: the ids alone still identify the device
  }
  return name == nullptr ? "" : name;
}

// ---- what keeps a device busy ------------------------------------------------------------

// A descriptor some process holds on a /dev path (the kernel's name for it: /dev/nvme0n1,
// /dev/dm-0, /dev/vfio/12).
struct OpenFile {
  long pid;
  std::string comm;
  std::string path;
};

std::vector<OpenFile> open_dev_files(const Roots& roots) {
  std::vector<long> pids;
  for (const std::string& e : entries(roots.proc)) {
    if (all_digits(e)) pids.push_back(std::atol(e.c_str()));
  }
  std::sort(pids.begin(), pids.end());
  std::vector<OpenFile> out;
  for (const long pid : pids) {
    const std::string dir = roots.proc + "/" + std::to_string(pid);
    // Other users' descriptors are readable by root only; moving a device needs root anyway.
    for (const std::string& fd : entries(dir + "/fd")) {
      std::string target = link_target(dir + "/fd/" + fd);
      if (target.rfind("/dev/", 0) != 0) continue;
      std::string comm;
      read_text(dir + "/comm", &comm);
      out.push_back({pid, comm, std::move(target)});
    }
  }
  return out;
}

// Decodes the octal escapes (\040 for a space) of /proc/mounts and /proc/swaps fields.
std::string unescape(const std::string& s) {
  const auto octal = [](char c) { return c >= '0' && c <= '7'; };
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && octal(s[i + 1]) && octal(s[i + 2]) && octal(s[i + 3])) {
      out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The block devices that stand on a controller's namespaces: the namespaces, their
// partitions, and their holders (device-mapper, md) recursively. Names as in /dev
// ("nvme0n1p2", "dm-0", "mapper/vg-data" for a dm device's alias).
std::set<std::string> stacked_block_devices(const Roots& roots, const std::string& dev_dir) {
  std::set<std::string> names;
  std::vector<std::pair<std::string, std::string>> todo;  // (name, its sysfs directory)
  for (const std::string& ns : namespaces_of(dev_dir)) {
    std::string dir;
    for (const std::string& ctrl : entries(dev_dir + "/nvme")) {
      if (exists(dev_dir + "/nvme/" + ctrl + "/" + ns)) dir = dev_dir + "/nvme/" + ctrl + "/" + ns;
    }
    if (dir.empty()) dir = roots.sysfs + "/class/block/" + ns;  // a multipath head
    todo.emplace_back(ns, dir);
  }
  while (!todo.empty() && names.size() < 4096) {
    const auto [name, dir] = todo.back();
    todo.pop_back();
    if (!names.insert(name).second) continue;
    std::string alias;
    if (read_text(dir + "/dm/name", &alias) && !alias.empty()) names.insert("mapper/" + alias);
    for (const std::string& e : entries(dir)) {  // partitions: nvme0n1p1 under nvme0n1
      if (e.size() > name.size() + 1 && e.rfind(name + "p", 0) == 0 &&
          all_digits(e, name.size() + 1)) {
        todo.emplace_back(e, dir + "/" + e);
      }
    }
    for (const std::string& h : entries(dir + "/holders")) {
      todo.emplace_back(h, roots.sysfs + "/class/block/" + h);
    }
  }
  return names;
}

// True when the /dev path `source` (from /proc/mounts or /proc/swaps) is one of `names`,
// directly or through a symlink in /dev (/dev/disk/by-uuid/..., /dev/mapper/...).
bool names_device(const Roots& roots, const std::string& source,
                  const std::set<std::string>& names) {
  if (source.rfind("/dev/", 0) != 0) return false;
  const std::string rel = source.substr(5);
  if (names.count(rel)) return true;
  char resolved[PATH_MAX], root[PATH_MAX];
  if (::realpath((roots.dev + "/" + rel).c_str(), resolved) == nullptr ||
      ::realpath(roots.dev.c_str(), root) == nullptr) {
    return false;
  }
  const std::string r(resolved), prefix = std::string(root) + "/";
  return r.rfind(prefix, 0) == 0 && names.count(r.substr(prefix.size())) > 0;
}

// What keeps a device bound to nvme busy: mounts, swap and open descriptors of its block
// devices. Empty when nothing does.
std::vector<std::string> block_uses(const Roots& roots, const std::string& dev_dir) {
  std::vector<std::string> uses;
  const std::set<std::string> names = stacked_block_devices(roots, dev_dir);
  if (names.empty()) return uses;
  std::string text;
  if (read_text(roots.proc + "/mounts", &text)) {
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t eol = std::min(text.find('\n', pos), text.size());
      char src[4096], dst[4096], type[256];
      const std::string line = text.substr(pos, eol - pos);
      pos = eol + 1;
      if (std::sscanf(line.c_str(), "%4095s %4095s %255s", src, dst, type) != 3) continue;
      const std::string source = unescape(src);
      if (names_device(roots, source, names)) {
        uses.push_back(source + " is mounted on " + unescape(dst) + " (" + type +
                       "): unmount it first");
      }
    }
  }
  if (read_text(roots.proc + "/swaps", &text)) {
    size_t pos = text.find('\n');  // skips the header line
    while (pos != std::string::npos && pos < text.size()) {
      const size_t eol = std::min(text.find('\n', pos + 1), text.size());
      char file[4096];
      const std::string line = text.substr(pos + 1, eol - pos - 1);
      pos = eol;
      if (std::sscanf(line.c_str(), "%4095s", file) != 1) continue;
      const std::string source = unescape(file);
      if (names_device(roots, source, names)) {
        uses.push_back(source + " is in use as swap: swapoff " + source + " first");
      }
    }
  }
  for (const OpenFile& f : open_dev_files(roots)) {
    if (names.count(f.path.substr(5))) {
      uses.push_back(f.path + " is open in process " + std::to_string(f.pid) + " (" + f.comm +
                     "): stop it first");
    }
  }
  return uses;
}

// What keeps a device bound to vfio-pci busy: a process holding its group (or, with the
// iommufd cdev interface, its /dev/vfio/devices/vfioN) open, such as a mounted warpfs.
std::vector<std::string> vfio_uses(const Roots& roots, const std::string& dev_dir) {
  std::set<std::string> paths;
  const int group = iommu_group_of(dev_dir);
  if (group >= 0) paths.insert("/dev/vfio/" + std::to_string(group));
  for (const std::string& cdev : entries(dev_dir + "/vfio-dev"))
    paths.insert("/dev/vfio/devices/" + cdev);
  std::vector<std::string> uses;
  if (paths.empty()) return uses;
  for (const OpenFile& f : open_dev_files(roots)) {
    if (paths.count(f.path)) {
      uses.push_back(f.path + " is open in process " + std::to_string(f.pid) + " (" + f.comm +
                     "): stop it first (a mounted warpfs: fusermount3 -u MOUNTPOINT)");
    }
  }
  return uses;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// ---- the checks every move starts with ---------------------------------------------------

// "0000:01:00.0" from DDDD:BB:DD.F or BB:DD.F (any case); false when `in` is neither.
bool canonical_bdf(const std::string& in, std::string* out) {
  unsigned dom = 0, bus, dev, fn;
  char tail;
  if (std::sscanf(in.c_str(), "%4x:%2x:%2x.%1x%c", &dom, &bus, &dev, &fn, &tail) != 4) {
    dom = 0;
    if (std::sscanf(in.c_str(), "%2x:%2x.%1x%c", &bus, &dev, &fn, &tail) != 3) return false;
  }
  if (dev > 0x1f || fn > 7) return false;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", dom, bus, dev, fn);
  *out = buf;
  return true;
}

// The device's sysfs directory, after checking that it exists and is an NVMe controller.
bool nvme_device(const Roots& roots, const std::string& arg, std::string* bdf, std::string* dir,
                 std::string* error) {
  if (!canonical_bdf(arg, bdf)) {
    *error = "'" + arg + "' is not a PCI address (expected DDDD:BB:DD.F, such as 0000:01:00.0)";
    return false;
  }
  *dir = devices_dir(roots) + *bdf;
  std::string cls;
  if (!exists(*dir)) {
    *error = "no PCI device " + *bdf + " (not in " + roots.sysfs + "/bus/pci/devices" +
             "); `warpfs-pci list` shows the NVMe controllers";
    return false;
  }
  if (!read_text(*dir + "/class", &cls)) {
    *error = "cannot read " + *dir + "/class: " + std::strerror(errno);
    return false;
  }
  if (std::strtoul(cls.c_str(), nullptr, 16) != kNvmeClass) {
    *error = *bdf + " is not an NVMe controller (PCI class " + cls +
             ", NVMe is 0x010802); `warpfs-pci list` shows the NVMe controllers";
    return false;
  }
  return true;
}

// Refuses to move a device something is using.
bool check_idle(const Roots& roots, const std::string& bdf, const std::string& dir,
                const std::string& driver, std::string* error) {
  std::vector<std::string> uses;
  if (driver == kNvme) uses = block_uses(roots, dir);
  if (driver == kVfio) uses = vfio_uses(roots, dir);
  if (uses.empty()) return true;
  *error = bdf + " is in use, leaving it on " + driver + ": " + join(uses, "; ");
  return false;
}

// VFIO opens a group only when every device in it is bound to a vfio driver or to none;
// pci-stub is allowed, and bridges (pcieport) are not endpoints VFIO cares about.
bool check_group_viable(const Roots& roots, const std::string& bdf, const std::string& dir,
                        std::string* error) {
  const int group = iommu_group_of(dir);
  if (group < 0) {
    *error = bdf +
             " has no IOMMU group: the IOMMU is off. Turn it on with intel_iommu=on "
             "(Intel) or amd_iommu=on (AMD) on the kernel command line (GRUB_CMDLINE_LINUX "
             "in /etc/default/grub, then update-grub) and reboot; enable VT-d/AMD-Vi in "
             "the firmware if it is still off";
    return false;
  }
  const std::vector<std::string> blockers = sysfs::group_blockers(roots.sysfs, group, bdf);
  if (blockers.empty()) return true;
  *error = "IOMMU group " + std::to_string(group) + " of " + bdf +
           " is not viable for VFIO: it also holds " + join(blockers, ", ") +
           "; every device in the group must be bound to vfio-pci or to no driver (unbind "
           "them first: warpfs-pci unbind BDF for NVMe controllers, echo BDF > "
           "/sys/bus/pci/devices/BDF/driver/unbind for others), or move the controller to "
           "a slot with a group of its own";
  return false;
}

// Makes sure /sys/bus/pci/drivers/<driver> exists, loading the module on the real system.
bool driver_loaded(const Roots& roots, const std::string& driver, std::string* error) {
  const std::string dir = drivers_dir(roots) + driver;
  if (exists(dir)) return true;
  if (roots.sysfs != "/sys") {  // a fake tree: modprobe would act on the running kernel
    *error = "the " + driver + " driver is not loaded (no " + dir + "): run modprobe " + driver;
    return false;
  }
  pid_t pid;
  std::string module = driver;
  char* argv[] = {const_cast<char*>("modprobe"), module.data(), nullptr};
  int status = 0;
  const int rc = ::posix_spawnp(&pid, "modprobe", nullptr, nullptr, argv, environ);
  if (rc != 0) {
    *error = "the " + driver + " driver is not loaded and modprobe could not run (" +
             std::strerror(rc) + "): install kmod and run modprobe " + driver;
    return false;
  }
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !exists(dir)) {
    *error = "modprobe " + driver + " failed: the " + driver +
             " driver is not available (its message is above; is the module built for "
             "this kernel?)";
    return false;
  }
  return true;
}

// The driver the device ended up with, waiting a moment while it shows none.
std::string settled_driver(const std::string& dir) {
  const auto deadline = std::chrono::steady_clock::now() + kSettle;
  std::string drv = link_name(dir + "/driver");
  while (drv.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    drv = link_name(dir + "/driver");
  }
  return drv;
}

}  // namespace

bool list_nvme(const Roots& roots, std::vector<NvmeFunction>* out, std::string* error) {
  out->clear();
  PciAccess access;
  pci_access* a = access.get();
  std::string path = roots.sysfs + "/bus/pci";
  std::string why;
  // The sysfs back end reads vendor, device and class from sysfs (the kernel's view, quirks
  // applied) and the programming interface from the class file's low byte.
  const bool ok = pci_guard(
      [&] {
        pci_set_param(a, const_cast<char*>("sysfs.path"), path.data());
        pci_init(a);
        pci_scan_bus(a);
        for (pci_dev* d = a->devices; d != nullptr; d = d->next) {
          pci_fill_info(d, PCI_FILL_IDENT | PCI_FILL_CLASS | PCI_FILL_CLASS_EXT);
        }
      },
      &why);
  if (!ok) {
    *error =
        "cannot list PCI devices (libpci: " + why + "); is sysfs mounted on " + roots.sysfs + "?";
    return false;
  }
  for (pci_dev* d = a->devices; d != nullptr; d = d->next) {
    const uint32_t cls = uint32_t{d->device_class} << 8 | d->prog_if;
    if (cls != kNvmeClass) continue;
    NvmeFunction f;
    char bdf[32];
    std::snprintf(bdf, sizeof bdf, "%04x:%02x:%02x.%x", static_cast<unsigned>(d->domain), d->bus,
                  d->dev, d->func);
    f.bdf = bdf;
    f.vendor_id = d->vendor_id;
    f.device_id = d->device_id;
    f.vendor = lookup(a, PCI_LOOKUP_VENDOR, d->vendor_id, 0);
    f.device = lookup(a, PCI_LOOKUP_DEVICE, d->vendor_id, d->device_id);
    const std::string dir = devices_dir(roots) + f.bdf;
    f.driver = link_name(dir + "/driver");
    f.iommu_group = iommu_group_of(dir);
    if (f.driver == kNvme) f.block_devices = namespaces_of(dir);
    out->push_back(std::move(f));
  }
  std::sort(out->begin(), out->end(),
            [](const NvmeFunction& x, const NvmeFunction& y) { return x.bdf < y.bdf; });
  return true;
}

bool bind_driver(const Roots& roots, const std::string& arg, const std::string& driver,
                 std::string* error) {
  if (driver != kVfio && driver != kNvme) {
    *error = "cannot bind to '" + driver + "': the drivers are vfio-pci and nvme";
    return false;
  }
  std::string bdf, dir;
  if (!nvme_device(roots, arg, &bdf, &dir, error)) return false;
  const std::string current = link_name(dir + "/driver");
  if (current == driver) return true;
  if (driver == kVfio && !check_group_viable(roots, bdf, dir, error)) return false;
  if (!current.empty() && !check_idle(roots, bdf, dir, current, error)) return false;
  if (!driver_loaded(roots, driver, error)) return false;

  // As setup.sh: driver_override makes only vfio-pci match the device (a newline clears it,
  // so nvme matches by class again), then the device leaves its driver and is probed anew.
  if (!write_attr(roots, dir + "/driver_override", driver == kVfio ? "vfio-pci" : "\n", error)) {
    return false;
  }
  if (!current.empty() &&
      !write_attr(roots, drivers_dir(roots) + current + "/unbind", bdf, error)) {
    return false;
  }
  if (!write_attr(roots, roots.sysfs + "/bus/pci/drivers_probe", bdf, error)) {
    *error += "; " + bdf + " is left without a driver";
    return false;
  }
  const std::string now = settled_driver(dir);
  if (now != driver) {
    *error = bdf + " did not bind to " + driver + " (it is " +
             (now.empty() ? std::string("bound to no driver") : "bound to " + now) +
             "); dmesg may say why";
    if (driver == kVfio) *error += "; warpfs-pci bind " + bdf + " nvme gives it back to the kernel";
    return false;
  }
  return true;
}

bool unbind_driver(const Roots& roots, const std::string& arg, std::string* error) {
  std::string bdf, dir;
  if (!nvme_device(roots, arg, &bdf, &dir, error)) return false;
  const std::string current = link_name(dir + "/driver");
  if (current.empty()) return true;
  if (!check_idle(roots, bdf, dir, current, error)) return false;
  if (!write_attr(roots, drivers_dir(roots) + current + "/unbind", bdf, error)) return false;
  const std::string now = link_name(dir + "/driver");
  if (!now.empty()) {
    *error = bdf + " is still bound to " + now + " after the unbind; dmesg may say why";
    return false;
  }
  return true;
}

std::string format_table(const std::vector<NvmeFunction>& functions) {
  if (functions.empty()) return "no NVMe controllers (PCI class 01h/08h/02h) found\n";
  std::vector<std::vector<std::string>> rows = {{"BDF", "IDS", "NAME", "DRIVER", "IOMMU", "BLOCK"}};
  for (const NvmeFunction& f : functions) {
    char ids[16];
    std::snprintf(ids, sizeof ids, "%04x:%04x", f.vendor_id, f.device_id);
    std::string name = f.vendor + (f.vendor.empty() || f.device.empty() ? "" : " ") + f.device;
    rows.push_back({f.bdf, ids, name.empty() ? "-" : name, f.driver.empty() ? "-" : f.driver,
                    f.iommu_group < 0 ? "-" : std::to_string(f.iommu_group),
                    f.block_devices.empty() ? "-" : join(f.block_devices, ",")});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string format_json(const NvmeFunction& f) {
  using json = nlohmann::ordered_json;
  char vendor_id[8], device_id[8];
  std::snprintf(vendor_id, sizeof vendor_id, "%04x", f.vendor_id);
  std::snprintf(device_id, sizeof device_id, "%04x", f.device_id);
  json j = {{"bdf", f.bdf},
            {"vendor_id", vendor_id},
            {"device_id", device_id},
            {"vendor", f.vendor},
            {"device", f.device},
            {"driver", f.driver.empty() ? json(nullptr) : json(f.driver)},
            {"iommu_group", f.iommu_group < 0 ? json(nullptr) : json(f.iommu_group)},
            {"block_devices", f.block_devices}};
  // pci.ids names are not always UTF-8: such bytes become U+FFFD.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace warpfs::nvme::pci
