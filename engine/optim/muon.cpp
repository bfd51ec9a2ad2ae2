#include "engine/optim/muon.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <vector>

#include "engine/optim/host_segment.h"
#include "models/param_split.h"
#include "ops/error.h"
#include "ops/buffer.h"
#include "ops/kernels/device_backend.h"
#include "ops/kernels/newton_schulz.h"
#include "ops/kernels/tensor_ops.h"

namespace dstrain {
namespace {

// torch.lerp as its kernels compute it (the form chosen by the weight, for accuracy at both ends).
inline float lerp(float a, float b, float w) { return std::abs(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

}  // namespace

MuonTensor muon_tensor_of(const ParamSpec& spec) {
  MuonTensor t;
  std::string low = spec.name;
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  t.muon = spec.shape.rank >= 2 && low.find("embed") == std::string::npos && low.find("lm_head") == std::string::npos;
  if (!t.muon) return t;
  // DeepSpeed views conv filters (4-D) as (len, -1); a matrix is itself. A tensor-parallel piece
  // is orthogonalised (and scaled) as the whole matrix it is a piece of.
  const Shape whole = spec.whole_shape();
  t.rows = whole[0];
  t.cols = whole.numel() / std::max<std::int64_t>(1, whole[0]);
  t.cut = tensor_cut_of(spec);
  std::int64_t hf_rows = spec.init.rows > 0 ? spec.init.rows : t.rows, hf_cols = t.cols;
  if (spec.hf_transposed) std::swap(hf_rows, hf_cols);
  t.scale = std::sqrt(std::max(1.0, static_cast<double>(hf_rows) / static_cast<double>(hf_cols)));
  return t;
}

void muon_step(OptimizerPartition& partition, std::span<const MuonTensor> tensors, const MuonStepConfig& c) {
  const std::size_t nt = static_cast<std::size_t>(partition.tensor_count());
  DSTRAIN_CHECK(tensors.size() == nt, "muon_step: {} tensor descriptions for a partition of {} tensors", tensors.size(), nt);
  const float gs = c.grad_scale;
  const float mu = static_cast<float>(c.momentum), one_minus_mu = static_cast<float>(1.0 - c.momentum);
  const float b1w = static_cast<float>(1.0 - c.beta1), b2w = static_cast<float>(1.0 - c.beta2), eps = static_cast<float>(c.eps);
  const double t = static_cast<double>(c.step);
  const auto bc1 = static_cast<float>(1.0 - std::pow(c.beta1, t)), bc2 = static_cast<float>(1.0 - std::pow(c.beta2, t));
  const auto adam_lr = static_cast<float>(c.adam_lr), muon_lr = static_cast<float>(c.lr);

  // Pass 1: momentum and Nesterov input of the Muon pieces (into whole-matrix copies), Adam on the rest.
  std::vector<std::vector<float>> whole(nt);
  // The rank holding a matrix's first element orthogonalises it (exactly one rank holds it).
  std::vector<char> owner(nt, 0);
  Device device = Device::cpu();  // where the partition lives: the iteration runs there
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      if (!s.params.device.is_cpu()) device = s.params.device;
      const auto adam_decay = static_cast<float>(1.0 - c.adam_lr * (s.weight_decay ? c.weight_decay : 0.0));
      HostSegment h(s, 2);
      float *p = h.master(), *m = h.state(0), *v = h.state(1);
      const float* g = h.grads();
      for (const TensorPiece& piece : s.pieces) {
        const MuonTensor& mt = tensors[static_cast<std::size_t>(piece.tensor)];
        const std::int64_t end = piece.offset + piece.numel;
        if (mt.muon) {
          std::vector<float>& u = whole[static_cast<std::size_t>(piece.tensor)];
          if (u.empty()) u.assign(static_cast<std::size_t>(mt.piece_numel()), 0.0f);
          if (piece.tensor_offset == 0 && piece.numel > 0) owner[static_cast<std::size_t>(piece.tensor)] = 1;
          float* ut = u.data() + (piece.tensor_offset - piece.offset);
          for (std::int64_t i = piece.offset; i < end; ++i) {
            const float gi = g[i] * gs;
            const float mi = lerp(m[i], gi, one_minus_mu);
            m[i] = mi;
            ut[i] = lerp(gi, mi, mu);
          }
        } else {
          for (std::int64_t i = piece.offset; i < end; ++i) {
            const float gi = g[i] * gs;
            const float mi = lerp(m[i], gi, b1w), vi = lerp(v[i], gi * gi, b2w);
            m[i] = mi;
            v[i] = vi;
            const float update = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
            p[i] = p[i] * adam_decay + (-adam_lr) * update;
          }
        }
      }
      h.commit();
    }
  });

