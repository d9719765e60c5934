#include "nn/checkpoint.h"

#include "core/graph.h"

#include <cstring>

namespace mf::nn {

namespace {

// The tensor's elements as a contiguous CPU tensor (itself when it already is one).
Tensor host_contiguous(const Tensor& tensor) {
  MF_CHECK(tensor.defined(), "checkpoint: cannot store an undefined tensor");
  NoGradGuard no_grad;
  return tensor.detach().to(Device::cpu()).contiguous();
}

std::span<const std::byte> bytes_of(const Tensor& host) {
  return {static_cast<const std::byte*>(host.raw_data()), static_cast<size_t>(host.numel()) * host.element_size()};
}

}  // namespace

TensorRecord to_record(const std::string& name, const Tensor& tensor) {
  Tensor host = host_contiguous(tensor);
  std::span<const std::byte> bytes = bytes_of(host);
  return {name, host.dtype(), host.shape(), {bytes.begin(), bytes.end()}};
}

Tensor from_record(const TensorRecord& record, Device device) {
  Tensor host;
  try {
    host = Tensor::empty(record.shape, record.dtype);
  } catch (const Error& e) {  // e.g. an empty tensor whose other sizes overflow int64 strides
    fail("from_record: tensor '{}': {}", record.name, e.what());
  }
  MF_CHECK(record.data.size() == bytes_of(host).size(),
           "from_record: tensor '{}' has {} bytes, but shape {} of {} needs {}", record.name, record.data.size(),
           shape_str(record.shape), dtype_name(record.dtype), bytes_of(host).size());
  if (!record.data.empty()) std::memcpy(host.raw_data(), record.data.data(), record.data.size());
  return device.is_cpu() ? host : host.to(device);
}

void save_tensors(const std::filesystem::path& path, const StateDict& tensors, const SafetensorsMetadata& metadata) {
  // Borrow each tensor's bytes instead of copying them into records: contiguous CPU tensors are
  // written straight from their storage.
  std::vector<Tensor> hosts;
  hosts.reserve(tensors.size());
  std::vector<TensorRecordView> views;
  views.reserve(tensors.size());
  for (const NamedTensor& entry : tensors) {
    const Tensor& host = hosts.emplace_back(host_contiguous(entry.tensor));
    views.push_back({entry.name, host.dtype(), host.shape(), bytes_of(host)});
  }
  write_safetensors(path, views, metadata);
}

TensorFile load_tensors(const std::filesystem::path& path, Device device) {
  SafetensorsContents contents = read_safetensors(path);
  TensorFile file{.tensors = {}, .metadata = std::move(contents.metadata)};
  file.tensors.reserve(contents.records.size());
  for (const TensorRecord& record : contents.records) {
    try {
      file.tensors.push_back({record.name, from_record(record, device)});
    } catch (const Error& e) {  // from_record names the tensor
      fail("cannot load '{}': {}", path.string(), e.what());
    }
  }
  return file;
}

void save(const Module& module, const std::filesystem::path& path, const SafetensorsMetadata& metadata) {
  save_tensors(path, module.state_dict(), metadata);
}

LoadReport load(Module& module, const std::filesystem::path& path, bool strict) {
  TensorFile file = load_tensors(path);
  try {
    return module.load_state_dict(file.tensors, strict);
  } catch (const Error& e) {
    fail("cannot load checkpoint '{}': {}", path.string(), e.what());
  }
}

}  // namespace mf::nn
