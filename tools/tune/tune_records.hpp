// comet-tune's reading of benchmark records (comet-bench's and comet-bench-ipc's JSON): the table key, the
// launch, the link and the work a record stands for.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comet/tune.hpp"

namespace comet::tune_tool {

std::vector<nlohmann::json> read_records(const std::string& path);  // a file's list of records
double median(std::vector<double> v);                                // 0 for none
// The middle value, or the mean of the middle two (two runs that disagree average out; median takes
// the upper one); 0 for none.
double middle(std::vector<double> v);
// A record's SM count: `forced` (--sms) if > 0, else the one the benchmark wrote, else 132.
int sms_of(const nlohmann::json& r, int forced);
// The link a record's key has: the team's ("nvlink", comet-bench-ipc on GPUs of their own, keys the device
// link an IpcTeam has).
Link link_of(const nlohmann::json& r);
// Whether a record counts for a table of `transport`'s kernels (records that name none always count).
bool of_transport(const nlohmann::json& r, const std::string& transport);
int launch_of(const nlohmann::json& r);  // "l0".."l3" -> 0..3; -1 for whole-layer records (fwd, bwd, ...)
TuneKey key_of(const nlohmann::json& r, int sms);
// key_of at load class 1: the key of a record measured under uniform routing, whatever rows it counted.
TuneKey uniform_key_of(const nlohmann::json& r, int sms);
// The work the cost model sees for a record: expected under uniform routing, or, with `measured`, from
// the rows and link rows the record counted.
LayerWork work_of(const nlohmann::json& r, bool measured = false);

}  // namespace comet::tune_tool
