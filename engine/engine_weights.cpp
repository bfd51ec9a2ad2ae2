// The engine's weights in the model family's Hugging Face layout (Engine::save_weights,
// load_weights; models/model_family.h): whole fp32 tensors gathered from ZeRO partitions,
// tensor-parallel pieces and, on a pipeline, every stage.
#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_impl.h"
#include "engine/tensor_parallel.h"
#include "models/param_split.h"
#include "ops/buffer.h"
#include "ops/error.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

// The whole model's parameters by name (whole shapes; tied names too), and each tied name's owner,
// from the architecture's layers (built once per call: a pipeline stage holds only some of them).
std::unordered_map<std::string, Shape> whole_param_shapes(const Architecture& arch) {
  std::unordered_map<std::string, Shape> shapes;
  for (const auto& layer : arch.make_layers())
    for (const ParamSpec& ps : layer->params()) shapes.emplace(ps.name, ps.whole_shape());
  return shapes;
}

std::unordered_map<std::string, std::string> tied_param_owners(const Architecture& arch) {
  std::unordered_map<std::string, std::string> tied;
  for (const auto& layer : arch.make_layers())
    for (const ParamSpec& ps : layer->params())
      if (ps.tied()) tied.emplace(ps.name, ps.tied_to);
  return tied;
}

}  // namespace

namespace {
// The architecture that reads and writes the model's weight files (its family's Hugging Face
// layout). Error naming `who` when the model was built without one.
const Architecture& weights_architecture(const Model& model, const char* who) {
  if (!model.architecture) {
    fail(
        "{}: the model has no architecture (it was built from layers, not from a model family), and weight files are in a family's "
        "layout; build it with make_model(...)",
        who);
  }
  return *model.architecture;
}
}  // namespace

void Engine::save_weights(const std::filesystem::path& path) {
  const Architecture& arch = weights_architecture(model_, "save_weights");
  Impl& im = *impl_;
  if (im.pp != nullptr) {
    save_pipeline_weights(path);
    return;
  }
  const bool writer = rank() == 0 && (im.tp == nullptr || im.tp->rank() == 0);  // rank 0 of the whole mesh
  if (im.config.zero_optimization.stage == 0 && device().is_cpu() && im.tp == nullptr && im.ep == nullptr) {
    // The fp32 masters (= the params in fp32 training): the 16-bit copies would lose their digits.
    // Every rank holds them whole, in host memory; rank 0 writes.
    if (rank() == 0) arch.export_weights(path, [this](const std::string& n) { return master_param(n); });
    return;
  }
  if (im.config.zero_optimization.stage == 3 && !im.config.zero_optimization.gather_16bit_weights_on_model_save && im.world > 1) {
    fail(
        "save_weights: ZeRO stage 3 partitions the weights across {} ranks and zero_optimization.stage3_gather_16bit_weights_on_model_save "
        "is false, so they are not gathered for saving (DeepSpeed's save_16bit_model refuses likewise); set it to true",
        im.world);
  }
  // Gather the fp32 masters (collective; on a GPU also at stage 0: they come to the host), keep a
  // host copy of each, rank 0 writes.
  std::unordered_map<std::string, std::pair<Shape, std::vector<float>>> host;
  gather_master_params([&](const std::string& name, const Tensor& t) {
    if (!writer) return;
    const float* p = t.as<float>();
    host[name] = {t.shape, std::vector<float>(p, p + t.numel())};
  });
  if (!writer) return;
  arch.export_weights(path, [&](const std::string& n) {
    auto& [shape, v] = host.at(im.owned[owned_param_index(model_, im.by_name, im.owned.size(), "-", n)].spec.name);
    return Tensor(v.data(), DType::fp32, shape);
  });
}

