// TcpStore: exact bytes through the server (empty, zeros, 1 MiB), a get that waits for a later set,
// waits and connects that time out naming the key / host:port, a port already taken, a garbage
// client that must not stop the others, clients that start before the server, a server that goes
// away mid-call, and one rendezvous across processes (fork).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "ops/error.h"
#include "zero/tcp_store.h"

using namespace dstrain;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// A port nobody listens on right now: bind port 0, read what the kernel chose, close.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

long long ms_since(Clock::time_point t) { return std::chrono::duration_cast<milliseconds>(Clock::now() - t).count(); }

// The Error's text, or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(TcpStore, ThreeClientsRoundTripExactBytes) {
  const int port = free_port();
  TcpStore server("127.0.0.1", port, true, milliseconds(5000));
  std::vector<char> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131 + 7) % 251);
  const std::vector<std::vector<char>> values = {{}, {'a', '\0', 'b', '\0', '\xff', '\0'}, big};
  std::vector<std::vector<std::vector<char>>> seen(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      TcpStore client("localhost", port, false, milliseconds(5000));
      client.set("value/" + std::to_string(r), values[r]);
      for (int q = 0; q < 3; ++q) seen[r].push_back(client.get("value/" + std::to_string(q)));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(seen[r].size(), 3u);
    for (int q = 0; q < 3; ++q) EXPECT_EQ(seen[r][q], values[q]) << "client " << r << " reading value/" << q;
  }
  // The server's own client sees them too, and a second set replaces the value.
  EXPECT_EQ(server.get("value/1"), values[1]);
  server.set("value/1", bytes("replaced"));
  EXPECT_EQ(server.get("value/1"), bytes("replaced"));
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(port));
}

TEST(TcpStore, GetBeforeSetReturnsOnceSet) {
  const int port = free_port();
  TcpStore server("127.0.0.1", port, true, milliseconds(5000));
  std::atomic<Clock::rep> returned_at{0};
  std::vector<char> got;
  std::thread reader([&] {
    TcpStore client("127.0.0.1", port, false, milliseconds(5000));
    got = client.get("late");
    returned_at = Clock::now().time_since_epoch().count();
  });
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(returned_at.load(), 0) << "get returned before the key was set";
  TcpStore writer("127.0.0.1", port, false, milliseconds(5000));
  const auto set_at = Clock::now();
  writer.set("late", bytes("here"));
  reader.join();
  EXPECT_EQ(got, bytes("here"));
  const Clock::time_point ret{Clock::duration(returned_at.load())};
  EXPECT_GE(ret, set_at);
  EXPECT_LT(ret - set_at, milliseconds(200)) << "get returned " << (ret - set_at).count() << " ns after the set";
}

TEST(TcpStore, WaitNamesTheMissingKeyAfterItsTimeout) {
  const int port = free_port();
  TcpStore server("127.0.0.1", port, true, milliseconds(5000));
  TcpStore client("127.0.0.1", port, false, milliseconds(5000));
  client.set("present/a", bytes("1"));
  server.set("present/b", bytes("2"));
  const auto t0 = Clock::now();
  const std::string e = error_of([&] { client.wait({"present/a", "never/there", "present/b"}, milliseconds(300)); });
  const auto took = ms_since(t0);
  EXPECT_THAT(e, HasSubstr("never/there"));
  EXPECT_THAT(e, Not(HasSubstr("present/")));
  EXPECT_THAT(e, HasSubstr("300 ms"));
  EXPECT_GE(took, 290);
  EXPECT_LT(took, 2000);
  // The connection stays in step after a timed-out wait; get times out the same way.
  client.wait({"present/a", "present/b"}, milliseconds(300));
  EXPECT_EQ(client.get("present/b"), bytes("2"));
  TcpStore quick("127.0.0.1", port, false, milliseconds(200));
  EXPECT_THAT(error_of([&] { quick.get("never/either"); }), HasSubstr("never/either"));
}

