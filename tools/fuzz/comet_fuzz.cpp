// comet-fuzz: the fused layer under random shapes, layouts, options and routings, each batch checked
// against the CPU reference; and a soak of one layer for minutes, watching memory and drift.
//
//   comet-fuzz [--seed S] [--batches N] [--per-family B] [--minutes M] [--jobs J] [--json FILE]
//       families S, S+1, ... of B batches each (default 16) until N batches (default 1000) or M minutes;
//       --jobs J: J processes on the one GPU, process j taking families S+j, S+j+J, ... (the CPU
//       reference is the long pole: one thread per process for these sizes)
//   comet-fuzz --family F [--upto J]
//       replays family F's batches 0..J (a mismatch prints this line)
//   comet-fuzz --list [--seed S] [--batches N] [--per-family B]
//       prints what those families and batches are, runs nothing (no GPU needed)
//   comet-fuzz --soak --minutes M [--seed S] [--check-every N] [--epoch-start V] [--json FILE]
//       one layer (H 512, F 1024, E 8, top-2, EP 4, host link) with changing token counts: every Nth
//       batch (default 25) against the reference, batch 0 again every 100 calls (bitwise equal to its
//       first run), device memory in use and host RSS after warm-up and at the end
//
// Every wait of the kernels is bounded (--timeout seconds, default 10): a hang is reported as a
// mismatch naming the rank, layer and flag. Exit status: 0 when every batch was right.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "comet/bf16.hpp"
#include "comet/common.hpp"
#include "harness/gpu_presence.hpp"
#include "ops/moe_engine.hpp"
#include "tools/fuzz/fuzz_run.hpp"

using namespace comet;
using namespace comet::fuzz;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  uint64_t seed = 1;
  long batches = 1000;
  int jobs = 1;
  int per_family = 16;
  double minutes = 0;  // 0: no time limit (fuzz), required for soak
  double timeout = 10;
  long family = -1;
  int upto = -1;
  bool soak = false;
  bool list = false;
  int check_every = 25;
  uint64_t epoch_start = 0;
  std::string json;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "comet-fuzz: %s\nsee the comment at the top of tools/fuzz/comet_fuzz.cpp\n", why);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + k).c_str());
      return argv[++i];
    };
    if (k == "--seed") a.seed = std::stoull(value());
    else if (k == "--batches") a.batches = std::stol(value());
    else if (k == "--jobs") a.jobs = std::stoi(value());
    else if (k == "--per-family") a.per_family = std::stoi(value());
    else if (k == "--minutes") a.minutes = std::stod(value());
    else if (k == "--timeout") a.timeout = std::stod(value());
    else if (k == "--family") a.family = std::stol(value());
    else if (k == "--upto") a.upto = std::stoi(value());
    else if (k == "--soak") a.soak = true;
    else if (k == "--list") a.list = true;
    else if (k == "--check-every") a.check_every = std::stoi(value());
    else if (k == "--epoch-start") a.epoch_start = std::stoull(value());
    else if (k == "--json") a.json = value();
    else usage(("unknown argument " + k).c_str());
  }
  if (a.per_family < 1 || a.batches < 1 || a.check_every < 1 || a.jobs < 1) usage("counts must be positive");
  if (a.soak && a.minutes <= 0) usage("--soak needs --minutes");
  return a;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

size_t device_bytes_in_use() {
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  return total - free;
}

size_t host_rss_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return size_t(resident) * size_t(sysconf(_SC_PAGESIZE));
}

