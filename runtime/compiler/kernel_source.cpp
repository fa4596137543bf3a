#include "compiler/kernel_source.hpp"

#include <fmt/format.h>

namespace attnplan::compiler {

namespace {
// Renders `Traits<a, b, ...>`, optionally with `/*name=*/` before each argument.
std::string traits_instance(const KernelSource& source, bool commented) {
  std::string text = source.traits + "<";
  for (std::size_t i = 0; i < source.arguments.size(); ++i) {
    if (i > 0) text += ", ";
    if (commented) text += fmt::format("/*{}=*/", source.arguments[i].name);
    text += source.arguments[i].value;
  }
  return text + ">";
}
}  // namespace

// Every kernel takes exactly one argument, its Params struct, which its traits name as `Params`.
std::string KernelSource::render_stub() const {
  return fmt::format(
      "// attnplan kernel: {family}\n"
      "#include \"{header}\"\n"
      "using Traits = {traits};\n"
      "template __global__ void {kernel}<Traits>(const {annotation}Traits::Params);\n",
      fmt::arg("family", family), fmt::arg("header", header),
      fmt::arg("traits", traits_instance(*this, true)), fmt::arg("kernel", kernel),
      fmt::arg("annotation", grid_constant ? "__grid_constant__ " : ""));
}

std::string KernelSource::name_expression() const {
  return kernel + "<Traits>";
}

}  // namespace attnplan::compiler
