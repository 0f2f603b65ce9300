// Option sources and their precedence: command line > --config file > MPIDDP_* environment.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "app/cli.hpp"
#include "scoped.hpp"

namespace po = boost::program_options;
using mpiddp::app::parse_options;

namespace {

po::options_description demo_options() {
  po::options_description d("demo");
  d.add_options()("help", "help")("config", po::value<std::string>(), "config file")(
      "batch-size", po::value<int>()->default_value(32), "batch")("lr", po::value<double>()->default_value(0.1), "lr")(
      "name", po::value<std::string>(), "name");
  return d;
}

using mpiddp::testing::EnvGuard;

std::string write_config(const std::string& text) {
  std::string path = ::testing::TempDir() + "mpiddp_cli_test.cfg";
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST(Cli, EnvNameMapping) {
  EXPECT_EQ(mpiddp::app::env_name_for("batch-size"), "MPIDDP_BATCH_SIZE");
  EXPECT_EQ(mpiddp::app::env_name_for("lr"), "MPIDDP_LR");
}

TEST(Cli, DefaultsWhenNothingSet) {
  auto vm = parse_options(demo_options(), {});
  EXPECT_EQ(vm["batch-size"].as<int>(), 32);
  EXPECT_DOUBLE_EQ(vm["lr"].as<double>(), 0.1);
}

TEST(Cli, EnvironmentOverridesDefault) {
  EnvGuard g("MPIDDP_BATCH_SIZE", "64");
  EXPECT_EQ(parse_options(demo_options(), {})["batch-size"].as<int>(), 64);
}

TEST(Cli, ConfigOverridesEnvironmentAndCommandLineOverridesConfig) {
  EnvGuard g("MPIDDP_BATCH_SIZE", "64");
  EnvGuard g2("MPIDDP_LR", "0.5");
  auto path = write_config("batch-size = 128\nname = from-config\n");
  auto vm = parse_options(demo_options(), {"--config", path});
  EXPECT_EQ(vm["batch-size"].as<int>(), 128);
  EXPECT_DOUBLE_EQ(vm["lr"].as<double>(), 0.5);
  EXPECT_EQ(vm["name"].as<std::string>(), "from-config");
  vm = parse_options(demo_options(), {"--config", path, "--batch-size", "7"});
  EXPECT_EQ(vm["batch-size"].as<int>(), 7);
}

TEST(Cli, UnrelatedMpiddpVariablesIgnored) {
  EnvGuard g("MPIDDP_ROOT", "/opt/mpiddp");  // set by the modulefile, not an option
  EXPECT_NO_THROW(parse_options(demo_options(), {}));
}

TEST(Cli, BadInputThrows) {
  EXPECT_THROW(parse_options(demo_options(), {"--nope"}), po::error);
  EXPECT_THROW(parse_options(demo_options(), {"--batch-size", "abc"}), po::error);
  EXPECT_THROW(parse_options(demo_options(), {"--config", "/nonexistent.cfg"}), po::error);
  EnvGuard g("MPIDDP_BATCH_SIZE", "many");
  EXPECT_THROW(parse_options(demo_options(), {}), po::error);
}
