// warpfs-bench-gpu-bfs: the fourth GPU benchmark, an application. Breadth-first search over a
// generated graph whose CSR arrays lie on the emulated NVMe namespace, run the three ways of
// BaM §9.2 (plus a fourth):
//
//   memory      the arrays read from the namespace into GPU memory beforehand; the kernel uses
//               plain loads (BaM's run (1): no BaM software; the floor).
//   warm        through the GPU cache (gpu::array<T>), every line of the graph loaded into a
//               cache larger than the graph before the timed run (BaM's (2)). warm - memory is
//               the cache's cost on hits.
//   cold        the same cache, invalidated first: every line the BFS touches is read from the
//               emulated controller once. cold - warm is the storage cost (BaM's (3) - (2)).
//   cold_small  cold with a cache of about a quarter of the graph, as BaM limits its cache to
//               8 GB under 27-50 GB graphs: lines are evicted and read again.
//
// The raw image. The CSR sits in contiguous ranges of 4 KiB lines of the namespace (a RAM
// store):
//   line 0    Header (magic "WARPBFS1", sizes, where the arrays start, the generator)
//   line 1..  offsets: uint64_t[vertices + 1] (vertex v's neighbours are edges[off[v]..off[v+1]))
//   then      edges: uint32_t[adjacency], from the next line boundary
// Every raw variant takes the graph from the namespace (memory mode through the store).
//
// From files (built where gpu::Volume is, i.e. with the filesystem core):
//   --write-graph DIR   writes each graph's CSR as two files, DIR/NAME.off and DIR/NAME.adj
//                       (NAME = GRAPH-sSCALE-eEDGEFACTOR-SEED), with plain write(2)s and an
//                       fsync each: how a user copies a dataset into a mounted warpfs. Prints a
//                       gpu_bfs_write line and exits.
//   --image IMG [--dir /D]  adds the modes file_warm and file_cold: the same BFS with the two
//                       files of the image (IMG unmounted; /D inside it, default /bfs) read as
//                       gpu::file_array<T> through gpu::Volume (volume.cuh): the block map in
//                       GPU memory, the warp-coalesced cache, GPU-initiated reads. The file
//                       arrays' cache has twice the raw warm cache's sets (a file's blocks need
//                       not be contiguous, so a set may get more than 8 of them).
//   The files must hold the generated graph: their sizes are checked, and every run's levels
//   against the CPU's.
//
// The graph. R-MAT with Graph500's parameters (a = 0.57, b = c = 0.19), 2^scale vertices,
// edge_factor * 2^scale generated edges, each stored both ways (undirected); self-loops
// dropped, duplicate edges kept; vertex ids permuted (the generator puts hubs at low ids).
// Deterministic from --seed, whatever the number of generator threads.
//
// BFS. Level-synchronous, top-down, one kernel per level and a host read of a "changed" flag
// after each (as BaM's and EMOGI's BFS): a warp takes 8 consecutive vertices (BaM §9.1); for
// each on the current level its 32 lanes read the adjacency list in coalesced chunks, through
// an array_ref (BaM's coalescing + reference reuse, §9.2.2). Levels live in GPU memory in every
// variant; only the graph goes through the cache. Sources: vertices
// of degree > 2 (BaM: >= 32 sources with more than two neighbours), drawn by a seeded hash.
//
// Checks (exit 1 on any failure): every run's levels equal a CPU BFS from the same source; a
// warm run misses nothing; no I/O errors.
//
// Output: JSON lines. gpu_bfs_graph (the graph and image), gpu_bfs_run (one per source and
// mode), gpu_bfs (one per mode: means over sources, TEPS, hit rate, ratio to memory).
//   edges_traversed: adjacency entries scanned (the degrees of the visited vertices; an
//   undirected edge counts twice). teps = edges_traversed / time; teps_graph500 counts each
//   undirected edge once (half). lookups: line acquisitions (one per coalesced group);
//   hit_rate = 1 - misses / lookups.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "gpu_bench.cuh"
#include "warpfs/gpu/array.cuh"
#include "warpfs/gpu/cache.cuh"
#include "warpfs/gpu/rig.cuh"
#ifdef WARPFS_BFS_FILES
#include "warpfs/gpu/volume.cuh"
#endif

namespace {

using namespace warpfs;
namespace gb = warpfs::gpu::bench;

constexpr uint32_t kLine = 4096;
constexpr uint32_t kInf = ~0u;
constexpr uint32_t kVerticesPerWarp = 8;
constexpr uint64_t kMagic = 0x3153464250524157ull;  // "WARPBFS1", little-endian

struct Header {
  uint64_t magic, vertices, adjacency, offsets_line, edges_line, kind, scale, edge_factor, seed;
};

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// ---- the graph (host) -----------------------------------------------------------------------

struct Csr {
  uint64_t n = 0;
  std::vector<uint64_t> off;  // n + 1
  std::vector<uint32_t> adj;
  uint64_t degree(uint64_t v) const { return off[v + 1] - off[v]; }
};

// Runs f(first, end) over [0, n) on every core, in contiguous chunks.
template <typename F>
void parallel_for(uint64_t n, F&& f) {
  const unsigned k = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < k; ++t) {
    ts.emplace_back([&, t] { f(n * t / k, n * (t + 1) / k); });
  }
  for (std::thread& t : ts) t.join();
}

