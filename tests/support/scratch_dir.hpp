// Test helper: a fixture whose `dir` is a fresh directory of this process under the system's temp
// directory, made before each test and removed after it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace mpiddp::testing {

class ScratchDir : public ::testing::Test {
 protected:
  explicit ScratchDir(const std::string& name) : name_(name) {}
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / ("mpiddp_" + name_ + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::filesystem::path dir;

 private:
  std::string name_;
};

}  // namespace mpiddp::testing
