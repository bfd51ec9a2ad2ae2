// What the subcommands share on their command lines: validators whose messages a person can
// read ("--warmup-steps: 0 is not a whole number >= 1", not CLI11's range of doubles), and the
// options that fill a config's "auto" values, with the same names in `check-config` and `train`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <dstrain/dstrain.h>

namespace dstrain::cli {

// A whole number (decimal, optional sign, no fraction or exponent, within int64) >= `min`.
CLI::Validator whole_number_at_least(std::int64_t min);
// A finite real number >= `min` (nan, inf and out-of-range values such as 1e400 are refused).
CLI::Validator finite_number_at_least(double min);
// Any finite real number.
CLI::Validator finite_number();
// One of `choices` (the message lists them).
CLI::Validator one_of(std::vector<std::string> choices);

// The "auto" values as the HF Trainer's arguments fill them, by flag.
struct AutoValueArgs {
  std::optional<std::int64_t> micro_batch, grad_accum, hidden_size;
  std::optional<double> lr, eps, weight_decay, clipping;
  std::vector<double> betas;
  std::optional<double> beta1, beta2;  // HF's adam_beta1 / adam_beta2: the other keeps its default
  std::optional<std::string> precision;
};

// Adds --micro-batch-size, --gradient-accumulation-steps, --hidden-size, --lr, --adam-betas,
// --adam-beta1, --adam-beta2, --adam-eps, --weight-decay, --gradient-clipping and --precision to
// `cmd`, in a group of their own. The optimizer flags also fill `train`'s default AdamW (a config
// with no "optimizer" block).
void add_auto_value_options(CLI::App* cmd, AutoValueArgs& args);

// The AutoValues they give (total / warmup steps are the caller's). Error for --adam-betas with
// other than two values, or with --adam-beta1 / --adam-beta2.
config::AutoValues to_auto_values(const AutoValueArgs& args);

// A command's exit status other than 0, thrown by a subcommand's callback and returned by main.
struct ExitStatus {
  int code = 0;
};
// `dstrain train` stopped by SIGTERM / SIGINT after saving a checkpoint: EX_TEMPFAIL of
// sysexits.h, "a temporary failure; try again" — rerunning the command with --resume auto continues.
inline constexpr int kExitStoppedBySignal = 75;

}  // namespace dstrain::cli
