// The counting CPU allocator; see tensor_memory.h.
#include "dispatch/tensor_memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace dtrain::dispatch {

namespace {

// The sizes of live blocks, in shards by address so that intra-op threads rarely share a lock. The data
// pointer is its own context (libtorch's copy-on-write and resizing expect that of a CPU allocation).
class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* p = c10::alloc_cpu(n);
    Shard& s = shard(p);
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.sizes[p] = static_cast<int64_t>(n);
    }
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t seen = peak_.load();
    while (now > seen && !peak_.compare_exchange_weak(seen, now)) {
    }
    return c10::DataPtr(p, p, &release, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(live_.load()); }

  static CountingAllocator& get() {
    static CountingAllocator* a = new CountingAllocator();  // never destroyed: frees may come at exit
    return *a;
  }

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<void*, int64_t> sizes;  // guarded by mu
  };
  static constexpr size_t kShards = 16;
  Shard& shard(void* p) { return shards_[(reinterpret_cast<uintptr_t>(p) >> 6) % kShards]; }

  static void release(void* p) {
    CountingAllocator& a = get();
    int64_t n = 0;
    {
      Shard& s = a.shard(p);
      std::lock_guard<std::mutex> lock(s.mu);
      auto it = s.sizes.find(p);
      if (it != s.sizes.end()) {
        n = it->second;
        s.sizes.erase(it);
      }
    }
    a.live_.fetch_sub(n);
    c10::free_cpu(p);
  }

  std::array<Shard, kShards> shards_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

std::atomic<bool> g_installed{false};

}  // namespace

void install_tensor_memory_counter() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::SetCPUAllocator(&CountingAllocator::get(), /*priority=*/255);
    g_installed.store(true);
  });
}

bool tensor_memory_counter_installed() { return g_installed.load(); }

int64_t tensor_bytes_live() { return g_installed.load() ? CountingAllocator::get().live() : 0; }
int64_t tensor_bytes_peak() { return g_installed.load() ? CountingAllocator::get().peak() : 0; }
void reset_tensor_peak() {
  if (g_installed.load()) CountingAllocator::get().reset_peak();
}

}  // namespace dtrain::dispatch
