// A ds_config as DeepSpeed users write it: Hjson/JSON text (duplicate keys checked, as for a
// file), then the whole typed parse for 1 and 4 ranks.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "config_schema/ds_config.h"
#include "fuzz_expand.h"
#include "config_schema/hjson_reader.h"
#include "ops/error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string expanded = dstrain::fuzz::expand_repeats(data, size);  // deep nesting (fuzz_expand.h)
  const std::string_view text(expanded);
  try {
    dstrain::HjsonOptions opts;
    opts.reject_duplicate_keys = true;
    const nlohmann::ordered_json tree = dstrain::parse_hjson(text, opts);
    for (const std::int64_t world : {1, 4}) {
      try {
        dstrain::config::ConfigOptions o;
        o.world_size = world;
        (void)dstrain::config::parse_ds_config(tree, o);
      } catch (const dstrain::Error&) {
      }
    }
  } catch (const dstrain::Error&) {
  }
  return 0;
}
