#include "ops/dtype.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "ops/error.h"

namespace dstrain {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::fp32:
      return "fp32";
    case DType::fp16:
      return "fp16";
    case DType::bf16:
      return "bf16";
    case DType::int32:
      return "int32";
    case DType::uint16:
      return "uint16";
    case DType::fp64:
      return "fp64";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s.starts_with("torch.")) s = s.substr(6);
  if (s == "fp32" || s == "float32" || s == "float") return DType::fp32;
  if (s == "fp16" || s == "float16" || s == "half") return DType::fp16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  if (s == "int32" || s == "int") return DType::int32;
  if (s == "uint16") return DType::uint16;
  fail("unknown dtype '{}': use fp32 (float32), fp16 (float16, half), bf16 (bfloat16), int32 or uint16", name);
}

namespace {

template <typename Src, typename Dst>
void convert_typed(const Src* src, Dst* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Dst(static_cast<float>(src[i]));
}

template <typename Src>
void convert_from(const Src* src, void* dst, DType dst_type, std::size_t n) {
  switch (dst_type) {
    case DType::fp32:
      convert_typed(src, static_cast<float*>(dst), n);
      return;
    case DType::fp16:
      convert_typed(src, static_cast<fp16_t*>(dst), n);
      return;
    case DType::bf16:
      convert_typed(src, static_cast<bf16_t*>(dst), n);
      return;
    default:
      fail("convert: destination dtype {} is not floating point", dtype_name(dst_type));
  }
}

}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n) {
  DSTRAIN_CHECK(is_floating(src_type) && is_floating(dst_type),
                "convert: {} -> {} is not a floating-point conversion; convert() takes fp32, fp16 or bf16 "
                "(integer token ids are copied, not converted)",
                dtype_name(src_type), dtype_name(dst_type));
  if (n == 0) return;
  DSTRAIN_CHECK(src != nullptr && dst != nullptr, "convert: null pointer for {} elements ({} -> {})", n, dtype_name(src_type), dtype_name(dst_type));
  if (src_type == dst_type) {
    std::memmove(dst, src, n * dtype_size(src_type));
    return;
  }
  switch (src_type) {
    case DType::fp32:
      convert_from(static_cast<const float*>(src), dst, dst_type, n);
      return;
    case DType::fp16:
      convert_from(static_cast<const fp16_t*>(src), dst, dst_type, n);
      return;
    case DType::bf16:
      convert_from(static_cast<const bf16_t*>(src), dst, dst_type, n);
      return;
    default:
      fail("convert: source dtype {} is not floating point", dtype_name(src_type));
  }
}

}  // namespace dstrain
