// comet._C: the thin binding of the C++ library (nanobind). Torch-free: tensors cross as device
// pointers and the caller's stream as a handle; python/comet/ owns the torch side (dtypes, shapes,
// custom ops, the nn.Module). Every C++ exception becomes a Python one before anything is launched
// (comet::InvalidArgument -> comet.InvalidArgument, a ValueError).
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "comet/fused_moe.hpp"
#include "comet/team.hpp"
#include "comet/tune.hpp"
#include "comet/version.hpp"
#include "kernels/fp8_quantize.hpp"

namespace nb = nanobind;
using namespace comet;

namespace {

bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// A Python callable held from C++: shared_ptr copies never touch Python reference counts; the last
// owner drops the reference under the GIL (or leaks it when the interpreter is already gone).
using PyCallable = std::shared_ptr<nb::object>;
PyCallable hold(nb::object fn) {
  return PyCallable(new nb::object(std::move(fn)), [](nb::object* o) {
    if (interpreter_alive()) {
      nb::gil_scoped_acquire gil;
      delete o;
    } else {
      o->release();  // the interpreter is gone: nothing to give the reference back to
      delete o;
    }
  });
}

AllGatherFn all_gather_from(nb::object fn) {
  PyCallable f = hold(std::move(fn));
  return [f](const void* mine, void* all, size_t bytes) {
    nb::gil_scoped_acquire gil;
    nb::bytes in(static_cast<const char*>(mine), bytes);
    nb::object out = (*f)(in);
    nb::bytes got = nb::cast<nb::bytes>(out);
    COMET_REQUIRE(got.size() % bytes == 0 && got.size() > 0, "IpcTeam: the all-gather returned ", got.size(),
                  " bytes, not a multiple of ", bytes);
    std::memcpy(all, got.c_str(), got.size());
  };
}

DeviceAllocator allocator_from(std::optional<nb::object> allocate, std::optional<nb::object> release) {
  DeviceAllocator a;
  if (!allocate && !release) return a;
  COMET_REQUIRE(allocate && release, "FusedMoe: allocate and release go together");
  PyCallable alloc = hold(*allocate), free = hold(*release);
  a.allocate = [alloc](size_t bytes) -> void* {
    nb::gil_scoped_acquire gil;
    return reinterpret_cast<void*>(nb::cast<uintptr_t>((*alloc)(bytes)));
  };
  a.release = [free](void* p) {
    if (!interpreter_alive()) return;  // at exit the framework's allocator is gone with the process
    nb::gil_scoped_acquire gil;
    (*free)(reinterpret_cast<uintptr_t>(p));
  };
  return a;
}

LayerRequest request(std::optional<int> tile_n, std::optional<int> n_comm) {
  LayerRequest r;
  r.tile_n = tile_n;
  r.n_comm = n_comm;
  return r;
}

// (tokens, x, ids, ids_are_int64, gates, out, hidden): one rank's batch as device addresses (hidden 0:
// the layer's own buffer).
using BatchTuple = std::tuple<int, uintptr_t, uintptr_t, bool, uintptr_t, uintptr_t, uintptr_t>;

RankBatch batch_of(const BatchTuple& b) {
  RankBatch r;
  r.tokens = std::get<0>(b);
  r.x = reinterpret_cast<const void*>(std::get<1>(b));
  r.ids = reinterpret_cast<const void*>(std::get<2>(b));
  r.ids_type = std::get<3>(b) ? IdType::i64 : IdType::i32;
  r.gates = reinterpret_cast<const float*>(std::get<4>(b));
  r.out = reinterpret_cast<void*>(std::get<5>(b));
  r.hidden = reinterpret_cast<void*>(std::get<6>(b));
  return r;
}

// (dout, dx, dgates, dw0, dw1): one rank's gradients of the last forward as device addresses.
using GradTuple = std::tuple<uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t>;

RankGrad grad_of(const GradTuple& g) {
  RankGrad r;
  r.dout = reinterpret_cast<const void*>(std::get<0>(g));
  r.dx = reinterpret_cast<void*>(std::get<1>(g));
  r.dgates = reinterpret_cast<float*>(std::get<2>(g));
  r.dw0 = reinterpret_cast<void*>(std::get<3>(g));
  r.dw1 = reinterpret_cast<void*>(std::get<4>(g));
  return r;
}

BackwardOptions backward_options(const std::string& grad_type, bool accumulate, bool fused_activation,
                                 const std::string& weight_grad_kernel) {
  BackwardOptions o;
  o.fused_activation = fused_activation;
  const std::optional<WeightGradKernel> kernel = weight_grad_kernel_named(weight_grad_kernel);
  if (!kernel)
    throw InvalidArgument("weight_grad_kernel must be " + enum_names(kWeightGradKernels) + ", got '" + weight_grad_kernel + "'");
  o.weight_grad_kernel = *kernel;
  if (grad_type == "bf16") o.grad_type = GradType::bf16;
  else if (grad_type == "f32") o.grad_type = GradType::f32;
  else throw InvalidArgument("grad_type must be 'bf16' or 'f32', got '" + grad_type + "'");
  o.accumulate = accumulate;
  return o;
}

cudaStream_t stream_of(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

nb::dict decision_dict(const LaunchDecision& d) {
  nb::dict o;
  o["layer"] = d.layer;
  o["schedule"] = d.schedule == Schedule::sequential ? "sequential" : "fused";
  o["tile_n"] = d.tile_n;
  o["n_comm"] = d.n_comm;
  o["m_group"] = d.m_group;
  o["n_group"] = d.n_group;
  o["resident_blocks"] = d.resident_blocks;
  o["adaptive"] = d.adaptive;
  o["picked_by"] = d.picked_by;
  return o;
}

DeviceTransport transport_of(const std::string& s) {
  if (s == "peer") return DeviceTransport::peer;
  if (s == "nvshmem") return DeviceTransport::nvshmem;
  throw InvalidArgument("transport must be 'peer' or 'nvshmem', got '" + s + "'");
}

DType dtype_of(const std::string& s) {
  if (s == "bf16") return DType::bf16;
  if (s == "e4m3") return DType::e4m3;
  throw InvalidArgument("dtype must be 'bf16' or 'e4m3' (fp8 layer 0), got '" + s + "'");
}

const void* cptr(uintptr_t p) { return reinterpret_cast<const void*>(p); }
const float* fptr(uintptr_t p) { return reinterpret_cast<const float*>(p); }

Activation activation_of(const std::string& s) {
  if (s == "swiglu") return Activation::swiglu;
  if (s == "gelu") return Activation::gelu;
  if (s == "silu") return Activation::silu;
  throw InvalidArgument("activation must be 'swiglu', 'gelu' or 'silu', got '" + s + "'");
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "comet: distributed MoE layers with communication hidden inside the expert GEMMs (C++ core)";
  nb::exception<InvalidArgument>(m, "InvalidArgument", PyExc_ValueError);
  nb::exception<TimeoutError>(m, "DeviceTimeout", PyExc_TimeoutError);
  nb::exception<DeviceReportedError>(m, "DeviceError", PyExc_RuntimeError);
  nb::exception<CudaError>(m, "CudaError", PyExc_RuntimeError);

  m.def("version", [] { return std::string(version()); });
  m.def(
      "layer_footprint",
      [](int hidden, int ffn, int experts, int topk, const std::string& activation, int ep, int tp, int max_tokens,
         int max_rows, double load_factor, bool training) {
        const MoeShape shape{hidden, ffn, experts, topk, activation_of(activation)};
        const Parallel par{ep, tp};
        validate(shape, par);
        const MoeCapacity cap = resolve_capacity(shape, par, MoeCapacity{max_tokens, max_rows, load_factor});
        const LayerFootprint f = layer_footprint(shape, par, cap, training);
        nb::dict d;
        d["gathered"] = f.gathered;
        d["expert_out"] = f.expert_out;
        d["hidden"] = f.hidden;
        d["self_partial"] = f.self_partial;
        d["flags"] = f.flags;
        d["plan"] = f.plan;
        d["workspaces"] = f.workspaces;
        d["training"] = f.training;
        d["symmetric"] = f.symmetric;
        d["compute"] = f.compute();
        d["total"] = f.total();
        d["max_rows"] = cap.max_rows_per_rank;
        return d;
      },
      nb::arg("hidden"), nb::arg("ffn"), nb::arg("experts"), nb::arg("topk"), nb::arg("activation"), nb::arg("ep"),
      nb::arg("tp"), nb::arg("max_tokens"), nb::arg("max_rows") = 0, nb::arg("load_factor") = 0.0,
      nb::arg("training") = false);
  m.def("nvshmem_available", &nvshmem_available);
  m.def("cuda_device_count", [] {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  });
  // kernels/fp8_quantize.hpp: w [mats][rows][cols] bf16 -> codes [mats][rows][cols] e4m3 and scales
  // [mats][ceil(rows / 128)][cols / 128] fp32 (128 x 128 blocks), ordered on `stream` (device addresses;
  // cols a multiple of 128, 16-byte aligned pointers: comet.InvalidArgument otherwise, before any launch).
  m.def(
      "quantize_weights_e4m3",
      [](uintptr_t w, int mats, int rows, int cols, uintptr_t codes, uintptr_t scales, uintptr_t stream) {
        kernels::quantize_weights_e4m3(cptr(w), mats, rows, cols, reinterpret_cast<void*>(codes),
                                       reinterpret_cast<float*>(scales), stream_of(stream));
      },
      nb::arg("w"), nb::arg("mats"), nb::arg("rows"), nb::arg("cols"), nb::arg("codes"), nb::arg("scales"),
      nb::arg("stream"));
  m.def("set_shipped_tune_table", &TuneTable::set_shipped_path, nb::arg("path"));
  m.def("shipped_tune_table", &TuneTable::shipped_path);
  m.def("user_tune_table", &TuneTable::user_path);

  nb::class_<Team>(m, "Team")
      .def_prop_ro("world", &Team::world)
      .def_prop_ro("link", [](const Team& t) { return std::string(to_string(t.link())); })
      .def_prop_ro("device", &Team::device)
      .def_prop_ro("maps_peers", &Team::maps_peers)
      .def("local_ranks", &Team::local_ranks)
      .def("set_timeout", &Team::set_timeout, nb::arg("seconds"))
      .def_prop_ro("timeout", &Team::timeout)
      .def("synchronize", &Team::synchronize)
      .def("clear_status", &Team::clear_status, nb::arg("rank"));

  nb::class_<LocalTeam, Team>(m, "LocalTeam")
      .def(
          "__init__",
          [](LocalTeam* t, int world, const std::string& link, int device) {
            new (t) LocalTeam(world, parse_link(link), device);
          },
          nb::arg("world"), nb::arg("link") = "device", nb::arg("device") = 0);

  nb::class_<IpcTeam, Team>(m, "IpcTeam")
      .def(
          "__init__",
          [](IpcTeam* t, int rank, int world, nb::object all_gather, int device, const std::string& heap) {
            new (t) IpcTeam(rank, world, all_gather_from(std::move(all_gather)), device, parse_heap(heap));
          },
          nb::arg("rank"), nb::arg("world"), nb::arg("all_gather"), nb::arg("device") = 0,
          nb::arg("heap") = "cuda_ipc")
      .def_prop_ro("heap", [](const IpcTeam& t) { return std::string(to_string(t.heap())); })
      .def("barrier", &IpcTeam::barrier)
      .def("close", &IpcTeam::close)  // keeps the GIL: the all-gather is Python (torch.distributed)
      .def_prop_ro("rank", &IpcTeam::rank);

  nb::class_<FusedMoe>(m, "FusedMoe")
      .def(
          "__init__",
          [](FusedMoe* self, Team& team, int hidden, int ffn, int experts, int topk, const std::string& activation,
             int ep, int tp, int max_tokens, int max_rows, double load_factor, std::optional<int> layer0_tile_n,
             std::optional<int> layer0_n_comm, std::optional<int> layer1_tile_n, std::optional<int> layer1_n_comm,
             bool adaptive_split, bool batch_invariant, bool checking, bool training, const std::string& tune_table,
             std::optional<nb::object> allocate, std::optional<nb::object> release, const std::string& dtype,
             const std::string& transport, bool narrow_n_tiles, std::optional<bool> cublas_backward,
             bool check_schedule) {
            MoeOptions o;
            o.dtype = dtype_of(dtype);
            o.transport = transport_of(transport);
            o.layer0 = request(layer0_tile_n, layer0_n_comm);
            o.layer1 = request(layer1_tile_n, layer1_n_comm);
            o.adaptive_split = adaptive_split;
            o.batch_invariant = batch_invariant;
            o.checking = checking;
            o.training = training;
            o.narrow_n_tiles = narrow_n_tiles;
            o.cublas_backward = cublas_backward;
            o.check_schedule = check_schedule;
            o.tune_table = tune_table;
            o.allocator = allocator_from(std::move(allocate), std::move(release));
            new (self) FusedMoe(team, MoeShape{hidden, ffn, experts, topk, activation_of(activation)},
                                Parallel{ep, tp}, MoeCapacity{max_tokens, max_rows, load_factor}, o);
          },
          nb::keep_alive<1, 2>(),  // the team outlives the layer
          nb::arg("team"), nb::arg("hidden"), nb::arg("ffn"), nb::arg("experts"), nb::arg("topk"),
          nb::arg("activation"), nb::arg("ep"), nb::arg("tp"), nb::arg("max_tokens"), nb::arg("max_rows") = 0,
          nb::arg("load_factor") = 0.0,
          nb::arg("layer0_tile_n") = nb::none(), nb::arg("layer0_n_comm") = nb::none(),
          nb::arg("layer1_tile_n") = nb::none(), nb::arg("layer1_n_comm") = nb::none(),
          nb::arg("adaptive_split") = true, nb::arg("batch_invariant") = false, nb::arg("checking") = false,
          nb::arg("training") = false, nb::arg("tune_table") = "",
          nb::arg("allocate") = nb::none(), nb::arg("release") = nb::none(), nb::arg("dtype") = "bf16",
          nb::arg("transport") = "peer", nb::arg("narrow_n_tiles") = true,
          nb::arg("cublas_backward") = nb::none(), nb::arg("check_schedule") = false)
      .def_prop_ro("dtype", [](const FusedMoe& m) { return std::string(to_string(m.options().dtype)); })
      // w0_scales: an e4m3 layer's W0 block scales (fp32 [E_l][ceil(w0 rows / 128)][H / 128]); 0 = none
      // (a bf16 layer, or a w0 pointer 0 that keeps the rank's current weights).
      .def(
          "set_weights",
          [](FusedMoe& m, int rank, uintptr_t w0, uintptr_t w1, uintptr_t w0_scales) {
            m.set_weights(rank, cptr(w0), cptr(w1), fptr(w0_scales));
          },
          nb::arg("rank"), nb::arg("w0"), nb::arg("w1"), nb::arg("w0_scales") = 0)
      // The hot path of one rank per process: weights and batch in one call.
      .def(
          "forward1",
          [](FusedMoe& m, int rank, uintptr_t w0, uintptr_t w1, const BatchTuple& b, uintptr_t stream,
             uintptr_t w0_scales) {
            m.set_weights(rank, cptr(w0), cptr(w1), fptr(w0_scales));
            m.forward(batch_of(b), stream_of(stream));
          },
          nb::arg("rank"), nb::arg("w0"), nb::arg("w1"), nb::arg("batch"), nb::arg("stream"), nb::arg("w0_scales") = 0)
      // Every local rank: weights[i] = (w0, w1) and batches[i] of team.local_ranks()[i]; part "whole",
      // "layer0" or "layer1" (a weight pointer 0 keeps the rank's current one). w0_scales: empty (a bf16
      // layer) or one address per local rank, the e4m3 W0 block scales of weights[i] (0 with a w0 of 0).
      .def(
          "forward",
          [](FusedMoe& m, const std::vector<std::tuple<uintptr_t, uintptr_t>>& weights,
             const std::vector<BatchTuple>& batches, uintptr_t stream, const std::string& part,
             const std::vector<uintptr_t>& w0_scales) {
            const std::vector<int> local = m.team().local_ranks();
            COMET_REQUIRE(weights.size() == local.size() && batches.size() == local.size(), "FusedMoe.forward: ",
                          weights.size(), " weights and ", batches.size(), " batches for ", local.size(),
                          " local ranks");
            COMET_REQUIRE(w0_scales.empty() || w0_scales.size() == local.size(), "FusedMoe.forward: ",
                          w0_scales.size(), " w0_scales for ", local.size(), " local ranks (give none or one each)");
            std::vector<RankBatch> rb;
            for (size_t i = 0; i < local.size(); ++i) {
              m.set_weights(local[i], cptr(std::get<0>(weights[i])), cptr(std::get<1>(weights[i])),
                            w0_scales.empty() ? nullptr : fptr(w0_scales[i]));
              rb.push_back(batch_of(batches[i]));
            }
            if (part == "whole") m.forward(rb, stream_of(stream));
            else if (part == "layer0") m.forward_layer0(rb, stream_of(stream));
            else if (part == "layer1") m.forward_layer1(rb, stream_of(stream));
            else throw InvalidArgument("FusedMoe.forward: part must be whole, layer0 or layer1, got " + part);
          },
          nb::arg("weights"), nb::arg("batches"), nb::arg("stream"), nb::arg("part") = "whole",
          nb::arg("w0_scales") = std::vector<uintptr_t>())
      // Gradients of the last whole forward (built with training=True), for this process's one rank:
      // grad = (dout, dx, dgates, dw0, dw1); grad_type "bf16" or "f32" (dw0 / dw1); accumulate: dw += the
      // gradient instead of overwriting it; fused_activation: BackwardOptions::fused_activation;
      // weight_grad_kernel: BackwardOptions::weight_grad_kernel, "auto" (the planner's rule), "persistent",
      // "grouped", "grouped_cooperative" or "grouped_320".
      .def(
          "backward1",
          [](FusedMoe& m, int rank, const GradTuple& grad, uintptr_t stream, const std::string& grad_type,
             bool accumulate, bool fused_activation, const std::string& weight_grad_kernel) {
            const std::vector<int> local = m.team().local_ranks();
            COMET_REQUIRE(local.size() == 1 && local[0] == rank, "FusedMoe.backward1: rank ", rank,
                          " is not the one rank this process drives");
            m.backward(grad_of(grad), stream_of(stream),
                       backward_options(grad_type, accumulate, fused_activation, weight_grad_kernel));
          },
          nb::arg("rank"), nb::arg("grad"), nb::arg("stream"), nb::arg("grad_type") = "bf16",
          nb::arg("accumulate") = false, nb::arg("fused_activation") = false,
          nb::arg("weight_grad_kernel") = "auto")
      // Every local rank: grads[i] of team.local_ranks()[i].
      .def(
          "backward",
          [](FusedMoe& m, const std::vector<GradTuple>& grads, uintptr_t stream, const std::string& grad_type,
             bool accumulate, bool fused_activation, const std::string& weight_grad_kernel) {
            std::vector<RankGrad> rg;
            for (const GradTuple& g : grads) rg.push_back(grad_of(g));
            m.backward(rg, stream_of(stream), backward_options(grad_type, accumulate, fused_activation, weight_grad_kernel));
          },
          nb::arg("grads"), nb::arg("stream"), nb::arg("grad_type") = "bf16", nb::arg("accumulate") = false,
          nb::arg("fused_activation") = false, nb::arg("weight_grad_kernel") = "auto")
      .def("sync_and_check", &FusedMoe::sync_and_check)
      .def("close", &FusedMoe::close)  // keeps the GIL: an IpcTeam's all-gather is Python
      .def(
          "last_decision", [](const FusedMoe& m, int rank, int layer) { return decision_dict(m.last_decision(rank, layer)); },
          nb::arg("rank"), nb::arg("layer"))
      .def_prop_ro("device_bytes_per_rank", &FusedMoe::device_bytes_per_rank)
      .def_prop_ro("max_tokens", [](const FusedMoe& m) { return m.capacity().max_tokens_per_rank; })
      .def_prop_ro("max_rows", [](const FusedMoe& m) { return m.capacity().max_rows_per_rank; })
      .def_prop_ro("hidden", [](const FusedMoe& m) { return m.shape().hidden; })
      .def_prop_ro("ffn_shard", [](const FusedMoe& m) { return m.parallel().ffn_shard(m.shape()); })
      .def("local_ranks", [](const FusedMoe& m) { return m.team().local_ranks(); });
}
