// A stand-in for PyTorch's libc10_cuda.so, for machines without PyTorch or a GPU: the same
// exported `c10::cuda::CUDACachingAllocator::allocator`, an allocator object whose C++ type is
// `c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator`, with
// `attachAllocatorTraceTracker` in vtable slot 44 taking a libstdc++ `std::function` of
// `c10::CachingDeviceAllocator::TraceEntry` laid out as in torch 2.11 (136 bytes). Like PyTorch's
// allocator it takes segments from the CUDA runtime (cudaMalloc, the simulator's), cuts tensors
// from them, caches freed tensors, and calls every tracker for every event whether or not any
// history is recorded. It is not PyTorch's code: only its interface is the same.
//
// Driven through C functions (ctypes): standin_malloc(size), standin_free(ptr),
// standin_empty_cache(), standin_use_pool(id) (the pool what follows takes from: 0 the default,
// another id a private pool, as `torch.cuda.use_mem_pool` makes one; its events carry the id in
// `mempool_` as {0, id}, and only its own segments serve it). Knobs, read once:
//   STANDIN_BACKEND=async    the allocator is another class (PyTorch's cudaMallocAsync backend)
//   STANDIN_LAYOUT=shifted   events carry their fields elsewhere (a layout the shim must refuse)
#include <cstdlib>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

extern "C" int cudaMalloc(void **p, size_t size);
extern "C" int cudaFree(void *p);
extern "C" int cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);

namespace c10 {
namespace CachingDeviceAllocator {
struct TraceEntry {
  enum Action { ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM };
  Action action_;
  int8_t device_;
  size_t addr_;
  std::shared_ptr<void> context_;
  void *stream_{};
  size_t size_;
  std::pair<unsigned long long, unsigned long long> mempool_;
  uint64_t time_{};
  std::string compile_context_;
  std::string user_metadata_;
};
static_assert(sizeof(TraceEntry) == 136, "torch 2.11's TraceEntry");
static_assert(offsetof(TraceEntry, addr_) == 8 && offsetof(TraceEntry, stream_) == 32 &&
                  offsetof(TraceEntry, size_) == 40,
              "torch 2.11's field offsets");
using AllocatorTraceTracker = std::function<void(const TraceEntry &)>;
} // namespace CachingDeviceAllocator

namespace cuda {
namespace CUDACachingAllocator {
using c10::CachingDeviceAllocator::AllocatorTraceTracker;
using c10::CachingDeviceAllocator::TraceEntry;

#define PAD(n) virtual void pad##n() {}
struct CUDAAllocator {
  // Slots 0 to 43, as many as precede attachAllocatorTraceTracker in torch 2.10 and 2.11.
  PAD(00) PAD(01) PAD(02) PAD(03) PAD(04) PAD(05) PAD(06) PAD(07) PAD(08) PAD(09)
  PAD(10) PAD(11) PAD(12) PAD(13) PAD(14) PAD(15) PAD(16) PAD(17) PAD(18) PAD(19)
  PAD(20) PAD(21) PAD(22) PAD(23) PAD(24) PAD(25) PAD(26) PAD(27) PAD(28) PAD(29)
  PAD(30) PAD(31) PAD(32) PAD(33) PAD(34) PAD(35) PAD(36) PAD(37) PAD(38) PAD(39)
  PAD(40) PAD(41) PAD(42) PAD(43)
  virtual void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) = 0;
};

namespace Native {
// `asked`: the bytes the caller asked for, which PyTorch's trace gives (docs/cuda-facts.md).
struct Block { char *ptr; size_t size; bool free; size_t asked; };
struct Segment {
  char *base;
  size_t size;
  std::vector<Block> blocks;
  unsigned long long pool;
  unsigned long long stream;
};

class NativeCachingAllocator : public CUDAAllocator {
 public:
  std::vector<AllocatorTraceTracker> trackers;
  std::vector<Segment> segments;
  bool shifted = false;
  unsigned long long pool = 0;
  // The stream the next requests are made on (0: the default stream), as PyTorch keeps a
  // stream's blocks to it: a segment serves the stream it was made for.
  unsigned long long stream = 0;

  void attachAllocatorTraceTracker(AllocatorTraceTracker tracker) override {
    trackers.push_back(tracker); // a copy, as PyTorch makes one per device
  }

  void record(TraceEntry::Action a, size_t addr, size_t size, unsigned long long on = 0) {
    TraceEntry e{};
    e.action_ = a;
    e.device_ = 0;
    e.addr_ = shifted ? size : addr;
    e.size_ = shifted ? addr : size;
    e.stream_ = reinterpret_cast<void *>(static_cast<uintptr_t>(on));
    e.mempool_ = {0, pool};
    for (const auto &t : trackers) t(e);
  }

