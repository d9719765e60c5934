// cuda/cuda.h for every build, and the loading of libminiflow_cuda.so in builds with CUDA. The first
// CUDA question (cuda::is_available(), a tensor on a GPU, an NCCL group) loads the backend from the
// folder libminiflow.so was loaded from, and fills the registry's CUDA slots; a CPU program never asks,
// never loads it, and never maps the CUDA libraries. When the backend cannot be loaded (no CUDA runtime
// on this machine), CUDA is unavailable and every CUDA error says why, in the dynamic loader's words.
#include "cuda/backend.h"
#include "cuda/cuda.h"
#include "ops/kernel_api.h"

#include <fmt/format.h>

#include <dlfcn.h>
#include <sys/stat.h>

namespace mf {

extern Allocator* (*cuda_allocator_hook)(int device_index);  // core/storage.cpp

namespace cuda {
namespace {

#ifdef MF_CUDA
constexpr bool kBuilt = true;
#else
constexpr bool kBuilt = false;
#endif
constexpr const char* kBackendFile = "libminiflow_cuda.so";

/// The backend once asked for: the table when it loaded, else why not.
struct LoadedBackend {
  const detail::Backend* table = nullptr;
  std::string failure;
};

/// libminiflow_cuda.so in the folder this library was loaded from (the build folder, or the install's
/// libdir), where one is there; otherwise the bare name, for the dynamic loader's own search path.
std::string backend_path() {
  Dl_info self{};
  if (dladdr(reinterpret_cast<const void*>(&backend_path), &self) != 0 && self.dli_fname != nullptr) {
    std::string path = self.dli_fname;
    path = path.substr(0, path.rfind('/') + 1) + kBackendFile;
    struct stat found{};
    if (stat(path.c_str(), &found) == 0) return path;
  }
  return kBackendFile;
}

LoadedBackend load_backend() {
  if (!kBuilt) return {nullptr, "miniflow was built without CUDA (rebuild with meson setup -Dcuda=enabled)"};
  const std::string path = backend_path();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr)
    return {nullptr, fmt::format("the CUDA backend could not be loaded ({}; is the CUDA runtime installed?)", dlerror())};
  auto entry = reinterpret_cast<const detail::Backend* (*)()>(dlsym(handle, detail::kBackendEntryPoint));
  if (entry == nullptr)
    return {nullptr, fmt::format("{} has no entry point {}: it is not miniflow's CUDA backend", path,
                                 detail::kBackendEntryPoint)};
  const detail::Backend* table = entry();
  if (table->abi_version != detail::kBackendAbiVersion)
    return {nullptr, fmt::format("{} is a CUDA backend of another miniflow (interface version {}, this library "
                                 "needs {}); reinstall both from one build", path, table->abi_version,
                                 detail::kBackendAbiVersion)};
  table->register_kernels(mf::detail::registry_to_extend());
  return {table, ""};
}

const LoadedBackend& backend() {
  static const LoadedBackend loaded = load_backend();
  return loaded;
}

/// The backend's table, or an error saying that `device` is not available and why.
const detail::Backend& backend_for(int device) {
  const LoadedBackend& loaded = backend();
  MF_CHECK(loaded.table != nullptr, "device cuda:{} is not available: {}", device, loaded.failure);
  return *loaded.table;
}

Allocator* allocator_for_device(int device) { return backend_for(device).allocator(device); }

// Installed at load time, so that Tensor::empty on a CUDA device works before any op has run.
[[maybe_unused]] const bool kHookInstalled = (cuda_allocator_hook = &allocator_for_device, true);

// The dispatcher picks a kernel by the input's device: cpu -> cuda arrives in the CPU slot, which also
// keeps serving cpu -> cpu; cuda -> anything is the backend's CUDA slot. A CUDA output exists only
// once the backend is loaded.
void copy_from_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out, const Attrs& attrs) {
  if (out[0].device().is_cpu()) {
    registry()[OpId::copy].kernels[static_cast<size_t>(DeviceType::CPU)](in, out, attrs);
    return;
  }
  Tensor dst = out[0];
  backend_for(dst.device().index).copy_across(in[0], dst);
}

}  // namespace

bool is_built() { return kBuilt; }

int device_count() {
  const LoadedBackend& loaded = backend();
  return loaded.table == nullptr ? 0 : loaded.table->device_count();
}

bool is_available() { return device_count() > 0; }

std::string unavailable_reason() {
  const LoadedBackend& loaded = backend();
  if (loaded.table == nullptr) return loaded.failure;
  return loaded.table->device_count() > 0 ? "" : loaded.table->no_device_reason();
}

void synchronize(int device) {
  if (device_count() == 0) return;
  backend().table->synchronize(device);
}

std::vector<std::string> missing_ops() {
  backend();  // the CUDA slots are filled when the backend loads
  std::vector<std::string> names;
  for (size_t i = 0; i < kOpCount; ++i) {
    const OpDef& def = registry()[static_cast<OpId>(i)];
    if (!def.runs_on(DeviceType::CUDA)) names.emplace_back(def.name);
  }
  return names;
}

}  // namespace cuda

void register_cross_device_copy(Registry& registry) {
  registry.set_kernel(OpId::to_device, DeviceType::CPU, cuda::copy_from_cpu);
}

}  // namespace mf