void Engine::load_weights(const std::filesystem::path& path) {
  const Architecture& arch = weights_architecture(model_, "load_weights");
  Impl& im = *impl_;
  // Read the whole fp32 values (every rank reads the file), then each rank keeps its part as
  // master and rounds it into the 16-bit params the layers read.
  std::vector<std::vector<float>> values(im.owned.size());
  // (Tensor parallelism: whole values too; each rank keeps its piece below.)
  for (std::size_t k = 0; k < im.owned.size(); ++k) values[k].assign(static_cast<std::size_t>(im.owned[k].spec.whole_shape().numel()), 0.0f);
  // A pipeline stage holds some of the file's tensors: the others are read into a scratch buffer
  // of their whole shape (the whole model's, from the architecture) and dropped.
  std::unordered_map<std::string, Shape> whole_shapes;
  std::unordered_map<std::string, std::string> tied;  // a tied name -> its owner's
  std::unordered_map<std::string, std::vector<float>> elsewhere;  // by name: each buffer stays where it is
  if (model_.pipelined()) {
    whole_shapes = whole_param_shapes(arch);
    tied = tied_param_owners(arch);
  }
  const auto lookup = [&](const std::string& n) {
    if (model_.pipelined() && !im.by_name.contains(n)) {
      const auto t = tied.find(n);
      if (!im.by_name.contains(t != tied.end() ? t->second : n)) {
        const auto it = whole_shapes.find(n);
        if (it == whole_shapes.end()) fail("load_weights: the model has no parameter named '{}'", n);
        std::vector<float>& scratch = elsewhere[n];
        scratch.assign(static_cast<std::size_t>(it->second.numel()), 0.0f);
        return Tensor(scratch.data(), DType::fp32, it->second);
      }
    }
    const std::size_t k = owned_param_index(model_, im.by_name, im.owned.size(), "-", n);
    return Tensor(values[k].data(), DType::fp32, im.owned[k].spec.whole_shape());
  };
  arch.import_weights(path, lookup);
  // A NaN or an infinity would train to NaN from step 1 — or, with no step, be saved again as it
  // is: refused here, naming the tensor, before anything of the engine changes.
  for (std::size_t k = 0; k < values.size(); ++k) {
    const auto bad = std::find_if(values[k].begin(), values[k].end(), [](float v) { return !std::isfinite(v); });
    if (bad != values[k].end()) {
      fail(
          "weights {}: tensor '{}' holds {} at element {}; initial weights must be finite — the file is damaged, or saved from a run that "
          "diverged",
          path.string(), im.owned[k].spec.name, *bad, bad - values[k].begin());
    }
  }
  im.initial_state = false;
  im.states->set_masters([&](std::size_t layer, const FlatSlot& slot, const Tensor& out) {
    const ParamSpec& spec = im.states->spec(layer, slot);
    const std::size_t k = im.by_name.at(spec.name);
    if (!spec.is_piece()) {
      copy_tensor(out, Tensor(values[k].data(), DType::fp32, out.shape));
      return;
    }
    std::vector<float> part(static_cast<std::size_t>(spec.shape.numel()));
    copy_whole_to_piece(Tensor(values[k].data(), DType::fp32, spec.whole_shape()), Tensor(part.data(), DType::fp32, spec.shape), spec.split,
                        spec.piece.ranks, spec.piece.rank, spec.name);
    copy_tensor(out, Tensor(part.data(), DType::fp32, out.shape));
  });
}

namespace {

// Host values sent to / received from a pipeline peer, through the training device's memory when
// the engine trains on a GPU (what NCCL needs; the local backend takes it alike).
void send_host(Communicator& comm, const Tensor& host, int peer, Allocator* staging) {
  if (staging == nullptr) {
    comm.send(host, peer);
    return;
  }
  Buffer b(*staging, host.nbytes(), MemoryPurpose::buffers);
  const Tensor d = b.tensor(host.dtype, host.shape);
  copy_tensor(d, host);
  comm.send(d, peer);
  comm.synchronize();
}

void recv_host(Communicator& comm, const Tensor& host, int peer, Allocator* staging) {
  if (staging == nullptr) {
    comm.recv(host, peer);
    return;
  }
  Buffer b(*staging, host.nbytes(), MemoryPurpose::buffers);
  const Tensor d = b.tensor(host.dtype, host.shape);
  comm.recv(d, peer);
  comm.synchronize();
  copy_tensor(host, d);
}

}  // namespace

