// sluice's native gRPC edge: gRPC C++ (the library Triton's own front-end is built on) owns
// the connections, HTTP/2, HPACK, flow control, keepalive, deadlines and gRPC's message
// framing; this module only moves whole messages between gRPC's threads and Python.
//
// Rules of this file:
// - No gRPC behaviour here beyond moving bytes: every call of every method path is handed to
//   Python (`drain()`), which answers with `finish()` (and `write()` for streams). Status codes
//   and messages are decided in Python (frontends/errors.grpc_error), never here.
// - gRPC's asynchronous (completion-queue) API, as Triton's own front-end uses it: one poller
//   thread (SLUICE_GRPC_EDGE_THREADS to change) runs `cq->Next`, so a request is read, and its
//   answer written, on the thread that polls the sockets: no hop through gRPC's callback
//   executor (measured: the callback API cost 20-40 us more server CPU per request).
// - gRPC threads never touch Python objects and never take the GIL. They append events to a
//   queue and write an eventfd only when the queue turns non-empty; the asyncio loop watches
//   the eventfd and drains every pending event per wake-up.
// - Python's answers are queued; flush() (once per event-loop turn) arms one grpc::Alarm that
//   wakes a poller, which starts them all: a Write/Finish may run gRPC's transport work inline
//   (HPACK, framing, the socket write), which must not be paid on the asyncio thread.
// - Calls are reference-counted: every operation in flight holds a reference, as do the table
//   of live calls (until gRPC says the call is done) and a Python-side lookup (for one
//   operation). Operations are never started while a lock of ours is held.
// - A call cancelled by the client, by its deadline or by shutdown has been answered by gRPC;
//   Python hears of it (EV_CANCEL) to cancel its task, and a late answer finds no call.
// - Co-location at low load (start()'s `colocate`, 0: never): while that many calls in a
//   row each arrive with no other call in flight, the poller pins itself and the asyncio
//   thread to the CPU it is on, so the two hand-offs of a call stay on one CPU (measured on
//   the 2-vCPU VM: c=1 x1.16-1.40, bench/RESULTS.md); the first call that arrives while
//   another is in flight, or a message of kFlatMin bytes or more either way, gives both
//   threads their CPUs back, as does inference the edge does not see: Python says with
//   others() when HTTP or in-process requests are in flight (a busy loop keeps its CPUs;
//   measured: HTTP c=8 beside lone gRPC calls ran x0.95 co-located). The poller decides
//   from its own count of calls handed to Python and not answered, and others() spreads at
//   once; colocation() tells Python which CPUs were used, so that threads and processes
//   that inherited one are given theirs back.
// - Copies: a received message of 64 KB or more is made contiguous on the gRPC thread that
//   read it and reaches Python as a read-only memoryview over that memory (smaller ones as
//   bytes); an answer is bytes or a list of buffers (the codec's parts, tensors included):
//   parts of 64 KB or more are lent to gRPC as slices over the Python buffers (no copy;
//   released by the loop once gRPC drops them), runs of smaller parts are copied into one
//   slice.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/alarm.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/support/async_unary_call.h>
#if defined(SLUICE_ABSL_SYNC)
#include <absl/synchronization/mutex.h>
#endif
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

enum EventKind { EV_CALL = 0, EV_MESSAGE = 1, EV_HALF_CLOSE = 2, EV_CANCEL = 3 };

class Edge;

// A large received message made contiguous on the gRPC thread that read it (gRPC hands it
// over as ~64 KB slices), so that the asyncio thread only wraps it: its one copy is not paid
// on the loop's thread.
constexpr size_t kFlatMin = 64 * 1024;

struct FreeDeleter {
  void operator()(char* p) const { free(p); }
};
using FlatBuffer = std::unique_ptr<char, FreeDeleter>;

struct Event {
  uint64_t id;
  int kind;
  std::string method;  // EV_CALL only
  grpc::ByteBuffer payload;  // EV_CALL (unary) and EV_MESSAGE, unless flat
  FlatBuffer flat{};  // the payload made contiguous (large messages)
  size_t flat_len = 0;
  int64_t received_ns = 0;  // EV_MESSAGE and a unary EV_CALL: when gRPC handed it over
};

// CLOCK_MONOTONIC in ns: the clock of Python's time.monotonic_ns(), so that Python can count
// a request's time in the server from when its message was received, not from when the
// asyncio thread got to it.
int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Flattens a large payload into `ev.flat` (gRPC thread; no Python). False: left as it was.
bool Flatten(Event& ev) {
  size_t n = ev.payload.Length();
  if (n < kFlatMin) return false;
  std::vector<grpc::Slice> slices;
  if (!ev.payload.Dump(&slices).ok()) return false;
  char* buf = static_cast<char*>(malloc(n));
  if (buf == nullptr) return false;
  char* dst = buf;
  for (const grpc::Slice& s : slices) {
    memcpy(dst, s.begin(), s.size());
    dst += s.size();
  }
  ev.flat.reset(buf);
  ev.flat_len = n;
  ev.payload.Clear();
  return true;
}

struct Reply {
  uint64_t id;
  bool finish;  // false: a stream write
  bool has_msg;
  grpc::ByteBuffer msg;
  grpc::Status status;
};

class Call;

// What a completion-queue tag stands for: one kind of operation of one call (each kind has
// at most one operation in flight per call, so each call embeds its tags).
enum OpKind : uint8_t { OP_REQUEST, OP_READ, OP_WRITE, OP_FINISH, OP_DONE, OP_ALARM };

struct Tag {
  Call* call;
  OpKind op;
};

