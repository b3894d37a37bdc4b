// Tests for the safetensors writer and reader. The written file is first parsed by a minimal
// reader written here from the format description alone, so a bug shared by our writer and our
// reader (e.g. offsets relative to the wrong origin) cannot pass by round-tripping with itself.
#include "storage/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

std::string temp_path(const std::string& tag) {
  return testing::TempDir() + "dd_st_" + tag + "_" + std::to_string(::getpid()) + ".safetensors";
}

std::vector<uint8_t> slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file with a header we choose, for the corruption cases.
std::vector<uint8_t> make_raw(const std::string& header, const std::vector<uint8_t>& data, uint64_t n_override = 0) {
  const uint64_t n = n_override ? n_override : header.size();
  std::vector<uint8_t> out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

struct Fixture {
  std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};  // (2, 3)
  std::vector<int64_t> i64 = {-1, 0, 1LL << 40};                     // (3)
  std::vector<uint16_t> bf16 = {0x3f80, 0xc000, 0x4049, 0x0000, 0x7f80};  // (5), raw bits
  float scalar = 42.0f;                                                // ()
  std::vector<storage::TensorView> views() const {
    return {
        {"layers.0.w", "F32", {2, 3}, f32.data(), f32.size() * 4},
        {"step", "I64", {3}, i64.data(), i64.size() * 8},
        {"emb.bf16", "BF16", {5}, bf16.data(), bf16.size() * 2},
        {"empty", "F32", {0, 4}, nullptr, 0},
        {"scale", "F32", {}, &scalar, 4},
    };
  }
  std::map<std::string, std::string> meta = {{"format", "deltadeck-ckpt"}, {"version", "1"}, {"step", "120"}};
};

void expect_throws_naming(const std::string& path, const std::string& also = "") {
  try {
    storage::SafetensorsFile::read(path);
    ADD_FAILURE() << "expected a throw for " << path;
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(path + ": ", 0), 0u) << what;
    EXPECT_NE(what.find("(at byte offset "), std::string::npos) << what;
    if (!also.empty()) {
      EXPECT_NE(what.find(also), std::string::npos) << what;
    }
  }
}

TEST(Safetensors, DtypeSizes) {
  EXPECT_EQ(storage::dtype_size("F32"), 4u);
  EXPECT_EQ(storage::dtype_size("BF16"), 2u);
  EXPECT_EQ(storage::dtype_size("F16"), 2u);
  EXPECT_EQ(storage::dtype_size("F64"), 8u);
  EXPECT_EQ(storage::dtype_size("I64"), 8u);
  EXPECT_EQ(storage::dtype_size("I32"), 4u);
  EXPECT_EQ(storage::dtype_size("U8"), 1u);
  EXPECT_THROW(storage::dtype_size("F31"), std::runtime_error);
}

// The independent reader: only the format description, nlohmann and byte arithmetic.
TEST(Safetensors, WriteMatchesFormat) {
  Fixture fx;
  const auto views = fx.views();
  const std::string path = temp_path("format");
  const int64_t written = storage::write_safetensors(path, views, fx.meta);
  const std::vector<uint8_t> bytes = slurp(path);
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), written);
  ASSERT_GE(bytes.size(), 8u);

  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(bytes[i]) << (8 * i);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "data buffer must start 8-byte aligned";
  const std::string header_text(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  EXPECT_EQ(header_text.front(), '{');
  const nlohmann::json header = nlohmann::json::parse(header_text);
  const size_t data_start = 8 + n;

  ASSERT_TRUE(header.contains("__metadata__"));
  const auto meta = header["__metadata__"].get<std::map<std::string, std::string>>();
  EXPECT_EQ(meta, fx.meta);
  EXPECT_EQ(header.size(), views.size() + 1);

  uint64_t cursor = 0;
  for (const auto& v : views) {
    SCOPED_TRACE(v.name);
    ASSERT_TRUE(header.contains(v.name));
    const auto& e = header[v.name];
    EXPECT_EQ(e["dtype"].get<std::string>(), v.dtype);
    ASSERT_TRUE(e["shape"].is_array());
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), v.shape);
    const auto off = e["data_offsets"].get<std::vector<uint64_t>>();
    ASSERT_EQ(off.size(), 2u);
    EXPECT_EQ(off[0], cursor) << "tensors must be contiguous in write order";
    EXPECT_EQ(off[1] - off[0], v.nbytes);
    if (v.nbytes) {
      EXPECT_EQ(std::memcmp(bytes.data() + data_start + off[0], v.data, v.nbytes), 0);
    }
    cursor = off[1];
  }
  EXPECT_EQ(data_start + cursor, bytes.size()) << "offsets must cover the file to the last byte";
  std::remove(path.c_str());
}

