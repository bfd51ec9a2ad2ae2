// TcpStore's wire protocol. Integers are u32 big-endian; a str is a u32 length then its bytes.
//   request: u8 op, then  SET(1) str key, str value          reply: u8 0 once stored
//                         GET(2) str key                     reply: u8 found, then str value if found
//                         WAIT(3) u32 timeout_ms, u32 n, n str keys
//                                                            reply: u32 m, m str keys still missing
// GET never waits; WAIT is answered when every key exists (m = 0) or at the server's deadline, so a
// timed-out wait leaves the connection in step (the client's get is WAIT then GET). A client sends
// one request and reads its reply before the next; the server handles a connection's requests in
// order and drops a connection on an unknown op or a length over the caps (keys 4 KiB, values
// 64 MiB) — a port scanner or a confused process never stops the others' rendezvous.
#include "zero/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/error.h"

namespace dstrain {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint8_t kSet = 1, kGet = 2, kWait = 3;
constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 64u << 20;
constexpr uint32_t kMaxKeys = 1u << 16;
// The server answers a WAIT at its own deadline; the client allows this long on top for the reply
// to arrive before it calls the server unresponsive.
constexpr auto kReplyGrace = std::chrono::seconds(2);

// strerror is not thread-safe everywhere; the category's message is.
std::string errno_text(int e) { return std::generic_category().message(e); }

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

uint32_t clamp_ms(std::chrono::milliseconds t) { return static_cast<uint32_t>(std::clamp<long long>(t.count(), 0, UINT32_MAX)); }

void put_u32(std::string& out, uint32_t v) {
  v = htonl(v);
  out.append(reinterpret_cast<const char*>(&v), 4);
}
void put_str(std::string& out, std::string_view s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.append(s);
}

// Reads fields off the front of a buffer that may hold only part of a request.
struct Reader {
  std::string_view b;
  size_t pos = 0;
  bool bad = false;  // a length over its cap: the client is dropped
  bool u8(uint8_t& v) {
    if (b.size() - pos < 1) return false;
    v = static_cast<uint8_t>(b[pos++]);
    return true;
  }
  bool u32(uint32_t& v) {
    if (b.size() - pos < 4) return false;
    std::memcpy(&v, b.data() + pos, 4);
    v = ntohl(v);
    pos += 4;
    return true;
  }
  bool str(std::string& s, uint32_t max) {
    uint32_t n = 0;
    if (!u32(n)) return false;
    if (n > max) return !(bad = true);
    if (b.size() - pos < n) return false;
    s.assign(b.data() + pos, n);
    pos += n;
    return true;
  }
};

struct Request {
  uint8_t op = 0;
  std::string key, value;
  uint32_t timeout_ms = 0;
  std::vector<std::string> keys;
};

enum class Parse { done, more, bad };

Parse parse_request(std::string_view in, size_t& used, Request& r) {
  Reader rd{in};
  const auto incomplete = [&] { return rd.bad ? Parse::bad : Parse::more; };
  if (!rd.u8(r.op)) return Parse::more;
  if (r.op == kSet) {
    if (!rd.str(r.key, kMaxKey) || !rd.str(r.value, kMaxValue)) return incomplete();
  } else if (r.op == kGet) {
    if (!rd.str(r.key, kMaxKey)) return incomplete();
  } else if (r.op == kWait) {
    uint32_t n = 0;
    if (!rd.u32(r.timeout_ms) || !rd.u32(n)) return Parse::more;
    if (n > kMaxKeys) return Parse::bad;
    r.keys.clear();
    for (uint32_t i = 0; i < n; ++i)
      if (!rd.str(r.keys.emplace_back(), kMaxKey)) return incomplete();
  } else {
    return Parse::bad;
  }
  used = rd.pos;
  return Parse::done;
}

// A request never exceeds this; a buffer beyond it without a whole request is garbage.
constexpr size_t kMaxRequest = 1 + 8 + size_t{kMaxKey} + kMaxValue;

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

struct TcpStore::Server {
  struct Client {
    int fd = -1;
    std::string in, out;
    bool waiting = false;  // a WAIT not yet answered: later requests wait behind it
    std::vector<std::string> wait_keys;
    Clock::time_point deadline;
    bool dead = false;
  };

  int listen_fd = -1;
  int wake[2] = {-1, -1};  // the destructor writes one byte: poll returns and the thread ends
  std::unordered_map<std::string, std::string> data;
  std::vector<Client> clients;
  bool changed = false;  // a SET since the waiters were last checked
  std::thread thread;

