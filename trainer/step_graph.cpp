#include "trainer/step_graph.h"

#include <cstdint>
#include <stdexcept>

#if defined(DD_HAVE_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace trainer {

#if defined(DD_HAVE_CUDA)

struct StepGraph::Impl {
  c10::DeviceIndex device;
  c10::cuda::CUDAStream stream;  // a graph is captured on a stream other than the default one
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  bool captured = false;
  int64_t pool_idle_bytes = 0;

  explicit Impl(int d)
      : device(static_cast<c10::DeviceIndex>(d)), stream(c10::cuda::getStreamFromPool(false, device)) {}
};

namespace {

// `to` waits for the work queued on `from` so far.
void order_after(const c10::cuda::CUDAStream& from, const c10::cuda::CUDAStream& to) {
  at::cuda::CUDAEvent ev;
  ev.record(from);
  ev.block(to);
}

}  // namespace

StepGraph::StepGraph(int device_index) : impl_(std::make_unique<Impl>(device_index)) {}

StepGraph::~StepGraph() = default;

void StepGraph::run_on_graph_stream(const std::function<void()>& fn) {
  const auto current = c10::cuda::getCurrentCUDAStream(impl_->device);
  order_after(current, impl_->stream);
  {
    c10::cuda::CUDAStreamGuard on_graph_stream(impl_->stream);
    fn();
  }
  order_after(impl_->stream, current);
}

void StepGraph::capture(const std::function<void()>& fn) {
  if (impl_->captured) throw std::logic_error("StepGraph::capture: already captured");
  const auto current = c10::cuda::getCurrentCUDAStream(impl_->device);
  order_after(current, impl_->stream);
  c10::cuda::CUDAStreamGuard on_graph_stream(impl_->stream);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  // Thread-local mode: the data loader's threads may pin host memory while the step is captured;
  // only this thread's (and the capture stream's) work must be graph-safe.
  graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
  try {
    fn();
  } catch (...) {
    try {
      graph->capture_end();
    } catch (...) {
      // The capture was invalidated by what failed; ending it is all that is left to do.
    }
    (void)cudaGetLastError();
    throw;
  }
  graph->capture_end();
  // Nothing outside a capture allocates from the graph's pool, so what it holds idle now is what
  // it holds idle for the rest of the run.
  const auto pool = graph->pool();
  int64_t idle = 0;
  for (const auto& seg : c10::cuda::CUDACachingAllocator::snapshot({0, 0}, /*include_traces=*/false).segments) {
    if (seg.device == impl_->device && seg.owner_private_pool_id == pool)
      idle += static_cast<int64_t>(seg.total_size) - static_cast<int64_t>(seg.allocated_size);
  }
  impl_->pool_idle_bytes = idle;
  impl_->graph = std::move(graph);
  impl_->captured = true;
}

void StepGraph::replay() {
  if (!impl_->captured) throw std::logic_error("StepGraph::replay: nothing captured");
  impl_->graph->replay();
}

bool StepGraph::captured() const { return impl_->captured; }

int64_t StepGraph::pool_idle_bytes() const { return impl_->pool_idle_bytes; }

#else  // no CUDA in this build

struct StepGraph::Impl {};

StepGraph::StepGraph(int) { throw std::runtime_error("CUDA graphs need a CUDA build of deltadeck"); }
StepGraph::~StepGraph() = default;
void StepGraph::run_on_graph_stream(const std::function<void()>& fn) { fn(); }
void StepGraph::capture(const std::function<void()>&) { throw std::logic_error("StepGraph: no CUDA"); }
void StepGraph::replay() { throw std::logic_error("StepGraph: no CUDA"); }
bool StepGraph::captured() const { return false; }
int64_t StepGraph::pool_idle_bytes() const { return 0; }

#endif

}  // namespace trainer
