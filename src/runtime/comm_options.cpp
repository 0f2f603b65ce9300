// The communication's options from the environment (include/mpiddp/comm_options.hpp).
#include <mpiddp/comm_options.hpp>
#include <mpiddp/error.hpp>

#include <cstdlib>
#include <string>

namespace mpiddp {

CommOptions CommOptions::from_environment() {
  CommOptions o;
  if (const char* t = std::getenv("MPIDDP_COMM_TIMEOUT"); t && *t) {
    char* end = nullptr;
    double seconds = std::strtod(t, &end);
    MPIDDP_CHECK(*end == '\0' && seconds > 0,
                 std::string("MPIDDP_COMM_TIMEOUT must be a positive number of seconds, got '") + t + "'");
    o.timeout = std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
  }
  if (const char* c = std::getenv("MPIDDP_CHECK_COLLECTIVES"); c && *c) {
    std::string v = c;
    MPIDDP_CHECK(v == "0" || v == "1", "MPIDDP_CHECK_COLLECTIVES must be 0 or 1, got '" + v + "'");
    o.check_collectives = v == "1";
  }
  if (const char* w = std::getenv("MPIDDP_STALL_WARNING"); w && std::string(w) == "off") {
    o.stall_monitor = false;
  } else if (w && *w) {
    char* end = nullptr;
    const double seconds = std::strtod(w, &end);
    MPIDDP_CHECK(
        *end == '\0' && seconds >= 0,
        std::string("MPIDDP_STALL_WARNING must be a number of seconds >= 0 (0: no warnings) or off, got '") + w + "'");
    o.stall_warning = std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0));
  }
  return o;
}

}  // namespace mpiddp
