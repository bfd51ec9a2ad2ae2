#include "zero/gloo_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <mutex>
#include <numeric>
#include <thread>

#include <fmt/format.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <unistd.h>

#include "ops/error.h"
#include "ops/log.h"
#include "zero/point_to_point.h"
#include "zero/tcp_store.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;
using Buffer = gloo::transport::UnboundBuffer;

// The channels of a group's slots: a group's slots are slot_base + channel.
constexpr int kArrival = 0;
constexpr int kData = 1;
constexpr int kP2pSendDescription = 2;  // the sender's description, to the receiver
constexpr int kP2pRecvDescription = 3;  // the receiver's description, to the sender
constexpr int kP2pData = 4;
constexpr std::uint64_t kChannels = 256;

// What a send's poster thread waits for at most: the receiver may post much later than the sender
// (the timeout counts from wait()); wait() or the request's end aborts it.
constexpr auto kPosterWait = std::chrono::hours(24 * 365);

// gloo's Store over dstrain's TcpStore, its keys under "dstrain/".
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(TcpStore& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override { store_.set(prefixed(key), data); }
  std::vector<char> get(const std::string& key) override { return store_.get(prefixed(key)); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, store_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> p;
    for (const std::string& k : keys) p.push_back(prefixed(k));
    store_.wait(p, timeout);
  }

 private:
  static std::string prefixed(const std::string& key) { return "dstrain/" + key; }
  TcpStore& store_;
};

bool is_loopback(const std::string& host) {
  return host.empty() || host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1" || host == "[::1]";
}

// The interface Gloo listens on (the gloo_communicator.h header says which).
gloo::transport::tcp::attr device_attr(const std::string& master) {
  gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface != nullptr && *iface != '\0') {
    attr.iface = iface;
  } else if (is_loopback(master)) {
    attr.hostname = "127.0.0.1";
  } else {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) fail("Gloo communicator: gethostname failed; set GLOO_SOCKET_IFNAME to the network interface to use");
    attr.hostname = name;
  }
  return attr;
}

// A group's slots from its parent's, the parent's split count and the color: the members of a child
// compute the same base without talking, and siblings and cousins differ (a 64-bit mix).
std::uint64_t child_slot_base(std::uint64_t parent, std::uint64_t split, int color) {
  std::uint64_t z = parent ^ (split * 0x9e3779b97f4a7c15ULL) ^ (static_cast<std::uint64_t>(color) * 0xbf58476d1ce4e5b9ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return (z | kChannels) & ~(kChannels - 1);  // never the world's base (kChannels), channels in the low byte
}

// Where rank 0 serves the store: DSTRAIN_STORE_PORT when set; under torchrun's static rendezvous
// (TORCHELASTIC_USE_AGENT_STORE=True: `torchrun --nproc_per_node N` without --rdzv_backend) the
// agent's own store already listens on MASTER_PORT, so MASTER_PORT + 1; else MASTER_PORT (torchrun's
// c10d rendezvous leaves it free for rank 0, as torch's own workers expect).
int store_port(const LaunchEnv& env) {
  if (const char* p = std::getenv("DSTRAIN_STORE_PORT"); p != nullptr && *p != '\0') {
    char* end = nullptr;
    const long port = std::strtol(p, &end, 10);
    DSTRAIN_CHECK(*end == '\0' && port >= 1 && port <= 65535, "DSTRAIN_STORE_PORT={}: must be a port number in 1..65535", p);
    return static_cast<int>(port);
  }
  if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE"); agent != nullptr && std::string(agent) == "True") {
    DSTRAIN_CHECK(env.master_port < 65535,
                  "MASTER_PORT={} is torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True), and dstrain's store would take the next "
                  "port, which does not exist; give torchrun another --master_port, or set DSTRAIN_STORE_PORT",
                  env.master_port);
    return env.master_port + 1;
  }
  return env.master_port;
}

// Gloo's wait for what is left until `deadline`, rounded up: when Gloo gives up, the deadline has
// passed (timed_out), which is how a timeout is told from a connection that failed.
std::chrono::milliseconds left(Clock::time_point deadline) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(ms, std::chrono::milliseconds(1));
}
bool timed_out(Clock::time_point deadline) { return Clock::now() + std::chrono::milliseconds(2) >= deadline; }

}  // namespace

