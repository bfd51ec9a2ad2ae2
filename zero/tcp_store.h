// TcpStore: the key-value store the processes of one job meet at, over TCP at the launcher's
// MASTER_ADDR:MASTER_PORT (torchrun's, srun's) — how host-transport ranks started without mpirun
// find each other (the Gloo backend, zero/gloo_communicator.h, publishes each rank's address in it).
// The role torch's c10d TCPStore plays for init_process_group("gloo").
//
// One process serves it (rank 0: is_server = true, listening on every interface at `port`), every
// process — the server's own included — is a client connected to host:port. Keys are strings,
// values bytes; a key is written once (set again: the new value replaces it), read any number of
// times. get and wait block until the keys exist, up to the timeout.
//
// Failures are dstrain::Error naming the address, the key and the fix, never a hang: connecting
// retries until the timeout (the server may start after its clients), then names host:port and the
// variables it came from; a port the server cannot bind names it (another job, a stale process); a
// key that does not appear within the timeout names the key; a server that goes away names it.
// The server ends with its TcpStore; clients must be done with it by then (the Gloo backend keeps
// the store until every rank has connected).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace dstrain {

class TcpStore {
 public:
  // host: the server's name or address (MASTER_ADDR; "localhost", "10.0.0.1", "node03"); port:
  // 1..65535 (MASTER_PORT). is_server: this process listens on `port` first (SO_REUSEADDR), on all
  // interfaces. Connects (retrying) within `timeout`, which also bounds every later call.
  TcpStore(std::string host, int port, bool is_server, std::chrono::milliseconds timeout);
  ~TcpStore();  // closes the connection; the server's thread and its listening socket end
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Blocks until `key` exists (timeout: Error naming it), then returns its value.
  std::vector<char> get(const std::string& key);
  // Blocks until every key exists; Error naming the missing ones after `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

  std::chrono::milliseconds timeout() const { return timeout_; }
  // "localhost:29500"
  std::string address() const;

 private:
  struct Server;  // the listening socket and its thread (rank 0 only)
  std::string host_;
  int port_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;  // this client's connection
};

}  // namespace dstrain