TEST(Safetensors, RoundTrip) {
  Fixture fx;
  const auto views = fx.views();
  const std::string path = temp_path("roundtrip");
  storage::write_safetensors(path, views, fx.meta);
  const auto f = storage::SafetensorsFile::read(path);
  EXPECT_EQ(f.metadata(), fx.meta);
  ASSERT_EQ(f.entries().size(), views.size());
  std::vector<std::string> order;
  for (const auto& v : views) {
    SCOPED_TRACE(v.name);
    order.push_back(v.name);
    const auto& e = f.entries().at(v.name);
    EXPECT_EQ(e.dtype, v.dtype);
    EXPECT_EQ(e.shape, v.shape);
    EXPECT_EQ(e.nbytes, v.nbytes);
    if (v.nbytes) {
      EXPECT_EQ(std::memcmp(f.data(v.name), v.data, v.nbytes), 0);
    }
  }
  EXPECT_EQ(f.names_in_file_order(), order);
  float s = 0;
  std::memcpy(&s, f.data("scale"), 4);
  EXPECT_EQ(s, 42.0f);
  try {
    f.data("nope");
    ADD_FAILURE() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }

  // No tensors and no metadata is still a valid file.
  storage::write_safetensors(path, {}, {});
  const auto empty = storage::SafetensorsFile::read(path);
  EXPECT_TRUE(empty.entries().empty());
  EXPECT_TRUE(empty.metadata().empty());
  std::remove(path.c_str());
}

TEST(Safetensors, WriteRejectsBadViews) {
  const std::string path = temp_path("badview");
  std::vector<float> x(4);
  EXPECT_THROW(storage::write_safetensors(path, {{"x", "F32", {2, 3}, x.data(), 16}}, {}), std::runtime_error);
  EXPECT_THROW(storage::write_safetensors(path, {{"x", "Q4", {4}, x.data(), 16}}, {}), std::runtime_error);
  EXPECT_THROW(storage::write_safetensors(path, {{"x", "F32", {4}, x.data(), 16}, {"x", "F32", {4}, x.data(), 16}}, {}),
               std::runtime_error);
  const std::string no_dir = testing::TempDir() + "dd_st_no_such_dir/x.safetensors";
  try {
    storage::write_safetensors(no_dir, {}, {});
    ADD_FAILURE() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(no_dir), std::string::npos) << e.what();
  }
  std::remove(path.c_str());
}

TEST(Safetensors, FsyncDir) {
  EXPECT_NO_THROW(storage::fsync_dir(testing::TempDir()));
  EXPECT_THROW(storage::fsync_dir(testing::TempDir() + "dd_st_no_such_dir"), std::runtime_error);
}

TEST(Safetensors, CorruptHeaderLength) {
  Fixture fx;
  const std::string path = temp_path("hdrlen");
  storage::write_safetensors(path, fx.views(), fx.meta);
  std::vector<uint8_t> bytes = slurp(path);
  const uint64_t too_big = bytes.size();  // 8 + that is past the end
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(too_big >> (8 * i));
  spit(path, bytes);
  expect_throws_naming(path, "header length");

  spit(path, {1, 2, 3});
  expect_throws_naming(path, "at least 8");
  std::remove(path.c_str());
}

TEST(Safetensors, CorruptTruncatedData) {
  Fixture fx;
  const std::string path = temp_path("trunc");
  storage::write_safetensors(path, fx.views(), fx.meta);
  std::vector<uint8_t> bytes = slurp(path);
  bytes.resize(bytes.size() - 3);
  spit(path, bytes);
  expect_throws_naming(path, "scale");  // the last tensor no longer fits
  std::remove(path.c_str());
}

TEST(Safetensors, CorruptGarbageJson) {
  const std::string path = temp_path("garbage");
  spit(path, make_raw("{\"a\": {\"dtype\": \"F32\", \"sha", std::vector<uint8_t>(8)));
  expect_throws_naming(path, "JSON");
  spit(path, make_raw("[1, 2, 3]", {}));
  expect_throws_naming(path, "object");
  std::remove(path.c_str());
}

TEST(Safetensors, CorruptOffsets) {
  const std::string path = temp_path("offsets");
  const std::vector<uint8_t> data(16);
  spit(path, make_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})",
                      data));
  expect_throws_naming(path, "overlaps");
  // A hole between tensors.
  spit(path, make_raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                      data));
  expect_throws_naming(path, "gap");
  // Trailing bytes no tensor claims.
  spit(path, make_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data));
  expect_throws_naming(path, "cover");
  // Offsets that disagree with dtype x shape.
  spit(path, make_raw(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data));
  expect_throws_naming(path, "needs 12 bytes");
  // Reversed and out-of-range offsets, unknown dtype.
  spit(path, make_raw(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", data));
  expect_throws_naming(path, "data_offsets");
  spit(path, make_raw(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data));
  expect_throws_naming(path, "data_offsets");
  spit(path, make_raw(R"({"a":{"dtype":"F99","shape":[4],"data_offsets":[0,16]}})", data));
  expect_throws_naming(path, "F99");
  spit(path, make_raw(R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data));
  expect_throws_naming(path, "shape");
  std::remove(path.c_str());
}

TEST(Safetensors, MissingFile) {
  const std::string path = temp_path("missing_never_written");
  try {
    storage::SafetensorsFile::read(path);
    ADD_FAILURE() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path, 0), 0u) << e.what();
  }
}

}  // namespace
