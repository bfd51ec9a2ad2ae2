// Runs a fuzz input's reader on a thread with a small stack, so that a recursion without bound
// overflows at a depth the fuzzer reaches.
//
// Why: a reader that recurses once per nesting level (the pickle's values destroyed recursively, a
// tokenizer's Sequence steps parsed recursively) overflowed the main thread's 8 MiB stack at
// 100,000-200,000 levels. A fuzz input may expand to kMaxExpandedBytes (fuzz_expand.h), 64 KiB,
// so that each input stays fast: about 30,000 levels. On a 256 KiB stack, a thirty-second of the
// main thread's, those overflow as the 100,000 did; the readers' bounded work (nlohmann's parser
// and destructor are iterative, our recursions stop at kMaxTokenizerNesting) fits in it.
#pragma once

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

namespace dstrain::fuzz {

constexpr std::size_t kReaderStackBytes = std::size_t{256} << 10;

inline void run_on_small_stack(const std::function<void()>& reader) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kReaderStackBytes);
  pthread_t thread;
  auto body = [](void* arg) -> void* {
    (*static_cast<const std::function<void()>*>(arg))();
    return nullptr;
  };
  if (pthread_create(&thread, &attr, body, const_cast<std::function<void()>*>(&reader)) != 0) {
    std::fputs("fuzz: cannot start the reader's thread\n", stderr);
    std::abort();
  }
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

}  // namespace dstrain::fuzz
