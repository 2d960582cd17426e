#include "tdist/symmetric_heap.h"

#include <cstring>

#include "tdist/error.h"

namespace tdist {
namespace {

// The allocation request every rank contributes to the bootstrap exchange. The tag keeps a rank
// that is in some other collective (a barrier, say) from being read as an allocation.
constexpr std::uint64_t kAllocationTag = 0x7464697374616c6cULL;  // "tdistall"

std::string encode_request(std::uint64_t count, std::uint64_t bytes,
                           const std::set<std::size_t>& released) {
  std::vector<std::uint64_t> words = {kAllocationTag, count, bytes, released.size()};
  words.insert(words.end(), released.begin(), released.end());
  return std::string(reinterpret_cast<const char*>(words.data()), words.size() * 8);
}

struct Request {
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
  std::set<std::size_t> released;
};

bool decode_request(const std::string& blob, Request& out) {
  if (blob.size() < 32 || blob.size() % 8 != 0) return false;
  std::vector<std::uint64_t> words(blob.size() / 8);
  std::memcpy(words.data(), blob.data(), blob.size());
  if (words[0] != kAllocationTag || words.size() != 4 + words[3]) return false;
  out.count = words[1];
  out.bytes = words[2];
  out.released.insert(words.begin() + 4, words.end());
  return true;
}

std::string human_bytes(std::size_t bytes) {
  Message s;
  if (bytes >= (1ull << 30)) {
    s << static_cast<double>(bytes) / (1ull << 30) << " GiB";
  } else if (bytes >= (1ull << 20)) {
    s << static_cast<double>(bytes) / (1ull << 20) << " MiB";
  } else {
    s << bytes << " B";
  }
  return s.str();
}

}  // namespace

SymmetricBlock::SymmetricBlock(std::shared_ptr<SymmetricHeap> heap, std::size_t offset,
                               std::size_t bytes, void* local)
    : heap_(std::move(heap)), offset_(offset), bytes_(bytes), local_(local) {}

SymmetricBlock::~SymmetricBlock() { heap_->release_later(offset_); }

void* SymmetricBlock::peer(int pe) const { return heap_->peer_address(local_, pe); }

std::shared_ptr<SymmetricHeap> SymmetricHeap::create(Bootstrap& bootstrap,
                                                     SymmetricBackend& backend,
                                                     std::size_t capacity) {
  return std::shared_ptr<SymmetricHeap>(new SymmetricHeap(bootstrap, backend, capacity));
}

SymmetricHeap::SymmetricHeap(Bootstrap& bootstrap, SymmetricBackend& backend,
                             std::size_t capacity)
    : bootstrap_(bootstrap),
      backend_(backend),
      rank_(bootstrap.rank()),
      world_size_(bootstrap.world_size()),
      arena_(capacity) {
  TDIST_CHECK(capacity > 0, bootstrap.rank(), "SymmetricHeap", "the heap size must be positive");
  // Every rank must reserve the same amount, or the backend's own collective reservation fails
  // in ways that are much harder to read than this.
  auto sizes = bootstrap_.allgather(std::to_string(capacity));
  for (int r = 0; r < bootstrap_.world_size(); ++r) {
    TDIST_CHECK(sizes[r] == sizes[bootstrap_.rank()], bootstrap_.rank(), "SymmetricHeap",
                "rank " << r << " asked for a heap of " << sizes[r] << " B but this rank for "
                        << capacity << " B; give every rank the same heap size");
  }
  base_ = static_cast<std::byte*>(backend_.reserve(capacity));
  TDIST_CHECK(base_ != nullptr, bootstrap.rank(), "SymmetricHeap",
              backend_.name() << " could not reserve " << human_bytes(capacity)
                              << " of device memory; lower the heap size");
  peer_bases_.resize(bootstrap_.world_size());
  for (int pe = 0; pe < bootstrap_.world_size(); ++pe) {
    peer_bases_[pe] = static_cast<std::byte*>(backend_.peer_base(pe));
  }
}

std::shared_ptr<SymmetricBlock> SymmetricHeap::allocate(std::size_t bytes,
                                                        const std::string& what) {
  const int me = rank_;
  std::string request;
  std::uint64_t count;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TDIST_CHECK(!closed_, me, "symmetric_allocate",
                what << ": the runtime was finalized; call triton_dist.init() again first");
    count = allocation_count_++;
    request = encode_request(count, bytes, pending_release_);
  }
  auto blobs = bootstrap_.allgather(request);