struct GlooCommunicator::Shared {
  // What a failed call leaves to Gloo: after a timeout or a lost connection its thread may still
  // write a posted receive (a description, staging, scratch), and nothing orders that write before
  // a free. Never freed: at the group's end they move to a list that lives until the process ends
  // (reachable, so not a leak to LeakSanitizer), as the MPI backend leaves its to MPI_Finalize.
  std::vector<std::shared_ptr<void>> kept;
  ~Shared() {
    if (kept.empty()) return;
    static std::mutex graveyard;
    static auto* after_failures = new std::vector<std::shared_ptr<void>>();  // NOLINT: lives until the process ends
    const std::lock_guard<std::mutex> lock(graveyard);
    for (auto& k : kept) after_failures->push_back(std::move(k));
  }
  std::unique_ptr<TcpStore> store;  // rank 0 serves it; kept while any communicator of the process lives
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  // The first failure of any group: Gloo closes every connection of the context after one.
  std::mutex mu;
  std::string failure;
};

GlooCommunicator::GlooCommunicator(const LaunchEnv& env, std::chrono::milliseconds timeout, std::chrono::milliseconds join_timeout)
    : PairwiseCommunicator(env.rank, env.world_size, "Gloo"),
      shared_(std::make_shared<Shared>()),
      members_(static_cast<std::size_t>(env.world_size)),
      slot_base_(kChannels),
      timeout_(join_timeout.count() > 0 ? join_timeout : timeout),  // joining first, the collectives' below
      received_(static_cast<std::size_t>(env.world_size)) {
  DSTRAIN_CHECK(timeout.count() > 0, "Gloo communicator: the timeout must be positive, got {} ms", timeout.count());
  const std::chrono::milliseconds join = timeout_;
  std::iota(members_.begin(), members_.end(), 0);
  set_log_rank(rank(), world_size());
  if (world_size() == 1) {  // no peer: nothing to connect
    timeout_ = timeout;
    return;
  }
  const std::string host = env.master_addr.empty() ? "localhost" : env.master_addr;
  try {
    shared_->store = std::make_unique<TcpStore>(host, store_port(env), rank() == 0, join);
    shared_->device = gloo::transport::tcp::CreateDevice(device_attr(host));
    shared_->context = std::make_shared<gloo::rendezvous::Context>(rank(), world_size());
    shared_->context->setTimeout(join);
    StoreAdapter adapter(*shared_->store);
    shared_->context->connectFullMesh(adapter, shared_->device);
  } catch (const Error&) {
    throw;  // the store's, naming the address and the variables
  } catch (const std::exception& e) {
    fail(
        "Gloo communicator: rank {} of {} could not connect to the other ranks (store at {}:{}): {}. Fix: check that every process of the job "
        "has the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE, that the ranks can reach each other over TCP, and set GLOO_SOCKET_IFNAME to "
        "the network interface between the machines",
        rank(), world_size(), host, store_port(env), e.what());
  }
  // Every rank connected: the store has done its work (kept alive anyway, for no cost).
  arrive(make_call(0, CollectiveKind::barrier, DType::fp32, 0));
  timeout_ = timeout;
  shared_->context->setTimeout(timeout);
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<Shared> shared, std::vector<int> members, int rank, std::uint64_t slot_base,
                                   std::chrono::milliseconds timeout)
    : PairwiseCommunicator(rank, static_cast<int>(members.size()), "Gloo"),
      shared_(std::move(shared)),
      members_(std::move(members)),
      slot_base_(slot_base),
      timeout_(timeout),
      received_(members_.size()) {}

GlooCommunicator::~GlooCommunicator() {
  if (failure_.empty()) return;
  // The buffers a failed collective may still receive into (Shared::kept).
  keep(std::make_shared<std::vector<char>>(collectives_.release_scratch()));
  keep(std::make_shared<std::vector<Call>>(std::move(received_)));
}

void GlooCommunicator::keep(std::shared_ptr<void> what) noexcept {
  try {
    const std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->kept.push_back(std::move(what));
  } catch (...) {
    new std::shared_ptr<void>(std::move(what));  // NOLINT: no memory to record it: leaked, never freed under Gloo
  }
}

void GlooCommunicator::fail_with(std::string message) {
  if (failure_.empty()) failure_ = message;
  {
    const std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->failure.empty()) shared_->failure = message;
  }
  throw Error(message);
}

