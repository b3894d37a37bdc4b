// Tests for storage::Sha256 against the FIPS 180-2 appendix B vectors (the same digests are in
// NIST's SHA-256 example file), plus split-update and file hashing. Splits are at odd lengths so
// every buffering path of update() (partial fill, whole blocks, tail) is hit.
#include "storage/sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(storage::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(storage::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(storage::sha256_hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(storage::sha256_hex(million.data(), million.size()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths 55, 56 and 64 are where the padding needs one block or spills into a second.
TEST(Sha256, PaddingBoundaries) {
  EXPECT_EQ(storage::sha256_hex(std::string(55, 'a').data(), 55),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(storage::sha256_hex(std::string(56, 'a').data(), 56),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(storage::sha256_hex(std::string(64, 'a').data(), 64),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::vector<uint8_t> data(5000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::string want = storage::sha256_hex(data.data(), data.size());
  for (const std::vector<size_t>& splits :
       std::vector<std::vector<size_t>>{{1, 2, 3, 63, 64, 65, 127, 1000}, {0, 7, 0, 129}, {4999}, {63}}) {
    storage::Sha256 h;
    size_t at = 0;
    for (size_t s : splits) {
      const size_t n = std::min(s, data.size() - at);
      h.update(data.data() + at, n);
      at += n;
    }
    h.update(data.data() + at, data.size() - at);
    EXPECT_EQ(h.hex_digest(), want);
  }
  storage::Sha256 bytewise;
  for (uint8_t c : data) bytewise.update(&c, 1);
  EXPECT_EQ(bytewise.hex_digest(), want);
}

TEST(Sha256, File) {
  // Over 1 MiB so the block loop runs more than once.
  std::string content(3 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i % 251);
  const std::string path = testing::TempDir() + "dd_sha256_" + std::to_string(::getpid()) + ".bin";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  EXPECT_EQ(storage::sha256_file(path), storage::sha256_hex(content.data(), content.size()));
  std::remove(path.c_str());

  const std::string missing = testing::TempDir() + "dd_sha256_missing_file";
  try {
    storage::sha256_file(missing);
    FAIL() << "expected a throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

}  // namespace
