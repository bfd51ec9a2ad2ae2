// optimizer and scheduler sections (docs/optimizers.md, docs/lr_schedules.md, docs/precision.md §7).
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dstrain::config {
namespace {

using testing::contains;
using testing::error_of;
using testing::find_warning;
using testing::parse;

std::string with(const std::string& body) { return R"({"train_batch_size": 1, )" + body + "}"; }

TEST(Optimizer, AdamDefaults) {
  const OptimizerConfig o = parse(with(R"("optimizer": {"type": "Adam", "params": {}})")).optimizer;
  EXPECT_EQ(o.kind, OptimizerKind::adam);
  EXPECT_DOUBLE_EQ(o.params.lr, 1e-3);
  EXPECT_DOUBLE_EQ(o.params.betas.first, 0.9);
  EXPECT_DOUBLE_EQ(o.params.betas.second, 0.999);
  EXPECT_DOUBLE_EQ(o.params.eps, 1e-8);
  EXPECT_DOUBLE_EQ(o.params.weight_decay, 0.0);
  EXPECT_TRUE(o.params.bias_correction);
  EXPECT_TRUE(o.params.adam_w_mode);
  EXPECT_FALSE(o.params.torch_adam);
  EXPECT_FALSE(o.legacy_fusion);
}

TEST(Optimizer, AdamIsAdamWUnlessAdamWModeFalse) {
  EXPECT_TRUE(parse(with(R"("optimizer": {"type": "Adam", "params": {"weight_decay": 0.1}})")).optimizer.decoupled_weight_decay());
  EXPECT_FALSE(parse(with(R"("optimizer": {"type": "Adam", "params": {"adam_w_mode": false}})")).optimizer.decoupled_weight_decay());
  EXPECT_TRUE(parse(with(R"("optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}})")).optimizer.decoupled_weight_decay());
}

TEST(Optimizer, NamesCaseRules) {
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "adamw"})")).optimizer.kind, OptimizerKind::adamw);
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "LAMB"})")).optimizer.kind, OptimizerKind::lamb);
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "SGD"})")).optimizer.kind, OptimizerKind::sgd);
  // torch fallbacks are case-sensitive.
  const std::string m = error_of(with(R"("optimizer": {"type": "sgd"})"));
  EXPECT_TRUE(contains(m, "sgd is not a supported DeepSpeed Optimizer")) << m;
  EXPECT_TRUE(contains(m, "did you mean \"SGD\"?")) << m;
}

// The names DeepSpeed builds but cannot train with (docs/optimizers.md §10.2) are kept with a
// warning giving DeepSpeed's reason (the engine refuses them); Adafactor is a type of its own.
TEST(Optimizer, UnsupportedTypesWarn) {
  for (const char* t : {"LBFGS", "SparseAdam", "MuAdam", "musgd"}) {
    const DsConfig c = parse(with(std::string(R"("optimizer": {"type": ")") + t + R"(", "params": {"lr": 0.1}})"));
    EXPECT_EQ(c.optimizer.kind, OptimizerKind::unsupported) << t;
    EXPECT_NE(find_warning(c, "optimizer.type", "DeepSpeed could not train with it either"), nullptr) << t;
  }
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "Adafactor", "params": {"lr": 0.1}})")).optimizer.kind, OptimizerKind::adafactor);
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "MUON", "params": {"lr": 0.1}})")).optimizer.kind, OptimizerKind::muon);
}

TEST(Optimizer, UnknownParamListsValidOnes) {
  const std::string m = error_of(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "beta": [0.9, 0.95]}})"));
  EXPECT_TRUE(contains(m, "optimizer.params.beta")) << m;
  EXPECT_TRUE(contains(m, "did you mean \"betas\"?")) << m;
  EXPECT_TRUE(contains(m, "valid parameters: lr, betas, eps, weight_decay")) << m;
  EXPECT_TRUE(
      contains(error_of(with(R"("optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.9]}})")), "SGD does not take a parameter named \"betas\""));
}

TEST(Optimizer, MaxGradNormPointsToGradientClipping) {
  const std::string m = error_of(with(R"("optimizer": {"type": "Adam", "params": {"max_grad_norm": 1.0}})"));
  EXPECT_TRUE(contains(m,
                       "'max_grad_norm' is not supported as an optimizer parameter, please switch to using the "
                       "deepspeed parameter 'gradient_clipping'"))
      << m;
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Lamb", "params": {"max_grad_norm": 1.0}})")), "gradient_clipping"));
}