  explicit Server(int port) {
    try {
      listen_on(port);
      DSTRAIN_CHECK(::pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0, "TcpStore: pipe2 failed: {}", errno_text(errno));
      thread = std::thread([this] { run(); });
    } catch (...) {
      close_all();
      throw;
    }
  }

  ~Server() {
    if (thread.joinable()) {
      const char byte = 1;
      while (::write(wake[1], &byte, 1) < 0 && errno == EINTR) {
      }
      thread.join();
    }
    close_all();
  }

  void close_all() {
    close_fd(listen_fd);
    close_fd(wake[0]);
    close_fd(wake[1]);
    for (auto& c : clients) close_fd(c.fd);
    clients.clear();
  }

  // Dual-stack [::] reaches IPv4 and IPv6 clients alike; plain IPv4 where the kernel has no IPv6.
  void listen_on(int port) {
    int e = 0;
    for (int family : {AF_INET6, AF_INET}) {
      listen_fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (listen_fd < 0) {
        e = errno;
        continue;
      }
      const int one = 1, zero = 0;
      ::setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_storage addr{};
      socklen_t len = 0;
      if (family == AF_INET6) {
        ::setsockopt(listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons(static_cast<uint16_t>(port));
        len = sizeof *a;
      } else {
        auto* a = reinterpret_cast<sockaddr_in*>(&addr);
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons(static_cast<uint16_t>(port));
        len = sizeof *a;
      }
      if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 && ::listen(listen_fd, SOMAXCONN) == 0) return;
      e = errno;
      close_fd(listen_fd);
      if (e == EADDRINUSE || e == EACCES) break;  // IPv4 would say the same
    }
    fail(
        "TcpStore: cannot listen on port {} (MASTER_PORT={}): {}. Fix: another job or a stale process holds the port "
        "(`ss -ltnp | grep {}` shows which); end it or pick another MASTER_PORT",
        port, port, errno_text(e), port);
  }

  // Never throws: a client that misbehaves (or a failed allocation for it) is dropped, the
  // others continue; only the destructor's byte ends the loop.
  void run() noexcept {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake[0], POLLIN, 0});
      fds.push_back({listen_fd, POLLIN, 0});
      auto next = Clock::time_point::max();
      for (const auto& c : clients) {
        fds.push_back({c.fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
        if (c.waiting) next = std::min(next, c.deadline);
      }
      const int n = ::poll(fds.data(), fds.size(), next == Clock::time_point::max() ? -1 : remaining_ms(next));
      if (n < 0 && errno != EINTR) return;  // cannot happen with valid fds; never spin
      if (fds[0].revents != 0) return;
      const size_t polled = clients.size();
      for (size_t i = 0; i < polled; ++i) {
        Client& c = clients[i];
        try {
          const short re = fds[i + 2].revents;
          if ((re & (POLLIN | POLLHUP | POLLERR)) != 0) receive(c);
          if (!c.dead && (re & POLLOUT) != 0) flush(c);
          if (!c.dead) handle(c);
        } catch (...) {
          c.dead = true;
        }
      }
      // Answering one waiter lets its queued requests run, which may set keys others wait for.
      while (changed || any_expired()) {
        changed = false;
        for (auto& c : clients) {
          if (c.dead || !c.waiting) continue;
          try {
            if (answer_wait(c, false)) handle(c);
          } catch (...) {
            c.dead = true;
          }
        }
      }
      for (auto& c : clients)
        if (c.dead) close_fd(c.fd);
      std::erase_if(clients, [](const Client& c) { return c.fd < 0; });
      if ((fds[1].revents & POLLIN) != 0) accept_all();
    }
  }