// The unary methods registered by name (start()'s `raw`): gRPC reads such a call's one
// message before it hands the call over, so it arrives with its message in one completion
// (the generic service takes a second operation, a Read, for it). Their bytes are not
// parsed here either: they are "raw" methods, a ByteBuffer in and out.
class RawService : public grpc::Service {
 public:
  explicit RawService(std::vector<std::string> names) : names_(std::move(names)) {
    for (size_t i = 0; i < names_.size(); ++i) {
      AddMethod(new grpc::internal::RpcServiceMethod(
          names_[i].c_str(), grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
      MarkMethodRaw(static_cast<int>(i));
    }
  }
  void Request(int index, grpc::ServerContext* ctx, grpc::ByteBuffer* in,
               grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* out,
               grpc::ServerCompletionQueue* cq, void* tag) {
    RequestAsyncUnary(index, ctx, in, out, cq, cq, tag);
  }
  const std::string& name(int index) const { return names_[static_cast<size_t>(index)]; }
  size_t size() const { return names_.size(); }

 private:
  std::vector<std::string> names_;  // RpcServiceMethod keeps pointers into these
};

class Edge {
 public:
  Edge() { efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
  ~Edge() {
    if (efd_ >= 0) close(efd_);
  }

  // --- the completion queue and its threads ---
  grpc::AsyncGenericService service_;
  std::unique_ptr<RawService> raw_;  // the unary methods registered by name, if any
  std::unique_ptr<grpc::ServerCompletionQueue> cq_;
  std::vector<std::thread> pollers_;
  void Poll();
  void Request(int raw);  // post one more "accept a call": raw_'s method `raw`, -1: generic

  // --- answers from Python: queued, then one alarm wakes a poller to start them ---
  std::mutex rmu_;
  std::vector<Reply> replies_;
  bool armed_ = false;
  bool cq_closed_ = false;
  grpc::Alarm alarm_;
  Tag alarm_tag_{nullptr, OP_ALARM};

  void Answer(Reply&& r) {
    std::lock_guard<std::mutex> lk(rmu_);
    replies_.push_back(std::move(r));
  }

  void Flush() {
    std::lock_guard<std::mutex> lk(rmu_);
    if (armed_ || replies_.empty() || cq_closed_) return;
    armed_ = true;
    alarm_.Set(cq_.get(), gpr_time_0(GPR_CLOCK_MONOTONIC), &alarm_tag_);
  }

  void StartReplies();

  // Python buffers lent to gRPC (zero-copy send slices): gRPC drops a slice on any thread,
  // without the GIL, so it only queues the buffer here; the loop releases them (drain/flush).
  std::mutex relmu_;
  std::vector<Py_buffer*> released_;  // each one heap-allocated by to_byte_buffer

  void Released(Py_buffer* view) {
    std::lock_guard<std::mutex> lk(relmu_);
    released_.push_back(view);
  }

  void ReleaseLent() {  // with the GIL
    std::vector<Py_buffer*> done;
    {
      std::lock_guard<std::mutex> lk(relmu_);
      if (released_.empty()) return;
      done.swap(released_);
    }
    for (Py_buffer* view : done) {
      PyBuffer_Release(view);
      delete view;
    }
  }

  int efd_ = -1;

  // --- co-location at low load (see the rules above) ---
  int colocate_ = 0;              // lone calls in a row before co-locating; 0: never
  pid_t loop_tid_ = 0;            // the thread that called start(): the asyncio loop's
  std::atomic<pid_t> poller_tid_{0};  // the one poller (co-location needs exactly one)
  std::atomic<int> active_{0};    // calls handed to Python and not yet answered
  std::atomic<bool> others_{false};  // Python: other inference (HTTP, in-process) in flight
  int lone_ = 0;                  // poller only: lone calls in a row
  std::mutex cmu_;                // guards the three below for colocation()
  int cpu_ = -1;                  // the shared CPU, -1: spread
  std::vector<int> used_;         // CPUs shared since the last colocation()
  cpu_set_t loop_mask_, poller_mask_;  // what they had before

  static pid_t Tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

  void Counted(size_t bytes) {  // the poller handed a call to Python, its message this big
    int n = active_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (n > 1 || bytes >= kFlatMin || others_.load(std::memory_order_relaxed)) {
      Large();
      return;
    }
    if (lone_ < colocate_) ++lone_;
    if (lone_ == colocate_) Together();  // again after Python's others(True) spread them
  }

  // A call overlapped another, or a message of kFlatMin bytes or more went either way: the
  // second CPU pays for itself there (the 602 KB echo at c=1 ran x0.77-0.84 co-located).
  void Large() {  // poller, with colocate_ set
    lone_ = 0;
    Spread();
  }

  void Together() {  // poller
    std::lock_guard<std::mutex> lk(cmu_);
    // others_ again under the lock: others(True) stores it before it takes the lock to spread
    if (cpu_ >= 0 || others_.load(std::memory_order_relaxed)) return;
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= CPU_SETSIZE) return;
    if (sched_getaffinity(loop_tid_, sizeof loop_mask_, &loop_mask_) != 0 ||
        sched_getaffinity(0, sizeof poller_mask_, &poller_mask_) != 0 ||
        !CPU_ISSET(cpu, &loop_mask_))
      return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(loop_tid_, sizeof one, &one) != 0) return;
    sched_setaffinity(0, sizeof one, &one);
    cpu_ = cpu;
    used_.push_back(cpu);
  }

  void Spread() {  // poller, others(True) on the loop's thread, or stop()
    std::lock_guard<std::mutex> lk(cmu_);
    if (cpu_ < 0) return;
    sched_setaffinity(loop_tid_, sizeof loop_mask_, &loop_mask_);
    sched_setaffinity(poller_tid_.load(), sizeof poller_mask_, &poller_mask_);
    cpu_ = -1;
  }

  std::unique_ptr<grpc::Server> server_;
  std::unordered_set<std::string> streaming_;
  std::vector<std::string> capture_;  // client metadata keys call_info() reports
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> stopping_{false};

  std::mutex qmu_;
  std::vector<Event> queue_;
  bool signalled_ = false;

  std::mutex tmu_;
  std::unordered_map<uint64_t, Call*> calls_;

  void Push(Event&& ev) {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lk(qmu_);
      queue_.push_back(std::move(ev));
      if (!signalled_) {
        signalled_ = true;
        wake = true;
      }
    }
    if (wake) {
      uint64_t one = 1;
      ssize_t r;
      do {
        r = write(efd_, &one, sizeof one);
      } while (r < 0 && errno == EINTR);
    }
  }