  std::vector<Request> requests(blobs.size());
  for (std::size_t r = 0; r < blobs.size(); ++r) {
    TDIST_CHECK(decode_request(blobs[r], requests[r]), me, "symmetric_allocate",
                what << ": rank " << r
                     << " is in a different collective call, not a symmetric allocation; every "
                        "rank must make the same sequence of collective calls");
  }
  bool sizes_agree = true;
  for (const auto& req : requests) {
    sizes_agree = sizes_agree && req.bytes == bytes && req.count == count;
  }
  if (!sizes_agree) {
    Message sizes;
    for (std::size_t r = 0; r < requests.size(); ++r) {
      sizes << (r ? ", " : "") << "rank " << r << ": " << requests[r].bytes << " B (allocation #"
            << requests[r].count << ")";
    }
    TDIST_FAIL(me, "symmetric_allocate",
               what << ": ranks asked for different sizes (" << sizes.str()
                    << "). Symmetric allocations are collective: every rank must allocate the "
                       "same shape and dtype, in the same order. Nothing was allocated.");
  }

  std::vector<std::set<std::size_t>> released;
  for (auto& req : requests) released.push_back(std::move(req.released));

  std::lock_guard<std::mutex> lock(mutex_);
  reclaim_released_everywhere(released);
  auto offset = arena_.allocate(bytes);
  TDIST_CHECK(offset.has_value(), me, "symmetric_allocate",
              what << ": the symmetric heap is exhausted: asked for " << human_bytes(bytes) << ", "
                   << human_bytes(arena_.bytes_in_use()) << " of " << human_bytes(arena_.capacity())
                   << " in use, largest free block " << human_bytes(arena_.largest_free_block())
                   << ". Enlarge it with TRITON_DIST_SYMMETRIC_HEAP_SIZE (e.g. 8G) or "
                      "triton_dist.init(heap_size=...), or free symmetric tensors on every rank.");
  auto block = std::make_shared<SymmetricBlock>(shared_from_this(), *offset, bytes, base_ + *offset);
  live_[*offset] = block;
  return block;
}

std::shared_ptr<SymmetricBlock> SymmetricHeap::block_containing(const void* ptr, std::size_t bytes,
                                                                const std::string& op) const {
  const std::size_t offset = offset_of(ptr, bytes, op);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.upper_bound(offset);
  if (it != live_.begin()) {
    --it;
    auto block = it->second.lock();
    if (block && offset + bytes <= block->offset() + block->bytes()) return block;
  }
  TDIST_FAIL(rank_, op,
             "the " << bytes << " B at " << ptr
                    << " are inside the symmetric heap but not inside one live symmetric tensor; "
                       "use a tensor from triton_dist.symm_empty() (or a view of one) that is "
                       "still alive");
}

void SymmetricHeap::reclaim_released_everywhere(
    const std::vector<std::set<std::size_t>>& released) {
  // Every rank sees the same `released` lists, so every rank reclaims the same offsets.
  for (std::size_t offset : released[0]) {
    bool everywhere = true;
    for (const auto& rank_released : released) everywhere = everywhere && rank_released.count(offset);
    if (!everywhere) continue;
    arena_.release(offset);
    pending_release_.erase(offset);
  }
}

void SymmetricHeap::release_later(std::size_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  pending_release_.insert(offset);
  live_.erase(offset);
}

bool SymmetricHeap::contains(const void* ptr, std::size_t bytes) const {
  auto p = static_cast<const std::byte*>(ptr);
  return base_ != nullptr && p >= base_ && bytes <= arena_.capacity() &&
         p - base_ <= static_cast<std::ptrdiff_t>(arena_.capacity() - bytes);
}

std::size_t SymmetricHeap::offset_of(const void* ptr, std::size_t bytes,
                                     const std::string& op) const {
  TDIST_CHECK(contains(ptr, bytes), rank(), op,
              "the tensor at " << ptr << " (" << bytes
                               << " B) is not on the symmetric heap; allocate it with "
                                  "triton_dist.symm_empty() or symm_zeros()");
  return static_cast<std::size_t>(static_cast<const std::byte*>(ptr) - base_);
}

void* SymmetricHeap::peer_address(const void* local, int pe) const {
  const int me = rank();
  TDIST_CHECK(pe >= 0 && pe < world_size(), me, "peer_address",
              "peer " << pe << " is out of range for a world of size " << world_size());
  std::size_t offset = offset_of(local, 1, "peer_address");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TDIST_CHECK(!closed_, me, "peer_address", "the runtime was finalized");
  }
  TDIST_CHECK(peer_bases_[pe] != nullptr, me, "peer_address",
              "rank " << pe << " is on another node: its memory cannot be mapped with loads and "
                         "stores; use put/get (libshmem_device) to reach it");
  return peer_bases_[pe] + offset;
}

SymmetricHeapStats SymmetricHeap::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {arena_.capacity(), arena_.bytes_in_use(), arena_.live_allocations(),
          pending_release_.size()};
}

void SymmetricHeap::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  pending_release_.clear();
  live_.clear();
}

}  // namespace tdist
