// Names of the Team's enums, for messages, options and parsing.
#include <string>

#include "comet/team.hpp"

namespace comet {

const char* to_string(Link link) {
  switch (link) {
    case Link::device: return "device";
    case Link::host: return "host";
  }
  return "unknown";
}

Link parse_link(const std::string& s) {
  if (s == "device") return Link::device;
  if (s == "host") return Link::host;
  throw InvalidArgument(detail::concat("unknown link '", s, "': expected 'device' or 'host'"));
}

const char* to_string(WaitSite site) {
  switch (site) {
    case WaitSite::none: return "none";
    case WaitSite::signal: return "signal";
    case WaitSite::barrier: return "barrier";
    case WaitSite::tile_ready: return "tile_ready";
    case WaitSite::tile_done: return "tile_done";
    case WaitSite::test: return "test";
    case WaitSite::bulk_copy: return "bulk_copy";
    case WaitSite::peer_failed: return "peer_failed";
  }
  return "unknown";
}

}  // namespace comet