  std::vector<Event> Take() {
    uint64_t v;
    while (read(efd_, &v, sizeof v) < 0 && errno == EINTR) {
    }
    std::vector<Event> out;
    std::lock_guard<std::mutex> lk(qmu_);
    out.swap(queue_);
    signalled_ = false;
    return out;
  }

  Call* Find(uint64_t id);  // returns a referenced call or nullptr

  void Forget(uint64_t id) {
    std::lock_guard<std::mutex> lk(tmu_);
    calls_.erase(id);
  }
};

// One call, driven by completion-queue events on the poller threads. Every operation in
// flight holds a reference, as do the table of live calls (until the call is done) and a
// Python-side lookup (for one operation).
class Call {
 public:
  // raw: an index into edge->raw_ (a unary method gRPC reads the message of), -1: any other
  // method, through the generic service.
  Call(Edge* edge, int raw) : edge_(edge), raw_(raw) {
    if (raw_ < 0) {
      gctx_.emplace();
      stream_.emplace(&*gctx_);
      ctx_ = &*gctx_;
    } else {
      rctx_.emplace();
      responder_.emplace(&*rctx_);
      ctx_ = &*rctx_;
    }
  }

  void Ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  void Post() {  // wait for the next call gRPC accepts
    Ref();  // the OP_REQUEST in flight
    Ref();  // OP_DONE, armed before the call starts (gRPC's rule)
    ctx_->AsyncNotifyWhenDone(&done_tag_);
    if (raw_ < 0) {
      edge_->service_.RequestCall(&*gctx_, &*stream_, edge_->cq_.get(), edge_->cq_.get(),
                                  &request_tag_);
    } else {
      edge_->raw_->Request(raw_, &*rctx_, &in_, &*responder_, edge_->cq_.get(), &request_tag_);
    }
  }

  void OnEvent(OpKind op, bool ok);

  // The values of `names` in the client's metadata (first of each; absent ones skipped) and
  // the peer address. Read on the asyncio thread: gRPC fills both before the call starts and
  // never changes them after.
  PyObject* Info(const std::vector<std::string>& names);

  // From the poller that took the replies (never holding a lock of ours while starting).
  void PyWrite(grpc::ByteBuffer msg);
  void PyFinish(grpc::ByteBuffer* msg, grpc::Status status);

 private:
  void OnRequest(bool ok);
  void OnRead(bool ok);
  void OnWrite(bool ok);
  void OnDone();
  void StartRead() {
    Ref();
    stream_->Read(&in_, &read_tag_);
  }
  void StartWrite(grpc::ByteBuffer* msg) {
    Ref();
    stream_->Write(*msg, &write_tag_);
  }
  void StartFinish(grpc::ByteBuffer* msg, const grpc::Status& status) {
    Ref();
    if (raw_ >= 0) {  // unary: an answer, or an error status alone
      if (msg != nullptr) {
        responder_->Finish(*msg, status, &finish_tag_);
      } else if (!status.ok()) {
        responder_->FinishWithError(status, &finish_tag_);
      } else {  // OK without a message is not a unary answer
        responder_->FinishWithError(
            grpc::Status(grpc::StatusCode::INTERNAL, "no response message"), &finish_tag_);
      }
    } else if (msg != nullptr) {
      stream_->WriteAndFinish(*msg, grpc::WriteOptions(), status, &finish_tag_);
    } else {
      stream_->Finish(status, &finish_tag_);
    }
  }

  const std::string& Method() const {
    return raw_ < 0 ? gctx_->method() : edge_->raw_->name(raw_);
  }

  Edge* edge_;
  int raw_;
  grpc::ServerContext* ctx_ = nullptr;  // one of the two below
  std::optional<grpc::GenericServerContext> gctx_;
  std::optional<grpc::GenericServerAsyncReaderWriter> stream_;
  std::optional<grpc::ServerContext> rctx_;
  std::optional<grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>> responder_;
  Tag request_tag_{this, OP_REQUEST};
  Tag read_tag_{this, OP_READ};
  Tag write_tag_{this, OP_WRITE};
  Tag finish_tag_{this, OP_FINISH};
  Tag done_tag_{this, OP_DONE};
  std::atomic<int> refs_{0};

  uint64_t id_ = 0;
  bool streaming_ = false;
  bool first_ = true;
  grpc::ByteBuffer in_;

  std::mutex mu_;
  std::deque<grpc::ByteBuffer> out_;  // stream writes; the front one is being written
  bool writing_ = false;
  bool finished_ = false;        // Finish / WriteAndFinish started
  bool finish_pending_ = false;  // finish once the writes drain
  bool done_ = false;            // gRPC is done with the call (finished or cancelled)
  std::atomic<bool> counted_{false};  // in edge_->active_ (handed to Python, not answered)

