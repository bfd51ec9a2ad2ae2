#include "cli_options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <utility>

#include <fmt/format.h>

namespace dstrain::cli {

CLI::Validator whole_number_at_least(std::int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE) {
          return fmt::format("'{}' is not a whole number{}", text, errno == ERANGE ? " this program can hold (at most 2^63 - 1)" : "");
        }
        if (v < min) return fmt::format("{} is less than {}: give a whole number >= {}", text, min, min);
        return std::string();
      },
      fmt::format("INT>={}", min));
}

CLI::Validator whole_number_in(std::int64_t min, std::int64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < min || v > max) {
          return fmt::format("'{}' is not a whole number from {} to {}", text, min, max);
        }
        return std::string();
      },
      fmt::format("INT in [{}, {}]", min, max));
}

CLI::Validator finite_number_at_least(double min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(v) || errno == ERANGE) return fmt::format("{} is not a finite number in range: give a finite number >= {}", text, min);
        if (v < min) return fmt::format("{} is less than {}: give a number >= {}", text, min, min);
        return std::string();
      },
      fmt::format("NUMBER>={}", min));
}

CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size()) return fmt::format("'{}' is not a number", text);
        if (!std::isfinite(v) || errno == ERANGE) return fmt::format("{} is not a finite number in range", text);
        return std::string();
      },
      "NUMBER");
}

CLI::Validator one_of(std::vector<std::string> choices) {
  std::string list;
  for (const std::string& c : choices) list += (list.empty() ? "" : ", ") + c;
  return CLI::Validator(
      [choices = std::move(choices), list](std::string& text) -> std::string {
        for (const std::string& c : choices) {
          if (text == c) return std::string();
        }
        return fmt::format("'{}' is not one of {}", text, list);
      },
      "{" + list + "}");
}

CLI::Validator whole_number_64_bit_unsigned() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        if (digits) std::strtoull(text.c_str(), &end, 10);
        if (!digits || errno == ERANGE) return fmt::format("'{}' is not a whole number from 0 to 18446744073709551615 (2^64 - 1)", text);
        return std::string();
      },
      "UINT64");
}

CLI::Validator not_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (!text.empty()) return std::string();
        return "the value is empty (an unset shell variable?); give a value, or leave the option out";
      },
      "");
}

CLI::Validator unsigned_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const std::size_t first = text.find_first_not_of(" \t");
        if (first == std::string::npos) return fmt::format("'{}' is not a size: give a number of bytes such as 1048576, 1M or 1G", text);
        if (text[first] == '-' || text[first] == '+')
          return fmt::format("'{}' is not a size: give a number of bytes without a sign, such as 1048576, 1M or 1G", text);
        return std::string();
      },
      "SIZE");
}

std::optional<std::string> reworded_parse_error(const CLI::App& app, const CLI::ParseError& error) {
  // No command, or a word that is none: name it and list the commands.
  if (app.get_subcommands().empty()) {
    std::string commands;
    const std::function<bool(const CLI::App*)> every = [](const CLI::App*) { return true; };
    for (const CLI::App* sub : app.get_subcommands(every)) commands += (commands.empty() ? "" : ", ") + sub->get_name();
    for (const std::string& word : app.remaining()) {
      if (!word.empty() && word[0] != '-') return fmt::format("unknown command \"{}\"; the commands are {}", word, commands);
    }
    if (app.remaining().empty()) return fmt::format("no command given; the commands are {} (dstrain COMMAND --help)", commands);
    return std::nullopt;
  }
  // An option given more often than it takes values: CLI11 says "At Most 1 required but received 2".
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) != nullptr) {
    for (const CLI::App* sub : app.get_subcommands()) {
      for (const CLI::Option* option : sub->get_options()) {
        const int most = option->get_items_expected_max();
        if (most != 1 || option->count() < 2) continue;
        std::string given;
        for (const std::string& value : option->results()) given += (given.empty() ? "" : " and ") + option->get_name() + " " + value;
        const char* times = option->count() == 2 ? "twice" : "more than once";
        return fmt::format("{} given {} ({}): give it once", option->get_name(), times, given);
      }
    }
  }
  return std::nullopt;
}

void add_auto_value_options(CLI::App* cmd, AutoValueArgs& args) {
  const char* group = "Values for \"auto\" keys (as the HF Trainer fills them)";
  cmd->add_option("--micro-batch-size", args.micro_batch, "train_micro_batch_size_per_gpu")->group(group)->check(whole_number_at_least(1));
  cmd->add_option("--gradient-accumulation-steps", args.grad_accum, "gradient_accumulation_steps")->group(group)->check(whole_number_at_least(1));
  cmd->add_option("--hidden-size", args.hidden_size,
                  "Model hidden size: reduce_bucket_size = h*h, stage3_prefetch_bucket_size = 0.9*h*h, "
                  "stage3_param_persistence_threshold = 10*h (train: the model's n_embd when not given)")
      ->group(group)
      ->check(whole_number_at_least(1));
  // With no "optimizer" block, `train` uses AdamW with these (HF TrainingArguments' defaults).
  cmd->add_option("--lr", args.lr, "optimizer.params.lr and scheduler warmup_max_lr (no optimizer block: AdamW's lr, default 5e-5)")
      ->group(group)
      ->check(finite_number());
  cmd->add_option("--adam-betas", args.betas, "optimizer.params.betas (two values)")->group(group)->expected(2)->check(finite_number());
  cmd->add_option("--adam-beta1", args.beta1, "optimizer.params.betas[0] (default 0.9)")->group(group)->check(finite_number());
  cmd->add_option("--adam-beta2", args.beta2, "optimizer.params.betas[1] (default 0.999)")->group(group)->check(finite_number());
  cmd->add_option("--adam-eps", args.eps, "optimizer.params.eps (no optimizer block: default 1e-8)")->group(group)->check(finite_number());
  cmd->add_option("--weight-decay", args.weight_decay, "optimizer.params.weight_decay (no optimizer block: default 0)")
      ->group(group)
      ->check(finite_number());
  cmd->add_option("--gradient-clipping", args.clipping, "gradient_clipping (max_grad_norm)")->group(group)->check(finite_number());
  cmd->add_option("--precision", args.precision, "fp32, fp16 or bf16: fills fp16.enabled / bf16.enabled")
      ->group(group)
      ->check(one_of({"fp32", "fp16", "bf16"}));
}

config::AutoValues to_auto_values(const AutoValueArgs& args) {
  config::AutoValues autos;
  autos.train_micro_batch_size_per_gpu = args.micro_batch;
  autos.gradient_accumulation_steps = args.grad_accum;
  autos.hidden_size = args.hidden_size;
  autos.lr = args.lr;
  autos.eps = args.eps;
  autos.weight_decay = args.weight_decay;
  autos.gradient_clipping = args.clipping;
  autos.precision = args.precision;
  if (!args.betas.empty()) {
    DSTRAIN_CHECK(args.betas.size() == 2, "--adam-betas takes two values (beta1 beta2), got {}", args.betas.size());
    DSTRAIN_CHECK(!args.beta1 && !args.beta2, "--adam-betas with --adam-beta1 / --adam-beta2: give the betas one way");
    autos.betas = std::make_pair(args.betas[0], args.betas[1]);
  } else if (args.beta1 || args.beta2) {
    autos.betas = std::make_pair(args.beta1.value_or(0.9), args.beta2.value_or(0.999));  // HF's defaults for the other
  }
  return autos;
}

}  // namespace dstrain::cli