  void *malloc(size_t asked) {
    size_t size = (asked + 511) & ~size_t(511);
    // Best fit, as PyTorch's: the smallest free block that holds the request.
    Segment *best_seg = nullptr;
    size_t best_i = 0;
    for (auto &s : segments)
      for (size_t i = 0; i < s.blocks.size() && s.pool == pool && s.stream == stream; i++) {
        Block &b = s.blocks[i];
        if (!b.free || b.size < size) continue;
        if (!best_seg || b.size < best_seg->blocks[best_i].size) {
          best_seg = &s;
          best_i = i;
        }
      }
    if (best_seg) {
      Segment &s = *best_seg;
      size_t i = best_i;
      Block &b = s.blocks[i];
      if (b.size > size) s.blocks.insert(s.blocks.begin() + i + 1, Block{b.ptr + size, b.size - size, true, 0});
      s.blocks[i].size = size;
      s.blocks[i].free = false;
      s.blocks[i].asked = asked;
      record(TraceEntry::ALLOC, (size_t)s.blocks[i].ptr, asked, stream);
      return s.blocks[i].ptr;
    }
    size_t seg = size < (1u << 20) ? (2u << 20) : (size + (2u << 20) - 1) & ~size_t((2u << 20) - 1);
    // As torch.cuda.set_per_process_memory_fraction holds PyTorch's allocator: a segment that
    // would take its reserved memory past the allowed bytes (STANDIN_ALLOWED) is refused with
    // no cudaMalloc tried.
    size_t reserved = 0;
    for (auto &s : segments) reserved += s.size;
    const char *allowed = getenv("STANDIN_ALLOWED");
    if (allowed && reserved + seg > strtoull(allowed, nullptr, 10)) {
      size_t f = 0, t = 0;
      cudaMemGetInfo(&f, &t);
      record(TraceEntry::OOM, f, size);
      return nullptr;
    }
    void *p = nullptr;
    if (cudaMalloc(&p, seg) != 0) {
      size_t f = 0, t = 0;
      cudaMemGetInfo(&f, &t);
      record(TraceEntry::OOM, f, size);
      return nullptr;
    }
    record(TraceEntry::SEGMENT_ALLOC, (size_t)p, seg, stream);
    Segment s{(char *)p, seg, {}, pool, stream};
    s.blocks.push_back(Block{(char *)p, seg, true, 0});
    segments.push_back(s);
    return malloc(asked);
  }

  void free(void *ptr) {
    for (auto &s : segments)
      for (auto &b : s.blocks)
        if (b.ptr == ptr && !b.free) {
          record(TraceEntry::FREE_REQUESTED, (size_t)b.ptr, b.asked, s.stream);
          b.free = true;
          record(TraceEntry::FREE_COMPLETED, (size_t)b.ptr, b.asked, s.stream);
          return;
        }
  }

  // A free of a block another stream still uses (as after `record_stream`): requested now (the
  // allocated bytes drop), completed by a later `process_events` once the stream's work is
  // done, the block reusable only then.
  std::vector<void *> deferred;
  void free_deferred(void *ptr) {
    for (auto &s : segments)
      for (auto &b : s.blocks)
        if (b.ptr == ptr && !b.free) {
          record(TraceEntry::FREE_REQUESTED, (size_t)b.ptr, b.asked);
          deferred.push_back(ptr);
          return;
        }
  }

  void process_events() {
    for (void *ptr : deferred)
      for (auto &s : segments)
        for (auto &b : s.blocks)
          if (b.ptr == ptr && !b.free) {
            b.free = true;
            record(TraceEntry::FREE_COMPLETED, (size_t)b.ptr, b.asked);
          }
    deferred.clear();
  }

  void empty_cache() {
    for (size_t i = 0; i < segments.size();) {
      bool idle = true;
      for (auto &b : segments[i].blocks) idle = idle && b.free;
      idle = idle && segments[i].pool == 0;
      if (!idle) { i++; continue; }
      cudaFree(segments[i].base);
      record(TraceEntry::SEGMENT_FREE, (size_t)segments[i].base, segments[i].size);
      segments.erase(segments.begin() + i);
    }
  }
};
} // namespace Native

// PyTorch's cudaMallocAsync backend has no trace: another class.
namespace CudaMallocAsync {
class CudaMallocAsyncAllocator : public CUDAAllocator {
 public:
  void attachAllocatorTraceTracker(AllocatorTraceTracker) override { std::abort(); }
};
} // namespace CudaMallocAsync

static Native::NativeCachingAllocator native;
static CudaMallocAsync::CudaMallocAsyncAllocator async_backend;

static CUDAAllocator *chosen() {
  const char *b = std::getenv("STANDIN_BACKEND");
  if (b && std::strcmp(b, "async") == 0) return &async_backend;
  const char *l = std::getenv("STANDIN_LAYOUT");
  native.shifted = l && std::strcmp(l, "shifted") == 0;
  return &native;
}

__attribute__((visibility("default"))) std::atomic<CUDAAllocator *> allocator{chosen()};
} // namespace CUDACachingAllocator
} // namespace cuda
} // namespace c10

using c10::cuda::CUDACachingAllocator::native;

extern "C" __attribute__((visibility("default"))) void *standin_malloc(size_t size) { return native.malloc(size); }
extern "C" __attribute__((visibility("default"))) void standin_free(void *p) { native.free(p); }
extern "C" __attribute__((visibility("default"))) void standin_free_deferred(void *p) { native.free_deferred(p); }
extern "C" __attribute__((visibility("default"))) void standin_process_events() { native.process_events(); }
extern "C" __attribute__((visibility("default"))) void standin_empty_cache() { native.empty_cache(); }
extern "C" __attribute__((visibility("default"))) void standin_use_pool(unsigned long long id) { native.pool = id; }
extern "C" __attribute__((visibility("default"))) void standin_use_stream(unsigned long long id) { native.stream = id; }