 public:
  // Co-location's count (only with edge_->colocate_ set): Count when the poller hands the
  // call to Python, Uncount once when it is answered or gRPC is done with it (cancelled).
  void Count(size_t bytes) {
    counted_.store(true, std::memory_order_relaxed);
    edge_->Counted(bytes);
  }
  void Uncount() {
    if (counted_.exchange(false, std::memory_order_relaxed))
      edge_->active_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  grpc::ByteBuffer last_;        // unary response, alive until its finish completes
  grpc::Status finish_status_;
};

Call* Edge::Find(uint64_t id) {
  std::lock_guard<std::mutex> lk(tmu_);
  auto it = calls_.find(id);
  if (it == calls_.end()) return nullptr;
  it->second->Ref();
  return it->second;
}

void Edge::Request(int raw) { (new Call(this, raw))->Post(); }

PyObject* Call::Info(const std::vector<std::string>& names) {
  PyObject* meta = PyDict_New();
  if (!meta) return nullptr;
  const auto& md = ctx_->client_metadata();
  for (const std::string& name : names) {
    auto it = md.find(grpc::string_ref(name));
    if (it == md.end()) continue;
    PyObject* v = PyUnicode_DecodeLatin1(it->second.data(), it->second.size(), "replace");
    if (!v || PyDict_SetItemString(meta, name.c_str(), v) < 0) {
      Py_XDECREF(v);
      Py_DECREF(meta);
      return nullptr;
    }
    Py_DECREF(v);
  }
  std::string peer = ctx_->peer();
  return Py_BuildValue("(s#N)", peer.data(), static_cast<Py_ssize_t>(peer.size()), meta);
}

void Edge::Poll() {
  pid_t none = 0;
  poller_tid_.compare_exchange_strong(none, Tid());
  void* raw;
  bool ok;
  while (cq_->Next(&raw, &ok)) {
    Tag* tag = static_cast<Tag*>(raw);
    if (tag->op == OP_ALARM) {
      StartReplies();
      continue;
    }
    tag->call->OnEvent(tag->op, ok);
  }
}

void Edge::StartReplies() {
  std::vector<Reply> batch;
  {
    std::lock_guard<std::mutex> lk(rmu_);
    armed_ = false;
    batch.swap(replies_);
  }
  for (Reply& r : batch) {
    Call* call = Find(r.id);
    if (!call) continue;
    if (colocate_ != 0 && r.has_msg && r.msg.Length() >= kFlatMin) Large();
    if (r.finish) {
      call->Uncount();
      call->PyFinish(r.has_msg ? &r.msg : nullptr, r.status);
    } else {
      call->PyWrite(std::move(r.msg));
    }
    call->Unref();
  }
}

void Call::OnEvent(OpKind op, bool ok) {
  switch (op) {
    case OP_REQUEST:
      OnRequest(ok);
      break;
    case OP_READ:
      OnRead(ok);
      break;
    case OP_WRITE:
      OnWrite(ok);
      break;
    case OP_FINISH:
      break;
    case OP_DONE:
      OnDone();
      break;
    default:
      break;
  }
  Unref();  // the operation's reference
}

void Call::OnRequest(bool ok) {
  if (!ok) {  // shutting down: this call never started; its done tag never comes
    Unref();
    return;
  }
  if (!edge_->stopping_.load(std::memory_order_relaxed)) edge_->Request(raw_);
  id_ = edge_->next_id_.fetch_add(1, std::memory_order_relaxed);
  streaming_ = raw_ < 0 && edge_->streaming_.count(gctx_->method()) > 0;
  {
    std::lock_guard<std::mutex> lk(edge_->tmu_);
    edge_->calls_.emplace(id_, this);
  }
  Ref();  // the table's
  if (raw_ >= 0) {
    OnRead(true);  // gRPC read the message with the call
  } else {
    StartRead();
  }
}

void Call::OnRead(bool ok) {
  if (!ok) {
    if (streaming_ && !first_) {
      edge_->Push(Event{id_, EV_HALF_CLOSE, {}, {}});
      return;
    }
    if (streaming_) {  // a stream closed before its first message: nothing for Python yet
      first_ = false;
      edge_->Push(Event{id_, EV_CALL, Method(), {}});
      edge_->Push(Event{id_, EV_HALF_CLOSE, {}, {}});
      return;
    }
    // A unary call without a request message (or cancelled before it arrived).
    bool fin = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!finished_ && !done_) finished_ = fin = true;
    }
    if (fin) StartFinish(nullptr, grpc::Status(grpc::StatusCode::INTERNAL, "no request message"));
    return;
  }
  if (!streaming_) {
    std::lock_guard<std::mutex> lk(mu_);
    if (done_) return;  // cancelled while its message arrived: Python need not start it
  }
  Event ev{id_, first_ ? EV_CALL : EV_MESSAGE, first_ ? Method() : std::string(), {}};
  ev.received_ns = MonotonicNs();
  ev.payload.Swap(&in_);
  if (streaming_ && first_) {
    // Open the stream in Python first, then hand over its first message.
    edge_->Push(Event{id_, EV_CALL, Method(), {}});
    ev.kind = EV_MESSAGE;
    ev.method.clear();
  }
  if (edge_->colocate_ != 0) {
    if (first_) {
      Count(ev.payload.Length());
    } else if (ev.payload.Length() >= kFlatMin) {
      edge_->Large();
    }
  }
  first_ = false;
  Flatten(ev);
  edge_->Push(std::move(ev));
  if (streaming_) StartRead();
}

void Call::PyWrite(grpc::ByteBuffer msg) {
  grpc::ByteBuffer* start = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_ || finish_pending_ || done_) return;
    out_.push_back(std::move(msg));
    if (!writing_) {
      writing_ = true;
      start = &out_.front();
    }
  }
  if (start) StartWrite(start);
}

void Call::OnWrite(bool ok) {
  grpc::ByteBuffer* next = nullptr;
  bool fin = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    out_.pop_front();
    if (!ok) out_.clear();
    if (!out_.empty()) {
      next = &out_.front();
    } else {
      writing_ = false;
      if (finish_pending_ && !finished_ && !done_) finished_ = fin = true;
    }
  }
  if (next) StartWrite(next);
  if (fin) StartFinish(nullptr, finish_status_);
}

