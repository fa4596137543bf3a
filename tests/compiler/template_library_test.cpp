#include <fstream>

#include "compiler/template_library.hpp"
#include "core/error.hpp"
#include "core/sha256.hpp"
#include "support/catch.hpp"
#include "support/temp_dir.hpp"

using attnplan::Error;
using attnplan::Stage;
using attnplan::compiler::included_names;
using attnplan::compiler::TemplateLibrary;

namespace {

void write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

using Strings = std::vector<std::string>;

}  // namespace

TEST_CASE("the embedded library holds every template header", "[template_library]") {
  const TemplateLibrary library = TemplateLibrary::embedded();
  CHECK(library.origin() == "embedded");
  for (const char* name :
       {"attnplan/common.cuh", "attnplan/params.h", "attnplan/rmsnorm.cuh", "attnplan/kv_store.cuh"}) {
    INFO(name);
    REQUIRE(library.contains(name));
    CHECK_FALSE(library.headers().at(name).empty());
  }
  CHECK(library.headers().at("attnplan/rmsnorm.cuh").find("rmsnorm_kernel") != std::string::npos);
}

TEST_CASE("include closures follow project headers only", "[template_library]") {
  const TemplateLibrary library = TemplateLibrary::embedded();
  CHECK(library.include_closure("attnplan/rmsnorm.cuh") ==
        Strings{"attnplan/common.cuh", "attnplan/fp8_activation.cuh", "attnplan/params.h",
                "attnplan/rmsnorm.cuh", "attnplan/rope.cuh", "attnplan/vector_width.h"});
  CHECK(library.include_closure("attnplan/kv_store.cuh") ==
        Strings{"attnplan/common.cuh", "attnplan/fp8_kv.cuh", "attnplan/kv_store.cuh", "attnplan/params.h",
                "attnplan/vector_width.h"});
  // The postprocess kernel shares only common.cuh with the KV store: editing the store (or its fp8
  // helpers) must not change the postprocess key.
  CHECK(library.include_closure("attnplan/qkv_postprocess.cuh") ==
        Strings{"attnplan/common.cuh", "attnplan/params.h", "attnplan/qkv_postprocess.cuh",
                "attnplan/qkv_postprocess_params.h", "attnplan/rope.cuh", "attnplan/vector_width.h"});
  CHECK(library.include_closure("attnplan/params.h") == Strings{"attnplan/params.h"});
}

TEST_CASE("the source tree's templates/ equals the embedded library", "[template_library]") {
  const TemplateLibrary from_tree = TemplateLibrary::from_directory(ATTNPLAN_SOURCE_DIR "/templates");
  CHECK(from_tree.origin() == ATTNPLAN_SOURCE_DIR "/templates");
  CHECK(from_tree.headers() == TemplateLibrary::embedded().headers());
}

TEST_CASE("from_directory names headers relative to the root with '/'", "[template_library]") {
  attnplan::testing::TempDir dir;
  write(dir / "a/b/deep.cuh", "// deep\n");
  write(dir / "top.h", "#include \"a/b/deep.cuh\"\n");
  write(dir / "notes.txt", "not a header");
  write(dir / "kernel.cu", "not a header either");
  const TemplateLibrary library = TemplateLibrary::from_directory(dir.path());
  REQUIRE(library.headers().size() == 2);
  CHECK(library.headers().at("a/b/deep.cuh") == "// deep\n");
  CHECK(library.include_closure("top.h") == Strings{"a/b/deep.cuh", "top.h"});
}

TEST_CASE("from_directory rejects a missing directory", "[template_library]") {
  attnplan::testing::TempDir dir;
  try {
    TemplateLibrary::from_directory(dir / "missing");
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::input);
    CHECK(error.message().find("missing") != std::string::npos);
  }
}

TEST_CASE("include directives are recognized in every spelling the preprocessor accepts",
          "[template_library]") {
  const std::string source =
      "#include \"a.h\"\n"
      "  #  include   <b.h>  // trailing comment\n"
      "#\tinclude \"c/d.cuh\"\n"
      "#define X 1\n"
      "#include_next <e.h>\n"
      "#include MACRO_NAME\n"
      "int included = 0;  // #include \"not-a-directive.h\" is text after code\n";
  CHECK(included_names(source) == Strings{"a.h", "b.h", "c/d.cuh"});
}

TEST_CASE("closures include angle-bracket names of library headers, survive cycles and skip unknowns",
          "[template_library]") {
  // NVRTC resolves <name> against its in-memory headers as well, so those count for the cache key.
  const TemplateLibrary library = TemplateLibrary::from_headers(
      {{"x/a.cuh", "#include <x/b.cuh>\n#include <cuda_bf16.h>\n#include \"unknown.h\"\n"},
       {"x/b.cuh", "#include \"x/a.cuh\"\n#include \"x/c.cuh\"\n"},
       {"x/c.cuh", "// leaf\n"},
       {"x/unrelated.cuh", "// not reachable\n"}},
      "test");
  CHECK(library.include_closure("x/a.cuh") == Strings{"x/a.cuh", "x/b.cuh", "x/c.cuh"});
  CHECK(library.include_closure("x/c.cuh") == Strings{"x/c.cuh"});
}

TEST_CASE("closures resolve names exactly as NVRTC does, never relative to the includer",
          "[template_library]") {
  const TemplateLibrary library = TemplateLibrary::from_headers(
      {{"dir/a.cuh", "#include \"b.cuh\"\n"}, {"dir/b.cuh", "// sibling\n"}, {"b.cuh", "// top level\n"}},
      "test");
  CHECK(library.include_closure("dir/a.cuh") == Strings{"b.cuh", "dir/a.cuh"});
}

TEST_CASE("the closure of a header outside the library is an input error", "[template_library]") {
  const TemplateLibrary library = TemplateLibrary::embedded();
  try {
    library.include_closure("attnplan/missing.cuh");
    FAIL("expected an error");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::input);
    CHECK(error.message().find("attnplan/missing.cuh") != std::string::npos);
  }
}

TEST_CASE("header hashes are the SHA-256 of each header's contents, computed once", "[template_library]") {
  const TemplateLibrary library =
      TemplateLibrary::from_headers({{"a.h", "int a;"}, {"b.cuh", "#include \"a.h\"\n"}}, "memory");
  CHECK(library.header_sha256("a.h") == attnplan::core::sha256_hex("int a;"));
  CHECK(library.header_sha256("b.cuh") == attnplan::core::sha256_hex("#include \"a.h\"\n"));
  // The same string each call: the hash is stored, not recomputed.
  CHECK(&library.header_sha256("a.h") == &library.header_sha256("a.h"));
  try {
    library.header_sha256("missing.h");
    FAIL("expected Error(input)");
  } catch (const Error& error) {
    CHECK(error.stage() == Stage::input);
    CHECK(std::string(error.what()).find("missing.h") != std::string::npos);
  }
}