void GlooCommunicator::fail_on(const std::exception& e, int peer, const std::string& what) {
  if (peer < 0) fail_with(fmt::format("Gloo communicator: {} failed on rank {}: {}", what, rank(), e.what()));
  fail_with(fmt::format(
      "Gloo communicator: {} failed on rank {}: the connection to rank {} failed ({}): its process ended or stopped, or the network between "
      "them failed. Fix: look at rank {}'s own output and the launcher's messages",
      what, rank(), peer, e.what(), peer));
}

void GlooCommunicator::check_usable() const {
  if (!failure_.empty()) {
    throw Error(fmt::format("Gloo communicator: rank {} cannot issue collective #{}: the group failed earlier: {}", rank(), sequence(), failure_));
  }
  const std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->failure.empty()) {
    throw Error(fmt::format("Gloo communicator: rank {} cannot issue collective #{}: the process's connections failed earlier: {}", rank(),
                            sequence(), shared_->failure));
  }
}

void GlooCommunicator::arrive(const Call& call) {
  check_usable();
  const int w = world_size();
  const int me = rank();
  arrivals_.record(me, call);
  if (w == 1) return;
  gloo::Context& ctx = *shared_->context;
  received_[static_cast<std::size_t>(me)] = call;  // the description sent (lives as long as this communicator)
  // One receive and one send buffer per peer over received_, made at the first collective and
  // reposted at every one (a buffer counts its completions).
  std::vector<std::unique_ptr<Buffer>>& in = arrival_in_;
  std::vector<std::unique_ptr<Buffer>>& out = arrival_out_;
  try {
    if (in.empty()) {
      in.resize(static_cast<std::size_t>(w));
      out.resize(static_cast<std::size_t>(w));
      for (int q = 0; q < w; ++q) {
        if (q == me) continue;
        in[static_cast<std::size_t>(q)] = ctx.createUnboundBuffer(&received_[static_cast<std::size_t>(q)], sizeof(Call));
        out[static_cast<std::size_t>(q)] = ctx.createUnboundBuffer(&received_[static_cast<std::size_t>(me)], sizeof(Call));
      }
    }
    for (int q = 0; q < w; ++q) {
      if (q != me) in[static_cast<std::size_t>(q)]->recv(process_rank(q), slot(kArrival));
    }
    for (int q = 0; q < w; ++q) {
      if (q != me) out[static_cast<std::size_t>(q)]->send(process_rank(q), slot(kArrival));
    }
  } catch (const std::exception& e) {
    fail_on(e, -1, describe_call(call, w));
  }
  const Clock::time_point deadline = Clock::now() + timeout_;
  try {
    // The descriptions in rank order. Gloo's first timeout closes the connections, so the first
    // rank missing at the deadline is the one named.
    for (int q = 0; q < w; ++q) {
      if (q == me) continue;
      try {
        in[static_cast<std::size_t>(q)]->waitRecv(left(deadline));
      } catch (const std::exception& e) {
        if (timed_out(deadline)) fail_with(arrivals_.timeout_text(call, {q}, timeout_));
        fail_on(e, q, fmt::format("{} ({})", describe_call(call, w), arrivals_.last_reached(q)));
      }
      arrivals_.record(q, received_[static_cast<std::size_t>(q)]);
    }
    for (int q = 0; q < w; ++q) {
      if (q == me) continue;
      try {
        out[static_cast<std::size_t>(q)]->waitSend(left(deadline));
      } catch (const std::exception& e) {
        fail_on(e, q, describe_call(call, w));
      }
    }
  } catch (...) {
    // Gloo may still write the descriptions of the ranks not waited for (Shared::kept).
    for (auto* buffers : {&in, &out})
      for (auto& b : *buffers)
        if (b) keep(std::shared_ptr<Buffer>(std::move(b)));
    throw;
  }
  arrivals_.check_same(call, [this](std::string message) { fail_with(std::move(message)); });
}