TEST(Optimizer, ValueChecks) {
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam", "params": {"betas": [0.9]}})")), "optimizer.params.betas"));
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam", "params": {"amsgrad": true}})")), "AMSGrad"));
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "SGD", "params": {"nesterov": true}})")),
                       "Nesterov momentum requires a momentum and zero dampening"));
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam", "params": {"lr": "1e-3"}})")), "optimizer.params.lr"));
}

TEST(Optimizer, ZeroWhitelist) {
  const std::string m = error_of(with(R"("optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2})"));
  EXPECT_TRUE(contains(m,
                       "You are using an untested ZeRO Optimizer. Please add <\"zero_allow_untested_optimizer\": "
                       "true> in the configuration file to use it."))
      << m;
  EXPECT_EQ(parse(with(R"("optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2},
                         "zero_allow_untested_optimizer": true)"))
                .zero_optimization.stage,
            2);
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Lamb"}, "fp16": {"enabled": true, "loss_scale": 128})")),
                       "DeepSpeed lamb optimizer requires dynamic loss scaling"));
}

// ConfigOptions::default_optimizer fills a missing block (the HF Trainer's AdamW, from the flags'
// AutoValues); client_optimizer replaces the config's block, with a warning, as DeepSpeed uses the
// client's. Both are read like a config's block (its checks apply), and the scheduler's default
// warmup_max_lr is their lr.
TEST(Optimizer, DefaultAndClientOptimizers) {
  const Json hf = default_optimizer_block({});
  EXPECT_EQ(hf, Json::parse(R"({"type": "AdamW", "params": {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}})"));
  AutoValues autos;
  autos.lr = 1e-3;
  autos.betas = std::pair{0.8, 0.95};
  autos.eps = 1e-6;
  autos.weight_decay = 0.1;
  EXPECT_EQ(default_optimizer_block(autos),
            Json::parse(R"({"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}})"));
  autos.betas = std::pair{0.9, 1.0};
  std::string beta_error;
  try {
    default_optimizer_block(autos);
  } catch (const Error& e) {
    beta_error = e.what();
  }
  EXPECT_TRUE(contains(beta_error, "--adam-beta2")) << beta_error;

  ConfigOptions o;
  o.default_optimizer = hf;
  const DsConfig d = parse_ds_config(Json::parse(with(R"("scheduler": {"type": "WarmupLR", "params": {}})")), o);
  EXPECT_EQ(d.optimizer_source, OptimizerSource::default_adamw);
  EXPECT_EQ(d.optimizer.kind, OptimizerKind::adamw);
  EXPECT_DOUBLE_EQ(d.optimizer.params.lr, 5e-5);
  EXPECT_DOUBLE_EQ(d.scheduler.params.warmup_max_lr, 5e-5);
  EXPECT_EQ(d.to_json()["optimizer"]["type"], "AdamW");
  // A config with a block keeps it.
  const DsConfig kept = parse_ds_config(Json::parse(with(R"("optimizer": {"type": "SGD", "params": {"lr": 0.5}})")), o);
  EXPECT_EQ(kept.optimizer_source, OptimizerSource::config);
  EXPECT_EQ(kept.optimizer.kind, OptimizerKind::sgd);

  ConfigOptions c;
  c.client_optimizer = Json::parse(R"({"type": "SGD", "params": {"lr": 0.25, "momentum": 0.9}})");
  const DsConfig client = parse_ds_config(Json::parse(with(R"("optimizer": {"type": "AdamW"})")), c);
  EXPECT_EQ(client.optimizer_source, OptimizerSource::client);
  EXPECT_EQ(client.optimizer.kind, OptimizerKind::sgd);
  EXPECT_DOUBLE_EQ(client.optimizer.params.momentum, 0.9);
  EXPECT_NE(find_warning(client, "optimizer", "replaces this block"), nullptr);
  // The client's block is checked as a config's.
  c.client_optimizer = Json::parse(R"({"type": "SGD", "params": {"betas": [0.9, 0.9]}})");
  std::string m;
  try {
    parse_ds_config(Json::parse(with("\"steps_per_print\": 1")), c);
  } catch (const Error& e) {
    m = e.what();
  }
  EXPECT_TRUE(contains(m, "SGD does not take a parameter named \"betas\"")) << m;
}