void Call::PyFinish(grpc::ByteBuffer* msg, grpc::Status status) {
  enum { NONE, FINISH, WRITE_FINISH, WRITE_THEN_FINISH } what = NONE;
  grpc::ByteBuffer* start = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (finished_ || finish_pending_ || done_) return;
    if (!streaming_) {
      finished_ = true;
      if (msg != nullptr && status.ok()) {
        last_ = std::move(*msg);
        what = WRITE_FINISH;
      } else {
        what = FINISH;
      }
    } else {
      if (msg != nullptr) out_.push_back(std::move(*msg));
      if (!writing_ && out_.empty()) {
        finished_ = true;
        what = FINISH;
      } else {
        finish_pending_ = true;
        finish_status_ = status;
        if (!writing_) {
          writing_ = true;
          start = &out_.front();
          what = WRITE_THEN_FINISH;
        }
      }
    }
  }
  if (what == WRITE_FINISH) {
    StartFinish(&last_, status);
  } else if (what == FINISH) {
    StartFinish(nullptr, status);
  } else if (what == WRITE_THEN_FINISH) {
    StartWrite(start);
  }
}

void Call::OnDone() {
  bool cancelled = ctx_->IsCancelled();
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_ = true;
  }
  Uncount();
  if (id_ != 0) {
    // A call cancelled by the client, its deadline or shutdown: gRPC has answered it
    // already; Python hears of it to cancel its work, and a late answer finds no call.
    if (cancelled) edge_->Push(Event{id_, EV_CANCEL, {}, {}});
    edge_->Forget(id_);
    Unref();  // the table's
  }
}

// ---------------------------------------------------------------------------------------
// Python type

struct PyEdge {
  PyObject_HEAD Edge* edge;
  PyObject* methods;  // dict: method path (str) -> the same str, so every event shares it
};

int PyEdge_init(PyEdge* self, PyObject* args, PyObject* kwds) {
  self->edge = new Edge();
  self->methods = PyDict_New();
  if (self->edge->efd_ < 0) {
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
  }
  return 0;
}

void PyEdge_dealloc(PyEdge* self) {
  // The gRPC server (if started) is shut down by stop(); a never-stopped edge is leaked on
  // purpose: its threads may still reference it.
  if (self->edge != nullptr && !self->edge->server_) delete self->edge;
  Py_XDECREF(self->methods);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

// The str items of an iterable appended to `out` (None: none); false with a Python error set.
bool Strings(PyObject* items, std::vector<std::string>* out) {
  if (items == Py_None) return true;
  PyObject* it = PyObject_GetIter(items);
  if (!it) return false;
  for (PyObject* item; (item = PyIter_Next(it));) {
    const char* s = PyUnicode_AsUTF8(item);
    if (s) out->emplace_back(s);
    Py_DECREF(item);
    if (!s) {
      Py_DECREF(it);
      return false;
    }
  }
  Py_DECREF(it);
  return !PyErr_Occurred();
}

// start(address, streaming_methods, int_args, str_args, max_message[, tls[, capture[,
// colocate[, raw]]]]) -> bound port. tls: None (plain) or (server_key_pem, server_cert_pem,
// root_cert_pem, mutual); capture: the client metadata keys call_info() reports; colocate:
// lone calls in a row before the poller and the calling (asyncio) thread share a CPU, 0
// never (nor with more than one poller or one CPU); raw: unary method paths gRPC is to read
// the message of before handing the call over (RawService), every other path is generic.
PyObject* PyEdge_start(PyEdge* self, PyObject* args) {
  const char* address;
  PyObject *streaming, *int_args, *str_args;
  PyObject* tls = Py_None;
  PyObject* capture = Py_None;
  int max_message;
  int colocate = 0;
  PyObject* raw = Py_None;
  if (!PyArg_ParseTuple(args, "sOOOi|OOiO", &address, &streaming, &int_args, &str_args,
                        &max_message, &tls, &capture, &colocate, &raw))
    return nullptr;
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls != Py_None) {
    const char *key, *cert, *root;
    int mutual;
    if (!PyArg_ParseTuple(tls, "sssp", &key, &cert, &root, &mutual)) return nullptr;
    grpc::SslServerCredentialsOptions opts(
        mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
               : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    opts.pem_root_certs = root;
    opts.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(opts);
  }
  Edge* edge = self->edge;
  if (edge->server_) {
    PyErr_SetString(PyExc_RuntimeError, "edge already started");
    return nullptr;
  }
  std::vector<std::string> streaming_names, raw_names;
  if (!Strings(streaming, &streaming_names) || !Strings(capture, &edge->capture_) ||
      !Strings(raw, &raw_names))
    return nullptr;
  edge->streaming_.insert(streaming_names.begin(), streaming_names.end());
  for (const std::string& name : raw_names) {
    if (edge->streaming_.count(name) > 0) {
      PyErr_Format(PyExc_ValueError, "%s: a streaming method cannot be raw", name.c_str());
      return nullptr;
    }
  }

  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  for (int pass = 0; pass < 2; ++pass) {
    PyObject* seq = PySequence_Fast(pass == 0 ? int_args : str_args, "channel args: a sequence");
    if (!seq) return nullptr;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* pair = PySequence_Fast_GET_ITEM(seq, i);
      const char* key;
      if (pass == 0) {
        int value;
        if (!PyArg_ParseTuple(pair, "si", &key, &value)) {
          Py_DECREF(seq);
          return nullptr;
        }
        builder.AddChannelArgument(key, value);
      } else {
        const char* value;
        if (!PyArg_ParseTuple(pair, "ss", &key, &value)) {
          Py_DECREF(seq);
          return nullptr;
        }
        builder.AddChannelArgument(key, std::string(value));
      }
    }
    Py_DECREF(seq);
  }
  int port = 0;
  builder.AddListeningPort(address, creds, &port);
  builder.RegisterAsyncGenericService(&edge->service_);
  if (!raw_names.empty()) {
    edge->raw_ = std::make_unique<RawService>(std::move(raw_names));
    builder.RegisterService(edge->raw_.get());
  }
  edge->cq_ = builder.AddCompletionQueue();
  std::unique_ptr<grpc::Server> server;
  Py_BEGIN_ALLOW_THREADS server = builder.BuildAndStart();
  Py_END_ALLOW_THREADS if (!server || port == 0) {
    PyErr_Format(PyExc_OSError, "cannot bind gRPC to %s", address);
    return nullptr;
  }
  edge->server_ = std::move(server);
  const char* env = getenv("SLUICE_GRPC_EDGE_THREADS");
  int threads = env ? atoi(env) : 1;
  if (threads < 1) threads = 1;
  cpu_set_t mask;
  edge->loop_tid_ = Edge::Tid();
  if (colocate > 0 && threads == 1 && sched_getaffinity(0, sizeof mask, &mask) == 0 &&
      CPU_COUNT(&mask) > 1)
    edge->colocate_ = colocate;
  for (int i = 0; i < 32; ++i) edge->Request(-1);
  if (edge->raw_) {
    for (size_t m = 0; m < edge->raw_->size(); ++m) {
      for (int i = 0; i < 32; ++i) edge->Request(static_cast<int>(m));
    }
  }
  for (int i = 0; i < threads; ++i) edge->pollers_.emplace_back([edge] { edge->Poll(); });
  return PyLong_FromLong(port);
}

