// warpfs-pci: lists the NVMe controllers and moves one between the kernel's nvme driver and
// vfio-pci, for the vfio:DDDD:BB:DD.F devices of warpfs (pci.h has the rules).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "warpfs/nvme/pci.h"

namespace pci = warpfs::nvme::pci;

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: warpfs-pci list [--json]          NVMe controllers: address, ids, names,\n"
               "                                          driver, IOMMU group, block devices\n"
               "       warpfs-pci bind BDF vfio-pci|nvme  move a controller to that driver\n"
               "       warpfs-pci unbind BDF              detach a controller from its driver\n"
               "BDF is a PCI address, DDDD:BB:DD.F (0000:01:00.0). bind and unbind need root and\n"
               "refuse while the controller is in use (mounted, swap, open, or held by VFIO).\n"
               "       warpfs-pci --version (-V)          the version\n");
}

int fail(const std::string& message) {
  std::fprintf(stderr, "warpfs-pci: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  pci::Roots roots;
  bool json = false;
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    // --sysfs/--proc/--dev point at other trees (for tests); not in the usage on purpose.
    std::string* root = a == "--sysfs"  ? &roots.sysfs
                        : a == "--proc" ? &roots.proc
                        : a == "--dev"  ? &roots.dev
                                        : nullptr;
    if (root != nullptr) {
      if (i + 1 == argc) return fail(a + " needs a directory");
      *root = argv[++i];
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else if (a == "-V" || a == "--version") {
      std::printf("warpfs-pci %s\n", WARPFS_VERSION);
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a.size() > 1 && a[0] == '-') {
      usage(stderr);
      return fail("unknown option " + a);
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) {
    usage(stderr);
    return 1;
  }
  const std::string& cmd = args[0];
  std::string error;
  if (cmd == "list" && args.size() == 1) {
    std::vector<pci::NvmeFunction> fns;
    if (!pci::list_nvme(roots, &fns, &error)) return fail(error);
    if (json) {
      for (const pci::NvmeFunction& f : fns) std::printf("%s\n", pci::format_json(f).c_str());
    } else {
      std::fputs(pci::format_table(fns).c_str(), stdout);
    }
    return 0;
  }
  if (json) return fail("--json goes with list only");
  if (cmd == "bind" && args.size() == 3) {
    if (!pci::bind_driver(roots, args[1], args[2], &error)) return fail(error);
    std::printf("%s: bound to %s\n", args[1].c_str(), args[2].c_str());
    return 0;
  }
  if (cmd == "unbind" && args.size() == 2) {
    if (!pci::unbind_driver(roots, args[1], &error)) return fail(error);
    std::printf("%s: no driver\n", args[1].c_str());
    return 0;
  }
  usage(stderr);
  return fail(cmd == "list" || cmd == "bind" || cmd == "unbind"
                  ? "wrong number of arguments for " + cmd
                  : "unknown command '" + cmd + "'");
}
