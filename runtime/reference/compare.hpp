// How far a result is from the reference: the measures the GPU tests and `attnplan verify` report.
#pragma once

#include <span>

namespace attnplan::reference {

// ||actual - reference||_2 / ||reference||_2. When the reference is all zeros it is ||actual||_2 (so two
// zero vectors give 0). Any NaN or infinity makes it +infinity, so a `<= tolerance` check fails loudly
// instead of silently comparing false. Throws Error(input) when the lengths differ.
double relative_l2_error(std::span<const double> reference, std::span<const double> actual);

// max_i |actual[i] - reference[i]|; +infinity on NaN or infinity. Throws Error(input) when the lengths
// differ.
double max_abs_error(std::span<const double> reference, std::span<const double> actual);

}  // namespace attnplan::reference
