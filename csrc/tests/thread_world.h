// Test fixtures: a Bootstrap whose ranks are threads of one process, and a SymmetricBackend over
// host memory, so heap logic is tested on machines without a GPU.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tdist/bootstrap.h"
#include "tdist/symmetric_backend.h"

namespace tdist::testing {

class ThreadExchange {
 public:
  explicit ThreadExchange(int world_size) : world_size_(world_size), slots_(world_size) {}

  std::vector<std::string> allgather(int rank, const std::string& mine) {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t my_round = round_;
    slots_[rank] = mine;
    if (++arrived_ == world_size_) {
      result_ = slots_;
      arrived_ = 0;
      ++round_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return round_ != my_round; });
    }
    return result_;
  }

 private:
  int world_size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> slots_;
  std::vector<std::string> result_;
  int arrived_ = 0;
  std::uint64_t round_ = 0;
};

class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(ThreadExchange& exchange, int rank, int world_size)
      : exchange_(exchange), rank_(rank), world_size_(world_size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::vector<std::string> allgather(const std::string& mine) override {
    return exchange_.allgather(rank_, mine);
  }

 private:
  ThreadExchange& exchange_;
  int rank_;
  int world_size_;
};

class HostBackend final : public SymmetricBackend {
 public:
  std::string name() const override { return "host"; }
  void* reserve(std::size_t bytes) override {
    memory_.resize(bytes);
    return memory_.data();
  }
  void* peer_base(int) override { return memory_.data(); }
  void barrier_all_on_stream(CUstream) override {}
  bool initialize_module(CUmodule, const ModulePtx&) override { return false; }
  void finalize() override { memory_.clear(); }

 private:
  std::vector<std::byte> memory_;
};

// Runs body(rank) on world_size threads and rethrows the first exception.
inline void run_ranks(int world_size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace tdist::testing