enum class Kind { kRmat, kUrand };

// R-MAT (Graph500's Kronecker parameters) or uniform random (GAP's urand): BaM's Table 9.1
// has one of each (K, U) beside its real-world graphs.
Csr make_graph(Kind kind, uint32_t scale, uint32_t edge_factor, uint64_t seed) {
  Csr g;
  g.n = uint64_t{1} << scale;
  const uint64_t m = uint64_t{edge_factor} * g.n;
  std::vector<uint32_t> src(m), dst(m);
  // R-MAT: 16 bits of a draw pick each level's quadrant, by p / 65536 in [0, a) (0,0),
  // [a, a+b) (0,1), [a+b, a+b+c) (1,0), [a+b+c, 1) (1,1).
  constexpr uint32_t kA = 37356, kAB = 49807, kABC = 62259;  // 0.57, 0.76, 0.95 of 65536
  parallel_for(m, [&](uint64_t first, uint64_t end) {
    for (uint64_t i = first; i < end; ++i) {  // edge i from its own random stream
      uint64_t r = mix(seed ^ mix(i)), u = 0, v = 0;
      if (kind == Kind::kUrand) {
        u = r % g.n;
        v = mix(r) % g.n;
      } else {
        for (uint32_t level = 0; level < scale; ++level) {
          if (level % 4 == 0 && level > 0) r = mix(r);
          const uint32_t p = static_cast<uint32_t>(r >> (16 * (level % 4))) & 0xffff;
          u = u << 1 | (p >= kAB);
          v = v << 1 | ((p >= kA && p < kAB) || p >= kABC);
        }
      }
      src[i] = static_cast<uint32_t>(u);
      dst[i] = static_cast<uint32_t>(v);
    }
  });
  std::vector<uint32_t> perm(g.n);
  std::iota(perm.begin(), perm.end(), 0u);
  uint64_t r = mix(seed + 1);
  for (uint64_t i = g.n - 1; i > 0; --i) {
    r = mix(r);
    std::swap(perm[i], perm[r % (i + 1)]);
  }
  std::vector<uint64_t> deg(g.n + 1, 0);
  for (uint64_t i = 0; i < m; ++i) {
    if (src[i] == dst[i]) continue;
    ++deg[perm[src[i]]];
    ++deg[perm[dst[i]]];
  }
  g.off.assign(g.n + 1, 0);
  for (uint64_t v = 0; v < g.n; ++v) g.off[v + 1] = g.off[v] + deg[v];
  g.adj.resize(g.off[g.n]);
  std::vector<uint64_t> cur(g.off.begin(), g.off.end() - 1);
  for (uint64_t i = 0; i < m; ++i) {
    if (src[i] == dst[i]) continue;
    const uint32_t a = perm[src[i]], b = perm[dst[i]];
    g.adj[cur[a]++] = b;
    g.adj[cur[b]++] = a;
  }
  return g;
}

// The reference: a queue-based BFS. Returns levels; *scanned = adjacency entries read.
std::vector<uint32_t> cpu_bfs(const Csr& g, uint32_t source, uint64_t* scanned, uint32_t* depth) {
  std::vector<uint32_t> level(g.n, kInf), q;
  q.reserve(g.n);
  level[source] = 0;
  q.push_back(source);
  uint64_t s = 0;
  for (size_t h = 0; h < q.size(); ++h) {
    const uint32_t v = q[h];
    s += g.degree(v);
    for (uint64_t e = g.off[v]; e < g.off[v + 1]; ++e) {
      const uint32_t u = g.adj[e];
      if (level[u] == kInf) {
        level[u] = level[v] + 1;
        q.push_back(u);
      }
    }
  }
  *scanned = s;
  *depth = level[q.back()];
  return level;
}

// ---- BFS on the GPU -----------------------------------------------------------------------

// The graph in GPU memory, read with plain loads: the interface of gpu::array<T>, and a
// cursor with the interface of gpu::array_ref<T>.
template <typename T>
struct InMemory {
  const T* p;
  __device__ T read(uint64_t i, uint32_t*) const { return p[i]; }
};
template <typename T>
struct InMemoryCursor {
  __device__ explicit InMemoryCursor(const InMemory<T>& m) : p(m.p) {}
  __device__ T read(uint64_t i, uint32_t*) { return p[i]; }
  __device__ bool holds(uint64_t) const { return true; }
  __device__ void reset() {}
  const T* p;
};
template <typename A>
struct CursorOf;
template <typename T>
struct CursorOf<InMemory<T>> {
  using type = InMemoryCursor<T>;
};
template <typename T>
struct CursorOf<gpu::array<T>> {
  using type = gpu::array_ref<T>;
};
#ifdef WARPFS_BFS_FILES
template <typename T>
struct CursorOf<gpu::file_array<T>> {
  using type = gpu::file_array_ref<T>;
};
#endif

