// The folder a file monitor writes into, made and checked when the monitor is built, so that an
// unwritable output_path fails at start with a message instead of at the first step's write.
#pragma once

#include <filesystem>
#include <string_view>

#include "config_schema/monitor_config.h"

namespace dstrain {

// output_path/job_name as DeepSpeed joins them (os.path.join: an empty output_path adds nothing,
// so the folder is job_name under the current directory), created with its parents, then probed
// by creating and removing a file in it. Throws Error naming `section` ("tensorboard",
// "csv_monitor"), the path, the system's reason and the fix.
std::filesystem::path make_monitor_log_dir(std::string_view section, const config::FileMonitorConfig& cfg);

}  // namespace dstrain