void write_json(const std::string& path, const nlohmann::json& j) {
  if (path.empty()) return;
  std::ofstream(path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
}

// Runs family `seed`'s batches [0, count): returns mismatching batches, adds to the counters.
constexpr long kNoGpu = 77;  // a child's marker: no GPU there

struct Totals {
  long batches = 0, backward = 0, refused = 0, mismatches = 0, families = 0, families_refused = 0;
};

void run_family(uint64_t seed, int count, double timeout, Totals& t, const Clock::time_point& deadline, bool timed) {
  const Family f = draw_family(seed);
  std::unique_ptr<FamilyRun> run;
  try {
    run = std::make_unique<FamilyRun>(f, timeout);
  } catch (const InvalidArgument& e) {
    ++t.families_refused;
    std::printf("%s\n  REFUSED at construction: %s\n", describe(f).c_str(), e.what());
    return;
  }
  ++t.families;
  const auto t0 = Clock::now();
  long bwd = 0, refused = 0, bad = 0;
  int done = 0;
  for (int i = 0; i < count; ++i) {
    if (timed && Clock::now() > deadline) break;
    const Batch b = draw_batch(f, i);
    Outcome o;
    try {
      o = run->run(b);
    } catch (const std::exception& e) {
      o.mismatch = std::string("exception: ") + e.what() + "\n";
    }
    ++done;
    bwd += o.checked_backward;
    refused += o.refused;
    if (!o.ok()) {
      ++bad;
      std::printf("MISMATCH %s\n  batch %d: %s\n%s  reproduce: comet-fuzz --family %llu --upto %d\n", describe(f).c_str(),
                  i, describe(b).c_str(), o.mismatch.c_str(), (unsigned long long)seed, i);
      std::fflush(stdout);
      break;  // the layer's state after a wrong answer proves nothing more
    }
  }
  t.batches += done;
  t.backward += bwd;
  t.refused += refused;
  t.mismatches += bad;
  std::printf("%s: %d batches, %ld with backward, %ld refused, %ld mismatches (%.1f s)\n", describe(f).c_str(), done, bwd,
              refused, bad, seconds_since(t0));
  std::fflush(stdout);
}

// Process `job` of `jobs`: families seed + job, seed + job + jobs, ... until its share of the batches.
Totals fuzz_share(const Args& a, int job, int jobs, Clock::time_point deadline) {
  Totals t;
  const long share = a.batches / jobs + (job < a.batches % jobs ? 1 : 0);
  for (uint64_t seed = a.seed + job; t.batches < share; seed += jobs) {
    if (a.minutes > 0 && Clock::now() > deadline) break;
    run_family(seed, int(std::min<long>(a.per_family, share - t.batches)), a.timeout, t, deadline, a.minutes > 0);
  }
  return t;
}

// --jobs: forks before any CUDA call (a child of a process with a CUDA context cannot use CUDA); each
// child sends its totals back through a pipe.
Totals fuzz_in_processes(const Args& a, Clock::time_point deadline) {
  std::vector<pid_t> pids;
  std::vector<int> fds;
  for (int j = 0; j < a.jobs; ++j) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("comet-fuzz: pipe failed");
    std::fflush(stdout);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      Totals t;
      if (testing::has_gpu()) t = fuzz_share(a, j, a.jobs, deadline);
      else t.families_refused = -kNoGpu;
      std::fflush(stdout);
      const ssize_t n = ::write(p[1], &t, sizeof(t));
      ::_exit(n == ssize_t(sizeof(t)) ? 0 : 3);
    }
    ::close(p[1]);
    pids.push_back(pid);
    fds.push_back(p[0]);
  }
  Totals sum;
  for (int j = 0; j < a.jobs; ++j) {
    Totals t;
    const ssize_t n = ::read(fds[j], &t, sizeof(t));
    ::close(fds[j]);
    int status = 0;
    ::waitpid(pids[j], &status, 0);
    if (n == ssize_t(sizeof(t)) && t.families_refused == -kNoGpu) {
      sum.families_refused = -kNoGpu;
      continue;
    }
    if (n != ssize_t(sizeof(t)) || t.families_refused < 0) {
      std::printf("comet-fuzz: process %d ended without its totals (status %d)\n", j, status);
      ++sum.mismatches;  // a crashed process is a failure, never a silent pass
      continue;
    }
    sum.batches += t.batches;
    sum.backward += t.backward;
    sum.refused += t.refused;
    sum.mismatches += t.mismatches;
    sum.families += t.families;
    sum.families_refused += t.families_refused;
  }
  return sum;
}

int run_fuzz(const Args& a) {
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.minutes * 60));
  Totals t;
  if (a.family >= 0) {
    run_family(uint64_t(a.family), a.upto >= 0 ? a.upto + 1 : a.per_family, a.timeout, t, deadline, false);
  } else if (a.jobs > 1) {
    t = fuzz_in_processes(a, deadline);
    if (t.families_refused == -kNoGpu) {
      std::printf("comet-fuzz: no GPU, nothing to run\n");
      return testing::kSkipExitCode;
    }
  } else {
    t = fuzz_share(a, 0, 1, deadline);
  }
  const double s = seconds_since(t0);
  std::printf("\ncomet-fuzz: %ld batches in %ld families (%ld families refused at construction), %ld with a checked "
              "backward, %ld refused as they must be, %ld mismatches, %.1f s (seeds from %llu)\n",
              t.batches, t.families, t.families_refused, t.backward, t.refused, t.mismatches, s,
              (unsigned long long)a.seed);
  write_json(a.json, {{"mode", "fuzz"}, {"seed", a.seed}, {"jobs", a.jobs}, {"batches", t.batches}, {"families", t.families},
                      {"families_refused", t.families_refused}, {"backward_checked", t.backward},
                      {"refused", t.refused}, {"mismatches", t.mismatches}, {"seconds", s}});
  return t.mismatches == 0 ? 0 : 1;
}

