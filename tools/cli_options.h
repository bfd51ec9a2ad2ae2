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
// A whole number from min to max, else "'X' is not a whole number from MIN to MAX".
CLI::Validator whole_number_in(std::int64_t min, std::int64_t max);
// A finite real number >= `min` (nan, inf and out-of-range values such as 1e400 are refused).
CLI::Validator finite_number_at_least(double min);
// Any finite real number.
CLI::Validator finite_number();
// One of `choices` (the message lists them).
CLI::Validator one_of(std::vector<std::string> choices);
// A whole number from 0 to 2^64 - 1 (a seed): "-1" is refused, not wrapped to 2^64 - 1.
CLI::Validator whole_number_64_bit_unsigned();
// A value that is not empty: `--save-dir ""` (an unset shell variable) is refused rather than
// read as "not given", which would lose an output without a word.
CLI::Validator not_empty();
// A size in bytes with an optional K/M/G/T suffix (powers of 1024): refuses a sign, which
// CLI::AsSizeValue would wrap ("-1M" to 2^64 - 1). Add it with ->transform() after AsSizeValue's
// (CLI11 runs the last transform added first), so that it sees the text as typed.
CLI::Validator unsigned_size();

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

// The message for a command line CLI11 refuses, in dstrain's words where CLI11's would leak its
// own ("--steps: At Most 1 required but received 2", "A subcommand is required"); nullopt: CLI11's
// message is fine. Call with the app after its parse threw `error`.
std::optional<std::string> reworded_parse_error(const CLI::App& app, const CLI::ParseError& error);

// A command's exit status other than 0, thrown by a subcommand's callback and returned by main.
struct ExitStatus {
  int code = 0;
};
// `dstrain train` stopped by SIGTERM / SIGINT after saving a checkpoint: EX_TEMPFAIL of
// sysexits.h, "a temporary failure; try again" — rerunning the command with --resume auto continues.
inline constexpr int kExitStoppedBySignal = 75;

}  // namespace dstrain::cli
