// The resource report ptxas writes into the NVRTC log under `--ptxas-options=-v`.
#pragma once

#include <string>

namespace attnplan::compiler {

// What ptxas reports for one kernel. Byte counts per thread for stack and spills, per block for smem.
struct ResourceUsage {
  int registers = 0;     // per thread
  int shared_bytes = 0;  // static shared memory
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
  int stack_bytes = 0;
  int constant_bytes = 0;  // every cmem[N] bank listed on the kernel's "Used" line, summed
  int barriers = 0;
  int spill_bytes() const { return spill_store_bytes + spill_load_bytes; }
  friend bool operator==(const ResourceUsage&, const ResourceUsage&) = default;
};

// Parses the ptxas info lines that concern the entry function `lowered_name`:
//   ptxas info    : Compiling entry function '<name>' for 'sm_90a'
//   ptxas info    : Function properties for <name>
//       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
//   ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 380 bytes cmem[0]
// Other functions' lines may come before, after or in between (a non-inlined device function gets its own
// "Function properties" block inside the entry's section). Parts ptxas leaves out (smem when there is
// none, barriers before CUDA 12, cmem on CUDA 13 for sm_90) read as 0. Throws Error(compile) if the log
// has no "Compiling entry function" or no "Used ... registers" line for `lowered_name`.
ResourceUsage parse_ptxas_report(const std::string& log, const std::string& lowered_name);

}  // namespace attnplan::compiler