TEST(TcpStore, ConnectToUnservedPortNamesAddressAfterTimeout) {
  const int port = free_port();
  const auto t0 = Clock::now();
  const std::string e = error_of([&] { TcpStore client("127.0.0.1", port, false, milliseconds(400)); });
  const auto took = ms_since(t0);
  EXPECT_THAT(e, HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_THAT(e, HasSubstr("MASTER_PORT"));
  EXPECT_THAT(e, HasSubstr("MASTER_ADDR"));
  EXPECT_GE(took, 390);
  EXPECT_LT(took, 3000);
}

TEST(TcpStore, PortAlreadyListenedOnNamesPort) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  const std::string e = error_of([&] { TcpStore server("127.0.0.1", port, true, milliseconds(500)); });
  ::close(fd);
  EXPECT_THAT(e, HasSubstr("port " + std::to_string(port)));
  EXPECT_THAT(e, HasSubstr("MASTER_PORT"));
}

TEST(TcpStore, GarbageClientIsDroppedOthersContinue) {
  const int port = free_port();
  TcpStore server("127.0.0.1", port, true, milliseconds(5000));
  TcpStore good("127.0.0.1", port, false, milliseconds(5000));
  good.set("before", bytes("ok"));
  // An unknown op, and a SET whose key claims 4 GiB: the server closes each connection.
  const std::vector<std::string> garbage = {std::string("\x7fhello garbage", 14), std::string("\x01\xff\xff\xff\xff", 5)};
  for (const auto& g : garbage) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::send(fd, g.data(), g.size(), MSG_NOSIGNAL), static_cast<ssize_t>(g.size()));
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c = 0;
    EXPECT_EQ(::recv(fd, &c, 1, 0), 0) << "the server should close a connection that sends garbage";
    ::close(fd);
  }
  // One that disconnects in the middle of a request.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ::send(fd, "\x01\x00\x00\x00\x10par", 8, MSG_NOSIGNAL);
    ::close(fd);
  }
  good.set("after", bytes("still"));
  EXPECT_EQ(good.get("before"), bytes("ok"));
  TcpStore late("127.0.0.1", port, false, milliseconds(5000));
  EXPECT_EQ(late.get("after"), bytes("still"));
}

TEST(TcpStore, ClientsStartedBeforeTheServerConnect) {
  const int port = free_port();
  std::vector<std::optional<std::vector<char>>> got(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TcpStore client("127.0.0.1", port, false, milliseconds(5000));
      client.set("early/" + std::to_string(r), bytes("from " + std::to_string(r)));
      got[r] = client.get("early/" + std::to_string(1 - r));
    });
  }
  std::this_thread::sleep_for(milliseconds(300));
  {
    TcpStore server("127.0.0.1", port, true, milliseconds(5000));
    for (auto& t : threads) t.join();
    EXPECT_EQ(server.get("early/0"), bytes("from 0"));
  }
  ASSERT_TRUE(got[0].has_value() && got[1].has_value());
  EXPECT_EQ(*got[0], bytes("from 1"));
  EXPECT_EQ(*got[1], bytes("from 0"));
}

TEST(TcpStore, ServerGoneDuringGetNamesIt) {
  const int port = free_port();
  auto server = std::make_unique<TcpStore>("127.0.0.1", port, true, milliseconds(5000));
  TcpStore client("127.0.0.1", port, false, milliseconds(5000));
  std::string e;
  Clock::time_point failed_at;
  std::thread t([&] {
    e = error_of([&] { client.get("never"); });
    failed_at = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(200));
  const auto gone_at = Clock::now();
  server.reset();
  t.join();
  EXPECT_THAT(e, HasSubstr("closed the connection"));
  EXPECT_THAT(e, HasSubstr("127.0.0.1:" + std::to_string(port)));
  EXPECT_LT(failed_at - gone_at, milliseconds(1000));
  // Later calls say the connection is gone instead of hanging.
  EXPECT_THAT(error_of([&] { client.set("x", bytes("y")); }), HasSubstr("lost by an earlier error"));
}

TEST(TcpStore, ForkedClientSetsParentServerGets) {
  const int port = free_port();
  // Fork before this process starts any thread (the server's): the child only connects and sets.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = 1;
    try {
      TcpStore client("127.0.0.1", port, false, milliseconds(5000));
      client.set("child/pid", bytes(std::to_string(::getpid())));
      rc = client.get("parent/ack") == bytes("seen") ? 0 : 2;
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  std::vector<char> got;
  {
    TcpStore server("127.0.0.1", port, true, milliseconds(5000));
    got = server.get("child/pid");
    server.set("parent/ack", bytes("seen"));
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  EXPECT_EQ(got, bytes(std::to_string(pid)));
}