void GlooCommunicator::exchange(const std::vector<PairwiseMessage>& sends, const std::vector<PairwiseMessage>& recvs, DType dtype,
                                const Call& call) {
  struct Posted {
    std::unique_ptr<Buffer> buffer;
    int peer;
    bool is_send;
  };
  std::vector<Posted> posted;
  posted.reserve(sends.size() + recvs.size());
  const std::size_t es = dtype_size(dtype);
  gloo::Context& ctx = *shared_->context;
  try {
    for (const PairwiseMessage& m : recvs) {
      if (m.count == 0) continue;
      posted.push_back({ctx.createUnboundBuffer(m.data, static_cast<std::size_t>(m.count) * es), m.peer, false});
      posted.back().buffer->recv(process_rank(m.peer), slot(kData));
    }
    for (const PairwiseMessage& m : sends) {
      if (m.count == 0) continue;
      posted.push_back({ctx.createUnboundBuffer(m.data, static_cast<std::size_t>(m.count) * es), m.peer, true});
      posted.back().buffer->send(process_rank(m.peer), slot(kData));
    }
  } catch (const std::exception& e) {
    fail_on(e, -1, describe_call(call, world_size()));
  }
  const Clock::time_point deadline = Clock::now() + timeout_;
  for (Posted& p : posted) {
    try {
      if (p.is_send) p.buffer->waitSend(left(deadline));
      else p.buffer->waitRecv(left(deadline));
    } catch (const std::exception& e) {
      for (Posted& q : posted) keep(std::shared_ptr<Buffer>(std::move(q.buffer)));  // Gloo may still use them
      if (timed_out(deadline)) fail_with(arrivals_.stuck_text(call, {p.peer}, timeout_));
      fail_on(e, p.peer, describe_call(call, world_size()));
    }
  }
}

namespace {

// One op of a started batch: its two descriptions, its data, and for a send with data its
// decision (made by the peer's SendPoster: post the data once the receiver's description came and
// agrees).
struct GlooOp {
  PointToPointCall mine;
  std::string name;
  int peer = 0;
  CollectiveCall out, in;  // this rank's description, the peer's
  std::unique_ptr<Buffer> out_description, in_description, data;
  std::vector<char> staging;  // a recv's data lands here, copied to `dest` once it matched
  void* dest = nullptr;
  // A send with data: what its poster decided.
  enum class Posting { waiting, posted, disagreed, aborted, failed };
  bool via_poster = false;
  std::mutex mu;
  std::condition_variable cv;
  Posting posting = Posting::waiting;
  bool taken = false;      // the poster is deciding it
  bool withdrawn = false;  // wait() gave up on it, or its request was abandoned: never post
  std::string error;

  // Gives up on the decision (a timeout, an abandoned request) and returns it once final: the
  // poster's wait is aborted, and an op it has not taken yet is skipped when it comes to it.
  Posting withdraw() {
    std::unique_lock<std::mutex> lock(mu);
    withdrawn = true;
    if (posting != Posting::waiting || !taken) return posting;
    lock.unlock();
    in_description->abortWaitRecv();
    lock.lock();
    cv.wait(lock, [&] { return posting != Posting::waiting; });
    return posting;
  }
};

struct GlooPending final : PendingPointToPoint {
  std::vector<std::shared_ptr<GlooOp>> ops;
  ~GlooPending() override {
    for (auto& op : ops)
      if (op->via_poster) op->withdraw();
  }
};

}  // namespace

// Per peer of a communicator: the thread that posts the data of this rank's sends to that peer, in
// the pair's order (Gloo matches a pair's messages on a slot in posting order), each once the
// receiver's description came and agrees (gloo_communicator.h: Gloo aborts on a message longer
// than its buffer). One send at a time: the receiver posts its recvs' descriptions in the same
// order, so the first undecided send is the one whose description comes next.
struct GlooCommunicator::SendPoster {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<GlooOp>> queue;
  std::shared_ptr<GlooOp> current;
  bool stop = false;
  std::thread thread;

  SendPoster(int peer, std::uint64_t data_slot) : thread([this, peer, data_slot] { run(peer, data_slot); }) {}
  ~SendPoster() {
    {
      const std::lock_guard<std::mutex> lock(mu);
      stop = true;
      if (current) current->in_description->abortWaitRecv();
    }
    cv.notify_all();
    thread.join();
  }

