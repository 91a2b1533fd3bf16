// parallel::OnMetaDevice (meta_device.h): modules built with no memory, for ZeRO-3's materialize.
#include <ATen/ATen.h>
#include <ATen/ops/empty_ops.h>
#include <ATen/ops/empty_strided_ops.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <mutex>
#include <optional>

#include "parallel/meta_device.h"

namespace dtrain::parallel {

namespace {

thread_local bool t_on_meta = false;

std::optional<at::Device> chosen_device(std::optional<at::Device> device) {
  if (t_on_meta && (!device || device->is_cpu())) return at::Device(at::kMeta);
  return device;
}

// What libtorch's BackendSelect kernels for these factories do (pick the backend from dtype, layout and
// device, and go on there), with chosen_device() first.
at::Tensor empty_select(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                        std::optional<at::Layout> layout, std::optional<at::Device> device,
                        std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  device = chosen_device(device);
  c10::DispatchKeySet ks(c10::computeDispatchKey(dtype, layout, device));
  return at::_ops::empty_memory_format::redispatch(ks, size, dtype, layout, device, pin_memory,
                                                   memory_format);
}

at::Tensor empty_strided_select(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                                std::optional<at::Device> device, std::optional<bool> pin_memory) {
  device = chosen_device(device);
  c10::DispatchKeySet ks(c10::computeDispatchKey(dtype, layout, device));
  return at::_ops::empty_strided::redispatch(ks, size, stride, dtype, layout, device, pin_memory);
}

void register_meta_factories() {
  static std::once_flag once;
  std::call_once(once, [] {
    // libtorch warns once when a kernel replaces another; this replacement is the point, and silent
    struct Silent : c10::WarningHandler {
      void process(const c10::Warning&) override {}
    };
    static Silent silent;
    c10::WarningUtils::WarningHandlerGuard silence(&silent);
    static torch::Library lib(torch::Library::IMPL, "aten", c10::DispatchKey::BackendSelect, __FILE__,
                              __LINE__);
    lib.impl("empty.memory_format", TORCH_FN(empty_select));
    lib.impl("empty_strided", TORCH_FN(empty_strided_select));
  });
}

}  // namespace

OnMetaDevice::OnMetaDevice() : previous_(t_on_meta) {
  register_meta_factories();
  t_on_meta = true;
}

OnMetaDevice::~OnMetaDevice() { t_on_meta = previous_; }

}  // namespace dtrain::parallel
