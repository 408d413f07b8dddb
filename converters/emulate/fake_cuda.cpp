// Emulated CUDA for a CPU-only PyTorch build (ettools capture --emulate).
//
// Two registrations make "cuda" a device PyTorch can reason about without a GPU or a CUDA build:
// a device guard (current device and stream bookkeeping, no driver calls) and CUDA hooks that say
// a CUDA runtime is present. Tensors on the device are FakeTensors (no storage): no kernel ever
// runs, so nothing here allocates or launches. Loaded before `import torch` initializes its hooks.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace {
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
}

namespace at {
struct EttoolsEmulatedCUDAHooks : public CUDAHooksInterface {
  EttoolsEmulatedCUDAHooks(CUDAHooksArgs) {}
  void init() const override {}
  bool hasCUDA() const override { return true; }
  bool isAvailable() const override { return true; }
  bool isBuilt() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  DeviceIndex deviceCount() const override { return c10::impl::kFakeGuardImplMaxDevices; }
  DeviceIndex current_device() const override { return c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>::getDeviceIndex(); }
  int getNumGPUs() const override { return c10::impl::kFakeGuardImplMaxDevices; }
  DeviceIndex getCurrentDevice() const override { return c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>::getDeviceIndex(); }
  void setCurrentDevice(DeviceIndex i) const override { c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>::setDeviceIndex(i); }
  // random ops on fake tensors never draw numbers; a generator object is all they ask for
  const Generator& getDefaultGenerator(DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  void deviceSynchronize(DeviceIndex) const override {}
};
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, EttoolsEmulatedCUDAHooks);
}  // namespace at

extern "C" int ettools_emulated_cuda_devices() { return c10::impl::kFakeGuardImplMaxDevices; }
// torch.cuda.set_device: the current device of this thread (what "cuda" without an index means)
extern "C" void ettools_set_device(int index) {
  c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>::setDeviceIndex(static_cast<c10::DeviceIndex>(index));
}
