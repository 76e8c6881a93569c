// warpfs-stat: a running warpfs daemon's counters, live. It reads one JSON object from the
// daemon's socket (/run/warpfs/MAJ:MIN.sock, the mount's device number; root only): the
// stats file's schema (warpfs(8), STATS FILE). Text for people, --json for scripts;
// --watch repeats every interval and shows rates since the last one.
//
// Exit codes: 0 shown, 1 no warpfs daemon to ask (not a mount, no socket, refused), 2 usage.
#include <getopt.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

using json = nlohmann::ordered_json;

namespace {

void usage(FILE* f) {
  std::fprintf(
      f,
      "usage: warpfs-stat [--json] [--watch [SECONDS]] [--count N] MOUNTPOINT\n"
      "  -j, --json          the daemon's JSON object (one line per interval with --watch)\n"
      "  -w, --watch [S]     again every S seconds (default 1), with rates since the last\n"
      "  -n, --count N       with --watch: stop after N intervals\n"
      "  -V, --version       print the version\n");
}

// One snapshot from the daemon of the mount at `mnt`: "" or why not.
std::string fetch(const std::string& mnt, json* out) {
  struct stat st;
  if (::stat(mnt.c_str(), &st) != 0) return mnt + ": " + std::strerror(errno);
  char path[64];
  std::snprintf(path, sizeof path, "/run/warpfs/%u:%u.sock", major(st.st_dev), minor(st.st_dev));
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path, std::strlen(path) + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    const int e = errno;
    ::close(fd);
    if (e == ENOENT) return mnt + " is not a warpfs mount with a live view (no " + path + ")";
    if (e == EACCES) return std::string(path) + ": permission denied (the live view is root's)";
    return std::string(path) + ": " + std::strerror(e);
  }
  std::string text;
  char buf[8192];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  *out = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded() || !out->is_object())
    return std::string(path) + ": not the daemon's JSON";
  return "";
}

uint64_t num(const json& j, const char* a, const char* b) {
  if (!j.contains(a) || !j[a].contains(b) || !j[a][b].is_number_unsigned()) return 0;
  return j[a][b].get<uint64_t>();
}

// One row per member of now[key] that has a count: the count, its rate over the interval
// (with `before`), the latency percentiles, and for device commands MB/s.
void print_table(const json& now, const json* before, double seconds, const char* key,
                 const char* what) {
  if (!now.contains(key)) return;
  const bool with_bytes = std::string(key) == "commands";
  std::printf("%-12s %12s %10s %10s %10s %10s %10s%s\n", what, "count", before ? "per s" : "",
              "p50 us", "p99 us", "p99.9 us", "max us",
              with_bytes ? (before ? "       MB/s" : "         MB") : "");
  for (auto it = now[key].begin(); it != now[key].end(); ++it) {
    const json& o = it.value();
    const uint64_t count = o.value("count", uint64_t{0});
    if (count == 0) continue;
    char rate[32] = "", mb[32] = "";
    const json* was = before && before->contains(key) && (*before)[key].contains(it.key())
                          ? &(*before)[key][it.key()]
                          : nullptr;
    if (was) {
      std::snprintf(rate, sizeof rate, "%.0f",
                    static_cast<double>(count - was->value("count", uint64_t{0})) / seconds);
    }
    if (with_bytes) {
      const uint64_t bytes = o.value("bytes", uint64_t{0});
      const double shown =
          was ? static_cast<double>(bytes - was->value("bytes", uint64_t{0})) / seconds
              : static_cast<double>(bytes);
      std::snprintf(mb, sizeof mb, " %10.1f", shown / 1e6);
    }
    const std::string name = with_bytes ? "dev." + it.key() : it.key();  // apart from FUSE's ops
    std::printf("%-12s %12" PRIu64 " %10s %10.1f %10.1f %10.1f %10.1f%s\n", name.c_str(), count,
                rate, o.value("p50_ns", uint64_t{0}) / 1e3, o.value("p99_ns", uint64_t{0}) / 1e3,
                o.value("p999_ns", uint64_t{0}) / 1e3, o.value("max_ns", uint64_t{0}) / 1e3, mb);
  }
}