PyObject* PyEdge_fileno(PyEdge* self, PyObject*) { return PyLong_FromLong(self->edge->efd_); }

PyObject* payload_bytes(grpc::ByteBuffer& bb) {
  size_t n = bb.Length();
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
  if (!out || n == 0) return out;
  char* dst = PyBytes_AS_STRING(out);
  std::vector<grpc::Slice> slices;
  if (!bb.Dump(&slices).ok()) {
    Py_DECREF(out);
    PyErr_SetString(PyExc_RuntimeError, "cannot read a received message");
    return nullptr;
  }
  bool big = n >= (1u << 20);
  PyThreadState* ts = big ? PyEval_SaveThread() : nullptr;  // the bytes object is ours alone
  for (const grpc::Slice& s : slices) {
    memcpy(dst, s.begin(), s.size());
    dst += s.size();
  }
  if (big) PyEval_RestoreThread(ts);
  return out;
}

// A flattened payload as a read-only buffer (drain() hands out a memoryview of it).
struct PyPayload {
  PyObject_HEAD char* buf;
  Py_ssize_t len;
};

int PyPayload_getbuffer(PyPayload* self, Py_buffer* view, int flags) {
  return PyBuffer_FillInfo(view, reinterpret_cast<PyObject*>(self), self->buf, self->len, 1,
                           flags);
}

void PyPayload_dealloc(PyPayload* self) {
  free(self->buf);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyBufferProcs PyPayload_as_buffer = {reinterpret_cast<getbufferproc>(PyPayload_getbuffer),
                                     nullptr};
PyTypeObject PyPayloadType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyObject* payload_view(Event& ev) {
  PyPayload* obj = PyObject_New(PyPayload, &PyPayloadType);
  if (!obj) return nullptr;
  obj->len = static_cast<Py_ssize_t>(ev.flat_len);
  obj->buf = ev.flat.release();
  PyObject* view = PyMemoryView_FromObject(reinterpret_cast<PyObject*>(obj));
  Py_DECREF(obj);
  return view;
}

// drain() -> [(id, kind, method or None, payload or None, received_ns), ...]; a payload is
// bytes, or a read-only memoryview for a large message; received_ns is when gRPC handed the
// message over (CLOCK_MONOTONIC, as time.monotonic_ns()), 0 for an event without one
PyObject* PyEdge_drain(PyEdge* self, PyObject*) {
  self->edge->ReleaseLent();
  std::vector<Event> events = self->edge->Take();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(events.size()));
  if (!list) return nullptr;
  for (size_t i = 0; i < events.size(); ++i) {
    Event& ev = events[i];
    PyObject* method = Py_None;
    Py_INCREF(Py_None);
    if (ev.kind == EV_CALL) {
      Py_DECREF(Py_None);
      PyObject* m = PyDict_GetItemString(self->methods, ev.method.c_str());
      if (m) {
        Py_INCREF(m);
      } else {
        m = PyUnicode_DecodeUTF8(ev.method.data(), ev.method.size(), "replace");
        if (!m || PyDict_SetItem(self->methods, m, m) < 0) {
          Py_XDECREF(m);
          Py_DECREF(list);
          return nullptr;
        }
      }
      method = m;
    }
    PyObject* payload;
    if (ev.flat) {
      payload = payload_view(ev);
      if (!payload) {
        Py_DECREF(method);
        Py_DECREF(list);
        return nullptr;
      }
    } else if (ev.kind == EV_MESSAGE || (ev.kind == EV_CALL && ev.payload.Valid())) {
      payload = payload_bytes(ev.payload);
      if (!payload) {
        Py_DECREF(method);
        Py_DECREF(list);
        return nullptr;
      }
    } else {
      payload = Py_None;
      Py_INCREF(Py_None);
    }
    PyObject* tup = Py_BuildValue("(KiNNL)", static_cast<unsigned long long>(ev.id), ev.kind,
                                  method, payload, static_cast<long long>(ev.received_ns));
    if (!tup) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), tup);
  }
  return list;
}

