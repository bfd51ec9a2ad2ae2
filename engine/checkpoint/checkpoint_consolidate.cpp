#include "engine/checkpoint/checkpoint_consolidate.h"

#include <map>
#include <optional>
#include <vector>

#include "data/run_files.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "models/model_registry.h"
#include "ops/error.h"

namespace dstrain {

std::string consolidate_checkpoint(const std::filesystem::path& save_dir, std::string tag, const std::filesystem::path& output, DType dtype) {
  // The output never replaces a file of the checkpoint it reads (a rank file, the manifest,
  // `latest`), nor a device or a link (data/run_files.h); checked before anything is read.
  check_outputs_spare_inputs({{save_dir, "the checkpoint folder", true}}, {{output, "consolidate's output"}});
  prove_writable({output, "consolidate's output"});
  if (tag.empty()) {
    const std::optional<std::string> latest = read_latest_tag(save_dir);
    if (!latest) fail("consolidate: no '{}' file in '{}'; give the checkpoint with --tag", kLatestFile, save_dir.string());
    tag = *latest;
  }
  check_checkpoint_tag(tag);
  CheckpointReader rd(save_dir, tag);
  const config::Json& m = rd.manifest();
  // The owned parameters (their names and shapes from the model the manifest records), and where a
  // tied name points.
  const Model model = make_model(manifest_architecture(m, rd.dir().string()));
  std::map<std::string, std::string> owner;
  std::map<std::string, Shape> shapes;
  for (const auto& layer : model.layers) {
    for (const ParamSpec& ps : layer->params()) {
      if (ps.tied()) {
        owner[ps.name] = ps.tied_to;
      } else {
        owner[ps.name] = ps.name;
        shapes[ps.name] = ps.shape;
      }
    }
  }
  std::map<std::string, std::vector<float>> values;
  for (const auto& [name, shape] : shapes) {
    std::vector<float> v(static_cast<std::size_t>(shape.numel()));
    rd.read("master", name, 0, shape.numel(), v.data());
    values[name] = std::move(v);
  }
  const auto lookup = [&](const std::string& n) {
    const auto it = owner.find(n);
    if (it == owner.end()) fail("consolidate: the Hugging Face layout asks for '{}', which the model does not have", n);
    return Tensor(values.at(it->second).data(), DType::fp32, shapes.at(it->second));
  };
  model.architecture->export_weights(output, lookup, dtype);
  return tag;
}

}  // namespace dstrain