  bool any_expired() const {
    const auto now = Clock::now();
    return std::any_of(clients.begin(), clients.end(), [&](const Client& c) { return !c.dead && c.waiting && c.deadline <= now; });
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;  // EAGAIN: none left; anything else: the next poll tries again
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      try {
        clients.emplace_back().fd = fd;
      } catch (...) {
        ::close(fd);
      }
    }
  }

  void receive(Client& c) {
    char buf[65536];
    for (;;) {
      const ssize_t got = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (got > 0) {
        c.in.append(buf, static_cast<size_t>(got));
        if (c.in.size() > kMaxRequest + kMaxRequest / 4) c.dead = true;  // pipelining garbage
        if (c.dead || static_cast<size_t>(got) < sizeof buf) return;
      } else if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return;
      } else {
        c.dead = true;  // closed (0) or reset
        return;
      }
    }
  }

  void flush(Client& c) {
    while (!c.out.empty()) {
      const ssize_t sent = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (sent <= 0) {
        c.dead = true;
        return;
      }
      c.out.erase(0, static_cast<size_t>(sent));
    }
  }

  // Runs the client's whole requests in order, stopping at a WAIT that has to wait.
  void handle(Client& c) {
    size_t consumed = 0;
    while (!c.waiting && !c.dead) {
      Request r;
      size_t used = 0;
      const Parse p = parse_request(std::string_view(c.in).substr(consumed), used, r);
      if (p == Parse::bad) c.dead = true;
      if (p != Parse::done) break;
      consumed += used;
      if (r.op == kSet) {
        data[std::move(r.key)] = std::move(r.value);
        changed = true;
        c.out.push_back(0);
      } else if (r.op == kGet) {
        const auto it = data.find(r.key);
        c.out.push_back(it != data.end() ? 1 : 0);
        if (it != data.end()) put_str(c.out, it->second);
      } else {
        c.waiting = true;
        c.wait_keys = std::move(r.keys);
        c.deadline = Clock::now() + std::chrono::milliseconds(r.timeout_ms);
        answer_wait(c, true);
      }
    }
    c.in.erase(0, consumed);
    if (!c.dead && c.in.size() > kMaxRequest) c.dead = true;
    if (!c.dead) flush(c);
  }

  // Answers c's WAIT when every key exists or its deadline has passed; true when answered.
  bool answer_wait(Client& c, bool fresh) {
    std::vector<std::string> missing;
    for (auto& k : c.wait_keys)
      if (!data.contains(k)) missing.push_back(std::move(k));
    if (!missing.empty() && Clock::now() < c.deadline) {
      c.wait_keys = std::move(missing);
      return false;
    }
    put_u32(c.out, static_cast<uint32_t>(missing.size()));
    for (const auto& k : missing) put_str(c.out, k);
    c.waiting = false;
    c.wait_keys.clear();
    if (!fresh) flush(c);
    return true;
  }
};

namespace {

// One request and its reply on a client's connection. Every read and write polls first, so none
// outlasts the deadline; a failure closes the connection (a half-read reply would leave it out of
// step) and throws.
struct Call {
  int& fd;
  std::string addr;
  std::string what;  // "set('key')"
  Clock::time_point deadline;

  [[noreturn]] void lost(const std::string& why) {
    close_fd(fd);
    throw Error(fmt::format("TcpStore: {} on the store at {}: {}", what, addr, why));
  }
  // Waits for `events`; false on EINTR (try again).
  bool ready(short events) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, remaining_ms(deadline));
    if (n == 0) lost("no answer in time. Fix: is rank 0's process alive and not stopped (a debugger, SIGSTOP)?");
    return n > 0;
  }
  [[noreturn]] void closed() { lost("the store closed the connection (rank 0's process ended? its log says why)"); }
  static bool again() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

  void send(std::string_view bytes) {
    while (!bytes.empty()) {
      if (!ready(POLLOUT)) continue;
      const ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && again()) continue;
      if (sent <= 0) closed();
      bytes.remove_prefix(static_cast<size_t>(sent));
    }
  }
  void recv(char* out, size_t size) {
    while (size > 0) {
      if (!ready(POLLIN)) continue;
      const ssize_t got = ::recv(fd, out, size, MSG_DONTWAIT);
      if (got < 0 && again()) continue;
      if (got <= 0) closed();
      out += got;
      size -= static_cast<size_t>(got);
    }
  }
  uint32_t u32(uint32_t max) {
    uint32_t v = 0;
    recv(reinterpret_cast<char*>(&v), 4);
    v = ntohl(v);
    if (v > max) lost(fmt::format("it answered {}, over the cap of {}: is a TcpStore listening there?", v, max));
    return v;
  }
};

