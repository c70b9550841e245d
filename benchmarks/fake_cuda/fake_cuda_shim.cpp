// The smallest native piece a CPU-only torch needs to run FakeTensorMode on "cuda" through a whole training step.
//
// A CPU build has no device guard and no hooks for CUDA, so even with every tensor fake:
//   - copy_ and .to("cuda") fail ("PyTorch is not linked with support for cuda devices": no guard for the type);
//   - backward fails ("Cannot access accelerator device"): the autograd engine asks the CUDA hooks whether CUDA was
//     built, and then the guard for the device's streams.
// This library registers, from its static initializers:
//   - c10's own FakeGuardImpl<CUDA> (c10/core/impl/FakeGuardImpl.h, written for tests of device guards): a current
//     device and current streams kept in thread-local fields, events that do nothing;
//   - CUDA hooks that say CUDA is built and present with one device, and do nothing when asked to initialise.
// No memory is ever allocated through them: fake tensors have no data. It must be loaded before anything asks for
// the CUDA hooks (ATen reads its hooks registry once), which is why the meter loads it before importing torch.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/FakeGuardImpl.h>

namespace at {

struct FakeCUDAHooks final : public CUDAHooksInterface {
  explicit FakeCUDAHooks(CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  void init() const override {}
  bool hasCUDA() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  DeviceIndex deviceCount() const override { return 1; }
  int getNumGPUs() const override { return 1; }
  DeviceIndex current_device() const override { return 0; }
  DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(DeviceIndex) const override {}
  void deviceSynchronize(DeviceIndex) const override {}
};

// ATen asks its registry for the class registered under the key "CUDAHooks" (the name libtorch_cuda uses).
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, FakeCUDAHooks);

}  // namespace at

namespace c10::impl {
C10_REGISTER_GUARD_IMPL(CUDA, FakeGuardImpl<DeviceType::CUDA>);
}  // namespace c10::impl
