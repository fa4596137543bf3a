// What a typed kernel spec renders to: a few-line instantiation stub that includes one real
// template header and names one kernel through an NVRTC name expression.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace attnplan::compiler {

// One named template argument, rendered as `/*name=*/value` so the stub reads like a call site.
struct TemplateArgument {
  std::string name;
  std::string value;  // C++ source text: "128", "true", "attnplan::kernels::NormKind::rms"
};

struct KernelSource {
  std::string family;  // "rmsnorm", "kv_store": the kernel family, also its template header stem
  std::string header;  // include path inside templates/, e.g. "attnplan/rmsnorm.cuh"
  std::string traits;  // the traits class template, e.g. "attnplan::kernels::RmsNormTraits"
  std::string kernel;  // the kernel function template, e.g. "attnplan::kernels::rmsnorm_kernel"
  std::vector<TemplateArgument> arguments;  // the traits' arguments, in declaration order
  nlohmann::json spec;                      // the typed spec's fields, for manifests and error payloads

  // The kernel declares its Params `const __grid_constant__` (it takes the parameter's address, e.g. for
  // TMA tensor maps); the instantiation must repeat the annotation.
  bool grid_constant = false;

  // The generated translation unit, e.g.
  //   #include "attnplan/rmsnorm.cuh"
  //   using Traits = attnplan::kernels::RmsNormTraits</*hidden_size=*/4096, /*unit_offset=*/false>;
  //   template __global__ void attnplan::kernels::rmsnorm_kernel<Traits>(attnplan::RmsNormParams);
  std::string render_stub() const;
  // The NVRTC name expression that resolves the kernel symbol, e.g.
  // "attnplan::kernels::rmsnorm_kernel<Traits>".
  std::string name_expression() const;
};

}  // namespace attnplan::compiler
