// xxHash, header-only (XXH_INLINE_ALL): the hash functions inline into their callers, no
// library to link (the GPU machine builds the core with xxhash.h alone), and the streaming
// state may live on the stack. GCC's -Warray-bounds misreads the bounds arithmetic in
// XXH64_update's short-input path once it is inlined next to a small buffer; the warning is
// silenced for this header's code only.
#pragma once

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#include <xxhash.h>
#pragma GCC diagnostic pop
#else
#include <xxhash.h>  // clang (the fuzz build) does not misread it
#endif
