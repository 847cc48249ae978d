// The driver's devices and configuration: how many devices this process sees (ACCEL_EMU_DEVICES,
// EMU_VISIBLE_DEVICES), their capacity (ACCEL_EMU_MEMORY), memory protection (ACCEL_EMU_PROTECT), the
// calling thread's current device and the process state (initialised, forked child).
#include "driver.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <string>

namespace emu {

namespace {

// ------------------------------------------------------------------ configuration
struct Config {
  std::vector<int> visible;  // visible index -> physical index
  uint64_t capacity = 8ull << 30;
  bool protect = true;
  std::string error;  // non-empty: the environment is invalid, every use raises this
};

bool parse_int(const std::string& text, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0';
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

bool parse_size(const std::string& raw, uint64_t& out) {
  std::string text = trim(raw);
  size_t i = 0;
  while (i < text.size() && (isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return false;
  double number = std::strtod(text.substr(0, i).c_str(), nullptr);
  std::string unit = trim(text.substr(i));
  for (auto& c : unit) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  double mult;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kib" || unit == "k") mult = 1024.0;
  else if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else return false;
  double bytes = number * mult;
  if (!(bytes >= 1)) return false;
  out = static_cast<uint64_t>(bytes);
  return true;
}

Config load_config() {
  Config c;
  long long physical = 2;
  if (const char* v = std::getenv("ACCEL_EMU_DEVICES")) {
    if (!parse_int(trim(v), physical) || physical < 1 || physical > 64) {
      c.error = std::string("ACCEL_EMU_DEVICES must be an integer from 1 to 64, got '") + v + "'";
      return c;
    }
  }
  if (const char* v = std::getenv("EMU_VISIBLE_DEVICES")) {
    std::string list = trim(v);
    std::stringstream ss(list);
    std::string item;
    while (!list.empty() && std::getline(ss, item, ',')) {
      long long idx;
      if (!parse_int(trim(item), idx) || idx < 0 || idx >= physical) {
        c.error = "EMU_VISIBLE_DEVICES='" + list + "': '" + item + "' is not a device index from 0 to " +
                  std::to_string(physical - 1);
        return c;
      }
      for (int seen : c.visible) {
        if (seen == idx) {
          c.error = "EMU_VISIBLE_DEVICES='" + list + "' names device " + std::to_string(idx) + " twice";
          return c;
        }
      }
      c.visible.push_back(static_cast<int>(idx));
    }
  } else {
    for (int i = 0; i < physical; ++i) c.visible.push_back(i);
  }
  if (const char* v = std::getenv("ACCEL_EMU_MEMORY")) {
    if (!parse_size(v, c.capacity)) {
      c.error = std::string("ACCEL_EMU_MEMORY must be a size such as 4GiB or 512MiB, got '") + v + "'";
      return c;
    }
  }
  if (const char* v = std::getenv("ACCEL_EMU_PROTECT")) {
    std::string s = trim(v);
    for (auto& ch : s) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
    if (s == "1" || s == "true" || s == "yes" || s == "on") c.protect = true;
    else if (s == "0" || s == "false" || s == "no" || s == "off") c.protect = false;
    else {
      c.error = std::string("ACCEL_EMU_PROTECT must be 0 or 1, got '") + v + "'";
      return c;
    }
  }
  return c;
}

const Config& config() {
  static const Config c = load_config();
  return c;
}

const Config& checked_config() {
  const Config& c = config();
  TORCH_CHECK(c.error.empty(), "emu: ", c.error);
  return c;
}

thread_local c10::DeviceIndex tls_device = 0;
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};

}  // namespace

c10::DeviceIndex device_count() {
  return static_cast<c10::DeviceIndex>(checked_config().visible.size());
}

int physical_index(c10::DeviceIndex index) {
  check_device(index);
  return config().visible[index];
}

uint64_t capacity_bytes() { return checked_config().capacity; }

bool protection_enabled() { return checked_config().protect; }

void check_device(c10::DeviceIndex index) {
  auto n = device_count();
  TORCH_CHECK(index >= 0 && index < n, "emu: invalid device index ", static_cast<int>(index),
              " (this process sees ", static_cast<int>(n), " emu device(s))");
}

c10::DeviceIndex current_device() { return tls_device; }

void set_current_device(c10::DeviceIndex index) {
  check_device(index);
  tls_device = index;
}

bool in_bad_fork() { return g_bad_fork.load(); }
bool is_initialized() { return g_initialized.load(); }
void mark_initialized() { g_initialized.store(true); }

void note_forked_child() {
  if (g_initialized.load()) g_bad_fork.store(true);
}

}  // namespace emu
