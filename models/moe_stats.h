// MoeStats: what the sparse layers of a model record while a micro-batch runs forward, for the
// load-balancing loss (which couples every sparse layer) and for the per-expert token report.
//
// Hugging Face's load_balancing_loss_func (Mixtral, Qwen-MoE, OLMoE) concatenates the router
// logits of ALL sparse layers, L layers of N tokens: with p = softmax(logits) and A_e the number of
// the L·N rows' top_k choices (by p) that are expert e,
//     aux = E · Σ_e (A_e / (L·N)) · (Σ_rows p_e / (L·N)),
// added to the loss × router_aux_loss_coef when output_router_logits. Its gradient with respect to
// any row's p_e is E · A_e / (L·N)², the same for every layer's rows — so a layer's backward needs
// the counts of every layer, which exist once the whole forward has run. The engine owns one
// MoeStats, clears it before each micro-batch's forward (begin), passes it to every layer, reads the
// aux loss after the forward and leaves it for the backward. A checkpointed recompute runs with
// recording off, so that the layers' statistics are counted once.
//
// Sequence parallelism: each rank routes its share of the tokens; the engine sums the statistics
// over the sequence-parallel group after the forward (pack / unpack), so that every rank's aux and
// gradient are those of the whole sequences.
//
// Pipeline parallelism: the stages hold different sparse layers, so a micro-batch's statistics
// travel with it (engine/engine_pipeline.cpp): a stage starts its forward from the running pack the
// previous stage sent with the activations (load), adds its own layers' and sends the pack on; the
// last stage then holds the whole model's, computes the aux loss, and the pack goes back with the
// gradients, each stage's backward reading the whole model's counts (load again). The per-expert
// report is summed over the stages when it is taken (report_pack / report_unpack).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace dstrain {

class MoeStats {
 public:
  // A new micro-batch: the aux statistics start again. `report`: its kept tokens count in the
  // per-expert report (training; an evaluation's do not).
  void begin(bool report = true);
  // False while a checkpointed segment recomputes its forward.
  bool recording = true;

  // One sparse layer's forward over `tokens` tokens of E experts: Hugging Face's counts and
  // probability sums (moe_aux_stats), the assignments each expert kept (after any capacity drop),
  // and the assignments dropped. `aux_weight`: the aux loss's weight (0: not in the loss).
  void record(std::int64_t layer, std::span<const double> assigned, std::span<const double> prob_sum, std::span<const std::int32_t> kept,
              std::int64_t dropped, std::int64_t tokens, double aux_weight);

  // Any sparse layer recorded since begin().
  bool recorded() const { return layers_ > 0; }
  // The weight of the aux loss in the objective (0: none, or nothing recorded).
  double aux_weight() const { return layers_ > 0 ? aux_weight_ : 0.0; }
  // aux as above (unweighted); 0 when nothing was recorded.
  double aux_loss() const;
  // d(weight · aux)/d(p_e) for every row: aux_weight · E · A_e / (L·N)², times `dloss` (E values).
  std::vector<float> aux_grad(float dloss) const;

  // The aux statistics as one vector [A (E) | P (E) | L | N] and back: what the engine sums over
  // the sequence-parallel group (unpack keeps L, the same on every rank of it).
  std::vector<double> pack() const;
  void unpack(std::span<const double> v);
  // The aux statistics replaced by a pack (2·E + 2 values: its E, L and N too) and `aux_weight`, the
  // report untouched: a pipeline stage's running statistics of a micro-batch, or the whole model's
  // before its backward.
  void load(std::span<const double> v, double aux_weight);

  // The report's aux value (Report::last_aux): the engine's aux loss of its last training
  // micro-batch, the whole model's (after the sequence-parallel sum, and on every pipeline stage).
  void report_aux(double aux) { last_aux_ = aux; }
  // Since begin(): a training micro-batch (its kept tokens count in the report).
  bool reporting() const { return report_; }

  // The per-expert report since the last take_report(): for each sparse layer that recorded, the
  // assignments each expert kept, summed over the micro-batches; and the drops.
  struct Report {
    std::int64_t layers = 0;           // sparse layers seen
    std::int64_t experts = 0;          // E
    double min = 0, max = 0, mean = 0;  // over (layer, expert) pairs: tokens kept
    std::int64_t dropped = 0;          // assignments dropped by a capacity
    std::int64_t idle = 0;             // (layer, expert) pairs that received no token
    double last_aux = 0;               // the last micro-batch's aux loss (unweighted)
    double imbalance() const { return mean > 0 ? max / mean : 0.0; }  // max / mean: 1 = perfectly even
  };
  Report take_report();
  // The same report with the counts first summed over ranks (the engine's data group, at a progress
  // line): `sum_over_ranks` receives [1 | the last micro-batch's aux | drops | each recorded layer's E kept
  // counts, in layer order] and sums it over the ranks in place, so that the counts are every
  // rank's tokens and the aux the ranks' mean. Every rank calling it must have recorded the same
  // sparse layers, as the ranks of one data group do.
  Report take_report(const std::function<void(std::span<double>)>& sum_over_ranks);
  // The report's counts as values [seen (layers) | kept (layers × experts) | dropped], for a model of
  // `layers` layers (the sparse layers' indices) and `experts` experts, and back: what the engine
  // sums over a pipeline's stages, each holding the counts of its own layers.
  std::vector<double> report_pack(std::int64_t layers, std::int64_t experts) const;
  void report_unpack(std::span<const double> v, std::int64_t layers, std::int64_t experts);

 private:
  std::vector<double> assigned_, prob_sum_;  // Σ over the recorded layers, E each
  std::int64_t layers_ = 0;                  // L
  std::int64_t tokens_ = 0;                  // N (per layer)
  double aux_weight_ = 0.0;
  // report
  std::vector<std::vector<double>> kept_;  // [sparse layer index in the model][expert]
  std::int64_t dropped_ = 0;
  double last_aux_ = 0.0;  // report_aux's
  bool report_ = true;
};

}  // namespace dstrain