// One level: vertices on level `cur` put their unvisited neighbours on cur + 1. BaM's two
// abstraction optimisations (§9.2.2) are both used, as in its final BFS: every access is made
// by the whole warp (warp coalescing: one acquisition per line per warp), and the adjacency
// list is read through a cursor (reference reuse: a lane keeps its line while the list stays
// in it, so a long list costs one acquisition per 4 KiB line, not one per 32 entries).
template <typename Offsets, typename Edges>
__global__ void bfs_level(Offsets off, Edges edges, uint64_t n, uint32_t* level, uint32_t cur,
                          uint32_t* changed, unsigned long long* lookups) {
  const uint64_t warp = (blockIdx.x * uint64_t{blockDim.x} + threadIdx.x) / 32;
  const uint32_t lane = threadIdx.x % 32;
  uint32_t looked = 0;
  bool grew = false;
  typename CursorOf<Edges>::type cursor(edges);
  const uint64_t first = warp * kVerticesPerWarp;
  for (uint64_t v = first; v < first + kVerticesPerWarp && v < n; ++v) {
    if (level[v] != cur) continue;  // one address for the whole warp: uniform
    // off[v] and off[v + 1] in one warp access (even lanes, odd lanes): one acquisition.
    __syncwarp();
    const uint64_t bound = off.read(v + (lane & 1), &looked);
    const uint64_t begin = __shfl_sync(0xffffffffu, bound, 0);
    const uint64_t end = __shfl_sync(0xffffffffu, bound, 1);
    for (uint64_t base = begin; base < end; base += 32) {
      // Every lane takes part (past the end it re-reads the last entry), so the group is the
      // whole warp, not whichever lanes happen to be converged.
      const uint64_t e = base + lane < end ? base + lane : end - 1;
      __syncwarp();
      // No lane holds a line while another acquires one (array.cuh, array_ref::holds): when
      // the list crosses into the next line, the whole warp lets go first.
      if (!__all_sync(0xffffffffu, cursor.holds(e))) cursor.reset();
      const uint32_t u = cursor.read(e, &looked);
      // Several lanes may set the same u: they all store cur + 1 (a benign race).
      if (base + lane < end && level[u] == kInf) {
        level[u] = cur + 1;
        grew = true;
      }
    }
    __syncwarp();
    cursor.reset();  // hold no line while acquiring the next vertex's offsets
  }
  // One store per warp that grew the frontier (GPU memory; the host copies it after the level).
  if (__any_sync(0xffffffffu, grew) && lane == 0) *changed = 1;
  const uint32_t warp_looked = __reduce_add_sync(0xffffffffu, looked);
  if (lane == 0 && warp_looked != 0)
    atomicAdd(lookups, static_cast<unsigned long long>(warp_looked));
}

// Warm-up for the warm runs: one element of every line of both arrays, through the cache
// (gpu::array<T>, or gpu::file_array<T>: one element of every file block).
template <typename Offsets, typename Edges>
__global__ void touch_lines(Offsets off, uint64_t off_lines, Edges edges, uint64_t edge_lines) {
  const uint64_t t = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
  if (t < off_lines) {
    (void)off.read(t * (kLine / sizeof(uint64_t)));
  } else if (t < off_lines + edge_lines) {
    (void)edges.read((t - off_lines) * (kLine / sizeof(uint32_t)));
  }
}

// Waits for the GPU without sleeping between looks (BFS levels are short: a sleep would be
// measured); gives up after `seconds` like sync_or_die.
void spin_sync(const char* what, double seconds) {
  WARPFS_CUDA_CHECK(cudaGetLastError());
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(nullptr);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) gpu::cuda_fail(e, what, __FILE__, __LINE__);
    if (seconds_since(start) > seconds) {
      std::fprintf(stderr, "warpfs-bench-gpu-bfs: %s did not finish within %.0f s\n", what,
                   seconds);
      std::fflush(stdout);
      std::_Exit(1);
    }
  }
}

struct Device {
  uint64_t n = 0;
  uint32_t* level = nullptr;
  uint32_t* changed = nullptr;       // GPU memory: set by every warp that grew the frontier
  uint32_t* changed_host = nullptr;  // pinned: its copy, read after each level
  unsigned long long* lookups = nullptr;
};

struct RunResult {
  double ms = 0;
  uint32_t levels = 0;  // kernels launched
  uint64_t lookups = 0;
};

