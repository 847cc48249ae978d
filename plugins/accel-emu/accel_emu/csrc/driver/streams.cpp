// The driver's streams and events: each stream is a queue served by a worker thread; an event records
// the time its stream reaches it. A forked child's streams are reset (their workers did not survive).
#include "driver.h"

#include <c10/util/Exception.h>

#include <pthread.h>

#include <chrono>
#include <new>

namespace emu {

// ------------------------------------------------------------------ streams
namespace {

constexpr c10::StreamId kPoolSize = 4;
// Tasks a stream holds before a caller that queues one more waits: a host that queues work faster than
// the device runs it is held back, and the tensors queued tasks keep alive stay bounded.
constexpr size_t kMaxQueuedTasks = 1024;

struct StreamTable {
  std::mutex mutex;
  std::vector<std::vector<StreamQueue*>> per_device;  // leaked on purpose: workers are detached
  std::vector<c10::StreamId> pool_next;
};

StreamTable* g_streams = new StreamTable();

thread_local std::vector<c10::StreamId> tls_current_stream;

c10::StreamId& tls_stream_slot(c10::DeviceIndex device) {
  if (tls_current_stream.size() <= static_cast<size_t>(device)) tls_current_stream.resize(device + 1, 0);
  return tls_current_stream[device];
}

void prepare_device_streams(c10::DeviceIndex device) {
  // g_streams->mutex held
  auto& pd = g_streams->per_device;
  if (pd.size() <= static_cast<size_t>(device)) {
    pd.resize(device + 1);
    g_streams->pool_next.resize(device + 1, 0);
  }
  auto& list = pd[device];
  while (list.size() < static_cast<size_t>(kPoolSize + 1)) {
    list.push_back(new StreamQueue(device, static_cast<c10::StreamId>(list.size())));
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StreamQueue::~StreamQueue() = default;

void StreamQueue::enqueue(std::function<void()> task) {
  std::vector<std::function<void()>> done;
  std::unique_lock<std::mutex> lock(mutex_);
  done.swap(retired_);
  if (!started_) {
    started_ = true;
    mark_initialized();
    std::thread t([this] { run(); });
    t.detach();
  }
  // a full queue makes the caller wait for the device, as a device's launch queue does
  cv_.wait(lock, [this] { return tasks_.size() < kMaxQueuedTasks || stop_; });
  tasks_.push_back(std::move(task));
  ++submitted_;
  dirty_.store(true, std::memory_order_release);
  cv_.notify_all();
}

void StreamQueue::run() {
  set_current_device(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    // a task the caller runs itself (run_now_if_idle) comes before every task queued after it
    cv_.wait(lock, [this] { return stop_ || (!tasks_.empty() && running_ == 0); });
    if (stop_) return;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    running_ = 1;
    lock.unlock();
    try {
      task();
    } catch (...) {
      std::lock_guard<std::mutex> relock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    lock.lock();
    retired_.push_back(std::move(task));
    running_ = 0;
    ++finished_;
    cv_.notify_all();
  }
}

bool StreamQueue::run_now_if_idle(const std::function<void()>& task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!tasks_.empty() || running_ != 0 || error_) return false;
    running_ = 1;
    ++submitted_;
    dirty_.store(true, std::memory_order_release);  // another thread's synchronize waits for this task
  }
  struct Done {
    StreamQueue* queue;
    ~Done() {
      std::lock_guard<std::mutex> lock(queue->mutex_);
      queue->running_ = 0;
      ++queue->finished_;
      queue->mark_clean_if_idle();
      queue->cv_.notify_all();
    }
  } done{this};
  task();
  return true;
}

void StreamQueue::synchronize() {
  // Nothing was queued since the last synchronize took the finished tasks away: every operator waits
  // for its stream, almost always an idle one, and returns here without a lock. The flag is cleared
  // (release) under the lock after the tasks finished, so a caller that reads it clear (acquire) sees
  // their writes.
  if (!dirty_.load(std::memory_order_acquire)) return;
  std::vector<std::function<void()>> done;
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t target = submitted_;
  cv_.wait(lock, [this, target] { return finished_ >= target; });
  done.swap(retired_);
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    mark_clean_if_idle();
    std::rethrow_exception(e);
  }
  mark_clean_if_idle();
}

void StreamQueue::mark_clean_if_idle() {
  if (tasks_.empty() && running_ == 0 && retired_.empty() && !error_) dirty_.store(false, std::memory_order_release);
}

bool StreamQueue::query() {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.empty() && running_ == 0;
}

void StreamQueue::reset_after_fork() {
  // the worker thread does not exist in the child; the old mutex may be held by it
  new (&mutex_) std::mutex();
  new (&cv_) std::condition_variable();
  tasks_.clear();
  retired_.clear();
  running_ = 0;
  submitted_ = finished_ = 0;
  dirty_.store(false, std::memory_order_relaxed);
  started_ = false;
  stop_ = false;
}

StreamQueue& stream_queue(c10::DeviceIndex device, c10::StreamId id) {
  // Queues never move or go (a fork resets them in place), so each thread remembers the ones it has
  // looked up: every operator waits for its stream, and that lookup then takes no lock.
  thread_local std::vector<std::vector<StreamQueue*>> known;
  if (device >= 0 && static_cast<size_t>(device) < known.size() && id >= 0 &&
      static_cast<size_t>(id) < known[device].size() && known[device][id] != nullptr) {
    return *known[device][id];
  }
  check_device(device);
  StreamQueue* queue = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_streams->mutex);
    prepare_device_streams(device);
    auto& list = g_streams->per_device[device];
    TORCH_CHECK(id >= 0 && static_cast<size_t>(id) < list.size(), "emu: unknown stream id ", id, " on emu:",
                static_cast<int>(device));
    queue = list[id];
  }
  if (known.size() <= static_cast<size_t>(device)) known.resize(device + 1);
  if (known[device].size() <= static_cast<size_t>(id)) known[device].resize(id + 1, nullptr);
  known[device][id] = queue;
  return *queue;
}

