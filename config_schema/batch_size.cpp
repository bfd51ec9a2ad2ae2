#include "config_schema/batch_size.h"

#include <string>

#include <fmt/format.h>

#include "ops/error.h"

namespace dstrain::config {

std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

namespace {

// micro * gas * w, or an Error with the values as the user wrote them when the product does not
// fit in 64 bits (it would wrap to a small or negative "batch size").
std::int64_t checked_product(std::int64_t mbs, std::int64_t gas, std::int64_t w) {
  std::int64_t mg = 0, p = 0;
  if (__builtin_mul_overflow(mbs, gas, &mg) || __builtin_mul_overflow(mg, w, &p)) {
    fail(
        "train_micro_batch_size_per_gpu {} * gradient_accumulation_steps {} * data-parallel world size {} = {:.4g} samples per step "
        "does not fit in a 64-bit integer (at most 2^63 - 1): give smaller values",
        mbs, gas, w, static_cast<double>(mbs) * static_cast<double>(gas) * static_cast<double>(w));
  }
  return p;
}

// What would satisfy TBS = MBS * GAS * W, in words.
std::string mismatch_fix(std::int64_t tbs, std::int64_t mbs, std::int64_t gas, std::int64_t w) {
  std::string fix = fmt::format("set train_batch_size to {} (= {} * {} * {})", mbs * gas * w, mbs, gas, w);
  if (mbs > 0 && tbs % (mbs * w) == 0 && tbs / (mbs * w) > 0) fix += fmt::format(", or gradient_accumulation_steps to {}", tbs / (mbs * w));
  if (gas > 0 && tbs % (gas * w) == 0 && tbs / (gas * w) > 0) fix += fmt::format(", or train_micro_batch_size_per_gpu to {}", tbs / (gas * w));
  if (tbs % w != 0)
    fix += fmt::format(
        "; train_batch_size {} is not a multiple of the data-parallel world size {}, so no micro "
        "batch size and accumulation steps can reach it",
        tbs, w);
  fix += ". Or give only two of the three keys and let dstrain infer the third";
  return fix;
}

}  // namespace

BatchSizes resolve_batch_sizes(std::optional<std::int64_t> tbs_in, std::optional<std::int64_t> mbs_in, std::optional<std::int64_t> gas_in,
                               std::int64_t w) {
  DSTRAIN_CHECK(w > 0, "data-parallel world size is {}; it must be positive", w);
  const std::string world = fmt::format(" (data-parallel world size {})", w);
  // DeepSpeed divides during inference, so a zero divisor fails there with ZeroDivisionError; we
  // report it with the assertion that would follow.
  auto need_positive_mbs = [&](std::int64_t mbs) {
    if (mbs == 0)
      fail(
          "Micro batch size per gpu: 0 has to be greater than 0 (train_micro_batch_size_per_gpu is 0; DeepSpeed "
          "fails dividing by it); set it to a positive number of samples per GPU");
  };
  auto need_positive_gas = [&](std::int64_t gas) {
    if (gas == 0)
      fail(
          "Gradient accumulation steps: 0 has to be greater than 0 (DeepSpeed fails dividing by it); set "
          "gradient_accumulation_steps to 1 or more");
  };

  BatchSizes b;
  if (tbs_in && mbs_in && gas_in) {
    b = {*tbs_in, *mbs_in, *gas_in};
  } else if (tbs_in && mbs_in) {
    need_positive_mbs(*mbs_in);
    b = {*tbs_in, *mbs_in, floor_div(floor_div(*tbs_in, *mbs_in), w)};
  } else if (tbs_in && gas_in) {
    need_positive_gas(*gas_in);
    b = {*tbs_in, floor_div(floor_div(*tbs_in, w), *gas_in), *gas_in};
  } else if (mbs_in && gas_in) {
    b = {checked_product(*mbs_in, *gas_in, w), *mbs_in, *gas_in};
  } else if (tbs_in) {
    b = {*tbs_in, floor_div(*tbs_in, w), 1};
  } else if (mbs_in) {
    b = {checked_product(*mbs_in, 1, w), *mbs_in, 1};
  } else {
    fail(
        "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided{}; add "
        "\"train_micro_batch_size_per_gpu\" (samples per GPU per step) or \"train_batch_size\" (samples per optimizer "
        "step over all GPUs)",
        gas_in ? " (gradient_accumulation_steps alone is not enough)" : "");
  }

  if (b.train_batch_size <= 0)
    fail("Train batch size: {} has to be greater than 0{}{}", b.train_batch_size, world,
         tbs_in ? "; set train_batch_size to a positive number"
                : "; it was inferred as train_micro_batch_size_per_gpu * gradient_accumulation_steps * world size");
  if (b.train_micro_batch_size_per_gpu <= 0)
    fail("Micro batch size per gpu: {} has to be greater than 0{}{}", b.train_micro_batch_size_per_gpu, world,
         mbs_in ? "; set train_micro_batch_size_per_gpu to a positive number"
                : fmt::format("; it was inferred from train_batch_size {} // world size {}{}, which is 0 — "
                              "train_batch_size must be at least the data-parallel world size{}",
                              b.train_batch_size, w, gas_in ? " // gradient_accumulation_steps" : "",
                              gas_in ? " times gradient_accumulation_steps" : ""));
  if (b.gradient_accumulation_steps <= 0)
    fail("Gradient accumulation steps: {} has to be greater than 0{}{}", b.gradient_accumulation_steps, world,
         gas_in ? "; set gradient_accumulation_steps to 1 or more"
                : fmt::format("; it was inferred as train_batch_size {} // train_micro_batch_size_per_gpu {} // world "
                              "size {}, which is 0 — train_batch_size must be at least micro batch * world size",
                              b.train_batch_size, b.train_micro_batch_size_per_gpu, w));
  const std::int64_t product = checked_product(b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps, w);
  if (b.train_batch_size != product)
    fail(
        "Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
        "world_size {} != {} * {} * {}{}. Fix: {}",
        b.train_batch_size, b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps, w, world,
        mismatch_fix(b.train_batch_size, b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps, w));
  return b;
}

}  // namespace dstrain::config