// One BFS from `source`; the levels land in *out.
template <typename Offsets, typename Edges>
RunResult run_bfs(const Device& d, Offsets off, Edges edges, uint32_t source,
                  std::vector<uint32_t>* out) {
  WARPFS_CUDA_CHECK(cudaMemset(d.level, 0xff, d.n * sizeof(uint32_t)));
  WARPFS_CUDA_CHECK(cudaMemset(d.level + source, 0, sizeof(uint32_t)));
  WARPFS_CUDA_CHECK(cudaMemset(d.lookups, 0, sizeof *d.lookups));
  WARPFS_CUDA_CHECK(cudaDeviceSynchronize());
  const uint64_t warps = (d.n + kVerticesPerWarp - 1) / kVerticesPerWarp;
  const uint32_t block = 256;
  const auto grid = static_cast<uint32_t>((warps * 32 + block - 1) / block);
  RunResult r;
  cudaEvent_t a, b;
  WARPFS_CUDA_CHECK(cudaEventCreate(&a));
  WARPFS_CUDA_CHECK(cudaEventCreate(&b));
  WARPFS_CUDA_CHECK(cudaEventRecord(a));
  for (uint32_t cur = 0;; ++cur) {
    WARPFS_CUDA_CHECK(cudaMemsetAsync(d.changed, 0, sizeof(uint32_t)));
    bfs_level<<<grid, block>>>(off, edges, d.n, d.level, cur, d.changed, d.lookups);
    WARPFS_CUDA_CHECK(
        cudaMemcpyAsync(d.changed_host, d.changed, sizeof(uint32_t), cudaMemcpyDeviceToHost));
    spin_sync("a BFS level", 120);
    ++r.levels;
    if (*reinterpret_cast<volatile uint32_t*>(d.changed_host) == 0) break;
  }
  WARPFS_CUDA_CHECK(cudaEventRecord(b));
  spin_sync("the BFS", 10);
  float ms = 0;
  WARPFS_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  WARPFS_CUDA_CHECK(cudaEventDestroy(a));
  WARPFS_CUDA_CHECK(cudaEventDestroy(b));
  r.ms = ms;
  unsigned long long l = 0;
  WARPFS_CUDA_CHECK(cudaMemcpy(&l, d.lookups, sizeof l, cudaMemcpyDeviceToHost));
  r.lookups = l;
  out->resize(d.n);
  WARPFS_CUDA_CHECK(
      cudaMemcpy(out->data(), d.level, d.n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  return r;
}

// Per mode, summed over the runs that count.
struct Tally {
  int runs = 0;
  double ms = 0, ms_min = 1e300, ms_max = 0;
  uint64_t scanned = 0, levels = 0, lookups = 0, misses = 0, evictions = 0;
  void add(double t, uint64_t s, uint32_t lv, uint64_t lk, uint64_t mi, uint64_t ev) {
    ++runs;
    ms += t;
    ms_min = std::min(ms_min, t);
    ms_max = std::max(ms_max, t);
    scanned += s;
    levels += lv;
    lookups += lk;
    misses += mi;
    evictions += ev;
  }
};

uint32_t sets_for(uint64_t lines) {  // the smallest power of two with sets * 8 >= lines
  uint32_t s = 1;
  while (uint64_t{s} * 8 < lines) s *= 2;
  return s;
}

struct Options {
  uint32_t scale = 21, edge_factor = 16, nsources = 8, small_fraction = 4;
  int reps = 3;
  uint64_t seed = 42;
  uint16_t queues = 4;
  std::string write_dir;     // --write-graph
  std::string image;         // --image
  std::string dir = "/bfs";  // --dir
};

// NAME of a graph's files (see the header comment).
std::string graph_name(Kind kind, const Options& op) {
  return std::string(kind == Kind::kRmat ? "rmat" : "urand") + "-s" + std::to_string(op.scale) +
         "-e" + std::to_string(op.edge_factor) + "-" + std::to_string(op.seed);
}

// Writes `bytes` of `p` to a new file `path` (replacing one) and fsyncs it; false with a message.
bool write_file(const std::string& path, const void* p, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    std::perror(path.c_str());
    return false;
  }
  const auto* c = static_cast<const char*>(p);
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, c + done, std::min<uint64_t>(bytes - done, 1u << 20));
    if (n <= 0) {
      std::perror(path.c_str());
      ::close(fd);
      return false;
    }
    done += static_cast<uint64_t>(n);
  }
  const bool ok = ::fsync(fd) == 0;
  if (!ok) std::perror(path.c_str());
  return ::close(fd) == 0 && ok;
}

// --write-graph: the dataset as a user would copy it into a mounted warpfs.
int write_graph(Kind kind, const Options& op, const std::string& dev) {
  const Csr g = make_graph(kind, op.scale, op.edge_factor, op.seed);
  const std::string base = op.write_dir + "/" + graph_name(kind, op);
  const auto t0 = std::chrono::steady_clock::now();
  const uint64_t off_bytes = (g.n + 1) * sizeof(uint64_t), adj_bytes = g.adj.size() * 4;
  if (!write_file(base + ".off", g.off.data(), off_bytes) ||
      !write_file(base + ".adj", g.adj.data(), adj_bytes)) {
    return 1;
  }
  const double s = seconds_since(t0);
  std::printf(
      "{\"bench\":\"gpu_bfs_write\",\"device\":\"%s\",\"files\":\"%s.{off,adj}\","
      "\"bytes\":%llu,\"seconds\":%.3f,\"mb_s\":%.1f}\n",
      dev.c_str(), base.c_str(), (unsigned long long)(off_bytes + adj_bytes), s,
      (off_bytes + adj_bytes) / s / 1e6);
  return 0;
}