c10::Stream current_stream(c10::DeviceIndex device) {
  check_device(device);
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device),
                     tls_stream_slot(device));
}

c10::Stream exchange_stream(c10::Stream s) {
  auto old = current_stream(s.device_index());
  stream_queue(s.device_index(), s.id());  // validates
  tls_stream_slot(s.device_index()) = s.id();
  return old;
}

c10::Stream new_stream(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_streams->mutex);
  prepare_device_streams(device);
  auto& list = g_streams->per_device[device];
  auto id = static_cast<c10::StreamId>(list.size());
  list.push_back(new StreamQueue(device, id));
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

c10::Stream pool_stream(c10::DeviceIndex device) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_streams->mutex);
  prepare_device_streams(device);
  auto& next = g_streams->pool_next[device];
  auto id = static_cast<c10::StreamId>(1 + (next++ % kPoolSize));
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

void synchronize_device(c10::DeviceIndex device) {
  check_device(device);
  std::vector<StreamQueue*> list;
  {
    std::lock_guard<std::mutex> lock(g_streams->mutex);
    prepare_device_streams(device);
    list = g_streams->per_device[device];
  }
  for (auto* q : list) q->synchronize();
}

void wait_current_stream(c10::DeviceIndex device) {
  stream_queue(device, tls_stream_slot(device)).synchronize();
}

// ------------------------------------------------------------------ events
void record_event(Event* ev, const c10::Stream& s, bool timing) {
  StreamQueue& queue = stream_queue(s.device_index(), s.id());
  // an idle stream reaches the event now: no round trip through its worker thread (the profiler
  // records two events per operator)
  const bool idle = queue.query();
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(ev->mutex);
    TORCH_CHECK(ev->device < 0 || ev->device == s.device_index(), "emu: event recorded on emu:",
                static_cast<int>(ev->device), " cannot be recorded on a stream of emu:",
                static_cast<int>(s.device_index()));
    ev->recorded = true;
    ev->device = s.device_index();
    ev->timing = ev->timing || timing;
    gen = ++ev->generation;
    if (idle) {
      ev->time_ns = now_ns();
      ev->completed = true;
      ev->cv.notify_all();
      return;
    }
    ev->completed = false;
  }
  queue.enqueue([ev, gen] {
    std::lock_guard<std::mutex> lock(ev->mutex);
    if (ev->generation == gen) {
      ev->time_ns = now_ns();
      ev->completed = true;
    }
    ev->cv.notify_all();
  });
}

void block_on_event(Event* ev, const c10::Stream& s) {
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(ev->mutex);
    if (!ev->recorded) return;
    gen = ev->generation;
  }
  stream_queue(s.device_index(), s.id()).enqueue([ev, gen] {
    std::unique_lock<std::mutex> lock(ev->mutex);
    ev->cv.wait(lock, [&] { return ev->completed || ev->generation != gen; });
  });
}

bool query_event(Event* ev) {
  std::lock_guard<std::mutex> lock(ev->mutex);
  return !ev->recorded || ev->completed;
}

void synchronize_event(Event* ev) {
  std::unique_lock<std::mutex> lock(ev->mutex);
  if (!ev->recorded) return;
  ev->cv.wait(lock, [&] { return ev->completed; });
}

double elapsed_ms(Event* start, Event* end) {
  TORCH_CHECK(start->recorded && end->recorded,
              "emu: both events must be recorded before calculating elapsed time");
  TORCH_CHECK(start->timing && end->timing,
              "emu: both events must be created with enable_timing=True to measure elapsed time");
  synchronize_event(start);
  synchronize_event(end);
  std::lock_guard<std::mutex> l1(start->mutex);
  return static_cast<double>(end->time_ns - start->time_ns) / 1e6;
}

// ------------------------------------------------------------------ fork
namespace {

void after_fork_child() {
  note_forked_child();
  for (auto& list : g_streams->per_device) {
    for (auto* q : list) q->reset_after_fork();
  }
  new (&g_streams->mutex) std::mutex();
}

struct ForkHandlerInstaller {
  ForkHandlerInstaller() { pthread_atfork(nullptr, nullptr, &after_fork_child); }
} fork_handler_installer;

}  // namespace

}  // namespace emu
