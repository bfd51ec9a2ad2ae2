// ModelStates' flat units (zero/model_states.h, "Expert parallelism"): the bookkeeping shared by
// model_states.cpp (the hooks, the step, whole parameters) and model_states_layout.cpp (building
// the units and cutting the partition). Private to those files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "zero/model_states.h"

namespace dstrain {

// One flat unit: some of a layer's owned parameters, replicated over one group (comm, or
// expert_comm for the expert unit), over which ZeRO splits, reduces and gathers them.
struct ModelStates::Unit {
  std::size_t layer = 0;          // the engine layer it belongs to
  bool expert = false;            // the layer's expert unit (over expert_comm)
  Communicator* comm = nullptr;   // its group; nullptr: one rank
  int world = 1;                  // the group's size (the collectives')
  int rank = 0;                   // this rank's index in it
  FlatLayout layout;              // split over `world` ranks at stages 1-3, over 1 at stage 0
  std::int64_t layer_base = 0;    // its elements' offset in the layer's numbering (PartitionSegment::layer_offset)
  bool partitioned = false;       // stage 3 above the persistence threshold: gathered per call
  std::int64_t full_begin = 0;    // offset in params_full_ (units kept whole)
  std::size_t store_unit = 0;     // the ParamStore unit holding this rank's shard (partitioned units)
  std::int64_t grad_begin = 0;    // offset in grads_full_ (stages 0-1)
  std::int64_t shard_begin = 0;   // offset in grads_shard_ and the shard space (the optimizer partition)
  Buffer gathered;                // stage 3: the whole params while gathered
  Buffer fetched;                 // stage 3: the shard copied out of an offloaded store for the gather
  Buffer transient_grads;         // stages 2-3: the whole grads during backward
  CommQueue::Ticket gather_ticket = 0;
  // hpZ: its 1/h share of the gathered params in the secondary buffer, and whether that holds this
  // pass's weights (set by a training pass's first gather, cleared at the next pass).
  std::int64_t secondary_begin = 0;
  bool secondary_valid = false;

  // This rank's piece of every chunk (stage 0 does not split: the one piece is the whole chunk).
  int piece_rank(int stage) const { return stage >= 1 ? rank : 0; }
};

struct ModelStates::Layer {
  std::size_t primary = 0;       // its unit over comm (always there, maybe empty)
  std::ptrdiff_t expert = -1;    // its unit over expert_comm; -1: none
  std::vector<std::size_t> owners;       // layers whose params this one reads (itself first if it owns any)
  std::vector<std::size_t> owner_units;  // ... and the units holding them
  // Per params() entry: the owner unit and the slot there.
  std::vector<std::pair<std::size_t, const FlatSlot*>> refs;
};

}  // namespace dstrain