// A message from Python: one bytes-like object, or a list/tuple of them that concatenate to
// the message (the codec's parts: protobuf's header, then the tensors' own buffers). Parts of
// kLendMin bytes or more are lent to gRPC as they are (a slice over the Python buffer, which
// stays exported, so nobody can change or free it, until gRPC drops the slice and the loop
// releases it): no copy. Smaller runs of parts are copied into one slice of their own.
constexpr size_t kLendMin = 64 * 1024;

struct Lent {
  Edge* edge;
  Py_buffer* view;
};

void lent_done(void* p) {  // gRPC dropped the slice (any thread, no GIL)
  Lent* lent = static_cast<Lent*>(p);
  lent->edge->Released(lent->view);
  delete lent;
}

bool to_byte_buffer(Edge* edge, PyObject* obj, grpc::ByteBuffer* out) {
  bool single = !PyList_Check(obj) && !PyTuple_Check(obj);
  Py_ssize_t k = single ? 1 : PySequence_Fast_GET_SIZE(obj);
  PyObject** items = single ? &obj : PySequence_Fast_ITEMS(obj);
  std::vector<Py_buffer> views(static_cast<size_t>(k));
  for (Py_ssize_t i = 0; i < k; ++i) {
    if (PyObject_GetBuffer(items[i], &views[i], PyBUF_SIMPLE) < 0) {
      for (Py_ssize_t j = 0; j < i; ++j) PyBuffer_Release(&views[j]);
      return false;
    }
  }
  std::vector<grpc::Slice> slices;
  size_t i = 0;
  while (i < views.size()) {
    size_t n = static_cast<size_t>(views[i].len);
    if (n >= kLendMin) {  // lent: the slice keeps the buffer exported until gRPC drops it
      Lent* lent = new Lent{edge, new Py_buffer(views[i])};
      slices.emplace_back(views[i].buf, n, lent_done, lent);
      ++i;
      continue;
    }
    size_t j = i, total = 0;  // a run of small parts: one copied slice
    while (j < views.size() && static_cast<size_t>(views[j].len) < kLendMin) {
      total += static_cast<size_t>(views[j].len);
      ++j;
    }
    grpc::Slice slice(total);
    uint8_t* dst = const_cast<uint8_t*>(slice.begin());
    for (size_t m = i; m < j; ++m) {
      memcpy(dst, views[m].buf, static_cast<size_t>(views[m].len));
      dst += views[m].len;
      PyBuffer_Release(&views[m]);
    }
    slices.push_back(std::move(slice));
    i = j;
  }
  grpc::ByteBuffer bb(slices.data(), slices.size());
  out->Swap(&bb);
  return true;
}

// write(id, message): one message (bytes or a list of buffers) on a stream
PyObject* PyEdge_write(PyEdge* self, PyObject* args) {
  unsigned long long id;
  PyObject* data;
  if (!PyArg_ParseTuple(args, "KO", &id, &data)) return nullptr;
  Reply r{id, false, true, {}, grpc::Status::OK};
  if (!to_byte_buffer(self->edge, data, &r.msg)) return nullptr;
  self->edge->Answer(std::move(r));
  Py_RETURN_NONE;
}

// finish(id, code, message, response (bytes or a list of buffers) or None)
PyObject* PyEdge_finish(PyEdge* self, PyObject* args) {
  unsigned long long id;
  int code;
  const char* message;
  Py_ssize_t message_len;
  PyObject* data;
  if (!PyArg_ParseTuple(args, "Kis#O", &id, &code, &message, &message_len, &data)) return nullptr;
  bool has = data != Py_None;
  Reply r{id, true, has, {},
          grpc::Status(static_cast<grpc::StatusCode>(code),
                       std::string(message, static_cast<size_t>(message_len)))};
  if (has && !to_byte_buffer(self->edge, data, &r.msg)) return nullptr;
  self->edge->Answer(std::move(r));
  Py_RETURN_NONE;
}

// stop(grace_seconds): stop accepting calls, cancel what is left after the grace, wait.
PyObject* PyEdge_stop(PyEdge* self, PyObject* args) {
  double grace;
  if (!PyArg_ParseTuple(args, "d", &grace)) return nullptr;
  Edge* edge = self->edge;
  if (!edge->server_ || edge->stopping_.exchange(true)) Py_RETURN_NONE;
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::microseconds(static_cast<int64_t>(grace * 1e6));
  Py_BEGIN_ALLOW_THREADS edge->server_->Shutdown(deadline);
  {
    std::lock_guard<std::mutex> lk(edge->rmu_);
    edge->cq_closed_ = true;
  }
  edge->cq_->Shutdown();
  for (std::thread& t : edge->pollers_) t.join();
  edge->Spread();
  edge->server_->Wait();
  Py_END_ALLOW_THREADS edge->ReleaseLent();
  Py_RETURN_NONE;
}

PyObject* PyEdge_flush(PyEdge* self, PyObject*) {
  self->edge->ReleaseLent();
  self->edge->Flush();
  Py_RETURN_NONE;
}

// call_info(id) -> (peer, {key: value}) for the start()'s capture keys, or None when the
// call is over
PyObject* PyEdge_call_info(PyEdge* self, PyObject* args) {
  unsigned long long id;
  if (!PyArg_ParseTuple(args, "K", &id)) return nullptr;
  Call* call = self->edge->Find(id);
  if (!call) Py_RETURN_NONE;
  PyObject* out = call->Info(self->edge->capture_);
  call->Unref();
  return out;
}

