// The plugin loader: real plugins load and describe themselves; a missing file, a library that is
// not a plugin, a file that is not a library and a plugin of another ABI get one clear error each.
#include <gtest/gtest.h>

#include <boost/dll/shared_library.hpp>
#include <filesystem>
#include <fstream>

#include "runner/plugin_loader.hpp"

using namespace strata;
namespace fs = std::filesystem;

static std::string plugin(const std::string& family) {
  return std::string(STRATA_TEST_PLUGIN_DIR) + "/libstrata_" + family + ".so";
}

static std::string error_of(const std::string& path) {
  try {
    load_plugin(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Loader, LoadsRealPluginsWithTheirDescriptors) {
  LoadedPlugin p = load_plugin(plugin("ddp"));
  EXPECT_EQ(p.descriptor->family, "ddp");
  ASSERT_EQ(p.descriptor->strategies.size(), 1u);
  const StrategySpec& s = p.descriptor->strategies[0];
  EXPECT_EQ(s.name, "ddp");
  ASSERT_EQ(s.options.size(), 1u);
  EXPECT_EQ(s.options[0].name, "bucket_mb");
  EXPECT_EQ(s.options[0].default_value, "25");
  EXPECT_NE(describe(p, s).find("bucket_mb <real>  default 25"), std::string::npos);
}

TEST(Loader, MissingFile) {
  std::string e = error_of("/nonexistent/libstrata_x.so");
  EXPECT_NE(e.find("/nonexistent/libstrata_x.so"), std::string::npos) << e;
  EXPECT_NE(e.find("file not found"), std::string::npos) << e;
}

TEST(Loader, NotALibrary) {
  fs::path f = fs::temp_directory_path() / "libstrata_text.so";
  std::ofstream(f) << "not an ELF file\n";
  std::string e = error_of(f.string());
  EXPECT_NE(e.find(f.string()), std::string::npos) << e;
  EXPECT_NE(e.find("not a loadable shared library"), std::string::npos) << e;
  fs::remove(f);
}

TEST(Loader, LibraryThatIsNotAPlugin) {
  std::string path = std::string(STRATA_TEST_PLUGIN_DIR_TESTS) + "/libstrata_no_exports.so";
  std::string e = error_of(path);
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("not a strata plugin"), std::string::npos) << e;
}

TEST(Loader, WrongAbiIsRefusedBeforeTheDescriptorIsRead) {
  std::string path = std::string(STRATA_TEST_PLUGIN_DIR_TESTS) + "/libstrata_wrong_abi.so";
  std::string e = error_of(path);
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("ABI version 999"), std::string::npos) << e;
}

TEST(Registry, BrokenFilesDoNotHideGoodPlugins) {
  PluginRegistry r;
  r.scan({STRATA_TEST_PLUGIN_DIR, STRATA_TEST_PLUGIN_DIR_TESTS, "/nonexistent-dir"});
  EXPECT_NE(r.find("dp"), nullptr);
  EXPECT_NE(r.find("ddp"), nullptr);
  EXPECT_NE(r.find("faulty"), nullptr);
  EXPECT_EQ(r.find("nosuch"), nullptr);
  EXPECT_EQ(r.problems().size(), 3u);  // no_exports, wrong_abi, the missing directory
}

TEST(Registry, StrategyKeepsItsLibraryLoaded) {
  PluginRegistry r;
  r.scan({STRATA_TEST_PLUGIN_DIR});
  const LoadedPlugin* p = r.find("ddp");
  ASSERT_NE(p, nullptr);
  long before = p->library.use_count();
  {
    std::shared_ptr<Strategy> s =
        r.create("ddp", Options(std::map<std::string, std::string>{{"bucket_mb", "25"}}));
    EXPECT_EQ(p->library.use_count(), before + 1);
  }
  EXPECT_EQ(p->library.use_count(), before);
}

TEST(Options, ValidatedAgainstTheDescriptor) {
  StrategySpec spec{"x",
                    "",
                    {{"bucket_mb", OptionType::real, "25", "", {}},
                     {"mode", OptionType::choice, "a", "", {"a", "b"}},
                     {"on", OptionType::boolean, "true", "", {}},
                     {"count", OptionType::integer, "1", "", {}}}};
  Options o = validate_options(spec, {"bucket_mb=1.5", "mode=b"});
  EXPECT_DOUBLE_EQ(o.get_real("bucket_mb"), 1.5);
  EXPECT_EQ(o.get("mode"), "b");
  EXPECT_TRUE(o.get_bool("on"));  // default filled in
  auto message = [&](std::vector<std::string> kv) {
    try {
      validate_options(spec, kv);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({"nosuch=1"}).find("has no such option (it has: bucket_mb, mode, on, count)"),
            std::string::npos);
  EXPECT_NE(message({"bucket_mb=abc"}).find("must be a finite number"), std::string::npos);
  // Numbers checked as numbers: no inf or nan, integers within the int a plugin keeps them in
  // (2147483648 would wrap to -2147483648), a key given twice refused, each quoted as given.
  for (const char* bad : {"bucket_mb=inf", "bucket_mb=-inf", "bucket_mb=nan", "bucket_mb=1e999"})
    EXPECT_EQ(message({bad}), std::string("--plugin-opt ") + bad + ": must be a finite number");
  EXPECT_EQ(message({"count=2147483648"}),
            "--plugin-opt count=2147483648: must be a whole number in -2147483648..2147483647");
  EXPECT_NE(message({"count=9223372036854775807"}).find("must be a whole number in"),
            std::string::npos);
  EXPECT_EQ(message({"count=2147483647"}), "");
  EXPECT_EQ(message({"count=-2147483648"}), "");
  EXPECT_EQ(message({"mode=a", "mode=b"}),
            "--plugin-opt mode=b: mode is given twice (first mode=a)");
  EXPECT_NE(message({"mode=c"}).find("must be one of a b"), std::string::npos);
  EXPECT_NE(message({"on=maybe"}).find("true or false"), std::string::npos);
  EXPECT_NE(message({"novalue"}).find("expected KEY=VALUE"), std::string::npos);
}
