// The list of every field table, for describe_fields() and the JSON-schema agreement test.
#include "config_schema/ds_config.h"

namespace dstrain::config {

const std::vector<SectionSpec>& all_sections() {
  static const std::vector<SectionSpec> sections = {
      top_level_section_spec(),
      optimizer_section_spec(),
      optimizer_params_section_spec(),
      scheduler_section_spec(),
      scheduler_params_section_spec(),
      fp16_section_spec(),
      bf16_section_spec("bf16"),
      bf16_section_spec("bfloat16"),
      amp_section_spec(),
      torch_autocast_section_spec(),
      data_types_section_spec(),
      zero_section_spec(),
      offload_param_section_spec(),
      offload_optimizer_section_spec(),
      aio_section_spec(),
      activation_checkpointing_section_spec(),
      checkpoint_section_spec(),
      checkpoint_parallel_write_section_spec(),
      tensorboard_section_spec(),
      csv_monitor_section_spec(),
      wandb_section_spec(),
      comet_section_spec(),
      comms_logger_section_spec(),
      flops_profiler_section_spec(),
      timers_section_spec(),
      timers_throughput_section_spec(),
      elasticity_section_spec(),
      tensor_parallel_section_spec(),
      tensor_parallel_tp_section_spec("tensor_parallel"),
      tensor_parallel_tp_section_spec("tp"),
      tp_partition_config_section_spec(),
      pipeline_section_spec(),
      expert_parallel_section_spec(),
      hybrid_engine_section_spec(),
  };
  return sections;
}

}  // namespace dstrain::config