// One non-blocking connect, bounded by the deadline; the socket on success, -1 and `err` otherwise.
int connect_once(const addrinfo& ai, Clock::time_point deadline, int& err) {
  int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  int rc = ::connect(fd, ai.ai_addr, ai.ai_addrlen);
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    const int n = ::poll(&p, 1, std::max(remaining_ms(deadline), 1));
    socklen_t len = sizeof err;
    if (n == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) rc = 0;
    if (n == 0) err = ETIMEDOUT;
  } else if (rc != 0) {
    err = errno;
  }
  if (rc != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, bool is_server, std::chrono::milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  DSTRAIN_CHECK(port_ >= 1 && port_ <= 65535, "TcpStore: port {} (MASTER_PORT) is not a TCP port (1..65535)", port_);
  if (is_server) server_ = std::make_unique<Server>(port_);
  // Retry until the deadline: the server's process may start after its clients.
  const auto deadline = Clock::now() + timeout_;
  auto backoff = std::chrono::milliseconds(10);
  std::string last = "nothing tried";
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    const int g = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &list);
    if (g != 0) {
      last = fmt::format("cannot resolve '{}': {}", host_, ::gai_strerror(g));
    } else {
      for (const addrinfo* ai = list; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
        int err = 0;
        fd_ = connect_once(*ai, deadline, err);
        if (fd_ < 0) last = errno_text(err);
      }
      ::freeaddrinfo(list);
    }
    if (fd_ >= 0) return;
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));  // the last try is at the deadline
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  fail(
      "TcpStore: could not connect to the store at {} within {} ms (MASTER_ADDR={}, MASTER_PORT={}; last error: {}). Fix: is "
      "rank 0 running and has it reached the rendezvous? Do all processes have the same MASTER_ADDR and MASTER_PORT? Does a "
      "firewall block the port between the nodes?",
      address(), timeout_.count(), host_, port_, last);
}

TcpStore::~TcpStore() {
  close_fd(fd_);
  server_.reset();  // wakes the thread, joins it, closes every socket it holds
}

std::string TcpStore::address() const {
  return host_.find(':') != std::string::npos ? fmt::format("[{}]:{}", host_, port_) : fmt::format("{}:{}", host_, port_);
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  DSTRAIN_CHECK(key.size() <= kMaxKey, "TcpStore: key '{}...' is {} bytes; keys are at most {}", key.substr(0, 64), key.size(), kMaxKey);
  DSTRAIN_CHECK(value.size() <= kMaxValue, "TcpStore: the value of key '{}' is {} bytes; values are at most {}", key, value.size(), kMaxValue);
  DSTRAIN_CHECK(fd_ >= 0, "TcpStore: the connection to the store at {} was lost by an earlier error", address());
  Call call{fd_, address(), fmt::format("set('{}')", key), Clock::now() + timeout_};
  std::string req(1, static_cast<char>(kSet));
  put_str(req, key);
  put_str(req, std::string_view(value.data(), value.size()));
  call.send(req);
  char ack = 0;
  call.recv(&ack, 1);
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  Call call{fd_, address(), fmt::format("get('{}')", key), Clock::now() + timeout_};
  std::string req(1, static_cast<char>(kGet));
  put_str(req, key);
  call.send(req);
  char found = 0;
  call.recv(&found, 1);
  if (found != 1) call.lost("the key vanished after wait saw it (keys are never removed: a second store on that port?)");
  std::vector<char> value(call.u32(kMaxValue));
  call.recv(value.data(), value.size());
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  DSTRAIN_CHECK(fd_ >= 0, "TcpStore: the connection to the store at {} was lost by an earlier error", address());
  DSTRAIN_CHECK(keys.size() <= kMaxKeys, "TcpStore: wait on {} keys; at most {} at once", keys.size(), kMaxKeys);
  std::string req(1, static_cast<char>(kWait));
  put_u32(req, clamp_ms(timeout));
  put_u32(req, static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    DSTRAIN_CHECK(k.size() <= kMaxKey, "TcpStore: key '{}...' is {} bytes; keys are at most {}", k.substr(0, 64), k.size(), kMaxKey);
    put_str(req, k);
  }
  Call call{fd_, address(), "wait", Clock::now() + timeout + kReplyGrace};
  call.send(req);
  std::vector<std::string> missing(call.u32(static_cast<uint32_t>(keys.size())));
  for (auto& k : missing) {
    k.resize(call.u32(kMaxKey));
    call.recv(k.data(), k.size());
  }
  if (!missing.empty())
    fail(
        "TcpStore at {}: key(s) {} did not appear within {} ms. Fix: the rank that sets them failed or has not got there yet — "
        "check its log; a slow start (loading, compiling) needs a longer timeout",
        address(), fmt::join(missing, ", "), timeout.count());
}

}  // namespace dstrain
