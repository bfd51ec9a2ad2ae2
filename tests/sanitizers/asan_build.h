// Whether this test program is built with AddressSanitizer (scripts/gates.sh asan). GCC defines
// __SANITIZE_ADDRESS__; clang (before 16) only answers __has_feature(address_sanitizer). The gate
// builds the dstrain binary the CLI tests start the same way as the test itself.
#pragma once

namespace dstrain::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif
#else
inline constexpr bool kAddressSanitizer = false;
#endif

}  // namespace dstrain::testing
