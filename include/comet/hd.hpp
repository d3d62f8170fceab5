// COMET_HD: functions that run on the host and, compiled by nvcc, on the device too.
#pragma once

#if defined(__CUDACC__)
#define COMET_HD __host__ __device__
#else
#define COMET_HD
#endif
