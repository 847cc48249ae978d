// The driver's random number generators: one per device, drawing from a host generator of its own.
#include "driver.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <string>
#include <vector>

namespace emu {

// ------------------------------------------------------------------ generators
namespace {

// A device generator: its numbers come from a host Mersenne Twister (the kernels run on the host),
// but it belongs to one emu device, so seeding emu never touches the CPU generator and vice versa.
class EmuGenerator final : public c10::GeneratorImpl {
 public:
  EmuGenerator(c10::DeviceIndex device, at::Generator host)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> l(host_.mutex());
    host_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> l(host_.mutex());
    host_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.get_offset();
  }
  uint64_t current_seed() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> l(host_.mutex());
    host_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return host_.unsafeGetGeneratorImpl()->get_state();
  }
  const at::Generator& host() const { return host_; }

 private:
  EmuGenerator* clone_impl() const override {
    std::lock_guard<std::mutex> l(host_.mutex());
    return new EmuGenerator(device_.index(), host_.clone());
  }
  mutable at::Generator host_;
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device(device);
  static std::once_flag once;
  static std::vector<at::Generator>* gens = nullptr;
  std::call_once(once, [] {
    gens = new std::vector<at::Generator>();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      gens->push_back(at::make_generator<EmuGenerator>(d, at::detail::createCPUGenerator()));
    }
  });
  return (*gens)[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device < 0) device = current_device();
  check_device(device);
  return at::make_generator<EmuGenerator>(device, at::detail::createCPUGenerator());
}

at::Generator host_generator_of(const at::Generator& emu_gen) {
  auto* impl = dynamic_cast<EmuGenerator*>(emu_gen.unsafeGetGeneratorImpl());
  TORCH_CHECK(impl != nullptr, "Expected a 'emu' device type for generator but found '",
              emu_gen.device().type() == c10::DeviceType::PrivateUse1 ? std::string("emu")
                                                                       : c10::DeviceTypeName(emu_gen.device().type(), true),
              "'");
  return impl->host();
}

}  // namespace emu
