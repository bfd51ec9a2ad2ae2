#include "ops/buffer.h"

#include <exception>
#include <utility>

#include "ops/error.h"
#include "ops/log.h"

namespace dstrain {

Buffer::Buffer(Allocator& allocator, std::size_t bytes, MemoryPurpose purpose, std::size_t alignment)
    : allocator_(&allocator), data_(allocator.allocate(bytes, purpose, alignment)), bytes_(bytes), purpose_(purpose) {}

Buffer::~Buffer() { reset(); }

Buffer::Buffer(Buffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      purpose_(other.purpose_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    allocator_ = std::exchange(other.allocator_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    purpose_ = other.purpose_;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (data_ != nullptr && allocator_ != nullptr) {
    // A destructor must not throw; deallocate can only fail here if the device reports an error
    // from earlier asynchronous work (CUDA), which is worth a line but not a terminate().
    try {
      allocator_->deallocate(data_);
    } catch (const std::exception& e) {
      log_error("freeing a {} buffer of {} bytes failed: {}", memory_purpose_name(purpose_), bytes_, e.what());
    }
  }
  data_ = nullptr;
  bytes_ = 0;
}

Tensor Buffer::tensor(DType dtype, Shape shape, std::size_t byte_offset) const {
  const std::size_t elem = dtype_size(dtype);
  const auto numel = static_cast<std::size_t>(shape.numel());
  DSTRAIN_CHECK(elem != 0 && byte_offset % elem == 0, "Buffer::tensor: byte offset {} is not a multiple of the {} element size {}", byte_offset,
                dtype_name(dtype), elem);
  const std::size_t need = numel * elem;
  DSTRAIN_CHECK(byte_offset <= bytes_ && need / elem == numel && need <= bytes_ - byte_offset,
                "Buffer::tensor: a {}{} view at byte offset {} needs {} bytes but the {} buffer has {}; "
                "allocate a larger buffer or view fewer elements",
                dtype_name(dtype), shape.str(), byte_offset, numel * elem, memory_purpose_name(purpose_), bytes_);
  void* p = data_ == nullptr ? nullptr : static_cast<char*>(data_) + byte_offset;
  return Tensor(p, dtype, shape, device());
}

}  // namespace dstrain
