#include "link_what_if.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "models.hpp"

namespace comet::tune_tool {

void what_if_link(const TuneTable& table, double link_gbps, double latency_scale, const std::string& tokens_csv,
                  int sms) {
  COMET_REQUIRE(link_gbps > 0 && latency_scale > 0, "--what-if-link: the rate and the latency scale must be > 0");
  CostModel m = table.model("NVIDIA H200", Link::device);
  m.link_gbps = link_gbps;
  m.l0_unit_us *= latency_scale;
  m.l1_slice_us *= latency_scale;
  std::vector<int> tokens;
  std::stringstream ss(tokens_csv);
  for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::atoi(t.c_str()));
  std::printf("# Cost model at a %.0f GB/s link, per-unit comm latency x %.2f (device-link calibration: GEMM "
              "%.2f TFLOP/s per SM, layer-0 unit %.2f us, layer-1 slice %.2f us), %d SMs, uniform routing\n\n",
              link_gbps, latency_scale, m.gemm_tflops_per_sm, m.l0_unit_us, m.l1_slice_us, sms);
  std::printf("| model | layout | tokens | layer | T_gemm ms | T_comm ms (link) | sequential ms | fused ms (n_comm) | "
              "pick | fused / sequential |\n|---|---|---|---|---|---|---|---|---|---|\n");
  int cases = 0, fused_wins = 0;
  std::vector<double> ratios;
  for (const bench::Model& model : bench::all_models())
    for (const char* layout : {"ep8", "tp8", "ep4tp2"}) {
      const Parallel par = bench::parse_layout(layout).par;
      for (int t : tokens)
        for (int layer : {0, 1}) {
          const LayerWork w = expected_work(model.shape, par, layer, t, 256);
          const double seq = m.predict_ms(w, 0, sms);
          int best_n = 2;
          double best = m.predict_ms(w, 2, sms);
          for (int n : {4, 8, 16, 24, 32}) {
            const double p = m.predict_ms(w, n, sms);
            if (p < best) best = p, best_n = n;
          }
          const int pick = m.best_n_comm(w, sms);
          const double gemm = w.flops / (m.gemm_tflops_per_sm * 1e12 * sms) * 1e3;
          const double link = w.link_bytes / (link_gbps * 1e9) * 1e3;
          const double picked = m.predict_ms(w, pick, sms);
          ++cases;
          fused_wins += pick != 0;
          ratios.push_back(picked / seq);
          std::printf("| %s | %s | %d | l%d | %.3f | %.3f | %.3f | %.3f (%d) | %d | %.2f |\n", model.name.c_str(),
                      layout, t, layer, gemm, link, seq, best, best_n, pick, picked / seq);
        }
    }
  std::sort(ratios.begin(), ratios.end());
  std::printf("\n%d cases: the model picks a fused split in %d, sequential mode in %d; picked / sequential: "
              "median %.2f, best %.2f, worst %.2f\n",
              cases, fused_wins, cases - fused_wins, ratios[ratios.size() / 2], ratios.front(), ratios.back());
}

}  // namespace comet::tune_tool
