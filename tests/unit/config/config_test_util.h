// Helpers for the config tests: parse a JSON literal, capture an error message, find a warning.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "config_schema/ds_config.h"
#include "ops/error.h"

namespace dstrain::config::testing {

inline DsConfig parse(const std::string& text, std::int64_t world = 1, const AutoValues& autos = {}) {
  ConfigOptions o;
  o.world_size = world;
  o.autos = autos;
  return parse_ds_config(Json::parse(text), o);
}

// The Error message of parsing `text`, or "<no error>".
inline std::string error_of(const std::string& text, std::int64_t world = 1, const AutoValues& autos = {}) {
  try {
    parse(text, world, autos);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

inline bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

// The first warning at `path` whose message contains `text`, or nullptr.
inline const Warning* find_warning(const DsConfig& c, const std::string& path, const std::string& text = "") {
  for (const auto& w : c.warnings)
    if (w.path == path && contains(w.message, text)) return &w;
  return nullptr;
}

}  // namespace dstrain::config::testing

#define EXPECT_ERROR(text, needle)                                                          \
  do {                                                                                      \
    const std::string msg_ = ::dstrain::config::testing::error_of(text);                    \
    EXPECT_TRUE(::dstrain::config::testing::contains(msg_, needle)) << "message: " << msg_; \
  } while (0)