int run_soak(const Args& a) {
  Family f;
  f.seed = a.seed;
  f.shape = MoeShape{512, 1024, 8, 2, Activation::swiglu};
  f.par = Parallel{4, 1};
  f.link = Link::host;
  f.max_tokens = 256;
  std::printf("soak: %s, %.1f minutes\n", describe(f).c_str(), a.minutes);
  FamilyRun run(f, a.timeout);
  MoeEngine& engine = run.layer().engine();
  if (a.epoch_start > 0)
    for (int r = 0; r < f.par.world(); ++r) engine.set_epoch(r, a.epoch_start);

  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.minutes * 60));
  long calls = 0, checked = 0, mismatches = 0, anchors = 0;
  size_t dev0 = 0, rss0 = 0;
  uint64_t anchor_hash = 0;  // batch 0's outputs, first run: every repeat must give the same bits
  const Batch b0 = draw_batch(f, 0, false);
  for (long i = 0; Clock::now() < deadline; ++i) {
    const bool is_anchor = i % 100 == 0;
    const Batch b = is_anchor ? b0 : draw_batch(f, int(i % 1000000), false);
    const bool check = is_anchor || i % a.check_every == 0;
    Outcome o;
    try {
      o = run.run(b, check);
    } catch (const std::exception& e) {
      o.mismatch = std::string("exception: ") + e.what() + "\n";
    }
    ++calls;
    checked += check;
    anchors += is_anchor;
    if (is_anchor && o.ok()) {
      if (i == 0) anchor_hash = o.output_hash;
      if (o.output_hash != anchor_hash) o.mismatch = "batch 0 again gave other bits than its first run\n";
    }
    if (!o.ok()) {
      ++mismatches;
      std::printf("MISMATCH at call %ld: %s\n%s", i, describe(b).c_str(), o.mismatch.c_str());
    }
    if (i == 20) {
      cudaDeviceSynchronize();
      dev0 = device_bytes_in_use();
      rss0 = host_rss_bytes();
    }
    if (i % 1000 == 0) {
      std::printf("  %ld calls, %ld checked, %ld mismatches, %.0f s\n", calls, checked, mismatches, seconds_since(t0));
      std::fflush(stdout);
    }
  }
  cudaDeviceSynchronize();
  const size_t dev1 = device_bytes_in_use(), rss1 = host_rss_bytes();
  const double s = seconds_since(t0);
  std::printf("\ncomet-fuzz --soak: %ld calls in %.1f s, %ld checked against the reference (%ld repeats of batch 0), "
              "%ld mismatches; device memory in use %.1f -> %.1f MiB, host RSS %.1f -> %.1f MiB (after call 20 -> end)\n",
              calls, s, checked, anchors, mismatches, dev0 / 1048576.0, dev1 / 1048576.0, rss0 / 1048576.0,
              rss1 / 1048576.0);
  write_json(a.json, {{"mode", "soak"}, {"seed", a.seed}, {"calls", calls}, {"checked", checked}, {"mismatches", mismatches},
                      {"seconds", s}, {"device_bytes_start", dev0}, {"device_bytes_end", dev1}, {"host_rss_start", rss0},
                      {"host_rss_end", rss1}, {"epoch_start", a.epoch_start}});
  return mismatches == 0 ? 0 : 1;
}

int list(const Args& a) {
  long n = 0;
  for (uint64_t seed = a.seed; n < a.batches; ++seed) {
    const Family f = draw_family(seed);
    std::printf("%s\n", describe(f).c_str());
    for (int i = 0; i < a.per_family && n < a.batches; ++i, ++n) std::printf("  batch %d: %s\n", i, describe(draw_batch(f, i)).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (a.list) return list(a);
  if (!a.soak && a.jobs > 1) return run_fuzz(a);  // the children check for the GPU: no CUDA before fork
  if (!testing::has_gpu()) {
    std::printf("comet-fuzz: no GPU, nothing to run\n");
    return 77;
  }
  return a.soak ? run_soak(a) : run_fuzz(a);
}
