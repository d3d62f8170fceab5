// e4m3 quantisation on the GPU (fp8_quantize.cu): the device side of comet::fp8's block-scaled formats
// (include/comet/fp8.hpp), bitwise identical to the CPU oracle fp8::quantize on the same values (bf16
// converted to float): s = amax / 448 (s = 1 for a block of zeros) by IEEE float division, codes
// e4m3(v / s) by IEEE float division and a round-to-nearest-even, saturating conversion.
//
// Non-finite input: the CPU oracle throws; these kernels do not check. A NaN or an infinity in a block
// gives that block a NaN or infinite scale and meaningless codes (garbage in, garbage out, no error).
#pragma once

#include <cuda_runtime.h>

namespace comet::kernels {

// x [rows][hidden] bf16, row-major -> `rows` packed records of fp8::record_bytes(hidden) bytes each
// (fp8.hpp): the row's codes (1 x 128 blocks), its hidden / 128 fp32 scales at byte hidden + 4 j, then
// zero padding. hidden must be a positive multiple of 128, rows >= 0, both pointers 16-byte aligned
// (comet::InvalidArgument before any launch otherwise). rows == 0 launches nothing.
void quantize_rows_e4m3(const void* x_bf16, int rows, int hidden, void* records, cudaStream_t stream);

// w [mats][rows][cols] bf16 (an expert's weight is one mat: rows = N, cols = K) -> codes
// [mats][rows][cols] e4m3 and scales [mats][ceil(rows / 128)][cols / 128] fp32, one per 128 x 128
// block (the last row block may be partial). cols must be a positive multiple of 128, mats, rows >= 0,
// the three pointers 16-byte aligned. Nothing is launched when there is nothing to quantise.
void quantize_weights_e4m3(const void* w_bf16, int mats, int rows, int cols, void* codes, float* scales,
                           cudaStream_t stream);

}  // namespace comet::kernels