void print_text(const json& now, const json* before, double seconds) {
  const uint64_t hits = num(now, "cache", "hits"), misses = num(now, "cache", "misses");
  std::printf(
      "cache: %" PRIu64 " hits, %" PRIu64 " misses (%.1f %% hits), %" PRIu64 " locked hits\n", hits,
      misses,
      hits + misses ? 100.0 * static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0,
      num(now, "cache", "locked_hits"));
  std::printf("journal: %" PRIu64 " commits; device: %s, %" PRIu64 " I/O queues, %" PRIu64
              " resets\n",
              num(now, "fs", "commits"),
              now.contains("device") ? now["device"].value("transport", "?").c_str() : "?",
              num(now, "device", "io_queues"), num(now, "device", "resets"));
  if (before) {
    const double rd =
        static_cast<double>(num(now, "io", "read_bytes") - num(*before, "io", "read_bytes"));
    const double wr =
        static_cast<double>(num(now, "io", "written_bytes") - num(*before, "io", "written_bytes"));
    std::printf("io: %.1f MB/s read, %.1f MB/s written\n", rd / seconds / 1e6, wr / seconds / 1e6);
  } else {
    std::printf("io: %" PRIu64 " bytes read, %" PRIu64 " written\n", num(now, "io", "read_bytes"),
                num(now, "io", "written_bytes"));
  }
  if (now.contains("queues") && now["queues"].contains("pairs") &&
      now["queues"]["pairs"].is_array()) {
    std::printf("queue pairs (in flight/completed):");
    for (const json& q : now["queues"]["pairs"]) {
      std::printf(" %" PRIu64 ": %" PRIu64 "/%" PRIu64, q.value("qid", uint64_t{0}),
                  q.value("outstanding", uint64_t{0}), q.value("completed", uint64_t{0}));
    }
    std::printf("\n");
  }
  print_table(now, before, seconds, "ops", "operation");
  print_table(now, before, seconds, "commands", "device");
}

}  // namespace

int main(int argc, char** argv) {
  static const option longs[] = {
      {"json", no_argument, nullptr, 'j'},        {"watch", optional_argument, nullptr, 'w'},
      {"count", required_argument, nullptr, 'n'}, {"help", no_argument, nullptr, 'h'},
      {"version", no_argument, nullptr, 'V'},     {nullptr, 0, nullptr, 0}};
  bool as_json = false, watch = false;
  double interval = 1;
  long count = -1;
  int c;
  while ((c = getopt_long(argc, argv, "jw::n:hV", longs, nullptr)) != -1) {
    switch (c) {
      case 'j':
        as_json = true;
        break;
      case 'w': {
        watch = true;
        if (optarg) {
          char* end = nullptr;
          interval = std::strtod(optarg, &end);
          if (end == optarg || *end != '\0' || !(interval >= 0.01 && interval <= 3600)) {
            std::fprintf(stderr, "warpfs-stat: bad interval '%s' (0.01 to 3600 seconds)\n", optarg);
            return 2;
          }
        }
        break;
      }
      case 'n': {
        char* end = nullptr;
        count = std::strtol(optarg, &end, 10);
        if (end == optarg || *end != '\0' || count < 1) {
          std::fprintf(stderr, "warpfs-stat: bad count '%s'\n", optarg);
          return 2;
        }
        break;
      }
      case 'h':
        usage(stdout);
        return 0;
      case 'V':
        std::printf("warpfs-stat %s\n", WARPFS_VERSION);
        return 0;
      default:
        usage(stderr);
        return 2;
    }
  }
  if (optind + 1 != argc) {
    usage(stderr);
    return 2;
  }
  const std::string mnt = argv[optind];
  json before;
  bool have_before = false;
  auto last = std::chrono::steady_clock::now();
  for (long i = 0; count < 0 || i < count; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    json now;
    if (std::string why = fetch(mnt, &now); !why.empty()) {
      std::fprintf(stderr, "warpfs-stat: %s\n", why.c_str());
      return 1;
    }
    const auto t = std::chrono::steady_clock::now();
    if (as_json) {
      std::printf("%s\n", now.dump().c_str());
    } else {
      if (watch) std::printf("%s--- %s\n", i ? "\n" : "", mnt.c_str());
      print_text(now, have_before ? &before : nullptr,
                 std::chrono::duration<double>(t - last).count());
    }
    std::fflush(stdout);
    if (!watch) break;
    before = std::move(now);
    have_before = true;
    last = t;
  }
  return 0;
}