// colocation() -> (cpu, cpus, loop_tid, poller_tid): the CPU the poller and the asyncio
// thread share now (-1: none), every CPU they shared since the last call, and the two
// threads' ids (0: no poller yet)
PyObject* PyEdge_colocation(PyEdge* self, PyObject*) {
  Edge* edge = self->edge;
  int cpu;
  std::vector<int> used;
  {
    std::lock_guard<std::mutex> lk(edge->cmu_);
    cpu = edge->cpu_;
    used.swap(edge->used_);
  }
  PyObject* cpus = PyList_New(static_cast<Py_ssize_t>(used.size()));
  if (!cpus) return nullptr;
  for (size_t i = 0; i < used.size(); ++i) {
    PyObject* v = PyLong_FromLong(used[i]);
    if (!v) {
      Py_DECREF(cpus);
      return nullptr;
    }
    PyList_SET_ITEM(cpus, static_cast<Py_ssize_t>(i), v);
  }
  return Py_BuildValue("(iNll)", cpu, cpus, static_cast<long>(edge->loop_tid_),
                       static_cast<long>(edge->poller_tid_.load()));
}

// others(flag): whether inference the edge does not see (HTTP, in-process) is in flight; while
// it is, the next gRPC call spreads the threads instead of counting as a lone call, and
// others(True) gives both threads their CPUs back at once.
PyObject* PyEdge_others(PyEdge* self, PyObject* arg) {
  int flag = PyObject_IsTrue(arg);
  if (flag < 0) return nullptr;
  Edge* edge = self->edge;
  edge->others_.store(flag != 0, std::memory_order_relaxed);
  if (flag && edge->colocate_ != 0) edge->Spread();
  Py_RETURN_NONE;
}

PyObject* PyEdge_pending(PyEdge* self, PyObject*) {
  std::lock_guard<std::mutex> lk(self->edge->tmu_);
  return PyLong_FromSize_t(self->edge->calls_.size());
}

PyMethodDef PyEdge_methods[] = {
    {"start", reinterpret_cast<PyCFunction>(PyEdge_start), METH_VARARGS,
     "start(address, streaming_methods, int_args, str_args, max_message[, tls[, capture[, "
     "colocate]]]) -> port"},
    {"fileno", reinterpret_cast<PyCFunction>(PyEdge_fileno), METH_NOARGS,
     "the eventfd that turns readable when events are pending"},
    {"drain", reinterpret_cast<PyCFunction>(PyEdge_drain), METH_NOARGS,
     "drain() -> [(id, kind, method, payload, received_ns)]"},
    {"write", reinterpret_cast<PyCFunction>(PyEdge_write), METH_VARARGS,
     "write(id, message): one message on a stream (queued until flush())"},
    {"finish", reinterpret_cast<PyCFunction>(PyEdge_finish), METH_VARARGS,
     "finish(id, code, message, response_or_None) (queued until flush())"},
    {"stop", reinterpret_cast<PyCFunction>(PyEdge_stop), METH_VARARGS,
     "stop(grace_seconds): blocking; call it off the event loop"},
    {"flush", reinterpret_cast<PyCFunction>(PyEdge_flush), METH_NOARGS,
     "hand the answers queued by write()/finish() to gRPC"},
    {"call_info", reinterpret_cast<PyCFunction>(PyEdge_call_info), METH_VARARGS,
     "call_info(id) -> (peer, {metadata key: value}) or None when the call is over"},
    {"colocation", reinterpret_cast<PyCFunction>(PyEdge_colocation), METH_NOARGS,
     "colocation() -> (shared cpu or -1, cpus shared since the last call, loop tid, poller tid)"},
    {"others", reinterpret_cast<PyCFunction>(PyEdge_others), METH_O,
     "others(flag): other inference is in flight (co-location spreads while it is)"},
    {"pending", reinterpret_cast<PyCFunction>(PyEdge_pending), METH_NOARGS,
     "number of calls gRPC has not finished with"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject PyEdgeType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef edge_module = {PyModuleDef_HEAD_INIT, "_edge",
                           "sluice's native gRPC edge (gRPC C++ async generic service)", -1,
                           nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__edge(void) {
#if defined(SLUICE_ABSL_SYNC)
  // Debian's abseil is built without NDEBUG: every absl::Mutex lock (gRPC takes several a
  // call) then records the lock order for deadlock detection (GraphCycles), ~10 k
  // instructions a unary call here. A release build of abseil (Triton's) has it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
  PyEdgeType.tp_name = "sluice.frontends.grpc_edge._edge.Edge";
  PyEdgeType.tp_basicsize = sizeof(PyEdge);
  PyEdgeType.tp_flags = Py_TPFLAGS_DEFAULT;
  PyEdgeType.tp_new = PyType_GenericNew;
  PyEdgeType.tp_init = reinterpret_cast<initproc>(PyEdge_init);
  PyEdgeType.tp_dealloc = reinterpret_cast<destructor>(PyEdge_dealloc);
  PyEdgeType.tp_methods = PyEdge_methods;
  if (PyType_Ready(&PyEdgeType) < 0) return nullptr;
  PyPayloadType.tp_name = "sluice.frontends.grpc_edge._edge.Payload";
  PyPayloadType.tp_basicsize = sizeof(PyPayload);
  PyPayloadType.tp_flags = Py_TPFLAGS_DEFAULT;
  PyPayloadType.tp_dealloc = reinterpret_cast<destructor>(PyPayload_dealloc);
  PyPayloadType.tp_as_buffer = &PyPayload_as_buffer;
  if (PyType_Ready(&PyPayloadType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&edge_module);
  if (!m) return nullptr;
  Py_INCREF(&PyEdgeType);
  if (PyModule_AddObject(m, "Edge", reinterpret_cast<PyObject*>(&PyEdgeType)) < 0) return nullptr;
  PyModule_AddIntConstant(m, "EV_CALL", EV_CALL);
  PyModule_AddIntConstant(m, "EV_MESSAGE", EV_MESSAGE);
  PyModule_AddIntConstant(m, "EV_HALF_CLOSE", EV_HALF_CLOSE);
  PyModule_AddIntConstant(m, "EV_CANCEL", EV_CANCEL);
  PyModule_AddStringConstant(m, "GRPC_VERSION", grpc::Version().c_str());
  return m;
}
