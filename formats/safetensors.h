// safetensors (Hugging Face's weight file format): reader and atomic writer.
//
// Layout: 8 bytes little-endian u64 N, then N bytes of JSON header
//   {"name": {"dtype": "F32", "shape": [768, 2304], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}                       (metadata optional, strings only)
// then the data section; offsets are relative to its start, end exclusive, row-major, little-endian.
//
// The reader checks everything before any data is used: the header length against the file size,
// JSON syntax, each entry's dtype name, shape, and that end - begin = numel * dtype size, that
// every range lies inside the data section and that no two ranges overlap. Every Error names the
// file and, where there is one, the tensor. Files are memory-mapped, read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/dtype.h"
#include "ops/tensor.h"

namespace dstrain {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 // as in the file: "F32", "F16", "BF16", "F64", "I64", "U8", "BOOL", ...
  std::vector<std::int64_t> shape;   // any rank, () for a scalar
  std::uint64_t begin = 0, end = 0;  // byte range in the data section

  std::int64_t numel() const;
};

// The dstrain DType of a safetensors dtype name: F32, F16, BF16 (the floating types dstrain
// stores). Throws Error naming the dtype, `file` and `tensor` otherwise.
DType safetensors_dtype(std::string_view dtype, std::string_view file, std::string_view tensor);
// "F32", "F16", "BF16" for fp32 / fp16 / bf16; Error for the others.
std::string_view safetensors_dtype_name(DType dtype);

class SafetensorsFile {
 public:
  // Maps and validates the file. Throws Error naming the file and what is wrong.
  explicit SafetensorsFile(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // In the order of their data offsets.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  const SafetensorsEntry* find(std::string_view name) const;  // nullptr if absent
  // The raw little-endian bytes of one entry.
  std::span<const std::byte> bytes(const SafetensorsEntry& e) const;
  // Converts an F32 / F16 / BF16 entry to fp32 values (Error for other dtypes).
  std::vector<float> read_fp32(const SafetensorsEntry& e) const;

 private:
  std::filesystem::path path_;
  void* map_ = nullptr;
  std::size_t map_size_ = 0;
  const std::byte* data_ = nullptr;  // start of the data section
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: a contiguous CPU tensor of fp32 / fp16 / bf16, stored with its own dtype
// and `shape` (the tensor's shape when empty; the element counts must agree).
struct SafetensorsWriteItem {
  std::string name;
  Tensor tensor;
  std::vector<std::int64_t> shape;
};

// Writes the tensors in the given order (no gaps), the header padded with spaces to a multiple of
// 8 bytes as Hugging Face's writer does, to a temporary file in the same folder, flushed to disk,
// then renamed over `path`: a crash leaves either the old file or the new one, never a torn one.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsWriteItem> items,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dstrain
