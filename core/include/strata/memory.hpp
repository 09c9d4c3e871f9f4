// strata SDK: the memory ledger. Every buffer the core or a plugin allocates carries a tag, so the
// run file can show current and peak bytes per tag per rank next to the analytic prediction.
#pragma once
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

#include "strata/export.hpp"
#include "strata/types.hpp"

STRATA_EXPORT_BEGIN
namespace strata {

// Every tag but `offload` is memory of the ledger's device. `offload` is host memory whatever the
// device: optimizer state a sharded strategy keeps on the host (--plugin-opt offload=optimizer) and
// the host copies of the gradient and parameter shard it stages through. New tags go at the end:
// run files name their tags, older files simply lack the newer ones.
enum class MemTag : int { params, grads, optimizer, activations, comm_buffers, workspace, offload };
inline constexpr int kNumMemTags = 7;
inline constexpr std::array<const char*, kNumMemTags> kMemTagNames = {
    "params", "grads", "optimizer", "activations", "comm_buffers", "workspace", "offload"};
inline const char* tag_name(MemTag t) { return kMemTagNames[static_cast<int>(t)]; }
// Whether a tag's buffers live in host memory rather than on the ledger's device.
inline constexpr bool is_host_tag(MemTag t) { return t == MemTag::offload; }

// Current and peak bytes per tag for this rank, and of their sum: the peak of the total is the most
// tracked device memory held at one moment, which is at most the sum of the per-tag peaks (tags
// peak at different times). The ledger belongs to one device: every Buffer accounted in it lives in
// that device's memory (a run's ledger: the run's --device), except those of host tags
// (is_host_tag), which live in host memory and are left out of the total. Not thread-safe by
// design: allocations happen on the compute thread (comm streams only use buffers allocated there).
class MemoryLedger {
 public:
  explicit MemoryLedger(Device device = Device::cpu) : device_(device) {}
  Device device() const { return device_; }
  void on_alloc(MemTag t, std::uint64_t bytes) {
    auto& c = current_[static_cast<int>(t)];
    c += bytes;
    auto& p = peak_[static_cast<int>(t)];
    if (c > p) p = c;
    if (is_host_tag(t)) return;
    total_ += bytes;
    if (total_ > total_peak_) total_peak_ = total_;
  }
  void on_free(MemTag t, std::uint64_t bytes) {
    current_[static_cast<int>(t)] -= bytes;
    if (!is_host_tag(t)) total_ -= bytes;
  }
  std::uint64_t current(MemTag t) const { return current_[static_cast<int>(t)]; }
  std::uint64_t peak(MemTag t) const { return peak_[static_cast<int>(t)]; }
  std::uint64_t total() const { return total_; }
  std::uint64_t total_peak() const { return total_peak_; }

 private:
  std::array<std::uint64_t, kNumMemTags> current_{};
  std::array<std::uint64_t, kNumMemTags> peak_{};
  std::uint64_t total_ = 0;
  std::uint64_t total_peak_ = 0;
  Device device_;
};

// Zero-filled memory on `device` (64-byte aligned on the host; on a GPU from the run's
// stream-ordered pool), and its release. Buffer's allocator; the GPU needs its backend open.
void* allocate_bytes(Device device, std::size_t bytes);
void release_bytes(Device device, void* p) noexcept;
// Zero-filled host memory for a host tag of a run on `device`: page-locked where the device's
// backend is open (a GPU's copies to and from it are then DMA at the bus's speed, not staged
// through the driver), else as allocate_bytes on the host.
void* allocate_host_bytes(Device device, std::size_t bytes);
void release_host_bytes(Device device, void* p) noexcept;

// An owning, zero-initialised array of T on the ledger's device (in host memory for a host tag),
// accounted in the ledger under a tag. Element access (data() read or written by the host,
// operator[], span()) is for host memory only: on a GPU, reach the elements through views
// (BufferView) and the run's backend.
template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(MemoryLedger& ledger, MemTag tag, std::size_t count)
      : ledger_(&ledger), tag_(tag), count_(count) {
    if (count_ == 0) return;
    if (count_ > (SIZE_MAX - 63) / sizeof(T)) throw std::bad_alloc();
    const std::size_t bytes = count_ * sizeof(T);
    data_ = static_cast<T*>(is_host_tag(tag_) ? allocate_host_bytes(ledger_->device(), bytes)
                                              : allocate_bytes(device(), bytes));
    ledger_->on_alloc(tag_, count_ * sizeof(T));
  }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_) {
      ledger_->on_free(tag_, count_ * sizeof(T));
      if (is_host_tag(tag_))
        release_host_bytes(ledger_->device(), data_);
      else
        release_bytes(device(), data_);
    }
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  std::span<T> span() { return {data_, count_}; }
  // The whole buffer as a view that carries its dtype and its device.
  BufferView view() { return {data_, count_, dtype_of<T>(), device()}; }
  Device device() const { return ledger_ && !is_host_tag(tag_) ? ledger_->device() : Device::cpu; }
  std::span<const T> span() const { return {data_, count_}; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(ledger_, o.ledger_);
    std::swap(tag_, o.tag_);
    std::swap(count_, o.count_);
    std::swap(data_, o.data_);
  }
  MemoryLedger* ledger_ = nullptr;
  MemTag tag_ = MemTag::workspace;
  std::size_t count_ = 0;
  T* data_ = nullptr;
};

// A Buffer whose element type is chosen at run time: parameters and gradients, whose dtype is the
// run's precision (strata/model.hpp MixedPrecision). Plugins reach its memory only through views
// (collectives, Context::ops(), the model's passes), never by dereferencing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(MemoryLedger& ledger, MemTag tag, DType dtype, std::size_t count)
      : dtype_(dtype), count_(count), bytes_(ledger, tag, count * dtype_size(dtype)) {}
  DType dtype() const { return dtype_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return bytes_.size(); }
  Device device() const { return bytes_.device(); }
  BufferView view() { return {bytes_.data(), count_, dtype_, device()}; }
  // Elements [offset, offset + count).
  BufferView view(std::size_t offset, std::size_t count) { return slice(view(), offset, count); }

 private:
  DType dtype_ = DType::f32;
  std::size_t count_ = 0;
  Buffer<std::uint8_t> bytes_;
};

}  // namespace strata
STRATA_EXPORT_END