TEST(Scheduler, WarmupLRDefaultsInheritOptimizerLr) {
  const DsConfig c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
                                   "scheduler": {"type": "WarmupLR", "params": {}})"));
  const auto& p = c.scheduler.params;
  EXPECT_EQ(c.scheduler.kind, SchedulerKind::warmup_lr);
  EXPECT_DOUBLE_EQ(p.warmup_min_lr, 0.0);
  EXPECT_DOUBLE_EQ(p.warmup_max_lr, 3e-4);  // optimizer lr since v0.17.2
  EXPECT_EQ(p.warmup_num_steps, 1000);
  EXPECT_EQ(p.warmup_type, "log");
  EXPECT_EQ(p.last_batch_iteration, -1);
}

TEST(Scheduler, WarmupDecayLRKeepsItsOwnMax) {
  const DsConfig c = parse(with(R"("optimizer": {"type": "AdamW", "params": {"lr": 3e-4}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 5000}})"));
  EXPECT_DOUBLE_EQ(c.scheduler.params.warmup_max_lr, 0.001);
  EXPECT_EQ(c.scheduler.params.total_num_steps, 5000);
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupDecayLR", "params": {}})")),
                       "total_num_steps is missing"));
}

TEST(Scheduler, WarmupCosineAndOneCycleAndRangeTestDefaults) {
  const auto cos = parse(with(R"("optimizer": {"type": "Adam"},
      "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100}})"))
                       .scheduler.params;
  EXPECT_DOUBLE_EQ(cos.warmup_min_ratio, 0.0);
  EXPECT_DOUBLE_EQ(cos.cos_min_ratio, 0.0001);
  const auto one = parse(with(R"("optimizer": {"type": "Adam"},
      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_stair_count": 3}})"))
                       .scheduler.params;
  EXPECT_EQ(one.cycle_first_step_size, 2000);
  EXPECT_EQ(one.cycle_second_step_size, 2000);  // None -> first
  EXPECT_EQ(one.cycle_second_stair_count, 3);   // None -> first stair count
  EXPECT_DOUBLE_EQ(one.cycle_min_mom, 0.8);
  EXPECT_DOUBLE_EQ(one.cycle_max_mom, 0.9);
  EXPECT_TRUE(one.cycle_momentum);
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}})")),
                       "cycle_max_lr"));
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "OneCycle",
      "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_first_step_size": 0}})")),
                       "scheduler.params.cycle_first_step_size"));
  const auto rt = parse(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "LRRangeTest", "params": {}})")).scheduler.params;
  EXPECT_DOUBLE_EQ(rt.lr_range_test_min_lr, 1e-3);
  EXPECT_EQ(rt.lr_range_test_step_size, 2000);
  EXPECT_DOUBLE_EQ(rt.lr_range_test_step_rate, 1.0);
  EXPECT_FALSE(rt.lr_range_test_staircase);
}

TEST(Scheduler, WarmupNumStepsMustBePositiveInt) {
  const std::string f = error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e3}})"));
  EXPECT_TRUE(contains(f, "scheduler.params.warmup_num_steps")) << f;
  EXPECT_TRUE(contains(f, "1000")) << f;
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}})")),
                       "scheduler.params.warmup_num_steps"));
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "10"}})")),
                       "scheduler.params.warmup_num_steps"));
}

TEST(Scheduler, NamesAndParams) {
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "warmuplr", "params": {}})")),
                       "DeepSpeed does not recognize LR scheduler warmuplr"));
  EXPECT_TRUE(contains(error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR"})")), "scheduler.params is missing"));
  const std::string m = error_of(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupLR", "params": {"warmup_max": 1}})"));
  EXPECT_TRUE(contains(m, "did you mean \"warmup_max_lr\"?")) << m;
  const DsConfig torch = parse(with(R"("optimizer": {"type": "Adam"}, "scheduler": {"type": "StepLR", "params": {"step_size": 10}})"));
  EXPECT_NE(find_warning(torch, "scheduler.type", "does not provide"), nullptr);
}

}  // namespace
}  // namespace dstrain::config