  void add(std::shared_ptr<GlooOp> op) {
    {
      const std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(op));
    }
    cv.notify_all();
  }

  void run(int peer, std::uint64_t data_slot) {
    for (;;) {
      std::shared_ptr<GlooOp> op;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (stop) return;
        op = queue.front();
        queue.pop_front();
        current = op;
      }
      decide(*op, peer, data_slot);
      const std::lock_guard<std::mutex> lock(mu);
      current.reset();
    }
  }

  static void decide(GlooOp& op, int peer, std::uint64_t data_slot) {
    {
      const std::lock_guard<std::mutex> lock(op.mu);
      if (op.withdrawn) {
        op.posting = GlooOp::Posting::aborted;
        op.cv.notify_all();
        return;
      }
      op.taken = true;
    }
    GlooOp::Posting result = GlooOp::Posting::failed;
    std::string error;
    try {
      if (!op.in_description->waitRecv(nullptr, kPosterWait)) {
        result = GlooOp::Posting::aborted;
      } else if (!point_to_point_disagreement("Gloo", op.mine, op.in).empty()) {
        result = GlooOp::Posting::disagreed;
      } else {
        op.data->send(peer, data_slot);
        result = GlooOp::Posting::posted;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      const std::lock_guard<std::mutex> lock(op.mu);
      op.posting = result;
      op.error = std::move(error);
    }
    op.cv.notify_all();
  }
};

GlooCommunicator::SendPoster& GlooCommunicator::poster(int peer) {
  if (posters_.empty()) posters_.resize(static_cast<std::size_t>(world_size()));
  auto& p = posters_[static_cast<std::size_t>(peer)];
  if (!p) p = std::make_unique<SendPoster>(process_rank(peer), slot(kP2pData));
  return *p;
}

std::unique_ptr<PendingPointToPoint> GlooCommunicator::do_start_send_recv(std::span<const PointToPointOp> ops, std::span<const PointToPointCall> mine) {
  auto p = std::make_unique<GlooPending>();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    auto op = std::make_shared<GlooOp>();
    op->mine = mine[i];
    op->name = describe_point_to_point(mine[i]);
    op->peer = ops[i].peer;
    DSTRAIN_CHECK(ops[i].buffer.device.is_cpu(),
                  "Gloo communicator: the buffer of {} is on {}; the Gloo backend communicates host memory. Fix: use host buffers (--device "
                  "cpu), or the nccl backend for GPUs",
                  op->name, ops[i].buffer.device.str());
    p->ops.push_back(std::move(op));
  }
  check_usable();
  gloo::Context& ctx = *shared_->context;
  try {
    for (std::size_t i = 0; i < ops.size(); ++i) {
      GlooOp& op = *p->ops[i];
      const bool sending = op.mine.is_send;
      const int peer = process_rank(op.peer);
      // The descriptions carry the pair's number where a collective's carries its sequence number.
      op.out = make_call(op.mine.number, sending ? CollectiveKind::send : CollectiveKind::recv, op.mine.dtype, op.mine.count);
      op.in_description = ctx.createUnboundBuffer(&op.in, sizeof(Call));
      op.in_description->recv(peer, slot(sending ? kP2pRecvDescription : kP2pSendDescription));
      op.out_description = ctx.createUnboundBuffer(&op.out, sizeof(Call));
      op.out_description->send(peer, slot(sending ? kP2pSendDescription : kP2pRecvDescription));
      const std::size_t bytes = static_cast<std::size_t>(op.mine.count) * dtype_size(op.mine.dtype);
      if (bytes == 0) continue;
      if (!sending) {
        op.staging.resize(bytes);
        op.dest = ops[i].buffer.data;
        op.data = ctx.createUnboundBuffer(op.staging.data(), bytes);
        op.data->recv(peer, slot(kP2pData));
        continue;
      }
      op.data = ctx.createUnboundBuffer(ops[i].buffer.data, bytes);
      op.via_poster = true;
      poster(op.peer).add(p->ops[i]);
    }
  } catch (const std::exception& e) {
    fail_on(e, -1, "starting a send_recv batch");
  }
  return p;
}

void GlooCommunicator::do_wait(PendingPointToPoint& pending) {
  try {
    complete(pending);
  } catch (...) {
    keep_ops(pending);
    throw;
  }
}

void GlooCommunicator::keep_ops(PendingPointToPoint& pending) noexcept {
  // A failed or abandoned batch: Gloo may still write its descriptions and staging (Shared::kept);
  // its sends' posters stop first.
  auto& p = static_cast<GlooPending&>(pending);
  for (auto& op : p.ops) {
    if (op->via_poster) op->withdraw();
    keep(std::move(op));
  }
  p.ops.clear();
}

