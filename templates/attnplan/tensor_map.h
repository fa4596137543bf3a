// The TMA tensor map as kernel parameters carry it: 128 opaque bytes, 128-byte aligned, the size and
// alignment of the driver's CUtensorMap. The host fills one with cuTensorMapEncodeTiled; the device only
// takes its address (wgmma.cuh: tma_load_2d). Builtin types only, like params.h.
#pragma once

namespace attnplan {

struct alignas(128) TensorMap {
  unsigned long long opaque[16];
};

static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

}  // namespace attnplan
