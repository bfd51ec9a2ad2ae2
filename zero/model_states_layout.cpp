// ModelStates' construction of its flat units (zero/model_states.h): each layer's one or two units
// (primary over comm, expert over expert_comm), their places in the model-wide buffers, and this
// rank's partition of them (owned pieces, segments); and the lookups from a layer to its units.
#include <algorithm>
#include <unordered_map>
#include <utility>

#include "ops/error.h"
#include "zero/model_states_units.h"

namespace dstrain {

// Each layer's units and their flat layouts, its owners (tied parameters), whether stage 3
// partitions each unit, and where their parameters, gradients and shards begin in the model-wide
// buffers.
ModelStates::LayoutSizes ModelStates::lay_out_layers() {
  const std::size_t L = specs_.size();
  std::unordered_map<std::string, std::pair<std::size_t, std::size_t>> owner_of;  // name -> (layer, spec)
  LayoutSizes sizes;
  std::int64_t persisted = 0;  // stage 3: elements kept whole so far (model_persistence_threshold)
  for (std::size_t i = 0; i < L; ++i) {
    auto ly = std::make_unique<Layer>();
    Layer& l = *ly;
    layers_.push_back(std::move(ly));
    l.primary = add_unit(i, false, sizes, persisted);
    if (expert_comm_ != nullptr) {
      const bool any = std::any_of(specs_[i].begin(), specs_[i].end(), [](const ParamSpec& ps) { return !ps.tied() && ps.split.kind == SplitKind::experts; });
      if (any) l.expert = static_cast<std::ptrdiff_t>(add_unit(i, true, sizes, persisted));
    }
    for (const std::size_t u : unit_ids(i)) {
      for (const FlatSlot& sl : units_[u]->layout.slots) {
        const ParamSpec& ps = specs_[i][sl.spec];
        if (!owner_of.emplace(ps.name, std::make_pair(i, sl.spec)).second) {
          fail("initialize: parameter name '{}' is declared twice (layer '{}')", ps.name, names_[i]);
        }
      }
      if (units_[u]->layout.numel > 0) l.owner_units.push_back(u);
    }
    if (!l.owner_units.empty()) l.owners.push_back(i);
    for (std::size_t j = 0; j < specs_[i].size(); ++j) {
      const ParamSpec& ps = specs_[i][j];
      const std::string& key = ps.tied() ? ps.tied_to : ps.name;
      const auto it = owner_of.find(key);
      if (it == owner_of.end()) fail("initialize: '{}' of layer '{}' is tied to '{}', which no earlier layer owns", ps.name, names_[i], key);
      const auto [owner, spec] = it->second;
      const ParamSpec& os = specs_[owner][spec];
      if (!(os.shape == ps.shape)) fail("initialize: '{}' {} is tied to '{}' of another shape {}", ps.name, ps.shape.str(), key, os.shape.str());
      std::size_t unit = 0;
      const FlatSlot* slot = nullptr;
      for (const std::size_t u : unit_ids(owner))
        if (slot == nullptr && (slot = units_[u]->layout.slot_of(spec)) != nullptr) unit = u;
      l.refs.emplace_back(unit, slot);
      if (std::find(l.owners.begin(), l.owners.end(), owner) == l.owners.end()) l.owners.push_back(owner);
      if (std::find(l.owner_units.begin(), l.owner_units.end(), unit) == l.owner_units.end()) l.owner_units.push_back(unit);
    }
  }
  place_gradients();
  return sizes;
}

// One unit of layer i: the primary (its specs over comm) or the expert one (its expert specs over
// expert_comm). Lays it out for its group, decides whether stage 3 partitions it, and places its
// params and shard after the units before it.
std::size_t ModelStates::add_unit(std::size_t i, bool expert, LayoutSizes& sizes, std::int64_t& persisted) {
  auto un = std::make_unique<Unit>();
  Unit& u = *un;
  u.layer = i;
  u.expert = expert;
  u.comm = expert ? expert_comm_ : partition_comm_;
  u.world = u.comm != nullptr ? u.comm->world_size() : 1;
  u.rank = u.comm != nullptr ? u.comm->rank() : 0;
  const int pw = s_.stage >= 1 ? u.world : 1;  // ranks the optimizer states split over
  std::int64_t max_chunk = 0;                  // stage 0: one chunk per unit (its all-reduce buckets span units instead)
  if (s_.stage == 1 || s_.stage == 2) max_chunk = std::min(s_.reduce_bucket_size, s_.allgather_bucket_size);
  if (s_.stage == 3) max_chunk = s_.reduce_bucket_size;
  // Without an expert group every owned spec is the primary unit's (the layout of old).
  const auto mine = [&](const ParamSpec& ps) { return expert_comm_ == nullptr || (ps.split.kind == SplitKind::experts) == expert; };
  u.layout = make_flat_layout(specs_[i], pw, dtype_size(s_.storage), max_chunk, mine);
  // The expert unit's elements are numbered after the primary's (`used`: the same for any split).
  if (expert) u.layer_base = units_[layers_[i]->primary]->layout.used;
  const FlatLayout& lo = u.layout;
  const std::int64_t owned = lo.used;
  u.partitioned =
      s_.stage == 3 && lo.numel > 0 && !(owned < s_.param_persistence_threshold && persisted + owned <= s_.model_persistence_threshold);
  if (s_.stage == 3 && lo.numel > 0 && !u.partitioned) persisted += owned;
  if (u.partitioned) {
    u.store_unit = sizes.unit_numel.size();
    sizes.unit_numel.push_back(lo.shard_numel());
    if (hpz_ && !expert) {
      // hpZ's share: 1/h of every chunk (a chunk holds a multiple of W·ealign elements, h divides W).
      u.secondary_begin = sizes.secondary;
      sizes.secondary += lo.numel / hpz_->world_size();
    }
  } else {
    u.full_begin = sizes.full;
    sizes.full += lo.numel;
  }
  u.shard_begin = sizes.shard;
  sizes.shard += lo.shard_numel();
  units_.push_back(std::move(un));
  return units_.size() - 1;
}

// The units' places in grads_full_ (and Ψ): the primary units in layer order, then the expert
// units. Each group's gradients are then one range that grows downwards as the backward finishes
// layers, which stage 0 all-reduces in buckets over that group (after_backward).
void ModelStates::place_gradients() {
  for (const bool expert : {false, true}) {
    for (const auto& u : units_) {
      if (u->expert != expert) continue;
      u->grad_begin = total_numel_;
      total_numel_ += u->layout.numel;
    }
  }
}

// This rank's optimizer work: the owned pieces of every tensor, and the partition's segments — its
// piece of every chunk, split at the decay boundary and at the store's sub-group boundaries.
void ModelStates::cut_partition(const std::vector<FlatRange>& groups) {
  // Owned parameter tensors, numbered in unit order: layer by layer, primary unit then expert unit
  // (the engine's order too, ModelStates::slots).
  std::vector<std::vector<std::int32_t>> tensor_of(units_.size());  // [unit][slot index]
  for (std::size_t u = 0; u < units_.size(); ++u)
    for (std::size_t k = 0; k < units_[u]->layout.slots.size(); ++k) tensor_of[u].push_back(tensor_count_++);

  // This rank's optimizer work: its piece of every chunk of every unit (in its unit's group), split
  // at the decay boundary and at the store's sub-group boundaries, with the parameter pieces each
  // run holds.
  std::size_t g = 0;  // the sub-group of the next run (shard offsets only grow)
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    const Unit& un = *units_[ui];
    const std::size_t i = un.layer;
    const FlatLayout& lo = un.layout;
    const int prank = un.piece_rank(s_.stage);
    for (std::int64_t k = 0; k < lo.chunk_count(); ++k) {
      const FlatRange pc = lo.piece(k, prank);
      for (std::size_t si = 0; si < lo.slots.size(); ++si) {
        const FlatSlot& sl2 = lo.slots[si];
        const FlatRange r = intersect(pc, FlatRange{sl2.offset, sl2.offset + sl2.numel});
        if (r.empty()) continue;
        owned_pieces_.push_back(
            {i, &sl2, tensor_of[ui][si], r.begin - sl2.offset, r.size(), un.shard_begin + lo.shard_offset(k) + (r.begin - pc.begin)});
      }
      for (const bool decay : {true, false}) {
        const FlatRange whole = intersect(pc, decay ? FlatRange{0, lo.decay_end} : FlatRange{lo.decay_end, lo.numel});
        for (std::int64_t b = whole.begin; b < whole.end;) {
          const std::int64_t at_shard = un.shard_begin + lo.shard_offset(k) + (b - pc.begin);
          while (g + 1 < groups.size() && groups[g].end <= at_shard) ++g;
          const std::int64_t n = std::min(whole.end - b, groups[g].end - at_shard);
          const FlatRange r{b, b + n};
          PartitionSegment seg;
          seg.layer = i;
          seg.group = g;
          seg.layer_offset = un.layer_base + r.begin;
          seg.shard_offset = at_shard;
          seg.numel = n;
          seg.weight_decay = decay;
          seg.expert = un.expert;
          // Where the storage-dtype params of this range live: the whole unit, or this rank's shard.
          if (un.partitioned) {
            seg.param_unit = static_cast<std::ptrdiff_t>(un.store_unit);
            seg.unit_offset = lo.shard_offset(k) + (r.begin - pc.begin);
            const Tensor in = param_store_->in_place(un.store_unit);
            if (!in.empty()) seg.param = in.slice_rows(seg.unit_offset, seg.unit_offset + n);
          } else {
            seg.param = region(params_full_, s_.storage, un.full_begin + r.begin, n);
          }
          seg.grads = s_.stage <= 1 ? region(grads_full_, s_.storage, un.grad_begin + r.begin, n) : region(grads_shard_, s_.storage, at_shard, n);
          for (std::size_t si = 0; si < lo.slots.size(); ++si) {
            const FlatSlot& sl2 = lo.slots[si];
            const FlatRange t = intersect(r, FlatRange{sl2.offset, sl2.offset + sl2.numel});
            if (t.empty()) continue;
            seg.pieces.push_back({tensor_of[ui][si], t.begin - r.begin, t.size(), t.begin - sl2.offset, sl2.numel});
          }
          segments_.push_back(std::move(seg));
          b += n;
        }
      }
    }
  }
  group_segments_.assign(groups.size(), {0, 0});
  for (std::size_t j = 0; j < segments_.size(); ++j) {
    auto& [first, last] = group_segments_[segments_[j].group];
    if (last == 0) first = j;
    last = j + 1;
  }
}