// Each stage gathers its parameters' whole fp32 values (collective within the stage); the stage
// writers (data rank 0, tensor-parallel rank 0 of each stage: one pipeline group) send theirs to
// stage 0 — a description (per tensor: name length, rank, dims, then the name's characters) and
// the values — and mesh rank 0 writes the file. A shared parameter's copy stays home: its owner's
// stage sends it.
void Engine::save_pipeline_weights(const std::filesystem::path& path) {
  Impl& im = *impl_;
  const Architecture& arch = *model_.architecture;
  if (im.config.zero_optimization.stage == 3) fail("save_weights: a pipeline runs ZeRO stages 0-2");
  const bool stage_writer = rank() == 0 && im.tp_rank() == 0;
  std::vector<bool> copy(im.owned.size(), false);
  for (const SharedParam& sp : model_.shared_params)
    if (sp.copy) copy[im.by_name.at(sp.name)] = true;
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<float> values;
  gather_master_params([&](const std::string& name, const Tensor& t) {
    if (!stage_writer || copy[im.by_name.at(name)]) return;
    names.push_back(name);
    shapes.push_back(t.shape);
    values.insert(values.end(), t.as<float>(), t.as<float>() + t.numel());
  });
  if (!stage_writer) return;
  Communicator& pp = *im.pp;
  Allocator* staging = im.host_value_staging();
  const int stage = pp.rank();
  if (stage > 0) {
    std::vector<std::int32_t> meta;
    for (std::size_t k = 0; k < names.size(); ++k) {
      meta.push_back(static_cast<std::int32_t>(names[k].size()));
      meta.push_back(shapes[k].rank);
      for (int d = 0; d < shapes[k].rank; ++d) meta.push_back(static_cast<std::int32_t>(shapes[k][d]));
      for (char ch : names[k]) meta.push_back(static_cast<unsigned char>(ch));
    }
    double header[3] = {static_cast<double>(names.size()), static_cast<double>(meta.size()), static_cast<double>(values.size())};
    send_host(pp, Tensor(header, DType::fp64, Shape{3}), 0, staging);
    if (!meta.empty()) send_host(pp, Tensor(meta.data(), DType::int32, Shape{static_cast<std::int64_t>(meta.size())}), 0, staging);
    if (!values.empty()) send_host(pp, Tensor(values.data(), DType::fp32, Shape{static_cast<std::int64_t>(values.size())}), 0, staging);
    return;
  }
  std::unordered_map<std::string, std::pair<Shape, std::vector<float>>> host;
  std::size_t at = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const auto n = static_cast<std::size_t>(shapes[k].numel());
    host[names[k]] = {shapes[k], std::vector<float>(values.begin() + static_cast<std::ptrdiff_t>(at), values.begin() + static_cast<std::ptrdiff_t>(at + n))};
    at += n;
  }
  for (int from = 1; from < pp.world_size(); ++from) {
    double header[3] = {0, 0, 0};
    recv_host(pp, Tensor(header, DType::fp64, Shape{3}), from, staging);
    std::vector<std::int32_t> meta(static_cast<std::size_t>(header[1]));
    std::vector<float> vals(static_cast<std::size_t>(header[2]));
    if (!meta.empty()) recv_host(pp, Tensor(meta.data(), DType::int32, Shape{static_cast<std::int64_t>(meta.size())}), from, staging);
    if (!vals.empty()) recv_host(pp, Tensor(vals.data(), DType::fp32, Shape{static_cast<std::int64_t>(vals.size())}), from, staging);
    std::size_t m = 0, v = 0;
    for (std::int64_t k = 0; k < static_cast<std::int64_t>(header[0]); ++k) {
      const auto len = static_cast<std::size_t>(meta[m++]);
      Shape shape;
      shape.rank = meta[m++];
      for (int d = 0; d < shape.rank; ++d) shape.dims[static_cast<std::size_t>(d)] = meta[m++];
      std::string name;
      for (std::size_t c = 0; c < len; ++c) name.push_back(static_cast<char>(meta[m++]));
      const auto n = static_cast<std::size_t>(shape.numel());
      host[name] = {shape, std::vector<float>(vals.begin() + static_cast<std::ptrdiff_t>(v), vals.begin() + static_cast<std::ptrdiff_t>(v + n))};
      v += n;
    }
  }
  // Names as the family asks for them: a tied name (GPT-2's "lm_head.weight") is its owner's.
  const std::unordered_map<std::string, std::string> tied = tied_param_owners(arch);
  arch.export_weights(path, [&](const std::string& n) {
    const auto t = tied.find(n);
    const auto it = host.find(t != tied.end() ? t->second : n);
    if (it == host.end()) fail("save_weights: no stage of the pipeline holds '{}'", n);
    return Tensor(it->second.second.data(), DType::fp32, it->second.first);
  });
}

}  // namespace dstrain