  // Whole matrices (the ranks' pieces added), orthogonalised and scaled. Partitioned, the ranks'
  // pieces are summed (one value and zeros: exact), the owner orthogonalises, and a second sum hands
  // its result to the other ranks (theirs are zeros), so each matrix is computed once, not per rank.
  // A matrix cut by tensor parallelism: the piece (whole on the rank after that first sum) is
  // all-gathered over the tensor-parallel group into the whole matrix, which the rank orthogonalises
  // (once per tensor-parallel rank) before keeping its piece of the result.
  std::vector<float> workspace;
  // On a GPU the iteration's GEMMs run there (cuBLASLt): the matrix is copied over and back.
  std::unique_ptr<Allocator> device_alloc;
  Buffer device_matrix, device_workspace;
  const auto orthogonalise = [&](const MuonTensor& mt, float* u) {
    const Shape shape{mt.rows, mt.cols};
    const std::int64_t ws = newton_schulz_workspace_numel(mt.rows, mt.cols);
    if (device.is_cpu()) {
      workspace.resize(static_cast<std::size_t>(ws));
      newton_schulz(Tensor(u, DType::fp32, shape), Tensor(workspace.data(), DType::fp32, Shape{ws}));
    } else {
      if (!device_alloc) device_alloc = make_device_allocator(device);
      const std::size_t matrix_bytes = static_cast<std::size_t>(mt.rows * mt.cols) * sizeof(float),
                        ws_bytes = static_cast<std::size_t>(ws) * sizeof(float);
      if (device_matrix.bytes() < matrix_bytes) device_matrix = Buffer(*device_alloc, matrix_bytes, MemoryPurpose::buffers);
      if (device_workspace.bytes() < ws_bytes) device_workspace = Buffer(*device_alloc, ws_bytes, MemoryPurpose::buffers);
      const Tensor host(u, DType::fp32, shape), x = device_matrix.tensor(DType::fp32, shape);
      copy_tensor(x, host);
      newton_schulz(x, device_workspace.tensor(DType::fp32, Shape{ws}));
      copy_tensor(host, x);  // completes the queued iteration before returning
    }
    const auto scale = static_cast<float>(mt.scale);
    for (std::int64_t i = 0; i < mt.rows * mt.cols; ++i) u[i] = u[i] * scale;
  };
  for (const MuonTensor& mt : tensors) check_cut_fits(partition, mt.cut, "Muon");
  std::vector<float> full;  // a cut matrix, whole
  for (std::size_t k = 0; k < nt; ++k) {
    const MuonTensor& mt = tensors[k];
    if (!mt.muon) continue;
    std::vector<float>& u = whole[k];  // this rank's piece of the matrix (the whole matrix unless cut)
    const bool held = !u.empty();      // this rank holds elements of it
    if (!c.partitioned && !mt.cut.cut) {
      if (held) orthogonalise(mt, u.data());
      continue;
    }
    // Collectives: every rank, every Muon matrix — twice over the data-parallel ranks (fp32: one
    // non-zero term per element) when partitioned, once over the tensor-parallel group when cut.
    if (!held) u.assign(static_cast<std::size_t>(mt.piece_numel()), 0.0f);
    if (c.partitioned) partition.all_reduce_sum(std::span<float>(u));
    const bool computes = c.partitioned ? owner[k] != 0 : held;
    if (mt.cut.cut) {
      full.assign(static_cast<std::size_t>(mt.rows * mt.cols), 0.0f);
      gather_whole_matrix(partition, mt.cut, u, full);
      if (computes) {
        orthogonalise(mt, full.data());
        copy_whole_to_piece(Tensor(full.data(), DType::fp32, mt.cut.whole), Tensor(u.data(), DType::fp32, mt.cut.piece), mt.cut.split,
                            mt.cut.ranks, mt.cut.rank, mt.cut.name);
      }
    } else if (computes) {
      orthogonalise(mt, u.data());
    }
    if (c.partitioned) {
      if (!computes) std::fill(u.begin(), u.end(), 0.0f);
      partition.all_reduce_sum(std::span<float>(u));
    }
    if (!held) std::vector<float>().swap(u);
  }

  // Pass 2: W ← W·(1 − lr·λ) − lr·O on the Muon pieces.
  partition.for_each_subgroup([&](std::span<const OptimizerSegment> segments) {
    for (const OptimizerSegment& s : segments) {
      if (s.params.numel() == 0) continue;
      bool any = false;
      for (const TensorPiece& piece : s.pieces) any = any || tensors[static_cast<std::size_t>(piece.tensor)].muon;
      if (!any) continue;
      const auto decay = static_cast<float>(1.0 - c.lr * (s.weight_decay ? c.weight_decay : 0.0));
      HostSegment h(s, 0);  // the master only
      float* p = h.master();
      for (const TensorPiece& piece : s.pieces) {
        if (!tensors[static_cast<std::size_t>(piece.tensor)].muon) continue;
        const float* o = whole[static_cast<std::size_t>(piece.tensor)].data() + (piece.tensor_offset - piece.offset);
        for (std::int64_t i = piece.offset; i < piece.offset + piece.numel; ++i) p[i] = p[i] * decay + (-muon_lr) * o[i];
      }
      h.commit();
    }
  });
}

}  // namespace dstrain
