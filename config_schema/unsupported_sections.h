// Sections DeepSpeed reads that dstrain does not provide (compression, 1-bit
// communication, curriculum learning, ...). They are validated where DeepSpeed validates them and
// always produce a warning when present and active: never silently dropped.
#pragma once

#include <string>
#include <vector>

#include "config_schema/field_spec.h"
#include "config_schema/section_reader.h"

namespace dstrain::config {

struct IgnoredSection {
  std::string key;  // top-level key, e.g. "sparse_attention"
  Json value;       // as given
  bool active;      // present and enabled (false: present but disabled, e.g. {"enabled": false})
};

// hybrid_engine is a pydantic model in DeepSpeed: its keys are validated like regime-B sections.
SectionSpec hybrid_engine_section_spec();

// The top-level keys handled here.
const std::vector<std::string>& unsupported_section_keys();

// Validates and warns about every unsupported section present in `root`; throws where DeepSpeed
// would reject the section (e.g. eigenvalue.enabled, an unknown
// sparse_attention mode).
std::vector<IgnoredSection> check_unsupported_sections(const Json& root, ParseContext& ctx);

}  // namespace dstrain::config
