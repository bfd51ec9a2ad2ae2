// Top-level scalar keys (docs/config.md §7): regime A, read with dict lookups by DeepSpeed.
#include "config_schema/ds_config.h"

namespace dstrain::config {

SectionSpec top_level_section_spec() {
  const std::vector<std::string> dtypes = {"fp32", "fp16", "bf16"};
  return make_section("", Regime::dict_lookup, "Top-level keys.",
                      {
                          int_field("train_batch_size", nullptr, "Samples per optimizer step over all data-parallel ranks (TBS)."),
                          int_field("train_micro_batch_size_per_gpu", nullptr, "Samples per forward/backward per rank (MBS)."),
                          int_field("gradient_accumulation_steps", nullptr, "Micro steps per optimizer step (GAS)."),
                          bool_field("managed_gradient_accumulation", true, "The engine decides the accumulation boundary."),
                          int_field("steps_per_print", nullptr, "Progress line every N optimizer steps; null = never.").min(1),
                          bool_field("wall_clock_breakdown", false, "Time forward/backward/step (forced on by flops_profiler)."),
                          bool_field("memory_breakdown", false, "Log memory use."),
                          bool_field("dump_state", false, "Print the engine state after initialisation."),
                          number_field("gradient_clipping", 1.0, "Max global L2 gradient norm; <= 0 disables (default 1.0 since v0.19.3)."),
                          bool_field("prescale_gradients", false, "Divide gradients by the world size before the all-reduce."),
                          number_field("gradient_predivide_factor", 1.0, "Divide gradients by this before the all-reduce."),
                          string_field("gradient_allreduce_op", "mean", "Gradient reduction: mean or sum (any case).").one_of({"mean", "sum"}, true),
                          string_field("communication_data_type", nullptr, "Gradient communication dtype; null = model dtype.").one_of(dtypes, true),
                          string_field("seq_parallel_communication_data_type", "fp32",
                                       "Gradient communication dtype when sequence_parallel_size > 1 (replaces communication_data_type); "
                                       "null = model dtype.")
                              .one_of(dtypes, true)
                              .optional(),
                          bool_field("sparse_gradients", false, "CSR all-reduce of embedding gradients."),
                          bool_field("disable_allgather", false, "Legacy."),
                          bool_field("zero_allow_untested_optimizer", false, "Allow optimizers outside ZeRO's whitelist (e.g. Lamb, SGD)."),
                          bool_field("zero_force_ds_cpu_optimizer", true, "Require DeepSpeed's CPU optimizer with optimizer offload."),
                          bool_field("graph_harvesting", false, "CUDA-graph capture of small kernels."),
                          bool_field("dataloader_drop_last", false, "Drop the last incomplete batch."),
                          int_field("vocabulary_size", nullptr, "Vocabulary size (warning if not a multiple of 8)."),
                          bool_field("use_data_before_expert_parallelism", false, "MoE topology order."),
                          string_field("log_level", nullptr, "Logging level."),
                          int_field("sequence_parallel_size", nullptr,
                                    "Sequence-parallel ranks; data-parallel size = world / (this x tensor_parallel.autotp_size).")
                              .min(1),
                          int_field("data_parallel_size", nullptr,
                                    "Data-parallel ranks; with sequence_parallel_size it must equal world / (sequence x tensor parallel).")
                              .min(1),
                          int_field("allgather_size", 500000000, "All-gather bucket for the legacy \"zero_optimization\": true.").min(0),
                      });
}

}  // namespace dstrain::config
