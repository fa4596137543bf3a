// Spec sections 2 and 7: a projection with HF's [out, in] weight layout.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.hpp"
#include "reference/layer.hpp"
#include "reference/parallel.hpp"

namespace attnplan::reference {

Tensor linear(const Tensor& x, const Tensor& weight, std::span<const double> bias) {
  if (x.rank() < 1) throw Error(Stage::input, "linear: x must have rank 1 or more, got a rank-0 tensor");
  if (weight.rank() != 2) {
    throw Error(Stage::input,
                fmt::format("linear: weight must be [out, in], got [{}]", fmt::join(weight.shape, ", ")));
  }
  const std::int64_t in_features = weight.extent(1);
  const std::int64_t out_features = weight.extent(0);
  if (x.extent(x.rank() - 1) != in_features) {
    throw Error(Stage::input, fmt::format("linear: x [{}] has rows of {}, but weight [{}] takes {}",
                                          fmt::join(x.shape, ", "), x.extent(x.rank() - 1),
                                          fmt::join(weight.shape, ", "), in_features));
  }
  if (!bias.empty() && static_cast<std::int64_t>(bias.size()) != out_features) {
    throw Error(Stage::input, fmt::format("linear: bias has {} elements; weight [{}] has {} outputs",
                                          bias.size(), fmt::join(weight.shape, ", "), out_features));
  }

  // x [..., in] is read as rows [M, in]; the output keeps x's leading dimensions: [..., out].
  std::vector<std::int64_t> output_shape = x.shape;
  output_shape.back() = out_features;
  Tensor output(std::move(output_shape));
  if (in_features == 0 || out_features == 0) {
    if (!bias.empty())
      for (std::size_t i = 0; i < output.data.size(); ++i) output.data[i] = bias[i % bias.size()];
    return output;
  }
  const std::int64_t rows = x.element_count() / in_features;
  // Work item: a tile of kTileRows rows of x against every weight row, so each weight row is read once
  // per tile instead of once per row (a 4096 x 4096 weight in double is 128 MiB: streaming it per row
  // made real-size projections memory bound). Within a tile, kGroupRows rows share each pass over a
  // weight row as independent accumulators. Every output is still one sum over k in increasing order,
  // so the result does not depend on the tiling.
  constexpr std::int64_t kTileRows = 32;
  constexpr std::int64_t kGroupRows = 4;
  const std::int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  detail::parallel_for(tiles, [&](std::int64_t tile) {
    const std::int64_t tile_end = std::min(rows, (tile + 1) * kTileRows);
    for (std::int64_t n = 0; n < out_features; ++n) {
      // Raw pointers in the inner loops: the reference also runs in Debug builds of the GPU tests,
      // where span indexing is a function call per multiply-add.
      const double* w_row = weight.row(n).data();  // output n's weights over the inputs
      const double bias_n = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(n)];
      std::int64_t m = tile * kTileRows;
      for (; m + kGroupRows <= tile_end; m += kGroupRows) {
        const double* x0 = x.row(m).data();
        const double* x1 = x.row(m + 1).data();
        const double* x2 = x.row(m + 2).data();
        const double* x3 = x.row(m + 3).data();
        double sum0 = 0.0, sum1 = 0.0, sum2 = 0.0, sum3 = 0.0;
        for (std::int64_t k = 0; k < in_features; ++k) {
          sum0 += x0[k] * w_row[k];
          sum1 += x1[k] * w_row[k];
          sum2 += x2[k] * w_row[k];
          sum3 += x3[k] * w_row[k];
        }
        output.row(m)[static_cast<std::size_t>(n)] = sum0 + bias_n;
        output.row(m + 1)[static_cast<std::size_t>(n)] = sum1 + bias_n;
        output.row(m + 2)[static_cast<std::size_t>(n)] = sum2 + bias_n;
        output.row(m + 3)[static_cast<std::size_t>(n)] = sum3 + bias_n;
      }
      for (; m < tile_end; ++m) {
        const double* x_row = x.row(m).data();
        double sum = 0.0;
        for (std::int64_t k = 0; k < in_features; ++k) sum += x_row[k] * w_row[k];
        output.row(m)[static_cast<std::size_t>(n)] = sum + bias_n;
      }
    }
  });
  return output;
}

}  // namespace attnplan::reference