// The whole benchmark on one graph; returns the number of runs that failed a check.
int run_graph(Kind kind, const Options& op, const std::string& dev) {
  const char* gname = kind == Kind::kRmat ? "rmat" : "urand";
  const uint32_t scale = op.scale, edge_factor = op.edge_factor, nsources = op.nsources;
  const uint32_t small_fraction = op.small_fraction;
  const int reps = op.reps;
  const uint64_t seed = op.seed;
  const uint16_t queues = op.queues;

  // 1. The graph, written into the image.
  auto t0 = std::chrono::steady_clock::now();
  const Csr g = make_graph(kind, scale, edge_factor, seed);
  const double gen_s = seconds_since(t0);
  Header h{kMagic, g.n, g.adj.size(), 1, 0, static_cast<uint64_t>(kind), scale, edge_factor, seed};
  const uint64_t off_bytes = (g.n + 1) * sizeof(uint64_t);
  const uint64_t off_lines = (off_bytes + kLine - 1) / kLine;
  const uint64_t edge_bytes = g.adj.size() * sizeof(uint32_t);
  const uint64_t edge_lines = (edge_bytes + kLine - 1) / kLine;
  h.edges_line = h.offsets_line + off_lines;
  const uint64_t graph_lines = off_lines + edge_lines;
  auto store = nvme::BackingStore::ram((1 + graph_lines) * kLine);
  if (!store->write(0, &h, sizeof h).is_ok() ||
      !store->write(h.offsets_line * kLine, g.off.data(), off_bytes).is_ok() ||
      !store->write(h.edges_line * kLine, g.adj.data(), edge_bytes).is_ok()) {
    std::fprintf(stderr, "warpfs-bench-gpu-bfs: writing the graph into the RAM store failed\n");
    std::exit(1);
  }
  // Sources: degree > 2, drawn by hash.
  std::vector<uint32_t> sources;
  for (uint64_t k = 0; sources.size() < nsources && k < 1000 * uint64_t{nsources}; ++k) {
    const auto v = static_cast<uint32_t>(mix(seed * 31 + k) % g.n);
    if (g.degree(v) > 2 && std::find(sources.begin(), sources.end(), v) == sources.end()) {
      sources.push_back(v);
    }
  }
  if (sources.size() < nsources) {
    std::fprintf(stderr, "warpfs-bench-gpu-bfs: found only %zu sources of degree > 2\n",
                 sources.size());
    std::exit(1);
  }
  uint64_t max_degree = 0;
  for (uint64_t v = 0; v < g.n; ++v) max_degree = std::max(max_degree, g.degree(v));
  std::printf(
      "{\"bench\":\"gpu_bfs_graph\",\"device\":\"%s\",\"graph\":\"%s\",\"scale\":%u,"
      "\"edge_factor\":%u,\"seed\":%llu,\"vertices\":%llu,\"adjacency\":%llu,"
      "\"offsets_lines\":%llu,\"edges_lines\":%llu,\"graph_bytes\":%llu,"
      "\"max_degree\":%llu,\"generate_s\":%.2f}\n",
      dev.c_str(), gname, scale, edge_factor, (unsigned long long)seed, (unsigned long long)g.n,
      (unsigned long long)g.adj.size(), (unsigned long long)off_lines,
      (unsigned long long)edge_lines, (unsigned long long)(graph_lines * kLine),
      (unsigned long long)max_degree, gen_s);
  std::fflush(stdout);

  // 2. The rig, the caches, GPU memory.
  gpu::RigOptions o;
  o.queues = queues;
  o.device_threads = queues;
  std::string err;
  auto rig = gpu::Rig::open(o, store, &err);
  if (!rig) {
    std::fprintf(stderr, "warpfs-bench-gpu-bfs: %s\n", err.c_str());
    std::exit(1);
  }
  // Large: every line of the graph fits (at most ceil(lines / sets) <= 8 per set: sequential
  // blocks spread evenly). Small: about 1/small_fraction of the graph.
  const uint32_t big_sets = sets_for(graph_lines);
  uint32_t small_sets = 1;
  while (uint64_t{small_sets} * 2 * 8 * small_fraction <= graph_lines) small_sets *= 2;
  auto big = gpu::GpuCache::create(*rig, {big_sets, 8, kLine}, &err);
  auto small = big ? gpu::GpuCache::create(*rig, {small_sets, 8, kLine}, &err) : nullptr;
  if (!big || !small) {
    std::fprintf(stderr, "warpfs-bench-gpu-bfs: %s\n", err.c_str());
    std::exit(1);
  }
  Device d;
  d.n = g.n;
  WARPFS_CUDA_CHECK(cudaMalloc(&d.level, g.n * sizeof(uint32_t)));
  WARPFS_CUDA_CHECK(cudaMalloc(&d.lookups, sizeof *d.lookups));
  WARPFS_CUDA_CHECK(cudaMalloc(&d.changed, sizeof(uint32_t)));
  WARPFS_CUDA_CHECK(cudaHostAlloc(&d.changed_host, sizeof(uint32_t), cudaHostAllocDefault));
  // Memory mode's copy, read back from the namespace's store (the image, not the generator).
  uint64_t* m_off = nullptr;
  uint32_t* m_adj = nullptr;
  {
    std::vector<uint64_t> off(g.n + 1);
    std::vector<uint32_t> adj(g.adj.size());
    Header back{};
    if (!store->read(0, &back, sizeof back).is_ok() || back.magic != kMagic ||
        !store->read(back.offsets_line * kLine, off.data(), off_bytes).is_ok() ||
        !store->read(back.edges_line * kLine, adj.data(), edge_bytes).is_ok()) {
      std::fprintf(stderr, "warpfs-bench-gpu-bfs: reading the graph back from the store failed\n");
      std::exit(1);
    }
    WARPFS_CUDA_CHECK(cudaMalloc(&m_off, off_bytes));
    WARPFS_CUDA_CHECK(cudaMalloc(&m_adj, std::max<uint64_t>(edge_bytes, 4)));
    WARPFS_CUDA_CHECK(cudaMemcpy(m_off, off.data(), off_bytes, cudaMemcpyHostToDevice));
    WARPFS_CUDA_CHECK(cudaMemcpy(m_adj, adj.data(), edge_bytes, cudaMemcpyHostToDevice));
  }
  const InMemory<uint64_t> mem_off{m_off};
  const InMemory<uint32_t> mem_adj{m_adj};
  const gpu::array<uint64_t> big_off(big->view(), g.n + 1, h.offsets_line);
  const gpu::array<uint32_t> big_adj(big->view(), g.adj.size(), h.edges_line);
  const gpu::array<uint64_t> small_off(small->view(), g.n + 1, h.offsets_line);
  const gpu::array<uint32_t> small_adj(small->view(), g.adj.size(), h.edges_line);

  // 2b. The same graph from the files of a warpfs image (--image).
  gpu::GpuCache* file_cache = nullptr;
#ifdef WARPFS_BFS_FILES
  std::unique_ptr<gpu::Volume> vol;
  gpu::file_array<uint64_t> file_off;
  gpu::file_array<uint32_t> file_adj;
  uint64_t file_off_blocks = 0, file_adj_blocks = 0;
  if (!op.image.empty()) {
    gpu::VolumeOptions vo;
    vo.rig = o;
    vo.cache = {big_sets * 2, 8, kLine};
    vol = gpu::Volume::open(op.image, vo, &err);
    const std::string base = op.dir + "/" + graph_name(kind, op);
    if (!vol || vol->open_array(base + ".off", false, &file_off, &err) != 0 ||
        vol->open_array(base + ".adj", false, &file_adj, &err) != 0) {
      std::fprintf(stderr, "warpfs-bench-gpu-bfs: %s: %s\n", op.image.c_str(), err.c_str());
      std::exit(1);
    }
    if (file_off.size() != g.n + 1 || file_adj.size() != g.adj.size()) {
      std::fprintf(stderr,
                   "warpfs-bench-gpu-bfs: %s%s.{off,adj} hold %llu and %llu elements, not the "
                   "generated graph's %llu and %llu (write it with --write-graph and the same "
                   "--scale, --edge-factor, --seed)\n",
                   op.dir.c_str(), graph_name(kind, op).c_str(),
                   (unsigned long long)file_off.size(), (unsigned long long)file_adj.size(),
                   (unsigned long long)(g.n + 1), (unsigned long long)g.adj.size());
      std::exit(1);
    }
    file_cache = &vol->cache();
    file_off_blocks = (file_off.size() * 8 + kLine - 1) / kLine;
    file_adj_blocks = (file_adj.size() * 4 + kLine - 1) / kLine;
    uint64_t holes = 0;
    for (const auto& f : vol->files()) holes += f->holes;
    std::printf(
        "{\"bench\":\"gpu_bfs_files\",\"device\":\"%s\",\"graph\":\"%s\",\"image\":\"%s\","
        "\"files\":\"%s.{off,adj}\",\"blocks\":%llu,\"holes\":%llu,\"cache_lines\":%llu}\n",
        dev.c_str(), gname, op.image.c_str(), base.c_str(),
        (unsigned long long)(file_off_blocks + file_adj_blocks), (unsigned long long)holes,
        (unsigned long long)file_cache->lines());
    std::fflush(stdout);
  }
#endif

  // 3. The runs. Memory and warm: the median of `reps` after one warm-up; cold: one each.
  enum Mode { kMemory, kWarm, kCold, kColdSmall, kFileWarm, kFileCold, kModes };
  const char* names[kModes] = {"memory", "warm", "cold", "cold_small", "file_warm", "file_cold"};
  const uint64_t file_lines = file_cache ? file_cache->lines() : 0;
  const uint64_t cache_lines[kModes] = {0,          big->lines(), big->lines(), small->lines(),
                                        file_lines, file_lines};
  Tally tally[kModes];
  int failures = 0;
  std::vector<uint32_t> got;
  for (uint32_t source : sources) {
    uint64_t scanned = 0;
    uint32_t depth = 0;
    const std::vector<uint32_t> want = cpu_bfs(g, source, &scanned, &depth);
    for (int mode = 0; mode < kModes; ++mode) {
      const bool file = mode == kFileWarm || mode == kFileCold;
      if (file && file_cache == nullptr) continue;
      gpu::GpuCache* c = mode == kMemory      ? nullptr
                         : mode == kColdSmall ? small.get()
                         : file               ? file_cache
                                              : big.get();
      const bool cold = mode == kCold || mode == kColdSmall || mode == kFileCold;
      if (mode == kWarm) {  // BaM's (2): the whole graph in the cache first
        big->invalidate();
        const uint64_t threads = graph_lines;
        touch_lines<<<static_cast<uint32_t>((threads + 255) / 256), 256>>>(big_off, off_lines,
                                                                           big_adj, edge_lines);
        gpu::sync_or_die("touch_lines", 120);
      }
#ifdef WARPFS_BFS_FILES
      if (mode == kFileWarm) {
        file_cache->invalidate();
        const uint64_t threads = file_off_blocks + file_adj_blocks;
        touch_lines<<<static_cast<uint32_t>((threads + 255) / 256), 256>>>(
            file_off, file_off_blocks, file_adj, file_adj_blocks);
        gpu::sync_or_die("touch_lines (files)", 120);
      }
#endif
      std::vector<double> times;
      RunResult last;
      gpu::GpuCacheStats st;
      for (int rep = 0; rep <= (cold ? 0 : reps); ++rep) {
        if (c != nullptr) {
          if (cold) c->invalidate();
          c->reset_stats();
        }
        switch (mode) {
          case kMemory:
            last = run_bfs(d, mem_off, mem_adj, source, &got);
            break;
          case kColdSmall:
            last = run_bfs(d, small_off, small_adj, source, &got);
            break;
#ifdef WARPFS_BFS_FILES
          case kFileWarm:
          case kFileCold:
            last = run_bfs(d, file_off, file_adj, source, &got);
            break;
#endif
          default:
            last = run_bfs(d, big_off, big_adj, source, &got);
            break;
        }
        if (c != nullptr) st = c->stats();
        uint64_t wrong = 0;
        for (uint64_t v = 0; v < g.n; ++v) wrong += got[v] != want[v];
        if (wrong != 0 || st.errors != 0 ||
            ((mode == kWarm || mode == kFileWarm) && st.misses != 0)) {
          std::fprintf(stderr,
                       "warpfs-bench-gpu-bfs: source %u, %s: %llu vertices on the wrong "
                       "level, %llu I/O errors, %llu misses\n",
                       source, names[mode], (unsigned long long)wrong,
                       (unsigned long long)st.errors, (unsigned long long)st.misses);
          ++failures;
        }
        if (cold || rep > 0) times.push_back(last.ms);
      }
      const double ms = gb::median(times);
      tally[mode].add(ms, scanned, last.levels, last.lookups, st.misses, st.evictions);
      std::printf(
          "{\"bench\":\"gpu_bfs_run\",\"device\":\"%s\",\"graph\":\"%s\",\"mode\":\"%s\","
          "\"source\":%u,"
          "\"depth\":%u,\"levels\":%u,\"edges_traversed\":%llu,\"ms\":%.3f,\"teps\":%.4g,"
          "\"cache_lines\":%llu,\"lookups\":%llu,\"misses\":%llu,\"evictions\":%llu}\n",
          dev.c_str(), gname, names[mode], source, depth, last.levels, (unsigned long long)scanned,
          ms, scanned / (ms / 1e3), (unsigned long long)cache_lines[mode],
          (unsigned long long)last.lookups, (unsigned long long)st.misses,
          (unsigned long long)st.evictions);
      std::fflush(stdout);
    }
  }
  const double mem_ms = tally[kMemory].ms / tally[kMemory].runs;
  for (int mode = 0; mode < kModes; ++mode) {
    const Tally& t = tally[mode];
    if (t.runs == 0) continue;  // the file modes without --image
    const double ms = t.ms / t.runs;
    const double teps = t.scanned / (t.ms / 1e3);
    std::printf(
        "{\"bench\":\"gpu_bfs\",\"device\":\"%s\",\"graph\":\"%s\",\"mode\":\"%s\",\"scale\":%u,"
        "\"edge_factor\":%u,\"vertices\":%llu,\"adjacency\":%llu,\"graph_lines\":%llu,"
        "\"cache_lines\":%llu,\"queues\":%u,\"controller_threads\":%u,\"sources\":%d,"
        "\"ms_mean\":%.3f,\"ms_min\":%.3f,\"ms_max\":%.3f,\"edges_traversed_mean\":%.0f,"
        "\"teps\":%.4g,\"teps_graph500\":%.4g,\"lookups\":%llu,\"misses\":%llu,"
        "\"evictions\":%llu,\"hit_rate\":%.5f,\"lines_read_per_s\":%.4g,"
        "\"ratio_to_memory\":%.2f}\n",
        dev.c_str(), gname, names[mode], scale, edge_factor, (unsigned long long)g.n,
        (unsigned long long)g.adj.size(), (unsigned long long)graph_lines,
        (unsigned long long)cache_lines[mode], queues, queues, t.runs, ms, t.ms_min, t.ms_max,
        double(t.scanned) / t.runs, teps, teps / 2, (unsigned long long)t.lookups,
        (unsigned long long)t.misses, (unsigned long long)t.evictions,
        t.lookups ? 1.0 - double(t.misses) / double(t.lookups) : 1.0, t.misses / (t.ms / 1e3),
        ms / mem_ms);
  }
  std::fflush(stdout);
  WARPFS_CUDA_CHECK(cudaFree(m_off));
  WARPFS_CUDA_CHECK(cudaFree(m_adj));
  WARPFS_CUDA_CHECK(cudaFree(d.level));
  WARPFS_CUDA_CHECK(cudaFree(d.lookups));
  WARPFS_CUDA_CHECK(cudaFree(d.changed));
  WARPFS_CUDA_CHECK(cudaFreeHost(d.changed_host));
  small.reset();
  big.reset();
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  Options op;
  std::vector<Kind> graphs = {Kind::kRmat, Kind::kUrand};
  for (int i = 1; i < argc; ++i) {
    auto arg = [&](const char* name) { return !std::strcmp(argv[i], name) && i + 1 < argc; };
    if (arg("--graphs")) {
      graphs.clear();
      const std::string list = argv[++i];
      if (list.find("rmat") != std::string::npos) graphs.push_back(Kind::kRmat);
      if (list.find("urand") != std::string::npos) graphs.push_back(Kind::kUrand);
    } else if (arg("--scale"))
      op.scale = static_cast<uint32_t>(std::atoi(argv[++i]));
    else if (arg("--edge-factor"))
      op.edge_factor = static_cast<uint32_t>(std::atoi(argv[++i]));
    else if (arg("--sources"))
      op.nsources = static_cast<uint32_t>(std::atoi(argv[++i]));
    else if (arg("--reps"))
      op.reps = std::atoi(argv[++i]);
    else if (arg("--seed"))
      op.seed = std::strtoull(argv[++i], nullptr, 0);
    else if (arg("--queues"))
      op.queues = static_cast<uint16_t>(std::atoi(argv[++i]));
    else if (arg("--small-fraction"))
      op.small_fraction = static_cast<uint32_t>(std::atoi(argv[++i]));
    else if (arg("--write-graph"))
      op.write_dir = argv[++i];
    else if (arg("--image"))
      op.image = argv[++i];
    else if (arg("--dir"))
      op.dir = argv[++i];
    else if (!std::strcmp(argv[i], "--quick"))
      op.scale = 17, op.nsources = 2, op.reps = 2;
    else {
      std::fprintf(stderr,
                   "usage: warpfs-bench-gpu-bfs [--quick] [--graphs rmat,urand] [--scale S] "
                   "[--edge-factor E] [--sources N] [--reps N] [--seed X] [--queues Q] "
                   "[--small-fraction F] [--write-graph DIR | --image IMAGE [--dir /D]]\n");
      return 2;
    }
  }
  if (graphs.empty() || op.scale < 4 || op.scale > 30 || op.edge_factor == 0 || op.nsources == 0 ||
      op.reps < 1 || op.queues == 0 || op.small_fraction == 0) {
    std::fprintf(stderr,
                 "warpfs-bench-gpu-bfs: graphs rmat and/or urand, scale 4..30, other "
                 "counts >= 1\n");
    return 2;
  }
#ifndef WARPFS_BFS_FILES
  if (!op.image.empty()) {
    std::fprintf(stderr, "warpfs-bench-gpu-bfs: --image needs a build with the filesystem core\n");
    return 2;
  }
#endif
  if (!op.write_dir.empty()) {  // no GPU needed
    int failed = 0;
    for (Kind k : graphs) failed += write_graph(k, op, "host");
    return failed ? 1 : 0;
  }
  const std::string dev = gb::device_name();
  int failures = 0;
  for (Kind k : graphs) failures += run_graph(k, op, dev);
  if (failures != 0) {
    std::fprintf(stderr, "warpfs-bench-gpu-bfs: %d runs FAILED the check\n", failures);
    return 1;
  }
  return 0;
}
