// Fuzz target: safetensors bytes -> parse_safetensors -> tensors.
//
// Beyond "mf::Error or a valid result", whatever parses must also serialize and parse back to the
// same records and metadata (the reader accepts nothing the writer cannot reproduce), and every
// record must become a tensor of its shape or fail with mf::Error.
#include "fuzz/fuzz.h"
#include "miniflow.h"

#include <optional>

namespace {

bool same_records(const std::vector<mf::TensorRecord>& a, const std::vector<mf::TensorRecord>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape || a[i].data != b[i].data)
      return false;
  return true;
}

void check_parsed(const mf::SafetensorsContents& contents) {
  std::vector<std::byte> again = mf::serialize_safetensors(contents.records, contents.metadata);
  mf::SafetensorsContents reparsed = mf::parse_safetensors(again, "re-serialized");
  // The writer orders tensors by alignment, then name; the file may use any order, so compare by name.
  auto by_name = [](std::vector<mf::TensorRecord> records) {
    std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return records;
  };
  mf::fuzz::require(same_records(by_name(contents.records), by_name(reparsed.records)),
                    "parsed records serialize and parse back unchanged");
  mf::fuzz::require(contents.metadata == reparsed.metadata, "parsed metadata serializes and parses back unchanged");
  // A valid file may still hold a record no tensor can take (an empty [0, 2^32, 2^32] has strides
  // past int64): mf::Error is fine there too.
  for (const mf::TensorRecord& record : contents.records) {
    mf::fuzz::expect_only_mf_errors([&] {
      mf::Tensor tensor = mf::nn::from_record(record);
      mf::fuzz::require(tensor.shape() == record.shape && tensor.dtype() == record.dtype,
                        "from_record keeps the record's shape and dtype");
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (bool skip : {false, true}) {
    std::optional<mf::SafetensorsContents> contents;
    mf::fuzz::expect_only_mf_errors([&] {
      contents = mf::parse_safetensors(mf::fuzz::as_bytes(data, size), "fuzz input", {.skip_unsupported_dtypes = skip});
    });
    if (contents) check_parsed(*contents);
  }
  return 0;
}
