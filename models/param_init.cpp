#include "models/param_init.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "ops/error.h"

namespace dstrain {
namespace {

// FNV-1a, 32 bits: a stable hash of the parameter name (std::hash is not the same everywhere).
std::uint32_t fnv1a(std::string_view s) {
  std::uint32_t h = 2166136261u;
  for (char ch : s) {
    h ^= static_cast<unsigned char>(ch);
    h *= 16777619u;
  }
  return h;
}

// Site 0xffff is reserved for init streams: dropout sites are 0 .. kRngSitesPerLayer-1, far below.
constexpr std::uint32_t kInitSite = 0xffffu;

}  // namespace

RngKey param_init_key(std::string_view name, std::uint64_t seed) {
  RngKey k;
  k.seed = seed;
  k.step = fnv1a(name);
  k.site = kInitSite;
  k.micro_batch = 0;
  return k;
}

void init_param(Tensor param, const ParamSpec& spec, std::uint64_t seed) {
  if (spec.tied())
    fail("init_param: '{}' is tied to '{}' and has no storage of its own; initialise '{}' instead", spec.name, spec.tied_to, spec.tied_to);
  if (!(param.shape == spec.shape)) fail("init_param: '{}' has shape {} but its spec says {}", spec.name, param.shape.str(), spec.shape.str());
  if (!is_floating(param.dtype)) fail("init_param: '{}' has dtype {}; parameters are fp32, fp16 or bf16", spec.name, dtype_name(param.dtype));
  if (!param.device.is_cpu())
    fail("init_param: '{}' is on {}; initialise on the cpu (e.g. the fp32 master copy) and copy over", spec.name, param.device.str());

  const std::int64_t n = param.numel();
  std::vector<float> values(static_cast<std::size_t>(n), 0.0f);
  switch (spec.init.kind) {
    case ParamInit::Kind::zeros:
      break;
    case ParamInit::Kind::ones:
      std::fill(values.begin(), values.end(), 1.0f);
      break;
    case ParamInit::Kind::normal: {
      const std::int64_t rows = spec.shape.rank == 0 ? 1 : spec.shape[0];
      const std::int64_t row_len = rows == 0 ? 0 : n / rows;
      const std::int64_t drawn_rows = spec.init.rows < 0 ? rows : std::min(spec.init.rows, rows);
      const std::int64_t drawn = drawn_rows * row_len;
      const RngKey key = param_init_key(spec.name, seed);
      const double std = spec.init.std;
      for (std::int64_t pair = 0; 2 * pair < drawn; ++pair) {
        const PhiloxCounter w = key.group_bits(static_cast<std::uint64_t>(pair));
        // u1 in (0, 1] so log(u1) is finite; u2 in [0, 1).
        const double u1 = (static_cast<double>(w.v[0] >> 8) + 1.0) * 0x1p-24;
        const double u2 = static_cast<double>(w.v[1] >> 8) * 0x1p-24;
        const double r = std::sqrt(-2.0 * std::log(u1));
        const double a = 2.0 * std::numbers::pi * u2;
        values[static_cast<std::size_t>(2 * pair)] = static_cast<float>(std * r * std::cos(a));
        if (2 * pair + 1 < drawn) values[static_cast<std::size_t>(2 * pair + 1)] = static_cast<float>(std * r * std::sin(a));
      }
      break;
    }
  }
  convert(values.data(), DType::fp32, param.data, param.dtype, static_cast<std::size_t>(n));
}

}  // namespace dstrain