const FlatLayout& ModelStates::layout(std::size_t i) const { return units_[layers_[i]->primary]->layout; }

const FlatLayout* ModelStates::expert_layout(std::size_t i) const {
  const std::ptrdiff_t e = layers_[i]->expert;
  return e < 0 ? nullptr : &units_[static_cast<std::size_t>(e)]->layout;
}

std::vector<const FlatSlot*> ModelStates::slots(std::size_t i) const {
  std::vector<const FlatSlot*> out;
  for (const std::size_t u : unit_ids(i))
    for (const FlatSlot& sl : units_[u]->layout.slots) out.push_back(&sl);
  return out;
}

std::vector<std::size_t> ModelStates::unit_ids(std::size_t i) const {
  const Layer& ly = *layers_[i];
  if (ly.expert < 0) return {ly.primary};
  return {ly.primary, static_cast<std::size_t>(ly.expert)};
}

// The slot's unit: the one whose layout holds that FlatSlot (the pointer, as owned_pieces() and
// slots() hand them out).
const ModelStates::Unit& ModelStates::unit_of(std::size_t i, const FlatSlot& slot) const {
  for (const std::size_t u : unit_ids(i)) {
    const std::vector<FlatSlot>& sl = units_[u]->layout.slots;
    if (!sl.empty() && &slot >= sl.data() && &slot < sl.data() + sl.size()) return *units_[u];
  }
  fail("ModelStates: a slot (params() entry {}) that is not one of layer '{}''s", slot.spec, names_[i]);
}

}  // namespace dstrain
