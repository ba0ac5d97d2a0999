// Properties of a CUDA device that launchers need at every call (multiprocessor count, compute
// capability, peak memory bandwidth), read once per device and cached, so that no launch queries the
// driver again.
#pragma once

namespace lfm2::cuda {

struct DeviceInfo {
  int sm_count = 0;
  int major = 0, minor = 0;  // compute capability
  // The DRAM's peak rate from its clock and bus width (double data rate), GB/s: 3,352 on an H100
  // SXM, 4,814 as an H200 reports it (copies reach ~3.0 and ~4.23 TB/s)
  double peak_dram_gbs = 0;
  // compute capability 9.0: the kernels built for sm_90a alone (wgmma, the CUTLASS sm90 GEMMs) run
  bool sm90a() const { return major == 9 && minor == 0; }
  // DRAM past 4.2 TB/s (an H200; not an H100 SXM or NVL): some decode kernels default to variants
  // measured faster there
  bool fast_dram() const { return peak_dram_gbs > 4200; }
};

int current_device();
const DeviceInfo& device_info(int device);  // thread-safe; the first call per device reads it

// SMs left to the compute kernels of `device`: all of them, less those reserved for kernels that
// run beside them (the NCCL transfers of a pipeline stage). Persistent kernels (the CUTLASS grouped
// GEMM, cuBLASLt's) size their grid to it, so that a resident transfer kernel does not push a
// second wave of their tiles behind the first. Set before the first GEMM on the device.
void reserve_sms(int device, int n);
int compute_sms(int device);

// Lets `kernel` use `bytes` of dynamic shared memory on the current device (past the default 48 KB):
// cudaFuncSetAttribute once per (kernel, device), a set lookup afterwards.
void raise_smem_limit(const void* kernel, int bytes);
// The kernel prefers all of an SM's unified memory as shared memory (the carveout; once a kernel
// and device): a kernel sized for two blocks an SM gets both.
void prefer_all_shared(const void* kernel);

}  // namespace lfm2::cuda
