// Debug checks of preconditions: the `// REQUIRES:` comments of every layer, as code.
//
// WARPFS_DCHECK(cond, "what") states that `cond` holds. Compiled in (the CMake option
// WARPFS_DEBUG_CHECKS, on by default in sanitizer and Debug builds, off in Release), a false
// `cond` prints "file:line: check failed: cond (what)" to stderr and aborts (a device thread
// prints and traps). Compiled out, `cond` is not evaluated and costs nothing, but it is still
// compiled: it must stay well-formed, and the variables it names count as used.
//
// A check states a caller's obligation, never an outcome the caller may meet (a bad image,
// an I/O error): those are errors returned as values (status.h). A condition that only a
// debug build can see (a lock's owner) lives behind the same switch: WARPFS_DEBUG_CHECKS is
// defined to 1 or 0 for every translation unit of the build, host and CUDA alike, and
// port::kDebugChecks says which (tests skip what a build without checks cannot show).
//
// Usable from host and device code (WARPFS_HD); allocates nothing; thread-safe.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "warpfs/nvme/port.h"

#ifndef WARPFS_DEBUG_CHECKS
#define WARPFS_DEBUG_CHECKS 0
#endif

namespace warpfs::port {

inline constexpr bool kDebugChecks = WARPFS_DEBUG_CHECKS != 0;

#if WARPFS_DEBUG_CHECKS
// The failure path of WARPFS_DCHECK: out of line in spirit (cold), never returns.
[[noreturn]] WARPFS_HD inline void check_failed(const char* file, int line, const char* cond,
                                                const char* what) {
#if defined(__CUDA_ARCH__)
  printf("%s:%d: check failed: %s (%s)\n", file, line, cond, what);
  __trap();
#else
  std::fprintf(stderr, "%s:%d: check failed: %s (%s)\n", file, line, cond, what);
  std::fflush(stderr);
  std::abort();
#endif
}
#endif

}  // namespace warpfs::port

#if WARPFS_DEBUG_CHECKS
#define WARPFS_DCHECK(cond, what)               \
  (__builtin_expect(static_cast<bool>(cond), 1) \
       ? static_cast<void>(0)                   \
       : ::warpfs::port::check_failed(__FILE__, __LINE__, #cond, what))
#else
// sizeof: an unevaluated operand, so `cond` is type-checked and its names count as used.
#define WARPFS_DCHECK(cond, what) static_cast<void>(sizeof(static_cast<bool>(cond)))
#endif