void GlooCommunicator::complete(PendingPointToPoint& pending) {
  auto& p = static_cast<GlooPending&>(pending);
  check_usable();
  const Clock::time_point deadline = Clock::now() + timeout_;
  for (auto& op_ptr : p.ops) {
    GlooOp& op = *op_ptr;
    const auto unmatched = [&] { fail_with(point_to_point_unmatched_text("Gloo", op.name, op.mine, timeout_, arrivals_.last_reached(op.peer))); };
    if (op.via_poster) {
      // A send with data: its poster learns the receiver's description.
      GlooOp::Posting posting = GlooOp::Posting::waiting;
      {
        std::unique_lock<std::mutex> lock(op.mu);
        op.cv.wait_until(lock, deadline, [&] { return op.posting != GlooOp::Posting::waiting; });
        posting = op.posting;
      }
      if (posting == GlooOp::Posting::waiting) posting = op.withdraw();
      switch (posting) {
        case GlooOp::Posting::waiting:
        case GlooOp::Posting::aborted:
          unmatched();
          break;
        case GlooOp::Posting::disagreed:
          fail_with(point_to_point_disagreement("Gloo", op.mine, op.in));
        case GlooOp::Posting::failed:
          fail_on(std::runtime_error(op.error), op.peer, op.name);
        case GlooOp::Posting::posted:
          break;
      }
    } else {
      try {
        op.in_description->waitRecv(left(deadline));
      } catch (const std::exception& e) {
        if (timed_out(deadline)) unmatched();
        fail_on(e, op.peer, op.name);
      }
      const std::string problem = point_to_point_disagreement("Gloo", op.mine, op.in);
      if (!problem.empty()) fail_with(problem);
    }
    try {
      op.out_description->waitSend(left(deadline));
      if (op.data != nullptr) {
        if (op.mine.is_send) op.data->waitSend(left(deadline));
        else op.data->waitRecv(left(deadline));
      }
    } catch (const std::exception& e) {
      if (timed_out(deadline)) fail_with(point_to_point_stuck_text("Gloo", op.name, op.mine, timeout_));
      fail_on(e, op.peer, op.name);
    }
    if (op.dest != nullptr) std::memcpy(op.dest, op.staging.data(), op.staging.size());
  }
}

void GlooCommunicator::do_abandon(PendingPointToPoint& pending) noexcept {
  auto& p = static_cast<GlooPending&>(pending);
  std::string names;
  for (auto& op : p.ops) names += (names.empty() ? "" : ", ") + op->name;
  keep_ops(pending);
  const std::string message = fmt::format(
      "Gloo communicator: rank {} abandoned a started send_recv batch without waiting for it ({}); its peers fail at their timeout", rank(), names);
  log_error("{}", message);
  const std::lock_guard<std::mutex> lock(shared_->mu);
  if (shared_->failure.empty()) shared_->failure = message;
}

std::unique_ptr<Communicator> GlooCommunicator::do_split(int color, int key) {
  // Every rank's (color, key), with the arrival's deadline and mismatch check.
  const int w = world_size();
  std::int32_t mine[2] = {color, key};
  std::vector<std::int32_t> table(static_cast<std::size_t>(2 * w));
  all_gather(Tensor(mine, DType::int32, Shape{2}), Tensor(table.data(), DType::int32, Shape{2 * static_cast<std::int64_t>(w)}));
  check_usable();
  std::vector<int> ranks;  // this group's ranks of the same color, ordered by (key, rank)
  for (int q = 0; q < w; ++q) {
    if (table[static_cast<std::size_t>(2 * q)] == color) ranks.push_back(q);
  }
  std::stable_sort(ranks.begin(), ranks.end(),
                   [&](int a, int b) { return table[static_cast<std::size_t>(2 * a + 1)] < table[static_cast<std::size_t>(2 * b + 1)]; });
  std::vector<int> members;
  int child_rank = 0;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == rank()) child_rank = static_cast<int>(i);
    members.push_back(process_rank(ranks[i]));
  }
  ++splits_;
  return std::unique_ptr<Communicator>(
      new GlooCommunicator(shared_, std::move(members), child_rank, child_slot_base(slot_base_, splits_, color), timeout_));
}

}  // namespace dstrain
